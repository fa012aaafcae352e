//! Admission control on one Sluice process (no Redis): the global cap's bounded FIFO queue
//! (order, timeout → 503, full → 503, a queued client that leaves frees its place at once),
//! and each per-tenant limit (concurrency, requests and tokens per window, tenant × model)
//! with its 429, `Retry-After` and OpenAI `x-ratelimit-*` headers on every response.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::{get, Mock, Response, Sluice, KEY};
use crate::redis_limits::{chat_as, eventually, limits_config, small_body};

/// A chat body for `acme/chat` whose only message is `marker`, with mock knobs `mock`.
fn body_with(marker: &str, mock: &str) -> String {
    format!(
        r#"{{"model":"acme/chat","messages":[{{"role":"user","content":"{marker}"}}],"mock":{mock}}}"#
    )
}

/// Sends a chat request and returns the open socket without reading (to hang up while
/// queued).
fn send_raw(addr: SocketAddr, body: &str) -> TcpStream {
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).expect("write request");
    sock
}

/// Holds the only global slot: a request the mock answers after `ms`.
fn hold_slot(s: &Sluice, ms: u64) -> std::thread::JoinHandle<Response> {
    let addr = s.addr;
    let body = body_with("holder", &format!(r#"{{"first_byte_delay_ms":{ms}}}"#));
    std::thread::spawn(move || chat_as(addr, KEY, &body))
}

fn queue_depth(s: &Sluice) -> f64 {
    s.gauge("sluice_admission_queue_depth")
}

fn wait_depth(s: &Sluice, depth: f64) {
    assert!(
        eventually(Duration::from_secs(5), || queue_depth(s) == depth),
        "queue depth stayed {} (wanted {depth})",
        queue_depth(s)
    );
}

fn assert_error(r: &Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    v
}

fn server(cap: usize, queue: usize, timeout_ms: u64) -> String {
    format!(
        "  max_concurrent_upstream_requests: {cap}\n  queue_size: {queue}\n  queue_timeout_ms: {timeout_ms}\n"
    )
}

#[test]
fn queued_requests_are_admitted_in_fifo_order() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        &server(1, 8, 20_000),
        "{}",
        "",
    ));
    let holder = hold_slot(&s, 800);
    assert!(eventually(Duration::from_secs(5), || mock.hits() == 1));
    let mut waiting = Vec::new();
    for i in 0..4 {
        let addr = s.addr;
        let body = body_with(&format!("queued-{i}"), "{}");
        waiting.push(std::thread::spawn(move || chat_as(addr, KEY, &body)));
        // Enqueue strictly one after the other.
        wait_depth(&s, f64::from(i + 1));
    }
    assert_eq!(holder.join().unwrap().status, 200);
    for w in waiting {
        assert_eq!(w.join().unwrap().status, 200);
    }
    let order: Vec<String> = mock
        .log()
        .iter()
        .map(|r| {
            let b = r["body"].as_str().unwrap_or_default();
            ["holder", "queued-0", "queued-1", "queued-2", "queued-3"]
                .into_iter()
                .find(|m| b.contains(m))
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    assert_eq!(
        order,
        ["holder", "queued-0", "queued-1", "queued-2", "queued-3"]
    );
    wait_depth(&s, 0.0);
}

#[test]
fn queue_timeout_and_full_queue_answer_503_with_retry_after() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        &server(1, 1, 300),
        "{}",
        "",
    ));
    let holder = hold_slot(&s, 1500);
    assert!(eventually(Duration::from_secs(5), || mock.hits() == 1));

    // One waits (and times out after 300 ms); meanwhile the queue is full for the next.
    let addr = s.addr;
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        (chat_as(addr, KEY, &small_body("acme/chat")), t.elapsed())
    });
    wait_depth(&s, 1.0);
    let t = Instant::now();
    let full = chat_as(s.addr, KEY, &small_body("acme/chat"));
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "a full queue answers at once (took {:?})",
        t.elapsed()
    );
    let v = assert_error(&full, 503, "queue_full");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(full.header("retry-after"), Some("1"));

    let (timed_out, waited) = waiter.join().unwrap();
    assert_error(&timed_out, 503, "queue_timeout");
    assert_eq!(timed_out.header("retry-after"), Some("1"));
    assert!(
        waited >= Duration::from_millis(280) && waited < Duration::from_millis(1400),
        "waited {waited:?} for a 300 ms queue timeout"
    );
    assert_eq!(holder.join().unwrap().status, 200);
    assert_eq!(mock.hits(), 1, "rejected requests never reach the provider");
    assert_eq!(
        s.metric("sluice_rejected_total{reason=\"queue_full\"}"),
        1.0
    );
    assert_eq!(
        s.metric("sluice_rejected_total{reason=\"queue_timeout\"}"),
        1.0
    );
    wait_depth(&s, 0.0);
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place_at_once() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        &server(1, 1, 20_000),
        "{}",
        "",
    ));
    let holder = hold_slot(&s, 1500);
    assert!(eventually(Duration::from_secs(5), || mock.hits() == 1));
    let leaver = send_raw(s.addr, &body_with("leaver", "{}"));
    wait_depth(&s, 1.0);
    let _ = leaver.shutdown(std::net::Shutdown::Both);
    drop(leaver);
    let left = Instant::now();
    wait_depth(&s, 0.0);
    assert!(
        left.elapsed() < Duration::from_millis(500),
        "the queue place was freed {:?} after the client left",
        left.elapsed()
    );
    // The place is usable again (queue_size 1): this one waits and is served.
    let addr = s.addr;
    let next = std::thread::spawn(move || chat_as(addr, KEY, &body_with("after-leaver", "{}")));
    wait_depth(&s, 1.0);
    assert_eq!(holder.join().unwrap().status, 200);
    assert_eq!(next.join().unwrap().status, 200);
    let bodies: Vec<String> = mock
        .log()
        .iter()
        .map(|r| r["body"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(bodies.len(), 2);
    assert!(
        !bodies.iter().any(|b| b.contains("\"leaver\"")),
        "{bodies:?}"
    );
    assert_eq!(
        s.metric("sluice_client_aborts_total{phase=\"queued\"}"),
        1.0
    );
}

#[test]
fn tenant_concurrency_limit_answers_429() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        "",
        "{max_concurrent_streams: 1, requests_per_minute: 100}",
        "",
    ));
    let holder = hold_slot(&s, 1000);
    assert!(eventually(Duration::from_secs(5), || mock.hits() == 1));
    let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
    let v = assert_error(&r, 429, "tenant_concurrency");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Limit 1 concurrent"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-ratelimit-limit-requests"), Some("100"));
    // The tenant `warm` is not limited by `t`'s streams.
    let other = chat_as(
        s.addr,
        crate::redis_limits::WARM_KEY,
        &small_body("acme/chat"),
    );
    assert_eq!(other.status, 200);
    assert_eq!(holder.join().unwrap().status, 200);
    assert_eq!(chat_as(s.addr, KEY, &small_body("acme/chat")).status, 200);
    assert_eq!(
        s.metric("sluice_rejected_total{reason=\"tenant_concurrency\"}"),
        1.0
    );
}

