//! Owns per-request state ([`RequestCtx`]), created in `new_ctx` and dropped when Pingora
//! finishes the request. Dropping it releases everything the request held (the active-stream
//! gauge, admission permits), which is how a client abort frees capacity.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::auth::Caller;
use crate::config::Config;
use crate::error::AttemptError;
use crate::metering::{Metered, Prices};
use crate::protocol::Dialect;

/// What finally happened, for the access log and metrics.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Final downstream status (0 = nothing was written).
    pub status: u16,
    /// Provider that answered, if any.
    pub provider: Option<String>,
    /// Upstream model that answered, if any.
    pub upstream_model: Option<String>,
    /// Label: `ok`, `client_abort`, an error's metric label, or `stream_error`.
    pub label: &'static str,
    /// Request received → first content event written downstream.
    pub ttft: Option<Duration>,
    /// Body bytes written downstream.
    pub bytes_out: u64,
    /// Input tokens, cached ones included (the provider's final `usage`, else the
    /// admission estimate; see [`crate::metering`]).
    pub input_tokens: u64,
    /// Output tokens, reasoning included (the provider's final `usage`, else the tokenizer
    /// count of the text streamed).
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's prompt cache (part of `input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`), when the provider says.
    pub reasoning_tokens: u64,
    /// The token figures are Sluice's estimate: the answer ended without the provider's
    /// final usage.
    pub usage_estimated: bool,
    /// The answer ended without any input figure from the provider: `input_tokens` is to be
    /// the request's input estimate, filled in by [`Outcome::fill_input_estimate`] where the
    /// request is at hand (the tokenizer runs only for such answers; a committed stream's
    /// request keeps a sample of its prompt for it).
    pub input_unknown: bool,
    /// The upstream answered, then broke off (mid-stream error, broken body): the route
    /// is charged a failure although a response was written.
    pub upstream_broke: bool,
    /// The request only counted tokens (`/v1/messages/count_tokens`): nothing was generated,
    /// so it stays out of the generation metrics (durations, TTFT, `sluice_tokens_total`).
    pub count_only: bool,
    /// When the first upstream attempt started (before its connect).
    pub upstream_started: Option<Instant>,
    /// When Sluice first held upstream output it could send: the read that brought the
    /// first data event (streams), or the end of the answer body (non-stream answers).
    pub upstream_first_event: Option<Instant>,
    /// The time Sluice itself added before the first byte of the answer
    /// (`sluice_gateway_overhead_seconds`, `x-sluice-overhead-ms`), set when the response
    /// head is written; see [`Outcome::overhead_at`].
    pub overhead: Option<Duration>,
}

impl Outcome {
    /// Sluice's own share of `elapsed` (request received → now, the first byte being
    /// written): `elapsed` minus the upstream's time (first upstream attempt started → first
    /// data event, or the whole non-stream body, received). That leaves admission, request
    /// parsing and translation before the first attempt, plus the time from holding the
    /// upstream's first event to writing it; failed attempts and fallbacks count as
    /// upstream time. `None` before the upstream sent anything.
    pub fn overhead_at(&self, elapsed: Duration) -> Option<Duration> {
        let upstream = self
            .upstream_first_event?
            .saturating_duration_since(self.upstream_started?);
        Some(elapsed.saturating_sub(upstream))
    }
}

impl Outcome {
    /// Sets `input_tokens` to `estimate()` (the parsed request's input estimate) when the
    /// answer ended without the provider's input figure ([`Outcome::input_unknown`]); else
    /// leaves it and never calls `estimate`.
    pub fn fill_input_estimate(&mut self, estimate: impl FnOnce() -> u64) {
        if std::mem::take(&mut self.input_unknown) {
            self.input_tokens = estimate();
        }
    }

