//! Owns the status page of the admin listener: `/` (one self-contained HTML page, inline CSS
//! and JS, no external assets, see `page.html`) and `/status.json` (the figures it shows),
//! plus the background sampler that keeps the last minutes of them in a fixed-size ring.
//!
//! Everything shown is what `/metrics` already exports (all three behind the admin token when
//! one is set, see [`crate::admin`]): requests, active streams, route health
//! (`sluice_provider_health`), fallbacks, rejections, TTFT quantiles (from bucket deltas of
//! `sluice_ttft_seconds` over all its label sets between samples), spend today (deltas of
//! `sluice_charge_usd_total` since the UTC day began) and budgets left
//! (`sluice_budget_remaining_usd`). The status page never reads the usage ledger: ledger rows
//! (per-request records) stay behind the admin token at `/admin/usage`, so `/` and
//! `/status.json` serve no usage data that `/metrics` does not.
//!
//! It never gathers the whole registry. The sampler reads Sluice's own totals
//! ([`crate::metrics::series`]: request and fallback counts, the all-routes TTFT histogram)
//! and `sluice_rejected_total` (fixed reasons), and re-reads the charges only when one was
//! recorded since the last sample, so its cost at rest does not depend on how many series
//! the config or the traffic made. A `/status.json` request reads the few families it shows
//! by their handles.
//!
//! Memory is fixed: [`RING_LEN`] samples of a few numbers and one TTFT bucket vector each,
//! plus one spend baseline per (tenant, model) series (bounded by
//! `server.metrics_max_series_per_family`).

use std::collections::BTreeMap;
use std::sync::{Mutex, Once};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::{MetricFamily, MetricType};
use serde_json::{json, Value};

/// The status page, served at `/` of the admin listener.
pub const PAGE: &str = include_str!("page.html");

/// Time between two samples of the ring.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Samples kept: 10 minutes at [`SAMPLE_INTERVAL`].
pub const RING_LEN: usize = 120;

/// The window of the headline rates and TTFT quantiles (requests/s, p50/p99 "now").
const RATE_WINDOW_SECS: f64 = 60.0;

/// One sample of the cumulative counters the page charts.
#[derive(Debug, Clone, Default)]
struct Sample {
    /// Unix time, seconds.
    at: f64,
    /// `sum(sluice_requests_total)`.
    requests: f64,
    /// `sum(sluice_fallback_total)`.
    fallbacks: f64,
    /// `sum(sluice_rejected_total)`.
    rejections: f64,
    /// `sluice_ttft_seconds` over all label sets: (upper bound, cumulative count), `+Inf` last.
    ttft: Vec<(f64, f64)>,
}

/// The ring and the spend baseline.
#[derive(Debug, Default)]
struct State {
    ring: std::collections::VecDeque<Sample>,
    /// UTC day (days since the epoch) the baseline belongs to.
    day: i64,
    /// `sluice_charge_usd_total{tenant,model}` when that day began (or when it was first seen).
    spend_baseline: BTreeMap<(String, String), f64>,
    /// The charge values of the previous sample (the baseline of the next day).
    spend_last: BTreeMap<(String, String), f64>,
}

static STATE: Mutex<State> = Mutex::new(State {
    ring: std::collections::VecDeque::new(),
    day: i64::MIN,
    spend_baseline: BTreeMap::new(),
    spend_last: BTreeMap::new(),
});

static STARTED: Once = Once::new();

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Starts the sampler thread once per process (later calls do nothing): a sample now, then
/// one every [`SAMPLE_INTERVAL`], so the last minutes exist before the page is opened.
pub fn start_sampler() {
    STARTED.call_once(|| {
        take_sample(unix_now());
        let spawned = std::thread::Builder::new()
            .name("sluice-status".into())
            .spawn(|| loop {
                std::thread::sleep(SAMPLE_INTERVAL);
                take_sample(unix_now());
            });
        if let Err(e) = spawned {
            log::error!("status page sampler not started: {e}");
        }
    });
}

/// Charges recorded when the sampler last read them (`u64::MAX`: never).
static CHARGES_READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

fn take_sample(at: f64) {
    let sample = sample_now(at);
    // The charge counters only move with a charge: re-read them only then.
    let charges = crate::metrics::series::charges_seen();
    let spend = (CHARGES_READ.swap(charges, std::sync::atomic::Ordering::Relaxed) != charges)
        .then(spend_now);
    lock().record(sample, spend);
}

/// `sluice_charge_usd_total{tenant,model}` now.
fn spend_now() -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    crate::metrics::series::for_each_charge(|t, m, v| {
        out.insert((t.to_string(), m.to_string()), v);
    });
    out
}

