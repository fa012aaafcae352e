//! Unit and property tests for the SSE hot path.

use super::*;
use bytes::BytesMut;
use proptest::prelude::*;

const MAX: usize = 64 * 1024;

/// Feeds `chunks` then `finish()`, returning all emitted events (raw bytes).
fn run(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut n = SseNormalizer::new(MAX);
    let mut out = Vec::new();
    for c in chunks {
        n.push(c).unwrap();
        while let Some(ev) = n.next_event() {
            out.push(ev.raw().to_vec());
        }
    }
    n.finish().unwrap();
    while let Some(ev) = n.next_event() {
        out.push(ev.raw().to_vec());
    }
    out
}

fn run_bytewise(input: &[u8]) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = input.chunks(1).collect();
    run(&chunks)
}

fn concat(evs: &[Vec<u8>]) -> Vec<u8> {
    evs.concat()
}

#[test]
fn single_event_one_chunk() {
    let evs = run(&[b"data: {\"a\":1}\n\n"]);
    assert_eq!(evs, vec![b"data: {\"a\":1}\n\n".to_vec()]);
}

#[test]
fn split_mid_line() {
    let evs = run(&[b"data: {\"a\"", b":1}\n", b"\ndata: x\n\n"]);
    assert_eq!(concat(&evs), b"data: {\"a\":1}\n\ndata: x\n\n");
    assert_eq!(evs.len(), 2);
}

#[test]
fn split_mid_utf8() {
    let input = "data: {\"content\":\"héllo 世界 🎉\"}\n\n".as_bytes();
    for cut in 0..input.len() {
        let (a, b) = input.split_at(cut);
        let evs = run(&[a, b]);
        assert_eq!(evs, vec![input.to_vec()], "cut at {cut}");
        assert!(std::str::from_utf8(&evs[0]).is_ok());
    }
    assert_eq!(run_bytewise(input), vec![input.to_vec()]);
}

#[test]
fn crlf_line_ends() {
    let evs = run(&[b"event: ping\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"]);
    assert_eq!(
        evs,
        vec![
            b"event: ping\ndata: 1\n\n".to_vec(),
            b"data: 2\n\n".to_vec()
        ]
    );
}

#[test]
fn lone_cr_line_ends() {
    let evs = run(&[b"data: 1\r\rdata: 2\r\r"]);
    assert_eq!(evs, vec![b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()]);
}

#[test]
fn cr_at_chunk_end_then_lf() {
    // "\r" | "\n" across chunks is ONE line end: no spurious blank line
    // (which would dispatch the event early).
    let evs = run(&[b"id: 1\r", b"\ndata: 1\r", b"\n\r", b"\n"]);
    assert_eq!(evs, vec![b"id: 1\ndata: 1\n\n".to_vec()]);
    // Lone CR at chunk end followed by a non-LF byte.
    let evs = run(&[b"id: 1\r", b"data: 1\r", b"\r"]);
    assert_eq!(evs, vec![b"id: 1\ndata: 1\n\n".to_vec()]);
    // CR at chunk end, then an empty chunk, then LF: still one line end.
    let evs = run(&[b"data: 1\r", b"", b"\n\n"]);
    assert_eq!(evs, vec![b"data: 1\n\n".to_vec()]);
}

#[test]
fn multi_line_data() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: line1\ndata:line2\ndata\ndata: \n\n")
        .unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(ev.raw(), b"data: line1\ndata: line2\ndata\ndata: \n\n");
    assert_eq!(ev.data_line_count(), 4);
    assert!(ev.has_data());
    assert!(!ev.is_done());
    assert_eq!(ev.data().unwrap().as_ref(), b"line1\nline2\n\n");
    assert!(matches!(ev.data(), Some(std::borrow::Cow::Owned(_))));
}

#[test]
fn single_line_data_is_borrowed() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: {\"x\":1}\n\n").unwrap();
    let ev = n.next_event().unwrap();
    assert!(matches!(
        ev.data(),
        Some(std::borrow::Cow::Borrowed(b"{\"x\":1}"))
    ));
}

#[test]
fn comments_pass_through() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b": OPENROUTER PROCESSING\n\n:\n\ndata: 1\n\n")
        .unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(ev.raw(), b": OPENROUTER PROCESSING\n\n");
    assert!(!ev.has_data());
    assert!(ev.data().is_none());
    assert_eq!(n.next_event().unwrap().raw(), b":\n\n");
    assert_eq!(n.next_event().unwrap().raw(), b"data: 1\n\n");
    assert!(n.next_event().is_none());
}