    /// The token use admission settles the request's charge with.
    pub fn used(&self) -> crate::backpressure::Used {
        crate::backpressure::Used {
            answered: self.provider.is_some(),
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// An attempt of a hedged pair that the race cancelled before its first event
/// ([`super::hedge`]). Its provider was sent the prompt, so at the request's end it is
/// metered apart ([`Metered::cancelled_hedge`]): a `hedge_cancelled` ledger row of its own
/// and Sluice's cost in the metrics, never the tenant's charge. Built only when a hedge
/// loses.
#[derive(Debug, Clone)]
pub struct CancelledHedge {
    /// The standard model whose route it was (the stage's model: the one asked for, or a
    /// fallback model).
    pub model: String,
    /// Its provider.
    pub provider: String,
    /// Its upstream model.
    pub upstream_model: String,
    /// Its route's cost prices, USD per million tokens (only the input price applies).
    pub prices: Prices,
    /// Attempt started → cancelled.
    pub ran: Duration,
    /// The request's fallback depth when the pair ran.
    pub fallback_depth: usize,
    /// The request's input-token estimate, filled in by
    /// [`RequestCtx::fill_cancelled_hedges`] where the request is at hand (0 before): the
    /// winner's input figure from its provider when it gave one before the commit, else
    /// Sluice's estimate.
    pub input_tokens: u64,
}

impl CancelledHedge {
    /// What it likely cost: its estimated input at its route's input price, charge 0.
    pub fn metered(&self) -> Metered {
        Metered::cancelled_hedge(self.input_tokens, &self.prices)
    }
}

/// Decrements `sluice_active_streams{tenant}` on drop.
#[derive(Debug)]
pub struct ActiveStreamGuard(prometheus::IntGauge);

impl ActiveStreamGuard {
    /// Increments the gauge for `tenant`.
    pub fn new(tenant: &str) -> Self {
        let g = crate::metrics::metrics()
            .active_streams
            .with_label_values(&[tenant]);
        g.inc();
        Self(g)
    }
}

impl Drop for ActiveStreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    /// Config snapshot pinned for the whole request (reloads never change it mid-request).
    pub config: Arc<Config>,
    /// When the request arrived.
    pub received: Instant,
    /// Request id (from a sane `x-request-id` or generated), echoed as `x-request-id`.
    pub request_id: String,
    /// `None` until authentication succeeds.
    pub caller: Option<Caller>,
    /// The standard model asked for; `None` before the body is parsed (or for `/v1/models`).
    pub standard_model: Option<String>,
    /// The standard model whose route is serving (or last tried) when it is not
    /// `standard_model`: a model-level fallback ([`super::fallback`]). `None` otherwise.
    pub answered_model: Option<String>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The wire API the client speaks (set by the endpoint): errors Sluice writes, the
    /// in-stream error event and heartbeats are in it.
    pub dialect: Dialect,
    /// Failed attempts in order.
    pub attempts: Vec<AttemptError>,
    /// Number of upstream attempts made (failed or not, same-route retries included).
    pub attempt_count: usize,
    /// Candidate routes that failed before the current one (same-route retries not counted).
    pub failed_routes: usize,
    /// Whether the response head has been written downstream (no fallback after this).
    pub downstream_committed: bool,
    /// Held while the request is proxied.
    pub active: Option<ActiveStreamGuard>,
    /// Held admission permits (global concurrency, tenant concurrency); dropped with the ctx.
    pub permits: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// The tenant's request/token limit status for the `x-ratelimit-*` headers; `None` before
    /// authentication or when the tenant has no such limit.
    pub rate_limit: Option<crate::backpressure::RateLimitStatus>,
    /// The result.
    pub outcome: Outcome,
    /// What the request used and costs, filled at its end (`logging`); `None` when no
    /// provider answered.
    pub metered: Option<Metered>,
    /// The attempts hedge races cancelled (at most one per attempt stage; empty, without an
    /// allocation, unless a hedge lost).
    pub cancelled_hedges: Vec<CancelledHedge>,
    /// The money reserved against the tenant's budget, settled in `logging` with the
    /// metered charge (dropped unsettled, it releases the money).
    pub budget: Option<crate::budget::Reservation>,
    /// Counts this request as in flight (graceful shutdown waits for the count to reach 0).
    pub in_flight: crate::shutdown::InFlight,
    /// Set when the request matched a passthrough route (Pingora's native proxy path).
    pub passthrough: Option<crate::passthrough::PassCtx>,
    /// The client's address ([`super::client_ip::client_ip`]), once the head is screened.
    pub client_ip: Option<std::net::IpAddr>,
}

impl RequestCtx {
    /// A fresh context pinned to `config`.
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            received: Instant::now(),
            request_id: String::new(),
            caller: None,
            standard_model: None,
            answered_model: None,
            stream: false,
            dialect: Dialect::ChatCompletions,
            attempts: Vec::new(),
            attempt_count: 0,
            failed_routes: 0,
            downstream_committed: false,
            active: None,
            permits: Vec::new(),
            rate_limit: None,
            outcome: Outcome::default(),
            metered: None,
            cancelled_hedges: Vec::new(),
            budget: None,
            in_flight: crate::shutdown::InFlight::new(),
            passthrough: None,
            client_ip: None,
        }
    }

    /// Fallback depth: how many candidate routes failed before the one serving now (0 when
    /// the first candidate served, even after a same-route retry; retries are counted in
    /// `sluice_upstream_retries_total` and the access log's `attempts`).
    pub fn fallback_depth(&self) -> usize {
        self.failed_routes
    }

    /// Gives every cancelled hedge attempt the request's input estimate (`estimate()`, the
    /// parsed request's cached estimate); never calls `estimate` when no hedge lost.
    pub fn fill_cancelled_hedges(&mut self, estimate: impl FnOnce() -> u64) {
        if self.cancelled_hedges.is_empty() {
            return;
        }
        let input = estimate();
        for h in &mut self.cancelled_hedges {
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
        c.cancelled_hedges.push(CancelledHedge {
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
        let m = c.cancelled_hedges[0].metered();
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
