//! Budgets (`tenants.<id>.budget`): a request is reserved at admission (worst charge × 1.2)
//! and settled with its metered charge; a tenant without room gets 402 in its own dialect
//! (`insufficient_quota` / `budget_exceeded`, Anthropic's `billing_error`); concurrent racers
//! never overspend, locally and across two replicas sharing Redis; an aborted stream settles
//! what was streamed; a restart keeps the spend (read from the ledger);
//! `sluice_budget_remaining_usd{tenant,window}` says what is left.
//!
//! Prices make the arithmetic exact: input is free and an output token costs 0.01 USD, the
//! mock answers 5 tokens to `max_tokens: 5`, so a request is charged 0.05 USD and reserves
//! 0.06 USD.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::client::{post_json, Response, StreamReader};
use crate::harness::{eventually, Mock, Sluice, KEY};
use crate::ledger::wait_records;
use crate::redis_limits::RedisServer;

/// One request's charge and reservation, USD.
const CHARGE: f64 = 0.05;

fn config(base_url: &str, budget: &str, ledger: &Path, tail: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{budget: {budget}}}\n  other: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\n  - key: sk-sluice-other-0001\n    tenant: other\nproviders:\n  p1:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-p1\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    input_usd_per_mtok: 0\n    output_usd_per_mtok: 10000\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\nledger:\n  path: {}\n  flush_interval_ms: 50\n{tail}",
        ledger.display()
    )
}

fn chat(addr: std::net::SocketAddr, key: &str, stream: bool) -> Response {
    post_json(
        addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key}"))],
        &format!(
            r#"{{"model":"acme/chat","max_tokens":5,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
        ),
    )
}

/// Waits until `sluice` wrote `n` access lines (each follows its request's settlement).
fn wait_settled(sluice: &Sluice, n: usize) {
    let ok = eventually(Duration::from_secs(5), || {
        sluice.log().matches(" charge_usd=").count() >= n
    });
    assert!(ok, "fewer than {n} access lines:\n{}", sluice.log());
}

fn remaining(sluice: &Sluice, window: &str) -> f64 {
    sluice.gauge(&format!(
        "sluice_budget_remaining_usd{{tenant=\"t\",window=\"{window}\"}}"
    ))
}

/// Whether the daily series exists and says `usd`.
fn left_is(sluice: &Sluice, usd: f64) -> bool {
    sluice
        .metric_opt("sluice_budget_remaining_usd{tenant=\"t\",window=\"daily\"}")
        .is_some_and(|v| close(v, usd))
}

