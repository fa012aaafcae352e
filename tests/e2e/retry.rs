//! The same-route retry policy (`server.retry`, `models.<id>.retry`): a one-off 500 is retried
//! on the route that failed, a persistent 503 gets `max_attempts_per_route` attempts and then
//! falls back, a short `Retry-After` is waited out on the same route while a long one rests the
//! route and falls back at once, connect errors are retried unless `on` leaves them out, a
//! model's override wins, and the per-route budget caps retries at a share of the minute's
//! requests. Every retry is an attempt: in `x-sluice-attempts`, the access log and
//! `sluice_upstream_retries_total`. Hit counts per provider are asserted in each.

use std::time::{Duration, Instant};

use crate::fallback::{assert_served_stream, body, chat_hits, config, Metrics, P};
use crate::harness::{dead_url, Mock, Sluice};

/// The default policy but for the budget (room for every retry here; the budget has its own
/// test with the default 0.2). The helper turns retries off unless `retry:` is set.
const DEFAULTS: &str = "  retry: {max_attempts_per_route: 2, backoff_ms: 100, max_retry_after_wait_ms: 2000, budget_ratio: 1.0}\n";
/// Health thresholds high enough that failures here never rest a route.
const MANY: &str = "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n";

fn tokens(n: usize) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

#[test]
fn a_one_off_500_is_retried_on_the_same_route() {
    let p1 = Mock::start(r#"{"fail_first":1,"status":500,"fail_key":"once","tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        DEFAULTS,
        &[P("p1", &p1.base_url(), MANY), P("p2", &p2.base_url(), "")],
        "",
    ));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p1"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    assert_eq!(r.header("x-sluice-attempts"), Some("2"));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (2, 0));
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_upstream_retries_total",
            &[("provider", "p1"), ("reason", "status_5xx")]
        ),
        1.0
    );
    assert_eq!(m.get("sluice_fallback_total", &[]), 0.0);
    assert!(
        crate::harness::eventually(Duration::from_secs(5), || sluice
            .log()
            .contains("attempts=2 status=200")),
        "{}",
        sluice.log()
    );
}

#[test]
fn a_persistent_503_gets_its_attempts_then_falls_back_and_a_model_may_turn_retries_off() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        DEFAULTS,
        &[P("p1", &p1.base_url(), MANY), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (2, 1));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.header("x-sluice-attempts"), Some("3"), "{}", r.text());

    // `models.acme/chat.retry` overrides `server.retry`: no retry on p1.
    let (p1, p2) = (
        Mock::start(r#"{"status":503}"#),
        Mock::start(r#"{"tokens":2}"#),
    );
    let sluice = Sluice::start(&config(
        DEFAULTS,
        &[P("p1", &p1.base_url(), MANY), P("p2", &p2.base_url(), "")],
        "    retry: {max_attempts_per_route: 1}\n",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
}

#[test]
fn a_short_retry_after_is_waited_out_and_a_long_one_rests_the_route() {
    // 429 with Retry-After: 1 (within max_retry_after_wait_ms): waited out on p1.
    let p1 = Mock::start(
        r#"{"fail_first":1,"status":429,"retry_after_s":1,"fail_key":"ra","tokens":2}"#,
    );
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        DEFAULTS,
        &[P("p1", &p1.base_url(), MANY), P("p2", &p2.base_url(), "")],
        "",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(950), "did not wait: {took:?}");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (2, 0));
    // The wait was this request's: p1 is not resting afterwards.
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (3, 0));

    // Retry-After: 30 (longer): no wait; p1 rests and p2 serves at once, also next time.
    let p1 = Mock::start(r#"{"status":429,"retry_after_s":30}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        DEFAULTS,
        &[P("p1", &p1.base_url(), MANY), P("p2", &p2.base_url(), "")],
        "",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_served_stream(&sluice, &body(true, ""), "p2", 0, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 2));
}

#[test]
fn connect_errors_are_retried_unless_on_leaves_them_out() {
    let sluice = Sluice::start(&config(DEFAULTS, &[P("p1", &dead_url(), MANY)], ""));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("x-sluice-attempts"), Some("2"));
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "connect")]
        ),
        2.0
    );
    assert_eq!(
        m.get(
            "sluice_upstream_retries_total",
            &[("provider", "p1"), ("reason", "connect")]
        ),
        1.0
    );
    let only_500 = "  retry: {max_attempts_per_route: 3, on: [500]}\n";
    let sluice = Sluice::start(&config(only_500, &[P("p1", &dead_url(), MANY)], ""));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-sluice-attempts"), Some("1"));
}

#[test]
fn the_retry_budget_caps_retries_at_a_share_of_the_routes_requests() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let sluice = Sluice::start(&config(
        "  retry: {budget_ratio: 0.2}\n",
        &[P("p1", &p1.base_url(), MANY)],
        "",
    ));
    for _ in 0..10 {
        assert_eq!(sluice.chat(&body(false, "")).status, 503);
    }
    // 20% of 10 requests, rounded up as they came: the 1st and the 6th were retried.
    assert_eq!(chat_hits(&p1), 12);
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_upstream_retries_total",
            &[("provider", "p1"), ("reason", "status_5xx")]
        ),
        2.0
    );
}

#[test]
fn a_reset_before_the_head_is_retried_and_a_protocol_violation_is_not() {
    // `connection_reset`: the mock resets the first connection, then answers.
    let p1 = Mock::start(r#"{"fail_first":1,"reset":true,"fail_key":"rst","tokens":2}"#);
    let sluice = Sluice::start(&config(DEFAULTS, &[P("p1", &p1.base_url(), MANY)], ""));
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    assert_eq!(chat_hits(&p1), 2);
    // A stream answered to `stream: false` repeats itself: not retried.
    let p1 = Mock::start(r#"{"tokens":2,"stream_always":true}"#);
    let sluice = Sluice::start(&config(DEFAULTS, &[P("p1", &p1.base_url(), MANY)], ""));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("x-sluice-attempts"), Some("1"));
    assert_eq!(chat_hits(&p1), 1);
}
