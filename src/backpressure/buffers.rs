//! Owns the process-wide bound on request body bytes held in memory
//! (`server.max_buffered_request_bytes`).
//!
//! A chat request's body is read whole before it goes upstream (it is parsed, and replayed to
//! each fallback candidate), so without a bound N clients sending large bodies hold N bodies.
//! Every body read takes a [`BufferReservation`] from [`RequestBuffers`], in bytes of memory:
//! each body byte counts [`COPIES_PER_BODY_BYTE`] times, since a body is held twice at its
//! peaks (the bytes as received while they are parsed, then the parsed request while an
//! attempt's serialized upstream copy is sent and awaited), so the bound is a bound on the
//! memory request bodies hold, not half of it.
//!
//! - a reservation grows with the body buffer's capacity, that is with the bytes that
//!   arrived (the buffer doubles, never past the announced `Content-Length`), and the body is
//!   refused mid-way when the next growth does not fit; bytes only announced hold nothing,
//!   so idle connections announcing large bodies cannot starve other clients;
//! - with a `Content-Length` that cannot fit in what is left right now, the body is refused
//!   at its head (before `100 Continue`), cleanly, without reading it.
//!
//! The reservation is held as long as the request holds the body in any form (the raw bytes,
//! then the parsed request that every attempt serializes from): until a stream commits
//! (nothing is replayed after it; see `proxy::request::InferenceRequest::release_payload`),
//! else until the attempt loop ends. Dropping it releases the bytes.
//! `sluice_buffered_request_bytes` shows the total reserved.
//!
//! The account also decides when freed body memory is handed back to the OS: a reservation
//! that takes the total past [`super::trim::high_water`] arms it, and the release that
//! drains it to [`super::trim::low_water`] asks [`super::trim`] for one heap trim.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

pub use crate::config::COPIES_PER_BODY_BYTE;
use crate::metrics::metrics;

/// The process-wide count of reserved request body bytes.
#[derive(Debug, Default)]
pub struct RequestBuffers {
    held: Arc<Account>,
}

/// Reserved bytes, and whether they passed the high-water mark since the last trim request.
#[derive(Debug, Default)]
struct Account {
    /// Bytes reserved now, all requests together.
    held: AtomicUsize,
    /// Set when a reservation took `held` past [`super::trim::high_water`]; cleared by the
    /// release that drains it to the low-water mark (which then asks for a trim).
    armed: AtomicBool,
    /// The low-water mark of the bound the account was armed under, bytes.
    low_water: AtomicUsize,
}

/// The bound would be passed: the caller answers 503 with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuffersFull {
    /// The configured bound, bytes.
    pub max_bytes: usize,
}

/// Bytes reserved by one request; released on drop.
#[derive(Debug)]
pub struct BufferReservation {
    held: Arc<Account>,
    bytes: usize,
}

impl RequestBuffers {
    /// An empty count.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes reserved now, all requests together.
    pub fn held(&self) -> usize {
        self.held.held.load(Ordering::Acquire)
    }

    /// A reservation of nothing yet, to grow with [`BufferReservation::ensure`] (it always
    /// fits).
    pub fn empty(&self) -> BufferReservation {
        BufferReservation {
            held: self.held.clone(),
            bytes: 0,
        }
    }

    /// Reserves `bytes` if the total stays within `max_bytes`.
    ///
    /// # Errors
    /// [`BuffersFull`] when it would not (nothing is reserved then).
    pub fn reserve(
        &self,
        bytes: usize,
        max_bytes: usize,
    ) -> Result<BufferReservation, BuffersFull> {
        let mut r = BufferReservation {
            held: self.held.clone(),
            bytes: 0,
        };
        r.ensure(bytes, max_bytes)?;
        Ok(r)
    }
}

impl BufferReservation {
    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows the reservation to at least `bytes` if the total stays within `max_bytes`
    /// (a reservation never shrinks; one already that large is left as it is).
    ///
    /// # Errors
    /// [`BuffersFull`] when the growth does not fit (the reservation is unchanged then).
    pub fn ensure(&mut self, bytes: usize, max_bytes: usize) -> Result<(), BuffersFull> {
        let Some(extra) = bytes.checked_sub(self.bytes).filter(|e| *e > 0) else {
            return Ok(());
        };
        let before = self
            .held
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(extra).filter(|total| *total <= max_bytes)
            })
            .map_err(|_| BuffersFull { max_bytes })?;
        self.bytes = bytes;
        if before + extra >= super::trim::high_water(max_bytes)
            && !self.held.armed.load(Ordering::Relaxed)
        {
            self.held
                .low_water
                .store(super::trim::low_water(max_bytes), Ordering::Relaxed);
            self.held.armed.store(true, Ordering::Release);
        }
        metrics()
            .buffered_request_bytes
            .add(i64::try_from(extra).unwrap_or(i64::MAX));
        Ok(())
    }
}

