//! Owns every Prometheus metric Sluice exports: name, help, unit, labels and buckets, all
//! registered once in the default registry and served by the admin listener's `/metrics`.
//!
//! Naming: `sluice_` prefix, base units (`_seconds`), `_total` on counters. Labels are
//! low-cardinality: `model` is a configured standard model id (or `unknown`), `provider` a
//! configured provider id, `tenant` a configured tenant id, `status` an HTTP status,
//! `reason`/`phase` fixed small sets.
//!
//! **Cost that does not grow with the config.** A series is created on its first use, except
//! those that dashboards and alerts need at 0 before the first event *and* whose number does
//! not grow with tenants × models: fixed label sets ([`init_known_series`]: rejections, reload
//! results, stream errors, ...), per provider (attempts, retries, heartbeats, invalid UTF-8,
//! probes, token fetches), per model alone (`sluice_requests_total` × the statuses Sluice
//! answers with, hedges, affinity, continuation seams, token counts), per route
//! (`sluice_provider_health`) and per model × its routes' provider pairs
//! (`sluice_fallback_total`); see [`init_config_series`]. The tenant-labelled families
//! (`sluice_tokens_total`, `sluice_cost_usd_total`, `sluice_charge_usd_total`,
//! `sluice_active_streams`) start empty: a (tenant, model) pair's series appear, all at once and
//! at 0 before the first increment, on its first metering, and their number is capped by
//! `server.metrics_max_series_per_family` (default 10000; past it label sets are recorded under
//! `tenant="__overflow__"`, counted in `sluice_metric_overflow_total{family}`); see [`series`].
//! `sluice_budget_remaining_usd{tenant,window}` and `sluice_response_store_bytes{tenant}` grow
//! with tenants alone (budgets configured, responses stored), never with models.
//!
//! The request path records through children resolved once per label set ([`series`]); the
//! status page reads its totals from there, never the whole registry.

pub mod series;

use prometheus::{
    exponential_buckets, register_counter_vec, register_gauge_vec, register_histogram,
    register_histogram_vec, register_int_counter, register_int_counter_vec, register_int_gauge,
    register_int_gauge_vec, CounterVec, Encoder, GaugeVec, Histogram, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, TextEncoder,
};
use std::sync::LazyLock;

