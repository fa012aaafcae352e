//! Owns the metric children the request path records into, resolved once per label set and
//! then reused (a per-request `with_label_values` hashes every label string and takes the
//! family's lock; a cached child is one map lookup for the whole group, then plain atomic
//! increments), and the cardinality cap on the families labelled by `tenant`.
//!
//! - [`route`]: per (standard model, provider) the request's own series
//!   (`sluice_requests_total`, `sluice_request_duration_seconds`, `sluice_ttft_seconds`,
//!   `sluice_gateway_overhead_seconds`). Both labels are configured ids (or `none`), so the
//!   map is bounded by the config's models × providers; each child is created on its first
//!   observation, as before.
//! - [`metering`]: per (tenant, model) the five `sluice_tokens_total` kinds,
//!   `sluice_cost_usd_total` and `sluice_charge_usd_total`, created together on the pair's
//!   first metering.
//! - [`active_streams`]: the `sluice_active_streams{tenant}` gauge.
//! - [`count_attempt_ok`]: `sluice_upstream_attempts_total{provider,outcome="ok"}` per
//!   provider; [`count_fallback`]: `sluice_fallback_total` (looked up per step, rare).
//!
//! **Cap.** The tenant-labelled groups hold at most `server.metrics_max_series_per_family`
//! label sets each ([`set_max_series_per_family`], default
//! [`DEFAULT_MAX_SERIES_PER_FAMILY`]): a (tenant, model) pair counts once in
//! `sluice_tokens_total`, `sluice_cost_usd_total` and `sluice_charge_usd_total` (its five token
//! kinds together), a tenant once in `sluice_active_streams`. A new label set past the cap is
//! recorded under [`OVERFLOW`] in every capped label (`tenant="__overflow__"`, and
//! `model="__overflow__"` for the pairs), so totals stay right while the series count stays
//! bounded; each such recording counts in `sluice_metric_overflow_total{family}`, and the
//! first of each group is logged at WARN. Series already created stay (a lowered cap applies to
//! new label sets only).
//!
//! The status page's totals ([`requests_seen`], [`fallbacks_seen`], [`ttft_all`],
//! [`charges_seen`]) are kept here too, next to where the metrics are recorded, so that the
//! page's sampler reads a few atomics instead of the whole registry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use prometheus::{Counter, Histogram, IntCounter, IntGauge};

use super::{metrics, GATEWAY_STATUSES};

/// The label value that stands for every label set past the cap.
pub const OVERFLOW: &str = "__overflow__";

/// Default of `server.metrics_max_series_per_family`.
pub const DEFAULT_MAX_SERIES_PER_FAMILY: usize = 10_000;

static MAX_SERIES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_SERIES_PER_FAMILY);

/// Sets the cap (`server.metrics_max_series_per_family`); at start and after every reload.
pub fn set_max_series_per_family(max: usize) {
    MAX_SERIES.store(max, Ordering::Relaxed);
}

/// Entries by first label value, then second label value.
type Map<V> = HashMap<Box<str>, HashMap<Box<str>, Arc<V>>>;

/// Label sets keyed by two label values, each resolved once. `capped` maps bound their size
/// by [`MAX_SERIES`] (past it: the [`OVERFLOW`] entry).
struct Resolved<V> {
    map: RwLock<Map<V>>,
    len: AtomicUsize,
    /// `None`: bounded by the config, never capped; else the families the overflow counts in.
    capped: Option<&'static [&'static str]>,
    warned: AtomicBool,
}

impl<V> Resolved<V> {
    fn new(capped: Option<&'static [&'static str]>) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            len: AtomicUsize::new(0),
            capped,
            warned: AtomicBool::new(false),
        }
    }

    fn find(map: &Map<V>, a: &str, b: &str) -> Option<Arc<V>> {
        map.get(a).and_then(|m| m.get(b)).cloned()
    }

    /// The entry of (`a`, `b`), made by `make` on first use (or the overflow entry past the
    /// cap: `(OVERFLOW, OVERFLOW)`, or `(OVERFLOW, "")` for single-label keys).
    fn get(&self, a: &str, b: &str, make: impl Fn(&str, &str) -> V) -> Arc<V> {
        let full = |this: &Self| {
            this.capped.is_some()
                && this.len.load(Ordering::Relaxed) >= MAX_SERIES.load(Ordering::Relaxed)
        };
        let overflow_b = if b.is_empty() { "" } else { OVERFLOW };
        let mut counted = false;
        {
            let map = self
                .map
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(v) = Self::find(&map, a, b) {
                return v;
            }
            if full(self) {
                self.overflowed();
                counted = true;
                if let Some(v) = Self::find(&map, OVERFLOW, overflow_b) {
                    return v;
                }
            }
        }
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(v) = Self::find(&map, a, b) {
            return v;
        }
        let (a, b) = if full(self) {
            if !counted {
                self.overflowed();
            }
            if let Some(v) = Self::find(&map, OVERFLOW, overflow_b) {
                return v;
            }
            (OVERFLOW, overflow_b)
        } else {
            (a, b)
        };
        let v = Arc::new(make(a, b));
        map.entry(a.into()).or_default().insert(b.into(), v.clone());
        if a != OVERFLOW {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        v
    }

    /// Counts one recording past the cap in `sluice_metric_overflow_total` (and logs the
    /// first).
    fn overflowed(&self) {
        let Some(families) = self.capped else { return };
        for family in families {
            metrics()
                .metric_overflow_total
                .with_label_values(&[family])
                .inc();
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                target: "sluice::metrics",
                "server.metrics_max_series_per_family ({}) reached in {}: new label sets are recorded under \"{OVERFLOW}\" (counted in sluice_metric_overflow_total)",
                MAX_SERIES.load(Ordering::Relaxed),
                families.join(", ")
            );
        }
    }

    /// Calls `f` with every entry.
    fn for_each(&self, mut f: impl FnMut(&str, &str, &V)) {
        let map = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (a, m) in map.iter() {
            for (b, v) in m {
                f(a, b, v);
            }
        }
    }
}