impl State {
    /// Appends `sample` (dropping the oldest past [`RING_LEN`]) and `spend`, the charge
    /// counters at the same time. The first sample of a new UTC day makes the previous
    /// sample's charges the day's baseline; a Sluice started today has none (everything
    /// charged since start is today's).
    /// `spend` is `None` when no charge was recorded since the previous sample (the last
    /// values still hold).
    fn record(&mut self, sample: Sample, spend: Option<BTreeMap<(String, String), f64>>) {
        let day = (sample.at / 86_400.0).floor() as i64;
        if self.day != day {
            self.spend_baseline = if self.day == i64::MIN {
                BTreeMap::new()
            } else {
                // A clone: the next samples may not re-read the charges (none recorded).
                self.spend_last.clone()
            };
            self.day = day;
        }
        if let Some(spend) = spend {
            self.spend_last = spend;
        }
        if self.ring.len() == RING_LEN {
            self.ring.pop_front();
        }
        self.ring.push_back(sample);
    }

    /// Charged today per (tenant, model), from the charge counters now: what grew since
    /// the day's baseline (a series first seen today counts whole); zero rows left out.
    fn spend_today(
        &self,
        current: &BTreeMap<(String, String), f64>,
    ) -> Vec<((String, String), f64)> {
        current
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v - self.spend_baseline.get(k).copied().unwrap_or(0.0),
                )
            })
            .filter(|(_, v)| *v > 0.0)
            .collect()
    }
}

/// A sample of the totals now, from Sluice's own counters (no registry walk).
fn sample_now(at: f64) -> Sample {
    let m = crate::metrics::metrics();
    Sample {
        at,
        requests: crate::metrics::series::requests_seen() as f64,
        fallbacks: crate::metrics::series::fallbacks_seen() as f64,
        rejections: sum(&m.rejected_total.collect(), "sluice_rejected_total"),
        ttft: buckets(
            &crate::metrics::series::ttft_all().collect(),
            "sluice_ttft_seconds_all",
        ),
    }
}

fn family<'a>(families: &'a [MetricFamily], name: &str) -> Option<&'a MetricFamily> {
    families.iter().find(|f| f.name() == name)
}

fn value(m: &prometheus::proto::Metric, t: MetricType) -> f64 {
    match t {
        MetricType::COUNTER => m.get_counter().value(),
        MetricType::GAUGE => m.get_gauge().value(),
        _ => 0.0,
    }
}

fn label<'a>(m: &'a prometheus::proto::Metric, name: &str) -> &'a str {
    m.get_label()
        .iter()
        .find(|l| l.name() == name)
        .map_or("", |l| l.value())
}

/// Sum of a counter or gauge over all its label sets (0 when absent).
fn sum(families: &[MetricFamily], name: &str) -> f64 {
    family(families, name).map_or(0.0, |f| {
        f.get_metric()
            .iter()
            .map(|m| value(m, f.get_field_type()))
            .sum()
    })
}

/// A counter or gauge summed by one label; zero values left out.
fn by_label(families: &[MetricFamily], name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if let Some(f) = family(families, name) {
        for m in f.get_metric() {
            *out.entry(label(m, key).to_string()).or_insert(0.0) += value(m, f.get_field_type());
        }
    }
    out.retain(|_, v| *v != 0.0);
    out
}

/// A counter or gauge by two labels.
fn series2(
    families: &[MetricFamily],
    name: &str,
    a: &str,
    b: &str,
) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    if let Some(f) = family(families, name) {
        for m in f.get_metric() {
            *out.entry((label(m, a).to_string(), label(m, b).to_string()))
                .or_insert(0.0) += value(m, f.get_field_type());
        }
    }
    out
}

/// A histogram's cumulative buckets summed over its label sets, `+Inf` (the count) last.
fn buckets(families: &[MetricFamily], name: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut count = 0.0;
    if let Some(f) = family(families, name) {
        for m in f.get_metric() {
            let h = m.get_histogram();
            count += h.get_sample_count() as f64;
            for (i, b) in h.get_bucket().iter().enumerate() {
                match out.get_mut(i) {
                    Some(slot) => slot.1 += b.cumulative_count() as f64,
                    None => out.push((b.upper_bound(), b.cumulative_count() as f64)),
                }
            }
        }
    }
    out.push((f64::INFINITY, count));
    out
}

