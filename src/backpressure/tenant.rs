//! Owns the per-process tenant limits: which limit scopes apply to a request (the tenant, and
//! the tenant × standard model when `tenants.<id>.model_limits` names the model), exact
//! in-flight counters for `max_concurrent_streams`, and the request and token windows of
//! `requests_per_minute` / `tokens_per_minute`, estimated with pingora-limits
//! [`Rate`] (<https://blog.cloudflare.com/counting-things-a-lot-of-different-things/>).
//!
//! - **Concurrency** uses one exact `AtomicU32` per scope rather than pingora-limits
//!   `Inflight`: `Inflight` is a count-min sketch that can over-count when keys collide, while
//!   the scope set here is small and known from the config, so exact counters cost the same
//!   and never reject a tenant for another tenant's traffic.
//! - **Rates** use one `Rate` for requests and one for tokens, keyed per scope; the count in the sliding window is the proportional
//!   interpolation of the previous and current fixed windows (`rate_with` +
//!   [`PROPORTIONAL_RATE_ESTIMATE_CALC_FN`]). A check observes first and refunds when over the
//!   limit, so concurrent checks can only over-reject, never over-admit. `Rate` is a
//!   count-min sketch (4 × 1024 counters): a collision makes a count too high, and the
//!   negative corrections of token settlement can make a colliding key's count slightly low.
//! - Token corrections (the real `usage` at the end of a request minus the estimate charged at
//!   admission) land in the window current at settlement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora_limits::rate::{Rate, RateComponents, PROPORTIONAL_RATE_ESTIMATE_CALC_FN};
use tokio::time::Instant;

use super::status::{LimitState, RateLimitStatus};
use crate::config::Config;

/// Whether a `tokens_per_minute` limit applies to `tenant` (its own, or its
/// `model_limits` entry for `model`) under `config`: only then does admission charge a
/// request's input estimate (the proxy computes the estimate only for such tenants).
pub fn counts_tokens(config: &Config, tenant: &str, model: Option<&str>) -> bool {
    config.tenants.get(tenant).is_some_and(|t| {
        t.limits.tokens_per_minute.is_some()
            || model
                .and_then(|m| t.limits.model_limits.get(m))
                .is_some_and(|ml| ml.tokens_per_minute.is_some())
    })
}

/// The limits of one scope, as configured (`None`: no such limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `max_concurrent_streams`.
    pub concurrency: Option<u32>,
    /// `requests_per_minute` (per window).
    pub requests: Option<u64>,
    /// `tokens_per_minute` (per window).
    pub tokens: Option<u64>,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.concurrency.is_some() || self.has_rates()
    }

    /// Whether a request or token limit is set.
    pub fn has_rates(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some()
    }
}

/// Which limit a request hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `max_concurrent_streams`.
    Concurrency,
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
}

impl LimitKind {
    /// The `sluice_rejected_total{reason}` label and error `code`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Concurrency => "tenant_concurrency",
            Self::Requests => "tenant_rpm",
            Self::Tokens => "tenant_tpm",
        }
    }
}

/// Process-wide state of one limit scope (tenant, or tenant × model).
#[derive(Debug)]
pub struct ScopeState {
    /// Tenant id.
    pub tenant: Box<str>,
    /// Standard model id for a tenant × model scope.
    pub model: Option<Box<str>>,
    /// Redis key of the scope's sliding-window log (a sorted set).
    pub redis_log_key: String,
    /// Redis key of the scope's token sum.
    pub redis_sum_key: String,
    /// The scope's key in the `Rate` sketches (random per scope: a `u64` hashes faster than
    /// the ids).
    rate_key: u64,
    /// Requests of this scope in flight in this process (admitted or queued).
    inflight: AtomicU32,
    /// The last status Redis reported for this scope, and when (for responses that are not
    /// checked against Redis themselves, e.g. `/v1/models`).
    remote: Mutex<Option<(Instant, RateLimitStatus)>>,
}

