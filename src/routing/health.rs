//! Owns route health: per route (`provider/upstream_model`) state machine fed by passive
//! request outcomes and active probes, lock-free on the hot path.
//!
//! States: `Healthy` → (`degraded_after_failures` consecutive failures) `Degraded` →
//! (`unhealthy_after_failures`, or an error rate of `error_rate_percent` over a sliding
//! `error_rate_window_ms` once it holds `error_rate_min_requests` outcomes) `Unhealthy`.
//!
//! How a route heals:
//! - **Half-open trial.** An unhealthy route rests for its cool-down (`cooldown_ms`, or an
//!   upstream 429's `Retry-After`); a degraded one keeps serving as a late fallback, and its
//!   cool-down runs from its last failure. Once the cool-down is over, the route's next plan
//!   claims its single trial permit ([`RouteHealth::claim_trial`]) and puts it *first*, ahead
//!   of healthy routes: one real request, never two at once. The trial still falls back
//!   before the first byte when it fails, so the client risks only the time of one failed
//!   attempt. A success makes the route healthy (a streamed trial: at its first event, not
//!   at its end); a failure restarts its cool-down.
//! - **Decay.** With no failure for `decay_after_ms` (default 60 s) a route steps one state
//!   back toward healthy: unhealthy → degraded after one period, → healthy after two, each
//!   counted from its last failure (applied when a plan reads the route and by the probe
//!   service's sweep at least once a second, so the gauge follows without traffic).
//! - **Scope of the evidence.** Each failure is of the provider (a connect failure, a
//!   rejected credential, a failed provider probe: [`FailureScope::Provider`]) or of the route
//!   itself (its own answer: a 5xx, a 429, a timeout, a broken answer). A provider probe's
//!   success ([`RouteHealth::record_probe_success`]) lifts the first kind only: a `GET
//!   /models` that answers 200 says nothing about the chat route that answers 503.
//!
//! State changes are logged once each and exported as `sluice_provider_health{provider,route}`.
//!
//! The registry outlives config reloads: it is keyed by name, not by snapshot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::Duration;

use crate::config::{ErrorRate, PassiveHealth};
use crate::error::AttemptFailure;
use crate::metrics::metrics;

/// Whether an upstream status is worth another provider: the attempt loop falls back on it,
/// and the active probes call a provider down for it.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 401 | 403 | 408 | 409 | 429 | 500..=599)
}

/// What a failure says is broken: the provider as a whole, or this route of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// The provider: unreachable, or its credential rejected. A provider probe's success
    /// disproves it.
    Provider,
    /// The route's own answer (status, timeout, broken or malformed answer). Only the route's
    /// own success (a request, or a request probe) disproves it.
    Route,
}

impl FailureScope {
    /// The scope of an attempt failure: connect failures and a 401/403 (the gateway's
    /// credential, shared by every route of the provider) are the provider's; the rest the
    /// route's.
    pub fn of(failure: AttemptFailure) -> Self {
        match failure {
            AttemptFailure::Connect | AttemptFailure::Status(401 | 403) => Self::Provider,
            _ => Self::Route,
        }
    }
}

/// A route's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// Serving normally.
    Healthy = 0,
    /// Recent failures: tried after healthy routes.
    Degraded = 1,
    /// Failing: skipped until its cool-down ends, then one trial.
    Unhealthy = 2,
}

impl Health {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Healthy,
            1 => Self::Degraded,
            _ => Self::Unhealthy,
        }
    }

    /// Lower-case name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// Milliseconds since the registry's process-wide epoch (monotonic).
fn now_ms() -> u64 {
    static EPOCH: LazyLock<tokio::time::Instant> = LazyLock::new(tokio::time::Instant::now);
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole ms, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2)
}

/// The single half-open trial of a route ([`RouteHealth::claim_trial`]). The trial ends with
/// the route's next recorded outcome, or when the permit is dropped (the request that held
/// it never reached the route, or the client left): dropping a permit whose trial already
/// ended does not touch a later one.
#[derive(Debug)]
pub struct TrialPermit {
    health: Arc<RouteHealth>,
    generation: u64,
}

impl TrialPermit {
    /// Ends this trial without an outcome, if it is still the one in flight.
    pub fn release(&self) {
        self.health.end_trial(self.generation);
    }
}