/// The `q` quantile (0..1) of the observations between two cumulative bucket vectors, by
/// linear interpolation inside the bucket (Prometheus' `histogram_quantile`); `None` without
/// observations. A quantile in the `+Inf` bucket is the highest finite bound.
fn quantile(q: f64, newer: &[(f64, f64)], older: &[(f64, f64)]) -> Option<f64> {
    let delta: Vec<(f64, f64)> = newer
        .iter()
        .enumerate()
        .map(|(i, &(le, c))| (le, c - older.get(i).map_or(0.0, |o| o.1)))
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = 0.0;
    let mut below = 0.0;
    for &(le, c) in &delta {
        if c >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let in_bucket = c - below;
            let frac = if in_bucket > 0.0 {
                (rank - below) / in_bucket
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        lower = le;
        below = c;
    }
    Some(lower)
}

/// `{total, by_tenant}` of `sluice_active_streams` (tenants at 0 left out).
fn active_streams() -> Value {
    let mut total = 0;
    let mut by_tenant = BTreeMap::new();
    crate::metrics::series::for_each_active(|t, n| {
        total += n;
        if n != 0 {
            by_tenant.insert(t.to_string(), n as f64);
        }
    });
    json!({"total": total as f64, "by_tenant": by_tenant})
}

fn health_name(v: f64) -> &'static str {
    match v as i64 {
        0 => "healthy",
        1 => "degraded",
        _ => "unhealthy",
    }
}

fn ms(s: Option<f64>) -> Value {
    s.map_or(Value::Null, |s| json!((s * 1e6).round() / 1e3))
}

