//! Streaming normalization, byte for byte: every framing variant the mock upstream can produce
//! (chunks cut mid-line, mid-UTF-8 and byte by byte; CRLF and lone CR line ends; comments;
//! multi-line `data:`; `event:` names; `data:` without the space) reaches the client as the
//! same normalized events, with `model` rewritten to the standard id in every chunk and
//! `data: [DONE]` last. Also the SSE response headers and `x-request-id`.
//!
//! The expected bytes are built here from OpenAI's chunk format
//! (<https://platform.openai.com/docs/api-reference/chat/streaming>) with the mock's fixed
//! `id`/`created`, independently of Sluice's code.

use crate::harness::client::{sse_events, StreamReader};
use crate::harness::{basic_config, Mock, Sluice, KEY};
use std::time::Duration;

/// Multi-byte text: 2-, 3- and 4-byte UTF-8 characters.
const TEXT: &str = "héllo 世界 🚀 ok";
const ID: &str = "chatcmpl-e2e0001";
const CREATED: u64 = 1_700_000_000;
const STANDARD: &str = "acme/chat";
const PROMPT_TOKENS: u64 = 7;
const READ: Duration = Duration::from_secs(15);

/// The request body: the multi-byte text, fixed id/created, plus `knobs` (JSON members).
fn body(knobs: &str, include_usage: bool) -> String {
    let usage = if include_usage {
        r#""stream_options":{"include_usage":true},"#
    } else {
        ""
    };
    let sep = if knobs.is_empty() { "" } else { "," };
    format!(
        r#"{{"model":"{STANDARD}","stream":true,{usage}"messages":[{{"role":"user","content":"hi"}}],"mock":{{"text":{text},"id":"{ID}","created":{CREATED},"prompt_tokens":{PROMPT_TOKENS}{sep}{knobs}}}}}"#,
        text = serde_json::to_string(TEXT).expect("json string"),
    )
}

/// The data payloads of the expected stream, in order (OpenAI chunk objects, then `[DONE]`).
fn expected_payloads(include_usage: bool) -> Vec<String> {
    let tokens = ["héllo ", "世界 ", "🚀 ", "ok"];
    let usage_null = if include_usage {
        r#","usage":null"#
    } else {
        ""
    };
    let chunk = |choices: &str, usage: &str| {
        format!(
            r#"{{"id":"{ID}","object":"chat.completion.chunk","created":{CREATED},"model":"{STANDARD}","system_fingerprint":"fp_mock","choices":{choices}{usage}}}"#
        )
    };
    let mut out = vec![chunk(
        r#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
        usage_null,
    )];
    for t in tokens {
        out.push(chunk(
            &format!(
                r#"[{{"index":0,"delta":{{"content":{}}},"logprobs":null,"finish_reason":null}}]"#,
                serde_json::to_string(t).expect("json string")
            ),
            usage_null,
        ));
    }
    out.push(chunk(
        r#"[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]"#,
        usage_null,
    ));
    if include_usage {
        let n = tokens.len() as u64;
        out.push(chunk(
            "[]",
            &format!(
                r#","usage":{{"prompt_tokens":{PROMPT_TOKENS},"completion_tokens":{n},"total_tokens":{}}}"#,
                PROMPT_TOKENS + n
            ),
        ));
    }
    out.push("[DONE]".to_string());
    out
}

