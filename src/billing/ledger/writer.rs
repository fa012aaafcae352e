//! Owns the ledger's bounded queue and its writer thread.
//!
//! Requests `try_send` records into a `sync_channel` of `ledger.queue_capacity`; nothing on
//! the request path waits. The writer is a plain OS thread (the backends are blocking:
//! SQLite, and PostgreSQL through a runtime of its own), so it is independent of Pingora's
//! runtimes, which shutdown tears down. Every `ledger.flush_interval_ms`, or at once when
//! [`Handle::flush`] asks, it takes what is queued (at most one queue's worth per round) and
//! writes it in one transaction. A batch that fails to write is kept and retried each
//! interval; meanwhile the queue fills and further records are dropped and counted, so
//! memory stays bounded by two queues' worth of records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use super::rows::Sink;
use super::{Backend, LedgerError, LedgerSettings, UsageRecord};
use crate::metrics::metrics;

/// Shortest gap between two "queue full" warnings, ms.
const DROP_LOG_INTERVAL_MS: u64 = 10_000;

/// Shortest gap between two "write failed" errors in the log, ms.
const ERROR_LOG_INTERVAL_MS: u64 = 10_000;

/// Opens the backend of `settings` for writing (creating or migrating its schema).
///
/// # Errors
/// When it cannot be opened or migrated.
pub fn open_sink(settings: &LedgerSettings) -> Result<Box<dyn Sink>, LedgerError> {
    Ok(match &settings.backend {
        Backend::Sqlite { path } => Box::new(super::sqlite::SqliteLedger::open(path)?),
        Backend::Postgres { url } => {
            Box::new(super::postgres::PostgresLedger::connect(url.expose())?)
        }
    })
}

/// What the writer thread is asked besides records.
enum Control {
    /// Write everything queued now, then acknowledge (`true`: all of it was written).
    Flush(SyncSender<bool>),
}

/// The producer side, shared by every request.
#[derive(Debug)]
pub struct Handle {
    settings: LedgerSettings,
    records: SyncSender<UsageRecord>,
    control: Mutex<mpsc::Sender<Control>>,
}

/// Unix ms now (for rate-limited logging).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records dropped since the last "queue full" warning, and when that was (unix ms).
static DROPPED_UNLOGGED: AtomicU64 = AtomicU64::new(0);
static LAST_DROP_LOG_MS: AtomicU64 = AtomicU64::new(0);

fn note_drop(capacity: usize) {
    metrics().ledger_dropped_total.inc();
    DROPPED_UNLOGGED.fetch_add(1, Ordering::Relaxed);
    let now = now_ms();
    let last = LAST_DROP_LOG_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= DROP_LOG_INTERVAL_MS
        && LAST_DROP_LOG_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let n = DROPPED_UNLOGGED.swap(0, Ordering::Relaxed);
        log::warn!(target: "sluice::ledger::writer", "usage ledger queue full ({capacity} records): dropped {n} usage record(s); \
             the writer is behind or failing (see sluice_ledger_dropped_total)"
        );
    }
}

/// The consumer side before its thread runs: the writer thread is spawned by
/// [`Pending::spawn`] (from a Pingora background service, after `-d` forked, since threads do
/// not survive a fork); records queued meanwhile wait in the queue.
pub struct Pending {
    rx: Receiver<UsageRecord>,
    control: Receiver<Control>,
    settings: LedgerSettings,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl Pending {
    /// Starts the writer thread over `sink`.
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn spawn(self, sink: Box<dyn Sink>) -> std::io::Result<()> {
        let Pending {
            rx,
            control,
            settings,
        } = self;
        let at = settings.backend.to_string();
        std::thread::Builder::new()
            .name("sluice-ledger".into())
            .spawn(move || {
                run(
                    sink,
                    &rx,
                    &control,
                    settings.flush_interval,
                    settings.queue_capacity,
                    &at,
                );
            })?;
        Ok(())
    }

    /// The settings.
    pub fn settings(&self) -> &LedgerSettings {
        &self.settings
    }
}

impl Handle {
    /// The queue of `settings` (producer side) and its not yet running consumer.
    pub fn channels(settings: LedgerSettings) -> (Handle, Pending) {
        let (records, rx) = mpsc::sync_channel(settings.queue_capacity);
        let (control, control_rx) = mpsc::channel();
        let pending = Pending {
            rx,
            control: control_rx,
            settings: settings.clone(),
        };
        (
            Handle {
                settings,
                records,
                control: Mutex::new(control),
            },
            pending,
        )
    }

