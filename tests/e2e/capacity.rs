//! Per-provider concurrency caps (`providers.<id>.max_concurrent_requests`): a full provider
//! is skipped for the next route without touching its health; when every candidate is full
//! the client gets 503 `provider_capacity` with `Retry-After`.

use std::time::Duration;

use crate::fallback::{body, chat_hits, config, P};
use crate::harness::{Mock, Sluice, KEY};
use crate::redis_limits::{chat_as, eventually};

/// A request that `mock`'s provider holds for `ms` before it answers.
fn held(s: &Sluice, ms: u64) -> std::thread::JoinHandle<crate::harness::Response> {
    let addr = s.addr;
    let b = body(false, &format!(r#","mock":{{"first_byte_delay_ms":{ms}}}"#));
    std::thread::spawn(move || chat_as(addr, KEY, &b))
}

#[test]
fn a_full_provider_is_skipped_for_the_next_route_and_keeps_its_health() {
    let a = Mock::start("{}");
    let b = Mock::start("{}");
    let s = Sluice::start(&config(
        "",
        &[
            P("a", &a.base_url(), "    max_concurrent_requests: 1\n"),
            P("b", &b.base_url(), ""),
        ],
        "",
    ));
    let holder = held(&s, 1000);
    assert!(eventually(Duration::from_secs(5), || chat_hits(&a) == 1));

    // `a` holds its one request: the next goes to `b`, and `a` never sees it.
    let r = chat_as(s.addr, KEY, &body(false, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("b"));
    // Skipped, not tried: the depth counts routes that failed (as for a resting route), and
    // `sluice_fallback_total` shows the move with its own reason (below).
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    assert_eq!((chat_hits(&a), chat_hits(&b)), (1, 1));
    assert_eq!(holder.join().unwrap().status, 200);

    // Full was not failing: with its place back, `a` is first again.
    let r = chat_as(s.addr, KEY, &body(false, ""));
    assert_eq!(r.header("x-sluice-provider"), Some("a"));
    assert_eq!((chat_hits(&a), chat_hits(&b)), (2, 1));
    assert_eq!(
        s.gauge(r#"sluice_provider_health{provider="a",route="a/a-model"}"#),
        0.0,
        "the skip left `a` healthy"
    );
    assert_eq!(
        s.metric(
            r#"sluice_fallback_total{from_provider="a",model="acme/chat",reason="provider_capacity",to_provider="b"}"#
        ),
        1.0
    );
}

#[test]
fn every_candidate_full_is_a_503_with_retry_after() {
    let a = Mock::start("{}");
    let s = Sluice::start(&config(
        "",
        &[P("a", &a.base_url(), "    max_concurrent_requests: 1\n")],
        "",
    ));
    let holder = held(&s, 1000);
    assert!(eventually(Duration::from_secs(5), || chat_hits(&a) == 1));
    let r = chat_as(s.addr, KEY, &body(true, ""));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let v = r.json();
    assert_eq!(v["error"]["code"], "provider_capacity", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("provider `a` is at its limit"),
        "{v}"
    );
    assert_eq!(chat_hits(&a), 1, "the refused request never reached `a`");
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="provider_capacity"}"#),
        1.0
    );
    assert_eq!(holder.join().unwrap().status, 200);
    assert_eq!(chat_as(s.addr, KEY, &body(false, "")).status, 200);
    assert_eq!(chat_hits(&a), 2);
}
