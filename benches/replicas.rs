//! Replicas under load (issue 31): three Sluice processes sharing one `redis-server` (rate
//! limits and budgets) and one PostgreSQL usage ledger, one mock upstream, 64 closed-loop
//! clients spread over the three replicas, all as one tenant with a request limit and a
//! budget that both run out during the run. It reports how exact the shared limits are
//! (admitted vs the setting), the budget's overshoot (charged vs budget), the ledger's rows
//! vs the requests served, and what the Redis round trips add to latency (the same config
//! with and without `redis:`, in the same run, plus Redis' own `INFO commandstats`).
//! See `benches/README.md`, section "Replicas under load (issue 31)".
//!
//! Run: `cargo bench --bench replicas` (Cargo builds `sluice` and `sluice-mock-upstream`
//! with the bench profile into `target/release/`). `cargo test --bench replicas` (no
//! `--bench` argument) runs a few-second sanity pass that fails on any error. Everything
//! listens on and talks to 127.0.0.1 only; every phase is bounded in time and in requests;
//! every child process is stopped and the scratch folder removed when the bench ends, also
//! when it panics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[path = "replicas/client.rs"]
mod client;
#[path = "common/mod.rs"]
#[expect(dead_code, reason = "this bench shares the port helper only")]
mod common;
#[path = "replicas/procs.rs"]
mod procs;
#[path = "replicas/report.rs"]
mod report;

use client::PhaseLog;
use procs::{Proc, Resp};

/// The virtual key of tenant `t`, the tenant under test.
const KEY_T: &str = "sk-sluice-replicas-t-0001";
/// The virtual key of tenant `lat` (latency phases and warm-up; limits that never bind).
const KEY_LAT: &str = "sk-sluice-replicas-lat-0001";
/// The standard model with the request limit (`tenants.t.model_limits`).
const MODEL_A: &str = "acme/chat";
/// The second standard model (same route, no request limit): its clients spend the budget
/// after model A's limit bound.
const MODEL_B: &str = "acme/chat-b";
/// The mock's answer: 10 output tokens, 10 input tokens reported (Sluice's input estimate
/// for the request is a little higher, so no charge exceeds its reservation).
const MOCK_BEHAVIOR: &str = r#"{"tokens":10,"prompt_tokens":10}"#;
/// Sell prices of both models, USD per million tokens.
const SELL_PRICES: &str = "    input_usd_per_mtok: 100\n    output_usd_per_mtok: 400\n";
/// Cost prices of the route, USD per million tokens.
const COST_PRICES: &str = "        input_usd_per_mtok: 50\n        output_usd_per_mtok: 200\n";
/// What one served request is charged: 10 × 100 + 10 × 400 USD per million tokens.
const CHARGE_USD: f64 = 0.005;
/// The sliding window of `requests_per_minute` (Sluice's default `rate_limit_window_ms`).
const WINDOW: Duration = Duration::from_secs(60);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number"))
    })
}

/// Every knob (environment variables, documented in `benches/README.md`).
#[derive(Debug, Clone)]
struct Opts {
    /// The main phase (`REPLICAS_DURATION_MS`, default 60 000).
    duration: Duration,
    /// Each of the four latency phases (`REPLICAS_LATENCY_MS`, default 10 000).
    latency: Duration,
    /// Closed-loop clients (`REPLICAS_CLIENTS`, default 64).
    clients: usize,
    /// Worker threads per replica (`REPLICAS_SLUICE_THREADS`, default 1).
    sluice_threads: u64,
    /// Load generator threads (`REPLICAS_GEN_THREADS`, default: the CPUs).
    gen_threads: usize,
    /// Model A's `requests_per_minute` (`REPLICAS_RPM`; default: sized from the latency
    /// phases' throughput so that it binds in the first quarter of the main phase).
    rpm: Option<u64>,
    /// The budget in served requests (`REPLICAS_BUDGET_REQUESTS`; default 4 × the RPM).
    budget_requests: Option<u64>,
    /// `redis.timeout_ms` (`REPLICAS_REDIS_TIMEOUT_MS`, default 50 = Sluice's default).
    redis_timeout_ms: u64,
    /// Most requests of one phase (`REPLICAS_MAX_REQUESTS`, default 3 000 000).
    max_requests: u64,
    /// Keep the scratch folder (`REPLICAS_KEEP_TMP=1`).
    keep_tmp: bool,
    /// The `cargo test` pass: short phases, fails on any error.
    sanity: bool,
}