/// All metrics. Obtain with [`metrics()`].
#[derive(Debug)]
pub struct Metrics {
    /// `sluice_requests_total{model,status}`: finished downstream requests by final status.
    pub requests_total: IntCounterVec,
    /// `sluice_active_streams{tenant}`: requests currently being proxied (streams and not).
    pub active_streams: IntGaugeVec,
    /// `sluice_request_duration_seconds{model,provider,stream}`: downstream request duration.
    pub request_duration_seconds: HistogramVec,
    /// `sluice_ttft_seconds{model,provider}`: request received → first content event written.
    pub ttft_seconds: HistogramVec,
    /// `sluice_inter_token_seconds{model,provider}`: gaps between the arrivals of content
    /// events of one stream, seconds (one observation per upstream read that carried new
    /// content after the first; events that arrive in one read are one arrival).
    pub inter_token_seconds: HistogramVec,
    /// `sluice_gateway_overhead_seconds{model,provider}`: the time Sluice itself adds before
    /// the first byte of an answer, seconds: request received → first byte written, minus
    /// the upstream's own time (first attempt started → first data event, or the whole
    /// non-stream body, received; failed attempts and fallbacks count as upstream time).
    /// See [`crate::outcome::Outcome::overhead_at`].
    pub gateway_overhead_seconds: HistogramVec,
    /// `sluice_upstream_attempts_total{provider,outcome}`: attempts by outcome
    /// (`ok`, or an attempt failure label).
    pub upstream_attempts_total: IntCounterVec,
    /// `sluice_token_counts_total{model,method}`: answered `/v1/messages/count_tokens`
    /// requests by how they were counted (`provider`: the Anthropic provider's own count;
    /// `estimate`: the local `o200k_base` estimate).
    pub token_counts_total: IntCounterVec,
    /// `sluice_provider_token_fetches_total{provider,result}`: access-token fetches of
    /// providers whose credential is exchanged for a bearer token (Vertex AI), by `result`
    /// (`ok`, `error`); one per token lifetime when all is well, not one per request.
    pub provider_token_fetches_total: IntCounterVec,
    /// `sluice_fallback_total{model,from_provider,to_provider,reason}`: fallbacks from one
    /// route to the next; `model` is the model asked for, `reason` the failure label, or
    /// [`MODEL_FALLBACK_REASON`] for a step to another standard model.
    pub fallback_total: IntCounterVec,
    /// `sluice_fallback_depth`: candidate routes that failed before the one that answered
    /// (same-route retries not counted), per request that got an upstream answer.
    pub fallback_depth: Histogram,
    /// `sluice_upstream_retries_total{provider,reason}`: same-route retries.
    pub upstream_retries_total: IntCounterVec,
    /// `sluice_hedges_total{model,outcome}`: hedge timers that fired
    /// (`models.<id>.hedge_after_ms`), by outcome: [`HEDGE_OUTCOMES`].
    pub hedges_total: IntCounterVec,
    /// `sluice_affinity_total{model,outcome}`: requests of models with
    /// `affinity: conversation`, by outcome: [`AFFINITY_OUTCOMES`].
    pub affinity_total: IntCounterVec,
    /// `sluice_client_aborts_total{phase}`: downstream disconnects by phase
    /// (`queued`, `connecting`, `waiting_head`, `waiting_first_event`, `streaming`).
    pub client_aborts_total: IntCounterVec,
    /// `sluice_provider_health{provider,route}`: 0 healthy, 1 degraded, 2 unhealthy.
    pub provider_health: IntGaugeVec,
    /// `sluice_health_probes_total{provider,mode,result}`: active health probes sent, by
    /// `mode` (`list`: one `GET` per provider; `request`: a one-output-token request per
    /// route, never metered or charged to a tenant) and `result` (`up`, `down`).
    pub health_probes_total: IntCounterVec,
    /// `sluice_tokens_total{tenant,model,kind}`: metered tokens by class ([`TOKEN_KINDS`]:
    /// `input` (cached included), `output` (reasoning included), `cached_input`,
    /// `cache_write`, `reasoning`), estimated ones included (see [`crate::billing::metering`]): a
    /// stream's estimate when it ended without the provider's usage, and the estimated
    /// input of an attempt a hedge race cancelled.
    pub tokens_total: IntCounterVec,
    /// `sluice_cost_usd_total{tenant,model}`: what providers bill, at the routes' prices, USD;
    /// includes the estimated input cost of attempts hedge races cancelled (Sluice's cost,
    /// never in `sluice_charge_usd_total`).
    pub cost_usd_total: CounterVec,
    /// `sluice_charge_usd_total{tenant,model}`: what tenants are charged, at the standard
    /// models' sell prices, USD.
    pub charge_usd_total: CounterVec,
    /// `sluice_budget_remaining_usd{tenant,window}`: what is left of a tenant's budget in a
    /// window (`total`, `monthly`, `daily`), budget minus charged minus reserved by requests in
    /// flight, USD, as this process knows it (see [`crate::billing::budget`]); only for configured
    /// windows.
    pub budget_remaining_usd: GaugeVec,
    /// `sluice_heartbeats_total{provider}`: heartbeats written to clients (a `: keepalive`
    /// comment, Messages clients `event: ping`): Sluice's own on a silent stream, and the
    /// upstream keepalives a translated stream relays (at most one a second).
    pub heartbeats_total: IntCounterVec,
    /// `sluice_stream_errors_total{reason}`: committed streams that ended with an error event.
    /// Reasons: `upstream_broken`, `upstream_error`, `upstream_truncated`,
    /// `upstream_incomplete`, `upstream_encoding`, `event_too_large`, `idle_timeout`,
    /// `first_event_timeout`, `max_stream_duration`, `shutdown`, `continuation_seam`.
    pub stream_errors_total: IntCounterVec,
    /// `sluice_stream_continuations_total{model,outcome}`: committed streams that broke with
    /// `models.<id>.continue_on_break` on, by what became of them (`continued` and the
    /// refusals, see `crate::engine::continuation::OUTCOMES`).
    pub stream_continuations_total: IntCounterVec,
    /// `sluice_continuation_seams_total{model,outcome}`: how a continuation's text met the
    /// text the client had (`clean`, `trimmed`, `space_added`, `refused`; see
    /// [`crate::protocol::seam`]).
    pub continuation_seams_total: IntCounterVec,
    /// `sluice_resumable_streams{state}`: resumable streams held now, `attached` (a client
    /// is reading), `detached` (the generation runs on for a resume) or `completed` (the
    /// final event was written; its tail stays replayable for the grace window; see
    /// [`crate::stream::resume`]).
    pub resumable_streams: IntGaugeVec,
    /// `sluice_stream_resumes_total{outcome}`: `GET /v1/streams/<id>` and `DELETE` answers:
    /// `resumed`, `replayed` (the kept tail of a completed stream), `not_found`, `expired` (410: the window passed, the buffer overflowed or the
    /// event named is no longer kept), `misdirected` (421: another replica's id), `cancelled`
    /// (DELETE).
    pub stream_resumes_total: IntCounterVec,
    /// `sluice_resumable_buffer_bytes`: bytes of events held in the replay buffers of
    /// resumable streams now.
    pub resumable_buffer_bytes: IntGauge,
    /// `sluice_dropped_fields_total{client_dialect,upstream_dialect}`: members and values of
    /// translated requests left out because the target cannot carry them
    /// (`models.<id>.unsupported: drop`; each also named in the answer's
    /// `x-sluice-dropped` header and an info log line).
    pub dropped_fields_total: IntCounterVec,
    /// `sluice_sse_invalid_utf8_total{provider}`: invalid UTF-8 sequences in upstream
    /// answers, each replaced with U+FFFD before it reached the client: in SSE events
    /// (WHATWG SSE decoding) and in non-stream answer bodies (before the model rewrite or
    /// the Anthropic translation).
    pub sse_invalid_utf8_total: IntCounterVec,
    /// `sluice_sse_malformed_events_total{provider}`: upstream SSE data events whose data
    /// is not JSON (nor `[DONE]`): dropped, never forwarded to the client (its SDK would
    /// fail on it), on the same-dialect path and on a translated stream alike; never the end
    /// of a stream. The first of a stream is logged.
    pub sse_malformed_events_total: IntCounterVec,
    /// `sluice_config_reloads_total{result}`: reloads (`ok`, `error`).
    pub config_reloads_total: IntCounterVec,
    /// `sluice_rejected_total{reason}`: admission rejections
    /// (`queue_full`, `queue_timeout`, `tenant_rpm`, `tenant_tpm`, `tenant_concurrency`,
    /// `request_buffers_full`) and edge refusals before authentication (`header_too_large`,
    /// `too_many_headers`, `uri_too_long`, `per_ip_rate`, `per_ip_connections`).
    pub rejected_total: IntCounterVec,
    /// `sluice_admission_queue_depth`: requests waiting for a slot.
    pub admission_queue_depth: IntGauge,
    /// `sluice_admission_wait_seconds`: time spent queued before admission.
    pub admission_wait_seconds: Histogram,
    /// `sluice_ratelimit_backend_errors_total`: Redis checks that failed or timed out (fail-open).
    pub ratelimit_backend_errors_total: IntCounterVec,
    /// `sluice_buffered_request_bytes`: memory reserved for request bodies now (announced
    /// `Content-Length` of bodies being read, chunked bodies so far, and bodies held for
    /// their upstream attempts; each body byte counts twice, see
    /// [`crate::backpressure::buffers`]), bounded by `server.max_buffered_request_bytes`.
    pub buffered_request_bytes: IntGauge,
    /// `sluice_heap_trims_total`: times freed heap memory was handed back to the OS after a
    /// burst of request bodies drained (glibc's `malloc_trim`; see
    /// [`crate::backpressure::trim`]).
    pub heap_trims_total: IntCounter,
    /// `sluice_request_read_aborts_total{phase,reason}`: requests that never fully arrived:
    /// `phase` `head` or `body`, `reason` `timeout` (`server.header_read_timeout_ms` /
    /// `body_read_timeout_ms` passed) or `closed` (the client hung up or reset mid-way).
    pub request_read_aborts_total: IntCounterVec,
    /// `sluice_tls_handshake_failures_total{reason}`: downstream TLS handshakes that failed
    /// (`error`: not TLS, no shared version or cipher, a reset, ...) or did not finish within
    /// `server.header_read_timeout_ms` (`timeout`); logged at DEBUG, see [`crate::tls`].
    pub tls_handshake_failures_total: IntCounterVec,
    /// `sluice_ledger_queue_depth`: usage records queued for the ledger writer.
    pub ledger_queue_depth: IntGauge,
    /// `sluice_ledger_dropped_total`: usage records dropped because the ledger queue was full.
    pub ledger_dropped_total: IntCounter,
    /// `sluice_response_store_bytes{tenant}`: bytes of stored Responses (their
    /// `size_bytes`, [`crate::conversation`]) per tenant, as of the last write or sweep.
    pub response_store_bytes: IntGaugeVec,
    /// `sluice_websocket_sessions`: Responses WebSocket sessions open now
    /// ([`crate::ingress::websocket`]).
    pub websocket_sessions: IntGauge,
    /// `sluice_websocket_messages_total{direction,type}`: messages on Responses WebSockets:
    /// `direction` `client` (`type` `response.create`, `response.cancel`, `unknown`,
    /// `binary`, `invalid`) or `server` (`type` the event's, one of the Responses stream's
    /// event types, else `other`).
    pub websocket_messages_total: IntCounterVec,
    /// `sluice_response_store_evictions_total{reason}`: stored responses removed by
    /// retention (`age`: older than `response_store.max_age_secs`; `bytes`: the tenant was
    /// over `response_store.max_bytes_per_tenant`).
    pub response_store_evictions_total: IntCounterVec,
    /// `sluice_response_store_dropped_total`: responses not stored because the store's
    /// queue was full or its database failed.
    pub response_store_dropped_total: IntCounter,
    /// `sluice_ledger_records_written_total`: usage records written to the ledger.
    pub ledger_records_written_total: IntCounter,
    /// `sluice_ledger_write_errors_total`: ledger batch writes that failed (retried).
    pub ledger_write_errors_total: IntCounter,
    /// `sluice_ledger_flush_seconds`: time to write one batch of usage records, seconds.
    pub ledger_flush_seconds: Histogram,
    /// `sluice_metric_overflow_total{family}`: recordings of a new label set past
    /// `server.metrics_max_series_per_family`, made under `tenant="__overflow__"` instead
    /// (see [`series`]), by family.
    pub metric_overflow_total: IntCounterVec,
    /// `sluice_ttft_seconds` over all label sets, not registered (not exported): what the
    /// status page's TTFT quantiles are computed from.
    pub ttft_all: Histogram,
}

