//! Cost that does not grow with the config (issue 31, item 4): a config of 1,000 tenants
//! (one virtual key each) × 100 models starts, serves, and is scraped with a resident set
//! below [`MAX_RSS_KIB`] and, with no traffic, uses less than [`MAX_IDLE_CPU`] of a core
//! (the process's own CPU time from `/proc/PID/stat`, which load on other processes does not
//! inflate). Series are created on first use, so `/metrics` holds the pairs that had traffic,
//! not the config's product; and past `server.metrics_max_series_per_family` new tenants are
//! recorded under `tenant="__overflow__"`.

use std::time::{Duration, Instant};

use crate::harness::{eventually, parse_metric, post_json, Mock, Sluice};

/// Tenants (and virtual keys) of the large config.
const TENANTS: usize = 1_000;

/// Standard models of the large config (two routes each).
const MODELS: usize = 100;

/// The bound on the resident set after start, a few requests and a scrape, KiB.
const MAX_RSS_KIB: u64 = 150 * 1000;

/// The bound on CPU used at rest, as a fraction of one core.
const MAX_IDLE_CPU: f64 = 0.01;

/// How long the process is watched at rest.
const IDLE_WINDOW: Duration = Duration::from_secs(8);

fn key(i: usize) -> String {
    format!("sk-sluice-tenant{i:04}-key")
}

/// The large config: `tenants` tenants with a key and a request limit each, two providers
/// (both the mock), `models` models with a route on each provider and prices.
fn config(base_url: &str, tenants: usize, models: usize, extra_server: &str) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{extra_server}tenants:\n"
    );
    for t in 0..tenants {
        y.push_str(&format!("  t{t:04}: {{requests_per_minute: 6000}}\n"));
    }
    y.push_str("virtual_keys:\n");
    for t in 0..tenants {
        y.push_str(&format!("  - {{key: {}, tenant: t{t:04}}}\n", key(t)));
    }
    y.push_str(&format!(
        "providers:\n  p1: {{kind: openai, base_url: {base_url}, api_key: sk-p1, health_check: {{enabled: false}}}}\n  p2: {{kind: openai, base_url: {base_url}, api_key: sk-p2, health_check: {{enabled: false}}}}\nmodels:\n"
    ));
    for m in 0..models {
        y.push_str(&format!(
            "  acme/m{m:03}:\n    input_usd_per_mtok: 2\n    output_usd_per_mtok: 8\n    routes:\n      - {{provider: p1, upstream_model: mock-small-v1, priority: 1, input_usd_per_mtok: 1, output_usd_per_mtok: 4}}\n      - {{provider: p2, upstream_model: mock-small-v1, priority: 2, input_usd_per_mtok: 1, output_usd_per_mtok: 4}}\n"
        ));
    }
    y
}

fn chat(sluice: &Sluice, tenant: usize, model: usize) -> u16 {
    post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {}", key(tenant)))],
        &format!(r#"{{"model":"acme/m{model:03}","messages":[{{"role":"user","content":"hi"}}]}}"#),
    )
    .status
}

