//! Owns graceful shutdown of open streams. On SIGTERM/SIGQUIT Pingora stops accepting and
//! broadcasts shutdown; open streams may then run for `server.shutdown_grace_ms`, after which
//! [`streams_cancelled`] resolves everywhere and each remaining stream closes its upstream and
//! ends with an SSE error event.
//!
//! The process exits as soon as no request is in flight ([`InFlight`] counts them), instead of
//! sleeping through Pingora's whole grace period when there is nothing left to finish. Just
//! before it exits, the hooks registered with [`StreamShutdown::on_exit`] run (the server
//! registers the usage ledger's flush), so this module knows nothing of what they write.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::watch;

use crate::live::ConfigHandle;

static CANCEL: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::channel(false).0);

/// Set when shutdown starts (before the grace period).
static STARTED: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::channel(false).0);

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts one downstream request while it is alive (held in the request context).
#[derive(Debug)]
pub struct InFlight(());

impl InFlight {
    /// Starts counting a request.
    pub fn new() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        Self(())
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Requests currently in flight.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Acquire)
}

/// Polls until no request is in flight or `limit` passes; whether it drained.
async fn drained_within(limit: Duration) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if in_flight() == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ends the process once shutdown has nothing left to do.
#[expect(
    clippy::exit,
    reason = "Pingora would otherwise sleep out its whole grace period"
)]
fn exit_now(hooks: &[ExitHook]) -> ! {
    run_hooks(hooks);
    log::info!("no requests in flight: exiting");
    std::process::exit(0)
}

/// Work that must be done before the process exits (e.g. writing queued records); run in
/// registration order, each at most once per exit path.
pub type ExitHook = Box<dyn Fn() + Send + Sync>;

/// Runs every exit hook in order.
fn run_hooks(hooks: &[ExitHook]) {
    for h in hooks {
        h();
    }
}

/// Resolves once shutdown started (SIGTERM/SIGQUIT, or a graceful upgrade's handover; pends
/// forever before that). Work that only serves requests this process can no longer accept
/// (a resumable stream no client reads: its resume would reach the next process) ends here
/// rather than at the end of the grace period.
pub async fn started() {
    let mut rx = STARTED.subscribe();
    let _ = rx.wait_for(|v| *v).await;
}

/// Resolves once the shutdown grace period is over (pends forever before that).
pub async fn streams_cancelled() {
    let mut rx = CANCEL.subscribe();
    let _ = rx.wait_for(|v| *v).await;
}

/// The background service that times the grace period.
pub struct StreamShutdown {
    config: Arc<ConfigHandle>,
    hooks: Vec<ExitHook>,
}

impl std::fmt::Debug for ExitHooks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} exit hooks", self.0.len())
    }
}

/// Debug view of the hooks (closures have no `Debug`).
struct ExitHooks<'a>(&'a [ExitHook]);

impl std::fmt::Debug for StreamShutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamShutdown")
            .field("config", &self.config)
            .field("hooks", &ExitHooks(&self.hooks))
            .finish()
    }
}

impl StreamShutdown {
    /// Reads the grace period from `config` when shutdown starts.
    pub fn new(config: Arc<ConfigHandle>) -> Self {
        Self {
            config,
            hooks: Vec::new(),
        }
    }

    /// Adds `hook` to what runs just before the process exits at the end of a shutdown (and,
    /// when requests outlive the grace period, before Pingora ends the process).
    #[must_use]
    pub fn on_exit(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.push(Box::new(hook));
        self
    }
}

#[async_trait]
impl BackgroundService for StreamShutdown {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.changed().await.is_err() {
            return;
        }
        STARTED.send_replace(true);
        let grace = self.config.snapshot().server.shutdown_grace;
        log::info!(
            "shutting down: open streams have {} ms to finish",
            grace.as_millis()
        );
        // Give requests accepted just before the signal a moment to register.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if drained_within(grace.saturating_sub(Duration::from_millis(100))).await {
            exit_now(&self.hooks);
        }
        log::info!("shutdown grace period over: cancelling open streams");
        CANCEL.send_replace(true);
        // Cancelled streams write their error events and finish; then nothing is left.
        if drained_within(Duration::from_secs(1)).await {
            exit_now(&self.hooks);
        }
        // Pingora ends the process at the end of its grace period: write what is queued
        // now (a request still finishing after this loses its record at most).
        run_hooks(&self.hooks);
    }
}