/// Buckets of the request latency histograms (`sluice_request_duration_seconds`,
/// `sluice_ttft_seconds`): 5 ms to ~41 s, doubling, seconds.
fn latency_buckets() -> Result<Vec<f64>, prometheus::Error> {
    exponential_buckets(0.005, 2.0, 14)
}

/// Buckets of `sluice_inter_token_seconds`: 1 ms (tokens batched by the provider) to 10 s
/// (a reasoning model thinking between visible tokens), seconds.
const INTER_TOKEN_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets of `sluice_gateway_overhead_seconds`: 50 µs to 1 s, seconds (a healthy gateway
/// stays in the sub-millisecond buckets; admission queueing lands in the upper ones).
const OVERHEAD_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Observes `sluice_inter_token_seconds` for one stream: the histogram child is resolved
/// once per stream, so the per-chunk path is one comparison and, on new content, one
/// atomic observation (no label lookup, no allocation).
#[derive(Debug)]
pub struct InterTokenClock {
    histogram: Histogram,
    content_events: u64,
    last: Option<tokio::time::Instant>,
}

impl InterTokenClock {
    /// A clock for a stream of standard model `model` served by `provider`, which has seen
    /// `content_events` content events so far, the last of them (if any) arriving at `last`.
    pub fn new(
        model: &str,
        provider: &str,
        content_events: u64,
        last: Option<tokio::time::Instant>,
    ) -> Self {
        Self {
            histogram: metrics()
                .inter_token_seconds
                .with_label_values(&[model, provider]),
            content_events,
            last: last.filter(|_| content_events > 0),
        }
    }

    /// After an upstream read at `now`: when the stream's content-event count grew past
    /// the last one seen, observes the gap since the previous content arrival.
    pub fn arrived(&mut self, content_events: u64, now: tokio::time::Instant) {
        if content_events <= self.content_events {
            return;
        }
        self.content_events = content_events;
        if let Some(prev) = self.last.replace(now) {
            self.histogram
                .observe(now.saturating_duration_since(prev).as_secs_f64());
        }
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one registration per metric: splitting it would scatter the metric table"
)]
fn build() -> Result<Metrics, prometheus::Error> {
    let latency = latency_buckets()?;
    Ok(Metrics {
        ttft_all: Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "sluice_ttft_seconds_all",
                "Time to first token over all label sets (status page only).",
            )
            .buckets(latency.clone()),
        )?,
        metric_overflow_total: register_int_counter_vec!(
            "sluice_metric_overflow_total",
            "Recordings of a new label set past server.metrics_max_series_per_family, made under tenant=\"__overflow__\" instead, by family.",
            &["family"]
        )?,
        requests_total: register_int_counter_vec!(
            "sluice_requests_total",
            "Finished downstream requests by standard model and final HTTP status.",
            &["model", "status"]
        )?,
        active_streams: register_int_gauge_vec!(
            "sluice_active_streams",
            "Requests currently being proxied upstream, by tenant.",
            &["tenant"]
        )?,
        request_duration_seconds: register_histogram_vec!(
            "sluice_request_duration_seconds",
            "Downstream request duration in seconds.",
            &["model", "provider", "stream"],
            latency.clone()
        )?,
        ttft_seconds: register_histogram_vec!(
            "sluice_ttft_seconds",
            "Time to first token: request received to first content event written, seconds.",
            &["model", "provider"],
            latency
        )?,
        inter_token_seconds: register_histogram_vec!(
            "sluice_inter_token_seconds",
            "Gaps between content events of a stream as they arrive from the upstream, seconds.",
            &["model", "provider"],
            INTER_TOKEN_BUCKETS.to_vec()
        )?,
        gateway_overhead_seconds: register_histogram_vec!(
            "sluice_gateway_overhead_seconds",
            "Time Sluice itself adds before the first content event (TTFT minus the upstream's time to first content), seconds.",
            &["model", "provider"],
            OVERHEAD_BUCKETS.to_vec()
        )?,
        upstream_attempts_total: register_int_counter_vec!(
            "sluice_upstream_attempts_total",
            "Upstream attempts by provider and outcome.",
            &["provider", "outcome"]
        )?,
        fallback_total: register_int_counter_vec!(
            "sluice_fallback_total",
            "Fallbacks from one provider to the next, before the first byte.",
            &["model", "from_provider", "to_provider", "reason"]
        )?,
        fallback_depth: register_histogram!(
            "sluice_fallback_depth",
            "Routes that failed before the one that answered (same-route retries not counted), per request answered by an upstream.",
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]
        )?,
        upstream_retries_total: register_int_counter_vec!(
            "sluice_upstream_retries_total",
            "Short same-route retries by provider and reason.",
            &["provider", "reason"]
        )?,
        hedges_total: register_int_counter_vec!(
            "sluice_hedges_total",
            "Hedge timers that fired, by model and outcome (hedge_won, primary_won, none, no_budget, no_partner).",
            &["model", "outcome"]
        )?,
        affinity_total: register_int_counter_vec!(
            "sluice_affinity_total",
            "Requests of models with conversation affinity, by model and outcome (hit, miss, unavailable).",
            &["model", "outcome"]
        )?,
        client_aborts_total: register_int_counter_vec!(
            "sluice_client_aborts_total",
            "Downstream disconnects before the response was complete, by phase.",
            &["phase"]
        )?,
        provider_health: register_int_gauge_vec!(
            "sluice_provider_health",
            "Route health: 0 healthy, 1 degraded, 2 unhealthy.",
            &["provider", "route"]
        )?,
        health_probes_total: register_int_counter_vec!(
            "sluice_health_probes_total",
            "Active health probes by provider, mode (list, request) and result (up, down).",
            &["provider", "mode", "result"]
        )?,
        provider_token_fetches_total: register_int_counter_vec!(
            "sluice_provider_token_fetches_total",
            "Access-token fetches of token-authenticated providers (Vertex AI) by result (ok, error).",
            &["provider", "result"]
        )?,
        token_counts_total: register_int_counter_vec!(
            "sluice_token_counts_total",
            "Answered token-count requests by standard model and method (provider, estimate).",
            &["model", "method"]
        )?,
        tokens_total: register_int_counter_vec!(
            "sluice_tokens_total",
            "Metered tokens by tenant, standard model and kind (input incl. cached, output incl. reasoning, cached_input, cache_write, reasoning).",
            &["tenant", "model", "kind"]
        )?,
        cost_usd_total: register_counter_vec!(
            "sluice_cost_usd_total",
            "Provider cost of metered usage at the routes' prices (cancelled hedges' estimated input included), USD.",
            &["tenant", "model"]
        )?,
        charge_usd_total: register_counter_vec!(
            "sluice_charge_usd_total",
            "Charge of metered usage at the standard models' sell prices, USD.",
            &["tenant", "model"]
        )?,
        budget_remaining_usd: register_gauge_vec!(
            "sluice_budget_remaining_usd",
            "What is left of a tenant's budget in a window (budget minus charged minus reserved), USD.",
            &["tenant", "window"]
        )?,
        heartbeats_total: register_int_counter_vec!(
            "sluice_heartbeats_total",
            "SSE heartbeats written to clients (own and relayed upstream keepalives), by provider.",
            &["provider"]
        )?,
        stream_errors_total: register_int_counter_vec!(
            "sluice_stream_errors_total",
            "Committed streams that ended with an SSE error event, by reason.",
            &["reason"]
        )?,
        stream_continuations_total: register_int_counter_vec!(
            "sluice_stream_continuations_total",
            "Committed streams that broke with continue_on_break on, by model and outcome (continued, or why not).",
            &["model", "outcome"]
        )?,
        resumable_streams: register_int_gauge_vec!(
            "sluice_resumable_streams",
            "Resumable streams held now, by state (attached: a client reads; detached: kept for a resume; completed: its tail kept for a client that lost it).",
            &["state"]
        )?,
        stream_resumes_total: register_int_counter_vec!(
            "sluice_stream_resumes_total",
            "Resume and cancel requests on /v1/streams, by outcome (resumed, replayed, not_found, expired, misdirected, cancelled).",
            &["outcome"]
        )?,
        resumable_buffer_bytes: register_int_gauge!(
            "sluice_resumable_buffer_bytes",
            "Bytes of events held in the replay buffers of resumable streams now."
        )?,
        continuation_seams_total: register_int_counter_vec!(
            "sluice_continuation_seams_total",
            "Seams of continued streams, by model and outcome (clean, trimmed, space_added, refused).",
            &["model", "outcome"]
        )?,
        dropped_fields_total: register_int_counter_vec!(
            "sluice_dropped_fields_total",
            "Members and values of translated requests left out because the target cannot carry them, by client and upstream dialect.",
            &["client_dialect", "upstream_dialect"]
        )?,
        sse_invalid_utf8_total: register_int_counter_vec!(
            "sluice_sse_invalid_utf8_total",
            "Invalid UTF-8 sequences in upstream answers (SSE events and non-stream bodies), replaced with U+FFFD, by provider.",
            &["provider"]
        )?,
        sse_malformed_events_total: register_int_counter_vec!(
            "sluice_sse_malformed_events_total",
            "Upstream SSE data events whose data is not JSON, passed through untouched (same dialect) or skipped (translated), by provider.",
            &["provider"]
        )?,
        config_reloads_total: register_int_counter_vec!(
            "sluice_config_reloads_total",
            "Config reloads by result (ok, error).",
            &["result"]
        )?,
        rejected_total: register_int_counter_vec!(
            "sluice_rejected_total",
            "Requests rejected by admission control, by reason.",
            &["reason"]
        )?,
        admission_queue_depth: register_int_gauge!(
            "sluice_admission_queue_depth",
            "Requests waiting in the admission queue."
        )?,
        admission_wait_seconds: register_histogram!(
            "sluice_admission_wait_seconds",
            "Time spent in the admission queue, seconds.",
            exponential_buckets(0.001, 2.0, 14)?
        )?,
        ratelimit_backend_errors_total: register_int_counter_vec!(
            "sluice_ratelimit_backend_errors_total",
            "Distributed rate-limit checks that failed or timed out (served by the local limiter).",
            &["kind"]
        )?,
        buffered_request_bytes: register_int_gauge!(
            "sluice_buffered_request_bytes",
            "Memory reserved for request bodies now, bytes (each body byte counts twice; bounded by server.max_buffered_request_bytes)."
        )?,
        heap_trims_total: register_int_counter!(
            "sluice_heap_trims_total",
            "Times freed heap memory was handed back to the OS after a burst of request bodies drained."
        )?,
        request_read_aborts_total: register_int_counter_vec!(
            "sluice_request_read_aborts_total",
            "Requests whose head or body never fully arrived, by phase (head, body) and reason (timeout, closed).",
            &["phase", "reason"]
        )?,
        tls_handshake_failures_total: register_int_counter_vec!(
            "sluice_tls_handshake_failures_total",
            "Downstream TLS handshakes that failed (error) or did not finish within server.header_read_timeout_ms (timeout).",
            &["reason"]
        )?,
        ledger_queue_depth: register_int_gauge!(
            "sluice_ledger_queue_depth",
            "Usage records queued for the ledger writer."
        )?,
        ledger_dropped_total: register_int_counter!(
            "sluice_ledger_dropped_total",
            "Usage records dropped because the ledger queue was full."
        )?,
        response_store_bytes: register_int_gauge_vec!(
            "sluice_response_store_bytes",
            "Bytes of stored Responses API responses per tenant (response_store), as of the last write or sweep.",
            &["tenant"]
        )?,
        websocket_sessions: register_int_gauge!(
            "sluice_websocket_sessions",
            "Responses WebSocket sessions open now."
        )?,
        websocket_messages_total: register_int_counter_vec!(
            "sluice_websocket_messages_total",
            "Messages on Responses WebSockets by direction (client, server) and type.",
            &["direction", "type"]
        )?,
        response_store_evictions_total: register_int_counter_vec!(
            "sluice_response_store_evictions_total",
            "Stored responses removed by retention, by reason (age, bytes).",
            &["reason"]
        )?,
        response_store_dropped_total: register_int_counter!(
            "sluice_response_store_dropped_total",
            "Responses not stored because the response store's queue was full or its database failed."
        )?,
        ledger_records_written_total: register_int_counter!(
            "sluice_ledger_records_written_total",
            "Usage records written to the ledger."
        )?,
        ledger_write_errors_total: register_int_counter!(
            "sluice_ledger_write_errors_total",
            "Ledger batch writes that failed (the batch is kept and retried)."
        )?,
        ledger_flush_seconds: register_histogram!(
            "sluice_ledger_flush_seconds",
            "Time to write one batch of usage records to the ledger, seconds.",
            exponential_buckets(0.0001, 2.0, 16)?
        )?,
    })
}