/// The sum of every `sluice_charge_usd_total` series in a scrape, USD.
fn charge_sum(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("sluice_charge_usd_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `utime + stime` of `pid`, clock ticks (fields 14 and 15 of `/proc/PID/stat`, counted
/// after the command name's closing parenthesis).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[test]
fn a_thousand_tenants_by_a_hundred_models_stay_small_and_quiet() {
    let mock = Mock::start("{}");
    let started = Instant::now();
    let sluice = Sluice::start(&config(&mock.base_url(), TENANTS, MODELS, ""));
    let start_time = started.elapsed();
    // A few requests: three tenants on two models each.
    for (t, m) in [(0, 0), (0, 1), (500, 0), (500, 42), (999, 99), (999, 98)] {
        assert_eq!(
            chat(&sluice, t, m),
            200,
            "t{t:04} acme/m{m:03}\n{}",
            sluice.log()
        );
    }
    let token_series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("sluice_tokens_total{"))
            .count()
    };
    // The access line records a request's series after its answer went out: wait for the
    // last one.
    let mut text = String::new();
    let mut scrape_time = Duration::ZERO;
    eventually(Duration::from_secs(10), || {
        let scrape_started = Instant::now();
        text = sluice.metrics();
        scrape_time = scrape_started.elapsed();
        token_series(&text) >= 6 * 5
    });
    // Series exist for the pairs that had traffic (all kinds, at 0 where nothing was
    // counted), none for the other 99,994 pairs.
    assert_eq!(token_series(&text), 6 * 5, "{text}");
    for kind in ["input", "output", "reasoning"] {
        let series =
            format!(r#"sluice_tokens_total{{kind="{kind}",model="acme/m042",tenant="t0500"}}"#);
        assert!(parse_metric(&text, &series).is_some(), "{series} missing");
    }
    assert!(
        parse_metric(
            &text,
            r#"sluice_charge_usd_total{model="acme/m099",tenant="t0999"}"#
        )
        .is_some_and(|usd| usd > 0.0),
        "no charge for t0999:\n{text}"
    );
    assert!(
        !text.contains(r#"tenant="t0001""#),
        "an idle tenant has series"
    );
    // What dashboards need at 0 is still there per model (alone).
    assert_eq!(
        parse_metric(
            &text,
            r#"sluice_requests_total{model="acme/m077",status="502"}"#
        ),
        Some(0.0)
    );
    // Let the first status sample after the traffic pass, then watch the process at rest.
    std::thread::sleep(Duration::from_secs(1));
    let rss = sluice.rss_kib();
    let (t0, w0) = (cpu_ticks(sluice.pid()), Instant::now());
    std::thread::sleep(IDLE_WINDOW);
    let (t1, w1) = (cpu_ticks(sluice.pid()), Instant::now());
    let idle = (t1 - t0) as f64 / ticks_per_second() / (w1 - w0).as_secs_f64();
    eprintln!(
        "{TENANTS} tenants x {MODELS} models: start {start_time:?}, scrape {scrape_time:?} for {} bytes ({} lines), RSS {rss} KiB, idle CPU {:.3} % of a core",
        text.len(),
        text.lines().count(),
        idle * 100.0
    );
    assert!(rss > 0 && rss < MAX_RSS_KIB, "RSS {rss} KiB");
    assert!(
        idle < MAX_IDLE_CPU,
        "idle CPU {:.3} % of a core",
        idle * 100.0
    );
}

#[test]
fn label_sets_past_the_cap_are_recorded_under_the_overflow_tenant() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        &mock.base_url(),
        4,
        2,
        "  metrics_max_series_per_family: 2\n",
    ));
    // A pair's series is taken by its first *recorded* charge, and a charge is recorded after
    // the answer went out: wait for each before the next request, or a later pair can be
    // recorded first and take the place (as seen under CI load).
    let mut charged = 0.0;
    for (t, m) in [(0, 0), (1, 0), (2, 0), (3, 1), (0, 0)] {
        assert_eq!(chat(&sluice, t, m), 200, "t{t:04}\n{}", sluice.log());
        assert!(
            eventually(Duration::from_secs(10), || {
                let now = charge_sum(&sluice.metrics());
                let more = now > charged;
                if more {
                    charged = now;
                }
                more
            }),
            "t{t:04}'s charge never recorded:\n{}",
            sluice.metrics()
        );
    }
    // The access line records a request's series after its answer went out: wait for the
    // last request's (tenant t0000's second charge).
    let mut text = String::new();
    eventually(Duration::from_secs(10), || {
        text = sluice.metrics();
        let one = parse_metric(
            &text,
            r#"sluice_charge_usd_total{model="acme/m000",tenant="t0001"}"#,
        );
        let t0 = parse_metric(
            &text,
            r#"sluice_charge_usd_total{model="acme/m000",tenant="t0000"}"#,
        );
        one.zip(t0)
            .is_some_and(|(one, t0)| (t0 - 2.0 * one).abs() < 1e-9)
    });
    let value = |s: &str| parse_metric(&text, s).unwrap_or_else(|| panic!("{s} missing:\n{text}"));
    // The first two pairs have their own series; the next two share the overflow pair.
    assert!(value(r#"sluice_charge_usd_total{model="acme/m000",tenant="t0000"}"#) > 0.0);
    assert!(value(r#"sluice_charge_usd_total{model="acme/m000",tenant="t0001"}"#) > 0.0);
    let overflow_charge =
        value(r#"sluice_charge_usd_total{model="__overflow__",tenant="__overflow__"}"#);
    let one_charge = value(r#"sluice_charge_usd_total{model="acme/m000",tenant="t0001"}"#);
    assert!(
        (overflow_charge - 2.0 * one_charge).abs() < 1e-9,
        "{overflow_charge} vs 2 × {one_charge}"
    );
    assert!(!text.contains(r#"tenant="t0002""#), "{text}");
    assert!(!text.contains(r#"tenant="t0003""#), "{text}");
    for family in [
        "sluice_tokens_total",
        "sluice_cost_usd_total",
        "sluice_charge_usd_total",
        "sluice_active_streams",
    ] {
        assert_eq!(
            value(&format!(
                r#"sluice_metric_overflow_total{{family="{family}"}}"#
            )),
            2.0,
            "{family}"
        );
    }
    assert_eq!(
        value(r#"sluice_active_streams{tenant="__overflow__"}"#),
        0.0,
        "the overflow gauge goes back down"
    );
    // Logged once per capped group.
    let log = sluice.log();
    assert_eq!(
        log.matches("metrics_max_series_per_family (2) reached in sluice_tokens_total")
            .count(),
        1,
        "{log}"
    );
}
