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
    // A partial last event is discarded (and reported); what came before stands.
    match n.finish() {
        Ok(()) | Err(SseError::Truncated { .. }) => {}
        Err(e) => panic!("finish: {e}"),
    }
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
fn finish_discards_and_reports_partial_event() {
    // Half an event then the end of body: never flushed (the client would get truncated
    // JSON), reported as truncated.
    for tail in [
        &b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel"[..],
        b"data: 2\n",
        b"data: 2\r",
        b"data:2",
        b"event: message_delta\ndata: {}",
        b": comment",
    ] {
        let mut n = SseNormalizer::new(MAX);
        n.push(b"data: 1\n\n").unwrap();
        n.push(tail).unwrap();
        assert_eq!(
            n.finish(),
            Err(SseError::Truncated {
                partial_bytes: tail.len()
            }),
            "{tail:?}"
        );
        assert_eq!(n.next_event().unwrap().raw(), b"data: 1\n\n");
        assert!(n.next_event().is_none(), "{tail:?}");
    }
    // Nothing lost: complete comment/field lines without data, or nothing at all.
    for tail in [
        &b": ping\n"[..],
        b"id: 3\r\n",
        b"event: message_delta\n",
        b"\n\n",
        b"",
    ] {
        let mut n = SseNormalizer::new(MAX);
        n.push(tail).unwrap();
        assert_eq!(n.finish(), Ok(()), "{tail:?}");
        assert!(n.next_event().is_none());
    }
    // A complete `data: [DONE]` line that only lacks its blank line is the terminator.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: [DONE]\n").unwrap();
    assert_eq!(n.finish(), Ok(()));
    let ev = n.next_event().unwrap();
    assert!(ev.is_done());
    assert_eq!(ev.raw(), b"data: [DONE]\n\n");
    // Without its line end it could be the start of anything: truncated.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: [DONE]").unwrap();
    assert!(n.finish().is_err());
    assert!(n.next_event().is_none());
}

#[test]
fn invalid_utf8_replaced_and_counted() {
    // A lead byte without its continuation, then `(`, then FF: two maximal subparts.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: {\"c\":\"a\xC3(\xFFb\"}\n\n").unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(
        ev.raw(),
        "data: {\"c\":\"a\u{FFFD}(\u{FFFD}b\"}\n\n".as_bytes()
    );
    assert_eq!(
        ev.data().unwrap().as_ref(),
        "{\"c\":\"a\u{FFFD}(\u{FFFD}b\"}".as_bytes()
    );
    assert_eq!(n.take_invalid_utf8(), 2);
    assert_eq!(n.take_invalid_utf8(), 0, "the counter restarts");
    // Valid text split inside a character across chunks is not touched.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: caf\xC3").unwrap();
    n.push(b"\xA9\n\n").unwrap();
    assert_eq!(n.next_event().unwrap().raw(), "data: café\n\n".as_bytes());
    assert_eq!(n.take_invalid_utf8(), 0);
    // A sequence cut by a line end is invalid on its own line (as a whole-stream decode
    // would find), and so is a truncated 4-byte sequence at the end of a line.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"data: x\xE2\x82\ndata: \xF0\x9F\x8E\n\n").unwrap();
    assert_eq!(
        n.next_event().unwrap().raw(),
        "data: x\u{FFFD}\ndata: \u{FFFD}\n\n".as_bytes()
    );
    assert_eq!(n.take_invalid_utf8(), 2);
    // Invalid bytes in the field name (`dat\xFF`) are repaired before the line is read.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"event: e\xFF\ndata: 1\n\n").unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(ev.event_name(), Some("e\u{FFFD}"));
    assert_eq!(ev.data().unwrap().as_ref(), b"1");
}

#[test]
fn invalid_utf8_same_in_any_chunking() {
    let input =
        b"data: {\"a\":\"\xF0\x9F\xA6\x80 \xC3\xA9 \xC3 \xE2\x82\xAC\xFF\"}\n\ndata: [DONE]\n\n";
    let whole = run(&[input]);
    let expected = String::from_utf8_lossy(input).into_owned();
    assert_eq!(concat(&whole), expected.as_bytes());
    for cut in 0..input.len() {
        let (a, b) = input.split_at(cut);
        assert_eq!(run(&[a, b]), whole, "cut at {cut}");
    }
    assert_eq!(run_bytewise(input), whole);
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
    r.rewrite_json(input, &mut out);
    out.to_vec()
}

