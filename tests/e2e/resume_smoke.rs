//! Resumable streams, smoke test (issue 32): a Chat stream opted in by header is cut by its
//! client after a few events; a `GET /v1/streams/<id>` with `Last-Event-ID` gets exactly the
//! events after that one and the live rest, the text reassembles the uninterrupted answer,
//! and the provider saw one request.

use std::time::Duration;

use crate::cancellation::{chat_body, chat_records};
use crate::harness::client::{sse_text, StreamReader};
use crate::harness::{basic_config, eventually, Mock, Sluice, KEY};

/// The complete events of an SSE body (a trailing partial event left out).
fn complete_events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut events: Vec<String> = text.split("\n\n").map(str::to_string).collect();
    // What follows the last blank line is incomplete (or empty).
    events.pop();
    events.into_iter().filter(|e| !e.is_empty()).collect()
}

/// The `id:` of an event, if it has one.
fn event_id(event: &str) -> Option<&str> {
    event.lines().find_map(|l| l.strip_prefix("id: "))
}

#[test]
fn a_dropped_chat_stream_resumes_where_it_left_off() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let body = chat_body(true, r#"{"tokens":30,"token_delay_ms":40}"#);

    // The uninterrupted answer, for comparison.
    let mut plain = sluice.chat_stream(&body);
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("x-sluice-stream-id"), None, "not opted in");
    let whole = sse_text(&plain.read_to_end(Duration::from_secs(10)));
    assert!(
        whole.starts_with("tok0 ") && whole.ends_with("tok29 "),
        "{whole}"
    );
    let chats_before = chat_records(&mock.log()).len();

    // Opted in by header: read a few events, then hang up mid-stream.
    let auth = format!("Bearer {KEY}");
    let mut first = StreamReader::open(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &auth), ("x-sluice-resumable", "true")],
        &body,
    );
    assert_eq!(first.status, 200);
    let sid = first
        .header("x-sluice-stream-id")
        .expect("x-sluice-stream-id on the head")
        .to_string();
    assert!(sid.starts_with("sc_"), "{sid}");
    let mut got = Vec::new();
    while complete_events(&got).len() < 4 {
        got.extend(
            first
                .next_piece(Duration::from_secs(5))
                .expect("more events"),
        );
    }
    first.close();
    let before = complete_events(&got);
    for (i, e) in before.iter().enumerate() {
        assert_eq!(
            event_id(e),
            Some(format!("{sid}:{}", i + 1).as_str()),
            "{e}"
        );
    }
    let last = event_id(before.last().expect("events"))
        .expect("an id")
        .to_string();

    // Resume after the last complete event.
    let mut resumed = StreamReader::open_raw(
        sluice.addr,
        "GET",
        &format!("/v1/streams/{sid}"),
        &[("authorization", &auth), ("last-event-id", &last)],
        b"",
    );
    assert_eq!(resumed.status, 200);
    assert_eq!(resumed.header("x-sluice-stream-id"), Some(sid.as_str()));
    let rest = resumed.read_to_end(Duration::from_secs(10));
    let after = complete_events(&rest);
    assert_eq!(
        event_id(&after[0]),
        Some(format!("{sid}:{}", before.len() + 1).as_str()),
        "the resume starts right after the event named"
    );
    assert!(after.last().is_some_and(|e| e.ends_with("data: [DONE]")));

    let mut joined = before.join("\n\n").into_bytes();
    joined.extend_from_slice(b"\n\n");
    joined.extend_from_slice(&rest);
    assert_eq!(
        sse_text(&joined),
        whole,
        "the text reassembles the uninterrupted answer"
    );

    // One generation: the provider saw one request, and the resume counted once.
    assert_eq!(chat_records(&mock.log()).len(), chats_before + 1);
    assert!(eventually(Duration::from_secs(3), || sluice
        .metric("sluice_stream_resumes_total{outcome=\"resumed\"}")
        == 1.0));
    // The stream is over: no generation is held, only its tail (kept for the grace window
    // for a client that lost it unread), and a resume naming the final event is told the
    // stream completed.
    assert!(eventually(Duration::from_secs(3), || {
        sluice.gauge("sluice_resumable_streams{state=\"attached\"}") == 0.0
            && sluice.gauge("sluice_resumable_streams{state=\"detached\"}") == 0.0
            && sluice.gauge("sluice_resumable_streams{state=\"completed\"}") == 1.0
    }));
    let final_id = event_id(after.last().expect("events")).expect("an id");
    let late = crate::harness::get(
        sluice.addr,
        &format!("/v1/streams/{sid}"),
        &[("authorization", &auth), ("last-event-id", final_id)],
    );
    assert_eq!(late.status, 410, "{}", late.text());
    assert_eq!(late.json()["error"]["code"], "stream_completed");
}