impl Opts {
    fn from_env(sanity: bool) -> Opts {
        let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let ms = |name: &str, full: u64, short: u64| {
            Duration::from_millis(env_u64(name).unwrap_or(if sanity { short } else { full }))
        };
        Opts {
            duration: ms("REPLICAS_DURATION_MS", 60_000, 4_000).min(Duration::from_secs(600)),
            latency: ms("REPLICAS_LATENCY_MS", 10_000, 1_000).min(Duration::from_secs(600)),
            clients: env_u64("REPLICAS_CLIENTS").unwrap_or(64).clamp(2, 4096) as usize,
            sluice_threads: env_u64("REPLICAS_SLUICE_THREADS").unwrap_or(1).max(1),
            gen_threads: env_u64("REPLICAS_GEN_THREADS").map_or(cpus, |v| v.max(1) as usize),
            rpm: env_u64("REPLICAS_RPM"),
            budget_requests: env_u64("REPLICAS_BUDGET_REQUESTS"),
            redis_timeout_ms: env_u64("REPLICAS_REDIS_TIMEOUT_MS").unwrap_or(50).max(1),
            max_requests: env_u64("REPLICAS_MAX_REQUESTS").unwrap_or(3_000_000).max(1),
            keep_tmp: env_u64("REPLICAS_KEEP_TMP").unwrap_or(0) != 0,
            sanity,
        }
    }
}

/// The shared backends of one run.
struct Backends {
    mock: SocketAddr,
    redis: SocketAddr,
    /// The PostgreSQL ledger's URL; `None` in a sanity pass on a machine without PostgreSQL.
    pg: Option<String>,
}

/// The Sluice config of one replica: tenant `t` (model A's request limit `rpm` and a
/// `total_usd` budget of `budget_usd`), tenant `lat` (limits that never bind), models A and
/// B priced at [`SELL_PRICES`] on one route to the mock, the ledger in PostgreSQL, and
/// `redis:` when `with_redis`.
fn sluice_yaml(
    (listen, admin): (SocketAddr, SocketAddr),
    o: &Opts,
    b: &Backends,
    (rpm, budget_usd): (u64, f64),
    with_redis: bool,
) -> String {
    let model = |id: &str| {
        format!(
            "  {id}:\n{SELL_PRICES}    routes:\n      - provider: mock\n        upstream_model: mock-small-v1\n{COST_PRICES}"
        )
    };
    let redis = if with_redis {
        format!(
            "redis:\n  url: redis://{}\n  timeout_ms: {}\n  replicas: 3\n",
            b.redis, o.redis_timeout_ms
        )
    } else {
        String::new()
    };
    let ledger = match &b.pg {
        Some(url) => format!("ledger:\n  url: {url}\n"),
        None => "ledger:\n  enabled: false\n".into(),
    };
    format!(
        "server:
  listen: {listen}
  admin_listen: {admin}
  threads: {threads}
tenants:
  t: {{budget: {{total_usd: {budget_usd:.9}}}, model_limits: {{{MODEL_A}: {{requests_per_minute: {rpm}}}}}}}
  lat: {{requests_per_minute: 1000000000, budget: {{total_usd: 1000000000}}}}
virtual_keys:
  - key: {KEY_T}
    tenant: t
  - key: {KEY_LAT}
    tenant: lat
providers:
  mock:
    kind: openai
    base_url: http://{mock}/v1
    api_key: sk-provider-replicas
    health_check: {{enabled: false}}
models:
{a}{bm}{redis}{ledger}",
        threads = o.sluice_threads,
        mock = b.mock,
        a = model(MODEL_A),
        bm = model(MODEL_B),
    )
}

/// Three replicas of one config; stopped with SIGTERM when dropped.
struct Replicas {
    procs: Vec<Proc>,
    listen: Vec<SocketAddr>,
    admin: Vec<SocketAddr>,
}

impl Replicas {
    fn start(
        dir: &std::path::Path,
        tag: &str,
        yaml: &dyn Fn(SocketAddr, SocketAddr) -> String,
    ) -> Replicas {
        let mut r = Replicas {
            procs: Vec::new(),
            listen: Vec::new(),
            admin: Vec::new(),
        };
        for i in 0..3 {
            let (p, l, a) = procs::start_sluice(dir, &format!("{tag}-{i}"), yaml)
                .unwrap_or_else(|e| panic!("{e}"));
            r.procs.push(p);
            r.listen.push(l);
            r.admin.push(a);
        }
        r
    }

    /// Metric `name` summed over the three replicas, per label set.
    fn metric(&self, name: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for a in &self.admin {
            for (labels, v) in procs::metric_series(*a, name) {
                *out.entry(labels).or_default() += v;
            }
        }
        out
    }