impl BufferReservation {
    /// Shrinks the reservation to `bytes` (releasing the rest; one already that small is
    /// left as it is): for a holder whose need falls as well as grows (the replay buffer of
    /// a resumable stream, [`crate::stream::resume`]).
    pub fn shrink_to(&mut self, bytes: usize) {
        let Some(extra) = self.bytes.checked_sub(bytes).filter(|e| *e > 0) else {
            return;
        };
        self.held.held.fetch_sub(extra, Ordering::AcqRel);
        self.bytes = bytes;
        metrics()
            .buffered_request_bytes
            .sub(i64::try_from(extra).unwrap_or(i64::MAX));
    }
}

impl Drop for BufferReservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let left = self.held.held.fetch_sub(self.bytes, Ordering::AcqRel) - self.bytes;
            if self.held.armed.load(Ordering::Acquire)
                && left <= self.held.low_water.load(Ordering::Relaxed)
                && self.held.armed.swap(false, Ordering::AcqRel)
            {
                super::trim::request();
            }
            metrics()
                .buffered_request_bytes
                .sub(i64::try_from(self.bytes).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_grow_and_release_on_drop() {
        let b = RequestBuffers::new();
        let a = b.reserve(600, 1000).unwrap();
        assert_eq!(b.held(), 600);
        // 600 + 500 > 1000: refused, nothing taken.
        assert_eq!(b.reserve(500, 1000).unwrap_err().max_bytes, 1000);
        assert_eq!(b.held(), 600);
        let mut c = b.reserve(0, 1000).unwrap();
        c.ensure(400, 1000).unwrap();
        assert_eq!(b.held(), 1000);
        // Growth past the bound fails and leaves the reservation as it was.
        assert!(c.ensure(401, 1000).is_err());
        assert_eq!((c.bytes(), b.held()), (400, 1000));
        // Never shrinks.
        c.ensure(10, 1000).unwrap();
        assert_eq!(c.bytes(), 400);
        drop(a);
        assert_eq!(b.held(), 400);
        c.ensure(1000, 1000).unwrap();
        assert_eq!(b.held(), 1000);
        drop(c);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_reservation_may_shrink_and_grow_again() {
        let b = RequestBuffers::new();
        let mut r = b.reserve(800, 1000).unwrap();
        r.shrink_to(300);
        assert_eq!((r.bytes(), b.held()), (300, 300));
        r.shrink_to(500);
        assert_eq!(r.bytes(), 300, "shrink never grows");
        r.ensure(1000, 1000).unwrap();
        assert_eq!(b.held(), 1000);
        drop(r);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_drain_after_passing_the_high_water_mark_asks_for_one_trim() {
        let requests = || crate::backpressure::trim::REQUESTS.load(Ordering::Relaxed);
        let max = 32 << 20; // high water 8 MiB, low water 1 MiB
        let b = RequestBuffers::new();
        // Below the high-water mark: filling and draining asks for nothing.
        let small = b.reserve(7 << 20, max).unwrap();
        drop(small);
        assert!(!b.held.armed.load(Ordering::Acquire));
        // Past it, the drain to the low-water mark asks once, not on every release.
        let before = requests();
        let big = b.reserve(6 << 20, max).unwrap();
        let mut other = b.reserve(0, max).unwrap();
        other.ensure(3 << 20, max).unwrap();
        assert!(b.held.armed.load(Ordering::Acquire));
        drop(big); // 3 MiB left: above the low-water mark
        assert!(b.held.armed.load(Ordering::Acquire));
        let small = b.reserve(512 << 10, max).unwrap();
        drop(other); // 0.5 MiB left: drained
        assert!(!b.held.armed.load(Ordering::Acquire));
        assert!(requests() > before);
        drop(small);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_bound() {
        let b = Arc::new(RequestBuffers::new());
        let admitted = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (b, admitted, peak) = (b.clone(), admitted.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if let Ok(r) = b.reserve(300, 1000) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            peak.fetch_max(b.held(), Ordering::Relaxed);
                            drop(r);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            peak.load(Ordering::Relaxed) <= 900,
            "3 × 300 fit, a 4th never"
        );
        assert!(admitted.load(Ordering::Relaxed) > 0);
        assert_eq!(b.held(), 0);
    }
}