impl Drop for TrialPermit {
    fn drop(&mut self) {
        self.release();
    }
}

/// Health of one route.
#[derive(Debug)]
pub struct RouteHealth {
    provider: String,
    route: String,
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    /// No traffic before this instant (ms since epoch); 0 = none.
    cooldown_until_ms: AtomicU64,
    /// The generation of the half-open trial in flight ([`TrialPermit`]); 0 = none.
    trial: AtomicU64,
    /// A degraded route's next trial is due at this instant (ms since epoch).
    trial_due_ms: AtomicU64,
    /// The last failure (ms since epoch); 0 = none yet. Decay counts from it.
    last_failure_ms: AtomicU64,
    /// Failures of [`FailureScope::Route`] among the current consecutive failures.
    route_failures: AtomicU32,
    /// Exponentially weighted TTFT, microseconds (0 = no sample yet).
    ewma_ttft_us: AtomicU64,
    /// Outcomes for the error-rate trigger (only touched when it is configured).
    window: Mutex<OutcomeWindow>,
    /// Requests and same-route retries over the last minute (`retry.budget_ratio`).
    retry_budget: super::retry::RetryBudget,
    /// Recent time-to-first-event samples (`hedge_after_ms: auto`).
    first_event: super::ttft::TtftSamples,
}

/// Outcome counts in a sliding window, estimated from the current and the previous fixed
/// window (the previous one weighted by how much of it still overlaps), like
/// `pingora_limits::rate::Rate`.
#[derive(Debug, Default, Clone, Copy)]
struct OutcomeWindow {
    /// Start of the current fixed window, ms since the epoch.
    start_ms: u64,
    /// (outcomes, failures) in the current window.
    current: (u32, u32),
    /// (outcomes, failures) in the previous window.
    previous: (u32, u32),
}

impl OutcomeWindow {
    /// Adds one outcome at `now` and returns the estimated (outcomes, failures) in the last
    /// `window_ms`.
    fn add(&mut self, now: u64, window_ms: u64, failed: bool) -> (f64, f64) {
        let w = window_ms.max(1);
        let age = now.saturating_sub(self.start_ms);
        if age >= 2 * w {
            self.previous = (0, 0);
            self.current = (0, 0);
            self.start_ms = now - age % w;
        } else if age >= w {
            self.previous = self.current;
            self.current = (0, 0);
            self.start_ms += w;
        }
        self.current.0 = self.current.0.saturating_add(1);
        if failed {
            self.current.1 = self.current.1.saturating_add(1);
        }
        #[expect(clippy::cast_precision_loss, reason = "ms within one window")]
        let overlap = 1.0 - (now.saturating_sub(self.start_ms) as f64 / w as f64).min(1.0);
        (
            f64::from(self.previous.0) * overlap + f64::from(self.current.0),
            f64::from(self.previous.1) * overlap + f64::from(self.current.1),
        )
    }

    /// Whether the estimate after adding an outcome trips `rate`.
    fn trips(&mut self, now: u64, rate: &ErrorRate, failed: bool) -> bool {
        let window_ms = u64::try_from(rate.window.as_millis()).unwrap_or(u64::MAX / 4);
        let (total, failures) = self.add(now, window_ms, failed);
        total >= f64::from(rate.min_requests) && failures * 100.0 >= f64::from(rate.percent) * total
    }
}

impl RouteHealth {
    fn new(provider: &str, route: &str) -> Self {
        let h = Self {
            provider: provider.to_string(),
            route: route.to_string(),
            state: AtomicU8::new(0),
            consecutive_failures: AtomicU32::new(0),
            cooldown_until_ms: AtomicU64::new(0),
            trial: AtomicU64::new(0),
            trial_due_ms: AtomicU64::new(0),
            last_failure_ms: AtomicU64::new(0),
            route_failures: AtomicU32::new(0),
            ewma_ttft_us: AtomicU64::new(0),
            window: Mutex::new(OutcomeWindow::default()),
            retry_budget: super::retry::RetryBudget::default(),
            first_event: super::ttft::TtftSamples::default(),
        };
        h.export();
        h
    }

    /// The route's retry budget.
    pub fn retry_budget(&self) -> &super::retry::RetryBudget {
        &self.retry_budget
    }

