//! Routes that heal, over real sockets: a flapping primary is used again within one cool-down
//! of its recovery (its half-open trial goes first, ahead of the healthy fallback), with
//! provider probes off, with list probes on (whose `GET /models` success does not heal the
//! chat route: its trial does) and with request probes (which heal it without client
//! traffic, unmetered); a provider probe's 200 never wipes a route's own failures; decay
//! without traffic; and the stale pooled connection resend, which happens only when the
//! provider cannot have processed the request and is then counted as an attempt.
//!
//! Client requests and request probes both reach the mock's chat path; probes carry
//! `x-request-id: sluice-health-probe`, so hit counts below count each apart.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fallback::{body, chat_log, config, Metrics, P};
use crate::harness::{eventually, Mock, Sluice};
use crate::health::{gauge, wait_gauge};

/// The `x-request-id` of request probes (`sluice::routing::request_probe::PROBE_REQUEST_ID`).
const PROBE_ID: &str = "sluice-health-probe";
/// The primary's cool-down in the flapping tests, ms.
const COOLDOWN_MS: u64 = 400;

fn is_probe(r: &Value) -> bool {
    r["headers"]["x-request-id"] == PROBE_ID
}

/// Client chat requests the mock received (request probes left out).
fn hits(mock: &Mock) -> usize {
    chat_log(mock).iter().filter(|r| !is_probe(r)).count()
}

/// Request probes the mock received.
fn probe_hits(mock: &Mock) -> usize {
    chat_log(mock).iter().filter(|r| is_probe(r)).count()
}

/// Health thresholds of the flapping primary: degraded after 1 failure, unhealthy after 2.
fn thresholds() -> String {
    format!("    health: {{degraded_after_failures: 1, unhealthy_after_failures: 2, cooldown_ms: {COOLDOWN_MS}}}\n")
}

/// Sends one chat request that must be answered (200); the provider that served and the
/// `x-sluice-fallback-depth`.
fn served(sluice: &Sluice) -> (String, String) {
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    (
        r.header("x-sluice-provider")
            .unwrap_or_default()
            .to_string(),
        r.header("x-sluice-fallback-depth")
            .unwrap_or_default()
            .to_string(),
    )
}

fn owned(p: &str, depth: &str) -> (String, String) {
    (p.to_string(), depth.to_string())
}

/// After `p1` recovered: sends requests (every 20 ms, for at most 3 s) until `p1` serves one;
/// returns how many went to `p2` meanwhile and how long it took.
fn until_primary_serves(sluice: &Sluice) -> (usize, Duration) {
    let recovered = Instant::now();
    let mut on_p2 = 0;
    while recovered.elapsed() < Duration::from_secs(3) {
        let (p, depth) = served(sluice);
        if p == "p1" {
            assert_eq!(depth, "0", "the trial went first");
            return (on_p2, recovered.elapsed());
        }
        assert_eq!((p.as_str(), depth.as_str()), ("p2", "0"));
        on_p2 += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "p1 did not serve again within 3 s of its recovery:\n{}",
        sluice.log()
    );
}

