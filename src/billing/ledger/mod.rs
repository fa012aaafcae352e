//! Owns the durable usage ledger: one [`UsageRecord`] per authenticated inference request
//! (plus one per attempt a hedge race cancelled, see below), written off the request path
//! to SQLite (the default) or PostgreSQL, and read back by `sluice usage` and the admin
//! listener's `GET /admin/usage`.
//!
//! | part | owns |
//! |---|---|
//! | this file | the record (its field names are a contract), the outcome classes, the settings, the process-wide writer handle |
//! | [`writer`] | the bounded queue and the background thread that writes batches |
//! | [`sqlite`], [`postgres`] | the two backends: schema with a version table, migrations, batch insert, queries |
//! | [`query`] | filters, the per tenant × model summary (request counts; token, money and resumption sums), the `table`/`json`/`csv` formats, `GET /admin/usage` |
//!
//! **Never blocks a request.** The proxy builds the record and [`writer::Handle::submit`]
//! `try_send`s it into a bounded
//! queue (`ledger.queue_capacity`); a full queue drops the record, counts it in
//! `sluice_ledger_dropped_total` and logs (at most one warning per 10 s). A background thread
//! drains the queue every `ledger.flush_interval_ms` (default 200 ms) and writes everything
//! queued in one transaction. `sluice_ledger_queue_depth` is the number of queued records.
//!
//! **Off.** With `ledger.enabled: false` the server never calls [`install`]: no backend is
//! opened, [`running`] stays `None`, and the proxy builds no record.
//!
//! **Durability.** SIGTERM (graceful shutdown) writes everything queued before the process
//! exits (see [`flush`] and [`crate::shutdown`]). After `kill -9` (or a crash, or SIGINT, which
//! is Pingora's fast shutdown) the records queued since the last flush are lost: at most one
//! flush interval of traffic, plus a batch being written. SQLite runs in WAL mode with
//! `synchronous=NORMAL`: a committed batch survives a process kill; an OS crash or power loss
//! may lose the last batches too.
//!
//! **What a record holds.** Metadata only, never prompt or completion text: the request's
//! [`Metered`](crate::billing::metering::Metered) usage, cost and charge. `estimated` is `true` when
//! the answer ended without the provider's `usage` and Sluice estimated it. Unauthenticated
//! requests and requests that name no model (bad JSON, `GET /v1/models`) are only in the
//! access log.
//!
//! **Cancelled hedges.** A hedged request (`models.<id>.hedge_after_ms`) whose race cancelled
//! an attempt ([`crate::engine::hedge`]) leaves a second row under the same `request_id`
//! (rows have their own id; a request may have several): `outcome` [`HEDGE_CANCELLED`], the
//! same `tenant`, `virtual_key`, `ingress` and `time`, the `model`, `provider` and
//! `upstream_model` of the cancelled attempt, `input_tokens` the request's input estimate,
//! no output, `estimated: true`, `cost_usd` that estimate at the route's input price (the
//! provider was sent the prompt and may bill it), `charge_usd` 0 (Sluice's cost, never the
//! tenant's: budgets read back charges only), `status` 0 (it wrote nothing), `attempts` 1,
//! `ttft_ms` none and `duration_ms` how long it ran. The answer's row is unchanged (its
//! `attempts` counts the cancelled one too). Readers count requests without these rows
//! (the summary's `requests` and `estimated_requests`), while the token and money sums
//! include them.

pub mod postgres;
pub mod query;
pub mod rows;
pub mod sqlite;
pub mod writer;

use std::sync::OnceLock;
use std::time::Duration;

use serde::Serialize;

pub use crate::config::ledger::{
    Backend, LedgerSettings, DEFAULT_FLUSH_INTERVAL_MS, DEFAULT_PATH, DEFAULT_QUEUE_CAPACITY,
};

