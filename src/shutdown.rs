//! Owns graceful shutdown of open streams. On SIGTERM/SIGQUIT Pingora stops accepting and
//! broadcasts shutdown; open streams may then run for `server.shutdown_grace_ms`, after which
//! [`streams_cancelled`] resolves everywhere and each remaining stream closes its upstream and
//! ends with an SSE error event.

use std::sync::Arc;
use std::sync::LazyLock;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::watch;

use crate::config::ConfigHandle;

static CANCEL: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::channel(false).0);

/// Resolves once the shutdown grace period is over (pends forever before that).
pub async fn streams_cancelled() {
    let mut rx = CANCEL.subscribe();
    let _ = rx.wait_for(|v| *v).await;
}

/// Whether the process is shutting down and the grace period is over.
pub fn is_cancelled() -> bool {
    *CANCEL.borrow()
}

/// The background service that times the grace period.
#[derive(Debug)]
pub struct StreamShutdown {
    config: Arc<ConfigHandle>,
}

impl StreamShutdown {
    /// Reads the grace period from `config` when shutdown starts.
    pub fn new(config: Arc<ConfigHandle>) -> Self {
        Self { config }
    }
}

#[async_trait]
impl BackgroundService for StreamShutdown {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.changed().await.is_err() {
            return;
        }
        let grace = self.config.snapshot().server.shutdown_grace;
        log::info!(
            "shutting down: open streams have {} ms to finish",
            grace.as_millis()
        );
        tokio::time::sleep(grace).await;
        log::info!("shutdown grace period over: cancelling open streams");
        CANCEL.send_replace(true);
    }
}