/// Creates the series of fixed label sets at 0, so alerts and rates see them before the
/// first event (`rate(sluice_config_reloads_total{result="error"}[5m])` needs a series).
fn init_known_series(m: &Metrics) {
    for result in ["ok", "error"] {
        m.config_reloads_total.with_label_values(&[result]);
    }
    for kind in [
        "response.create",
        "response.cancel",
        "unknown",
        "binary",
        "invalid",
    ] {
        m.websocket_messages_total
            .with_label_values(&["client", kind]);
    }
    for reason in [
        "queue_full",
        "queue_timeout",
        "tenant_rpm",
        "tenant_tpm",
        "tenant_concurrency",
        "request_buffers_full",
        "header_too_large",
        "too_many_headers",
        "uri_too_long",
        "per_ip_rate",
        "per_ip_connections",
    ] {
        m.rejected_total.with_label_values(&[reason]);
    }
    for reason in ["error", "timeout"] {
        m.tls_handshake_failures_total.with_label_values(&[reason]);
    }
    for phase in ["head", "body"] {
        for reason in ["timeout", "closed"] {
            m.request_read_aborts_total
                .with_label_values(&[phase, reason]);
        }
    }
    for phase in [
        "queued",
        "reading_body",
        "connecting",
        "waiting_head",
        "waiting_first_event",
        "waiting_body",
        "streaming",
    ] {
        m.client_aborts_total.with_label_values(&[phase]);
    }
    for kind in ["timeout", "error", "unavailable", "settle"] {
        m.ratelimit_backend_errors_total.with_label_values(&[kind]);
    }
    for reason in STREAM_ERROR_REASONS {
        m.stream_errors_total.with_label_values(&[reason]);
    }
    for state in ["attached", "detached", "completed"] {
        m.resumable_streams.with_label_values(&[state]);
    }
    for outcome in [
        "resumed",
        "replayed",
        "not_found",
        "expired",
        "misdirected",
        "cancelled",
    ] {
        m.stream_resumes_total.with_label_values(&[outcome]);
    }
}