#[test]
fn event_id_retry_fields() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b"event: message_delta\nid: 42\nretry: 3000\ndata: {}\n\nevent:ping\ndata: {}\n\nevents: x\ndata: 1\n\n")
        .unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(
        ev.raw(),
        b"event: message_delta\nid: 42\nretry: 3000\ndata: {}\n\n"
    );
    assert_eq!(ev.event_name(), Some("message_delta"));
    assert_eq!(ev.data().unwrap().as_ref(), b"{}");
    let ev = n.next_event().unwrap();
    assert_eq!(
        ev.raw(),
        b"event:ping\ndata: {}\n\n",
        "event: passes unchanged"
    );
    assert_eq!(ev.event_name(), Some("ping"));
    let ev = n.next_event().unwrap();
    assert_eq!(ev.event_name(), None, "`events` is a different field");
}

#[test]
fn done_sentinel() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: [DONE]\n\ndata:[DONE]\n\ndata: [DONE] \n\ndata: [DONE]\ndata: x\n\n")
        .unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(ev.raw(), b"data: [DONE]\n\n");
    assert!(ev.is_done());
    let ev = n.next_event().unwrap();
    assert_eq!(ev.raw(), b"data: [DONE]\n\n");
    assert!(ev.is_done());
    assert!(!n.next_event().unwrap().is_done());
    assert!(!n.next_event().unwrap().is_done());
}

#[test]
fn data_without_space_normalized() {
    let evs = run(&[b"data:x\n\ndata:  two\n\ndata:\n\n"]);
    assert_eq!(
        evs,
        vec![
            b"data: x\n\n".to_vec(),
            b"data:  two\n\n".to_vec(),
            b"data:\n\n".to_vec()
        ]
    );
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data:{\"a\":1}\n\n").unwrap();
    assert_eq!(
        n.next_event().unwrap().data().unwrap().as_ref(),
        b"{\"a\":1}"
    );
    n.push(b"data:  two\n\n").unwrap();
    assert_eq!(n.next_event().unwrap().data().unwrap().as_ref(), b" two");
    // Split right after the colon.
    assert_eq!(run(&[b"data:", b"x\n\n"]), vec![b"data: x\n\n".to_vec()]);
}

#[test]
fn extra_blank_lines_dropped() {
    let evs = run(&[b"\n\n\r\ndata: 1\n\n\n\n\r\n\rdata: 2\n\n\n"]);
    assert_eq!(evs, vec![b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()]);
}

#[test]
fn finish_flushes_partial_event() {
    assert_eq!(
        run(&[b"data: 1\n\ndata: 2"]),
        vec![b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()]
    );
    assert_eq!(run(&[b"data: 2\n"]), vec![b"data: 2\n\n".to_vec()]);
    assert_eq!(run(&[b"data: 2\r"]), vec![b"data: 2\n\n".to_vec()]);
    assert_eq!(run(&[b"data:2"]), vec![b"data: 2\n\n".to_vec()]);
    assert!(run(&[b"\n\n"]).is_empty());
    assert!(run(&[b""]).is_empty());
}

#[test]
fn event_not_emitted_before_complete() {
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: 1\n").unwrap();
    assert!(n.next_event().is_none());
    assert_eq!(n.buffered_bytes(), 8);
    n.push(b"\n").unwrap();
    assert_eq!(n.pending_events(), 1);
    assert_eq!(n.next_event().unwrap().raw(), b"data: 1\n\n");
    n.push(b"").unwrap();
    assert_eq!(n.buffered_bytes(), 0);
}

#[test]
fn line_too_long() {
    let mut n = SseNormalizer::new(32);
    let long = [b'a'; 40];
    n.push(b"data: ok\n\n").unwrap();
    let err = n.push(&long).unwrap_err();
    assert_eq!(err, SseError::LineTooLong { limit_bytes: 32 });
    assert!(err.to_string().contains("32"));
    // The event completed before the error is still delivered.
    assert_eq!(n.next_event().unwrap().raw(), b"data: ok\n\n");
    // Growing one byte at a time also trips the limit.
    let mut n = SseNormalizer::new(32);
    let mut failed = false;
    for _ in 0..100 {
        if n.push(b"x").is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed);
    assert!(n.buffered_bytes() <= 32);
    // An event made of many short lines is bounded too.
    let mut n = SseNormalizer::new(32);
    let res: Result<Vec<()>, _> = (0..20).map(|_| n.push(b"id: 1\n")).collect();
    assert!(res.is_err());
    // Events that fit exactly are fine.
    let mut n = SseNormalizer::new(10);
    n.push(b"data: 12\n\n").unwrap();
    assert_eq!(n.next_event().unwrap().raw(), b"data: 12\n\n");
}