impl ScopeState {
    fn new(tenant: &str, model: Option<&str>) -> Self {
        let base = match model {
            Some(m) => format!("sluice:rl:{{{tenant}}}:m:{m}"),
            None => format!("sluice:rl:{{{tenant}}}"),
        };
        Self {
            tenant: tenant.into(),
            model: model.map(Into::into),
            redis_sum_key: format!("{base}:tokens"),
            redis_log_key: base,
            rate_key: fastrand::u64(..),
            inflight: AtomicU32::new(0),
            remote: Mutex::new(None),
        }
    }

    /// Requests of this scope in flight in this process.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }

    /// Remembers what Redis said about this scope.
    pub fn set_remote(&self, status: RateLimitStatus) {
        if let Ok(mut g) = self.remote.lock() {
            *g = Some((Instant::now(), status));
        }
    }

    /// What Redis last said, aged to now; `None` if it never answered for this scope.
    pub fn remote(&self) -> Option<RateLimitStatus> {
        let g = self.remote.lock().ok()?;
        g.as_ref().map(|(at, s)| s.aged(at.elapsed()))
    }
}

/// A tenant's scope and its lazily created tenant × model scopes.
#[derive(Debug)]
struct TenantStates {
    tenant: Arc<ScopeState>,
    models: ArcSwap<HashMap<Box<str>, Arc<ScopeState>>>,
}

/// One scope that applies to a request, with its configured limits.
#[derive(Debug, Clone)]
pub struct PlanItem {
    /// The scope's process-wide state.
    pub state: Arc<ScopeState>,
    /// Its limits (from the request's config snapshot).
    pub limits: Limits,
}

/// The scopes (at most two) that apply to one request; only scopes with a limit are kept.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Tenant-wide limits.
    pub tenant: Option<PlanItem>,
    /// Tenant × standard model limits.
    pub model: Option<PlanItem>,
}

impl Plan {
    /// The scopes, tenant first.
    pub fn items(&self) -> impl Iterator<Item = &PlanItem> {
        self.tenant.iter().chain(self.model.iter())
    }

    /// Whether any scope has a request or token limit.
    pub fn has_rates(&self) -> bool {
        self.items().any(|i| i.limits.has_rates())
    }

    /// Whether no limit applies at all.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_none() && self.model.is_none()
    }
}

/// The request and token windows (one pair per window length; replaced when a reload changes
/// `server.rate_limit_window_ms`).
pub struct Windows {
    /// Window length.
    pub length: Duration,
    requests: Rate,
    tokens: Rate,
}

impl std::fmt::Debug for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Windows")
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

/// A local verdict that refused a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refusal {
    /// Which limit.
    pub kind: LimitKind,
    /// The limit enforced (after the fail-open share).
    pub limit: u64,
    /// Used in the window (without this request).
    pub used: u64,
    /// What this request asked for (1 request, or its estimated tokens).
    pub requested: u64,
    /// When to come back.
    pub retry_after: Duration,
    /// Whether the scope is the tenant × model one.
    pub model_scope: bool,
}

/// Decrements a scope's in-flight count on drop.
#[derive(Debug)]
pub struct InflightGuard(Arc<ScopeState>);