/// One request's usage, as stored and as `sluice usage --format json` prints it (the field
/// names are a contract: tooling outside the repository reads them).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct UsageRecord {
    /// When the request arrived, unix milliseconds (UTC); printed as RFC 3339 with ms.
    #[serde(with = "rfc3339_ms")]
    pub time: i64,
    /// The request id (`x-request-id`).
    pub request_id: String,
    /// Tenant id.
    pub tenant: String,
    /// The virtual key's name (`virtual_keys[].name`, else `key-` + 8 hex of its hash).
    pub virtual_key: String,
    /// The standard model asked for.
    pub model: String,
    /// The provider that answered, if any (`None`: rejected before an upstream answered).
    pub provider: Option<String>,
    /// The upstream model that answered, if any.
    pub upstream_model: Option<String>,
    /// Input (prompt) tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's prompt cache (part of `input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`).
    pub reasoning_tokens: u64,
    /// Whether the token counts are Sluice's estimate (the provider reported no usage).
    pub estimated: bool,
    /// What the providers charge Sluice for this request, USD.
    pub cost_usd: f64,
    /// What the tenant is charged, USD.
    pub charge_usd: f64,
    /// Final downstream HTTP status (0: nothing was written; always 0 for a
    /// [`HEDGE_CANCELLED`] row).
    pub status: u16,
    /// Outcome class, one of [`OUTCOMES`] ([`HEDGE_CANCELLED`]: not a request but an
    /// attempt of one that a hedge race cancelled, see the module doc).
    pub outcome: String,
    /// Request received → first content event written downstream, ms (`None`: no content).
    pub ttft_ms: Option<u64>,
    /// Request received → request finished, ms.
    pub duration_ms: u64,
    /// Candidate routes that failed before the one that answered.
    pub fallback_depth: u32,
    /// Upstream attempts made (same-route retries included).
    pub attempts: u32,
    /// The client's wire API: `chat`, `messages` or `responses`.
    pub ingress: String,
    /// How many times the client reattached to this resumable stream after its connection
    /// dropped (`GET /v1/streams/{id}`, [`crate::outcome::Outcome::resumptions`]); 0 for
    /// every other request. The generation keeps its one row however often it is resumed.
    /// Absent in JSON written before the column existed: read as 0.
    #[serde(default)]
    pub resumptions: u32,
}

/// Every value of [`UsageRecord::outcome`]: the request classes of [`outcome_class`], and
/// [`HEDGE_CANCELLED`].
pub const OUTCOMES: [&str; 10] = [
    "ok",
    "client_abort",
    "upstream_error",
    "shutdown",
    COUNT_TOKENS,
    "rejected",
    "invalid_request",
    "unauthorized",
    "error",
    HEDGE_CANCELLED,
];

/// The [`UsageRecord::outcome`] of the extra row of an attempt a hedge race cancelled
/// (Sluice's estimated cost, charge 0; see the module doc): not a request, so readers that
/// count requests leave these rows out.
pub const HEDGE_CANCELLED: &str = "hedge_cancelled";

/// The [`UsageRecord::outcome`] of a token count that was answered
/// (`POST /v1/messages/count_tokens`, `POST /v1/responses/input_tokens`): nothing was
/// generated, so `--summary` does not count it as a request.
pub const COUNT_TOKENS: &str = "count_tokens";

/// The ledger outcome class of a request from its access-log outcome label (`ok`,
/// `client_abort`, `stream_error`, or a [`crate::error::GatewayError::metric_label`]) and its
/// final status: admission and limit refusals (429, 503 queue/buffers, 402 budgets, and a
/// stream ended because its running charge would pass the budget) are `rejected`; a stream
/// cut by the shutdown grace `shutdown` (Sluice's doing, not the upstream's); failures of the
/// upstream (after it was tried) `upstream_error`; other client
/// errors `invalid_request` or `unauthorized`; anything else `error`.
pub fn outcome_class(label: &str, status: u16) -> &'static str {
    match label {
        "ok" => "ok",
        "client_abort" => "client_abort",
        "shutdown" => "shutdown",
        "stream_error" | "upstream_error" | "upstream_unavailable" | "upstream_timeout" => {
            "upstream_error"
        }
        "queue_full"
        | "queue_timeout"
        | "tenant_rpm"
        | "tenant_tpm"
        | "tenant_concurrency"
        | "request_buffers_full"
        | "budget_exceeded" => "rejected",
        "unauthorized" | "forbidden" => "unauthorized",
        "invalid_request" | "not_found" | "method_not_allowed" | "upgrade_required"
        | "payload_too_large" | "request_timeout" | "no_route" => "invalid_request",
        _ => match status {
            402 | 429 => "rejected",
            401 | 403 => "unauthorized",
            400..=499 => "invalid_request",
            _ => "error",
        },
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Sqlite { path } => write!(f, "sqlite:{}", path.display()),
            Backend::Postgres { url } => write!(f, "{}", postgres::redacted_url(url.expose())),
        }
    }
}