/// The flapping scenario without probes: `p1` (primary) goes down and comes back twice; `p2`
/// is a healthy fallback throughout.
fn flap(sluice: &Sluice, p1: &Mock, p2: &Mock) {
    assert_eq!(served(sluice), owned("p1", "0"));
    assert_eq!((hits(p1), hits(p2)), (1, 0));

    for round in 0..2 {
        // Down: one request finds out and falls back; p1 is degraded, so the next ones go to
        // p2 without trying p1 (its cool-down runs from the failure).
        p1.set_behavior(r#"{"status":503}"#);
        let (h1, h2) = (hits(p1), hits(p2));
        let failed_at = Instant::now();
        assert_eq!(served(sluice), owned("p2", "1"), "round {round}");
        assert_eq!((hits(p1), hits(p2)), (h1 + 1, h2 + 1), "round {round}");
        assert!(gauge(sluice, "p1") >= 1.0);
        assert_eq!(served(sluice), owned("p2", "0"), "round {round}");
        if failed_at.elapsed() < Duration::from_millis(COOLDOWN_MS) {
            assert_eq!(
                hits(p1),
                h1 + 1,
                "round {round}: no trial within the cool-down"
            );
        }

        // Still down after the cool-down: exactly one trial, first, which falls back at once
        // (no same-route retry); p1 turns unhealthy and rests again.
        std::thread::sleep(
            Duration::from_millis(COOLDOWN_MS + 50).saturating_sub(failed_at.elapsed()),
        );
        let r = sluice.chat(&body(false, ""));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-sluice-provider"), Some("p2"), "round {round}");
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
        assert_eq!(r.header("x-sluice-attempts"), Some("2"));
        assert_eq!(hits(p1), h1 + 2, "round {round}: one trial");
        assert_eq!(wait_gauge(sluice, "p1", 2.0), 2.0);
        let h2 = hits(p2);
        assert_eq!(served(sluice), owned("p2", "0"));
        assert_eq!(hits(p1), h1 + 2, "round {round}: resting");

        // Back: within one cool-down its trial finds out, and p1 is the primary again.
        p1.set_behavior(r#"{"tokens":2}"#);
        let (on_p2, took) = until_primary_serves(sluice);
        assert!(
            took < Duration::from_millis(COOLDOWN_MS + 1500),
            "round {round}: {took:?}"
        );
        assert_eq!(
            hits(p1),
            h1 + 3,
            "round {round}: the one trial that succeeded"
        );
        assert_eq!(hits(p2), h2 + 1 + on_p2, "round {round}");
        assert_eq!(wait_gauge(sluice, "p1", 0.0), 0.0);
        for _ in 0..3 {
            assert_eq!(served(sluice), owned("p1", "0"));
        }
        assert_eq!(hits(p1), h1 + 6, "round {round}");
        assert_eq!(hits(p2), h2 + 1 + on_p2, "round {round}: p2 no longer used");
    }
}

#[test]
fn a_flapping_primary_serves_again_within_a_cooldown_of_recovery_without_probes() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), &thresholds()),
            P("p2", &p2.base_url(), ""),
        ],
        "",
    ));
    flap(&sluice, &p1, &p2);
    assert!(p1.log().iter().all(|r| r["method"] == "POST"), "no probes");
}

#[test]
fn a_flapping_primary_serves_again_within_a_cooldown_of_recovery_with_list_probes() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let probe = format!(
        "    health_check: {{path: /models, interval_ms: 100, timeout_ms: 500}}\n{}",
        thresholds()
    );
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), &probe), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_eq!(served(&sluice), owned("p1", "0"));
    for round in 0..2 {
        // Down: probes and requests find out (which first is a race); requests are served
        // by p2 throughout.
        p1.set_behavior(r#"{"status":503}"#);
        let noticed = eventually(Duration::from_secs(3), || {
            let (p, _) = served(&sluice);
            assert_eq!(p, "p2", "round {round}");
            gauge(&sluice, "p1") == 2.0
        });
        assert!(noticed, "round {round}: {}", sluice.log());
        let (h1, h2) = (hits(&p1), hits(&p2));
        // Back: p1 serves again within about a cool-down; its listing probes alone would not
        // lift failures its chat route had itself (see the next test), its trial does.
        p1.set_behavior(r#"{"tokens":2}"#);
        let (on_p2, took) = until_primary_serves(&sluice);
        assert!(
            took < Duration::from_millis(COOLDOWN_MS + 1500),
            "round {round}: {took:?}"
        );
        assert_eq!(hits(&p1), h1 + 1, "round {round}");
        assert_eq!(hits(&p2), h2 + on_p2, "round {round}");
        assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0);
        for _ in 0..3 {
            assert_eq!(served(&sluice), owned("p1", "0"));
        }
        assert_eq!(
            (hits(&p1), hits(&p2)),
            (h1 + 4, h2 + on_p2),
            "round {round}"
        );
    }
    let m = Metrics::scrape(&sluice);
    for result in ["up", "down"] {
        assert!(
            m.get(
                "sluice_health_probes_total",
                &[("provider", "p1"), ("mode", "list"), ("result", result)]
            ) >= 1.0,
            "{result}: {}",
            m.0
        );
    }
}

