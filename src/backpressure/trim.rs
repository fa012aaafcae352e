//! Owns giving heap memory back to the operating system after a burst of request bodies.
//!
//! glibc's allocator keeps what a burst of large request bodies freed: once a freed buffer
//! above its mmap threshold raised that threshold (dynamically, up to 32 MiB), later body
//! buffers come from its heap arenas, and an arena returns memory only from its top. After
//! 100 concurrent 5 MB uploads 120-180 MiB stayed resident on the default bound
//! (`tests/e2e/memory.rs`). `malloc_trim(0)` hands every free page of every arena back
//! (`madvise(MADV_DONTNEED)`), but it walks the arenas under their locks, so it must not run
//! on a request's path, nor often.
//!
//! So the trigger is the request-buffer account ([`super::buffers`]): it is *armed* when the
//! bytes reserved pass [`high_water`] of the bound, and when it then drains to [`low_water`]
//! it asks [`HeapTrimmer`], a background service, for a trim. The trimmer waits [`SETTLE`]
//! (the burst's last requests let go of their other buffers), trims, and trims once more
//! [`TAIL`] later (what closing connections freed since); trims are at least
//! [`MIN_INTERVAL`] apart. Steady traffic whose bodies never reserve that much never
//! arms it: its only cost there is one relaxed atomic load per reservation that grows.
//!
//! Trims are counted in `sluice_heap_trims_total` and logged with the RSS before and after.
//! `malloc_trim` is glibc's: on other targets (musl, whose allocator returns freed memory by
//! itself) the service does nothing.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::Notify;

/// The bound above which reserved bytes arm a trim, bytes: a quarter of the request-buffer
/// bound `max_bytes`, at most 32 MiB (64 MiB on the default 256 MiB bound would leave that
/// much behind after every burst under it).
pub fn high_water(max_bytes: usize) -> usize {
    (max_bytes / 4).min(32 << 20)
}

/// Reserved bytes at or below which an armed account asks for a trim: an eighth of
/// [`high_water`] (4 MiB on the default bound, 1 MiB on a 32 MiB one).
pub fn low_water(max_bytes: usize) -> usize {
    high_water(max_bytes) / 8
}

/// Wait between the request and the trim, for the rest of the burst's buffers to be freed.
pub const SETTLE: Duration = Duration::from_millis(250);

/// Shortest time between two trims.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// When the second trim of a burst runs, after its first.
pub const TAIL: Duration = Duration::from_secs(2);

/// Released below this much (bytes of RSS), a trim is logged at DEBUG rather than INFO.
const LOG_INFO_RELEASED: u64 = 16 << 20;

/// The pending request (a stored permit coalesces any number of requests into one trim).
static WANTED: Notify = Notify::const_new();

/// Asks the trimmer for one trim (cheap: called when the account drains after a burst).
pub fn request() {
    #[cfg(test)]
    REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    WANTED.notify_one();
}

/// Trims asked for so far (unit tests of the account read it).
#[cfg(test)]
pub(crate) static REQUESTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The background service that trims the heap when [`request`]ed.
#[derive(Debug, Default)]
pub struct HeapTrimmer;

#[async_trait]
impl BackgroundService for HeapTrimmer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if !SUPPORTED {
            log::debug!("heap trim after bursts: not available with this allocator");
            return;
        }
        loop {
            tokio::select! {
                () = WANTED.notified() => {}
                _ = shutdown.changed() => return,
            }
            tokio::time::sleep(SETTLE).await;
            trim_and_log("request bodies drained after a burst");
            // Once more a little later, for what the burst's connections and tasks freed
            // after the first pass; a new drain meanwhile starts over (after MIN_INTERVAL).
            tokio::select! {
                () = tokio::time::sleep(TAIL) => trim_and_log("a burst's tail"),
                () = WANTED.notified() => {
                    WANTED.notify_one();
                    tokio::time::sleep(MIN_INTERVAL).await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Trims the heap, counts it, and logs what it gave back (`why` says what led to it).
fn trim_and_log(why: &str) {
    let started = Instant::now();
    let before = rss_bytes();
    let released = trim();
    let after = rss_bytes();
    crate::metrics::metrics().heap_trims_total.inc();
    let freed = before.zip(after).map_or(0, |(b, a)| b.saturating_sub(a));
    let mib = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| (v >> 20).to_string());
    let line = format!(
        "{why}: heap trimmed in {} ms ({}), RSS {} -> {} MiB",
        started.elapsed().as_millis(),
        if released {
            "memory released"
        } else {
            "nothing to release"
        },
        mib(before),
        mib(after),
    );
    if freed >= LOG_INFO_RELEASED {
        log::info!("{line}");
    } else {
        log::debug!("{line}");
    }
}

/// Whether this build can trim (glibc).
const SUPPORTED: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Gives the free pages of every malloc arena back to the OS; whether any was released.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn trim() -> bool {
    // SAFETY: `malloc_trim` takes a byte count, touches no memory of the caller's, and is
    // thread-safe (it locks each arena in turn); glibc has had it since 2.0.
    #[expect(
        unsafe_code,
        reason = "FFI call to glibc's malloc_trim, which has no preconditions"
    )]
    let r = unsafe { libc::malloc_trim(0) };
    r == 1
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() -> bool {
    false
}

/// This process's resident set size, bytes (Linux: `VmRSS` of `/proc/self/status`).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_follow_the_bound() {
        assert_eq!(high_water(256 << 20), 32 << 20);
        assert_eq!(low_water(256 << 20), 4 << 20);
        assert_eq!(high_water(32 << 20), 8 << 20);
        assert_eq!(low_water(32 << 20), 1 << 20);
    }
}