/// Errors of the ledger backends.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// SQLite failed.
    #[error("sqlite ledger {path}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// The driver's error.
        #[source]
        source: rusqlite::Error,
    },
    /// PostgreSQL failed.
    #[error("postgres ledger {url}: {source}")]
    Postgres {
        /// The URL without its password.
        url: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The stored schema is newer than this Sluice knows, or otherwise unusable.
    #[error("ledger {at}: {message}")]
    Schema {
        /// Backend description.
        at: String,
        /// What is wrong.
        message: String,
    },
    /// The ledger does not exist (only reading opens without creating).
    #[error("no ledger at {0} (Sluice creates it when it starts)")]
    Missing(String),
    /// A runtime for the async driver could not be built.
    #[error("ledger: {0}")]
    Io(#[from] std::io::Error),
}

/// The ledger queue of this process, once [`install`] ran.
static WRITER: OnceLock<writer::Handle> = OnceLock::new();

/// Checks that the ledger of `settings` opens (creating or migrating its schema, then closing
/// it again) and installs the process-wide queue; the returned service starts the writer
/// thread when Pingora runs its services (after `-d` forked). Records queued before then wait
/// in the queue.
///
/// # Errors
/// When the backend cannot be opened or its schema cannot be created or migrated, or a
/// ledger is already installed.
pub fn install(settings: &LedgerSettings) -> Result<LedgerService, LedgerError> {
    drop(writer::open_sink(settings)?);
    let (handle, pending) = writer::Handle::channels(settings.clone());
    WRITER.set(handle).map_err(|_| LedgerError::Schema {
        at: settings.backend.to_string(),
        message: "a ledger is already running in this process".into(),
    })?;
    Ok(LedgerService {
        pending: std::sync::Mutex::new(Some(pending)),
    })
}

/// The Pingora background service that opens the ledger and runs its writer thread.
#[derive(Debug)]
pub struct LedgerService {
    pending: std::sync::Mutex<Option<writer::Pending>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for LedgerService {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let Some(pending) = self.pending.lock().ok().and_then(|mut p| p.take()) else {
            return;
        };
        let settings = pending.settings().clone();
        let opened = tokio::task::spawn_blocking(move || writer::open_sink(&settings)).await;
        match opened {
            Ok(Ok(sink)) => {
                let s = pending.settings();
                log::info!(target: "sluice::ledger", "usage ledger: {} (flush every {} ms, queue {} records)",
                    s.backend,
                    s.flush_interval.as_millis(),
                    s.queue_capacity
                );
                if let Err(e) = pending.spawn(sink) {
                    log::error!(target: "sluice::ledger", "usage ledger: cannot start the writer thread: {e}");
                }
            }
            Ok(Err(e)) => {
                log::error!(target: "sluice::ledger", "usage ledger: cannot open: {e}; usage is not recorded")
            }
            Err(e) => {
                log::error!(target: "sluice::ledger", "usage ledger: cannot open: {e}; usage is not recorded")
            }
        }
        // The writer thread runs on; the service lives as long as it (the final flush is
        // [`crate::shutdown`]'s, just before the process exits).
        let _ = shutdown.changed().await;
    }
}

/// The settings of the installed ledger (`None` before [`install`]).
pub fn running() -> Option<&'static LedgerSettings> {
    WRITER.get().map(writer::Handle::settings)
}

