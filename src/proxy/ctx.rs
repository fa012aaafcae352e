//! Owns per-request state ([`RequestCtx`]), created in `new_ctx` and dropped when Pingora
//! finishes the request. Dropping it releases everything the request held (the active-stream
//! gauge, admission permits), which is how a client abort frees capacity.

use std::sync::Arc;
use tokio::time::Instant;

use crate::auth::Caller;
use crate::billing::metering::{CancelledHedge, Metered};
use crate::config::Config;
use crate::error::AttemptError;
use crate::outcome::Outcome;
use crate::protocol::ClientDialect;

/// Decrements `sluice_active_streams{tenant}` on drop.
#[derive(Debug)]
pub struct ActiveStreamGuard(Arc<prometheus::IntGauge>);

impl ActiveStreamGuard {
    /// Increments the gauge for `tenant` (resolved once per tenant, capped: see
    /// [`crate::metrics::series`]).
    pub fn new(tenant: &str) -> Self {
        let g = crate::metrics::series::active_streams(tenant);
        g.inc();
        Self(g)
    }
}

impl Drop for ActiveStreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What admission granted a request; dropping it releases everything (that is how a client
/// abort frees capacity).
#[derive(Debug, Default)]
pub struct Admission {
    /// Held while the request is proxied (`sluice_active_streams`).
    pub active: Option<ActiveStreamGuard>,
    /// Held admission permits (global concurrency, tenant concurrency); dropped with the ctx.
    pub permits: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// The tenant's request/token limit status for the `x-ratelimit-*` headers; `None` before
    /// authentication or when the tenant has no such limit.
    pub rate_limit: Option<crate::backpressure::RateLimitStatus>,
}

/// The upstream attempts of a request.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Failed attempts in order.
    pub failed: Vec<AttemptError>,
    /// Number of upstream attempts made (failed or not, same-route retries included).
    pub count: usize,
    /// Candidate routes that failed before the current one (same-route retries not counted).
    pub failed_routes: usize,
    /// Whether the response head has been written downstream (no fallback after this).
    pub downstream_committed: bool,
}

/// What a request costs.
#[derive(Debug, Default)]
pub struct Billing {
    /// The money reserved against the tenant's budget, settled in `logging` with the
    /// metered charge (dropped unsettled, it releases the money).
    pub budget: Option<crate::billing::budget::Reservation>,
    /// What the request used and costs, filled at its end (`logging`); `None` when no
    /// provider answered.
    pub metered: Option<Metered>,
    /// The attempts hedge races cancelled (at most one per attempt stage; empty, without an
    /// allocation, unless a hedge lost).
    pub cancelled_hedges: Vec<CancelledHedge>,
    /// A budgeted stream's output tokens at the last running-charge check its budget held
    /// (`crate::stream::budget`): a stream ended at the budget is metered at most at this.
    pub budget_output_tokens: Option<u64>,
    /// The input estimate the budget reservation was made with (tokens; 0 without a budget):
    /// a stream's running charge stands on it until the provider reports its input.
    pub budget_input_tokens: u64,
}

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    /// Config snapshot pinned for the whole request (reloads never change it mid-request).
    pub config: Arc<Config>,
    /// The providers of `config`, resolved (adapters, live credentials), pinned with it.
    pub registry: Arc<crate::providers::Registry>,
    /// When the request arrived.
    pub received: Instant,
    /// Request id (from a sane `x-request-id` or generated), echoed as `x-request-id`.
    pub request_id: String,
    /// `None` until authentication succeeds.
    pub caller: Option<Caller>,
    /// The standard model asked for; `None` before the body is parsed (or for `/v1/models`).
    pub standard_model: Option<String>,
    /// The standard model whose route is serving (or last tried) when it is not
    /// `standard_model`: a model-level fallback ([`crate::engine::fallback`]). `None` otherwise.
    pub answered_model: Option<String>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The wire API the client speaks (set by the endpoint): errors Sluice writes, the
    /// in-stream error event and heartbeats are in it.
    pub dialect: ClientDialect,
    /// What admission granted the request, held while it is proxied.
    pub admission: Admission,
    /// The upstream attempts made for it.
    pub attempts: Attempts,
    /// The result.
    pub outcome: Outcome,
    /// What it costs: the budget reservation, the metered usage, the cancelled hedges.
    pub billing: Billing,
    /// Counts this request as in flight (graceful shutdown waits for the count to reach 0).
    pub in_flight: crate::shutdown::InFlight,
    /// Set when the request matched a passthrough route (Pingora's native proxy path).
    pub passthrough: Option<crate::passthrough::PassCtx>,
    /// The client's address ([`crate::client_ip::client_ip`]), once the head is screened.
    pub client_ip: Option<std::net::IpAddr>,
    /// A Responses request to store once answered ([`crate::conversation::capture`]):
    /// what it brought, then what the client received.
    pub response_capture: Option<Box<crate::conversation::capture::Capture>>,
    /// The resumable stream of a streaming request that opted in
    /// ([`crate::stream::resume`]): every client write of the committed stream goes
    /// through it. `None` for every other request.
    pub resumable: Option<Box<crate::stream::resume::writer::Resumable>>,
}

