//! Owns the same-route retry policy (`server.retry`, per model `models.<id>.retry`): which
//! attempt failures are retried on the route that failed before falling back, how often, after
//! which backoff, when a provider's `Retry-After` is waited out, and the per-route retry budget
//! that keeps retries from multiplying an outage ([`RetryBudget`]). The policy's data
//! ([`RetryPolicy`]) is the config's (`config::retry`); what it decides is here.

use std::sync::Mutex;
use std::time::Duration;

pub use crate::config::RetryPolicy;
use crate::error::AttemptFailure;

impl RetryPolicy {
    /// Whether `failure` is one this policy retries.
    pub fn retries(&self, failure: AttemptFailure) -> bool {
        match failure {
            AttemptFailure::Status(s) => self.statuses.contains(&s),
            AttemptFailure::Connect => self.connect_error,
            AttemptFailure::Reset => self.connection_reset,
            // A protocol violation repeats itself.
            AttemptFailure::Protocol => false,
            // A silent upstream is not asked again: the wait would double.
            AttemptFailure::FirstByteTimeout | AttemptFailure::FirstEventTimeout => false,
            // The same route has the same window: it goes to a larger one instead.
            AttemptFailure::ContextLength => false,
            // The route's model is not there; asking again finds it missing again.
            AttemptFailure::ModelNotFound => false,
        }
    }

    /// The wait before retry number `n` (1-based): `backoff × 2^(n-1)`, jittered ±50%.
    pub fn backoff(&self, n: u32) -> Duration {
        let base = self
            .backoff
            .saturating_mul(1 << n.saturating_sub(1).min(16));
        base.mul_f64(0.5 + fastrand::f64())
    }
}

/// Length of the retry budget's window.
const BUDGET_WINDOW_MS: u64 = 60_000;

/// Requests and retries of one route over the last minute, estimated from the current and the
/// previous fixed minute (the previous weighted by how much of it the sliding minute still
/// covers).
#[derive(Debug, Default)]
pub struct RetryBudget(Mutex<BudgetWindows>);

#[derive(Debug, Default, Clone, Copy)]
struct BudgetWindows {
    /// Start of the current fixed window, ms since the epoch.
    start_ms: u64,
    requests: [f64; 2],
    retries: [f64; 2],
}

impl BudgetWindows {
    fn roll(&mut self, now_ms: u64) {
        let start = now_ms - now_ms % BUDGET_WINDOW_MS;
        if start == self.start_ms {
            return;
        }
        if start == self.start_ms + BUDGET_WINDOW_MS {
            self.requests = [self.requests[1], 0.0];
            self.retries = [self.retries[1], 0.0];
        } else {
            self.requests = [0.0; 2];
            self.retries = [0.0; 2];
        }
        self.start_ms = start;
    }

    /// `(requests, retries)` over the sliding minute ending at `now_ms`.
    fn sliding(&self, now_ms: u64) -> (f64, f64) {
        let into = (now_ms - self.start_ms) as f64 / BUDGET_WINDOW_MS as f64;
        let w = 1.0 - into.clamp(0.0, 1.0);
        (
            self.requests[1] + self.requests[0] * w,
            self.retries[1] + self.retries[0] * w,
        )
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl RetryBudget {
    /// Counts one request sent to the route (its first attempt there).
    pub fn record_request(&self) {
        self.record_request_at(now_ms());
    }

    /// Takes one retry from the budget if `ratio` of the minute's requests (rounded up)
    /// leaves room; counts it when it does.
    pub fn try_retry(&self, ratio: f64) -> bool {
        self.try_retry_at(ratio, now_ms())
    }

    fn record_request_at(&self, now: u64) {
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.roll(now);
        g.requests[1] += 1.0;
    }

    fn try_retry_at(&self, ratio: f64, now: u64) -> bool {
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.roll(now);
        let (requests, retries) = g.sliding(now);
        if retries + 1.0 > (requests * ratio).ceil() {
            return false;
        }
        g.retries[1] += 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::schema::{RetryCondition, RetrySection};

    #[test]
    fn the_policy_retries_what_it_lists_and_backs_off_doubling() {
        let p = RetryPolicy::default();
        assert!(p.retries(AttemptFailure::Status(503)));
        assert!(p.retries(AttemptFailure::Status(429)));
        assert!(!p.retries(AttemptFailure::Status(400)));
        assert!(p.retries(AttemptFailure::Connect));
        assert!(p.retries(AttemptFailure::Reset));
        assert!(!p.retries(AttemptFailure::Protocol));
        assert!(!p.retries(AttemptFailure::FirstByteTimeout));
        for n in 1..=3u32 {
            let b = p.backoff(n).as_secs_f64();
            let base = 0.1 * f64::from(1u32 << (n - 1));
            assert!(b >= base * 0.5 && b <= base * 1.5, "{n}: {b}");
        }
        let mut m = p.clone();
        m.apply(&RetrySection {
            max_attempts_per_route: Some(1),
            on: Some(vec![RetryCondition::Status(500)]),
            ..RetrySection::default()
        });
        assert_eq!(m.max_attempts_per_route, 1);
        assert!(m.retries(AttemptFailure::Status(500)));
        assert!(!m.retries(AttemptFailure::Status(503)));
        assert!(!m.retries(AttemptFailure::Connect));
        assert_eq!(m.backoff, p.backoff);
    }

    #[test]
    fn the_budget_allows_a_share_of_the_minutes_requests_rounded_up() {
        let b = RetryBudget::default();
        let t = 10 * BUDGET_WINDOW_MS;
        // One request: 20% rounded up is one retry, not two.
        b.record_request_at(t);
        assert!(b.try_retry_at(0.2, t));
        assert!(!b.try_retry_at(0.2, t));
        // A storm: 100 failing requests get 20 retries in all.
        let b = RetryBudget::default();
        let granted = (0..100)
            .filter(|_| {
                b.record_request_at(t);
                b.try_retry_at(0.2, t)
            })
            .count();
        assert_eq!(granted, 20);
        // A minute and a half later the old window has gone: room again.
        let later = t + BUDGET_WINDOW_MS * 2 + BUDGET_WINDOW_MS / 2;
        b.record_request_at(later);
        assert!(b.try_retry_at(0.2, later));
        // Ratio 0: never.
        let b = RetryBudget::default();
        b.record_request_at(t);
        assert!(!b.try_retry_at(0.0, t));
    }
}