/// Queues one record (never blocks; a full queue drops and counts it). A no-op before
/// [`install`] (the `sluice usage` tool, unit tests).
pub fn submit(rec: UsageRecord) {
    if let Some(w) = WRITER.get() {
        w.submit(rec);
    }
}

/// How long the exit hook waits for the ledger to write what is queued.
const EXIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes every queued usage record before the process exits (the server registers it as a
/// shutdown exit hook, [`crate::shutdown::StreamShutdown::on_exit`]); logs an error when
/// that takes longer than 5 s.
pub fn flush_at_exit() {
    if !flush(EXIT_FLUSH_TIMEOUT) {
        log::error!(
            target: "sluice::shutdown",
            "usage ledger: queued records were not all written within {} s of shutdown",
            EXIT_FLUSH_TIMEOUT.as_secs()
        );
    }
}

/// Writes everything queued now and waits up to `timeout` for it; whether it finished.
/// Called on graceful shutdown just before the process exits.
pub fn flush(timeout: Duration) -> bool {
    WRITER.get().is_none_or(|w| w.flush(timeout))
}

/// `time` as RFC 3339 UTC with milliseconds (`2026-12-01T23:50:00.123Z`).
pub mod rfc3339_ms {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Formats unix ms; out-of-range values print as the number.
    pub fn format(ms: i64) -> String {
        match jiff::Timestamp::from_millisecond(ms) {
            Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            Err(_) => ms.to_string(),
        }
    }

    /// Serializes unix ms as RFC 3339.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(ms: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*ms))
    }

    /// Reads an RFC 3339 timestamp back into unix ms.
    ///
    /// # Errors
    /// When the text is no RFC 3339 timestamp.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<jiff::Timestamp>()
            .map(jiff::Timestamp::as_millisecond)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_classes_cover_the_labels_sluice_writes() {
        assert_eq!(outcome_class("ok", 200), "ok");
        assert_eq!(outcome_class("client_abort", 0), "client_abort");
        assert_eq!(outcome_class("stream_error", 200), "upstream_error");
        assert_eq!(outcome_class("shutdown", 200), "shutdown");
        assert_eq!(outcome_class("budget_exceeded", 200), "rejected");
        assert_eq!(outcome_class("upstream_unavailable", 503), "upstream_error");
        assert_eq!(outcome_class("tenant_rpm", 429), "rejected");
        assert_eq!(outcome_class("queue_full", 503), "rejected");
        assert_eq!(outcome_class("invalid_request", 400), "invalid_request");
        assert_eq!(outcome_class("forbidden", 403), "unauthorized");
        assert_eq!(outcome_class("something_new", 402), "rejected");
        assert_eq!(outcome_class("internal", 500), "error");
        for l in ["ok", "client_abort", "x"] {
            assert!(OUTCOMES.contains(&outcome_class(l, 500)));
        }
    }

    #[test]
    fn time_is_rfc3339_utc_with_milliseconds_both_ways() {
        assert_eq!(rfc3339_ms::format(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_ms::format(1_796_169_000_123),
            "2026-12-01T23:50:00.123Z"
        );
        let r: UsageRecord = serde_json::from_value(serde_json::json!({
            "time": "2026-12-01T23:50:00.123Z", "request_id": "r", "tenant": "t",
            "virtual_key": "k", "model": "m", "provider": null, "upstream_model": null,
            "input_tokens": 1, "output_tokens": 2, "cached_input_tokens": 0,
            "cache_write_tokens": 0, "reasoning_tokens": 0, "estimated": false,
            "cost_usd": 0.0, "charge_usd": 0.0, "status": 200, "outcome": "ok",
            "ttft_ms": null, "duration_ms": 5, "fallback_depth": 0, "attempts": 1,
            "ingress": "chat"
        }))
        .unwrap();
        assert_eq!(r.time, 1_796_169_000_123);
        assert_eq!(r.resumptions, 0, "JSON from before the column reads as 0");
    }
}
