//! Owns [`Gateway`]: the process-wide state behind the proxy service (the live config, the
//! upstream connector and its pools, admission, the passthrough routes). The `ProxyHttp`
//! shell (`super`) and the request steps below it read it; it knows none of them.

use std::sync::Arc;

use crate::backpressure::Admission;
use crate::engine::pool::Connector;
use crate::live::ConfigHandle;

/// How long an idle downstream keep-alive connection is kept, seconds.
pub const DOWNSTREAM_KEEPALIVE_S: u64 = 75;

/// The gateway: shared, immutable-per-process state behind the proxy service.
pub struct Gateway {
    /// Live configuration (hot-reloaded).
    pub config: Arc<ConfigHandle>,
    /// The upstream connector: one per process (it owns the connection pools; [`crate::engine::pool`]).
    pub connector: Connector,
    /// Admission control: global concurrency, queue, tenant limits.
    pub admission: Arc<Admission>,
    /// The passthrough routes (swapped by hot reload).
    pub passthrough: Arc<crate::passthrough::Router>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `config`.
    pub fn new(config: Arc<ConfigHandle>, admission: Arc<Admission>) -> Self {
        let passthrough = Arc::new(crate::passthrough::Router::new(&config.snapshot()));
        Self {
            config,
            connector: Connector::new(),
            admission,
            passthrough,
        }
    }
}