/// The series of requests of one standard model answered by one provider, each child
/// resolved on its first observation.
#[derive(Default)]
pub struct RouteSeries {
    model: Box<str>,
    provider: Box<str>,
    /// `sluice_requests_total{model,status}` per [`GATEWAY_STATUSES`] entry.
    requests: [OnceLock<IntCounter>; GATEWAY_STATUSES.len()],
    /// `sluice_request_duration_seconds{model,provider,stream}`: `false`, `true`.
    duration: [OnceLock<Histogram>; 2],
    ttft: OnceLock<Histogram>,
    overhead: OnceLock<Histogram>,
}

impl RouteSeries {
    /// Counts a finished request with final HTTP `status` (`sluice_requests_total{model,status}`;
    /// `provider` plays no part).
    pub fn count_request(&self, status: u16) {
        let mut buf = itoa::Buffer::new();
        let label = buf.format(status);
        match GATEWAY_STATUSES.iter().position(|s| *s == label) {
            Some(i) => self.requests[i]
                .get_or_init(|| {
                    metrics()
                        .requests_total
                        .with_label_values(&[&self.model, label])
                })
                .inc(),
            None => metrics()
                .requests_total
                .with_label_values(&[&self.model, label])
                .inc(),
        }
        REQUESTS.fetch_add(1, Ordering::Relaxed);
    }

    /// Observes a request's duration, seconds.
    pub fn observe_duration(&self, stream: bool, seconds: f64) {
        self.duration[usize::from(stream)]
            .get_or_init(|| {
                metrics().request_duration_seconds.with_label_values(&[
                    &*self.model,
                    &*self.provider,
                    if stream { "true" } else { "false" },
                ])
            })
            .observe(seconds);
    }

    /// Observes a TTFT, seconds (also in the status page's all-routes histogram).
    pub fn observe_ttft(&self, seconds: f64) {
        self.ttft
            .get_or_init(|| {
                metrics()
                    .ttft_seconds
                    .with_label_values(&[&self.model, &self.provider])
            })
            .observe(seconds);
        metrics().ttft_all.observe(seconds);
    }

    /// Observes the gateway's own overhead, seconds.
    pub fn observe_overhead(&self, seconds: f64) {
        self.overhead
            .get_or_init(|| {
                metrics()
                    .gateway_overhead_seconds
                    .with_label_values(&[&self.model, &self.provider])
            })
            .observe(seconds);
    }
}

static ROUTES: LazyLock<Resolved<RouteSeries>> = LazyLock::new(|| Resolved::new(None));

/// The request series of standard model `model` (a configured id or `none`) and `provider`
/// (a configured id or `none`).
pub fn route(model: &str, provider: &str) -> Arc<RouteSeries> {
    ROUTES.get(model, provider, |m, p| RouteSeries {
        model: m.into(),
        provider: p.into(),
        ..RouteSeries::default()
    })
}

/// The metering series of one (tenant, model) pair.
pub struct MeteringSeries {
    /// `sluice_tokens_total{tenant,model,kind}` in [`super::TOKEN_KINDS`] order.
    pub tokens: [IntCounter; 5],
    /// `sluice_cost_usd_total{tenant,model}`.
    pub cost_usd: Counter,
    /// `sluice_charge_usd_total{tenant,model}`.
    pub charge_usd: Counter,
}

/// The families one metering pair counts in (and its overflow).
const METERING_FAMILIES: &[&str] = &[
    "sluice_tokens_total",
    "sluice_cost_usd_total",
    "sluice_charge_usd_total",
];