#[test]
fn buffer_reused_across_events() {
    // Every event is assembled at the start of the same buffer: the one allocation is
    // reused (a fresh buffer per event would put them at other addresses while the old
    // one is still alive during the move).
    let mut n = SseNormalizer::new(MAX);
    let mut first: Option<*const u8> = None;
    for i in 0..1000 {
        n.push(format!("data: {i}\n").as_bytes()).unwrap();
        n.push(b"\n").unwrap();
        let ev = n.next_event().unwrap();
        assert_eq!(ev.raw(), format!("data: {i}\n\n").as_bytes());
        let at = ev.raw().as_ptr();
        assert_eq!(
            *first.get_or_insert(at),
            at,
            "event {i} is in another buffer"
        );
    }
    assert_eq!(n.buffered_bytes(), 0);
}

// ---------------------------------------------------------------- rewrite

fn rw(r: &ModelRewriter, input: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    r.rewrite_into(input, &mut out);
    out.to_vec()
}

#[test]
fn rewrite_spacing_variants() {
    let r = ModelRewriter::new("gpt-4o-mini-2024-07-18", "gpt-4o-mini");
    assert_eq!(
        rw(
            &r,
            br#"data: {"id":"x","model":"gpt-4o-mini-2024-07-18","choices":[]}"#
        ),
        br#"data: {"id":"x","model":"gpt-4o-mini","choices":[]}"#
    );
    assert_eq!(
        rw(&r, b"{ \"model\" :\t\"gpt-4o-mini-2024-07-18\" }"),
        b"{ \"model\" :\t\"gpt-4o-mini\" }"
    );
    assert_eq!(
        rw(
            &r,
            b"{\n  \"object\": \"x\",\n  \"model\":\r\n \"gpt-4o-mini-2024-07-18\"\n}"
        ),
        b"{\n  \"object\": \"x\",\n  \"model\":\r\n \"gpt-4o-mini\"\n}"
    );
    // Nested and multiple occurrences.
    assert_eq!(
        rw(
            &r,
            br#"{"model":"gpt-4o-mini-2024-07-18","message":{"model":"gpt-4o-mini-2024-07-18"}}"#
        ),
        br#"{"model":"gpt-4o-mini","message":{"model":"gpt-4o-mini"}}"#
    );
}

#[test]
fn rewrite_ignores_non_model_occurrences() {
    let r = ModelRewriter::new("m1", "public");
    // Escaped inside content text.
    let s = br#"{"model":"other","content":"use \"m1\" or {\"model\":\"m1\"}"}"#;
    assert_eq!(rw(&r, s), s.to_vec());
    // As another key's value.
    let s = br#"{"id":"m1","model_id":"m1","xmodel":"m1"}"#;
    assert_eq!(rw(&r, s), s.to_vec());
    // As a key.
    let s = br#"{"m1":"model"}"#;
    assert_eq!(rw(&r, s), s.to_vec());
    // As an array element after a "model" string.
    let s = br#"["model","m1"]"#;
    assert_eq!(rw(&r, s), s.to_vec());
    // Prefix of a longer name.
    let s = br#"{"model":"m1-large"}"#;
    assert_eq!(rw(&r, s), s.to_vec());
}

