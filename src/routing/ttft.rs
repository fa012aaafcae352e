//! Owns a route's recent time-to-first-event samples and their p95, which
//! `models.<id>.hedge_after_ms: auto` hedges after ([`crate::engine::hedge`]).
//!
//! Bounded and lock-free: a ring of the last [`TTFT_SAMPLES`] samples (microseconds, as
//! `u32`, so at most ~71 minutes each), written with one atomic store; the p95 is the
//! nearest-rank 95th percentile of the ring, computed on demand over a copy on the stack
//! (only hedged requests ask).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Samples kept per route (the most recent ones).
pub const TTFT_SAMPLES: usize = 64;
/// Samples a route needs before it has a p95 (before that, `auto` does not hedge).
pub const TTFT_P95_MIN_SAMPLES: usize = 8;

/// The last [`TTFT_SAMPLES`] first-event times of one route.
#[derive(Debug)]
pub struct TtftSamples {
    ring: [AtomicU32; TTFT_SAMPLES],
    /// Samples recorded so far (the next slot is `next % TTFT_SAMPLES`).
    next: AtomicU64,
}

impl Default for TtftSamples {
    fn default() -> Self {
        Self {
            ring: std::array::from_fn(|_| AtomicU32::new(0)),
            next: AtomicU64::new(0),
        }
    }
}

impl TtftSamples {
    /// Records one sample: an attempt's start (before its connect) → its first data event
    /// held (a stream) or its response head read (a non-streaming answer).
    pub fn record(&self, d: Duration) {
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX).max(1);
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "reduced modulo the ring size"
        )]
        let slot = (i % TTFT_SAMPLES as u64) as usize;
        self.ring[slot].store(us, Ordering::Relaxed);
    }

    /// The nearest-rank p95 of the kept samples; `None` with fewer than
    /// [`TTFT_P95_MIN_SAMPLES`].
    pub fn p95(&self) -> Option<Duration> {
        let n = usize::try_from(self.next.load(Ordering::Relaxed))
            .unwrap_or(usize::MAX)
            .min(TTFT_SAMPLES);
        if n < TTFT_P95_MIN_SAMPLES {
            return None;
        }
        let mut v = [0u32; TTFT_SAMPLES];
        for (dst, src) in v.iter_mut().zip(&self.ring) {
            *dst = src.load(Ordering::Relaxed);
        }
        let v = &mut v[..n];
        // Nearest rank: the ceil(0.95 n)-th smallest (1-based).
        let rank = (n * 95).div_ceil(100).max(1) - 1;
        let (_, p, _) = v.select_nth_unstable(rank);
        Some(Duration::from_micros(u64::from(*p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_needs_warm_up_then_follows_the_recent_samples() {
        let s = TtftSamples::default();
        for _ in 0..TTFT_P95_MIN_SAMPLES - 1 {
            s.record(Duration::from_millis(10));
        }
        assert_eq!(s.p95(), None, "not warmed up");
        s.record(Duration::from_millis(10));
        assert_eq!(s.p95(), Some(Duration::from_millis(10)));
        // 1..=20 ms: the nearest-rank p95 of 20 samples is the 19th.
        let s = TtftSamples::default();
        for ms in 1..=20 {
            s.record(Duration::from_millis(ms));
        }
        assert_eq!(s.p95(), Some(Duration::from_millis(19)));
        // The ring keeps only the last 64: old slow samples age out.
        for _ in 0..TTFT_SAMPLES {
            s.record(Duration::from_millis(3));
        }
        assert_eq!(s.p95(), Some(Duration::from_millis(3)));
    }
}