#[test]
fn request_probes_heal_a_route_without_client_traffic_and_are_never_metered() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let probe = format!(
        "    health_check: {{mode: request, interval_ms: 100, timeout_ms: 500}}\n{}",
        thresholds()
    );
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), &probe), P("p2", &p2.base_url(), "")],
        "",
    ));
    // The probe is a minimal chat request to the route, not a listing.
    assert!(eventually(Duration::from_secs(3), || probe_hits(&p1) >= 2));
    let first = chat_log(&p1).into_iter().find(is_probe).expect("a probe");
    let sent: Value = serde_json::from_str(first["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["model"], "p1-model");
    let one = sent.get("max_completion_tokens").or(sent.get("max_tokens"));
    assert_eq!(one, Some(&serde_json::json!(1)), "{sent}");
    assert_eq!(
        first["headers"]["authorization"],
        "Bearer sk-provider-secret-p1"
    );
    assert!(
        p1.log().iter().all(|r| r["method"] == "POST"),
        "no GET probes"
    );

    // Down: the probes alone make the route unhealthy (its own failures).
    p1.set_behavior(r#"{"status":503}"#);
    assert_eq!(wait_gauge(&sluice, "p1", 2.0), 2.0, "{}", sluice.log());
    assert_eq!(served(&sluice), owned("p2", "0"));
    // Back: a request probe heals it, still without client traffic on p1.
    p1.set_behavior(r#"{"tokens":2}"#);
    let back = Instant::now();
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0, "{}", sluice.log());
    assert!(
        back.elapsed() < Duration::from_secs(2),
        "{:?}",
        back.elapsed()
    );
    assert_eq!(hits(&p1), 0, "healed by probes alone");
    let (on_p2, took) = until_primary_serves(&sluice);
    assert!(took < Duration::from_millis(COOLDOWN_MS + 1500), "{took:?}");
    assert_eq!((hits(&p1), hits(&p2)), (1, 1 + on_p2));

    // Probe traffic is counted, never metered: the tenant's tokens are the clients' only
    // (2 output tokens per answer), although probes were answered too.
    let m = Metrics::scrape(&sluice);
    let ups = m.get(
        "sluice_health_probes_total",
        &[("provider", "p1"), ("mode", "request"), ("result", "up")],
    );
    let downs = m.get(
        "sluice_health_probes_total",
        &[("provider", "p1"), ("mode", "request"), ("result", "down")],
    );
    assert!(ups >= 3.0 && downs >= 2.0, "{ups} {downs}");
    let clients = hits(&p1) + hits(&p2);
    #[expect(clippy::cast_precision_loss, reason = "small counts")]
    let want = 2.0 * clients as f64;
    assert_eq!(
        m.get(
            "sluice_tokens_total",
            &[("tenant", "t"), ("model", "acme/chat"), ("kind", "output")]
        ),
        want,
        "{}",
        m.0
    );
}

#[test]
fn a_provider_probe_200_does_not_wipe_the_chat_routes_own_failures() {
    // The issue's scenario: `GET /models` answers 200 while the chat route answers 503.
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let probe = "    health_check: {path: /models, interval_ms: 100, timeout_ms: 500}\n    health: {degraded_after_failures: 1, unhealthy_after_failures: 2, cooldown_ms: 1500}\n";
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), probe)], ""));
    let listings = || p1.log().iter().filter(|r| r["method"] == "GET").count();
    assert!(eventually(Duration::from_secs(3), || listings() >= 1));
    let failing = body(false, r#","mock":{"status":503}"#);
    for _ in 0..2 {
        assert_eq!(sluice.chat(&failing).status, 503);
    }
    let unhealthy_at = Instant::now();
    assert_eq!(gauge(&sluice, "p1"), 2.0);
    let seen = listings();

    // Probes keep answering 200; the route stays unhealthy and keeps resting.
    assert!(eventually(Duration::from_secs(3), || listings() >= seen + 5));
    assert_eq!(gauge(&sluice, "p1"), 2.0, "{}", sluice.log());
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("no healthy provider"), "{}", r.text());
    assert_eq!(hits(&p1), 2, "no request reached the resting route");
    assert!(
        unhealthy_at.elapsed() < Duration::from_millis(1500),
        "the checks above ran within the cool-down: {:?}",
        unhealthy_at.elapsed()
    );
    assert_eq!(
        Metrics::scrape(&sluice).get(
            "sluice_health_probes_total",
            &[("provider", "p1"), ("mode", "list"), ("result", "down")]
        ),
        0.0
    );

    // After the cool-down the route's own trial (a request that succeeds) heals it.
    std::thread::sleep(Duration::from_millis(1550).saturating_sub(unhealthy_at.elapsed()));
    assert_eq!(gauge(&sluice, "p1"), 2.0, "still unhealthy until its trial");
    assert_eq!(served(&sluice), owned("p1", "0"));
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0);
    assert_eq!(hits(&p1), 3);
}

