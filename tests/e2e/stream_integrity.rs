//! What happens to an upstream answer on its way to the client (issue 8, sections 1, 3, 4):
//! the model echo names only the standard model; streams that end badly (a truncated last
//! event, invalid UTF-8, no finish reason, no `[DONE]`) end with an honest error event or
//! are completed; compressed answers are decoded; limits that end valid work are the right
//! ones (one event's own limit, the heartbeat clock on client bytes, the provider's error
//! type kept).
//!
//! Every stream check reads the body to its chunked terminator (`is_done`) and compares the
//! exact sequence of events, summarised by [`summary`].

use std::time::{Duration, Instant};

use crate::harness::client::{sse_events, sse_text};
use crate::harness::{basic_config, Mock, Sluice, KEY};

const READ: Duration = Duration::from_secs(10);

/// An OpenAI-kind provider `p1` (model `acme/chat` → `mock-small-v1`) with `extra_server`.
fn openai(mock: &Mock, extra_server: &str) -> Sluice {
    Sluice::start(&basic_config(&mock.base_url(), extra_server))
}

/// An Anthropic-kind provider `claude` (model `acme/claude` → `claude-mock-1`).
fn anthropic(mock: &Mock, extra_server: &str) -> Sluice {
    Sluice::start(&anthropic_config(mock, extra_server))
}

/// The config of [`anthropic`].
fn anthropic_config(mock: &Mock, extra_server: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{extra_server}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  claude:\n    kind: anthropic\n    base_url: {}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/claude:\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n",
        mock.base_url()
    )
}

fn chat_body(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// Streams a request and returns the whole body, checking status 200 and that the body
/// ended with its chunked terminator.
fn stream_body(sluice: &Sluice, model: &str) -> Vec<u8> {
    let mut s = sluice.chat_stream(&chat_body(model, true));
    assert_eq!(s.status, 200);
    let body = s.read_to_end(READ);
    assert!(
        s.is_done(),
        "the body must end with its terminator: {}",
        String::from_utf8_lossy(&body)
    );
    body
}

/// One line per event: `role`, `content:<text>`, `finish:<reason>`, `usage`, `[DONE]`,
/// `error:<type>:<code>`, `comment`, or `other:<event>`.
fn summary(body: &[u8]) -> Vec<String> {
    sse_events(body)
        .iter()
        .map(|ev| {
            if ev.starts_with(':') {
                return "comment".to_string();
            }
            let data: String = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect::<Vec<_>>()
                .join("\n");
            if data == "[DONE]" {
                return data;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) else {
                return format!("other:{ev}");
            };
            if let Some(e) = v.get("error") {
                return format!(
                    "error:{}:{}",
                    e["type"].as_str().unwrap_or("?"),
                    e["code"].as_str().unwrap_or("?")
                );
            }
            let choice = &v["choices"][0];
            if let Some(r) = choice["finish_reason"].as_str() {
                return format!("finish:{r}");
            }
            if choice["delta"]["role"].is_string() {
                return "role".to_string();
            }
            if let Some(c) = choice["delta"]["content"].as_str() {
                return format!("content:{c}");
            }
            if v["usage"].is_object() {
                return "usage".to_string();
            }
            format!("other:{ev}")
        })
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

/// Every `model` value of every data event.
fn models(body: &[u8]) -> Vec<String> {
    sse_events(body)
        .iter()
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).expect("chunk JSON");
            v["model"].as_str().unwrap_or("<none>").to_string()
        })
        .collect()
}

// ------------------------------------------------------------------ 1. the model echo

