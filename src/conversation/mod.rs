//! Owns the Responses API's conversation state: the response store behind `store`,
//! `previous_response_id`, `item_reference` inputs and `GET`/`DELETE /v1/responses/{id}`
//! (<https://platform.openai.com/docs/api-reference/responses/get>), kept on the ledger's
//! database (`ledger.path`, SQLite, or `ledger.url`, PostgreSQL when replicas share state)
//! in tables of its own with their own schema version table and migrations.
//!
//! | part | owns |
//! |---|---|
//! | this file | the stored response, the process-wide handle, the worker thread and its queue, retention |
//! | [`sqlite`], [`postgres`] | the two backends: schema (`response_store_schema`), migrations, queries |
//! | [`expand`] | a request's `previous_response_id` chain and `item_reference` items, resolved into its `input` |
//! | [`capture`] | what the client received, made into a [`StoredResponse`] |
//!
//! **What is stored.** Per response: its id (the Response object's `id`), the tenant of the
//! virtual key that asked, `created_at` (unix ms of the capture), the model, the
//! `previous_response_id`, the request's own input items (after `item_reference`
//! resolution, without the history a `previous_response_id` added), the output items, the
//! Response object JSON exactly as the client got it (the unary body, or the `response` member
//! of the client-bound `response.completed` / `response.incomplete` event) and its size in
//! bytes (`size_bytes`: the Response object plus the input items). Everything is keyed by
//! tenant: another tenant's id is an unknown id. Bodies are never logged: log lines name ids,
//! tenants and sizes only.
//!
//! **Never blocks a request.** One worker thread owns the database connection (rusqlite, or
//! tokio-postgres driven by a runtime of its own) and serves a bounded queue
//! (`response_store.queue_capacity`): writes are queued with `try_send` after the answer was
//! sent (a full queue drops the response and counts it in
//! `sluice_response_store_dropped_total`); reads (lookups, `GET`, `DELETE`) are queued the same
//! way and awaited on a oneshot. One thread, first in first out: a response this replica
//! captured is written before any later lookup on this replica is served. Another replica
//! sees it once written (one round trip after the answer). SIGTERM writes what is queued
//! before the process exits; `kill -9` loses what is queued (the ledger's durability).
//!
//! **Retention.** A response older than `response_store.max_age_secs` is never returned or
//! continued (reads filter by age) and is deleted by the sweep, every
//! `response_store.sweep_interval_secs`; a write that takes its tenant over
//! `response_store.max_bytes_per_tenant` deletes the tenant's oldest responses (the new one
//! too when it alone is over) until it is under. Both count in
//! `sluice_response_store_evictions_total{reason}` (`age`, `bytes`);
//! `sluice_response_store_bytes{tenant}` is each tenant's total as of the last write or sweep.

pub mod capture;
pub mod expand;
pub mod postgres;
pub mod sqlite;

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::billing::ledger::{Backend as DbBackend, LedgerError};
pub use crate::config::response_store::ResponseStoreSettings;
use crate::metrics::metrics;

/// One stored response (see the module doc for what each member holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The Response object's `id` (`resp_…`).
    pub id: String,
    /// The tenant of the virtual key that asked.
    pub tenant: String,
    /// When it was stored, unix ms.
    pub created_ms: i64,
    /// The Response object's `model`.
    pub model: String,
    /// The request's `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// The request's own input items (item references resolved), JSON text each.
    pub input: Vec<StoredItem>,
    /// The Response object's `output` items, JSON text each.
    pub output: Vec<StoredItem>,
    /// The Response object as the client got it, JSON text.
    pub response: String,
    /// `response` plus the input items, bytes.
    pub size_bytes: u64,
}

/// One item of a stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredItem {
    /// The item's own `id`, or one Sluice gave it (`item_{response}_{n}`) for listing.
    pub id: String,
    /// The item, JSON text, as it was received or sent.
    pub json: String,
}