fn charged(sluice: &Sluice) -> f64 {
    sluice
        .metric_opt("sluice_charge_usd_total{model=\"acme/chat\",tenant=\"t\"}")
        .unwrap_or(0.0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn a_spent_budget_answers_402_in_each_dialect_and_survives_a_restart() {
    let mock = Mock::start(r#"{"tokens": 5}"#);
    let dir = crate::harness::TempDir::new("budget");
    let ledger = dir.path().join("usage.db");
    let yaml = config(
        &mock.base_url(),
        "{total_usd: 10, daily_usd: 0.25}",
        &ledger,
        "",
    );
    let mut sluice = Sluice::start(&yaml);
    // The series exists before the first request (the figures are read from the ledger in
    // the background at start).
    assert!(eventually(Duration::from_secs(5), || left_is(
        &sluice, 0.25
    )));
    assert!(close(remaining(&sluice, "total"), 10.0));
    // 4 × 0.05 fit; then 0.20 spent + 0.06 reserved > 0.25.
    for i in 0..4 {
        let r = chat(sluice.addr, KEY, i % 2 == 1);
        assert_eq!(r.status, 200, "{}", r.text());
        wait_settled(&sluice, i + 1);
    }
    assert!(
        close(remaining(&sluice, "daily"), 0.05),
        "{}",
        remaining(&sluice, "daily")
    );
    assert!(close(remaining(&sluice, "total"), 9.8));
    assert!(close(charged(&sluice), 4.0 * CHARGE));

    let r = chat(sluice.addr, KEY, false);
    assert_eq!(r.status, 402, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["type"], "insufficient_quota", "{e}");
    assert_eq!(e["code"], "budget_exceeded", "{e}");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("daily budget") && msg.contains("tenant `t`"),
        "{msg}"
    );
    // A stream is refused the same way, before any event.
    let r = chat(sluice.addr, KEY, true);
    assert_eq!(r.status, 402);
    assert_eq!(r.json()["error"]["code"], "budget_exceeded");
    // Anthropic's shape on /v1/messages.
    let r = post_json(
        sluice.addr,
        "/v1/messages",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        r#"{"model":"acme/chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 402, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "billing_error", "{v}");
    // Responses: OpenAI's body with the code.
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        r#"{"model":"acme/chat","max_output_tokens":5,"input":"hi"}"#,
    );
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");
    assert_eq!(r.json()["error"]["code"], "budget_exceeded");
    // A cheaper request still fits what is left (1 token reserves 0.012).
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {KEY}"))],
        r#"{"model":"acme/chat","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"mock":{"tokens":1}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Another tenant is not affected; nothing reached the provider for the refusals.
    assert_eq!(chat(sluice.addr, "sk-sluice-other-0001", false).status, 200);
    assert_eq!(mock.hits(), 6);
    assert!(sluice.metric("sluice_rejected_total{reason=\"budget_exceeded\"}") >= 4.0);

    // The ledger has the refusals as `rejected` with status 402 and no charge.
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 10);
    let refused: Vec<&Value> = recs.iter().filter(|r| r["status"] == 402).collect();
    assert_eq!(refused.len(), 4, "{recs:?}");
    assert!(refused
        .iter()
        .all(|r| r["outcome"] == "rejected" && r["charge_usd"] == 0.0 && r["provider"].is_null()));
    let spent: f64 = recs
        .iter()
        .filter(|r| r["tenant"] == "t")
        .map(|r| r["charge_usd"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(close(spent, 0.21), "{spent}");

    // A restart reads the spend back from the ledger: still 0.04 left.
    sluice.signal("TERM");
    assert!(sluice.wait_exit(Duration::from_secs(10)).is_some());
    let sluice = Sluice::start(&yaml);
    assert!(
        eventually(Duration::from_secs(5), || left_is(&sluice, 0.04)),
        "after restart:\n{}",
        sluice.metrics()
    );
    assert_eq!(chat(sluice.addr, KEY, false).status, 402);
}

/// A mock answering `behavior` and one Sluice whose tenant `t` has `budget`, with its own
/// ledger (the directory lives as long as the returned guard).
fn one_sluice(behavior: &str, budget: &str) -> (Mock, crate::harness::TempDir, Sluice) {
    let mock = Mock::start(behavior);
    let dir = crate::harness::TempDir::new("budget");
    let sluice = Sluice::start(&config(
        &mock.base_url(),
        budget,
        &dir.path().join("usage.db"),
        "",
    ));
    (mock, dir, sluice)
}

/// Starts `n` streams at once from threads; each returns its status.
fn race(addr: std::net::SocketAddr, n: usize) -> Vec<u16> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = StreamReader::open(
                    addr,
                    "/v1/chat/completions",
                    &[("authorization", &format!("Bearer {KEY}"))],
                    r#"{"model":"acme/chat","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
                );
                let status = s.status;
                s.read_to_end(Duration::from_secs(10));
                status
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("racer"))
        .collect()
}

#[test]
fn concurrent_racers_for_the_last_dollar_never_overspend() {
    // Each stream takes about 150 ms, so the racers overlap: at most 8 reservations of 0.06
    // fit 0.5 at once.
    let (_mock, _dir, sluice) =
        one_sluice(r#"{"tokens": 5, "token_delay_ms": 30}"#, "{daily_usd: 0.5}");
    let statuses = race(sluice.addr, 24);
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 402),
        "{statuses:?}"
    );
    wait_settled(&sluice, 24);
    let spent = charged(&sluice);
    assert!(ok >= 8, "only {ok} admitted: {statuses:?}");
    assert!(
        spent <= 0.5 + 1e-9,
        "overspent: {spent} USD for {ok} streams"
    );
    assert!(close(spent, ok as f64 * CHARGE), "{spent} for {ok}");
    assert!(close(remaining(&sluice, "daily"), 0.5 - spent));
}

