//! The admin status page (`/`, fed by `/status.json`) loaded in headless Chromium against
//! known traffic through a real Sluice: request counts, route health, fallbacks, TTFT and the
//! active streams (while one is held open, and after it ends) must show what was sent. Also
//! the latency metrics behind it: `x-sluice-overhead-ms` and
//! `sluice_gateway_overhead_seconds` subtract the upstream's own time, and
//! `sluice_inter_token_seconds` measures the gaps of a stream.
//!
//! Chromium comes from Debian's `chromium` package (`scripts/install-deps.sh`); outside CI a
//! machine without it skips the page test with a message, under `CI=true` it fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::fallback::Metrics;
use crate::harness::get;
use crate::harness::{dead_port, KEY};
use crate::harness::{Mock, Sluice, TempDir};

/// `SLUICE_CHROMIUM`, else the first of `chromium`, `chromium-browser` on `PATH`.
pub(crate) fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
        .find(|p| p.is_file())
}

/// The page at `url` after its scripts ran (8 s of virtual time: several refreshes), as
/// Chromium serializes the DOM.
pub(crate) fn dump_dom(browser: &PathBuf, url: &str) -> String {
    let profile = TempDir::new("chromium");
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", url])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text inside the element with `id` (up to its first child tag), trimmed.
pub(crate) fn text_of(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[at..];
    let start = rest.find('>')? + 1;
    let end = rest[start..].find('<')? + start;
    Some(rest[start..end].trim().to_string())
}

/// The `data-health` of the provider table row of `provider`.
fn health_of(dom: &str, provider: &str) -> Option<String> {
    let at = dom.find(&format!("data-provider=\"{provider}\""))?;
    let rest = &dom[at..];
    let h = rest.find("data-health=\"")? + "data-health=\"".len();
    let end = rest[h..].find('"')? + h;
    Some(rest[h..end].to_string())
}

/// Two providers: `dead` (nothing listens) first (by priority: equal priorities would be
/// spread by weight, so the first requests might all miss `dead`), then `p1` (the mock);
/// `dead` turns unhealthy after its first failure and rests for 10 minutes.
fn config(base_url: &str) -> String {
    let dead = dead_port();
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\n  b: {{budget: {{daily_usd: 12.5}}}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  dead:\n    kind: openai\n    base_url: http://127.0.0.1:{dead}/v1\n    api_key: sk-dead\n    health_check: {{enabled: false}}\n    health: {{degraded_after_failures: 1, unhealthy_after_failures: 1, cooldown_ms: 600000}}\n  p1:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-p1\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: dead\n        upstream_model: dead-model\n        priority: 1\n      - provider: p1\n        upstream_model: mock-small-v1\n        priority: 2\n"
    )
}

fn body(stream: bool, mock: &str) -> String {
    format!(
        r#"{{"model":"acme/chat","stream":{stream},"messages":[{{"role":"user","content":"hi"}}],"mock":{mock}}}"#
    )
}

/// Loads the page until `check` accepts its DOM (each load runs the page's refreshes), up to
/// `timeout`; the last DOM.
fn page_until(
    browser: &PathBuf,
    url: &str,
    timeout: Duration,
    check: impl Fn(&str) -> bool,
) -> String {
    let end = Instant::now() + timeout;
    loop {
        let dom = dump_dom(browser, url);
        if check(&dom) || Instant::now() > end {
            return dom;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn status_page_in_chromium_shows_the_traffic_sent() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed (scripts/install-deps.sh installs Debian's `chromium`)"
        );
        eprintln!(
            "SKIPPED: no chromium on PATH (set SLUICE_CHROMIUM or run scripts/install-deps.sh)"
        );
        return;
    };
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let url = format!("http://{}/", sluice.admin);

    // Known traffic: 3 answers and 2 streams, all 200; the first requests fall back from
    // the dead provider to p1 until `dead` is unhealthy.
    for _ in 0..3 {
        let r = sluice.chat(&body(false, r#"{"tokens":3}"#));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for _ in 0..2 {
        let mut s = sluice.chat_stream(&body(true, r#"{"tokens":4,"token_delay_ms":10}"#));
        assert_eq!(s.status, 200);
        while s.next_piece(Duration::from_secs(5)).is_some() {}
    }
    // One stream held open while the page is loaded: 600 tokens 100 ms apart (60 s), far
    // longer than the page may take to load under load (the client drops it below).
    let mut held = sluice.chat_stream(&body(true, r#"{"tokens":600,"token_delay_ms":100}"#));
    assert_eq!(held.status, 200);
    assert!(held.next_piece(Duration::from_secs(5)).is_some());

    let m = Metrics::scrape(&sluice);
    let fallbacks: f64 =
        m.0.lines()
            .filter(|l| l.starts_with("sluice_fallback_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
    assert!(
        fallbacks >= 1.0,
        "the dead provider made no fallback:\n{}",
        m.0
    );
    let dead_health = m
        .get_opt("sluice_provider_health", &[("provider", "dead")])
        .expect("dead's health gauge");
    assert_eq!(dead_health, 2.0, "dead is not unhealthy:\n{}", m.0);

    let dom = page_until(&browser, &url, Duration::from_secs(20), |d| {
        text_of(d, "requests-total").as_deref() == Some("5")
            && text_of(d, "active-streams").as_deref() == Some("1")
    });
    assert_eq!(
        text_of(&dom, "requests-total").as_deref(),
        Some("5"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "requests-by-status").as_deref(),
        Some("200: 5"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "active-streams").as_deref(),
        Some("1"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "active-by-tenant").as_deref(),
        Some("t: 1"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "fallbacks-total"),
        Some(format!("{fallbacks}")),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "rejections-total").as_deref(),
        Some("0"),
        "{dom}"
    );
    assert_eq!(
        health_of(&dom, "dead").as_deref(),
        Some("unhealthy"),
        "{dom}"
    );
    assert_eq!(health_of(&dom, "p1").as_deref(), Some("healthy"), "{dom}");
    // TTFT of the 5 finished requests: a figure (not the placeholder) and a chart line.
    let p50 = text_of(&dom, "ttft-p50").unwrap_or_default();
    assert!(
        p50.ends_with(" ms"),
        "no TTFT p50 on the page: {p50:?}\n{dom}"
    );
    let p50_ms: f64 = p50.trim_end_matches(" ms").parse().expect("p50 number");
    assert!(p50_ms > 0.0 && p50_ms < 5_000.0, "{p50_ms}");
    assert!(dom.contains("<polyline"), "no TTFT chart drawn:\n{dom}");
    // Tenant `b` has a daily budget it has not touched: its row shows all of it.
    assert!(
        dom.contains(r#"<td>b</td><td>daily</td><td class="num">$12.50</td>"#),
        "no budget row for b:\n{dom}"
    );
    assert!(
        text_of(&dom, "updated").is_some_and(|t| t.ends_with("UTC")),
        "{dom}"
    );

    // The held stream ends (the client leaves): the page follows live.
    drop(held);
    let dom = page_until(&browser, &url, Duration::from_secs(20), |d| {
        text_of(d, "active-streams").as_deref() == Some("0")
            && text_of(d, "requests-total").as_deref() == Some("6")
    });
    assert_eq!(
        text_of(&dom, "active-streams").as_deref(),
        Some("0"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "requests-total").as_deref(),
        Some("6"),
        "{dom}"
    );
}

#[test]
fn status_json_serves_no_ledger_rows_and_the_page_is_self_contained() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&crate::harness::basic_config(&mock.base_url(), ""));
    let r = sluice.chat(&body(false, r#"{"tokens":2}"#));
    assert_eq!(r.status, 200);
    let page = get(sluice.admin, "/", &[]);
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/html"));
    let html = page.text();
    // Self-contained: no external scripts, styles, images or fonts.
    for external in ["src=", "href=", "@import", "url("] {
        assert!(!html.contains(external), "the page loads `{external}`");
    }
    // The request is counted when Pingora logs it, just after the answer went out.
    let mut j = serde_json::Value::Null;
    crate::harness::eventually(Duration::from_secs(3), || {
        j = get(sluice.admin, "/status.json", &[]).json();
        j["requests"]["total"] == 1.0
    });
    assert_eq!(j["requests"]["total"], 1.0, "{j}");
    assert_eq!(j["providers"][0]["provider"], "p1", "{j}");
    // No admin token configured: usage data stays off the admin listener; the status page's
    // figures are the metrics' own (no request ids, no ledger records).
    assert!(!j.to_string().contains(r#""request_id""#), "{j}");
    assert_eq!(get(sluice.admin, "/admin/usage", &[]).status, 403);
}

#[test]
fn overhead_excludes_the_upstream_and_inter_token_gaps_are_measured() {
    // The upstream waits 300 ms before its head, then 6 tokens 40 ms apart.
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&crate::harness::basic_config(&mock.base_url(), ""));
    let mut s = sluice.chat_stream(&body(
        true,
        r#"{"tokens":6,"token_delay_ms":40,"first_byte_delay_ms":300}"#,
    ));
    assert_eq!(s.status, 200);
    let overhead_ms: f64 = s
        .header("x-sluice-overhead-ms")
        .expect("x-sluice-overhead-ms on a stream")
        .parse()
        .expect("a number of milliseconds");
    while s.next_piece(Duration::from_secs(5)).is_some() {}
    // TTFT is over 300 ms; Sluice's own part of it is far below the upstream's wait.
    assert!(
        (0.0..100.0).contains(&overhead_ms),
        "overhead {overhead_ms} ms includes the upstream's 300 ms"
    );
    let r = sluice.chat(&body(false, r#"{"tokens":2,"first_byte_delay_ms":300}"#));
    let unary_ms: f64 = r
        .header("x-sluice-overhead-ms")
        .expect("x-sluice-overhead-ms on an answer")
        .parse()
        .expect("ms");
    assert!((0.0..100.0).contains(&unary_ms), "{unary_ms}");

    let mut m = Metrics::scrape(&sluice);
    crate::harness::eventually(Duration::from_secs(3), || {
        m = Metrics::scrape(&sluice);
        m.get("sluice_gateway_overhead_seconds_count", &[]) >= 2.0
    });
    let labels = [("model", "acme/chat"), ("provider", "p1")];
    assert_eq!(
        m.get("sluice_gateway_overhead_seconds_count", &labels),
        2.0,
        "{}",
        m.0
    );
    let sum = m.get("sluice_gateway_overhead_seconds_sum", &labels);
    assert!(sum < 0.2, "overhead sum {sum} s includes upstream time");
    assert_eq!(m.get("sluice_ttft_seconds_count", &labels), 2.0, "{}", m.0);
    // 6 content events: at most 5 gaps (events that arrive in one read are one arrival),
    // each about 40 ms, none under 10 ms.
    let gaps = m.get("sluice_inter_token_seconds_count", &labels);
    assert!((1.0..=5.0).contains(&gaps), "{gaps} gaps:\n{}", m.0);
    let mean = m.get("sluice_inter_token_seconds_sum", &labels) / gaps;
    assert!((0.02..2.0).contains(&mean), "mean gap {mean} s");
    let fast = m.get(
        "sluice_inter_token_seconds_bucket",
        &[("model", "acme/chat"), ("provider", "p1"), ("le", "0.01")],
    );
    assert_eq!(fast, 0.0, "{}", m.0);
}