#[test]
fn rewrite_escaping_and_noop() {
    let r = ModelRewriter::new("we\"ird\\name", "pub\"lic");
    assert_eq!(
        rw(&r, br#"{"model":"we\"ird\\name"}"#),
        br#"{"model":"pub\"lic"}"#
    );
    let r = ModelRewriter::new("same", "same");
    assert!(r.is_noop());
    let s = br#"{"model":"same"}"#;
    assert_eq!(rw(&r, s), s.to_vec());
    let r = ModelRewriter::new("a", "b");
    assert!(!r.is_noop());
    assert_eq!(rw(&r, b"no json at all"), b"no json at all");
    // Appends to existing content.
    let mut out = BytesMut::from(&b"prefix|"[..]);
    r.rewrite_into(br#"{"model":"a"}"#, &mut out);
    assert_eq!(&out[..], br#"prefix|{"model":"b"}"#);
}

// ---------------------------------------------------------------- usage

#[test]
fn usage_openai() {
    let d = br#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,"prompt_tokens_details":{"cached_tokens":0}}}"#;
    assert_eq!(
        extract_usage(d),
        Some(Usage {
            input_tokens: 12,
            output_tokens: 34
        })
    );
    let d = br#"{"usage" : { "prompt_tokens" : 1 , "completion_tokens" : 2 } }"#;
    assert_eq!(
        extract_usage(d),
        Some(Usage {
            input_tokens: 1,
            output_tokens: 2
        })
    );
}

#[test]
fn usage_anthropic() {
    let d = br#"{"type":"message_start","message":{"id":"msg_1","model":"claude","usage":{"input_tokens":25,"output_tokens":1}}}"#;
    assert_eq!(
        extract_usage(d),
        Some(Usage {
            input_tokens: 25,
            output_tokens: 1
        })
    );
    let d = br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#;
    assert_eq!(
        extract_usage(d),
        Some(Usage {
            input_tokens: 0,
            output_tokens: 15
        })
    );
}

#[test]
fn usage_absent_or_null() {
    assert_eq!(
        extract_usage(br#"{"choices":[{"delta":{"content":"hi"}}],"usage":null}"#),
        None
    );
    assert_eq!(
        extract_usage(br#"{"choices":[{"delta":{"content":"hi"}}]}"#),
        None
    );
    assert_eq!(
        extract_usage(br#"{"content":"the \"usage\": {\"prompt_tokens\":1}"}"#),
        None
    );
    assert_eq!(extract_usage(br#"{"usage":{"prompt_tokens":1"#), None);
    assert_eq!(extract_usage(br#"{"usage":{}}"#), None);
    assert_eq!(extract_usage(b"[DONE]"), None);
    // A "usage" string value followed by a real usage object.
    let d = br#"{"kind":"usage","usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
    assert_eq!(
        extract_usage(d),
        Some(Usage {
            input_tokens: 3,
            output_tokens: 4
        })
    );
}

// ---------------------------------------------------------------- content

#[test]
fn content_detection() {
    assert!(has_content(
        br#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#
    ));
    assert!(has_content(br#"{"choices":[{"delta":{"content" : " "}}]}"#));
    assert!(!has_content(
        br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}"#
    ));
    assert!(!has_content(
        br#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
    ));
    assert!(!has_content(
        br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#
    ));
    assert!(!has_content(br#"{"choices":[{"delta":{"content":null}}]}"#));
    assert!(has_content(
        br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}"#
    ));
    assert!(!has_content(
        br#"{"choices":[{"delta":{"tool_calls":[ ]}}]}"#
    ));
    assert!(has_content(
        br#"{"choices":[{"delta":{"reasoning_content":"think"}}]}"#
    ));
    assert!(has_content(
        br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#
    ));
    assert!(!has_content(br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#));
    assert!(!has_content(b"[DONE]"));
    assert!(!has_content(br#"{"note":"\"content\":\"x\""}"#));
}

// ---------------------------------------------------------------- frames

#[test]
fn error_event_and_keepalive() {
    let ev = openai_error_event("upstream \"died\"\n", "server_error", "upstream_error");
    assert_eq!(
        &ev[..],
        &b"event: error\ndata: {\"error\":{\"message\":\"upstream \\\"died\\\"\\n\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n"[..]
    );
    // Round-trips through the normalizer as one event.
    let mut n = SseNormalizer::new(MAX);
    n.push(&ev).unwrap();
    let parsed = n.next_event().unwrap();
    assert_eq!(parsed.raw(), &ev[..]);
    assert_eq!(parsed.event_name(), Some("error"));
    let v: serde_json::Value = serde_json::from_slice(&parsed.data().unwrap()).unwrap();
    assert_eq!(v["error"]["message"], "upstream \"died\"\n");
    assert_eq!(KEEPALIVE_COMMENT, b": keepalive\n\n");
}

// ---------------------------------------------------------------- proptest

const OPENAI_CRLF: &[u8] = b": ping\r\n\r\ndata: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\ndata:{\"id\":\"chatcmpl-1\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\r\n\r\n\r\ndata: {\"id\":\"chatcmpl-1\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\r\n\r\ndata: [DONE]\r\n\r\n";

const OPENAI_UTF8: &str = "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"Grüße, 世界! 🎉🦀\"}}]}\n\ndata: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"ñ é ü ß 日本語\"}}]}\r\rdata:{\"choices\":[{\"delta\":{\"content\":\"€\"}}]}\r\n\n\ndata: [DONE]\n\n";

const ANTHROPIC_MIXED: &[u8] = b"event: message_start\rdata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\r\revent: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"caf\xc3\xa9\"}}\n\n: c\nid: 7\nretry: 10\ndata: a\ndata:b\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}";

/// Splits `input` at the given (sorted, deduplicated) cut points.
fn split_at_cuts<'a>(input: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut last = 0;
    for &c in cuts {
        out.push(&input[last..c]);
        last = c;
    }
    out.push(&input[last..]);
    out
}

/// The events of [`OPENAI_CRLF`], written out by hand.
const OPENAI_CRLF_EVENTS: &[&[u8]] = &[
    b": ping\n\n",
    b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    b"data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
    b"data: [DONE]\n\n",
];

/// The events of [`OPENAI_UTF8`], written out by hand.
const OPENAI_UTF8_EVENTS: &[&str] = &[
    "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"Grüße, 世界! 🎉🦀\"}}]}\n\n",
    "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"ñ é ü ß 日本語\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"€\"}}]}\n\n",
    "data: [DONE]\n\n",
];

/// The events of [`ANTHROPIC_MIXED`], written out by hand.
const ANTHROPIC_MIXED_EVENTS: &[&[u8]] = &[
    b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
    b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"caf\xc3\xa9\"}}\n\n",
    b": c\nid: 7\nretry: 10\ndata: a\ndata: b\n\n",
    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
];

fn owned(evs: &[&[u8]]) -> Vec<Vec<u8>> {
    evs.iter().map(|e| e.to_vec()).collect()
}

fn check_any_chunking(
    input: &[u8],
    expected: &[Vec<u8>],
    mut cuts: Vec<usize>,
) -> Result<(), TestCaseError> {
    cuts.iter_mut().for_each(|c| *c %= input.len() + 1);
    cuts.sort_unstable();
    cuts.dedup();
    let chunked = run(&split_at_cuts(input, &cuts));
    prop_assert_eq!(&chunked, expected);
    for ev in &chunked {
        prop_assert!(ev.ends_with(b"\n\n"));
        prop_assert!(!ev.starts_with(b"\n"));
        prop_assert!(!ev.contains(&b'\r'));
        prop_assert!(std::str::from_utf8(ev).is_ok());
    }
    Ok(())
}

fn openai_utf8_events() -> Vec<Vec<u8>> {
    OPENAI_UTF8_EVENTS
        .iter()
        .map(|e| e.as_bytes().to_vec())
        .collect()
}

#[test]
fn fixtures_one_chunk_expected() {
    assert_eq!(run(&[OPENAI_CRLF]), owned(OPENAI_CRLF_EVENTS));
    assert_eq!(run(&[OPENAI_UTF8.as_bytes()]), openai_utf8_events());
    assert_eq!(run(&[ANTHROPIC_MIXED]), owned(ANTHROPIC_MIXED_EVENTS));
    assert_eq!(run_bytewise(OPENAI_CRLF), owned(OPENAI_CRLF_EVENTS));
    assert_eq!(run_bytewise(OPENAI_UTF8.as_bytes()), openai_utf8_events());
    assert_eq!(run_bytewise(ANTHROPIC_MIXED), owned(ANTHROPIC_MIXED_EVENTS));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_chunking_openai_crlf(cuts in proptest::collection::vec(any::<usize>(), 0..40)) {
        check_any_chunking(OPENAI_CRLF, &owned(OPENAI_CRLF_EVENTS), cuts)?;
    }

    #[test]
    fn any_chunking_openai_utf8(cuts in proptest::collection::vec(any::<usize>(), 0..40)) {
        check_any_chunking(OPENAI_UTF8.as_bytes(), &openai_utf8_events(), cuts)?;
    }

    #[test]
    fn any_chunking_anthropic(cuts in proptest::collection::vec(any::<usize>(), 0..40)) {
        check_any_chunking(ANTHROPIC_MIXED, &owned(ANTHROPIC_MIXED_EVENTS), cuts)?;
    }

    #[test]
    fn any_chunking_arbitrary_bytes(
        input in proptest::collection::vec(
            prop_oneof![Just(b'\r'), Just(b'\n'), Just(b':'), Just(b' '), Just(b'd'), Just(b'a'), Just(b't'), any::<u8>()],
            0..200),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let mut cuts = cuts;
        cuts.iter_mut().for_each(|c| *c %= input.len() + 1);
        cuts.sort_unstable();
        cuts.dedup();
        prop_assert_eq!(run(&split_at_cuts(&input, &cuts)), run(&[&input]));
    }
}