/// Rewrites every event of `stream` (normalized) and returns the concatenated output.
fn rw_events(r: &ModelRewriter, stream: &[u8]) -> Vec<u8> {
    let mut n = SseNormalizer::new(MAX);
    n.push(stream).unwrap();
    let mut out = BytesMut::new();
    let mut memo = EchoMemo::default();
    while let Some(ev) = n.next_event() {
        r.rewrite_event(&ev, &mut memo, &mut out);
    }
    out.to_vec()
}

#[test]
fn rewrite_replaces_whatever_id_the_provider_answered() {
    let r = ModelRewriter::new("gpt-4o-mini");
    for answered in [
        "gpt-4o-mini-2024-07-18",
        "gpt-4o-mini",
        "my-azure-deployment",
        "/models/Qwen2.5-7B-Instruct",
        "",
        "we\\\"ird",
    ] {
        let body = format!(
            r#"{{"id":"x","object":"chat.completion","created":1,"model":"{answered}","choices":[]}}"#
        );
        assert_eq!(
            rw(&r, body.as_bytes()),
            br#"{"id":"x","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[]}"#,
            "{answered}"
        );
    }
    // Spacing around the member stays byte for byte.
    assert_eq!(
        rw(&r, b"{ \"model\" :\t\"m-2024\" }"),
        b"{ \"model\" :\t\"gpt-4o-mini\" }"
    );
    assert_eq!(
        rw(&r, b"{\n  \"object\": \"x\",\n  \"n\": -1.5e3,\n  \"ok\": true,\n  \"model\":\r\n \"m\"\n}"),
        b"{\n  \"object\": \"x\",\n  \"n\": -1.5e3,\n  \"ok\": true,\n  \"model\":\r\n \"gpt-4o-mini\"\n}"
    );
    // The standard id is JSON-escaped.
    let r2 = ModelRewriter::new("pub\"lic");
    assert_eq!(rw(&r2, br#"{"model":"x"}"#), br#"{"model":"pub\"lic"}"#);
    // Appends to what `out` holds.
    let mut out = BytesMut::from(&b"prefix|"[..]);
    r.rewrite_json(br#"{"model":"a"}"#, &mut out);
    assert_eq!(&out[..], br#"prefix|{"model":"gpt-4o-mini"}"#);
}

#[test]
fn rewrite_touches_only_the_responses_own_member() {
    let r = ModelRewriter::new("public");
    // A "model" inside string content (escaped quotes), as another key's value, or as an
    // array element is not the member.
    for s in [
        &br#"{"content":"use {\"model\":\"m1\"}","id":"model"}"#[..],
        br#"{"id":"m1","model_id":"m1","xmodel":"m1","m1":"model"}"#,
        br#"["model","m1"]"#,
        b"no json at all",
        b"",
        br#"{"model":null}"#,
        br#"{"model":42}"#,
        br#"{"model""#,
        br#"{"id":"unterminated"#,
    ] {
        assert_eq!(rw(&r, s), s.to_vec(), "{}", String::from_utf8_lossy(s));
    }
    // Nested objects (tool-call arguments, a message) keep their own "model"; the
    // top-level member after them is replaced.
    assert_eq!(
        rw(
            &r,
            br#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":{"model":"m1"}}}]},"message":{"model":"m1"}}],"meta":{"model":"m1"},"model":"m1","tail":{"model":"m1"}}"#
        ),
        br#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":{"model":"m1"}}}]},"message":{"model":"m1"}}],"meta":{"model":"m1"},"model":"public","tail":{"model":"m1"}}"#
    );
    // A string with escaped quotes and backslashes before the member is skipped whole.
    assert_eq!(
        rw(&r, br#"{"a":"x\\\"model\":\"y\\","model":"m1"}"#),
        br#"{"a":"x\\\"model\":\"y\\","model":"public"}"#
    );
}

#[test]
fn rewrite_at_a_nested_path() {
    // Where Anthropic's `message_start` and Responses events name the model.
    let r = ModelRewriter::at(ModelPath::new(&["message", "model"]), "claude-std");
    assert_eq!(
        rw(
            &r,
            br#"{"type":"message_start","model":"top","message":{"id":"m","content":[{"model":"x"}],"model":"claude-sonnet-4-5-20250929","usage":{}}}"#
        ),
        br#"{"type":"message_start","model":"top","message":{"id":"m","content":[{"model":"x"}],"model":"claude-std","usage":{}}}"#
    );
    // `message` that is not an object, or has no model: unchanged.
    for s in [
        &br#"{"message":"model","model":"x"}"#[..],
        br#"{"message":{"id":"m"},"model":"x"}"#,
    ] {
        assert_eq!(rw(&r, s), s.to_vec());
    }
}

#[test]
fn rewrite_memo_hits_only_on_the_same_prefix() {
    let r = ModelRewriter::new("std");
    let stream = b"data: {\"id\":\"a\",\"model\":\"x1\"}\n\n\
        data: {\"id\":\"a\",\"model\":\"x2-longer\",\"n\":1}\n\n\
        data: {\"id\":\"a\",\"model\":null}\n\n\
        data: {\"id\":\"a\",\"model\":\"q\\\"x\\\\\"}\n\n\
        data: {\"id\":\"bb\",\"model\":\"x\"}\n\n\
        data: {\"id\":\"a\",\"model\"}\n\n\
        data: {\"id\":\"a\",\"model\":\"unterminated}\n\n\
        data: {\"id\":\"a\",\"model\":\"x3\"}\n\n";
    assert_eq!(
        String::from_utf8_lossy(&rw_events(&r, stream)),
        String::from_utf8_lossy(
            b"data: {\"id\":\"a\",\"model\":\"std\"}\n\n\
        data: {\"id\":\"a\",\"model\":\"std\",\"n\":1}\n\n\
        data: {\"id\":\"a\",\"model\":null}\n\n\
        data: {\"id\":\"a\",\"model\":\"std\"}\n\n\
        data: {\"id\":\"bb\",\"model\":\"std\"}\n\n\
        data: {\"id\":\"a\",\"model\"}\n\n\
        data: {\"id\":\"a\",\"model\":\"unterminated}\n\n\
        data: {\"id\":\"a\",\"model\":\"std\"}\n\n"
        )
    );
}

#[test]
fn rewrite_events_single_and_multi_line() {
    let r = ModelRewriter::new("gpt-4o-mini");
    let stream = b"data: {\"id\":\"c\",\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[]}\n\n\
        event: chunk\ndata:{\"id\":\"c\",\n\
        data: \"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[]}\n\n\
        : comment \"model\":\"x\"\n\n\
        data: [DONE]\n\n";
    assert_eq!(
        rw_events(&r, stream),
        b"data: {\"id\":\"c\",\"model\":\"gpt-4o-mini\",\"choices\":[]}\n\n\
        event: chunk\ndata: {\"id\":\"c\",\n\
        data: \"model\":\"gpt-4o-mini\",\"choices\":[]}\n\n\
        : comment \"model\":\"x\"\n\n\
        data: [DONE]\n\n"
            .to_vec()
    );
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

#[test]
fn finish_reason_detection() {
    assert!(has_finish_reason(
        br#"{"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#
    ));
    assert!(has_finish_reason(
        br#"{"choices":[{"delta":{},"finish_reason" : "tool_calls"}]}"#
    ));
    assert!(!has_finish_reason(
        br#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}"#
    ));
    assert!(!has_finish_reason(
        br#"{"choices":[{"delta":{"content":"x"}}]}"#
    ));
    assert!(!has_finish_reason(
        br#"{"choices":[{"delta":{"content":"\"finish_reason\":\"stop\""}}]}"#
    ));
    assert!(!has_finish_reason(b"[DONE]"));
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
    // The Anthropic fixture ends in the middle of its last event (no line end): that event
    // is discarded and reported, never flushed.
    let mut n = SseNormalizer::new(MAX);
    n.push(ANTHROPIC_MIXED).unwrap();
    while n.next_event().is_some() {}
    assert_eq!(
        n.finish(),
        Err(SseError::Truncated {
            partial_bytes: "event: message_stop\ndata: {\"type\":\"message_stop\"}".len()
        })
    );
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

#[test]
fn repair_utf8_leaves_valid_bodies_alone_and_repairs_like_from_utf8_lossy() {
    assert_eq!(super::repair_utf8("{\"a\":\"ö\"}".as_bytes()), None);
    let bad = b"{\"a\":\"x\xC3(\xFF\xF0\x9F\"}";
    let (fixed, n) = super::repair_utf8(bad).expect("invalid input is repaired");
    assert_eq!(n, 3);
    assert_eq!(fixed, String::from_utf8_lossy(bad).as_bytes());
}

#[test]
fn one_leading_bom_is_stripped_in_any_chunking() {
    let input = b"\xEF\xBB\xBFdata: 1\n\ndata: 2\n\n";
    let expected = vec![b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()];
    assert_eq!(run(&[input]), expected);
    assert_eq!(run_bytewise(input), expected);
    for cut in 0..input.len() {
        let (a, b) = input.split_at(cut);
        assert_eq!(run(&[a, b]), expected, "cut at {cut}");
    }
    let mut n = SseNormalizer::new(MAX);
    n.push(b"\xEF\xBB").unwrap();
    n.push(b"\xBFdata: x\n\n").unwrap();
    let ev = n.next_event().unwrap();
    assert_eq!(
        ev.data().unwrap().as_ref(),
        b"x",
        "the first event keeps its data"
    );
}

#[test]
fn only_one_bom_and_only_at_the_start_is_stripped() {
    // A second BOM is content of the first line (a field named "\u{FEFF}data").
    let evs = run(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: 1\n\n"]);
    assert_eq!(evs, vec!["\u{FEFF}data: 1\n\n".as_bytes().to_vec()]);
    let evs = run(&[b"data: 1\n\n\xEF\xBB\xBFdata: 2\n\n"]);
    assert_eq!(concat(&evs), "data: 1\n\n\u{FEFF}data: 2\n\n".as_bytes());
    // Bytes held as a possible BOM that turn out not to be one are kept (and repaired).
    let mut n = SseNormalizer::new(MAX);
    n.push(b"\xEF").unwrap();
    n.push(b"\xBB").unwrap();
    n.push(b"data: 1\n\n").unwrap();
    assert_eq!(
        n.next_event().unwrap().raw(),
        "\u{FFFD}data: 1\n\n".as_bytes()
    );
    assert_eq!(n.take_invalid_utf8(), 1);
    // A body that ends inside a possible BOM ended inside an event.
    let mut n = SseNormalizer::new(MAX);
    n.push(b"\xEF\xBB").unwrap();
    assert!(matches!(n.finish(), Err(SseError::Truncated { .. })));
    // A reused normalizer strips the next stream's BOM.
    n.push(b"\xEF\xBB\xBFdata: 2\n\n").unwrap();
    assert_eq!(n.next_event().unwrap().data().unwrap().as_ref(), b"2");
}

#[test]
fn has_content_anthropic_first_is_has_content() {
    for data in [
        &br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#[..],
        br#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}"#,
        br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
        br#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#,
        br#"{"type":"message_start","message":{"id":"m","content":[],"model":"x"}}"#,
        br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
        br#"{"type": "ping"}"#,
        br#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}"#,
        br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
        br#"{"note":"\"text_delta\":\"x\""}"#,
        b"[DONE]",
    ] {
        assert_eq!(
            has_content_anthropic_first(data),
            has_content(data),
            "{}",
            String::from_utf8_lossy(data)
        );
    }
}

#[test]
fn finish_reason_found_wherever_the_member_is() {
    // The reverse search still checks every occurrence, first or last.
    assert!(has_finish_reason(
        br#"{"finish_reason":"stop","choices":[{"delta":{"content":"\"finish_reason\":null"}}]}"#
    ));
    assert!(has_finish_reason(
        br#"{"choices":[{"finish_reason":"length","delta":{}}],"note":{"finish_reason":null}}"#
    ));
}