/// A backend's operations (blocking; the worker thread calls them).
pub trait Store: Send {
    /// Stores (or replaces) `r`, then deletes the tenant's oldest responses while it holds
    /// more than `max_bytes`; returns how many were deleted and the tenant's bytes after.
    ///
    /// # Errors
    /// The database's.
    fn put(&mut self, r: &StoredResponse, max_bytes: u64) -> Result<(u64, u64), LedgerError>;
    /// The Response object JSON of `tenant`'s response `id` stored at or after `since_ms`.
    ///
    /// # Errors
    /// The database's.
    fn get(&mut self, tenant: &str, id: &str, since_ms: i64)
        -> Result<Option<String>, LedgerError>;
    /// The items of the chain that ends with `id` (its input and output items, then those of
    /// the response it continued, …), oldest response first, each response's input before its
    /// output; `None` when `id` is unknown (or expired) for `tenant`.
    ///
    /// # Errors
    /// The database's.
    fn chain(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<Vec<String>>, LedgerError>;
    /// The newest stored item of `tenant` with id `item_id`, JSON text.
    ///
    /// # Errors
    /// The database's.
    fn item(
        &mut self,
        tenant: &str,
        item_id: &str,
        since_ms: i64,
    ) -> Result<Option<String>, LedgerError>;
    /// The input items of `tenant`'s response `id`, in order; `None` when it is unknown.
    ///
    /// # Errors
    /// The database's.
    fn input_items(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<Vec<StoredItem>>, LedgerError>;
    /// Deletes `tenant`'s response `id` and its items; whether there was one.
    ///
    /// # Errors
    /// The database's.
    fn delete(&mut self, tenant: &str, id: &str) -> Result<bool, LedgerError>;
    /// Deletes every response stored before `before_ms`; how many.
    ///
    /// # Errors
    /// The database's.
    fn sweep(&mut self, before_ms: i64) -> Result<u64, LedgerError>;
    /// Bytes stored per tenant.
    ///
    /// # Errors
    /// The database's.
    fn tenant_bytes(&mut self) -> Result<Vec<(String, u64)>, LedgerError>;
}

/// Opens the store's tables in the database of `backend` (creating or migrating them).
///
/// # Errors
/// When the database cannot be opened or its schema is newer than this Sluice.
pub fn open(backend: &DbBackend) -> Result<Box<dyn Store>, LedgerError> {
    Ok(match backend {
        DbBackend::Sqlite { path } => Box::new(sqlite::SqliteStore::open(path)?),
        DbBackend::Postgres { url } => Box::new(postgres::PostgresStore::connect(url.expose())?),
    })
}

/// Unix ms now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Why a store operation did not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The queue is full or the worker is gone.
    #[error("the response store is busy")]
    Busy,
    /// The database failed (its message; logged by the worker).
    #[error("the response store failed: {0}")]
    Database(String),
}

type Reply<T> = tokio::sync::oneshot::Sender<Result<T, String>>;

/// A job for the worker thread.
enum Job {
    Put(Box<StoredResponse>),
    Get(String, String, Reply<Option<String>>),
    Chain(String, String, Reply<Option<Vec<String>>>),
    Item(String, String, Reply<Option<String>>),
    InputItems(String, String, Reply<Option<Vec<StoredItem>>>),
    Delete(String, String, Reply<bool>),
    /// Acknowledged once every job before it ran.
    Flush(SyncSender<()>),
}

/// The process-wide store: settings and the worker's queue.
#[derive(Debug)]
pub struct Handle {
    settings: ResponseStoreSettings,
    jobs: SyncSender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the bodies.
        f.write_str(match self {
            Job::Put(_) => "Put",
            Job::Get(..) => "Get",
            Job::Chain(..) => "Chain",
            Job::Item(..) => "Item",
            Job::InputItems(..) => "InputItems",
            Job::Delete(..) => "Delete",
            Job::Flush(_) => "Flush",
        })
    }
}

static STORE: OnceLock<Handle> = OnceLock::new();

/// The running store (`None` when `response_store.enabled` is false, or before
/// [`install`]).
pub fn running() -> Option<&'static Handle> {
    STORE.get()
}

/// Opens the store's tables once (so that a bad database stops the start), installs the
/// process-wide handle and returns the service that runs the worker thread once Pingora
/// starts its services (after `-d` forked); jobs queued before then wait.
///
/// # Errors
/// When the database cannot be opened or migrated, or a store is already installed.
pub fn install(
    settings: &ResponseStoreSettings,
    backend: &DbBackend,
) -> Result<StoreService, LedgerError> {
    drop(open(backend)?);
    let (tx, rx) = mpsc::sync_channel(settings.queue_capacity);
    STORE
        .set(Handle {
            settings: settings.clone(),
            jobs: tx,
        })
        .map_err(|_| LedgerError::Schema {
            at: backend.to_string(),
            message: "a response store is already running in this process".into(),
        })?;
    Ok(StoreService {
        pending: std::sync::Mutex::new(Some((rx, backend.clone(), settings.clone()))),
    })
}

