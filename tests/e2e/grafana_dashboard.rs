//! `conf/grafana-dashboard.json` parses as a Grafana dashboard model and its PromQL names only
//! metrics Sluice exports: every `sluice_*` name in a panel `expr` or a template query is one
//! registered in `src/metrics/mod.rs` and present in a live `/metrics` after traffic (histograms
//! by their `_bucket`/`_sum`/`_count` series).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness::{dead_port, Mock, Sluice, KEY};

/// Metrics of the billing issue that other branches add (metering, budgets): named by the
/// dashboard ahead of their merge. Remove each entry when its metric lands in
/// `src/metrics/mod.rs` (the test fails until then, to say so).
const PENDING: [&str; 0] = [];

/// Every `sluice_*` identifier in `s`.
fn metric_names(s: &str, out: &mut BTreeSet<String>) {
    let bytes = s.as_bytes();
    let mut i = 0;
    while let Some(at) = s[i..].find("sluice_") {
        let start = i + at;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let end = s[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(s.len(), |e| start + e);
        if boundary {
            out.insert(s[start..end].to_string());
        }
        i = end;
    }
}

/// The PromQL strings of the dashboard: panel (and nested row panel) target `expr`s and
/// template variable queries.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The base metric name of a series name (`_bucket`, `_sum`, `_count` of histograms).
fn base(name: &str, registered: &BTreeSet<String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(b) = name.strip_suffix(suffix) {
            if registered.contains(b) {
                return b.to_string();
            }
        }
    }
    name.to_string()
}

#[test]
fn grafana_dashboard_parses_and_names_only_exported_metrics() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/conf/grafana-dashboard.json"))
        .expect("conf/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON parses");
    assert!(
        dash["title"].is_string() && dash["schemaVersion"].is_u64(),
        "not a dashboard model"
    );
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate panel id"
        );
        assert!(
            p["gridPos"]["w"].is_u64() && p["gridPos"]["h"].is_u64(),
            "{p}"
        );
        if p["type"] != "row" {
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "panel without query: {}", p["title"]);
        }
    }

    // What Sluice registers (the source) ...
    let source = std::fs::read_to_string(format!("{root}/src/metrics/mod.rs")).expect("metrics");
    let mut registered = BTreeSet::new();
    for lit in source.split('"').skip(1).step_by(2) {
        if lit.starts_with("sluice_") && lit.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            registered.insert(lit.to_string());
        }
    }
    // The names the dashboard's queries use.
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    assert!(qs.len() >= 15, "only {} queries", qs.len());
    let mut used = BTreeSet::new();
    for q in &qs {
        let mut names = BTreeSet::new();
        metric_names(q, &mut names);
        assert!(!names.is_empty(), "query names no Sluice metric: {q}");
        used.extend(names.iter().map(|n| base(n, &registered)));
    }
    // ... and what a live Sluice exports after a fallback and a stream.
    let mock = Mock::start("{}");
    let dead = dead_port();
    let sluice = Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{budget: {{daily_usd: 100}}}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  dead:\n    kind: openai\n    base_url: http://127.0.0.1:{dead}/v1\n    health_check: {{enabled: false}}\n  p1:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: dead\n        upstream_model: dead-model\n      - provider: p1\n        upstream_model: mock-small-v1\n",
        mock.base_url()
    ));
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tokens":3,"token_delay_ms":5}}"#,
    );
    assert_eq!(s.status, 200);
    while s.next_piece(Duration::from_secs(5)).is_some() {}
    // The access line records the request's series one after another (the overhead
    // before the tokens and money), so a scrape can fall between them: wait for all.
    let mut live = BTreeSet::new();
    crate::harness::eventually(Duration::from_secs(5), || {
        live = sluice
            .metrics()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_string)
            .collect();
        used.iter()
            .all(|n| PENDING.contains(&n.as_str()) || live.contains(n))
    });

    for name in &used {
        if PENDING.contains(&name.as_str()) {
            assert!(
                !registered.contains(name),
                "{name} is now registered in src/metrics/mod.rs: remove it from PENDING"
            );
            continue;
        }
        assert!(
            registered.contains(name),
            "the dashboard uses {name}, which Sluice does not register"
        );
        assert!(
            live.contains(name),
            "the dashboard uses {name}, absent from a live /metrics:\n{live:?}"
        );
    }
    // The dashboard covers what the issue lists.
    for want in [
        "sluice_requests_total",
        "sluice_ttft_seconds",
        "sluice_inter_token_seconds",
        "sluice_gateway_overhead_seconds",
        "sluice_fallback_total",
        "sluice_rejected_total",
        "sluice_tokens_total",
        "sluice_cost_usd_total",
        "sluice_charge_usd_total",
        "sluice_budget_remaining_usd",
        "sluice_ledger_queue_depth",
        "sluice_ledger_dropped_total",
        "sluice_provider_health",
        "sluice_active_streams",
    ] {
        assert!(used.contains(want), "no panel for {want}");
    }
}
