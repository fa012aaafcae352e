//! What the replicas bench measured, and its printout: limit accuracy, budget overshoot,
//! ledger rows vs requests served, latency with and without Redis. Returns the failed
//! checks (a sanity pass fails on any; a full run prints the goals met or missed).

use std::collections::BTreeMap;

use crate::client::{quantile_ms, PhaseLog, Sample};
use crate::{Opts, CHARGE_USD, MODEL_A, MODEL_B, WINDOW};

/// One load level of the latency phases: two phases without Redis, two with, and Redis'
/// script statistics over them.
#[derive(Debug, Default)]
pub(crate) struct Round {
    pub(crate) clients: usize,
    pub(crate) local: Vec<PhaseLog>,
    pub(crate) redis: Vec<PhaseLog>,
    /// (command, calls, µs per call) over the Redis phases.
    pub(crate) scripts: Vec<(String, u64, f64)>,
    /// `sluice_ratelimit_backend_errors_total` of the Redis replicas in this round, per
    /// label set.
    pub(crate) backend_errors: BTreeMap<String, f64>,
}

/// The latency phases, light load first.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    pub(crate) rounds: Vec<Round>,
}

fn ok_rate(p: &PhaseLog) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "a request count below 2^53")]
    let n = p.samples.iter().filter(|s| s.status == 200).count() as f64;
    n / p.elapsed.as_secs_f64().max(1e-3)
}

impl Latency {
    /// Served requests per second of the Redis phases at the heaviest load (their mean).
    pub(crate) fn redis_rate(&self) -> f64 {
        let Some(r) = self.rounds.last() else {
            return 0.0;
        };
        #[expect(clippy::cast_precision_loss, reason = "two phases")]
        let n = r.redis.len().max(1) as f64;
        r.redis.iter().map(ok_rate).sum::<f64>() / n
    }
}

/// One ledger group: (model, status, outcome) → (rows, charged USD, cost USD).
pub(crate) type Rows = BTreeMap<(String, i32, String), (i64, f64, f64)>;

/// The main phase's figures.
#[derive(Debug, Default)]
pub(crate) struct Main {
    pub(crate) rpm: u64,
    pub(crate) budget_usd: f64,
    pub(crate) log: PhaseLog,
    pub(crate) scripts: Vec<(String, u64, f64)>,
    /// Entries in model A's Redis window log at the end (`ZCARD`).
    pub(crate) redis_window: Option<u64>,
    /// The tenant's budget keys in Redis at the end, nano-USD.
    pub(crate) redis_spent_nusd: Option<i64>,
    pub(crate) redis_reserved_nusd: Option<i64>,
    pub(crate) backend_errors: BTreeMap<String, f64>,
    pub(crate) ledger_dropped: f64,
    pub(crate) ledger_write_errors: f64,
    /// Tenant `t`'s ledger rows (`None` without PostgreSQL).
    pub(crate) rows: Option<Rows>,
}

