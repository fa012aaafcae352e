//! Owns the process's one Redis connection (`redis: {url, timeout_ms, replicas}`) and its
//! health: the lazily connecting `ConnectionManager` (recreated when `redis.url` changes on
//! reload), the up/down state that makes shared limits and budgets fail open to local ones,
//! the `PING` probe that brings it back, and request ids for the window logs. Used by the
//! distributed rate limits (`crate::backpressure::redis`) and the shared tenant budgets
//! (`crate::billing::budget`), neither of which owns it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::schema::RedisSection;
use crate::metrics::metrics;

/// Bound of a connection attempt made off the request path.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a check did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No answer within `redis.timeout_ms`.
    #[error("no answer within {0} ms")]
    Timeout(u128),
    /// Connection or protocol error.
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    /// The script answered something unexpected.
    #[error("unexpected script answer")]
    Malformed,
}

impl BackendError {
    /// `sluice_ratelimit_backend_errors_total{kind}` label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Redis(_) | Self::Malformed => "error",
        }
    }
}

struct Conn {
    url: String,
    manager: ConnectionManager,
}

/// The Redis backend of one process, shared by the admission path (checks), tenant budgets
/// and the background service (probes). Its `Debug` hides URL credentials.
pub struct SharedRedis {
    /// The configured section (`None`: Redis not configured); updated on reload.
    settings: ArcSwapOption<RedisSection>,
    conn: ArcSwapOption<Conn>,
    create: Mutex<()>,
    up: AtomicBool,
    id_prefix: u64,
    seq: AtomicU64,
}

impl std::fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRedis")
            .field(
                "url",
                &self.settings.load().as_ref().map(|s| redact(&s.url)),
            )
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

impl SharedRedis {
    /// A backend for `settings` (nothing connects until the first check or probe).
    pub fn new(settings: Option<&RedisSection>) -> Self {
        Self {
            settings: ArcSwapOption::from(settings.cloned().map(Arc::new)),
            conn: ArcSwapOption::empty(),
            create: Mutex::new(()),
            up: AtomicBool::new(true),
            id_prefix: fastrand::u64(..),
            seq: AtomicU64::new(0),
        }
    }

    /// Applies a reloaded `redis:` section.
    pub fn reconfigure(&self, settings: Option<&RedisSection>) {
        self.settings.store(settings.cloned().map(Arc::new));
    }

    /// The configured `redis:` section, if any.
    pub fn settings(&self) -> Option<Arc<RedisSection>> {
        self.settings.load_full()
    }

    /// Whether checks go to Redis (configured and not marked down).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// A unique request id for the window logs.
    pub fn next_member(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n:x}", self.id_prefix)
    }

    /// The connection manager for `url`, created (lazily connecting) when missing or when
    /// the URL changed. Must run inside a Tokio runtime.
    ///
    /// # Errors
    /// [`BackendError::Redis`] when `url` is not a valid Redis URL.
    pub fn connection(&self, url: &str) -> Result<ConnectionManager, BackendError> {
        if let Some(c) = self.conn.load().as_ref().filter(|c| c.url == url) {
            return Ok(c.manager.clone());
        }
        let _g = self
            .create
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = self.conn.load().as_ref().filter(|c| c.url == url) {
            return Ok(c.manager.clone());
        }
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
            .set_connection_timeout(Some(BACKGROUND_TIMEOUT))
            .set_response_timeout(None);
        let manager = ConnectionManager::new_lazy_with_config(client, config)?;
        self.conn.store(Some(Arc::new(Conn {
            url: url.to_string(),
            manager: manager.clone(),
        })));
        Ok(manager)
    }

    /// Marks the backend down after a failed check; logs once per outage.
    pub fn mark_down(&self, e: &BackendError) {
        metrics()
            .ratelimit_backend_errors_total
            .with_label_values(&[e.kind()])
            .inc();
        if self.up.swap(false, Ordering::AcqRel) {
            let s = self.settings.load();
            let (url, replicas) = s
                .as_ref()
                .map_or(("-".into(), 1), |s| (redact(&s.url), s.replicas));
            log::warn!(target: "sluice::backpressure::redis",
                "rate-limit backend {url} unavailable ({e}); failing open to local limits (limit / {replicas} replicas) until it answers again"
            );
        }
    }

    fn mark_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            log::info!(target: "sluice::backpressure::redis", "rate-limit backend recovered; shared limits apply again");
        }
    }

    /// One probe of a down backend: `PING`; success marks it up.
    pub async fn probe(&self) {
        let Some(s) = self.settings.load_full() else {
            return;
        };
        if self.is_up() {
            return;
        }
        let Ok(mut conn) = self.connection(&s.url) else {
            return;
        };
        let ping = redis::cmd("PING");
        let bound = Duration::from_millis(s.timeout_ms.max(1)).max(Duration::from_millis(200));
        if let Ok(Ok(())) = tokio::time::timeout(bound, ping.exec_async(&mut conn)).await {
            self.mark_up();
        }
    }
}

/// `redis://user:secret@host` → `redis://host` for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &url[..s + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact("redis://u:pw@127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