type Pending = (mpsc::Receiver<Job>, DbBackend, ResponseStoreSettings);

/// A store of its own, not the process-wide one: opens the database and starts the worker
/// thread at once (benchmarks and tools; the server uses [`install`]). The thread ends when
/// the handle is dropped.
///
/// # Errors
/// When the database cannot be opened or migrated, or the thread cannot start.
pub fn standalone(
    settings: &ResponseStoreSettings,
    backend: &DbBackend,
) -> Result<Handle, LedgerError> {
    drop(open(backend)?);
    let (tx, rx) = mpsc::sync_channel(settings.queue_capacity);
    let (b, s) = (backend.clone(), settings.clone());
    std::thread::Builder::new()
        .name("sluice-response-store".into())
        .spawn(move || worker(&rx, &b, &s))?;
    Ok(Handle {
        settings: settings.clone(),
        jobs: tx,
    })
}

/// The Pingora background service that starts the store's worker thread.
#[derive(Debug)]
pub struct StoreService {
    pending: std::sync::Mutex<Option<Pending>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for StoreService {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let Some((rx, backend, settings)) = self.pending.lock().ok().and_then(|mut p| p.take())
        else {
            return;
        };
        let at = backend.to_string();
        let spawned = std::thread::Builder::new()
            .name("sluice-response-store".into())
            .spawn(move || worker(&rx, &backend, &settings));
        match spawned {
            Ok(_) => log::info!(target: "sluice::conversation", "response store: {at}"),
            Err(e) => log::error!(target: "sluice::conversation",
                "response store: cannot start its thread: {e}; responses are not stored"),
        }
        let _ = shutdown.changed().await;
    }
}