/// Every `reason` of `sluice_stream_errors_total` (the codes of the error events Sluice
/// writes into committed streams).
const STREAM_ERROR_REASONS: [&str; 11] = [
    "upstream_broken",
    "upstream_error",
    "upstream_truncated",
    "upstream_incomplete",
    "upstream_encoding",
    "event_too_large",
    "idle_timeout",
    "first_event_timeout",
    "max_stream_duration",
    "shutdown",
    "continuation_seam",
];

/// The statuses Sluice itself answers with ([`crate::error::GatewayError::status`], 200 for
/// an answer), exported at 0 in `sluice_requests_total` for every configured model and for
/// `none` (requests naming no configured model). Provider statuses passed through (other
/// 4xx/5xx) appear on their first occurrence.
pub(crate) const GATEWAY_STATUSES: [&str; 13] = [
    "200", "400", "401", "403", "404", "405", "408", "413", "429", "500", "502", "503", "504",
];

/// Every `reason` label of [`crate::error::AttemptFailure::label`] (fallbacks, attempts).
const ATTEMPT_FAILURE_LABELS: [&str; 9] = [
    "connect",
    "first_byte_timeout",
    "first_event_timeout",
    "status_429",
    "status_5xx",
    "status_4xx",
    "protocol",
    "context_length",
    "model_not_found",
];

