//! Hedged requests (`models.<id>.hedge_after_ms`): a primary whose first token is slow is
//! hedged onto the next route, the first to deliver wins and the loser's upstream
//! connection is closed (the slow mock sees its peer go); a fast primary is never hedged;
//! `auto` hedges only once the route's time-to-first-event p95 is known; no room in the
//! retry budget means no hedge. Hit counts per mock asserted in each.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fallback::{
    assert_served_stream, body, chat_hits, chat_log, chat_with_headers, config, config_with_routes,
    Metrics, P,
};
use crate::harness::{eventually, Mock, Sluice};

fn tokens(n: usize) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

/// Waits until the mock's `n`-th chat request (0-based) saw Sluice close the connection;
/// returns the phase the mock was in.
fn peer_closed_phase(mock: &Mock, n: usize) -> String {
    let log = mock.wait_log(Duration::from_secs(5), |l| {
        l.get(n).is_some_and(|r| !r["peer_closed_at_ms"].is_null())
    });
    let r = &log[n];
    assert!(
        !r["peer_closed_at_ms"].is_null() && r["completed"] == false,
        "the loser was not cancelled: {r:#}"
    );
    r["phase"].as_str().unwrap_or_default().to_string()
}

fn hedges(sluice: &Sluice, outcome: &str) -> f64 {
    Metrics::scrape(sluice).get(
        "sluice_hedges_total",
        &[("model", "acme/chat"), ("outcome", outcome)],
    )
}

#[test]
fn a_slow_first_token_is_hedged_the_first_to_deliver_wins_and_the_loser_is_cancelled() {
    // p1 sends its head at once and its first event after 3 s; p2 is fast.
    let p1 = Mock::start(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    hedge_after_ms: 200\n    retry: {max_attempts_per_route: 1, budget_ratio: 1.0}\n",
    ));
    let t = Instant::now();
    // No route failed (p1 was cancelled): depth 0.
    assert_served_stream(&sluice, &body(true, ""), "p2", 0, &tokens(2));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(2000),
        "served after {took:?}"
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    // The loser's connection was dropped: p1 saw its peer go after its head, before any
    // event, long before its 3 s were up.
    assert_eq!(peer_closed_phase(&p1, 0), "after_head");
    let closed = chat_log(&p1)[0]["peer_closed_at_ms"]
        .as_u64()
        .expect("closed")
        - chat_log(&p1)[0]["received_at_ms"]
            .as_u64()
            .expect("received");
    assert!(closed < 2000, "closed after {closed} ms");
    assert_eq!(hedges(&sluice, "hedge_won"), 1.0);
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "hedge_cancelled")]
        ),
        1.0
    );
    // Two attempts for one request, in the access log.
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .log()
            .contains("attempts=2 status=200")),
        "{}",
        sluice.log()
    );

    // A non-streaming request: the race is to the answer's head (p1 holds its head 3 s).
    p1.set_behavior(r#"{"first_byte_delay_ms":3000,"tokens":2}"#);
    let t = Instant::now();
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert!(
        t.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t.elapsed()
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (2, 2));
    assert_eq!(peer_closed_phase(&p1, 1), "before_head");
    assert_eq!(hedges(&sluice, "hedge_won"), 2.0);

    // The primary delivering first wins: p2 is slower than p1 once the hedge starts.
    p1.set_behavior(r#"{"first_event_delay_ms":400,"tokens":2}"#);
    p2.set_behavior(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (3, 3));
    assert_eq!(peer_closed_phase(&p2, 2), "after_head");
    assert_eq!(hedges(&sluice, "primary_won"), 1.0);
}

#[test]
fn a_fast_primary_is_not_hedged_and_without_budget_room_nothing_is() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    hedge_after_ms: 500\n",
    ));
    for _ in 0..5 {
        assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    }
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.header("x-sluice-provider"), Some("p1"));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (6, 0));
    for outcome in [
        "hedge_won",
        "primary_won",
        "none",
        "no_budget",
        "no_partner",
    ] {
        assert_eq!(hedges(&sluice, outcome), 0.0, "{outcome}");
    }

    // A retry budget of 0: the timer fires, but no hedge is sent.
    let p1 = Mock::start(r#"{"first_event_delay_ms":700,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    hedge_after_ms: 100\n    retry: {max_attempts_per_route: 1, budget_ratio: 0.0}\n",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 0));
    assert_eq!(hedges(&sluice, "no_budget"), 1.0);
}

