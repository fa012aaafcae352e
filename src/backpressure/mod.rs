//! Owns admission control: whether a request may go upstream now, later, or not at all.
//!
//! In order, for `POST /v1/chat/completions`:
//!
//! 0. **Request buffers** (`server.max_buffered_request_bytes`): the memory all request
//!    bodies hold at once, each body byte counted twice ([`buffers`]), reserved from the head
//!    when the length is announced; over → 503 `request_buffers_full` with `Retry-After`.
//! 1. **Tenant concurrency** (`tenants.<id>.max_concurrent_streams`, and per standard model
//!    under `model_limits`): exact per-process counters ([`tenant`]); over → 429
//!    `tenant_concurrency`. The tenant-wide slot is taken from the request head, before the
//!    body is read ([`Admission::take_tenant_slot`]: a tenant at its limit cannot make Sluice
//!    buffer more bodies); the tenant × model slot once the body named the model.
//! 2. **Tenant request and token rates** (`requests_per_minute`, `tokens_per_minute` over
//!    `server.rate_limit_window_ms`): with `redis:` configured, one atomic script call shared by
//!    all replicas ([`redis`]); without it, or while Redis is slow or down, the local
//!    sliding-window estimate ([`tenant`]) with the limit divided by `redis.replicas`. Over →
//!    429 `tenant_rpm` / `tenant_tpm`. Input tokens are estimated here and settled with the
//!    real `usage` when the request ends ([`AdmissionPermit::settle`]).
//! 3. **The global cap** on concurrent upstream requests
//!    (`server.max_concurrent_upstream_requests`) with a bounded FIFO wait queue
//!    (`queue_size`, `queue_timeout_ms`; tokio's semaphore is FIFO-fair). A full queue or a
//!    timeout answers 503 with `Retry-After` (and refunds step 2); a queued client that
//!    disconnects leaves the queue at once.
//!
//! Tenant limits come before the queue so that a tenant over its limit never takes a queue
//! place from others. Every response to an authenticated request carries OpenAI's
//! `x-ratelimit-*` headers ([`status`]). No lock is held across an await; every wait is
//! bounded (queue timeout, `redis.timeout_ms`).

pub mod buffers;
pub mod provider;
pub mod redis;
pub mod status;
pub mod tenant;
pub mod trim;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::proxy::Session;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use buffers::{BufferReservation, BuffersFull, RequestBuffers};
pub use status::{LimitState, RateLimitStatus};
pub use tenant::counts_tokens;
use tenant::{Inflight, InflightGuard, LimitKind, LocalLimiter, Plan, Refusal, Windows};

use crate::config::Config;
use crate::error::GatewayError;
use crate::metrics::metrics;
use redis::{BackendError, RedisLimiter, Settle};

/// What admission needs to know about a request: who it is billed to and what it asks for.
/// Admission knows no request context type: the caller passes these (the proxy's context
/// lives above it on the request path).
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    /// The authenticated caller's tenant (`None`: no tenant limits apply).
    pub tenant: Option<&'a str>,
    /// The standard model asked for (tenant × model limits).
    pub model: Option<&'a str>,
    /// Estimated input tokens, charged to the token windows until [`AdmissionPermit::settle`]
    /// (read only when a token limit applies, see [`counts_tokens`]: 0 will do otherwise).
    pub estimated_input_tokens: u64,
}

/// A finished request's real token use, for [`AdmissionPermit::settle`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    /// A provider answered (its input is charged at the estimate when it reported none).
    pub answered: bool,
    /// Input tokens reported by the upstream `usage` (0: none reported).
    pub input_tokens: u64,
    /// Output tokens (from `usage`, else counted events).
    pub output_tokens: u64,
}

impl Used {
    /// The token use admission settles a finished request's charge with.
    pub fn of(outcome: &crate::outcome::Outcome) -> Self {
        Self {
            answered: outcome.provider.is_some(),
            input_tokens: outcome.input_tokens,
            output_tokens: outcome.output_tokens,
        }
    }
}