/// The `reason` of a `sluice_fallback_total` step to another standard model after every
/// route of the previous one failed (`models.<id>.fallback_models` or the body's `models`).
/// A step to another model, or to a larger route of the same model, on a context-length
/// rejection has the reason `context_length`. The `model` label stays the model the
/// request asked for; `from_provider` / `to_provider` are the routes' providers.
pub const MODEL_FALLBACK_REASON: &str = "model_fallback";

/// The `reason`s of same-route retries (only connect failures and 502/503 are retried).
const RETRY_LABELS: [&str; 2] = ["connect", "status_5xx"];

/// The `kind` label values of `sluice_tokens_total`.
pub const TOKEN_KINDS: [&str; 5] = [
    "input",
    "output",
    "cached_input",
    "cache_write",
    "reasoning",
];

/// `sluice_hedges_total` outcomes: the hedge served (`hedge_won`), the first attempt
/// served and the hedge was cancelled (`primary_won`), neither served (`none`: both
/// failed, a final error, the client left), or no hedge was started: the retry budget had
/// no room (`no_budget`) or no further healthy candidate was free (`no_partner`).
pub const HEDGE_OUTCOMES: [&str; 5] = [
    "hedge_won",
    "primary_won",
    "none",
    "no_budget",
    "no_partner",
];