    /// Stops all three (SIGTERM: each writes its queued ledger records first).
    fn stop(self) {
        self.procs.into_iter().for_each(Proc::stop);
    }
}

/// Redis `INFO commandstats` lines of the script commands: (command, calls, µs per call).
fn script_stats(redis: SocketAddr) -> Vec<(String, u64, f64)> {
    let info = procs::redis(redis, &["INFO", "commandstats"]).unwrap_or(Resp::Nil);
    info.text()
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if !name.starts_with("eval") {
                return None;
            }
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .map(str::to_string)
            };
            Some((
                name.to_string(),
                field("calls")?.parse().ok()?,
                field("usec_per_call")?.parse().ok()?,
            ))
        })
        .collect()
}

fn reset_stats(redis: SocketAddr) {
    let r = procs::redis(redis, &["CONFIG", "RESETSTAT"]);
    assert!(
        matches!(r, Ok(Resp::Str(ref s)) if s == "OK"),
        "CONFIG RESETSTAT: {r:?}"
    );
}

/// The latency phases: the same config (tenant `lat`, limits that never bind) on three
/// replicas without `redis:` (local limits) and three with, in the order local, Redis,
/// Redis, local (a drift of the machine's background load hits both alike), after a
/// warm-up of each.
fn latency_phases(
    rt: &tokio::runtime::Runtime,
    tmp: &std::path::Path,
    o: &Opts,
    b: &Backends,
) -> report::Latency {
    let local = Replicas::start(tmp, "local", &|l, a| {
        sluice_yaml((l, a), o, b, (1_000_000, 1e9), false)
    });
    let remote = Replicas::start(tmp, "redis", &|l, a| {
        sluice_yaml((l, a), o, b, (1_000_000, 1e9), true)
    });
    let req = vec![
        Arc::new(client::chat_request(KEY_LAT, MODEL_A)),
        Arc::new(client::chat_request(KEY_LAT, MODEL_B)),
    ];
    let run = |targets: &[SocketAddr], clients: usize, d: Duration| -> PhaseLog {
        rt.block_on(client::phase(targets, &req, clients, d, o.max_requests))
    };
    let warm = Duration::from_millis(500).min(o.latency);
    for set in [&local, &remote] {
        let w = run(&set.listen, o.clients, warm);
        assert!(
            w.errors == 0 && w.samples.iter().all(|s| s.status == 200),
            "warm-up failed: {} errors (first: {:?}), statuses {:?}",
            w.errors,
            w.first_error,
            w.first_bodies
        );
    }
    let mut out = report::Latency::default();
    let mut errors_before = remote.metric("sluice_ratelimit_backend_errors_total");
    // Light load first (one client per replica: latency ≈ service time, so the difference
    // is the Redis round trips), then the main phase's load (queueing included).
    for clients in [3, o.clients] {
        let mut round = report::Round {
            clients,
            ..report::Round::default()
        };
        reset_stats(b.redis);
        for redis_phase in [false, true, true, false] {
            let set = if redis_phase { &remote } else { &local };
            let log = run(&set.listen, clients, o.latency);
            if redis_phase {
                round.redis.push(log);
            } else {
                round.local.push(log);
            }
        }
        round.scripts = script_stats(b.redis);
        let errors = remote.metric("sluice_ratelimit_backend_errors_total");
        round.backend_errors = errors
            .iter()
            .map(|(k, v)| (k.clone(), v - errors_before.get(k).copied().unwrap_or(0.0)))
            .collect();
        errors_before = errors;
        out.rounds.push(round);
    }
    local.stop();
    remote.stop();
    out
}

