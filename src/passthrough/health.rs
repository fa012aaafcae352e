//! Owns the schedule of the passthrough health checks: one Pingora background service that
//! runs, for every route of the live table with a `health_check`, a pass over its upstreams
//! every `interval_ms` (each route in its own task, so a slow upstream delays no other
//! route), and publishes the result in `sluice_passthrough_upstream_healthy`.
//!
//! A route's task holds it weakly: once a reload dropped the route and its last request
//! ended, the task stops. A reload wakes the service, which starts the tasks of new routes.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinHandle;

use super::{Route, Router};

/// The health-check service of a [`Router`]'s routes.
#[derive(Debug)]
pub struct HealthChecks {
    router: Arc<Router>,
}

impl HealthChecks {
    /// Checks the routes of `router`, following its reloads.
    pub fn new(router: Arc<Router>) -> Self {
        Self { router }
    }
}

/// Checks `route` every interval until it is gone (a route a reload removed but a request
/// still holds is checked, for that request, without reappearing in the metrics).
async fn run(router: Arc<Router>, route: Weak<Route>) {
    loop {
        let Some(r) = route.upgrade() else { return };
        let Some(interval) = r.spec.health_check.as_ref().map(|h| h.interval) else {
            return;
        };
        r.balancer.check().await;
        if router.table().routes().iter().any(|t| Arc::ptr_eq(t, &r)) {
            r.publish_health();
        }
        drop(r);
        tokio::time::sleep(interval).await;
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Keyed by the route's address, with the weak handle to tell a freed route's key
        // (reused by a new allocation) from a live one.
        let mut tasks: HashMap<usize, (Weak<Route>, JoinHandle<()>)> = HashMap::new();
        loop {
            tasks.retain(|_, (weak, task)| {
                let live = weak.strong_count() > 0 && !task.is_finished();
                if !live {
                    task.abort();
                }
                live
            });
            for r in self.router.table().routes() {
                if r.spec.health_check.is_none() {
                    continue;
                }
                let key = Arc::as_ptr(r) as usize;
                tasks.entry(key).or_insert_with(|| {
                    let weak = Arc::downgrade(r);
                    (weak.clone(), tokio::spawn(run(self.router.clone(), weak)))
                });
            }
            tokio::select! {
                _ = shutdown.changed() => break,
                () = self.router.changed.notified() => {}
            }
        }
        for (_, (_, task)) in tasks {
            task.abort();
        }
    }
}
