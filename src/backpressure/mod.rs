//! Owns admission control: the global cap on concurrent upstream requests with a bounded FIFO
//! wait queue (`server.max_concurrent_upstream_requests`, `queue_size`, `queue_timeout_ms`).
//!
//! A request over the cap waits in the queue (tokio's semaphore is FIFO-fair) for up to
//! `queue_timeout_ms`; a full queue or a timeout answers 503 with `Retry-After`. A queued client
//! that disconnects leaves the queue at once. No lock is held across an await.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pingora::proxy::Session;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Caller;
use crate::config::Config;
use crate::error::GatewayError;
use crate::metrics::metrics;

/// Why admission failed.
#[derive(Debug)]
pub enum Rejected {
    /// Tell the client (429/503 with `Retry-After`).
    Client(GatewayError),
    /// The client left while queued.
    Gone,
}

/// Held while a request is in flight; dropping it frees the slot.
#[derive(Debug)]
pub struct AdmissionPermit {
    _global: OwnedSemaphorePermit,
}

/// Process-wide admission state.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    capacity: AtomicUsize,
    waiting: AtomicUsize,
}

/// Decrements the queue depth on drop (also when the waiting future is cancelled).
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        metrics().admission_queue_depth.dec();
    }
}

impl Admission {
    /// Admission sized by `config.server`.
    pub fn new(config: &Config) -> Self {
        let cap = config.server.max_concurrent_upstream_requests;
        Self {
            slots: Arc::new(Semaphore::new(cap)),
            capacity: AtomicUsize::new(cap),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Applies a reloaded `max_concurrent_upstream_requests` (in-flight requests keep their
    /// slots; a smaller cap takes effect as they finish).
    pub fn resize(&self, config: &Config) {
        let new = config.server.max_concurrent_upstream_requests;
        let old = self.capacity.swap(new, Ordering::AcqRel);
        if new > old {
            self.slots.add_permits(new - old);
        } else if new < old {
            let mut remaining = old - new;
            remaining -= self.slots.forget_permits(remaining);
            if remaining > 0 {
                // Take the rest as they are released.
                let slots = self.slots.clone();
                tokio::spawn(async move {
                    if let Ok(p) = slots
                        .acquire_many_owned(u32::try_from(remaining).unwrap_or(u32::MAX))
                        .await
                    {
                        p.forget();
                    }
                });
            }
        }
    }

    /// Requests currently waiting.
    pub fn queue_depth(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Admits a request or says why not.
    ///
    /// # Errors
    /// [`Rejected::Client`] with a 503 (`queue_full`, `queue_timeout`);
    /// [`Rejected::Gone`] when the client disconnects while queued.
    pub async fn admit(
        &self,
        session: &mut Session,
        _caller: &Caller,
        config: &Config,
        _estimated_input_tokens: u64,
    ) -> Result<AdmissionPermit, Rejected> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(AdmissionPermit { _global: p });
        }
        let queue_size = config.server.queue_size;
        let timeout = config.server.queue_timeout;
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= queue_size {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            metrics()
                .rejected_total
                .with_label_values(&["queue_full"])
                .inc();
            return Err(Rejected::Client(GatewayError::Overloaded {
                message: "the gateway is at capacity and its queue is full; retry later".into(),
                reason: "queue_full",
                retry_after: timeout.max(Duration::from_secs(1)),
            }));
        }
        metrics().admission_queue_depth.inc();
        let _queued = Queued(&self.waiting);
        let started = tokio::time::Instant::now();
        let acquired = tokio::select! {
            r = tokio::time::timeout(timeout, self.slots.clone().acquire_owned()) => r,
            _ = session.downstream_session.read_body_or_idle(true) => return Err(Rejected::Gone),
        };
        metrics()
            .admission_wait_seconds
            .observe(started.elapsed().as_secs_f64());
        match acquired {
            Ok(Ok(p)) => Ok(AdmissionPermit { _global: p }),
            Ok(Err(_)) | Err(_) => {
                metrics()
                    .rejected_total
                    .with_label_values(&["queue_timeout"])
                    .inc();
                Err(Rejected::Client(GatewayError::Overloaded {
                    message: format!(
                        "the gateway is at capacity; no slot freed within {} ms",
                        timeout.as_millis()
                    ),
                    reason: "queue_timeout",
                    retry_after: timeout.max(Duration::from_secs(1)),
                }))
            }
        }
    }
}
