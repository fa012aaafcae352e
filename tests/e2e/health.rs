//! Route health over real sockets: passive transitions (healthy → degraded → unhealthy after
//! consecutive failures, skipped while resting, one half-open trial after the cool-down,
//! recovery), a 429's `Retry-After` as the cool-down, degraded routes tried last, and the
//! active probes (`GET {base_url}{path}` with the provider's key) that mark a provider down
//! without any traffic and bring it back, following config reloads.

use std::time::{Duration, Instant};

use crate::fallback::{body, chat_hits, config, eventually, Metrics, P};
use crate::harness::{dead_url, Mock, Sluice};

/// The health gauge of `provider`'s route; panics when the series is absent.
pub(crate) fn gauge(sluice: &Sluice, provider: &str) -> f64 {
    let m = Metrics::scrape(sluice);
    m.get_opt(
        "sluice_provider_health",
        &[
            ("provider", provider),
            ("route", &format!("{provider}/{provider}-model")),
        ],
    )
    .unwrap_or_else(|| panic!("no health gauge for {provider}:\n{}", m.0))
}

/// Waits (up to 5 s: probes on a loaded CI machine) until the health gauge of `provider`
/// reads `want`; the last value.
pub(crate) fn wait_gauge(sluice: &Sluice, provider: &str, want: f64) -> f64 {
    let mut last = f64::NAN;
    eventually(Duration::from_secs(5), || {
        last = gauge(sluice, provider);
        last == want
    });
    last
}

/// The mock's recorded probe requests (`GET .../models` and other `GET`s).
fn probes(mock: &Mock) -> Vec<serde_json::Value> {
    mock.log()
        .into_iter()
        .filter(|r| r["method"] == "GET")
        .collect()
}

#[test]
fn a_failing_route_turns_unhealthy_rests_and_recovers_through_one_trial() {
    let p1 = Mock::start(r#"{"status":500}"#);
    let th =
        "    health: {degraded_after_failures: 1, unhealthy_after_failures: 3, cooldown_ms: 600}\n";
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), th)], ""));

    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(gauge(&sluice, "p1"), 1.0, "degraded after 1 failure");
    for _ in 0..2 {
        assert_eq!(sluice.chat(&body(false, "")).status, 500);
    }
    assert_eq!(gauge(&sluice, "p1"), 2.0, "unhealthy after 3 failures");
    assert!(sluice.log().contains("from=degraded to=unhealthy"));
    assert_eq!(chat_hits(&p1), 3);

    // Resting: skipped without a request; the 503 says why and when to come back.
    let rested_at = Instant::now();
    for _ in 0..3 {
        let r = sluice.chat(&body(true, ""));
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.text().contains("no healthy provider"), "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    assert_eq!(chat_hits(&p1), 3, "the hit count stops growing");

    // After the cool-down one trial; it fails (503: no same-route retry for a trial), so the
    // route rests again at once.
    std::thread::sleep(Duration::from_millis(650).saturating_sub(rested_at.elapsed()));
    p1.set_behavior(r#"{"status":503}"#);
    assert_eq!(sluice.chat(&body(false, "")).status, 503);
    assert_eq!(chat_hits(&p1), 4, "exactly one trial request");
    let r = sluice.chat(&body(false, ""));
    assert!(r.text().contains("no healthy provider"), "{}", r.text());
    assert_eq!(chat_hits(&p1), 4);
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_upstream_retries_total", &[]),
        0.0
    );

    // Next cool-down: the provider is back; the trial succeeds and the route is healthy.
    std::thread::sleep(Duration::from_millis(650));
    p1.set_behavior(r#"{"tokens":2}"#);
    let r = sluice.chat(&body(true, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0);
    assert!(sluice.log().contains("from=unhealthy to=healthy"));
    for _ in 0..3 {
        assert_eq!(sluice.chat(&body(false, "")).status, 200);
    }
    assert_eq!(chat_hits(&p1), 8);
    // Each state change is logged once.
    let log = sluice.log();
    assert_eq!(log.matches("from=healthy to=degraded").count(), 1, "{log}");
    assert_eq!(
        log.matches("from=degraded to=unhealthy").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("from=unhealthy to=healthy").count(), 1, "{log}");
}

#[test]
fn an_error_rate_over_the_window_makes_a_route_unhealthy() {
    let p1 = Mock::start(r#"{"tokens":1}"#);
    let th = "    health: {degraded_after_failures: 100, unhealthy_after_failures: 100, cooldown_ms: 60000, error_rate_percent: 50, error_rate_window_ms: 30000, error_rate_min_requests: 6}\n";
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), th)], ""));
    // Every other request fails: never two failures in a row.
    let fail = r#","mock":{"status":500}"#;
    for i in 0..6 {
        let r = sluice.chat(&body(false, if i % 2 == 1 { fail } else { "" }));
        assert_eq!(r.status, if i % 2 == 1 { 500 } else { 200 }, "{i}");
    }
    assert_eq!(wait_gauge(&sluice, "p1", 2.0), 2.0, "3 of 6 failed");
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(chat_hits(&p1), 6);
}

#[test]
fn an_unhealthy_route_is_skipped_and_the_next_serves_at_depth_zero() {
    let p1 = Mock::start(r#"{"status":500}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let th = "    health: {degraded_after_failures: 3, unhealthy_after_failures: 3, cooldown_ms: 60000}\n";
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), th), P("p2", &p2.base_url(), "")],
        "",
    ));
    for i in 0..3 {
        let r = sluice.chat(&body(true, ""));
        assert_eq!(r.header("x-sluice-provider"), Some("p2"), "{i}");
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"), "{i}");
    }
    assert_eq!(gauge(&sluice, "p1"), 2.0);
    for i in 0..5 {
        let r = sluice.chat(&body(true, ""));
        assert_eq!(r.header("x-sluice-provider"), Some("p2"), "{i}");
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"), "{i}");
    }
    assert_eq!(chat_hits(&p1), 3);
    assert_eq!(chat_hits(&p2), 8);
    assert_eq!(gauge(&sluice, "p2"), 0.0);
}