    /// Starts the writer thread over an already open `sink` at once.
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn start_with(
        settings: LedgerSettings,
        sink: Box<dyn Sink>,
    ) -> Result<Handle, LedgerError> {
        let (handle, pending) = Self::channels(settings);
        pending.spawn(sink)?;
        Ok(handle)
    }

    /// The settings this writer runs with.
    pub fn settings(&self) -> &LedgerSettings {
        &self.settings
    }

    /// Queues `rec`; a full queue drops it (counted, logged rate-limited).
    pub fn submit(&self, rec: UsageRecord) {
        match self.records.try_send(rec) {
            Ok(()) => metrics().ledger_queue_depth.inc(),
            Err(TrySendError::Full(_)) => note_drop(self.settings.queue_capacity),
            Err(TrySendError::Disconnected(_)) => {
                metrics().ledger_dropped_total.inc();
            }
        }
    }

    /// Asks the writer to write everything queued now; waits up to `timeout` for it.
    /// Whether everything was written in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        let sent = self
            .control
            .lock()
            .map(|c| c.send(Control::Flush(ack)).is_ok())
            .unwrap_or(false);
        sent && done.recv_timeout(timeout).unwrap_or(false)
    }
}

/// The writer thread.
fn run(
    mut sink: Box<dyn Sink>,
    rx: &Receiver<UsageRecord>,
    control: &Receiver<Control>,
    interval: Duration,
    capacity: usize,
    at: &str,
) {
    let mut batch: Vec<UsageRecord> = Vec::with_capacity(capacity.min(4096));
    let mut last_error_log = 0u64;
    let mut next = std::time::Instant::now() + interval;
    loop {
        let wait = next.saturating_duration_since(std::time::Instant::now());
        let ack = match control.recv_timeout(wait) {
            Ok(Control::Flush(ack)) => Some(ack),
            Err(RecvTimeoutError::Timeout) => None,
            // The handle is gone (a test dropped it): write what is left and stop.
            Err(RecvTimeoutError::Disconnected) => {
                drain(rx, &mut batch, capacity);
                let _ = write(&mut *sink, &mut batch, at, &mut last_error_log);
                return;
            }
        };
        if ack.is_none() {
            next = std::time::Instant::now() + interval;
        }
        // A flush takes rounds until the queue is empty (or a write fails).
        loop {
            drain(rx, &mut batch, capacity);
            if batch.is_empty() || !write(&mut *sink, &mut batch, at, &mut last_error_log) {
                break;
            }
            if ack.is_none() {
                break;
            }
        }
        if let Some(ack) = ack {
            let _ = ack.try_send(batch.is_empty());
        }
    }
}

/// Moves queued records into `batch` until it holds `capacity` (a failed batch is kept whole
/// and nothing more is taken, so the queue fills and drops are counted).
fn drain(rx: &Receiver<UsageRecord>, batch: &mut Vec<UsageRecord>, capacity: usize) {
    while batch.len() < capacity {
        match rx.try_recv() {
            Ok(r) => {
                metrics().ledger_queue_depth.dec();
                batch.push(r);
            }
            Err(_) => break,
        }
    }
}