#[test]
fn without_traffic_an_unhealthy_route_decays_to_degraded_then_healthy() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let th = "    health: {degraded_after_failures: 1, unhealthy_after_failures: 1, cooldown_ms: 200, decay_after_ms: 500}\n";
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), th), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_eq!(served(&sluice), owned("p2", "1"));
    let failed_at = Instant::now();
    assert_eq!(gauge(&sluice, "p1"), 2.0);
    p1.set_behavior(r#"{"tokens":2}"#);

    // No traffic at all: the gauge follows the schedule (one step per 500 ms without a
    // failure, applied within a second by the probe service's sweep).
    assert_eq!(wait_gauge(&sluice, "p1", 1.0), 1.0, "{}", sluice.log());
    let degraded = failed_at.elapsed();
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0, "{}", sluice.log());
    let healthy = failed_at.elapsed();
    assert!(degraded >= Duration::from_millis(500), "{degraded:?}");
    assert!(healthy >= Duration::from_millis(1000), "{healthy:?}");
    let log = sluice.log();
    assert!(
        log.contains("from=unhealthy to=degraded cause=decay"),
        "{log}"
    );
    assert!(
        log.contains("from=degraded to=healthy cause=decay"),
        "{log}"
    );
    assert_eq!((hits(&p1), hits(&p2)), (1, 1));

    // Healthy again: the primary serves first.
    assert_eq!(served(&sluice), owned("p1", "0"));
    assert_eq!((hits(&p1), hits(&p2)), (2, 1));
}

/// Chat records of the mock whose body asked for `stall`.
fn stalled(mock: &Mock) -> Vec<Value> {
    chat_log(mock)
        .into_iter()
        .filter(|r| r["body"].as_str().is_some_and(|b| b.contains("stall")))
        .collect()
}

#[test]
fn a_provider_that_held_the_request_then_closed_is_not_sent_it_again() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), "")], ""));
    // A first answer leaves a pooled keep-alive connection.
    assert_eq!(served(&sluice), owned("p1", "0"));
    // The next request reuses it; the provider holds it silently for 300 ms, then closes.
    let held = Instant::now();
    let r = sluice.chat(&body(false, r#","mock":{"stall":true,"stall_max_ms":300}"#));
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    assert!(held.elapsed() >= Duration::from_millis(300));
    let seen = stalled(&p1);
    assert_eq!(seen.len(), 1, "sent exactly once: {seen:?}");
    assert_eq!(seen[0]["conn_seq"], 2, "on the reused connection: {seen:?}");
    assert_eq!(r.header("x-sluice-attempts"), Some("1"));
    let m = Metrics::scrape(&sluice);
    let attempts = |outcome: &str| {
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", outcome)],
        )
    };
    assert_eq!(attempts("protocol"), 1.0, "a connection_reset failure");
    assert_eq!(attempts("stale_connection"), 0.0);
    assert_eq!(hits(&p1), 2);
}