/// The main phase: three replicas with `redis:` and the PostgreSQL ledger, model A limited
/// to `rpm` per minute, tenant `t` holding `budget_usd`; half the clients on each model.
fn main_phase(
    rt: &tokio::runtime::Runtime,
    tmp: &std::path::Path,
    o: &Opts,
    b: &Backends,
    rpm: u64,
    budget_usd: f64,
) -> report::Main {
    let set = Replicas::start(tmp, "main", &|l, a| {
        sluice_yaml((l, a), o, b, (rpm, budget_usd), true)
    });
    // Warm-up as tenant `lat`: connections to the mock, Redis and PostgreSQL open, scripts
    // loaded; tenant `t`'s windows and budget untouched.
    let warm = vec![Arc::new(client::chat_request(KEY_LAT, MODEL_A))];
    rt.block_on(client::phase(
        &set.listen,
        &warm,
        o.clients,
        Duration::from_millis(500),
        o.max_requests,
    ));
    reset_stats(b.redis);
    let req = vec![
        Arc::new(client::chat_request(KEY_T, MODEL_A)),
        Arc::new(client::chat_request(KEY_T, MODEL_B)),
    ];
    let log = rt.block_on(client::phase(
        &set.listen,
        &req,
        o.clients,
        o.duration,
        o.max_requests,
    ));
    let mut m = report::Main {
        rpm,
        budget_usd,
        log,
        ..report::Main::default()
    };
    m.scripts = script_stats(b.redis);
    let int = |key: &str| match procs::redis(b.redis, &["GET", key]) {
        Ok(Resp::Str(s)) => s.parse::<i64>().ok(),
        _ => None,
    };
    m.redis_window =
        match procs::redis(b.redis, &["ZCARD", &format!("sluice:rl:{{t}}:m:{MODEL_A}")]) {
            Ok(Resp::Int(n)) => u64::try_from(n).ok(),
            _ => None,
        };
    m.redis_spent_nusd = int("sluice:budget:{t}:total:spent");
    m.redis_reserved_nusd = int("sluice:budget:{t}:total:reserved");
    m.backend_errors = set.metric("sluice_ratelimit_backend_errors_total");
    m.ledger_dropped = set.metric("sluice_ledger_dropped_total").values().sum();
    m.ledger_write_errors = set
        .metric("sluice_ledger_write_errors_total")
        .values()
        .sum();
    set.stop();
    if let Some(url) = &b.pg {
        m.rows = Some(rt.block_on(report::ledger_rows(url)));
    }
    m
}

fn main() {
    // `cargo test --benches` runs bench targets without `--bench`: a short sanity pass.
    let sanity = !std::env::args().any(|a| a == "--bench");
    let o = Opts::from_env(sanity);
    let Some(redis_exe) = procs::find_program("redis-server") else {
        assert!(
            sanity,
            "replicas: no redis-server on PATH (scripts/install-deps.sh installs it)"
        );
        println!(
            "replicas: skipped (no redis-server on PATH; scripts/install-deps.sh installs it)"
        );
        return;
    };
    let pg_bindir = procs::postgres_bindir();
    assert!(
        sanity || pg_bindir.is_some(),
        "replicas: no PostgreSQL server binaries (initdb, postgres); scripts/install-deps.sh installs them"
    );
    let tmp = procs::TempDir::new(o.keep_tmp);
    let (mock_proc, mock) = procs::start_mock(&tmp.path, MOCK_BEHAVIOR);
    let (redis_proc, redis) =
        procs::start_redis(&tmp.path, &redis_exe).unwrap_or_else(|e| panic!("{e}"));
    let (pg_proc, pg) = match &pg_bindir {
        Some(dir) => {
            let (p, url) = procs::start_postgres(&tmp.path, dir).unwrap_or_else(|e| panic!("{e}"));
            (Some(p), Some(url))
        }
        None => {
            println!(
                "replicas: no PostgreSQL on this machine: the sanity pass runs without the ledger"
            );
            (None, None)
        }
    };
    let b = Backends { mock, redis, pg };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.gen_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");

    let lat = latency_phases(&rt, &tmp.path, &o, &b);
    // Model A's limit binds after about an eighth of the main phase at the Redis phases'
    // rate (half the clients are on model A), the budget (4 × the limit) some time after
    // its limit bound; a sanity pass sizes both smaller, so they surely bind. Model B's
    // requests make no rate-limit check and are served up to ~1.5× as fast as model A's
    // (more on a loaded machine), so by the time A's limit binds B has spent up to ~1.5 ×
    // the limit's worth: a budget of 2.5 × could run out first and keep the limit from
    // ever binding (CI saw exactly that); 4 × leaves room for B at up to 3× A's speed.
    let rate = lat.redis_rate();
    let share = if sanity { 16.0 } else { 8.0 };
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a positive request count far below 2^53"
    )]
    let rpm = o
        .rpm
        .unwrap_or_else(|| ((rate * o.duration.as_secs_f64() / share).round() as u64).max(20));
    let budget_requests = o.budget_requests.unwrap_or(rpm * 4);
    #[expect(clippy::cast_precision_loss, reason = "a request count below 2^53")]
    let budget_usd = budget_requests as f64 * CHARGE_USD;
    let main = main_phase(&rt, &tmp.path, &o, &b, rpm, budget_usd);

    let failures = report::print(&o, &lat, &main);
    drop(rt);
    drop(pg_proc);
    drop(redis_proc);
    drop(mock_proc);
    if sanity {
        assert!(
            failures.is_empty(),
            "replicas sanity pass failed:\n{}",
            failures.join("\n")
        );
        println!("replicas: sanity pass ok (test build, short phases: not a figure)");
    }
}