/// Writes `batch` and clears it; on failure keeps it and logs (rate-limited). Whether it
/// was written.
fn write(sink: &mut dyn Sink, batch: &mut Vec<UsageRecord>, at: &str, last_log: &mut u64) -> bool {
    if batch.is_empty() {
        return true;
    }
    let started = std::time::Instant::now();
    match sink.write_batch(batch) {
        Ok(()) => {
            let m = metrics();
            m.ledger_flush_seconds
                .observe(started.elapsed().as_secs_f64());
            m.ledger_records_written_total.inc_by(batch.len() as u64);
            batch.clear();
            true
        }
        Err(e) => {
            metrics().ledger_write_errors_total.inc();
            let now = now_ms();
            if now.saturating_sub(*last_log) >= ERROR_LOG_INTERVAL_MS {
                *last_log = now;
                log::error!(target: "sluice::ledger::writer", "usage ledger {at}: writing {} record(s) failed, retrying: {e}",
                    batch.len()
                );
            }
            false
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex as StdMutex};

    /// A sink that stores batches in memory, and can be made to fail.
    struct Memory {
        batches: Arc<StdMutex<Vec<usize>>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Sink for Memory {
        fn write_batch(&mut self, batch: &[UsageRecord]) -> Result<(), LedgerError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(LedgerError::Schema {
                    at: "memory".into(),
                    message: "failing".into(),
                });
            }
            self.batches.lock().unwrap().push(batch.len());
            Ok(())
        }
    }

    pub(crate) fn rec(i: usize) -> UsageRecord {
        UsageRecord {
            time: 1_796_169_000_000 + i as i64,
            request_id: format!("r{i}"),
            tenant: "t".into(),
            virtual_key: "k".into(),
            model: "m".into(),
            provider: Some("p".into()),
            upstream_model: Some("u".into()),
            input_tokens: 1,
            output_tokens: 2,
            cached_input_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            estimated: false,
            cost_usd: 0.0,
            charge_usd: 0.0,
            status: 200,
            outcome: "ok".into(),
            ttft_ms: Some(3),
            duration_ms: 4,
            fallback_depth: 0,
            attempts: 1,
            ingress: "chat".into(),
            resumptions: 0,
        }
    }

    fn settings(interval_ms: u64, capacity: usize) -> LedgerSettings {
        LedgerSettings {
            flush_interval: Duration::from_millis(interval_ms),
            queue_capacity: capacity,
            ..LedgerSettings::default()
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_flush_writes_the_rest_in_one_batch() {
        let batches = Arc::new(StdMutex::new(Vec::new()));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sink = Memory {
            batches: batches.clone(),
            fail,
        };
        // The interval is long: nothing is written before the flush.
        let h = Handle::start_with(settings(60_000, 3), Box::new(sink)).unwrap();
        let dropped = metrics().ledger_dropped_total.get();
        for i in 0..5 {
            h.submit(rec(i));
        }
        assert_eq!(metrics().ledger_dropped_total.get() - dropped, 2);
        assert!(batches.lock().unwrap().is_empty());
        assert!(h.flush(Duration::from_secs(5)));
        assert_eq!(*batches.lock().unwrap(), vec![3]);
    }

    #[test]
    fn the_writer_flushes_every_interval_and_keeps_a_failed_batch_for_the_next_round() {
        let batches = Arc::new(StdMutex::new(Vec::new()));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sink = Memory {
            batches: batches.clone(),
            fail: fail.clone(),
        };
        let h = Handle::start_with(settings(20, 100), Box::new(sink)).unwrap();
        h.submit(rec(0));
        h.submit(rec(1));
        std::thread::sleep(Duration::from_millis(100));
        assert!(batches.lock().unwrap().is_empty(), "the sink fails");
        fail.store(false, Ordering::SeqCst);
        h.submit(rec(2));
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while batches.lock().unwrap().iter().sum::<usize>() < 3 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(batches.lock().unwrap().iter().sum::<usize>(), 3);
    }
}
