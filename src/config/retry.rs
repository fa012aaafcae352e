//! Owns the same-route retry policy as data: `server.retry` with a model's `models.<id>.retry`
//! over it, defaults filled in. What the policy decides (which failure is retried, the
//! backoff) is [`crate::routing::retry`]'s.

use std::time::Duration;

use super::schema::{RetryCondition, RetrySection};

/// The retry policy of one request (the model's override merged over `server.retry`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts on one route before falling back (1 = no retry).
    pub max_attempts_per_route: u32,
    /// Upstream statuses that are retried.
    pub statuses: Vec<u16>,
    /// Connect failures (refused, unreachable, TLS, connect timeout) are retried.
    pub connect_error: bool,
    /// A connection closed or reset before the answer's first event is retried.
    pub connection_reset: bool,
    /// First backoff; doubled for each further retry, jittered ±50%.
    pub backoff: Duration,
    /// A `Retry-After` up to this is waited out on the same route; a longer one rests the
    /// route (cool-down) and the request falls back at once.
    pub max_retry_after_wait: Duration,
    /// Retries of a route at most this share of its requests over a minute (rounded up).
    pub budget_ratio: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::from_section(&RetrySection::default())
    }
}

impl RetryPolicy {
    /// The policy a `server.retry` section describes (absent keys: the defaults).
    pub fn from_section(s: &RetrySection) -> Self {
        let mut p = Self {
            max_attempts_per_route: 2,
            statuses: vec![429, 500, 502, 503, 504],
            connect_error: true,
            connection_reset: true,
            backoff: Duration::from_millis(100),
            max_retry_after_wait: Duration::from_millis(2000),
            budget_ratio: 0.2,
        };
        p.apply(s);
        p
    }

    /// `s` (a model's `retry`) over this policy: the keys it sets win.
    pub fn apply(&mut self, s: &RetrySection) {
        if let Some(n) = s.max_attempts_per_route {
            self.max_attempts_per_route = n.max(1);
        }
        if let Some(on) = &s.on {
            self.statuses.clear();
            self.connect_error = false;
            self.connection_reset = false;
            for c in on {
                match c {
                    RetryCondition::Status(code) => self.statuses.push(*code),
                    RetryCondition::ConnectError => self.connect_error = true,
                    RetryCondition::ConnectionReset => self.connection_reset = true,
                }
            }
        }
        if let Some(ms) = s.backoff_ms {
            self.backoff = Duration::from_millis(ms);
        }
        if let Some(ms) = s.max_retry_after_wait_ms {
            self.max_retry_after_wait = Duration::from_millis(ms);
        }
        if let Some(r) = s.budget_ratio {
            self.budget_ratio = r;
        }
    }
}