static METERING: LazyLock<Resolved<MeteringSeries>> =
    LazyLock::new(|| Resolved::new(Some(METERING_FAMILIES)));

/// The metering series of `tenant` × `model`, created at 0 on the pair's first use (or the
/// overflow pair past the cap).
pub fn metering(tenant: &str, model: &str) -> Arc<MeteringSeries> {
    METERING.get(tenant, model, |t, m| {
        let mx = metrics();
        MeteringSeries {
            tokens: super::TOKEN_KINDS.map(|kind| mx.tokens_total.with_label_values(&[t, m, kind])),
            cost_usd: mx.cost_usd_total.with_label_values(&[t, m]),
            charge_usd: mx.charge_usd_total.with_label_values(&[t, m]),
        }
    })
}

/// Adds `usd` to a pair's charge (`sluice_charge_usd_total`) and tells the status page.
pub fn add_charge(series: &MeteringSeries, usd: f64) {
    series.charge_usd.inc_by(usd);
    CHARGES.fetch_add(1, Ordering::Relaxed);
}

/// Calls `f(tenant, model, charged_usd)` for every metering pair recorded so far.
pub fn for_each_charge(mut f: impl FnMut(&str, &str, f64)) {
    METERING.for_each(|t, m, s| f(t, m, s.charge_usd.get()));
}

static ACTIVE: LazyLock<Resolved<IntGauge>> =
    LazyLock::new(|| Resolved::new(Some(&["sluice_active_streams"])));

/// The `sluice_active_streams{tenant}` gauge of `tenant` (the overflow tenant's past the cap).
pub fn active_streams(tenant: &str) -> Arc<IntGauge> {
    ACTIVE.get(tenant, "", |t, _| {
        metrics().active_streams.with_label_values(&[t])
    })
}

/// Calls `f(tenant, streams)` for every tenant that had a stream.
pub fn for_each_active(mut f: impl FnMut(&str, i64)) {
    ACTIVE.for_each(|t, _, g| f(t, g.get()));
}

static ATTEMPTS_OK: LazyLock<Resolved<IntCounter>> = LazyLock::new(|| Resolved::new(None));

/// Counts an attempt that answered (`sluice_upstream_attempts_total{provider,outcome="ok"}`),
/// `provider` a configured provider id.
pub fn count_attempt_ok(provider: &str) {
    ATTEMPTS_OK
        .get(provider, "", |p, _| {
            metrics()
                .upstream_attempts_total
                .with_label_values(&[p, "ok"])
        })
        .inc();
}

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
static CHARGES: AtomicU64 = AtomicU64::new(0);

/// `sum(sluice_requests_total)`: requests counted since start.
pub fn requests_seen() -> u64 {
    REQUESTS.load(Ordering::Relaxed)
}

/// Counts one fallback step (`sluice_fallback_total{model,from_provider,to_provider,reason}`).
pub fn count_fallback(labels: &[&str; 4]) {
    metrics().fallback_total.with_label_values(labels).inc();
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
}

/// `sum(sluice_fallback_total)`: fallback steps since start.
pub fn fallbacks_seen() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

/// Charges recorded since start (a change tells the status page to re-read spend).
pub fn charges_seen() -> u64 {
    CHARGES.load(Ordering::Relaxed)
}

/// The all-routes TTFT histogram (status page; not exported).
pub fn ttft_all() -> &'static Histogram {
    &metrics().ttft_all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_past_the_cap_go_to_the_overflow_series_and_are_counted() {
        let r: Resolved<u32> = Resolved::new(Some(&["sluice_test_family_total"]));
        let max = MAX_SERIES.load(Ordering::Relaxed);
        let made = std::sync::atomic::AtomicU32::new(0);
        let make = |_: &str, _: &str| made.fetch_add(1, Ordering::Relaxed);
        for i in 0..max {
            r.get(&format!("t{i}"), "m", make);
        }
        let overflow_before = metrics()
            .metric_overflow_total
            .with_label_values(&["sluice_test_family_total"])
            .get();
        let a = r.get("late-1", "m", make);
        let b = r.get("late-2", "m2", make);
        assert!(
            Arc::ptr_eq(&a, &b),
            "both past the cap share the overflow entry"
        );
        assert_eq!(made.load(Ordering::Relaxed) as usize, max + 1);
        // Known pairs keep their own entry.
        let t0 = r.get("t0", "m", make);
        assert_eq!(*t0, 0);
        let mut keys = Vec::new();
        r.for_each(|a, b, _| keys.push((a.to_string(), b.to_string())));
        assert!(keys.contains(&(OVERFLOW.to_string(), OVERFLOW.to_string())));
        assert_eq!(keys.len(), max + 1);
        assert_eq!(
            metrics()
                .metric_overflow_total
                .with_label_values(&["sluice_test_family_total"])
                .get(),
            overflow_before + 2
        );
    }
}