/// Why admission failed.
#[derive(Debug)]
pub enum Rejected {
    /// Tell the client (429/503 with `Retry-After`).
    Client(GatewayError),
    /// The client left while queued.
    Gone,
}

/// Held while a request is in flight; dropping it frees its global slot and tenant
/// concurrency slots. Call [`AdmissionPermit::settle`] when the request is done so token
/// limits see the real usage (dropping it unsettled keeps the estimate charged).
#[derive(Debug)]
pub struct AdmissionPermit {
    _global: OwnedSemaphorePermit,
    tenant: TenantPermit,
}

impl AdmissionPermit {
    /// Corrects the tenant's token windows with the request's real usage (input from
    /// `usage`, else the estimate when an upstream answered, else 0; plus output tokens), then
    /// releases everything.
    pub fn settle(self, used: Used) {
        self.tenant.settle(used);
    }
}

/// A tenant-wide concurrency slot taken from the request head, before the body is read
/// ([`Admission::take_tenant_slot`]); [`Admission::admit`] keeps it instead of taking a
/// second one. Empty when the tenant has no `max_concurrent_streams`. Released on drop.
#[derive(Debug, Default)]
pub struct TenantSlot(Option<InflightGuard>);

/// What a request holds against its tenant's limits.
#[derive(Debug, Default)]
pub struct TenantPermit {
    _inflight: Inflight,
    charge: Option<Charge>,
}

/// The rate charge of an admitted request, for settlement or refund.
#[derive(Debug)]
struct Charge {
    windows: Arc<Windows>,
    plan: Plan,
    /// Estimated input tokens charged at admission.
    cost: u64,
    /// Set when Redis admitted the request: its backend and window-log member.
    remote: Option<(Arc<RedisLimiter>, String)>,
}

/// Queues the Redis settlement (`actual` tokens) or refund (`None`: remove the entry) of a
/// request recorded as `member` in `plan`'s scopes with `cost` estimated tokens.
fn settle_remote(
    backend: &RedisLimiter,
    plan: &Plan,
    cost: u64,
    member: &str,
    actual: Option<u64>,
) {
    let scopes: Vec<_> = plan
        .items()
        .filter(|i| {
            if actual.is_some() {
                i.limits.tokens.is_some()
            } else {
                i.limits.has_rates()
            }
        })
        .map(|i| (i.clone(), if i.limits.tokens.is_some() { cost } else { 0 }))
        .collect();
    if !scopes.is_empty() {
        backend.enqueue(Settle {
            scopes,
            member: member.to_string(),
            actual,
        });
    }
}

impl TenantPermit {
    /// See [`AdmissionPermit::settle`].
    pub fn settle(mut self, used: Used) {
        let Some(c) = self.charge.take() else {
            return;
        };
        let input = if used.input_tokens > 0 {
            used.input_tokens
        } else if used.answered {
            c.cost
        } else {
            0
        };
        let actual = input.saturating_add(used.output_tokens);
        if actual == c.cost {
            return;
        }
        let delta = i64::try_from(actual)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(c.cost).unwrap_or(i64::MAX));
        c.windows.adjust_tokens(&c.plan, delta);
        if let Some((backend, member)) = &c.remote {
            settle_remote(backend, &c.plan, c.cost, member, Some(actual));
        }
    }

    /// Undoes the rate charge (the request was admitted by its tenant but not served).
    fn refund(mut self) {
        let Some(c) = self.charge.take() else {
            return;
        };
        c.windows.charge(&c.plan, c.cost, -1);
        if let Some((backend, member)) = &c.remote {
            settle_remote(backend, &c.plan, c.cost, member, None);
        }
    }
}