/// `sluice_affinity_total` outcomes: the conversation's route was known and put first
/// (`hit`), no route was known for it (`miss`), or its route was known but unhealthy,
/// degraded, resting or not a candidate of this request (`unavailable`: normal order).
pub const AFFINITY_OUTCOMES: [&str; 3] = ["hit", "miss", "unavailable"];

/// Creates at 0 the series whose label sets the config determines, so that dashboards and
/// alerts see `sluice_fallback_total`, `sluice_upstream_retries_total`,
/// `sluice_heartbeats_total`, `sluice_upstream_attempts_total`,
/// `sluice_token_counts_total`,
/// `sluice_sse_invalid_utf8_total` (per provider), `sluice_health_probes_total` (per provider
/// with a probe, its mode × `up`/`down`), `sluice_provider_token_fetches_total` (per
/// token-authenticated provider × `ok`/`error`) and `sluice_requests_total` (every
/// configured model and `none` × the statuses Sluice itself answers with) before their first
/// event. Called at startup and after every successful reload (series of
/// providers or models removed by a reload stay, at their last value); also applies
/// `server.metrics_max_series_per_family` ([`series::set_max_series_per_family`]). Nothing
/// here is per tenant: the tenant × model series appear on first use ([`series`]).
///
/// Fallback series: for every standard model, every ordered pair of distinct route
/// providers × every attempt failure reason (fallback order depends on the strategy and on
/// health, so any route may follow any other).
pub fn init_config_series(cfg: &crate::config::Config) {
    series::set_max_series_per_family(cfg.server.metrics_max_series_per_family);
    let m = metrics();
    for (id, provider) in &cfg.providers {
        let p = id.as_str();
        if let Some(check) = &provider.health_check {
            for result in ["up", "down"] {
                m.health_probes_total
                    .with_label_values(&[p, check.mode.as_str(), result]);
            }
        }
        if provider.token_source.is_some() {
            for result in ["ok", "error"] {
                m.provider_token_fetches_total
                    .with_label_values(&[p, result]);
            }
        }
        m.heartbeats_total.with_label_values(&[p]);
        m.sse_invalid_utf8_total.with_label_values(&[p]);
        m.sse_malformed_events_total.with_label_values(&[p]);
        m.upstream_attempts_total.with_label_values(&[p, "ok"]);
        for reason in ATTEMPT_FAILURE_LABELS {
            m.upstream_attempts_total.with_label_values(&[p, reason]);
        }
        for reason in RETRY_LABELS {
            m.upstream_retries_total.with_label_values(&[p, reason]);
        }
    }
    for model_id in cfg.models.keys().map(|k| k.as_str()).chain(["none"]) {
        for status in GATEWAY_STATUSES {
            m.requests_total.with_label_values(&[model_id, status]);
        }
    }
    for (model_id, model) in &cfg.models {
        if model.hedge_after.is_some() {
            for outcome in HEDGE_OUTCOMES {
                m.hedges_total
                    .with_label_values(&[model_id.as_str(), outcome]);
            }
        }
        if model.continue_on_break {
            for outcome in crate::protocol::seam::SeamOutcome::ALL {
                m.continuation_seams_total
                    .with_label_values(&[model_id.as_str(), outcome.label()]);
            }
        }
        if model.affinity != crate::config::opt_in::Affinity::Off {
            for outcome in AFFINITY_OUTCOMES {
                m.affinity_total
                    .with_label_values(&[model_id.as_str(), outcome]);
            }
        }
        for method in ["provider", "estimate"] {
            m.token_counts_total
                .with_label_values(&[model_id.as_str(), method]);
        }
        for r in &model.routes {
            // The route's health series exists (healthy) from the start; one that already
            // has a state keeps it.
            let route = format!("{}/{}", r.provider.id, r.upstream_model);
            m.provider_health
                .with_label_values(&[r.provider.id.as_str(), route.as_str()]);
        }
        let providers: std::collections::BTreeSet<&str> = model
            .routes
            .iter()
            .map(|r| r.provider.id.as_str())
            .collect();
        for from in &providers {
            for to in providers.iter().filter(|to| *to != from) {
                for reason in ATTEMPT_FAILURE_LABELS {
                    m.fallback_total
                        .with_label_values(&[model_id.as_str(), from, to, reason]);
                }
            }
        }
        // Steps to the configured fallback models (the body's `models` appear on use).
        for (list, reason) in [
            (&model.fallback_models, MODEL_FALLBACK_REASON),
            (&model.context_fallback_models, "context_length"),
        ] {
            for to_model in list.iter().filter_map(|id| cfg.models.get(id)) {
                for from in &providers {
                    for to in &to_model.routes {
                        m.fallback_total.with_label_values(&[
                            model_id.as_str(),
                            from,
                            to.provider.id.as_str(),
                            reason,
                        ]);
                    }
                }
            }
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| match build() {
    Ok(m) => {
        init_known_series(&m);
        m
    }
    Err(e) => {
        // Only possible if a metric is registered twice or a bucket list is invalid: a bug
        // caught by the first test run.
        log::error!("metric registration failed: {e}");
        #[expect(
            clippy::panic,
            reason = "static metric definitions are fixed at compile time"
        )]
        {
            panic!("metric registration failed: {e}")
        }
    }
});

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Prometheus text exposition of the default registry.
pub fn render() -> Vec<u8> {
    let _ = metrics();
    let mut buf = Vec::with_capacity(16 * 1024);
    let encoder = TextEncoder::new();
    if let Err(e) = encoder.encode(&prometheus::gather(), &mut buf) {
        log::error!("metrics encoding failed: {e}");
    }
    buf
}

