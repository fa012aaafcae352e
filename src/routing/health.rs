//! Owns route health: per route (`provider/upstream_model`) state machine fed by passive
//! request outcomes and active probes, lock-free on the hot path.
//!
//! States: `Healthy` → (`degraded_after_failures` consecutive failures) `Degraded` →
//! (`unhealthy_after_failures`, or an error rate of `error_rate_percent` over a sliding
//! `error_rate_window_ms` once it holds `error_rate_min_requests` outcomes) `Unhealthy`.
//! An unhealthy route rests for its cool-down (or an upstream 429's `Retry-After`), then
//! admits exactly one trial request (half-open); a success makes it healthy again, a failure
//! restarts the cool-down. State changes are logged once each and exported as
//! `sluice_provider_health{provider,route}`.
//!
//! The registry outlives config reloads: it is keyed by name, not by snapshot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::Duration;

use crate::config::{ErrorRate, PassiveHealth};
use crate::metrics::metrics;

/// Whether an upstream status is worth another provider: the attempt loop falls back on it,
/// and the active probes call a provider down for it.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 401 | 403 | 408 | 409 | 429 | 500..=599)
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

/// Health of one route.
#[derive(Debug)]
pub struct RouteHealth {
    provider: String,
    route: String,
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    /// No traffic before this instant (ms since epoch); 0 = none.
    cooldown_until_ms: AtomicU64,
    /// A half-open trial is in flight.
    trial_in_flight: AtomicBool,
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
            trial_in_flight: AtomicBool::new(false),
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

    /// Whether a request may use this route now. For an unhealthy route past its cool-down this
    /// claims the single half-open trial permit (only one caller gets `true`).
    pub fn admit(&self) -> bool {
        if self.cooldown_remaining().is_some() {
            return false;
        }
        if self.state() != Health::Unhealthy {
            return true;
        }
        self.trial_in_flight
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the route would be tried now, without claiming a trial.
    pub fn is_available(&self) -> bool {
        self.cooldown_remaining().is_none()
            && (self.state() != Health::Unhealthy || !self.trial_in_flight.load(Ordering::Relaxed))
    }

    /// Records a success (and its TTFT when known).
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
        self.trial_in_flight.store(false, Ordering::Release);
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

    /// Records a failure. `retry_after` (from a 429) sets the cool-down directly.
    pub fn record_failure(&self, thresholds: &PassiveHealth, retry_after: Option<Duration>) {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        self.trial_in_flight.store(false, Ordering::Release);
        if let Some(ra) = retry_after {
            let capped = ra.min(Duration::from_secs(300));
            self.set_cooldown(capped);
        }
        let rate_tripped = thresholds
            .error_rate
            .as_ref()
            .is_some_and(|rate| self.lock_window().trips(now_ms(), rate, true));
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

    fn lock_window(&self) -> std::sync::MutexGuard<'_, OutcomeWindow> {
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Releases a claimed half-open permit without an outcome (e.g. the client left).
    pub fn release_trial(&self) {
        self.trial_in_flight.store(false, Ordering::Release);
    }

    fn set_cooldown(&self, d: Duration) {
        let until = now_ms() + u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2);
        self.cooldown_until_ms.store(until, Ordering::Relaxed);
    }

    fn transition(&self, next: Health) {
        let prev = Health::from_u8(self.state.swap(next as u8, Ordering::AcqRel));
        if prev != next {
            log::warn!(
                target: "sluice::routing::health",
                "route health changed provider={} route={} from={} to={}",
                self.provider,
                self.route,
                prev.as_str(),
                next.as_str()
            );
            self.export();
        }
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
        }
    }

    #[test]
    fn healthy_degraded_unhealthy_then_half_open() {
        let h = RouteHealth::new("p", "p/m-test-1");
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Degraded);
        h.record_failure(&th(), None);
        h.record_failure(&th(), None);
        assert_eq!(h.state(), Health::Unhealthy);
        assert!(!h.admit(), "resting during cool-down");
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.admit(), "one trial after cool-down");
        assert!(!h.admit(), "only one trial at a time");
        h.record_success(&th(), Some(Duration::from_millis(10)));
        assert_eq!(h.state(), Health::Healthy);
        assert!(h.admit());
        assert_eq!(h.ewma_ttft(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn retry_after_sets_cooldown() {
        let h = RouteHealth::new("p", "p/m-test-2");
        h.record_failure(&th(), Some(Duration::from_secs(5)));
        assert!(!h.admit());
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
        };
        let h = RouteHealth::new("p", "p/m-test-3");
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
        assert!(!h.admit(), "resting");
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.admit());
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