/// The concurrency slots a request holds (tenant, tenant × model); released on drop.
#[derive(Debug, Default)]
pub struct Inflight {
    _tenant: Option<InflightGuard>,
    _model: Option<InflightGuard>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes one slot of `item`'s scope if it has `max_concurrent_streams`.
fn acquire_one(item: Option<&PlanItem>) -> Result<Option<InflightGuard>, Refusal> {
    let Some((item, limit)) = item.and_then(|i| Some((i, i.limits.concurrency?))) else {
        return Ok(None);
    };
    let before = item.state.inflight.fetch_add(1, Ordering::AcqRel);
    let guard = InflightGuard(item.state.clone());
    if before >= limit {
        return Err(Refusal {
            kind: LimitKind::Concurrency,
            limit: u64::from(limit),
            used: u64::from(before),
            requested: 1,
            retry_after: Duration::from_secs(1),
            model_scope: item.state.model.is_some(),
        });
    }
    Ok(Some(guard))
}

/// `limit / share`, rounded up (the fail-open share of one replica).
pub fn share_of(limit: u64, share: u32) -> u64 {
    limit.div_ceil(u64::from(share.max(1)))
}

/// The per-process limiter.
#[derive(Debug)]
pub struct LocalLimiter {
    windows: ArcSwap<Windows>,
    tenants: ArcSwap<HashMap<Box<str>, Arc<TenantStates>>>,
}

impl LocalLimiter {
    /// A limiter counting over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            windows: ArcSwap::from_pointee(new_windows(window)),
            tenants: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    /// Applies a reloaded window length (a change starts empty windows).
    pub fn set_window(&self, window: Duration) {
        if self.windows.load().length != window {
            self.windows.store(Arc::new(new_windows(window)));
        }
    }

    /// The current windows (pin them for a request: its settlement must use the same ones).
    pub fn windows(&self) -> Arc<Windows> {
        self.windows.load_full()
    }

    /// The scopes that apply to `tenant` (× `model`) under `config`, with their limits.
    pub fn plan(&self, config: &Config, tenant: &str, model: Option<&str>) -> Plan {
        let Some(t) = config.tenants.get(tenant) else {
            return Plan::default();
        };
        let l = &t.limits;
        let tenant_limits = Limits {
            concurrency: l.max_concurrent_streams,
            requests: l.requests_per_minute.map(u64::from),
            tokens: l.tokens_per_minute,
        };
        let model_limits = model.and_then(|m| l.model_limits.get(m)).map(|ml| Limits {
            concurrency: ml.max_concurrent_streams,
            requests: ml.requests_per_minute.map(u64::from),
            tokens: ml.tokens_per_minute,
        });
        if !tenant_limits.any() && !model_limits.is_some_and(|m| m.any()) {
            return Plan::default();
        }
        let states = self.tenant_states(tenant);
        Plan {
            tenant: tenant_limits.any().then(|| PlanItem {
                state: states.tenant.clone(),
                limits: tenant_limits,
            }),
            model: match (model, model_limits) {
                (Some(m), Some(limits)) if limits.any() => Some(PlanItem {
                    state: model_state(&states, tenant, m),
                    limits,
                }),
                _ => None,
            },
        }
    }

    fn tenant_states(&self, tenant: &str) -> Arc<TenantStates> {
        if let Some(s) = self.tenants.load().get(tenant) {
            return s.clone();
        }
        let fresh = Arc::new(TenantStates {
            tenant: Arc::new(ScopeState::new(tenant, None)),
            models: ArcSwap::from_pointee(HashMap::new()),
        });
        let mut out = fresh.clone();
        self.tenants.rcu(|m| {
            let mut m = HashMap::clone(m);
            out = m
                .entry(tenant.into())
                .or_insert_with(|| fresh.clone())
                .clone();
            m
        });
        out
    }

    /// Takes a concurrency slot in every scope with `max_concurrent_streams`.
    ///
    /// # Errors
    /// The [`Refusal`] of the first full scope (nothing is held then).
    pub fn acquire_concurrency(&self, plan: &Plan) -> Result<Inflight, Refusal> {
        self.acquire_concurrency_holding(plan, None)
    }

    /// Takes the tenant-wide slot alone (none when the tenant has no
    /// `max_concurrent_streams`), for a request whose model is not known yet.
    ///
    /// # Errors
    /// The [`Refusal`] when the tenant is at its limit (nothing is held then).
    pub fn acquire_tenant_concurrency(
        &self,
        plan: &Plan,
    ) -> Result<Option<InflightGuard>, Refusal> {
        acquire_one(plan.tenant.as_ref())
    }

