//! The `ledger:` settings after validation (the usage ledger itself, its writer and
//! backends live in [`crate::billing::ledger`], which re-exports these): kept in config so that config
//! depends on nothing above it.

use std::path::PathBuf;
use std::time::Duration;

use crate::secret::Secret;

/// Default SQLite file when the config has no `ledger:` section, relative to the working
/// directory of the process (made absolute at startup).
pub const DEFAULT_PATH: &str = "sluice-usage.db";

/// Default `ledger.flush_interval_ms`.
pub const DEFAULT_FLUSH_INTERVAL_MS: u64 = 200;

/// Default `ledger.queue_capacity`, records.
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;

/// Where the ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file (`ledger.path`, or [`DEFAULT_PATH`]).
    Sqlite {
        /// The database file.
        path: PathBuf,
    },
    /// A PostgreSQL database (`ledger.url`), shared by several replicas.
    Postgres {
        /// `postgres://user[:password]@host[:port]/db` (the password is never printed).
        url: Secret,
    },
}

/// `ledger:` after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// Whether usage records are written at all (`ledger.enabled`, default `true`).
    pub enabled: bool,
    /// The backend (kept when disabled, so the setting says where the ledger would be).
    pub backend: Backend,
    /// How often the writer drains the queue (`ledger.flush_interval_ms`).
    pub flush_interval: Duration,
    /// Records the queue holds before new ones are dropped (`ledger.queue_capacity`).
    pub queue_capacity: usize,
}

impl Default for LedgerSettings {
    /// Enabled, SQLite at [`DEFAULT_PATH`], 200 ms flush interval, 10 000 queued records.
    fn default() -> Self {
        Self {
            enabled: true,
            backend: Backend::Sqlite {
                path: PathBuf::from(DEFAULT_PATH),
            },
            flush_interval: Duration::from_millis(DEFAULT_FLUSH_INTERVAL_MS),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
        }
    }
}

impl LedgerSettings {
    /// The same settings with a relative SQLite path made absolute against the current
    /// working directory (done once at startup, before `-d` changes the directory).
    pub fn absolute(mut self) -> Self {
        if let Backend::Sqlite { path } = &mut self.backend {
            if let Ok(p) = std::path::absolute(&*path) {
                *path = p;
            }
        }
        self
    }
}

/// Checks a `ledger.url` without connecting; the message for the config error.
///
/// # Errors
/// A message when the URL does not parse or asks for TLS.
pub fn check_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err("must start with postgres:// or postgresql://".into());
    }
    let cfg: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
    if cfg.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        return Err(
            "sslmode=require is not supported (Sluice connects without TLS: use a private network or a local TLS tunnel)"
                .into(),
        );
    }
    Ok(())
}