#[test]
fn auto_hedges_after_the_routes_observed_p95_once_warmed_up() {
    // Cold: no samples yet, so no hedge even for a slow first token.
    let p1 = Mock::start(r#"{"first_event_delay_ms":600,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    hedge_after_ms: auto\n    retry: {max_attempts_per_route: 1, budget_ratio: 1.0}\n",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    assert!(
        t.elapsed() >= Duration::from_millis(590),
        "{:?}",
        t.elapsed()
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 0));

    // Warm-up: 20 fast answers (~20 ms) push the one slow sample past the p95. A p95 is
    // exceeded now and then by definition: p2 is slow meanwhile, so such a hedge loses.
    p1.set_behavior(r#"{"first_event_delay_ms":20,"tokens":2}"#);
    p2.set_behavior(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    for _ in 0..20 {
        assert_served_stream(&sluice, &body(true, ""), "p1", 0, &tokens(2));
    }
    let warm_hedges = chat_hits(&p2);
    assert!(warm_hedges <= 5, "{warm_hedges} of 20 fast answers hedged");
    assert_eq!(
        hedges(&sluice, "primary_won"),
        f64::from(u32::try_from(warm_hedges).expect("small"))
    );
    assert_eq!(chat_hits(&p1), 21);

    // Now a slow first token is hedged after about the p95, far below its 3 s.
    p1.set_behavior(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    p2.set_behavior(r#"{"tokens":2}"#);
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p2", 0, &tokens(2));
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (22, warm_hedges + 1));
    assert_eq!(peer_closed_phase(&p1, 21), "after_head");
    assert_eq!(hedges(&sluice, "hedge_won"), 1.0);
}

#[test]
fn a_client_that_leaves_during_the_race_cancels_both_attempts() {
    // Both providers hold their first event 5 s; the hedge starts after 100 ms.
    let p1 = Mock::start(r#"{"first_event_delay_ms":5000,"tokens":2}"#);
    let p2 = Mock::start(r#"{"first_event_delay_ms":5000,"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    hedge_after_ms: 100\n    retry: {max_attempts_per_route: 1, budget_ratio: 1.0}\n",
    ));
    let client = crate::cancellation::RawClient::send(sluice.addr, &body(true, ""));
    // Both attempts are under way once p2 has its request.
    let started = p2.wait_log(Duration::from_secs(5), |l| !l.is_empty());
    assert_eq!(started.len(), 1, "the hedge never started");
    std::thread::sleep(Duration::from_millis(100));
    client.close();
    assert_eq!(peer_closed_phase(&p1, 0), "after_head");
    assert_eq!(peer_closed_phase(&p2, 0), "after_head");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    // The hedge outcome is counted inside the attempt race, the abort just after it
    // returns: wait for both, so a scrape between the two is not a failure.
    let aborts = || {
        Metrics::scrape(&sluice).get(
            "sluice_client_aborts_total",
            &[("phase", "waiting_first_event")],
        )
    };
    assert!(
        eventually(Duration::from_secs(2), || hedges(&sluice, "none") == 1.0
            && aborts() == 1.0),
        "{}",
        sluice.metrics()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!((hedges(&sluice, "none"), aborts()), (1.0, 1.0));
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn a_cancelled_loser_is_recorded_as_sluices_cost_in_the_ledger_and_the_metrics_never_charged() {
    // p1 (the first route) holds its first event 3 s and loses to the hedge on p2. The loser
    // was sent the prompt: its input, estimated, is Sluice's cost at p1's input price.
    let p1 = Mock::start(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2,"usage":true,"prompt_tokens":7}"#);
    let (p1_in, p2_in, p2_out) = (2.5, 1.0, 4.0);
    let route = |id: &str, priority: u32, input: f64, output: f64| {
        format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n        priority: {priority}\n        input_usd_per_mtok: {input}\n        output_usd_per_mtok: {output}\n"
        )
    };
    let sluice = Sluice::start(&config_with_routes(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        &format!(
            "    input_usd_per_mtok: 3.0\n    output_usd_per_mtok: 6.0\n    hedge_after_ms: 200\n    retry: {{max_attempts_per_route: 1, budget_ratio: 1.0}}\n    routes:\n{}{}",
            route("p1", 1, p1_in, 8.0),
            route("p2", 2, p2_in, p2_out)
        ),
    ));
    let r = chat_with_headers(&sluice, &[("x-request-id", "req-hedged")], &body(true, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    assert_eq!(peer_closed_phase(&p1, 0), "after_head");

    let (dir, cfg) = (sluice.dir.path(), &sluice.config_path);
    let recs = crate::ledger::wait_records(dir, cfg, 2);
    assert_eq!(recs.len(), 2, "{recs:#?}");
    let row = |provider: &str| {
        recs.iter()
            .find(|r| r["provider"] == provider)
            .unwrap_or_else(|| panic!("no row of {provider}: {recs:#?}"))
    };
    let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let u = |v: &Value| v.as_u64().unwrap_or(u64::MAX);

    // The winner's row: metered from p2's usage, unchanged by the hedge.
    let w = row("p2");
    assert_eq!(
        (
            &w["request_id"],
            &w["outcome"],
            &w["status"],
            &w["estimated"]
        ),
        (
            &Value::from("req-hedged"),
            &Value::from("ok"),
            &Value::from(200),
            &Value::from(false)
        ),
        "{w:#}"
    );
    assert_eq!((u(&w["input_tokens"]), u(&w["attempts"])), (7, 2), "{w:#}");
    let w_out = u(&w["output_tokens"]);
    assert!(w_out > 0, "{w:#}");
    let w_cost = (7.0 * p2_in + w_out as f64 * p2_out) / 1e6;
    assert!(near(f(&w["cost_usd"]), w_cost), "{w:#}");
    let w_charge = (7.0 * 3.0 + w_out as f64 * 6.0) / 1e6;
    assert!(near(f(&w["charge_usd"]), w_charge), "{w:#}");

    // The loser's row: the same request, p1's route, estimated input only, cost at p1's
    // input price, never charged.
    let l = row("p1");
    for k in ["request_id", "tenant", "virtual_key", "model", "ingress"] {
        assert_eq!(l[k], w[k], "{k}: {l:#}");
    }
    assert_eq!(
        (
            &l["upstream_model"],
            &l["outcome"],
            &l["status"],
            &l["estimated"],
            &l["attempts"],
            &l["output_tokens"],
            &l["ttft_ms"],
        ),
        (
            &Value::from("p1-model"),
            &Value::from("hedge_cancelled"),
            &Value::from(0),
            &Value::from(true),
            &Value::from(1),
            &Value::from(0),
            &Value::Null,
        ),
        "{l:#}"
    );
    let l_in = u(&l["input_tokens"]);
    assert!(l_in > 0 && l_in < 1000, "{l:#}");
    let l_cost = f(&l["cost_usd"]);
    assert!(
        l_cost > 0.0 && near(l_cost, l_in as f64 * p1_in / 1e6),
        "{l:#}"
    );
    assert_eq!(f(&l["charge_usd"]), 0.0, "{l:#}");

    // Read back: one request, whose cost includes the loser's; the charge is the winner's.
    let sum = crate::ledger::records(dir, cfg, &["--summary"]);
    assert_eq!(sum.len(), 1, "{sum:#?}");
    let s = &sum[0];
    assert_eq!(
        (u(&s["requests"]), u(&s["estimated_requests"])),
        (1, 0),
        "{s:#}"
    );
    assert!(near(f(&s["cost_usd"]), w_cost + l_cost), "{s:#}");
    assert!(near(f(&s["charge_usd"]), w_charge), "{s:#}");
    assert_eq!(u(&s["input_tokens"]), 7 + l_in, "{s:#}");

    // The metrics agree with the ledger: cost is the sum of both rows, the charge the
    // winner's, and the estimated input is in `sluice_tokens_total` as aborted streams'
    // estimates are.
    let m = Metrics::scrape(&sluice);
    let labels = [("tenant", "t"), ("model", "acme/chat")];
    let cost = m.get("sluice_cost_usd_total", &labels);
    assert!(
        near(cost, f(&w["cost_usd"]) + l_cost),
        "{cost} vs {recs:#?}"
    );
    assert!(near(m.get("sluice_charge_usd_total", &labels), w_charge));
    assert_eq!(
        m.get(
            "sluice_tokens_total",
            &[("tenant", "t"), ("model", "acme/chat"), ("kind", "input")]
        ),
        (7 + l_in) as f64
    );
    assert_eq!(
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "hedge_cancelled")]
        ),
        1.0
    );
}