    /// [`Self::acquire_concurrency`], keeping `held_tenant` (from
    /// [`Self::acquire_tenant_concurrency`] on the same tenant) as the tenant-wide slot
    /// instead of taking another.
    ///
    /// # Errors
    /// The [`Refusal`] of the first full scope (the held slot is released then).
    pub fn acquire_concurrency_holding(
        &self,
        plan: &Plan,
        held_tenant: Option<InflightGuard>,
    ) -> Result<Inflight, Refusal> {
        let tenant = match held_tenant {
            Some(g) => Some(g),
            None => acquire_one(plan.tenant.as_ref())?,
        };
        let model = acquire_one(plan.model.as_ref())?;
        Ok(Inflight {
            _tenant: tenant,
            _model: model,
        })
    }
}

impl Windows {
    /// Moves the windows on when one has ended. pingora's `Rate` only turns its windows over
    /// when it is used, and then starts the new one at that moment, so after an idle spell
    /// the old count would weigh as if it had just ended; calling this every
    /// [`Windows::tick_interval`] keeps window boundaries on time.
    pub fn tick(&self) {
        let _ = self.requests.rate(&0u64);
        let _ = self.tokens.rate(&0u64);
    }

    /// How often to [`Windows::tick`]: a fiftieth of the window, 10..=250 ms.
    pub fn tick_interval(&self) -> Duration {
        (self.length / 50).clamp(Duration::from_millis(10), Duration::from_millis(250))
    }

    /// Checks and charges one request and `cost` estimated tokens against every scope's
    /// request and token limits, each divided by `share` (1, or `redis.replicas` while
    /// failing open). On refusal nothing stays charged.
    ///
    /// # Errors
    /// The [`Refusal`] of the first limit exceeded, with the status to report.
    pub fn check(
        &self,
        plan: &Plan,
        cost: u64,
        share: u32,
    ) -> Result<RateLimitStatus, (Refusal, RateLimitStatus)> {
        self.charge(plan, cost, 1);
        // One read per limit serves both the verdict and the status to report.
        let mut status = RateLimitStatus::default();
        let mut refusal = None;
        'scopes: for item in plan.items() {
            let key = item.state.rate_key;
            let mut one = RateLimitStatus::default();
            for (kind, rate, limit, requested) in [
                (LimitKind::Requests, &self.requests, item.limits.requests, 1),
                (LimitKind::Tokens, &self.tokens, item.limits.tokens, cost),
            ] {
                let Some(limit) = limit.map(|l| share_of(l, share)) else {
                    continue;
                };
                let c = components(rate, &key);
                if exceeds(estimate(&c), limit) {
                    refusal = Some((item, kind, limit, requested));
                    break 'scopes;
                }
                let state = Some(limit_state(limit, &c));
                match kind {
                    LimitKind::Tokens => one.tokens = state,
                    _ => one.requests = state,
                }
            }
            status.merge(one);
        }
        let Some((item, kind, limit, requested)) = refusal else {
            return Ok(status);
        };
        self.charge(plan, cost, -1);
        let rate = match kind {
            LimitKind::Tokens => &self.tokens,
            _ => &self.requests,
        };
        let c = components(rate, &item.state.rate_key);
        let refusal = Refusal {
            kind,
            limit,
            used: (estimate(&c) - 1e-6).ceil().max(0.0) as u64,
            requested,
            retry_after: retry_after(&c, limit, requested),
            model_scope: item.state.model.is_some(),
        };
        Err((refusal, self.status(plan, share)))
    }

    /// Adds (`sign` 1) or removes (`sign` -1) one request and `cost` tokens in every scope
    /// with such a limit, without checking (used after Redis admitted a request, so the local
    /// view stays warm for fail-open, and to refund).
    pub fn charge(&self, plan: &Plan, cost: u64, sign: isize) {
        let cost = isize::try_from(cost).unwrap_or(isize::MAX);
        for item in plan.items() {
            let key = item.state.rate_key;
            if item.limits.requests.is_some() {
                self.requests.observe(&key, sign);
            }
            if item.limits.tokens.is_some() && cost != 0 {
                self.tokens.observe(&key, sign.saturating_mul(cost));
            }
        }
    }