/// Tenant `t`'s rows in the PostgreSQL ledger, grouped by model, status and outcome.
pub(crate) async fn ledger_rows(url: &str) -> Rows {
    let (pg, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to the ledger: {e}"));
    let task = tokio::spawn(conn);
    let rows = pg
        .query(
            "SELECT model, status, outcome, count(*), coalesce(sum(charge_usd), 0), \
             coalesce(sum(cost_usd), 0) FROM usage_records WHERE tenant = 't' \
             GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("query the ledger: {e}"));
    drop(pg);
    let _ = task.await;
    rows.iter()
        .map(|r| {
            (
                (r.get(0), r.get(1), r.get(2)),
                (r.get(3), r.get(4), r.get(5)),
            )
        })
        .collect()
}

/// Samples of `kind` with `status`.
fn count(s: &[Sample], kind: u8, status: u16) -> u64 {
    s.iter()
        .filter(|x| x.kind == kind && x.status == status)
        .count() as u64
}

/// The most send times of `t` (sorted, µs) that fit in one window of [`WINDOW`].
fn max_in_window(t: &[u64]) -> u64 {
    let w = u64::try_from(WINDOW.as_micros()).unwrap_or(u64::MAX);
    let (mut lo, mut best) = (0, 0);
    for hi in 0..t.len() {
        while t[hi] - t[lo] >= w {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best as u64
}

fn secs(us: Option<u64>) -> String {
    #[expect(clippy::cast_precision_loss, reason = "µs of a short run")]
    us.map_or("never".into(), |v| format!("{:.2} s", v as f64 / 1e6))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// "this request needs up to X USD" in a 402 body.
fn reservation_of(body: &str) -> Option<f64> {
    let rest = body.split("needs up to ").nth(1)?;
    rest.split(' ').next()?.parse().ok()
}

/// `sum (kind=a: x, kind=b: y)` of a labelled counter.
fn errors_text(by: &BTreeMap<String, f64>) -> String {
    let total: f64 = by.values().sum();
    let parts: Vec<String> = by
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    format!("{total} ({})", parts.join(", "))
}

fn print_latency(lat: &Latency) {
    println!("\n## Latency: the same config without and with `redis:` (tenant `lat`, limits never bind)\n");
    for r in &lat.rounds {
        print_round(r);
    }
}

fn print_round(r: &Round) {
    println!("\n{} clients:\n", r.clients);
    println!("| phase | served/s | p50 ms | p99 ms | errors |");
    println!("|---|---:|---:|---:|---:|");
    let mut merged: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    let mut rates = [0.0, 0.0];
    for (i, (name, phases)) in [("local limits", &r.local), ("redis limits", &r.redis)]
        .into_iter()
        .enumerate()
    {
        for p in phases {
            let mut v: Vec<u32> = p
                .samples
                .iter()
                .filter(|s| s.status == 200)
                .map(|s| s.latency_us)
                .collect();
            v.sort_unstable();
            println!(
                "| {name} | {:.0} | {} | {} | {} |",
                ok_rate(p),
                ms(quantile_ms(&v, 0.5)),
                ms(quantile_ms(&v, 0.99)),
                p.errors
            );
            merged[i].extend(v);
            #[expect(clippy::cast_precision_loss, reason = "two phases")]
            let n = phases.len() as f64;
            rates[i] += ok_rate(p) / n;
        }
        merged[i].sort_unstable();
    }
    let q = |i: usize, p: f64| quantile_ms(&merged[i], p);
    let diff = |p: f64| match (q(0, p), q(1, p)) {
        (Some(a), Some(b)) => format!("{:+.3} ms", b - a),
        _ => "-".into(),
    };
    println!(
        "\nRedis adds (both phases of each pooled): p50 {} ({} → {}), p99 {} ({} → {}); served/s {:.0} local vs {:.0} redis",
        diff(0.5),
        ms(q(0, 0.5)),
        ms(q(1, 0.5)),
        diff(0.99),
        ms(q(0, 0.99)),
        ms(q(1, 0.99)),
        rates[0],
        rates[1],
    );
    for (cmd, calls, us) in &r.scripts {
        #[expect(clippy::cast_precision_loss, reason = "request counts below 2^53")]
        let per_req = *calls as f64
            / r.redis
                .iter()
                .map(|p| p.samples.len())
                .sum::<usize>()
                .max(1) as f64;
        println!(
            "Redis `{cmd}` (the two Redis phases): {calls} calls ({per_req:.2} per request), {us:.2} µs per call inside Redis"
        );
    }
    println!(
        "sluice_ratelimit_backend_errors_total (Redis replicas, this round): {}",
        errors_text(&r.backend_errors)
    );
}

/// Prints everything; returns the failed checks.
#[expect(clippy::too_many_lines, reason = "one report, read top to bottom")]
pub(crate) fn print(o: &Opts, lat: &Latency, m: &Main) -> Vec<String> {
    let mut fail = Vec::new();
    println!(
        "# Replicas under load: 3 Sluice (threads {} each) + redis-server + PostgreSQL, {} clients{}\n",
        o.sluice_threads,
        o.clients,
        if o.sanity { " (sanity pass: short phases, not a figure)" } else { "" }
    );
    print_latency(lat);
    for p in lat
        .rounds
        .iter()
        .flat_map(|r| r.local.iter().chain(&r.redis))
    {
        if p.errors > 0 || p.samples.iter().any(|s| s.status != 200) {
            fail.push(format!(
                "latency phase: {} errors (first {:?}), non-200 answers {:?}",
                p.errors, p.first_error, p.first_bodies
            ));
        }
    }

    let s = &m.log.samples;
    // Redis answered every check in time: the shared limits decided every request.
    let redis_up = m.backend_errors.values().sum::<f64>() == 0.0;
    println!(
        "\n## Main phase: {:.1} s, tenant `t`, {MODEL_A} limited to {} requests/min, budget {:.6} USD ({:.0} served requests at {CHARGE_USD} USD)\n",
        m.log.elapsed.as_secs_f64(),
        m.rpm,
        m.budget_usd,
        m.budget_usd / CHARGE_USD
    );
    let mut statuses: BTreeMap<(u8, u16), u64> = BTreeMap::new();
    for x in s {
        *statuses.entry((x.kind, x.status)).or_default() += 1;
    }
    println!("| model | status | responses |\n|---|---:|---:|");
    for ((k, st), n) in &statuses {
        println!("| {} | {st} | {n} |", [MODEL_A, MODEL_B][usize::from(*k)]);
    }
    println!(
        "transport errors: {} (first: {:?})",
        m.log.errors, m.log.first_error
    );
    if m.log.errors > 0 {
        fail.push(format!(
            "{} requests got no answer: {:?}",
            m.log.errors, m.log.first_error
        ));
    }
    if let Some(((k, st), _)) = statuses
        .iter()
        .find(|((_, st), _)| ![200, 402, 429].contains(st))
    {
        fail.push(format!(
            "unexpected status {st} on kind {k}: {:?}",
            m.log.first_bodies.iter().find(|(x, _)| x == st)
        ));
    }

    // The request limit.
    let admitted: Vec<u64> = s
        .iter()
        .filter(|x| x.kind == 0 && x.status == 200)
        .map(|x| x.sent_us)
        .collect();
    let a = admitted.len() as u64;
    let first = |kind: Option<u8>, status: u16| {
        s.iter()
            .find(|x| kind.is_none_or(|k| x.kind == k) && x.status == status)
            .map(|x| x.sent_us)
    };
    #[expect(clippy::cast_precision_loss, reason = "request counts below 2^53")]
    let err_pct = (a as f64 - m.rpm as f64) / m.rpm as f64 * 100.0;
    println!("\n### Limit: {MODEL_A} requests_per_minute = {}\n", m.rpm);
    println!(
        "admitted (served) {a} vs setting {} = {err_pct:+.3} %; most admitted in any {} s window (client send times) {}",
        m.rpm,
        WINDOW.as_secs(),
        max_in_window(&admitted)
    );
    println!(
        "first admitted at {}, last at {}, first 429 at {} (after phase start); Redis window log holds {} entries at the end",
        secs(admitted.first().copied()),
        secs(admitted.last().copied()),
        secs(first(Some(0), 429)),
        m.redis_window.map_or("?".into(), |v| v.to_string())
    );
    let limit_bound = count(s, 0, 429) > 0;
    if !limit_bound {
        fail.push("the request limit never bound (no 429)".into());
    }
    if redis_up && a > m.rpm {
        fail.push(format!(
            "{a} admitted over a limit of {} with Redis up throughout",
            m.rpm
        ));
    }
    if !o.sanity {
        println!(
            "goal (within 2 %): {}",
            if err_pct.abs() <= 2.0 && limit_bound {
                "met"
            } else {
                "MISSED"
            }
        );
    }

    // The budget.
    let served = count(s, 0, 200) + count(s, 1, 200);
    let reservation = m
        .log
        .first_bodies
        .iter()
        .find(|(st, _)| *st == 402)
        .and_then(|(_, b)| reservation_of(b));
    let charged_pg = m
        .rows
        .as_ref()
        .map(|r| r.values().map(|v| v.1).sum::<f64>());
    #[expect(clippy::cast_precision_loss, reason = "nano-USD below 2^53")]
    let charged_redis = m.redis_spent_nusd.map(|v| v as f64 / 1e9);
    #[expect(clippy::cast_precision_loss, reason = "a request count below 2^53")]
    let charged_clients = served as f64 * CHARGE_USD;
    let charged = charged_pg.or(charged_redis).unwrap_or(charged_clients);
    println!("\n### Budget: total_usd = {:.6}\n", m.budget_usd);
    println!(
        "served (2xx, both models) {served} × {CHARGE_USD} = {charged_clients:.6} USD; ledger charge_usd sum {}; Redis spent {} (reserved left {})",
        charged_pg.map_or("-".into(), |v| format!("{v:.6} USD")),
        charged_redis.map_or("-".into(), |v| format!("{v:.6} USD")),
        m.redis_reserved_nusd.map_or("-".into(), |v| format!("{v} nano-USD")),
    );
    println!(
        "overshoot (charged − budget) {:+.6} USD; one request's reservation {} USD; first 402 at {}",
        charged - m.budget_usd,
        reservation.map_or("?".into(), |v| format!("{v:.6}")),
        secs(first(None, 402)),
    );
    let budget_bound = count(s, 0, 402) + count(s, 1, 402) > 0;
    if !budget_bound {
        fail.push("the budget never ran out (no 402)".into());
    }
    if redis_up && charged > m.budget_usd + 1e-9 {
        fail.push(format!(
            "charged {charged:.9} USD over a budget of {:.9} USD",
            m.budget_usd
        ));
    }
    if !o.sanity {
        let within = charged <= m.budget_usd + reservation.unwrap_or(0.0) + 1e-9;
        println!(
            "goal (no overshoot beyond one reservation): {}",
            if within && budget_bound {
                "met"
            } else {
                "MISSED"
            }
        );
    }

    // The ledger.
    println!("\n### Ledger (PostgreSQL, tenant `t`)\n");
    match &m.rows {
        None => println!("no PostgreSQL on this machine: ledger not checked"),
        Some(rows) => {
            println!("| model | status | outcome | rows | charge_usd | cost_usd |\n|---|---:|---|---:|---:|---:|");
            for ((model, st, outcome), (n, charge, cost)) in rows {
                println!("| {model} | {st} | {outcome} | {n} | {charge:.6} | {cost:.6} |");
            }
            let rows_2xx: i64 = rows
                .iter()
                .filter(|(k, _)| (200..300).contains(&k.1))
                .map(|(_, v)| v.0)
                .sum();
            let rows_all: i64 = rows.values().map(|v| v.0).sum();
            println!(
                "rows with a 2xx status {rows_2xx} vs served {served}; all rows {rows_all} vs responses {}; ledger records dropped {}, write errors {}",
                s.len(),
                m.ledger_dropped,
                m.ledger_write_errors
            );
            if u64::try_from(rows_2xx).ok() != Some(served) {
                fail.push(format!(
                    "ledger has {rows_2xx} rows with a 2xx status for {served} served requests"
                ));
            }
            if !o.sanity {
                println!(
                    "goal (rows = served): {}",
                    if u64::try_from(rows_2xx).ok() == Some(served) {
                        "met"
                    } else {
                        "MISSED"
                    }
                );
            }
        }
    }
    println!("\n### Redis\n");
    for (cmd, calls, us) in &m.scripts {
        println!("`{cmd}`: {calls} calls, {us:.2} µs per call inside Redis");
    }
    println!(
        "sluice_ratelimit_backend_errors_total (3 replicas): {}",
        errors_text(&m.backend_errors)
    );
    if !m.log.first_bodies.is_empty() {
        println!("\nfirst bodies of non-200 answers:");
        for (st, b) in &m.log.first_bodies {
            println!("- {st}: {}", b.chars().take(400).collect::<String>());
        }
    }
    fail
}