    /// The route's recent time-to-first-event samples (their p95 paces
    /// `hedge_after_ms: auto`).
    pub fn first_event(&self) -> &super::ttft::TtftSamples {
        &self.first_event
    }

    /// Current state.
    pub fn state(&self) -> Health {
        Health::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Recent TTFT (EWMA, α = 0.2), if any sample exists.
    pub fn ewma_ttft(&self) -> Option<Duration> {
        match self.ewma_ttft_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Remaining cool-down, if the route is resting.
    pub fn cooldown_remaining(&self) -> Option<Duration> {
        let until = self.cooldown_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            // Never rested, or the last cool-down was seen to end: no clock read (this runs
            // several times per route in every plan).
            return None;
        }
        let now = now_ms();
        if until > now {
            return Some(Duration::from_millis(until - now));
        }
        // Ended: forget it, unless a new cool-down was set meanwhile.
        let _ =
            self.cooldown_until_ms
                .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        None
    }

    /// Claims the route's half-open trial when one is due: the route is degraded or
    /// unhealthy, its cool-down is over (a degraded route's runs from its last failure), and
    /// no other trial is in flight. At most one caller holds a permit at a time; it ends with
    /// the route's next outcome or when the permit is dropped.
    pub fn claim_trial(self: &Arc<Self>) -> Option<TrialPermit> {
        let state = self.state();
        if state == Health::Healthy || self.cooldown_remaining().is_some() {
            return None;
        }
        if state == Health::Degraded && now_ms() < self.trial_due_ms.load(Ordering::Relaxed) {
            return None;
        }
        static GENERATION: AtomicU64 = AtomicU64::new(1);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        self.trial
            .compare_exchange(0, generation, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| TrialPermit {
                health: self.clone(),
                generation,
            })
    }

    /// Whether a request without a trial permit may use this route now: not resting, and not
    /// unhealthy (an unhealthy route serves only its trial).
    pub fn is_available(&self) -> bool {
        self.cooldown_remaining().is_none() && self.state() != Health::Unhealthy
    }

    /// Whether a half-open trial is in flight.
    pub fn trial_in_flight(&self) -> bool {
        self.trial.load(Ordering::Relaxed) != 0
    }

    /// Records a success (and its TTFT when known): the route is healthy.
    pub fn record_success(&self, thresholds: &PassiveHealth, ttft: Option<Duration>) {
        if let Some(rate) = &thresholds.error_rate {
            let mut w = self.lock_window();
            if self.state() == Health::Unhealthy {
                // Recovered: the failures that tripped the rate are history.
                *w = OutcomeWindow::default();
            }
            w.trips(now_ms(), rate, false);
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.route_failures.store(0, Ordering::Relaxed);
        self.trial.store(0, Ordering::Release);
        if let Some(t) = ttft {
            let sample = u64::try_from(t.as_micros()).unwrap_or(u64::MAX).max(1);
            let old = self.ewma_ttft_us.load(Ordering::Relaxed);
            let new = if old == 0 {
                sample
            } else {
                (old * 4 + sample) / 5
            };
            self.ewma_ttft_us.store(new.max(1), Ordering::Relaxed);
        }
        self.transition(Health::Healthy);
    }

    /// Records a provider probe's success ([`FailureScope::Provider`] evidence): it clears
    /// the route's failures only when none of them was the route's own. Returns whether it
    /// did.
    pub fn record_probe_success(&self, thresholds: &PassiveHealth) -> bool {
        if self.route_failures.load(Ordering::Relaxed) > 0 {
            return false;
        }
        self.record_success(thresholds, None);
        true
    }

    /// Records a failure of the route's own answer ([`FailureScope::Route`]). `retry_after`
    /// (from a 429) sets the cool-down directly.
    pub fn record_failure(&self, thresholds: &PassiveHealth, retry_after: Option<Duration>) {
        self.record_scoped_failure(thresholds, FailureScope::Route, retry_after);
    }

    /// Records a failed attempt, scoped by what failed ([`FailureScope::of`]).
    pub fn record_attempt_failure(
        &self,
        thresholds: &PassiveHealth,
        failure: AttemptFailure,
        retry_after: Option<Duration>,
    ) {
        if failure == AttemptFailure::ModelNotFound {
            // The route's model is gone: no point in waiting for more failures, it rests now
            // (unhealthy, for the cool-down; then its half-open trial as for any route).
            self.consecutive_failures.fetch_max(
                thresholds.unhealthy_after_failures.saturating_sub(1),
                Ordering::Relaxed,
            );
        }
        self.record_scoped_failure(thresholds, FailureScope::of(failure), retry_after);
    }

    /// Records a failure of `scope`. `retry_after` (from a 429) sets the cool-down directly.
    pub fn record_scoped_failure(
        &self,
        thresholds: &PassiveHealth,
        scope: FailureScope,
        retry_after: Option<Duration>,
    ) {
        let now = now_ms();
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if scope == FailureScope::Route {
            self.route_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.last_failure_ms.store(now.max(1), Ordering::Relaxed);
        self.trial_due_ms.store(
            now.saturating_add(ms(thresholds.cooldown)),
            Ordering::Relaxed,
        );
        self.trial.store(0, Ordering::Release);
        if let Some(ra) = retry_after {
            let capped = ra.min(Duration::from_secs(300));
            self.set_cooldown(capped);
        }
        let rate_tripped = thresholds
            .error_rate
            .as_ref()
            .is_some_and(|rate| self.lock_window().trips(now, rate, true));
        let next = if n >= thresholds.unhealthy_after_failures || rate_tripped {
            Health::Unhealthy
        } else if n >= thresholds.degraded_after_failures {
            Health::Degraded
        } else {
            self.state()
        };
        if next == Health::Unhealthy && retry_after.is_none() {
            self.set_cooldown(thresholds.cooldown);
        }
        self.transition(next);
    }

    /// Applies decay ([`PassiveHealth::decay_after`]): a route with no failure for one period
    /// is one state healthier, for two periods healthy. Reads the clock only for a route
    /// that is not healthy.
    pub fn refresh(&self, thresholds: &PassiveHealth) {
        let state = self.state();
        let Some(period) = thresholds.decay_after.filter(|_| state != Health::Healthy) else {
            return;
        };
        let last = self.last_failure_ms.load(Ordering::Relaxed);
        let steps = now_ms().saturating_sub(last) / ms(period).max(1);
        let next = match (state, steps) {
            (_, 0) => return,
            (Health::Unhealthy, 1) => Health::Degraded,
            _ => Health::Healthy,
        };
        // A failure recorded meanwhile wins (it moved the state or the last failure).
        if self
            .state
            .compare_exchange(state as u8, next as u8, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
            || self.last_failure_ms.load(Ordering::Relaxed) != last
        {
            return;
        }
        if next == Health::Healthy {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            self.route_failures.store(0, Ordering::Relaxed);
            if thresholds.error_rate.is_some() {
                *self.lock_window() = OutcomeWindow::default();
            }
        } else {
            // On probation: the next failure makes it unhealthy again.
            let n = thresholds.unhealthy_after_failures.saturating_sub(1);
            self.consecutive_failures.store(n, Ordering::Relaxed);
        }
        self.log_change(state, next, "decay");
        self.export();
    }

    fn lock_window(&self) -> std::sync::MutexGuard<'_, OutcomeWindow> {
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the trial of `generation` if it is still the one in flight.
    fn end_trial(&self, generation: u64) {
        let _ = self
            .trial
            .compare_exchange(generation, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    fn set_cooldown(&self, d: Duration) {
        let until = now_ms().saturating_add(ms(d));
        self.cooldown_until_ms.store(until, Ordering::Relaxed);
    }

    fn transition(&self, next: Health) {
        let prev = Health::from_u8(self.state.swap(next as u8, Ordering::AcqRel));
        if prev != next {
            self.log_change(prev, next, "outcome");
            self.export();
        }
    }

    fn log_change(&self, prev: Health, next: Health, cause: &str) {
        log::warn!(
            target: "sluice::routing::health",
            "route health changed provider={} route={} from={} to={} cause={cause}",
            self.provider,
            self.route,
            prev.as_str(),
            next.as_str()
        );
    }

    fn export(&self) {
        metrics()
            .provider_health
            .with_label_values(&[self.provider.as_str(), self.route.as_str()])
            .set(i64::from(self.state.load(Ordering::Relaxed)));
    }
}

/// All route health states, keyed by `provider/upstream_model`.
#[derive(Debug, Default)]
pub struct HealthRegistry {
    routes: RwLock<HashMap<String, Arc<RouteHealth>>>,
}

impl HealthRegistry {
    /// The state of a route, created healthy on first use.
    pub fn route(&self, provider: &str, key: &str) -> Arc<RouteHealth> {
        if let Ok(map) = self.routes.read() {
            if let Some(h) = map.get(key) {
                return h.clone();
            }
        }
        let mut map = match self.routes.write() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.entry(key.to_string())
            .or_insert_with(|| Arc::new(RouteHealth::new(provider, key)))
            .clone()
    }

    /// Every route of `provider`.
    pub fn routes_of(&self, provider: &str) -> Vec<Arc<RouteHealth>> {
        self.routes.read().map_or_else(
            |_| Vec::new(),
            |m| {
                m.values()
                    .filter(|h| h.provider == provider)
                    .cloned()
                    .collect()
            },
        )
    }
}

/// The process-wide registry.
pub fn registry() -> &'static HealthRegistry {
    static REG: LazyLock<HealthRegistry> = LazyLock::new(HealthRegistry::default);
    &REG
}

#[cfg(test)]
mod tests {
    use super::*;

    fn th() -> PassiveHealth {
        PassiveHealth {
            degraded_after_failures: 1,
            unhealthy_after_failures: 3,
            cooldown: Duration::from_millis(50),
            error_rate: None,
            decay_after: None,
        }
    }

    fn route(key: &str) -> Arc<RouteHealth> {
        Arc::new(RouteHealth::new("p", key))
    }

    #[test]
    fn healthy_degraded_unhealthy_then_half_open() {
        let h = route("p/m-test-1");
        assert!(h.claim_trial().is_none(), "a healthy route needs no trial");
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Degraded);
        h.record_failure(&th(), None);
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Unhealthy);
        assert!(!h.is_available(), "resting during cool-down");
        assert!(h.claim_trial().is_none(), "no trial while resting");
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            !h.is_available(),
            "an unhealthy route serves only its trial"
        );
        let trial = h.claim_trial().expect("one trial after cool-down");
        assert!(h.claim_trial().is_none(), "only one trial at a time");
        h.record_success(&th(), Some(Duration::from_millis(10)));
        drop(trial);
        assert_eq!(h.state(), Health::Healthy);
        assert!(h.is_available());
        assert_eq!(h.ewma_ttft(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn a_degraded_route_gets_one_trial_after_its_cooldown() {
        let h = route("p/m-test-trial");
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Degraded);
        assert!(h.is_available(), "a degraded route is still a fallback");
        assert!(
            h.claim_trial().is_none(),
            "its cool-down runs from the failure"
        );
        std::thread::sleep(Duration::from_millis(60));
        let first = h.claim_trial().expect("due");
        assert!(h.claim_trial().is_none(), "exactly one trial in flight");
        assert!(h.is_available(), "still a fallback for other requests");
        // The trial fails: the cool-down restarts, no trial until it ends.
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Degraded);
        assert!(h.claim_trial().is_none());
        std::thread::sleep(Duration::from_millis(60));
        let second = h.claim_trial().expect("due again");
        // The first permit's late drop does not end the second trial.
        drop(first);
        assert!(h.trial_in_flight());
        assert!(h.claim_trial().is_none());
        // A permit dropped without an outcome (the client left) frees the trial.
        drop(second);
        assert!(!h.trial_in_flight());
        let third = h.claim_trial().expect("free again");
        h.record_success(&th(), None);
        assert_eq!(h.state(), Health::Healthy);
        assert!(h.claim_trial().is_none());
        drop(third);
    }

    #[test]
    fn a_provider_probe_lifts_provider_failures_but_not_the_routes_own() {
        let h = route("p/m-test-scope");
        for _ in 0..3 {
            h.record_scoped_failure(&th(), FailureScope::Provider, None);
        }
        assert_eq!(h.state(), Health::Unhealthy);
        assert!(h.record_probe_success(&th()), "connect failures only");
        assert_eq!(h.state(), Health::Healthy);

        // The chat route answers 503 while the listing answers 200.
        for _ in 0..3 {
            h.record_attempt_failure(&th(), AttemptFailure::Status(503), None);
        }
        assert_eq!(h.state(), Health::Unhealthy);
        assert!(!h.record_probe_success(&th()));
        assert_eq!(
            h.state(),
            Health::Unhealthy,
            "the route's own failures stay"
        );
        // A probe failure still counts.
        h.record_scoped_failure(&th(), FailureScope::Provider, None);
        assert_eq!(h.state(), Health::Unhealthy);
        // Only the route's own success heals it.
        h.record_success(&th(), None);
        assert_eq!(h.state(), Health::Healthy);
        assert_eq!(
            FailureScope::of(AttemptFailure::Connect),
            FailureScope::Provider
        );
        assert_eq!(
            FailureScope::of(AttemptFailure::Status(401)),
            FailureScope::Provider
        );
        assert_eq!(FailureScope::of(AttemptFailure::Reset), FailureScope::Route);
    }

    #[test]
    fn without_failures_a_route_decays_one_state_per_period() {
        let th = PassiveHealth {
            cooldown: Duration::from_secs(60),
            decay_after: Some(Duration::from_millis(80)),
            ..th()
        };
        let h = route("p/m-test-decay");
        for _ in 0..3 {
            h.record_failure(&th, None);
        }
        assert_eq!(h.state(), Health::Unhealthy);
        h.refresh(&th);
        assert_eq!(h.state(), Health::Unhealthy, "not yet");
        std::thread::sleep(Duration::from_millis(90));
        h.refresh(&th);
        assert_eq!(h.state(), Health::Degraded, "one period");
        // On probation: one failure and it is unhealthy again, with a fresh decay clock.
        h.record_failure(&th, None);
        assert_eq!(h.state(), Health::Unhealthy);
        std::thread::sleep(Duration::from_millis(170));
        h.refresh(&th);
        assert_eq!(h.state(), Health::Healthy, "two periods");
        h.record_failure(&th, None);
        assert_eq!(h.state(), Health::Degraded, "the failure count restarted");
        // Decay off: nothing changes.
        let off = PassiveHealth {
            decay_after: None,
            ..th
        };
        std::thread::sleep(Duration::from_millis(90));
        h.refresh(&off);
        assert_eq!(h.state(), Health::Degraded);
        h.refresh(&th);
        assert_eq!(h.state(), Health::Healthy);
    }

    #[test]
    fn retry_after_sets_cooldown() {
        let h = route("p/m-test-2");
        h.record_failure(&th(), Some(Duration::from_secs(5)));
        assert!(!h.is_available());
        assert!(h.claim_trial().is_none());
        assert!(h.cooldown_remaining().unwrap() > Duration::from_secs(4));
    }

    #[test]
    fn an_error_rate_over_the_window_makes_a_route_unhealthy() {
        let th = PassiveHealth {
            degraded_after_failures: 100,
            unhealthy_after_failures: 100,
            cooldown: Duration::from_millis(50),
            error_rate: Some(ErrorRate {
                percent: 50,
                window: Duration::from_secs(60),
                min_requests: 6,
            }),
            decay_after: None,
        };
        let h = route("p/m-test-3");
        // Alternating: never two failures in a row, 50 % failures.
        for i in 0..5 {
            if i % 2 == 0 {
                h.record_success(&th, None);
            } else {
                h.record_failure(&th, None);
            }
            assert_eq!(h.state(), Health::Healthy, "{i}: fewer than 6 outcomes");
        }
        h.record_failure(&th, None);
        assert_eq!(h.state(), Health::Unhealthy, "3 of 6 failed");
        assert!(h.claim_trial().is_none(), "resting");
        std::thread::sleep(Duration::from_millis(60));
        let _trial = h.claim_trial().expect("trial");
        h.record_success(&th, None);
        assert_eq!(h.state(), Health::Healthy);
        // The window restarted on recovery: one failure does not trip it again.
        h.record_failure(&th, None);
        assert_eq!(h.state(), Health::Healthy);
    }

    #[test]
    fn the_window_slides() {
        let mut w = OutcomeWindow::default();
        for _ in 0..10 {
            w.add(0, 1000, true);
        }
        // Half of the previous window still overlaps.
        let (total, failed) = w.add(1500, 1000, false);
        assert!((total - 6.0).abs() < 1e-9, "{total}");
        assert!((failed - 5.0).abs() < 1e-9, "{failed}");
        // Two windows later nothing is left but the new outcome.
        assert_eq!(w.add(3600, 1000, false), (1.0, 0.0));
    }
}