    /// Corrects the token charge by `delta` (real usage minus the estimate).
    pub fn adjust_tokens(&self, plan: &Plan, delta: i64) {
        if delta == 0 {
            return;
        }
        let delta =
            isize::try_from(delta).unwrap_or(if delta < 0 { isize::MIN } else { isize::MAX });
        for item in plan.items() {
            if item.limits.tokens.is_some() {
                self.tokens.observe(&item.state.rate_key, delta);
            }
        }
    }

    /// The binding request and token status over `plan`, without charging anything.
    pub fn status(&self, plan: &Plan, share: u32) -> RateLimitStatus {
        let mut out = RateLimitStatus::default();
        for item in plan.items() {
            let key = item.state.rate_key;
            let one = |rate: &Rate, limit: Option<u64>| {
                limit.map(|l| {
                    let limit = share_of(l, share);
                    limit_state(limit, &components(rate, &key))
                })
            };
            out.merge(RateLimitStatus {
                requests: one(&self.requests, item.limits.requests),
                tokens: one(&self.tokens, item.limits.tokens),
            });
        }
        out
    }
}

/// What to report for one limit from its window counts.
fn limit_state(limit: u64, c: &Counts) -> LimitState {
    LimitState {
        limit,
        remaining: (limit as f64 - estimate(c) + 1e-6).floor().max(0.0) as u64,
        reset: reset_after(c),
    }
}

fn new_windows(length: Duration) -> Windows {
    Windows {
        length,
        requests: Rate::new(length),
        tokens: Rate::new(length),
    }
}

fn model_state(states: &TenantStates, tenant: &str, model: &str) -> Arc<ScopeState> {
    if let Some(s) = states.models.load().get(model) {
        return s.clone();
    }
    let fresh = Arc::new(ScopeState::new(tenant, Some(model)));
    let mut out = fresh.clone();
    states.models.rcu(|m| {
        let mut m = HashMap::clone(m);
        out = m
            .entry(model.into())
            .or_insert_with(|| fresh.clone())
            .clone();
        m
    });
    out
}

/// The previous and current fixed-window counts of one key, and how far into the current
/// window we are (plain numbers taken from pingora's `RateComponents`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    prev: f64,
    curr: f64,
    /// Elapsed fraction of the current window, 0..1.
    fraction: f64,
    /// Window length, seconds.
    window: f64,
    /// The sliding-window count: pingora's [`PROPORTIONAL_RATE_ESTIMATE_CALC_FN`] (previous
    /// count × its share still inside the window + current count, per second) × the window.
    sliding: f64,
}

fn components(rate: &Rate, key: &u64) -> Counts {
    rate.rate_with(key, |c: RateComponents| Counts {
        prev: c.prev_samples as f64,
        curr: c.curr_samples as f64,
        fraction: c.current_interval_fraction,
        window: c.interval.as_secs_f64(),
        sliding: PROPORTIONAL_RATE_ESTIMATE_CALC_FN(c) * c.interval.as_secs_f64(),
    })
}

/// The sliding-window count (never negative).
fn estimate(c: &Counts) -> f64 {
    c.sliding.max(0.0)
}

/// Whether a sliding count is over `limit` (the ×/÷ window of the estimate may add float
/// noise to a whole count; noise does not count).
fn exceeds(count: f64, limit: u64) -> bool {
    count > limit as f64 + 1e-6
}