#[cfg(test)]
mod tests {
    use crate::error::AttemptFailure;

    #[test]
    fn the_zero_series_cover_every_attempt_failure_label() {
        for f in [
            AttemptFailure::Connect,
            AttemptFailure::FirstByteTimeout,
            AttemptFailure::FirstEventTimeout,
            AttemptFailure::Status(429),
            AttemptFailure::Status(503),
            AttemptFailure::Status(404),
            AttemptFailure::Protocol,
            AttemptFailure::Reset,
            AttemptFailure::ContextLength,
            AttemptFailure::ModelNotFound,
        ] {
            assert!(
                super::ATTEMPT_FAILURE_LABELS.contains(&f.label()),
                "{}",
                f.label()
            );
        }
        for f in [AttemptFailure::Connect, AttemptFailure::Status(502)] {
            assert!(super::RETRY_LABELS.contains(&f.label()), "{}", f.label());
        }
    }

    #[test]
    fn config_series_and_fixed_reasons_start_at_zero() {
        let dir = std::env::temp_dir().join(format!("sluice-metrics-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.yaml");
        std::fs::write(
            &path,
            "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\ntenants:\n  t: {}\nvirtual_keys:\n  - key: sk-sluice-t-0001\n    tenant: t\nproviders:\n  zero-p:\n    kind: openai\n    base_url: http://127.0.0.1:18000/v1\nmodels:\n  zero/model:\n    routes:\n      - provider: zero-p\n        upstream_model: m\n",
        )
        .unwrap();
        let cfg = crate::config::Config::load(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        super::init_config_series(&cfg);
        let text = String::from_utf8(super::render()).unwrap();
        let mut want = vec![r#"sluice_sse_invalid_utf8_total{provider="zero-p"} 0"#.to_string()];
        for status in super::GATEWAY_STATUSES {
            want.push(format!(
                r#"sluice_requests_total{{model="zero/model",status="{status}"}} 0"#
            ));
            want.push(format!(
                r#"sluice_requests_total{{model="none",status="{status}"}}"#
            ));
        }
        for reason in super::STREAM_ERROR_REASONS {
            want.push(format!(
                r#"sluice_stream_errors_total{{reason="{reason}"}} 0"#
            ));
        }
        for series in want {
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
    }

    #[test]
    fn renders_registered_names() {
        super::metrics()
            .requests_total
            .with_label_values(&["m", "200"])
            .inc();
        let text = String::from_utf8(super::render()).unwrap();
        assert!(text.contains("sluice_requests_total{model=\"m\",status=\"200\"}"));
    }
}