/// Process-wide admission state.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    capacity: AtomicUsize,
    waiting: AtomicUsize,
    local: LocalLimiter,
    redis: Arc<RedisLimiter>,
    buffers: RequestBuffers,
    budgets: Arc<crate::billing::budget::Budgets>,
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
    /// Admission sized by `config.server`, with `config.redis` as the shared backend.
    pub fn new(config: &Config) -> Self {
        let cap = config.server.max_concurrent_upstream_requests;
        let redis = Arc::new(RedisLimiter::new(config.redis.as_ref()));
        let budgets = Arc::new(crate::billing::budget::Budgets::new(redis.shared().clone()));
        budgets.warm_later(config);
        Self {
            slots: Arc::new(Semaphore::new(cap)),
            capacity: AtomicUsize::new(cap),
            waiting: AtomicUsize::new(0),
            local: LocalLimiter::new(config.server.rate_limit_window),
            redis,
            buffers: RequestBuffers::new(),
            budgets,
        }
    }

    /// The tenants' budgets (sharing this admission's Redis backend).
    pub fn budgets(&self) -> &Arc<crate::billing::budget::Budgets> {
        &self.budgets
    }

    /// The process-wide request body budget (step 0).
    pub fn buffers(&self) -> &RequestBuffers {
        &self.buffers
    }

    /// The 503 of a request whose body does not fit in `server.max_buffered_request_bytes`
    /// (counted in `sluice_rejected_total{reason="request_buffers_full"}`).
    pub fn buffers_full(full: BuffersFull) -> GatewayError {
        metrics()
            .rejected_total
            .with_label_values(&["request_buffers_full"])
            .inc();
        GatewayError::Overloaded {
            message: format!(
                "the gateway holds its limit of {} bytes of request bodies; retry shortly",
                full.max_bytes
            ),
            reason: "request_buffers_full",
            retry_after: Duration::from_secs(1),
        }
    }

    /// Step 1 for the tenant scope alone, from the request head: takes the tenant's
    /// `max_concurrent_streams` slot (if it has one) before the body is read. Pass the slot
    /// to [`Self::admit`].
    ///
    /// # Errors
    /// A 429 `tenant_concurrency` [`GatewayError::RateLimited`] (and `status` set for the
    /// `x-ratelimit-*` headers).
    pub fn take_tenant_slot(
        &self,
        config: &Config,
        tenant: &str,
        status: &mut Option<RateLimitStatus>,
    ) -> Result<TenantSlot, GatewayError> {
        let plan = self.local.plan(config, tenant, None);
        match self.local.acquire_tenant_concurrency(&plan) {
            Ok(g) => Ok(TenantSlot(g)),
            Err(r) => {
                *status = self.status(config, tenant, None);
                Err(refuse(config, tenant, None, &r))
            }
        }
    }

    /// The background service of the limits (add it to the server once): keeps the local
    /// windows on time, probes a down Redis and writes token settlements.
    pub fn limits_service(self: &Arc<Self>) -> LimitsService {
        LimitsService(self.clone())
    }

    /// Applies a reloaded config: the global cap (in-flight requests keep their slots; a
    /// smaller cap takes effect as they finish), the rate window (a new length starts empty
    /// windows) and the `redis:` section. Tenant limits are read per request from its snapshot.
    pub fn reconfigure(&self, config: &Config) {
        self.budgets.warm_later(config);
        self.budgets.warm();
        self.local.set_window(config.server.rate_limit_window);
        self.redis.reconfigure(config.redis.as_ref());
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

    /// The per-process tenant limiter (for benches and tests).
    pub fn local(&self) -> &LocalLimiter {
        &self.local
    }

    /// Admits a request of `demand` under `config`, or says why not. Writes the tenant's limit
    /// status for the response headers into `status` either way. `slot` is the tenant slot taken from the head
    /// ([`Self::take_tenant_slot`]; the default when none was taken): it is kept, not taken
    /// twice.
    ///
    /// # Errors
    /// [`Rejected::Client`] with a 429 (`tenant_concurrency`, `tenant_rpm`, `tenant_tpm`) or a
    /// 503 (`queue_full`, `queue_timeout`); [`Rejected::Gone`] when the client disconnects while
    /// queued.
    pub async fn admit(
        &self,
        session: &mut Session,
        config: &Config,
        demand: Demand<'_>,
        status: &mut Option<RateLimitStatus>,
        slot: TenantSlot,
    ) -> Result<AdmissionPermit, Rejected> {
        let tenant = self
            .admit_tenant_holding(
                config,
                demand.tenant,
                demand.model,
                demand.estimated_input_tokens,
                status,
                slot,
            )
            .await
            .map_err(Rejected::Client)?;
        match self.admit_global(session, config).await {
            Ok(global) => Ok(AdmissionPermit {
                _global: global,
                tenant,
            }),
            Err(e) => {
                tenant.refund();
                Err(e)
            }
        }
    }

    /// The request and token status of `tenant` (× `model`) without charging anything, for
    /// responses that are not admitted themselves (e.g. `/v1/models`, early errors). `None`
    /// when the tenant has no request or token limit.
    pub fn status(
        &self,
        config: &Config,
        tenant: &str,
        model: Option<&str>,
    ) -> Option<RateLimitStatus> {
        let plan = self.local.plan(config, tenant, model);
        if !plan.has_rates() {
            return None;
        }
        let share = match config.redis.as_ref() {
            Some(_) if self.redis.is_up() => {
                // What Redis said last; until it said anything, this replica's own view.
                let remote: Option<Vec<RateLimitStatus>> = plan
                    .items()
                    .filter(|i| i.limits.has_rates())
                    .map(|i| i.state.remote())
                    .collect();
                if let Some(all) = remote {
                    let mut out = RateLimitStatus::default();
                    all.into_iter().for_each(|s| out.merge(s));
                    return Some(out);
                }
                1
            }
            Some(r) => r.replicas,
            None => 1,
        };
        Some(self.local.windows().status(&plan, share))
    }

    /// Steps 1 and 2: tenant concurrency and rates (through Redis when configured and up),
    /// keeping a tenant slot already taken. Writes the status to report into `status`.
    async fn admit_tenant_holding(
        &self,
        config: &Config,
        tenant: Option<&str>,
        model: Option<&str>,
        cost: u64,
        status: &mut Option<RateLimitStatus>,
        slot: TenantSlot,
    ) -> Result<TenantPermit, GatewayError> {
        let Some((tenant, plan, inflight)) = self.begin(config, tenant, model, status, slot)?
        else {
            return Ok(TenantPermit::default());
        };
        if !plan.has_rates() {
            return Ok(TenantPermit {
                _inflight: inflight,
                charge: None,
            });
        }
        let windows = self.local.windows();
        let share = match config.redis.as_ref() {
            Some(rs) if self.redis.is_up() => {
                let member = self.redis.next_member();
                match self
                    .redis
                    .check(rs, windows.length, &plan, &member, cost)
                    .await
                {
                    Ok(v) => {
                        *status = Some(v.status);
                        if let Some(r) = v.refused {
                            return Err(refuse(config, tenant, model, &r));
                        }
                        // Keep the local view warm: it decides alone if Redis goes away.
                        windows.charge(&plan, cost, 1);
                        return Ok(TenantPermit {
                            _inflight: inflight,
                            charge: Some(Charge {
                                windows,
                                plan,
                                cost,
                                remote: Some((self.redis.clone(), member)),
                            }),
                        });
                    }
                    Err(e) => {
                        self.redis.mark_down(&e);
                        if matches!(e, BackendError::Timeout(_)) {
                            // The script may still run late: take its entry out again.
                            settle_remote(&self.redis, &plan, cost, &member, None);
                        }
                        rs.replicas
                    }
                }
            }
            Some(rs) => {
                metrics()
                    .ratelimit_backend_errors_total
                    .with_label_values(&["unavailable"])
                    .inc();
                rs.replicas
            }
            None => 1,
        };
        self.finish_local(config, tenant, model, (plan, inflight), cost, share, status)
    }

    /// Steps 1 and 2 on the local limiter only, with every request and token limit divided
    /// by `share` (1, or `redis.replicas` when failing open). Never waits: this is the whole
    /// tenant admission when no `redis:` is configured.
    ///
    /// # Errors
    /// A 429 [`GatewayError::RateLimited`] naming the limit.
    pub fn admit_tenant_local(
        &self,
        config: &Config,
        tenant: Option<&str>,
        model: Option<&str>,
        cost: u64,
        share: u32,
        status: &mut Option<RateLimitStatus>,
    ) -> Result<TenantPermit, GatewayError> {
        let Some((tenant, plan, inflight)) =
            self.begin(config, tenant, model, status, TenantSlot::default())?
        else {
            return Ok(TenantPermit::default());
        };
        self.finish_local(config, tenant, model, (plan, inflight), cost, share, status)
    }

    /// The scopes of the request and its concurrency slots (keeping the tenant slot in
    /// `slot` when one was taken from the head); `None` when no limit applies.
    fn begin<'t>(
        &self,
        config: &Config,
        tenant: Option<&'t str>,
        model: Option<&str>,
        status: &mut Option<RateLimitStatus>,
        slot: TenantSlot,
    ) -> Result<Option<(&'t str, Plan, Inflight)>, GatewayError> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let plan = self.local.plan(config, tenant, model);
        if plan.is_empty() {
            return Ok(None);
        }
        match self.local.acquire_concurrency_holding(&plan, slot.0) {
            Ok(g) => Ok(Some((tenant, plan, g))),
            Err(r) => {
                *status = self.status(config, tenant, model);
                Err(refuse(config, tenant, model, &r))
            }
        }
    }

    /// The local rate check of step 2.
    #[expect(
        clippy::too_many_arguments,
        reason = "private; the request's parts, spelled out"
    )]
    fn finish_local(
        &self,
        config: &Config,
        tenant: &str,
        model: Option<&str>,
        (plan, inflight): (Plan, Inflight),
        cost: u64,
        share: u32,
        status: &mut Option<RateLimitStatus>,
    ) -> Result<TenantPermit, GatewayError> {
        if !plan.has_rates() {
            return Ok(TenantPermit {
                _inflight: inflight,
                charge: None,
            });
        }
        let windows = self.local.windows();
        match windows.check(&plan, cost, share) {
            Ok(s) => {
                *status = Some(s);
                Ok(TenantPermit {
                    _inflight: inflight,
                    charge: Some(Charge {
                        windows,
                        plan,
                        cost,
                        remote: None,
                    }),
                })
            }
            Err((r, s)) => {
                *status = Some(s);
                Err(refuse(config, tenant, model, &r))
            }
        }
    }

    /// A global slot if one is free now (the admission fast path, no queueing).
    pub fn try_admit_global(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Step 3: a global slot, waiting in the bounded FIFO queue when none is free.
    async fn admit_global(
        &self,
        session: &mut Session,
        config: &Config,
    ) -> Result<OwnedSemaphorePermit, Rejected> {
        if let Some(p) = self.try_admit_global() {
            return Ok(p);
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
            Ok(Ok(p)) => Ok(p),
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

/// The 429 for a refusal (counted in `sluice_rejected_total{reason}`), worded like OpenAI's:
/// which limit, its value, what is used and requested, and when to retry.
fn refuse(config: &Config, tenant: &str, model: Option<&str>, r: &Refusal) -> GatewayError {
    let reason = r.kind.reason();
    metrics().rejected_total.with_label_values(&[reason]).inc();
    let scope = match (r.model_scope, model) {
        (true, Some(m)) => format!("tenant `{tenant}` on model `{m}`"),
        _ => format!("tenant `{tenant}`"),
    };
    let window = config.server.rate_limit_window;
    let per = if window == Duration::from_secs(60) {
        "minute".to_string()
    } else {
        format!("{} window", status::format_reset(window))
    };
    let retry = status::format_reset(r.retry_after);
    let message = match r.kind {
        LimitKind::Concurrency => format!(
            "Concurrency limit reached for {scope}: Limit {} concurrent streams, Used {}. Please try again in {retry}.",
            r.limit, r.used
        ),
        LimitKind::Requests => format!(
            "Rate limit reached for {scope} on requests per {per} (RPM): Limit {}, Used {}, Requested {}. Please try again in {retry}.",
            r.limit, r.used, r.requested
        ),
        LimitKind::Tokens if r.requested > r.limit => format!(
            "Request too large for {scope} on tokens per {per} (TPM): Limit {}, Requested {}. Send fewer tokens.",
            r.limit, r.requested
        ),
        LimitKind::Tokens => format!(
            "Rate limit reached for {scope} on tokens per {per} (TPM): Limit {}, Used {}, Requested {}. Please try again in {retry}.",
            r.limit, r.used, r.requested
        ),
    };
    GatewayError::RateLimited {
        message,
        reason,
        retry_after: r.retry_after,
    }
}

/// The Pingora background service of [`Admission`]: ticks the local windows
/// ([`Windows::tick`]) and runs the Redis backend's loop ([`RedisLimiter::run`]) until
/// shutdown.
#[derive(Debug)]
pub struct LimitsService(Arc<Admission>);

#[async_trait]
impl BackgroundService for LimitsService {
    async fn start(&self, shutdown: ShutdownWatch) {
        // The budgets' figures from the ledger, now that a runtime runs.
        self.0.budgets.warm();
        let ticks = async {
            loop {
                let w = self.0.local.windows();
                tokio::time::sleep(w.tick_interval()).await;
                w.tick();
            }
        };
        tokio::select! {
            () = self.0.redis.run(shutdown) => {}
            () = ticks => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let yaml = "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\n  max_concurrent_upstream_requests: 1\ntenants:\n  t: {requests_per_minute: 2, tokens_per_minute: 100}\nvirtual_keys:\n  - key: sk-test-0001\n    tenant: t\nproviders:\n  p:\n    kind: demo\nmodels:\n  m/a:\n    routes:\n      - provider: p\n        upstream_model: a\n";
        Config::parse(std::path::Path::new("sluice.yaml"), yaml).unwrap()
    }

    #[test]
    fn tenant_admission_settles_refunds_and_names_the_limit() {
        let c = config();
        let adm = Admission::new(&c);
        let mut st = None;
        let a = adm
            .admit_tenant_local(&c, Some("t"), Some("m/a"), 30, 1, &mut st)
            .unwrap();
        assert_eq!(st.unwrap().tokens.unwrap().remaining, 70);
        // Real usage 50 + 40: the token window now holds 90.
        a.settle(Used {
            answered: true,
            input_tokens: 50,
            output_tokens: 40,
        });
        let status = adm.status(&c, "t", None).unwrap();
        assert_eq!(status.tokens.unwrap().remaining, 10);
        assert_eq!(status.requests.unwrap().remaining, 1);
        let e = adm
            .admit_tenant_local(&c, Some("t"), None, 30, 1, &mut st)
            .unwrap_err();
        assert_eq!(e.status(), 429);
        assert_eq!(e.metric_label(), "tenant_tpm");
        assert!(
            e.to_string().contains("Limit 100, Used 90, Requested 30"),
            "{e}"
        );
        // Admitted then refunded (the queue refused it): nothing stays charged.
        let b = adm
            .admit_tenant_local(&c, Some("t"), None, 5, 1, &mut st)
            .unwrap();
        b.refund();
        let b = adm
            .admit_tenant_local(&c, Some("t"), None, 5, 1, &mut st)
            .unwrap();
        assert_eq!(st.unwrap().requests.unwrap().remaining, 0);
        // An upstream that never answered consumed no tokens.
        b.settle(Used::default());
        assert_eq!(
            adm.status(&c, "t", None).unwrap().tokens.unwrap().remaining,
            10
        );
        let e = adm
            .admit_tenant_local(&c, Some("t"), None, 1, 1, &mut st)
            .unwrap_err();
        assert_eq!(e.metric_label(), "tenant_rpm");
        assert!(adm.try_admit_global().is_some());
    }
}
