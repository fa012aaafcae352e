//! Per-hop timeouts: connect, first byte, first event, stream idle, maximum stream duration,
//! downstream write; and the waiting-phase timers end once a stream flows.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::cancellation::{
    aborts, chat_body, chat_records, wait_chat, wait_metric, Blackhole, MockClock, CLOSE_BOUND_MS,
};
use crate::harness::client::{sse_events, sse_text};
use crate::harness::{Mock, Sluice, KEY};

/// A config with providers `(id, base_url, extra provider lines)` and model `acme/chat`
/// routed to them in order (priority 1, 2, ...). `server` lines go under `server:`.
pub(crate) fn config(server: &str, providers: &[(&str, &str, &str)]) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{server}tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for (id, url, extra) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: openai\n    base_url: {url}\n    api_key: sk-{id}\n    health_check: {{enabled: false}}\n{extra}"
        ));
    }
    y.push_str("models:\n  acme/chat:\n    routes:\n");
    for (i, (id, _, _)) in providers.iter().enumerate() {
        y.push_str(&format!(
            "      - provider: {id}\n        upstream_model: mock-small-v1\n        priority: {}\n",
            i + 1
        ));
    }
    y
}

/// Reads a stream to its end (bounded per read).
fn read_all(s: &mut crate::harness::StreamReader) -> String {
    String::from_utf8_lossy(&s.read_to_end(Duration::from_secs(10))).into_owned()
}

#[test]
fn connect_timeout_falls_back_to_the_next_provider() {
    let hole = Blackhole::start();
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "",
        &[
            ("p1", &hole.base_url(), "    connect_timeout_ms: 300\n"),
            ("p2", &mock.base_url(), ""),
        ],
    ));
    let t = Instant::now();
    let r = sluice.chat(&chat_body(false, r#"{"tokens":2}"#));
    let took = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    eprintln!("connect timeout + fallback took {took:?}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(
        sluice.metric("sluice_upstream_attempts_total{outcome=\"connect\",provider=\"p1\"}") >= 1.0,
        "{}",
        sluice.metrics()
    );
}

#[test]
fn connect_timeout_alone_is_a_prompt_gateway_error() {
    let hole = Blackhole::start();
    let sluice = Sluice::start(&config(
        "  connect_timeout_ms: 250\n",
        &[("p1", &hole.base_url(), "")],
    ));
    let t = Instant::now();
    let r = sluice.chat(&chat_body(true, "{}"));
    let took = t.elapsed();
    eprintln!("connect timeout answered in {took:?}: {}", r.text());
    assert!(
        r.status == 502 || r.status == 504,
        "{} {}",
        r.status,
        r.text()
    );
    assert!(r.text().contains("timed out"), "{}", r.text());
    assert!(took >= Duration::from_millis(250), "{took:?}");
    // At most one same-route retry: two connect timeouts plus a short backoff.
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn first_byte_timeout_is_504_and_closes_the_upstream() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "",
        &[("p1", &mock.base_url(), "    first_byte_timeout_ms: 300\n")],
    ));
    let t = Instant::now();
    let r = sluice.chat(&chat_body(true, r#"{"first_byte_delay_ms":5000}"#));
    let took = t.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_timeout");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    let rec = wait_chat(&mock, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "before_head");
    assert_eq!(chat_records(&mock.log()).len(), 1, "no retry of a timeout");
}

#[test]
fn first_byte_timeout_falls_back_invisibly() {
    let slow = Mock::start(r#"{"first_byte_delay_ms":5000}"#);
    let fast = Mock::start(r#"{"tokens":3}"#);
    let sluice = Sluice::start(&config(
        "  first_byte_timeout_ms: 300\n",
        &[("p1", &slow.base_url(), ""), ("p2", &fast.base_url(), "")],
    ));
    let mut s = sluice.chat_stream(&chat_body(true, "{}").replace(r#","mock":{}"#, ""));
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-sluice-provider"), Some("p2"));
    let body = read_all(&mut s);
    assert_eq!(sse_text(body.as_bytes()), "tok0 tok1 tok2 ");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("error"), "{body}");
    let rec = wait_chat(&slow, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "before_head");
}

#[test]
fn first_event_timeout_before_commit_is_504() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "  first_event_timeout_ms: 300\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let t = Instant::now();
    let r = sluice.chat(&chat_body(true, r#"{"first_event_delay_ms":5000}"#));
    assert_eq!(r.status, 504, "{}", r.text());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    let rec = wait_chat(&mock, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "after_head");
}

#[test]
fn idle_stream_gets_an_error_event_then_closes() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "",
        &[("p1", &mock.base_url(), "    idle_timeout_ms: 300\n")],
    ));
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":5,"stall_after_tokens":2}"#));
    assert_eq!(s.status, 200);
    let mut body = Vec::new();
    while sse_text(&body) != "tok0 tok1 " {
        body.extend(s.next_piece(Duration::from_secs(5)).expect("tokens"));
    }
    let last_token = Instant::now();
    let clock = MockClock::read(&mock);
    let rest = s.read_to_end(Duration::from_secs(5));
    let ended = Instant::now();
    let took = ended - last_token;
    assert!(s.is_done(), "the stream must end (chunked terminator)");
    let rest = String::from_utf8_lossy(&rest).into_owned();
    let events = sse_events(rest.as_bytes());
    assert_eq!(events.len(), 1, "{rest}");
    assert!(events[0].starts_with("event: error\ndata: {"), "{rest}");
    assert!(events[0].contains("\"code\":\"idle_timeout\""), "{rest}");
    eprintln!("idle error event after {took:?}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    let rec = wait_chat(&mock, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "mid_stream");
    // The upstream was closed when the error event went out.
    let delay = clock.delay_upper_ms(ended, rec["peer_closed_at_ms"].as_u64().unwrap_or(0));
    assert!(
        delay <= CLOSE_BOUND_MS,
        "upstream closed {delay} ms after the stream ended"
    );
    assert_eq!(
        sluice.metric("sluice_stream_errors_total{reason=\"idle_timeout\"}"),
        1.0
    );
}

#[test]
fn max_stream_duration_ends_a_flowing_stream() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "  max_stream_duration_ms: 700\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let t = Instant::now();
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":1000,"token_delay_ms":20}"#));
    let body = read_all(&mut s);
    let took = t.elapsed();
    assert!(s.is_done());
    let events = sse_events(body.as_bytes());
    let last = events.last().expect("events");
    assert!(last.contains("\"code\":\"max_stream_duration\""), "{last}");
    assert!(sse_text(body.as_bytes()).starts_with("tok0 tok1 tok2 "));
    eprintln!("max duration cut after {took:?}");
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    let rec = wait_chat(&mock, 0, Duration::from_secs(2), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["phase"], "mid_stream");
}

#[test]
fn a_long_flowing_stream_outlives_the_waiting_phase_timers() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        // The waiting-phase timers are a quarter of the stream's length, with room for a
        // loaded CI machine to deliver the first token late.
        "  first_byte_timeout_ms: 600\n  first_event_timeout_ms: 600\n  idle_timeout_ms: 1500\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let t = Instant::now();
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":25,"token_delay_ms":100}"#));
    assert_eq!(s.status, 200);
    let body = read_all(&mut s);
    assert!(
        t.elapsed() > Duration::from_millis(2400),
        "{:?}",
        t.elapsed()
    );
    let want: String = (0..25).map(|i| format!("tok{i} ")).collect();
    assert_eq!(sse_text(body.as_bytes()), want);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("event: error"), "{body}");
    assert_eq!(chat_records(&mock.log())[0]["completed"], true);
}