#[test]
fn a_degraded_route_is_tried_after_healthy_ones() {
    let p1 = Mock::start(r#"{"status":500}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_eq!(
        sluice.chat(&body(false, "")).header("x-sluice-provider"),
        Some("p2")
    );
    assert_eq!(gauge(&sluice, "p1"), 1.0);
    // p1 (degraded) now comes after p2.
    p1.set_behavior(r#"{"tokens":2}"#);
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    assert_eq!(chat_hits(&p1), 1);
    // ...but is still a fallback: p2 fails, degraded p1 serves and is healthy again.
    p2.set_behavior(r#"{"status":500}"#);
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.header("x-sluice-provider"), Some("p1"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0);
    assert_eq!(gauge(&sluice, "p2"), 1.0);
}

#[test]
fn a_429_retry_after_sets_the_cooldown() {
    let p1 = Mock::start(r#"{"status":429,"retry_after_s":1}"#);
    let sluice = Sluice::start(&config("", &[P("p1", &p1.base_url(), "")], ""));
    let t = Instant::now();
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    p1.set_behavior(r#"{"tokens":1}"#);
    // Resting for the provider's Retry-After, although only degraded (1 failure of 3).
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(gauge(&sluice, "p1"), 1.0);
    assert_eq!(chat_hits(&p1), 1);
    let served = eventually(Duration::from_secs(3), || {
        sluice.chat(&body(false, "")).status == 200
    });
    assert!(served);
    let rested = t.elapsed();
    assert!(rested >= Duration::from_millis(950), "{rested:?}");
    assert_eq!(chat_hits(&p1), 2, "no request reached p1 while it rested");
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0);
}

#[test]
fn active_probes_mark_a_provider_down_without_traffic_and_bring_it_back() {
    let p1 = Mock::start(r#"{"status":503,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let probe = "    health_check: {path: /models, interval_ms: 100, timeout_ms: 500}\n    health: {degraded_after_failures: 1, unhealthy_after_failures: 2, cooldown_ms: 300}\n";
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), probe),
            P("p2", &p2.base_url(), probe),
        ],
        "",
    ));
    // No client traffic at all: the probes alone make p1 unhealthy.
    assert_eq!(wait_gauge(&sluice, "p1", 2.0), 2.0, "{}", sluice.log());
    assert_eq!(gauge(&sluice, "p2"), 0.0);
    let seen = probes(&p1);
    assert!(seen.len() >= 2, "{seen:?}");
    assert_eq!(seen[0]["path"], "/v1/models");
    assert_eq!(
        seen[0]["headers"]["authorization"],
        "Bearer sk-provider-secret-p1"
    );
    assert!(!probes(&p2).is_empty());
    // Requests skip p1 without trying it.
    for _ in 0..3 {
        let r = sluice.chat(&body(false, ""));
        assert_eq!(r.header("x-sluice-provider"), Some("p2"));
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    }
    assert_eq!(chat_hits(&p1), 0);

    // p1 recovers: a probe sees it, the gauge follows, and after the cool-down p1 serves.
    p1.set_behavior(r#"{"tokens":2}"#);
    assert_eq!(wait_gauge(&sluice, "p1", 0.0), 0.0, "{}", sluice.log());
    let back = eventually(Duration::from_secs(3), || {
        sluice.chat(&body(false, "")).header("x-sluice-provider") == Some("p1")
    });
    assert!(back, "{}", sluice.log());
}

#[test]
fn probes_see_a_dead_provider_and_follow_reloads() {
    let dead_url = dead_url();
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let probe = |path: &str| {
        format!(
            "    health_check: {{path: {path}, interval_ms: 100, timeout_ms: 300}}\n    health: {{unhealthy_after_failures: 2, cooldown_ms: 60000}}\n"
        )
    };
    let yaml = |p2_probe: &str| {
        config(
            "",
            &[
                P("p1", &dead_url, &probe("/models")),
                P("p2", &p2.base_url(), p2_probe),
            ],
            "",
        )
    };
    let sluice = Sluice::start(&yaml(&probe("/models")));
    assert_eq!(wait_gauge(&sluice, "p1", 2.0), 2.0, "{}", sluice.log());
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_upstream_attempts_total", &[("provider", "p1")]),
        0.0,
        "no request tried the dead provider"
    );

    // Reload: p2's probe path changes; then its probe is switched off.
    let reloads = |n: f64| {
        eventually(Duration::from_secs(5), || {
            Metrics::scrape(&sluice).get("sluice_config_reloads_total", &[("result", "ok")]) >= n
        })
    };
    sluice.rewrite_config(&yaml(&probe("/status")));
    sluice.signal("HUP");
    assert!(reloads(1.0));
    let moved = eventually(Duration::from_secs(3), || {
        probes(&p2).iter().any(|r| r["path"] == "/v1/status")
    });
    assert!(moved, "{:?}", probes(&p2));
    let reloads_so_far =
        Metrics::scrape(&sluice).get("sluice_config_reloads_total", &[("result", "ok")]);
    sluice.rewrite_config(&yaml("    health_check: {enabled: false}\n"));
    sluice.signal("HUP");
    assert!(reloads(reloads_so_far + 1.0));
    // Let a probe already in flight land, then the count must stay put.
    std::thread::sleep(Duration::from_millis(300));
    let n = probes(&p2).len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(probes(&p2).len(), n, "probes stopped after the reload");
}