impl RequestCtx {
    /// A fresh context pinned to `config`, with a registry built from it (for a snapshot
    /// not loaded through [`crate::live::ConfigHandle`]: tests and tools).
    pub fn new(config: Arc<Config>) -> Self {
        let registry = Arc::new(crate::providers::Registry::build(&config));
        Self::pinned(&crate::live::Live { config, registry })
    }

    /// A fresh context pinned to `live`: its config snapshot and registry.
    pub fn pinned(live: &crate::live::Live) -> Self {
        Self {
            config: live.config.clone(),
            registry: live.registry.clone(),
            received: Instant::now(),
            request_id: String::new(),
            caller: None,
            standard_model: None,
            answered_model: None,
            stream: false,
            dialect: ClientDialect::ChatCompletions,
            admission: Admission::default(),
            attempts: Attempts::default(),
            outcome: Outcome::default(),
            billing: Billing::default(),
            in_flight: crate::shutdown::InFlight::new(),
            passthrough: None,
            client_ip: None,
            response_capture: None,
            resumable: None,
        }
    }

    /// Fallback depth: how many candidate routes failed before the one serving now (0 when
    /// the first candidate served, even after a same-route retry; retries are counted in
    /// `sluice_upstream_retries_total` and the access log's `attempts`).
    pub fn fallback_depth(&self) -> usize {
        self.attempts.failed_routes
    }

    /// Gives every cancelled hedge attempt the request's input estimate (`estimate()`, the
    /// parsed request's cached estimate); never calls `estimate` when no hedge lost.
    pub fn fill_cancelled_hedges(&mut self, estimate: impl FnOnce() -> u64) {
        if self.billing.cancelled_hedges.is_empty() {
            return;
        }
        let input = estimate();
        for h in &mut self.billing.cancelled_hedges {
            h.input_tokens = input;
        }
    }

    /// The standard model that answered (or was tried last): a fallback model, else the
    /// one asked for. Metering prices the answer at it and the ledger records it.
    pub fn answering_model(&self) -> Option<&str> {
        self.answered_model
            .as_deref()
            .or(self.standard_model.as_deref())
    }
}

/// A request id: the client's `x-request-id` when it is 1..=64 chars of `[A-Za-z0-9._-]`,
/// else 16 random hex chars.
pub fn request_id(from_client: Option<&[u8]>) -> String {
    if let Some(v) = from_client {
        if !v.is_empty()
            && v.len() <= 64
            && v.iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return String::from_utf8_lossy(v).into_owned();
        }
    }
    format!("{:016x}", fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::metering::Prices;
    use std::time::Duration;

    fn ctx() -> RequestCtx {
        let yaml = "tenants:\n  t: {}\nvirtual_keys:\n  - key: sk-test-ctx-000001\n    tenant: t\nproviders:\n  a:\n    kind: openai\n    base_url: http://127.0.0.1:1/v1\nmodels:\n  m:\n    routes:\n      - provider: a\n        upstream_model: x\n";
        let config = Config::parse(std::path::Path::new("c.yaml"), yaml).unwrap();
        RequestCtx::new(Arc::new(config))
    }

    #[test]
    fn cancelled_hedges_get_the_estimate_only_when_there_are_any() {
        let mut c = ctx();
        c.fill_cancelled_hedges(|| panic!("no hedge lost: the tokenizer must not run"));
        let prices = Prices {
            input: 2.0,
            ..Prices::default()
        };
        c.billing.cancelled_hedges.push(CancelledHedge {
            model: "m".into(),
            provider: "p1".into(),
            upstream_model: "u".into(),
            prices,
            ran: Duration::from_millis(5),
            fallback_depth: 0,
            input_tokens: 0,
        });
        let mut calls = 0;
        c.fill_cancelled_hedges(|| {
            calls += 1;
            500
        });
        assert_eq!(calls, 1);
        let m = c.billing.cancelled_hedges[0].metered();
        assert_eq!(
            (m.input_tokens, m.output_tokens, m.estimated),
            (500, 0, true)
        );
        assert_eq!((m.cost_usd, m.charge_usd), (0.001, 0.0));
    }

    #[test]
    fn request_id_accepts_sane_client_ids_only() {
        assert_eq!(super::request_id(Some(b"abc-123")), "abc-123");
        assert_eq!(super::request_id(Some(b"bad id\n")).len(), 16);
        assert_eq!(super::request_id(None).len(), 16);
    }
}