/// The worker thread: opens the database, serves jobs in order, sweeps expired responses.
fn worker(rx: &mpsc::Receiver<Job>, backend: &DbBackend, settings: &ResponseStoreSettings) {
    let mut store: Option<Box<dyn Store>> = None;
    let mut last_sweep = Instant::now();
    let max_age_ms = i64::try_from(settings.max_age.as_millis()).unwrap_or(i64::MAX);
    loop {
        let job = rx.recv_timeout(settings.sweep_interval);
        if store.is_none() {
            match open(backend) {
                Ok(s) => store = Some(s),
                Err(e) => {
                    log::error!(target: "sluice::conversation", "response store: cannot open: {e}")
                }
            }
        }
        let since = now_ms().saturating_sub(max_age_ms);
        match job {
            Ok(job) => match store.as_deref_mut() {
                Some(s) => {
                    if let Err(e) = run(s, job, since, settings) {
                        log::error!(target: "sluice::conversation", "response store: {e}");
                        // A broken connection is re-opened for the next job.
                        store = None;
                    }
                }
                None => refuse(job),
            },
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if last_sweep.elapsed() >= settings.sweep_interval {
            last_sweep = Instant::now();
            if let Some(s) = store.as_deref_mut() {
                if let Err(e) = sweep(s, since) {
                    log::error!(target: "sluice::conversation", "response store sweep: {e}");
                    store = None;
                }
            }
        }
    }
}

/// Deletes what expired and refreshes the per-tenant bytes gauge.
fn sweep(s: &mut dyn Store, since: i64) -> Result<(), LedgerError> {
    let n = s.sweep(since)?;
    if n > 0 {
        metrics()
            .response_store_evictions_total
            .with_label_values(&["age"])
            .inc_by(n);
        log::info!(target: "sluice::conversation", "response store: {n} expired response(s) deleted");
    }
    let g = &metrics().response_store_bytes;
    g.reset();
    for (tenant, bytes) in s.tenant_bytes()? {
        g.with_label_values(&[tenant.as_str()])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    Ok(())
}

/// Answers a job the worker cannot serve (no database).
fn refuse(job: Job) {
    let no = || "the response store's database is not open".to_string();
    match job {
        Job::Put(_) => metrics().response_store_dropped_total.inc(),
        Job::Get(_, _, r) | Job::Item(_, _, r) => drop(r.send(Err(no()))),
        Job::Chain(_, _, r) => drop(r.send(Err(no()))),
        Job::InputItems(_, _, r) => drop(r.send(Err(no()))),
        Job::Delete(_, _, r) => drop(r.send(Err(no()))),
        Job::Flush(ack) => drop(ack.send(())),
    }
}

/// Runs one job; an error of the database (after replying with it).
fn run(
    s: &mut dyn Store,
    job: Job,
    since: i64,
    settings: &ResponseStoreSettings,
) -> Result<(), LedgerError> {
    fn answer<T>(r: Reply<T>, v: Result<T, LedgerError>) -> Result<(), LedgerError> {
        match v {
            Ok(v) => {
                let _ = r.send(Ok(v));
                Ok(())
            }
            Err(e) => {
                let _ = r.send(Err(e.to_string()));
                Err(e)
            }
        }
    }
    match job {
        Job::Put(r) => match s.put(&r, settings.max_bytes_per_tenant) {
            Ok((evicted, bytes)) => {
                if evicted > 0 {
                    metrics()
                        .response_store_evictions_total
                        .with_label_values(&["bytes"])
                        .inc_by(evicted);
                }
                metrics()
                    .response_store_bytes
                    .with_label_values(&[r.tenant.as_str()])
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                log::debug!(target: "sluice::conversation", "response stored id={} tenant={} size_bytes={} evicted={evicted}",
                    r.id, r.tenant, r.size_bytes);
                Ok(())
            }
            Err(e) => {
                metrics().response_store_dropped_total.inc();
                Err(e)
            }
        },
        Job::Get(t, id, r) => answer(r, s.get(&t, &id, since)),
        Job::Chain(t, id, r) => answer(r, s.chain(&t, &id, since)),
        Job::Item(t, id, r) => answer(r, s.item(&t, &id, since)),
        Job::InputItems(t, id, r) => answer(r, s.input_items(&t, &id, since)),
        Job::Delete(t, id, r) => answer(r, s.delete(&t, &id)),
        Job::Flush(ack) => {
            let _ = ack.send(());
            Ok(())
        }
    }
}

impl Handle {
    /// The settings it runs with.
    pub fn settings(&self) -> &ResponseStoreSettings {
        &self.settings
    }

    /// Queues `r` for writing (never blocks; a full queue drops it and counts it).
    pub fn submit(&self, r: StoredResponse) {
        match self.jobs.try_send(Job::Put(Box::new(r))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                metrics().response_store_dropped_total.inc();
                log::warn!(target: "sluice::conversation",
                    "response store queue full ({} responses): a response was not stored",
                    self.settings.queue_capacity);
            }
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Job) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs.try_send(make(tx)).map_err(|_| StoreError::Busy)?;
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Database(e)),
            Err(_) => Err(StoreError::Busy),
        }
    }

    /// `tenant`'s stored Response object `id`, JSON text.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<String>, StoreError> {
        self.ask(|r| Job::Get(tenant.into(), id.into(), r)).await
    }

    /// The items of the conversation ending with `tenant`'s response `id`, oldest first.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    pub async fn chain(&self, tenant: &str, id: &str) -> Result<Option<Vec<String>>, StoreError> {
        self.ask(|r| Job::Chain(tenant.into(), id.into(), r)).await
    }

    /// `tenant`'s newest stored item `item_id`, JSON text.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    pub async fn item(&self, tenant: &str, item_id: &str) -> Result<Option<String>, StoreError> {
        self.ask(|r| Job::Item(tenant.into(), item_id.into(), r))
            .await
    }

    /// The input items of `tenant`'s response `id`.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    pub async fn input_items(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Vec<StoredItem>>, StoreError> {
        self.ask(|r| Job::InputItems(tenant.into(), id.into(), r))
            .await
    }

    /// Deletes `tenant`'s response `id`; whether it existed.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        self.ask(|r| Job::Delete(tenant.into(), id.into(), r)).await
    }

    /// Waits up to `timeout` until everything queued so far ran; whether it did.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.jobs.try_send(Job::Flush(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(timeout).is_ok()
    }
}

/// Writes every queued response before the process exits (a shutdown exit hook); logs an
/// error when that takes longer than 5 s.
pub fn flush_at_exit() {
    if let Some(h) = running() {
        if !h.flush(Duration::from_secs(5)) {
            log::error!(target: "sluice::shutdown",
                "response store: queued responses were not all written within 5 s of shutdown");
        }
    }
}