/// Byte index just after the first top-level comma of a JSON object (where the mock cuts
/// multi-line data).
fn first_top_level_comma(json: &str) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0, false, false);
    for (i, b) in json.bytes().enumerate() {
        if in_str {
            match b {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 1 => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// How the normalized stream differs from the plain one for a framing variant.
#[derive(Default, Clone, Copy)]
struct Shape {
    comments: bool,
    multi_line: bool,
    event_names: bool,
    /// `event:` lines pass through as sent (only `data:` gets its space back).
    no_space_event: bool,
    include_usage: bool,
}

/// The exact bytes the client must receive.
fn expected_stream(shape: Shape) -> String {
    let mut out = String::new();
    for data in expected_payloads(shape.include_usage) {
        if shape.comments {
            out.push_str(": OPENROUTER PROCESSING\n\n");
            if data == "[DONE]" && !shape.include_usage {
                // Sluice asks for usage (metering) and drops the usage chunk of a client that
                // did not; the comment the mock sent before that chunk passes through.
                out.push_str(": OPENROUTER PROCESSING\n\n");
            }
        }
        if shape.event_names {
            out.push_str(if shape.no_space_event {
                "event:chunk\n"
            } else {
                "event: chunk\n"
            });
        }
        match first_top_level_comma(&data).filter(|_| shape.multi_line) {
            Some(c) if c < data.len() => {
                out.push_str(&format!("data: {}\ndata: {}\n", &data[..c], &data[c..]));
            }
            _ => out.push_str(&format!("data: {data}\n")),
        }
        out.push('\n');
    }
    out
}

/// Opens a stream with `extra_headers` and reads it to the end.
fn open(sluice: &Sluice, body: &str, extra_headers: &[(&str, &str)]) -> (StreamReader, Vec<u8>) {
    let auth = format!("Bearer {KEY}");
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend_from_slice(extra_headers);
    let mut s = StreamReader::open(sluice.addr, "/v1/chat/completions", &headers, body);
    assert_eq!(s.status, 200, "status");
    let bytes = s.read_to_end(READ);
    assert!(s.is_done(), "the chunked body must end with its terminator");
    (s, bytes)
}

/// The SSE response head contract.
fn assert_sse_headers(s: &StreamReader) {
    assert_eq!(
        s.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(s.header("cache-control"), Some("no-cache"));
    assert_eq!(s.header("x-accel-buffering"), Some("no"));
    assert_eq!(s.header("content-length"), None, "no stale content-length");
    assert_eq!(s.header("transfer-encoding"), Some("chunked"));
    let rid = s.header("x-request-id").expect("x-request-id");
    assert!(!rid.is_empty());
}

/// Structural checks that hold for every variant: each event ends with exactly one blank
/// line, every JSON chunk names the standard model, `[DONE]` is last.
fn assert_well_formed(text: &str) {
    assert!(text.ends_with("data: [DONE]\n\n"), "[DONE] last: {text:?}");
    assert!(
        !text.contains("\n\n\n"),
        "an event ended with more than one blank line"
    );
    assert!(!text.contains('\r'), "CR left in the stream");
    assert!(!text.contains("mock-small-v1"), "upstream model leaked");
    let mut chunks = 0;
    for ev in sse_events(text.as_bytes()) {
        let data: Vec<&str> = ev
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        if data.is_empty() || data == ["[DONE]"] {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&data.join("\n"))
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {ev:?}"));
        assert_eq!(v["model"], STANDARD, "model in {ev:?}");
        chunks += 1;
    }
    assert!(chunks >= 6, "too few chunks: {chunks}");
}

#[test]
fn every_framing_variant_normalizes_to_the_same_events() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));

    // (knobs, shape) — the plain case first.
    let cases: &[(&str, Shape)] = &[
        ("", Shape::default()),
        (r#""split":"mid_line""#, Shape::default()),
        (r#""split":"mid_utf8""#, Shape::default()),
        (r#""split":"bytewise""#, Shape::default()),
        (r#""crlf":true"#, Shape::default()),
        (r#""crlf":true,"split":"bytewise""#, Shape::default()),
        (r#""lone_cr":true"#, Shape::default()),
        (r#""lone_cr":true,"split":"bytewise""#, Shape::default()),
        (r#""no_space":true"#, Shape::default()),
        (
            r#""comments":true"#,
            Shape {
                comments: true,
                ..Shape::default()
            },
        ),
        (
            r#""multi_line_data":true"#,
            Shape {
                multi_line: true,
                ..Shape::default()
            },
        ),
        (
            r#""event_names":true"#,
            Shape {
                event_names: true,
                ..Shape::default()
            },
        ),
        (
            r#""crlf":true,"split":"bytewise","comments":true,"multi_line_data":true,"event_names":true,"no_space":true"#,
            Shape {
                comments: true,
                multi_line: true,
                event_names: true,
                no_space_event: true,
                include_usage: false,
            },
        ),
    ];
    let plain = expected_stream(Shape::default());
    for (knobs, shape) in cases {
        let (s, bytes) = open(&sluice, &body(knobs, false), &[]);
        assert_sse_headers(&s);
        let text =
            String::from_utf8(bytes.clone()).unwrap_or_else(|e| panic!("[{knobs}] not UTF-8: {e}"));
        assert_eq!(text, expected_stream(*shape), "[{knobs}] normalized bytes");
        assert_well_formed(&text);
        assert_eq!(reassembled(&text), TEXT, "[{knobs}] reassembled text");
        // Semantically (comments dropped, data lines joined, names ignored) every variant
        // equals the plain stream.
        assert_eq!(
            semantic(&text),
            semantic(&plain),
            "[{knobs}] events differ from the plain case"
        );
    }
    // Every request reached the mock once, with the upstream model.
    let log = mock.log();
    assert_eq!(log.len(), cases.len());
    assert!(log.iter().all(|r| r["model"] == "mock-small-v1"));
}

/// Events as the SSE spec interprets them: data lines joined, comments and names ignored.
fn semantic(text: &str) -> Vec<String> {
    sse_events(text.as_bytes())
        .iter()
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .map(|d| {
            // Compare JSON as values (multi-line data has a newline between members).
            serde_json::from_str::<serde_json::Value>(&d)
                .map(|v| v.to_string())
                .unwrap_or(d)
        })
        .collect()
}

/// `delta.content` of every chunk, concatenated (multi-line data joined per the SSE spec).
fn reassembled(text: &str) -> String {
    semantic(text)
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn usage_chunk_passes_through_when_requested() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let shape = Shape {
        include_usage: true,
        ..Shape::default()
    };
    for knobs in ["", r#""split":"bytewise","crlf":true"#] {
        let (s, bytes) = open(&sluice, &body(knobs, true), &[]);
        assert_sse_headers(&s);
        let text = String::from_utf8(bytes).expect("utf-8");
        assert_eq!(text, expected_stream(shape), "[{knobs}] with usage");
        assert_well_formed(&text);
        let events = sse_events(text.as_bytes());
        let usage_ev = &events[events.len() - 2];
        let v: serde_json::Value =
            serde_json::from_str(usage_ev.strip_prefix("data: ").expect("data line"))
                .expect("usage chunk json");
        assert_eq!(v["usage"]["prompt_tokens"], PROMPT_TOKENS);
        assert_eq!(v["usage"]["completion_tokens"], 4);
        assert_eq!(v["usage"]["total_tokens"], PROMPT_TOKENS + 4);
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
    }
    // The client's stream_options reached the mock unchanged.
    let log = mock.log();
    assert!(log.iter().all(|r| r["body"]
        .as_str()
        .unwrap_or("")
        .contains("\"include_usage\":true")));
}

#[test]
fn request_id_is_echoed_or_generated() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));

    let (s, _) = open(
        &sluice,
        &body("", false),
        &[("x-request-id", "e2e-req.42_A")],
    );
    assert_eq!(s.header("x-request-id"), Some("e2e-req.42_A"));
    // The id goes upstream too, so provider logs can be matched.
    let log = mock.log();
    assert_eq!(log[0]["headers"]["x-request-id"], "e2e-req.42_A");

    // An insane id (spaces, too long) is replaced by a generated one.
    let long = "x".repeat(65);
    for bad in ["has space", long.as_str()] {
        let (s, _) = open(&sluice, &body("", false), &[("x-request-id", bad)]);
        let rid = s.header("x-request-id").expect("x-request-id");
        assert_ne!(rid, bad);
        assert_eq!(rid.len(), 16, "generated id: {rid:?}");
        assert!(rid.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    // Without one, each request gets its own.
    let (a, _) = open(&sluice, &body("", false), &[]);
    let (b, _) = open(&sluice, &body("", false), &[]);
    assert_ne!(a.header("x-request-id"), b.header("x-request-id"));
}

#[test]
fn events_are_forwarded_as_soon_as_complete() {
    // With a delay between tokens, the client sees the first token long before the last.
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let mut s = sluice.chat_stream(&body(r#""token_delay_ms":300,"split":"mid_utf8""#, false));
    assert_eq!(s.status, 200);
    let first = s.read_until("héllo".as_bytes(), READ);
    let at_first = s.sent_at.elapsed();
    assert!(
        !String::from_utf8_lossy(&first).contains("ok\""),
        "the first token arrived together with the last"
    );
    let rest = s.read_to_end(READ);
    let total = s.sent_at.elapsed();
    assert!(
        total >= at_first + Duration::from_millis(600),
        "first token at {at_first:?}, end at {total:?}: events were buffered"
    );
    let mut all = first;
    all.extend_from_slice(&rest);
    assert_eq!(
        String::from_utf8(all).expect("utf-8"),
        expected_stream(Shape::default())
    );
}
