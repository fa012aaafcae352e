//! Bounded memory for a stalled reader: the upstream streams 50 MB as fast as it can, the
//! client reads nothing. Sluice must stop reading upstream (the mock is seen to block), its
//! RSS must grow by less than 10 MB, and once the client reads again the whole stream
//! arrives intact.

use std::time::{Duration, Instant};

use crate::cancellation::{chat_body, chat_records, wait_chat};
use crate::harness::client::sse_events;
use crate::harness::{Mock, Sluice, StreamReader};
use crate::timeouts::config;

const TOTAL: u64 = 50 * 1024 * 1024;

#[test]
fn a_stalled_reader_blocks_the_upstream_and_bounds_memory() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "  downstream_write_timeout_ms: 60000\n",
        &[("p1", &mock.base_url(), "")],
    ));
    // Warm up (allocator arenas, pools, lazy statics) with a fully read 2 MB stream.
    let warm = sluice.chat(&chat_body(true, r#"{"total_bytes":2097152}"#));
    assert_eq!(warm.status, 200);
    let baseline = sluice.rss_kib();

    let mut s = sluice.chat_stream(&chat_body(true, &format!(r#"{{"total_bytes":{TOTAL}}}"#)));
    assert_eq!(s.status, 200);
    let mut body = s.next_piece(Duration::from_secs(5)).expect("first piece");

    // Read nothing. Wait until the mock's writes stop progressing for a full second.
    let started = Instant::now();
    let mut peak_rss = baseline;
    let mut last = 0u64;
    let mut stable_since = Instant::now();
    let blocked_at = loop {
        std::thread::sleep(Duration::from_millis(100));
        peak_rss = peak_rss.max(sluice.rss_kib());
        let log = mock.log();
        let w = chat_records(&log)[1]["bytes_written"].as_u64().unwrap_or(0);
        if w != last {
            last = w;
            stable_since = Instant::now();
        } else if stable_since.elapsed() >= Duration::from_secs(1) {
            break w;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the upstream never blocked: {w} bytes written"
        );
    };
    // Hold the stall a little longer, watching memory.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        peak_rss = peak_rss.max(sluice.rss_kib());
    }
    let growth_kib = peak_rss.saturating_sub(baseline);
    eprintln!(
        "upstream blocked after {blocked_at} bytes ({:.1} MB of {} MB); sluice RSS {baseline} KiB -> peak {peak_rss} KiB (+{growth_kib} KiB)",
        blocked_at as f64 / 1048576.0,
        TOTAL / 1048576
    );
    assert!(
        blocked_at < TOTAL / 2,
        "the upstream was not held back: {blocked_at} bytes"
    );
    assert!(
        growth_kib < 10 * 1024,
        "sluice RSS grew by {growth_kib} KiB while the reader stalled"
    );
    let rec = &chat_records(&mock.log())[1];
    assert_eq!(rec["completed"], false);
    assert!(rec["peer_closed_at_ms"].is_null(), "{rec:#?}");

    // Read again: the rest flows and arrives intact.
    while let Some(p) = s.next_piece(Duration::from_secs(10)) {
        body.extend_from_slice(&p);
    }
    // Exactly the events the upstream sent, each intact: no loss, no duplicate. The same
    // request straight to the mock (which is deterministic) gives the expected count; as
    // Sluice sends it, asking for usage (metering), which makes each event a little longer.
    let got = content_events(&body);
    let mut direct_body: serde_json::Value = serde_json::from_str(
        &chat_body(true, &format!(r#"{{"total_bytes":{TOTAL}}}"#))
            .replace("acme/chat", "mock-small-v1"),
    )
    .expect("chat body JSON");
    direct_body["stream_options"] = serde_json::json!({"include_usage": true});
    let direct = StreamReader::open(
        mock.addr,
        "/v1/chat/completions",
        &[],
        &direct_body.to_string(),
    )
    .read_to_end(Duration::from_secs(30));
    let want = content_events(&direct);
    // 1 KiB tokens, each in an event of under 2 KiB, until 50 MiB of events are written.
    assert!(
        (TOTAL as usize / 2048..=TOTAL as usize / 1024).contains(&want),
        "{want} tokens straight from the mock"
    );
    assert_eq!(got, want, "content events through Sluice vs from the mock");
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let rec = wait_chat(&mock, 1, Duration::from_secs(5), |r| r["completed"] == true);
    assert!(rec["bytes_written"].as_u64().unwrap_or(0) >= TOTAL);
}

/// The 1 KiB text token the mock sends in `total_bytes` mode.
fn bulk_token() -> String {
    "lorem ipsum dolor sit amet ".repeat(38)[..1024].to_string()
}

/// Counts the content events of an SSE body, asserting each carries exactly one whole
/// bulk token (a split, merged or damaged event fails).
fn content_events(body: &[u8]) -> usize {
    let token = bulk_token();
    let mut n = 0;
    for ev in sse_events(body) {
        let Some(data) = ev.strip_prefix("data: ") else {
            panic!("unexpected event {ev:?}");
        };
        if data == "[DONE]" {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(data).unwrap_or_else(|e| panic!("bad event ({e}): {data}"));
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            if c.is_empty() {
                continue;
            }
            assert_eq!(c, token, "event {n} is not one whole token");
            n += 1;
        }
    }
    n
}
