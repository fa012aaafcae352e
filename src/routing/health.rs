//! Owns route health: per route (`provider/upstream_model`) state machine fed by passive
//! request outcomes and active probes, lock-free on the hot path.
//!
//! States: `Healthy` → (`degraded_after_failures` consecutive failures) `Degraded` →
//! (`unhealthy_after_failures`) `Unhealthy`. An unhealthy route rests for its cool-down (or an
//! upstream 429's `Retry-After`), then admits exactly one trial request (half-open); a success
//! makes it healthy again, a failure restarts the cool-down. State changes are logged once each
//! and exported as `sluice_provider_health{provider,route}`.
//!
//! The registry outlives config reloads: it is keyed by name, not by snapshot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use crate::config::PassiveHealth;
use crate::metrics::metrics;

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
        };
        h.export();
        h
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
        let now = now_ms();
        (until > now).then(|| Duration::from_millis(until - now))
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
    pub fn record_success(&self, ttft: Option<Duration>) {
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
        let next = if n >= thresholds.unhealthy_after_failures {
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
        h.record_success(Some(Duration::from_millis(10)));
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
}