fn usd(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// The body of `/status.json`: the live figures plus the sampled history. Shape:
/// `{now, sample_interval_s, requests: {total, per_s, by_status}, active_streams: {total,
/// by_tenant}, providers: [{provider, route, health}], fallbacks: {total, per_min},
/// rejections: {total, by_reason}, ttft: {p50_ms, p99_ms, window_s, history_s, series: [{t,
/// p50_ms, p99_ms, count}]}, spend_today: {metric, since, total_usd, rows: [{tenant, model, usd}]} |
/// null, budgets: [{tenant, window, remaining_usd}] | null}`. Times are Unix seconds,
/// latencies milliseconds, money US dollars; `null` spend/budgets mean the metric is not
/// exported (no prices or no budgets configured).
#[expect(
    clippy::too_many_lines,
    reason = "one JSON document assembled field by field from the registry"
)]
pub fn status_json() -> Vec<u8> {
    start_sampler();
    // Only the families shown, each read by its handle.
    let m = crate::metrics::metrics();
    let families: Vec<MetricFamily> = [
        m.requests_total.collect(),
        m.rejected_total.collect(),
        m.provider_health.collect(),
        m.charge_usd_total.collect(),
        m.budget_remaining_usd.collect(),
    ]
    .into_iter()
    .flatten()
    // As a scrape: a family without series is not there (`budgets: null`).
    .filter(|f| !f.get_metric().is_empty())
    .collect();
    let now = unix_now();
    let live = sample_now(now);
    let st = lock();
    let ring: Vec<&Sample> = st.ring.iter().chain(std::iter::once(&live)).collect();

    // The oldest sample inside the rate window (or the oldest one there is).
    let base = ring
        .iter()
        .find(|s| now - s.at <= RATE_WINDOW_SECS + 0.5)
        .copied()
        .unwrap_or(&live);
    let span = (now - base.at).max(1e-3);
    let per_s = |newer: f64, older: f64| ((newer - older).max(0.0) / span * 1e3).round() / 1e3;

    let series: Vec<Value> = ring
        .windows(2)
        .filter_map(|w| {
            let count = w[1].ttft.last()?.1 - w[0].ttft.last()?.1;
            Some(json!({
                "t": w[1].at.round(),
                "p50_ms": ms(quantile(0.5, &w[1].ttft, &w[0].ttft)),
                "p99_ms": ms(quantile(0.99, &w[1].ttft, &w[0].ttft)),
                "count": count,
            }))
        })
        .collect();

    let providers: Vec<Value> = family(&families, "sluice_provider_health")
        .map(|f| {
            f.get_metric()
                .iter()
                .map(|m| {
                    json!({
                        "provider": label(m, "provider"),
                        "route": label(m, "route"),
                        "health": health_name(m.get_gauge().value()),
                    })
                })
                .collect()
        })
        .unwrap_or_default();

    // Always an object: every tenant may be charged (before the first charge, no rows).
    let spend_today = {
        let current = series2(&families, "sluice_charge_usd_total", "tenant", "model");
        let rows: Vec<Value> = st
            .spend_today(&current)
            .into_iter()
            .map(|((tenant, model), v)| json!({"tenant": tenant, "model": model, "usd": usd(v)}))
            .collect();
        let total: f64 = rows
            .iter()
            .filter_map(|r| r.get("usd").and_then(Value::as_f64))
            .sum();
        json!({
            "metric": "sluice_charge_usd_total",
            "since": (now / 86_400.0).floor() * 86_400.0,
            "total_usd": usd(total),
            "rows": rows,
        })
    };

    let budgets = family(&families, "sluice_budget_remaining_usd").map(|f| {
        f.get_metric()
            .iter()
            .map(|m| {
                json!({
                    "tenant": label(m, "tenant"),
                    "window": label(m, "window"),
                    "remaining_usd": usd(m.get_gauge().value()),
                })
            })
            .collect::<Vec<_>>()
    });

    let body = json!({
        "now": now.round(),
        "sample_interval_s": SAMPLE_INTERVAL.as_secs(),
        "requests": {
            "total": live.requests,
            "per_s": per_s(live.requests, base.requests),
            "by_status": by_label(&families, "sluice_requests_total", "status"),
        },
        "active_streams": active_streams(),
        "providers": providers,
        "fallbacks": {
            "total": live.fallbacks,
            "per_min": per_s(live.fallbacks, base.fallbacks) * 60.0,
        },
        "rejections": {
            "total": live.rejections,
            "by_reason": by_label(&families, "sluice_rejected_total", "reason"),
        },
        "ttft": {
            "window_s": span.round(),
            "history_s": SAMPLE_INTERVAL.as_secs() * RING_LEN as u64,
            "p50_ms": ms(quantile(0.5, &live.ttft, &base.ttft)),
            "p99_ms": ms(quantile(0.99, &live.ttft, &base.ttft)),
            "series": series,
        },
        "spend_today": spend_today,
        "budgets": budgets,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{quantile, Sample, State, RING_LEN};
    use std::collections::BTreeMap;

    fn spend(rows: &[(&str, f64)]) -> BTreeMap<(String, String), f64> {
        rows.iter()
            .map(|(t, v)| ((t.to_string(), "m".to_string()), *v))
            .collect()
    }

    fn at(t: f64) -> Sample {
        Sample {
            at: t,
            ..Sample::default()
        }
    }

    #[test]
    fn spend_today_restarts_at_utc_midnight_and_the_ring_stays_bounded() {
        let day = 20_000.0 * 86_400.0;
        let mut st = State {
            day: i64::MIN,
            ..State::default()
        };
        // Started in the afternoon: everything charged since start is today's.
        st.record(at(day + 50_000.0), Some(spend(&[("a", 2.0)])));
        assert_eq!(st.spend_today(&spend(&[("a", 3.0)]))[0].1, 3.0);
        // Last sample before midnight, then the first of the next day.
        st.record(at(day + 86_399.0), Some(spend(&[("a", 5.0)])));
        st.record(at(day + 86_404.0), Some(spend(&[("a", 5.5), ("b", 1.0)])));
        let today = st.spend_today(&spend(&[("a", 6.0), ("b", 1.0)]));
        assert_eq!(today.len(), 2);
        assert!((today[0].1 - 1.0).abs() < 1e-9, "{today:?}");
        assert_eq!(today[1].1, 1.0, "a tenant first seen today counts whole");
        // Same day: the baseline stays.
        st.record(at(day + 90_000.0), Some(spend(&[("a", 7.0)])));
        assert!((st.spend_today(&spend(&[("a", 7.0)]))[0].1 - 2.0).abs() < 1e-9);
        for i in 0..(RING_LEN * 2) {
            st.record(at(day + 90_000.0 + i as f64), None);
        }
        assert_eq!(st.ring.len(), RING_LEN);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_of_the_delta() {
        // Older: 10 fast observations. Newer: 10 more, all between 0.1 and 0.2.
        let older = [(0.1, 10.0), (0.2, 10.0), (0.4, 10.0), (f64::INFINITY, 10.0)];
        let newer = [(0.1, 10.0), (0.2, 20.0), (0.4, 20.0), (f64::INFINITY, 20.0)];
        let p50 = quantile(0.5, &newer, &older).unwrap();
        assert!((p50 - 0.15).abs() < 1e-9, "{p50}");
        let p99 = quantile(0.99, &newer, &older).unwrap();
        assert!((p99 - 0.199).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(0.5, &older, &older), None);
        // Everything in +Inf: the highest finite bound.
        let inf = [(0.1, 0.0), (f64::INFINITY, 3.0)];
        assert_eq!(quantile(0.5, &inf, &[]), Some(0.1));
    }
}
