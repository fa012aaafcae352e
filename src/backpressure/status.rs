//! Owns what a client is told about its rate limits: [`RateLimitStatus`] and OpenAI's
//! `x-ratelimit-*` response headers
//! (<https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers>).
//!
//! `limit` is the limit currently enforced (the tenant's, or its fail-open share
//! limit / `redis.replicas` while Redis is unreachable), `remaining` what is left in the current
//! window, and `reset` the time until the window is back to its initial state, written like
//! OpenAI's (`1s`, `6m0s`, `250ms`).

use std::fmt::Write as _;
use std::time::Duration;

/// One limit as reported to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// The limit enforced, per window (requests or tokens).
    pub limit: u64,
    /// What is left of it in the current window.
    pub remaining: u64,
    /// Time until the window is back to its initial state.
    pub reset: Duration,
}

/// The binding request and token limits of one request's tenant (and tenant × model).
/// `None` means no such limit is configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitStatus {
    /// Requests per window.
    pub requests: Option<LimitState>,
    /// Tokens per window.
    pub tokens: Option<LimitState>,
}

impl RateLimitStatus {
    /// Whether no limit is configured.
    pub fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }

    /// Folds in another scope's status: per kind, the one with fewer remaining binds.
    pub fn merge(&mut self, other: RateLimitStatus) {
        fn pick(a: Option<LimitState>, b: Option<LimitState>) -> Option<LimitState> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b.remaining < a.remaining { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        self.requests = pick(self.requests, other.requests);
        self.tokens = pick(self.tokens, other.tokens);
    }

    /// The same status `elapsed` later, assuming no traffic meanwhile: resets shrink, and a
    /// window whose reset has passed is back to full.
    pub fn aged(&self, elapsed: Duration) -> RateLimitStatus {
        let age = |s: Option<LimitState>| {
            s.map(|s| match s.reset.checked_sub(elapsed) {
                Some(reset) if !reset.is_zero() => LimitState { reset, ..s },
                _ => LimitState {
                    remaining: s.limit,
                    reset: Duration::ZERO,
                    ..s
                },
            })
        };
        RateLimitStatus {
            requests: age(self.requests),
            tokens: age(self.tokens),
        }
    }

    /// OpenAI's headers for the configured limits (none for an absent limit):
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, String)> {
        let req = self.requests.map(|s| {
            [
                ("x-ratelimit-limit-requests", s.limit.to_string()),
                ("x-ratelimit-remaining-requests", s.remaining.to_string()),
                ("x-ratelimit-reset-requests", format_reset(s.reset)),
            ]
        });
        let tok = self.tokens.map(|s| {
            [
                ("x-ratelimit-limit-tokens", s.limit.to_string()),
                ("x-ratelimit-remaining-tokens", s.remaining.to_string()),
                ("x-ratelimit-reset-tokens", format_reset(s.reset)),
            ]
        });
        req.into_iter().flatten().chain(tok.into_iter().flatten())
    }
}

/// A duration the way OpenAI writes `x-ratelimit-reset-*` (Go's duration format): `0s`,
/// `250ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`. Sub-millisecond parts round up.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let mut out = String::with_capacity(12);
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    let _ = write!(out, "{s}");
    if frac > 0 {
        let f = format!("{frac:03}");
        let _ = write!(out, ".{}", f.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_read_like_openai() {
        let ms = Duration::from_millis;
        assert_eq!(format_reset(Duration::ZERO), "0s");
        assert_eq!(format_reset(Duration::from_micros(1)), "1ms");
        assert_eq!(format_reset(ms(250)), "250ms");
        assert_eq!(format_reset(ms(1000)), "1s");
        assert_eq!(format_reset(ms(1500)), "1.5s");
        assert_eq!(format_reset(ms(1250)), "1.25s");
        assert_eq!(format_reset(ms(360_000)), "6m0s");
        assert_eq!(format_reset(ms(3_723_000)), "1h2m3s");
    }

    #[test]
    fn merge_keeps_the_binding_limit_and_headers_skip_absent_ones() {
        let s = |limit, remaining| LimitState {
            limit,
            remaining,
            reset: Duration::from_secs(1),
        };
        let mut a = RateLimitStatus {
            requests: Some(s(100, 40)),
            tokens: None,
        };
        a.merge(RateLimitStatus {
            requests: Some(s(10, 9)),
            tokens: Some(s(1000, 10)),
        });
        assert_eq!(a.requests, Some(s(10, 9)));
        assert_eq!(a.tokens, Some(s(1000, 10)));
        let h: Vec<_> = RateLimitStatus {
            requests: Some(s(60, 0)),
            tokens: None,
        }
        .headers()
        .collect();
        assert_eq!(
            h,
            vec![
                ("x-ratelimit-limit-requests", "60".to_string()),
                ("x-ratelimit-remaining-requests", "0".to_string()),
                ("x-ratelimit-reset-requests", "1s".to_string()),
            ]
        );
        let aged = RateLimitStatus {
            requests: Some(s(60, 0)),
            tokens: None,
        }
        .aged(Duration::from_secs(2));
        assert_eq!(
            aged.requests.map(|r| (r.remaining, r.reset)),
            Some((60, Duration::ZERO))
        );
    }
}