#[test]
fn a_stale_pooled_connection_is_resent_once_on_a_fresh_one_and_counted() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), "")], ""));
    let stale_total = || {
        Metrics::scrape(&sluice).get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "stale_connection")],
        )
    };
    // The reused connection closes the moment the request arrived (no byte of an answer):
    // the provider cannot have processed it, so it goes again on a fresh connection (which
    // this provider closes too: an ordinary failure, not resent). "The moment" is measured
    // (20 ms); on a machine so loaded that the close is seen later, the request is not
    // resent, which is as safe and as counted: up to three tries for one resend.
    let mut resent = 0;
    for round in 1..=3 {
        p1.reset();
        let stale_before = stale_total();
        // A first answer leaves a pooled keep-alive connection.
        assert_eq!(served(&sluice), owned("p1", "0"));
        let r = sluice.chat(&body(false, r#","mock":{"stall":true,"stall_max_ms":0}"#));
        assert!(r.status >= 500, "{} {}", r.status, r.text());
        let seen = stalled(&p1);
        assert_eq!(
            seen[0]["conn_seq"], 2,
            "first on the reused connection: {seen:?}"
        );
        let attempts = seen.len().to_string();
        assert_eq!(
            r.header("x-sluice-attempts"),
            Some(attempts.as_str()),
            "each request the mock saw is an attempt"
        );
        #[expect(clippy::cast_precision_loss, reason = "small counts")]
        let resends = (seen.len() - 1) as f64;
        assert_eq!(stale_total() - stale_before, resends, "round {round}");
        if seen.len() == 2 {
            assert_eq!(seen[1]["conn_seq"], 1, "then on a fresh one: {seen:?}");
            resent = round;
            break;
        }
        assert_eq!(seen.len(), 1, "{seen:?}");
    }
    assert!(resent > 0, "never resent:\n{}", sluice.log());
    let want = "attempts=2 status=";
    assert!(
        eventually(Duration::from_secs(5), || sluice.log().contains(want)),
        "{}",
        sluice.log()
    );
}

#[test]
fn a_trial_that_streams_heals_its_route_at_its_first_event_not_at_its_end() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), &thresholds()),
            P("p2", &p2.base_url(), ""),
        ],
        "",
    ));
    // Two failures (the second a trial): unhealthy.
    assert_eq!(served(&sluice), owned("p2", "1"));
    std::thread::sleep(Duration::from_millis(COOLDOWN_MS + 50));
    assert_eq!(served(&sluice), owned("p2", "1"));
    assert_eq!(gauge(&sluice, "p1"), 2.0);
    p1.set_behavior(r#"{"tokens":2}"#);
    std::thread::sleep(Duration::from_millis(COOLDOWN_MS + 50));

    // The trial is a slow stream (20 tokens, 100 ms apart); while it runs, the route is
    // healthy again and serves the next request first.
    let slow = body(true, r#","mock":{"tokens":20,"token_delay_ms":100}"#);
    std::thread::scope(|s| {
        let trial = s.spawn(|| sluice.chat(&slow));
        let started = eventually(Duration::from_secs(3), || {
            chat_log(&p1)
                .iter()
                .any(|r| !r["head_at_ms"].is_null() && r["stream"] == true)
        });
        assert!(started);
        assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0, "{}", sluice.log());
        assert_eq!(served(&sluice), owned("p1", "0"));
        assert!(
            !trial.is_finished(),
            "served while the trial still streams (2 s in all)"
        );
        let trial = trial.join().unwrap();
        assert_eq!(trial.status, 200, "{}", trial.text());
        assert_eq!(trial.header("x-sluice-provider"), Some("p1"));
    });
    assert_eq!((hits(&p1), hits(&p2)), (4, 2));
}