#[test]
fn requests_per_window_limit_with_openai_headers_everywhere() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        "  rate_limit_window_ms: 1500\n",
        "{requests_per_minute: 3}",
        "",
    ));
    // A stream carries the headers in its head too.
    let mut st = s.chat_stream(
        r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(st.status, 200);
    assert_eq!(
        st.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(st.header("x-ratelimit-limit-requests"), Some("3"));
    assert_eq!(st.header("x-ratelimit-remaining-requests"), Some("2"));
    st.read_to_end(Duration::from_secs(10));
    for remaining in ["1", "0"] {
        let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some(remaining));
        let reset = r.header("x-ratelimit-reset-requests").unwrap();
        assert!(reset.ends_with('s'), "reset {reset}");
        assert!(
            r.header("x-ratelimit-limit-tokens").is_none(),
            "no token limit set"
        );
    }
    let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
    let v = assert_error(&r, 429, "tenant_rpm");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("tenant `t`") && msg.contains("Limit 3, Used 3"),
        "{msg}"
    );
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "retry-after {retry}");
    // Errors and model lists of the tenant carry them as well.
    let models = get(
        s.addr,
        "/v1/models",
        &[("authorization", &format!("Bearer {KEY}"))],
    );
    assert_eq!(models.status, 200);
    assert_eq!(models.header("x-ratelimit-remaining-requests"), Some("0"));
    let bad = chat_as(s.addr, KEY, &small_body("nope"));
    assert_eq!(bad.status, 404);
    assert_eq!(bad.header("x-ratelimit-limit-requests"), Some("3"));
    // Room again about Retry-After later, not much sooner (refused tries are not charged).
    let refused_at = Instant::now();
    let mut tries = 0;
    while chat_as(s.addr, KEY, &small_body("acme/chat")).status == 429 {
        tries += 1;
        assert!(
            refused_at.elapsed() < Duration::from_secs(retry + 2),
            "still limited {:?} after a Retry-After of {retry} s",
            refused_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = refused_at.elapsed();
    assert!(
        waited + Duration::from_secs(1) >= Duration::from_secs(retry),
        "admitted after {waited:?}, well before Retry-After {retry} s"
    );
    assert_eq!(
        s.metric("sluice_rejected_total{reason=\"tenant_rpm\"}"),
        f64::from(1 + tries)
    );
    assert_eq!(mock.hits(), 4);
}

#[test]
fn tokens_per_window_count_the_real_usage() {
    // 60 completion tokens + 1 prompt token per answer.
    let mock = Mock::start(r#"{"tokens":60,"prompt_tokens":1}"#);
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        "",
        "{tokens_per_minute: 100}",
        "",
    ));
    // One user message "hi": estimated with the o200k_base tokenizer at 7 input tokens
    // (3 reply priming + 3 message framing + 1 for "hi").
    let body = small_body("acme/chat");
    // The real usage is settled just after the answer is written, before its access line
    // (`charge_usd=` is only in access lines): wait for that line before the next request.
    let settled = |n: usize| {
        assert!(
            eventually(Duration::from_secs(3), || s
                .log()
                .matches(" charge_usd=")
                .count()
                >= n),
            "{}",
            s.log()
        );
    };
    let r = chat_as(s.addr, KEY, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("100"));
    assert_eq!(r.header("x-ratelimit-remaining-tokens"), Some("93"));
    settled(1);
    // Charged now: 61 real tokens. The next estimate (7) still fits: 68.
    let r = chat_as(s.addr, KEY, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining-tokens"), Some("32"));
    settled(2);
    // 122 now: over.
    let r = chat_as(s.addr, KEY, &body);
    let v = assert_error(&r, 429, "tenant_tpm");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tokens per minute"));
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.header("x-ratelimit-remaining-tokens"), Some("0"));
    // A request whose estimate alone is over the limit can never pass: it says so.
    let huge = format!(
        r#"{{"model":"acme/chat","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "hello ".repeat(200)
    );
    let v = assert_error(&chat_as(s.addr, KEY, &huge), 429, "tenant_tpm");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Request too large"));
    assert_eq!(mock.hits(), 2);
}

#[test]
fn tenant_times_model_limits_apply_to_that_model_only() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&limits_config(
        &mock.base_url(),
        "",
        "{requests_per_minute: 10, model_limits: {acme/chat: {requests_per_minute: 1}}}",
        "",
    ));
    let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ratelimit-limit-requests"),
        Some("1"),
        "the binding limit"
    );
    let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
    let v = assert_error(&r, 429, "tenant_rpm");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("on model `acme/chat`"),
        "{v}"
    );
    let r = chat_as(s.addr, KEY, &small_body("acme/other"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-requests"), Some("10"));
    assert_eq!(
        r.header("x-ratelimit-remaining-requests"),
        Some("8"),
        "the tenant window counts both models"
    );
}