/// How long until `need` more fits under `limit`, assuming no other traffic meanwhile.
fn retry_after(c: &Counts, limit: u64, need: u64) -> Duration {
    let w = c.window;
    let (prev, curr) = (c.prev.max(0.0), c.curr.max(0.0));
    let (limit, need, f) = (limit as f64, need as f64, c.fraction);
    let secs = if need > limit {
        // Never fits; say "a window".
        w
    } else if curr + need <= limit {
        // The previous window's share decays enough within this window.
        if prev <= 0.0 {
            0.0
        } else {
            let target = 1.0 - (limit - curr - need) / prev;
            ((target - f) * w).max(0.0)
        }
    } else {
        // Wait for this window to become the previous one and decay.
        let g = if curr <= 0.0 {
            0.0
        } else {
            (1.0 - (limit - need) / curr).max(0.0)
        };
        (1.0 - f) * w + g * w
    };
    Duration::from_secs_f64(secs.clamp(0.001, 2.0 * w))
}

/// How long until the window count is back to zero, assuming no other traffic.
fn reset_after(c: &Counts) -> Duration {
    let rest = (1.0 - c.fraction) * c.window;
    let secs = if c.curr > 0.0 {
        rest + c.window
    } else if c.prev > 0.0 {
        rest
    } else {
        0.0
    };
    Duration::from_secs_f64(secs.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml_tenants: &str) -> Config {
        let yaml = format!(
            "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\ntenants:\n{yaml_tenants}\nvirtual_keys:\n  - key: sk-test-0001\n    tenant: t\nproviders:\n  p:\n    kind: demo\nmodels:\n  m/a:\n    routes:\n      - provider: p\n        upstream_model: a\n  m/b:\n    routes:\n      - provider: p\n        upstream_model: b\n"
        );
        Config::parse(std::path::Path::new("sluice.yaml"), &yaml).unwrap()
    }

    #[test]
    fn plans_keep_only_limited_scopes() {
        let c = config("  t:\n    requests_per_minute: 5\n    model_limits:\n      m/a: {max_concurrent_streams: 1}\n  free: {}");
        let l = LocalLimiter::new(Duration::from_secs(60));
        let p = l.plan(&c, "t", Some("m/a"));
        assert!(p.tenant.is_some() && p.model.is_some());
        assert_eq!(
            p.model.as_ref().unwrap().state.redis_log_key,
            "sluice:rl:{t}:m:m/a"
        );
        let p = l.plan(&c, "t", Some("m/b"));
        assert!(p.tenant.is_some() && p.model.is_none());
        assert!(l.plan(&c, "free", Some("m/a")).is_empty());
        // States are shared between requests.
        let a = l.plan(&c, "t", None).tenant.unwrap().state;
        let b = l.plan(&c, "t", None).tenant.unwrap().state;
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn concurrency_is_exact_and_released_on_drop() {
        let c = config("  t:\n    max_concurrent_streams: 2");
        let l = LocalLimiter::new(Duration::from_secs(60));
        let p = l.plan(&c, "t", None);
        let a = l.acquire_concurrency(&p).unwrap();
        let b = l.acquire_concurrency(&p).unwrap();
        let r = l.acquire_concurrency(&p).unwrap_err();
        assert_eq!((r.kind, r.limit, r.used), (LimitKind::Concurrency, 2, 2));
        assert_eq!(p.tenant.as_ref().unwrap().state.inflight(), 2);
        drop(a);
        let _c = l.acquire_concurrency(&p).unwrap();
        drop(b);
        assert_eq!(p.tenant.as_ref().unwrap().state.inflight(), 1);
    }

    #[test]
    fn a_tenant_slot_taken_from_the_head_is_kept_not_counted_twice() {
        let c = config("  t:\n    max_concurrent_streams: 1\n    model_limits:\n      m/a: {max_concurrent_streams: 1}");
        let l = LocalLimiter::new(Duration::from_secs(60));
        let head = l.plan(&c, "t", None);
        let slot = l.acquire_tenant_concurrency(&head).unwrap();
        let tenant = head.tenant.as_ref().unwrap().state.clone();
        assert_eq!(tenant.inflight(), 1);
        // A second request's head is refused while the first holds the only slot.
        assert!(l.acquire_tenant_concurrency(&head).is_err());
        assert_eq!(tenant.inflight(), 1);
        // The body named the model: the tenant slot is kept, the model slot taken.
        let full = l.plan(&c, "t", Some("m/a"));
        let held = l.acquire_concurrency_holding(&full, slot).unwrap();
        let model = full.model.as_ref().unwrap().state.clone();
        assert_eq!((tenant.inflight(), model.inflight()), (1, 1));
        drop(held);
        assert_eq!((tenant.inflight(), model.inflight()), (0, 0));
        // Refused on the model scope: the held tenant slot is released too.
        let other = l.acquire_concurrency(&full).unwrap();
        let slot = l.acquire_tenant_concurrency(&l.plan(&c, "t", None));
        assert!(slot.is_err(), "tenant limit 1 is held by `other`");
        drop(other);
        let slot = l.acquire_tenant_concurrency(&head).unwrap();
        let _model_holder = acquire_one(full.model.as_ref()).unwrap();
        assert!(l.acquire_concurrency_holding(&full, slot).is_err());
        assert_eq!(tenant.inflight(), 0);
    }

    #[test]
    fn requests_and_tokens_are_limited_per_window_with_shares() {
        let c = config("  t:\n    requests_per_minute: 10\n    tokens_per_minute: 1000");
        let l = LocalLimiter::new(Duration::from_secs(60));
        let w = l.windows();
        let p = l.plan(&c, "t", None);
        for i in 0..5 {
            let s = w.check(&p, 10, 2).unwrap();
            assert_eq!(s.requests.unwrap().remaining, 4 - i);
            assert_eq!(s.requests.unwrap().limit, 5);
        }
        let (r, s) = w.check(&p, 10, 2).unwrap_err();
        assert_eq!((r.kind, r.limit, r.used), (LimitKind::Requests, 5, 5));
        assert_eq!(s.requests.unwrap().remaining, 0);
        assert!(r.retry_after > Duration::from_secs(50), "{r:?}");
        // The full limit applies without a share; refused checks charged nothing.
        for _ in 0..5 {
            w.check(&p, 10, 1).unwrap();
        }
        assert!(w.check(&p, 10, 1).is_err());
        // Tokens: 100 charged so far; a 901-token request does not fit, a 900 one does.
        let q = l.plan(&c, "t", Some("m/a"));
        let big = Limits {
            requests: None,
            ..q.tenant.as_ref().unwrap().limits
        };
        let q = Plan {
            tenant: Some(PlanItem {
                state: q.tenant.unwrap().state,
                limits: big,
            }),
            model: None,
        };
        let (r, _) = w.check(&q, 901, 1).unwrap_err();
        assert_eq!((r.kind, r.used, r.requested), (LimitKind::Tokens, 100, 901));
        let s = w.check(&q, 900, 1).unwrap();
        assert_eq!(s.tokens.unwrap().remaining, 0);
        // Settlement refunds an over-estimate.
        w.adjust_tokens(&q, -400);
        assert_eq!(w.status(&q, 1).tokens.unwrap().remaining, 400);
    }

    #[test]
    fn retry_after_follows_the_sliding_estimate() {
        let c = |prev: f64, curr: f64, fraction: f64| Counts {
            prev,
            curr,
            fraction,
            window: 60.0,
            sliding: prev * (1.0 - fraction) + curr,
        };
        // Current window full: wait for it to end (30 s) and half of it to decay (30 s).
        let d = retry_after(&c(0.0, 10.0, 0.5), 10, 5);
        assert!((d.as_secs_f64() - 60.0).abs() < 0.01, "{d:?}");
        // Previous window of 10, limit 10, nothing current: 1 fits after 10 % of the window.
        let d = retry_after(&c(10.0, 0.0, 0.0), 10, 1);
        assert!((d.as_secs_f64() - 6.0).abs() < 0.01, "{d:?}");
        assert_eq!(reset_after(&c(0.0, 0.0, 0.3)), Duration::ZERO);
        assert_eq!(reset_after(&c(4.0, 0.0, 0.5)), Duration::from_secs(30));
    }
}