#[test]
fn an_aborted_stream_settles_what_was_streamed() {
    let (_mock, _dir, sluice) =
        one_sluice(r#"{"tokens": 50, "token_delay_ms": 100}"#, "{daily_usd: 1}");
    let mut s = StreamReader::open(
        sluice.addr,
        "/v1/chat/completions",
        &[
            ("authorization", &format!("Bearer {KEY}")),
            ("x-request-id", "abort-1"),
        ],
        r#"{"model":"acme/chat","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    // While it runs, 0.6 is reserved.
    s.read_until(b"data: ", Duration::from_secs(5));
    assert!(
        close(remaining(&sluice, "daily"), 0.4),
        "{}",
        remaining(&sluice, "daily")
    );
    let end = Instant::now() + Duration::from_millis(350);
    while Instant::now() < end {
        let _ = s.try_next_piece(Duration::from_millis(50));
    }
    s.close();
    wait_settled(&sluice, 1);
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 1);
    let r = &recs[0];
    assert_eq!(r["outcome"], "client_abort", "{r}");
    assert_eq!(r["estimated"], true, "{r}");
    let charge = r["charge_usd"].as_f64().unwrap_or(0.0);
    assert!(charge > 0.0 && charge < 0.25, "charged {charge}: {r}");
    assert!(close(remaining(&sluice, "daily"), 1.0 - charge));
}

#[test]
fn two_replicas_share_one_budget_through_redis() {
    let redis = RedisServer::start();
    let mock = Mock::start(r#"{"tokens": 5, "token_delay_ms": 30}"#);
    let dir = crate::harness::TempDir::new("budget");
    let tail = format!(
        "redis:\n  url: {}\n  timeout_ms: 500\n  replicas: 2\n",
        redis.url()
    );
    // Separate ledgers: only Redis can tell one replica what the other spent.
    let a = Sluice::start(&config(
        &mock.base_url(),
        "{daily_usd: 0.25}",
        &dir.path().join("a.db"),
        &tail,
    ));
    let b = Sluice::start(&config(
        &mock.base_url(),
        "{daily_usd: 0.25}",
        &dir.path().join("b.db"),
        &tail,
    ));
    for (i, s) in [&a, &b, &a, &b].into_iter().enumerate() {
        assert_eq!(chat(s.addr, KEY, false).status, 200);
        wait_settled(s, i / 2 + 1);
    }
    // Settlements reach Redis off the request path.
    let day = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
    let key = format!("sluice:budget:{{t}}:d{day}:spent");
    assert!(
        eventually(Duration::from_secs(5), || redis.int(&["GET", &key])
            == 200_000_000),
        "{key} = {:?}",
        redis.command(&["GET", &key])
    );
    // 0.20 spent across both: neither replica has room for 0.06 more.
    assert_eq!(chat(a.addr, KEY, false).status, 402);
    assert_eq!(chat(b.addr, KEY, false).status, 402);
}

#[test]
fn racers_on_two_replicas_never_overspend_a_shared_budget() {
    let redis = RedisServer::start();
    let mock = Mock::start(r#"{"tokens": 5, "token_delay_ms": 30}"#);
    let dir = crate::harness::TempDir::new("budget");
    let tail = format!(
        "redis:\n  url: {}\n  timeout_ms: 500\n  replicas: 2\n",
        redis.url()
    );
    let start = |ledger: &str| {
        Sluice::start(&config(
            &mock.base_url(),
            "{total_usd: 0.5}",
            &dir.path().join(ledger),
            &tail,
        ))
    };
    let (a, b) = (start("a.db"), start("b.db"));
    let (ra, rb) = (a.addr, b.addr);
    let ta = std::thread::spawn(move || race(ra, 12));
    let tb = std::thread::spawn(move || race(rb, 12));
    let (sa, sb) = (ta.join().expect("a"), tb.join().expect("b"));
    let ok = |s: &[u16]| s.iter().filter(|s| **s == 200).count();
    wait_settled(&a, sa.len());
    wait_settled(&b, sb.len());
    let spent = charged(&a) + charged(&b);
    assert!(
        spent <= 0.5 + 1e-9,
        "overspent: {spent} USD ({} + {} streams admitted)",
        ok(&sa),
        ok(&sb)
    );
    assert!(ok(&sa) + ok(&sb) >= 8, "{sa:?} {sb:?}");
    assert!(close(spent, (ok(&sa) + ok(&sb)) as f64 * CHARGE));
    let total = "sluice:budget:{t}:total:spent";
    assert!(
        eventually(Duration::from_secs(5), || close(
            redis.int(&["GET", total]) as f64 / 1e9,
            spent
        )),
        "{:?} vs {spent}",
        redis.command(&["GET", total])
    );
}

/// `/metrics` parsed by a Prometheus text-format parser (`prometheus-parse`): every family
/// parses with its declared type and help text, histogram buckets are cumulative, and the
/// billing series agree with the ledger.
#[test]
fn metrics_parse_as_prometheus_text_and_agree_with_the_ledger() {
    use prometheus_parse::{Scrape, Value as P};
    let (_mock, _dir, sluice) = one_sluice(r#"{"tokens": 5}"#, "{monthly_usd: 1, daily_usd: 0.5}");
    for i in 0..3 {
        assert_eq!(chat(sluice.addr, KEY, i == 1).status, 200);
        wait_settled(&sluice, i + 1);
    }
    let text = sluice.metrics();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
    assert!(
        scrape.samples.len() > 50,
        "{} samples",
        scrape.samples.len()
    );
    let sample = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name} {labels:?}"))
    };
    // Types as declared; help text for every family named here.
    for name in [
        "sluice_charge_usd_total",
        "sluice_tokens_total",
        "sluice_budget_remaining_usd",
        "sluice_ttft_seconds",
    ] {
        assert!(scrape.docs.contains_key(name), "no HELP for {name}");
    }
    let charge = match sample(
        "sluice_charge_usd_total",
        &[("tenant", "t"), ("model", "acme/chat")],
    )
    .value
    {
        P::Counter(v) => v,
        ref v => panic!("charge is not a counter: {v:?}"),
    };
    let output = match sample(
        "sluice_tokens_total",
        &[("tenant", "t"), ("model", "acme/chat"), ("kind", "output")],
    )
    .value
    {
        P::Counter(v) => v,
        ref v => panic!("tokens is not a counter: {v:?}"),
    };
    assert_eq!(output, 15.0);
    for (window, budget) in [("daily", 0.5), ("monthly", 1.0)] {
        match sample(
            "sluice_budget_remaining_usd",
            &[("tenant", "t"), ("window", window)],
        )
        .value
        {
            P::Gauge(v) => assert!(
                close(v, budget - charge),
                "{window}: {v} vs {budget} - {charge}"
            ),
            ref v => panic!("budget is not a gauge: {v:?}"),
        }
    }
    match &sample("sluice_ttft_seconds", &[]).value {
        P::Histogram(buckets) => {
            assert!(buckets.len() > 5, "{buckets:?}");
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].less_than < w[1].less_than && w[0].count <= w[1].count),
                "not cumulative: {buckets:?}"
            );
        }
        v => panic!("ttft is not a histogram: {v:?}"),
    }
    // The ledger says the same.
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 3);
    let spent: f64 = recs
        .iter()
        .map(|r| r["charge_usd"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(close(spent, charge), "ledger {spent} vs metrics {charge}");
    assert!(close(charge, 3.0 * CHARGE));
}

/// A reservation Redis answered too late (past `redis.timeout_ms`; the replica decided alone)
/// still ran there when Redis resumed: it is released again rather than holding the tenant's
/// money for the reservation TTL (an hour). Found by `benches/replicas.rs`: under load, holds
/// of timed-out reservations kept a shared budget's last 0.30 USD from being spent.
#[test]
fn a_reservation_that_timed_out_in_redis_holds_no_money_there() {
    let redis = RedisServer::start();
    let mock = Mock::start(r#"{"tokens": 5}"#);
    let dir = crate::harness::TempDir::new("budget");
    let tail = format!(
        "redis:\n  url: {}\n  timeout_ms: 100\n  replicas: 1\n",
        redis.url()
    );
    let s = Sluice::start(&config(
        &mock.base_url(),
        "{total_usd: 10}",
        &dir.path().join("a.db"),
        &tail,
    ));
    let spent = "sluice:budget:{t}:total:spent";
    let reserved = "sluice:budget:{t}:total:reserved";
    let holds = "sluice:budget:{t}:total:holds";
    assert_eq!(chat(s.addr, KEY, false).status, 200);
    wait_settled(&s, 1);
    assert!(
        eventually(Duration::from_secs(5), || redis.int(&["GET", spent])
            == 50_000_000),
        "{:?}",
        redis.command(&["GET", spent])
    );
    // Redis stops answering for 600 ms: the reservation times out (100 ms), the request is
    // served on the local decision, and the reservation script runs when Redis resumes.
    assert_eq!(
        redis.command(&["CLIENT", "PAUSE", "600", "ALL"]).as_deref(),
        Some("+OK")
    );
    assert_eq!(chat(s.addr, KEY, false).status, 200);
    wait_settled(&s, 2);
    assert_eq!(
        s.metric("sluice_ratelimit_backend_errors_total{kind=\"timeout\"}"),
        1.0
    );
    // Both charges reach Redis, and no money stays held there.
    let settled = || {
        redis.int(&["GET", spent]) == 100_000_000
            && redis.int(&["ZCARD", holds]) == 0
            && redis.int(&["GET", reserved]) == 0
    };
    assert!(
        eventually(Duration::from_secs(10), settled),
        "spent {:?}, reserved {:?}, holds {:?}",
        redis.command(&["GET", spent]),
        redis.command(&["GET", reserved]),
        redis.command(&["ZRANGE", holds, "0", "-1"])
    );
}