#[test]
fn a_client_that_stops_reading_is_disconnected_after_the_write_timeout() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "  downstream_write_timeout_ms: 500\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let total: u64 = 50 * 1024 * 1024;
    let mut s = sluice.chat_stream(&chat_body(true, &format!(r#"{{"total_bytes":{total}}}"#)));
    assert_eq!(s.status, 200);
    s.next_piece(Duration::from_secs(5));
    // Read nothing more. Sluice's writes block, time out, and it hangs up both sides.
    let t = Instant::now();
    let rec = wait_chat(&mock, 0, Duration::from_secs(15), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    let took = t.elapsed();
    eprintln!(
        "upstream closed {took:?} after the client stopped reading; mock wrote {} bytes",
        rec["bytes_written"]
    );
    // No write can block before the client stops reading, and a blocked write lasts the
    // 500 ms timeout; the buffers between fill in well under a second on loopback. `took`
    // bounds the close from above (the log is polled every 5 ms).
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    assert!(
        rec["bytes_written"].as_u64().unwrap_or(0) < total / 2,
        "{rec:#?}"
    );
    assert_eq!(rec["completed"], false);
    let (n, _) = wait_metric(&sluice, &aborts("streaming"), 1.0, Duration::from_secs(2));
    assert_eq!(n, 1.0);
    // The client side was closed too: draining what the kernel buffered ends in EOF,
    // without the chunked terminator.
    let mut sock = s.socket().try_clone().expect("clone");
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                let keep = tail.len().saturating_sub(16);
                tail.drain(..keep);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the client connection was not closed: {e}"),
        }
    }
    assert!(!tail.ends_with(b"0\r\n\r\n"), "{tail:?}");
}

#[test]
fn a_tls_handshake_that_never_completes_is_bounded_by_the_connect_timeout() {
    // Accepts TCP, then says nothing: the TLS handshake hangs after the ClientHello.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming().take(2) {
            let Ok(mut c) = c else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut buf = [0u8; 4096];
                let mut hello = 0;
                // Read until Sluice gives up (EOF/reset) or 10 s pass.
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => hello += n,
                    }
                }
                let _ = tx.send(hello);
            });
        }
    });
    let sluice = Sluice::start(&config(
        "",
        &[(
            "p1",
            &format!("https://{addr}/v1"),
            "    connect_timeout_ms: 300\n",
        )],
    ));
    let t = Instant::now();
    let r = sluice.chat(&chat_body(true, "{}"));
    let took = t.elapsed();
    eprintln!("TLS handshake timeout answered in {took:?}: {}", r.text());
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("timed out"), "{}", r.text());
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // Sluice sent a ClientHello and then hung up when the timeout fired.
    let hello = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the provider saw sluice hang up");
    assert!(hello > 0, "no ClientHello was sent");
}