#[test]
fn openai_answers_naming_another_model_reach_the_client_with_the_standard_id() {
    let mock =
        Mock::start(r#"{"answer_model":"mock-small-v1-2024-07-18","tokens":3,"usage":true}"#);
    let sluice = openai(&mock, "");
    // The client asks for usage: the usage chunk names the model too (a client that does not
    // ask gets no usage chunk, see tests/e2e/metering.rs).
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/chat","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    let body = s.read_to_end(READ);
    assert!(s.is_done(), "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8_lossy(&body);
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "content:tok2 ",
            "finish:stop",
            "usage",
            "[DONE]"
        ]),
        "{text}"
    );
    assert_eq!(models(&body), vec!["acme/chat"; 6], "{text}");
    assert!(!text.contains("2024-07-18"), "{text}");

    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/chat", "{}", r.text());
    assert!(!r.text().contains("2024-07-18"), "{}", r.text());
    // The request named the upstream model: only the answer differed.
    assert!(mock.log().iter().all(|rec| rec["model"] == "mock-small-v1"));
}

#[test]
fn anthropic_answers_naming_a_dated_snapshot_reach_the_client_with_the_standard_id() {
    let mock = Mock::start(r#"{"answer_model":"claude-mock-1-20250929","tokens":2}"#);
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    let text = String::from_utf8_lossy(&body);
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:stop",
            "[DONE]"
        ]),
        "{text}"
    );
    assert_eq!(models(&body), vec!["acme/claude"; 4], "{text}");
    assert!(!text.contains("20250929"), "{text}");

    let r = sluice.chat(&chat_body("acme/claude", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/claude");
    assert!(!r.text().contains("20250929"), "{}", r.text());
}

// ------------------------------------------------------------------ 3. streams that end badly

#[test]
fn a_truncated_last_event_is_never_flushed_and_ends_with_an_error_event() {
    let mock = Mock::start(r#"{"tokens":4,"truncate_after_tokens":2}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:api_error:upstream_truncated"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );

    let mock = Mock::start(r#"{"tokens":4,"truncate_after_tokens":2}"#);
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:api_error:upstream_truncated"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );
}

#[test]
fn invalid_utf8_is_replaced_counted_and_never_forwarded() {
    let mock = Mock::start(r#"{"tokens":3,"invalid_utf8":true,"split":"bytewise"}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    let text = std::str::from_utf8(&body).expect("the client gets valid UTF-8");
    assert_eq!(
        sse_text(&body),
        "tok0\u{FFFD}(\u{FFFD} tok1\u{FFFD}(\u{FFFD} tok2\u{FFFD}(\u{FFFD} ",
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(
        sluice.metric(r#"sluice_sse_invalid_utf8_total{provider="p1"}"#),
        6.0
    );
}

#[test]
fn a_clean_end_without_a_finish_reason_is_a_broken_stream() {
    let mock = Mock::start(r#"{"tokens":3,"no_finish":true}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "content:tok2 ",
            "error:api_error:upstream_incomplete"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        sluice.metric(r#"sluice_stream_errors_total{reason="upstream_incomplete"}"#),
        1.0
    );

    let mock = Mock::start(r#"{"tokens":2,"no_finish":true}"#);
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:api_error:upstream_incomplete"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );
}

#[test]
fn a_finish_reason_without_done_is_completed_with_exactly_one_done() {
    let mock = Mock::start(r#"{"tokens":2,"no_done":true,"finish_reason":"length"}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:length",
            "[DONE]"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );

    let mock = Mock::start(r#"{"tokens":2,"no_done":true}"#);
    let sluice = anthropic(&mock, "");
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/claude","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    let body = s.read_to_end(READ);
    assert!(s.is_done());
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:stop",
            "usage",
            "[DONE]"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );
}

#[test]
fn compressed_answers_are_decoded_stream_and_not() {
    for coding in ["gzip", "deflate", "deflate-raw", "br", "zstd"] {
        let mock = Mock::start(&format!(
            r#"{{"tokens":3,"content_encoding":"{coding}","answer_model":"mock-small-v1-x"}}"#
        ));
        let sluice = openai(&mock, "");
        let body = stream_body(&sluice, "acme/chat");
        assert_eq!(
            summary(&body),
            strings(&[
                "role",
                "content:tok0 ",
                "content:tok1 ",
                "content:tok2 ",
                "finish:stop",
                "[DONE]"
            ]),
            "{coding}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(models(&body), vec!["acme/chat"; 5], "{coding}");

        let r = sluice.chat(&chat_body("acme/chat", false));
        assert_eq!(r.status, 200, "{coding}: {}", r.text());
        assert_eq!(r.header("content-encoding"), None, "{coding}");
        let v = r.json();
        assert_eq!(v["model"], "acme/chat", "{coding}");
        assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");

        // Sluice says upstream exactly what it decodes.
        for rec in mock.log() {
            let accept = rec["all_headers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|h| h[0] == "accept-encoding")
                .map(|h| h[1].clone());
            assert_eq!(
                accept,
                Some(serde_json::json!("gzip, deflate, br, zstd")),
                "{rec}"
            );
        }
    }
    // Anthropic streams compressed too.
    let mock = Mock::start(r#"{"tokens":2,"content_encoding":"gzip"}"#);
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:stop",
            "[DONE]"
        ])
    );
}

#[test]
fn a_compressed_error_body_is_decoded_into_the_client_error() {
    let mock = Mock::start(
        r#"{"status":400,"error_message":"max_tokens is too large","content_encoding":"br"}"#,
    );
    let sluice = openai(&mock, "");
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["error"]["message"],
        "max_tokens is too large",
        "{}",
        r.text()
    );
}

#[test]
fn an_unknown_content_coding_is_an_honest_error() {
    let mock = Mock::start(r#"{"tokens":2,"content_encoding":"compress"}"#);
    let sluice = openai(&mock, "");
    for stream in [false, true] {
        let r = sluice.chat(&chat_body("acme/chat", stream));
        assert_eq!(r.status, 502, "{}", r.text());
        let v = r.json();
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("`compress`"), "{v}");
    }
}

#[test]
fn a_non_stream_answer_over_the_limit_names_the_limit() {
    let mock = Mock::start(r#"{"total_bytes":50000}"#);
    let sluice = openai(&mock, "  max_response_body_bytes: 16384\n");
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 502, "{}", r.text());
    let v = r.json();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("16384 bytes"), "{v}");
    assert!(message.contains("server.max_response_body_bytes"), "{v}");
    assert_eq!(v["error"]["code"], "upstream_response_too_large", "{v}");

    // The limit applies to the decoded answer: a small gzip body that inflates past it.
    let mock = Mock::start(r#"{"total_bytes":50000,"content_encoding":"gzip"}"#);
    let sluice = openai(&mock, "  max_response_body_bytes: 16384\n");
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_response_too_large");
}

// ------------------------------------------------------------------ 4. limits that end valid work

#[test]
fn a_200_kb_event_passes_and_the_event_limit_is_its_own() {
    let mock = Mock::start(r#"{"tokens":2,"big_token_bytes":200000}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    let events = summary(&body);
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(events[1], format!("content:{}", "x".repeat(200_000)));
    assert_eq!(
        events[2..],
        strings(&["content:tok1 ", "finish:stop", "[DONE]"])
    );

    // Over `max_event_bytes` the stream ends with an error naming the limit.
    let mock = Mock::start(r#"{"tokens":2,"big_token_bytes":200000}"#);
    let sluice = openai(&mock, "  max_event_bytes: 100000\n");
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&["role", "error:api_error:event_too_large"]),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(String::from_utf8_lossy(&body).contains("server.max_event_bytes"));
}

#[test]
fn upstream_pings_do_not_postpone_heartbeats() {
    // Anthropic `ping`s every 100 ms produce no client bytes; the heartbeat (200 ms) must
    // still keep the client's line alive through the 1.5 s between tokens.
    let mock = Mock::start(r#"{"tokens":2,"token_delay_ms":1500,"ping_interval_ms":100}"#);
    let sluice = anthropic(&mock, "  heartbeat_interval_ms: 200\n");
    let mut s = sluice.chat_stream(&chat_body("acme/claude", true));
    assert_eq!(s.status, 200);
    let mut body = Vec::new();
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    let mut first = true;
    while let Some(p) = s.next_piece(READ) {
        let now = Instant::now();
        if !first {
            longest = longest.max(now - last);
        }
        first = false;
        last = now;
        body.extend_from_slice(&p);
    }
    assert!(s.is_done());
    let events = summary(&body);
    let keepalives = events.iter().filter(|e| *e == "comment").count();
    assert!(keepalives >= 8, "{events:?}");
    let content: Vec<&String> = events.iter().filter(|e| *e != "comment").collect();
    assert_eq!(
        content,
        [
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:stop",
            "[DONE]"
        ]
    );
    assert!(
        longest < Duration::from_millis(700),
        "the client saw no byte for {longest:?} (heartbeat 200 ms)"
    );
}

#[test]
fn in_band_stream_errors_keep_the_providers_error_type() {
    // (`status` would make the whole answer an HTTP error: the in-band type is scripted.)
    let mock = Mock::start(
        r#"{"tokens":4,"error_after_tokens":2,"error_type":"overloaded_error","error_message":"Overloaded"}"#,
    );
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:overloaded_error:upstream_error"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );

    let mock =
        Mock::start(r#"{"tokens":4,"error_after_tokens":1,"error_type":"rate_limit_error"}"#);
    let sluice = anthropic(&mock, "");
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "error:rate_limit_error:upstream_error"
        ])
    );

    let mock = Mock::start(r#"{"tokens":4,"error_after_tokens":1,"error_type":"server_error"}"#);
    let sluice = openai(&mock, "");
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&["role", "content:tok0 ", "error:server_error:upstream_error"])
    );
}

#[test]
fn events_that_arrive_with_an_in_band_error_reach_the_client_before_it() {
    // The head is committed early (100 ms), then the provider delivers its whole stream in
    // one write: role, two tokens and an in-band error in one HTTP chunk. The events before
    // the error are the client's; only then does the error event end the stream.
    let behavior = r#"{"tokens":4,"error_after_tokens":2,"error_type":"overloaded_error","first_event_delay_ms":400,"token_delay_ms":0,"split":"burst"}"#;
    let mock = Mock::start(behavior);
    let sluice = Sluice::start(&basic_config(&mock.base_url(), "").replace(
        "  acme/chat:\n",
        "  acme/chat:\n    early_commit_after_ms: 100\n",
    ));
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:overloaded_error:upstream_error"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );

    let mock = Mock::start(behavior);
    let sluice = Sluice::start(&anthropic_config(&mock, "").replace(
        "  acme/claude:\n",
        "  acme/claude:\n    early_commit_after_ms: 100\n",
    ));
    let body = stream_body(&sluice, "acme/claude");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "error:overloaded_error:upstream_error"
        ]),
        "{}",
        String::from_utf8_lossy(&body)
    );
}

// ------------------------------------------------------------------ non-stream answers

#[test]
fn invalid_utf8_in_a_non_stream_answer_is_replaced_and_counted() {
    // OpenAI path: the body is passed on (model rewritten) as valid UTF-8 JSON.
    let mock = Mock::start(r#"{"tokens":2,"invalid_utf8":true}"#);
    let sluice = openai(&mock, "");
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        v["choices"][0]["message"]["content"], "tok0\u{FFFD}(\u{FFFD} tok1\u{FFFD}(\u{FFFD} ",
        "{v}"
    );
    assert_eq!(v["model"], "acme/chat", "{v}");
    assert_eq!(
        sluice.metric(r#"sluice_sse_invalid_utf8_total{provider="p1"}"#),
        4.0
    );
    // Anthropic path: translated, not a 502.
    let mock = Mock::start(r#"{"tokens":2,"invalid_utf8":true}"#);
    let sluice = anthropic(&mock, "");
    let r = sluice.chat(&chat_body("acme/claude", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "tok0\u{FFFD}(\u{FFFD} tok1\u{FFFD}(\u{FFFD} ",
    );
    assert_eq!(
        sluice.metric(r#"sluice_sse_invalid_utf8_total{provider="claude"}"#),
        4.0
    );
}

#[test]
fn an_sse_answer_to_a_non_stream_request_is_a_failed_attempt() {
    let mock = Mock::start(r#"{"tokens":2,"stream_always":true}"#);
    let sluice = openai(&mock, "");
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 502, "{}", r.text());
    let v = r.json();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("text/event-stream"), "{v}");
    assert!(message.contains("`p1`"), "{v}");
    assert_eq!(
        sluice.metric(r#"sluice_upstream_attempts_total{outcome="protocol",provider="p1"}"#),
        1.0
    );
    // The same provider still streams when asked to.
    let body = stream_body(&sluice, "acme/chat");
    assert_eq!(
        summary(&body),
        strings(&[
            "role",
            "content:tok0 ",
            "content:tok1 ",
            "finish:stop",
            "[DONE]"
        ])
    );

    // Nothing was committed: the next route answers.
    let good = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p1:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\n  p2:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: m1\n        priority: 1\n      - provider: p2\n        upstream_model: m2\n        priority: 2\n",
        mock.base_url(),
        good.base_url()
    ));
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 ");
    assert_eq!(
        sluice.metric(
            r#"sluice_fallback_total{from_provider="p1",model="acme/chat",reason="protocol",to_provider="p2"}"#
        ),
        1.0
    );

    let mock = Mock::start(r#"{"tokens":2,"stream_always":true}"#);
    let sluice = anthropic(&mock, "");
    let r = sluice.chat(&chat_body("acme/claude", false));
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("text/event-stream"), "{message}");
}

// ------------------------------------------------------------------ SSE decoding details

#[test]
fn a_leading_bom_is_stripped_even_split_across_chunks() {
    for split in ["none", "bytewise"] {
        let mock = Mock::start(&format!(r#"{{"tokens":2,"bom":true,"split":"{split}"}}"#));
        let sluice = openai(&mock, "");
        let body = stream_body(&sluice, "acme/chat");
        assert_eq!(
            summary(&body),
            strings(&[
                "role",
                "content:tok0 ",
                "content:tok1 ",
                "finish:stop",
                "[DONE]"
            ]),
            "{split}: {}",
            String::from_utf8_lossy(&body)
        );
        assert!(!body.starts_with("\u{FEFF}".as_bytes()), "{split}");

        let mock = Mock::start(&format!(r#"{{"tokens":2,"bom":true,"split":"{split}"}}"#));
        let sluice = anthropic(&mock, "");
        let body = stream_body(&sluice, "acme/claude");
        assert_eq!(
            summary(&body),
            strings(&[
                "role",
                "content:tok0 ",
                "content:tok1 ",
                "finish:stop",
                "[DONE]"
            ]),
            "{split}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[test]
fn a_stream_that_decodes_past_the_cap_before_the_commit_says_so() {
    // 200 kB of `x` gzip to a few hundred bytes, all in one read: a gzip bomb.
    let mock = Mock::start(
        r#"{"tokens":2,"big_token_bytes":200000,"content_encoding":"gzip","split":"burst"}"#,
    );
    let sluice = openai(&mock, "  max_event_bytes: 16384\n");
    let r = sluice.chat(&chat_body("acme/chat", true));
    assert_eq!(r.status, 502, "{}", r.text());
    let v = r.json();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`p1`"), "{v}");
    assert!(
        message.contains("gzip-decoded answer exceeds 81920 bytes"),
        "{v}"
    );
    assert!(!message.contains("sk-provider-secret"), "{v}");
}
