//! Graceful shutdown: on SIGTERM Sluice stops accepting, lets open streams finish within
//! `shutdown_grace_ms`, then ends the rest with an SSE error event (upstreams closed), and
//! exits.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::cancellation::{
    chat_body, chat_records, wait_chat, MockClock, RawClient, CLOSE_BOUND_MS,
};
use crate::harness::client::{sse_events, sse_text};
use crate::harness::{Mock, Sluice};
use crate::timeouts::config;

const GRACE_MS: u64 = 1000;

/// Waits until connecting to `sluice` is refused; returns how long it took.
fn wait_refused(sluice: &Sluice, from: Instant) -> Duration {
    let end = from + Duration::from_secs(3);
    while Instant::now() < end {
        match TcpStream::connect_timeout(&sluice.addr, Duration::from_millis(100)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return from.elapsed(),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    panic!(
        "sluice still accepts connections {:?} after SIGTERM",
        from.elapsed()
    );
}

#[test]
fn sigterm_drains_short_streams_and_cancels_long_ones() {
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&config(
        &format!("  shutdown_grace_ms: {GRACE_MS}\n"),
        &[("p1", &mock.base_url(), "")],
    ));
    // A ends ~500 ms after the signal, within the grace period; B would run for 100 s.
    let mut short = sluice.chat_stream(&chat_body(true, r#"{"tokens":5,"token_delay_ms":100}"#));
    let mut long = sluice.chat_stream(&chat_body(true, r#"{"tokens":1000,"token_delay_ms":100}"#));
    assert_eq!((short.status, long.status), (200, 200));
    wait_chat(&mock, 1, Duration::from_secs(3), |r| {
        r["head_at_ms"].is_u64()
    });
    let clock = MockClock::read(&mock);

    let term = Instant::now();
    sluice.signal("TERM");
    let refused_after = wait_refused(&sluice, term);
    eprintln!("new connections refused {refused_after:?} after SIGTERM");

    let short_body = short.read_to_end(Duration::from_secs(5));
    assert!(short.is_done());
    assert_eq!(sse_text(&short_body), "tok0 tok1 tok2 tok3 tok4 ");
    assert!(short_body.ends_with(b"data: [DONE]\n\n"));
    assert!(!String::from_utf8_lossy(&short_body).contains("event: error"));

    let long_body = long.read_to_end(Duration::from_secs(5));
    let ended = Instant::now();
    assert!(
        long.is_done(),
        "the cancelled stream ends with a chunked terminator"
    );
    let cut_after = ended - term;
    eprintln!("long stream cancelled {cut_after:?} after SIGTERM");
    assert!(
        cut_after >= Duration::from_millis(GRACE_MS - 50)
            && cut_after < Duration::from_millis(GRACE_MS + 1000),
        "{cut_after:?}"
    );
    let events = sse_events(&long_body);
    let last = events.last().expect("events");
    assert!(last.starts_with("event: error\n"), "{last}");
    assert!(last.contains("\"code\":\"shutdown\""), "{last}");
    assert!(sse_text(&long_body).starts_with("tok0 tok1 tok2 "));

    let rec = wait_chat(&mock, 1, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "mid_stream");
    let delay = clock.delay_upper_ms(ended, rec["peer_closed_at_ms"].as_u64().unwrap_or(0));
    assert!(
        delay <= CLOSE_BOUND_MS,
        "upstream closed {delay} ms after the error event"
    );
    assert_eq!(chat_records(&mock.log())[0]["completed"], true);

    let status = sluice
        .wait_exit(Duration::from_secs(10))
        .expect("sluice exits after the grace period");
    eprintln!("exited {:?} after SIGTERM: {status}", term.elapsed());
    assert!(status.success(), "{status}");
}

#[test]
fn sigterm_answers_requests_still_waiting_for_their_first_event() {
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&config(
        &format!("  shutdown_grace_ms: {GRACE_MS}\n"),
        &[("p1", &mock.base_url(), "")],
    ));
    let waiting = RawClient::send(
        sluice.addr,
        &chat_body(true, r#"{"first_event_delay_ms":30000}"#),
    );
    wait_chat(&mock, 0, Duration::from_secs(3), |r| {
        r["head_at_ms"].is_u64()
    });
    let term = Instant::now();
    sluice.signal("TERM");
    let r = waiting.read_response(Duration::from_secs(5));
    let took = term.elapsed();
    eprintln!("waiting request answered {took:?} after SIGTERM: {r}");
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("shutting down"), "{r}");
    assert!(took < Duration::from_millis(GRACE_MS + 1000), "{took:?}");
    let rec = wait_chat(&mock, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "after_head");
    assert!(sluice.wait_exit(Duration::from_secs(10)).is_some());
}

#[test]
fn an_idle_gateway_exits_at_once_on_sigterm() {
    let mock = Mock::start("{}");
    // A long grace period: with nothing in flight, none of it is waited out.
    let mut sluice = Sluice::start(&config(
        "  shutdown_grace_ms: 30000\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let r = sluice.chat(&chat_body(false, r#"{"tokens":2}"#));
    assert_eq!(r.status, 200, "{}", r.text());
    let from = Instant::now();
    sluice.signal("TERM");
    let status = sluice
        .wait_exit(Duration::from_secs(5))
        .expect("an idle sluice exits well before its 30 s grace period");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        from.elapsed() < Duration::from_secs(3),
        "{:?}",
        from.elapsed()
    );
}
