//! Owns what the attempt loop ([`crate::engine::attempt`]), the unary exchange ([`crate::stream::unary`])
//! and the stream pump ([`crate::stream::pump`]) share about one attempt: how it ends ([`Attempt`]),
//! the client-disconnect signal, the record of a resend on a stale pooled connection
//! ([`stale_resend`]; opening the request is [`crate::providers::exchange::open`]), and
//! returning a finished upstream connection to the pool. It depends on none of them, so each arrow points down:
//! attempt → unary / pump → upstream.

use std::time::Duration;

use crate::engine::pool::Connector;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use crate::config::Route;
use crate::error::{AttemptError, AttemptFailure, GatewayError};
use crate::metrics::metrics;
use crate::protocol;

pub(crate) use crate::providers::exchange::SendError;
use crate::proxy::ctx::RequestCtx;

/// Largest upstream error body read for pass-through (bytes); also the most body bytes
/// drained after `[DONE]` to pool a connection.
pub(crate) const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// Idle time a pooled upstream connection is kept.
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(90);
/// After `[DONE]`, how long the upstream's end of body is awaited to pool its connection.
const DONE_DRAIN: Duration = Duration::from_millis(200);

/// The client disconnected; the phase is the `sluice_client_aborts_total` label.
#[derive(Debug, Clone, Copy)]
pub struct ClientGone(pub &'static str);

/// How one attempt ended.
pub(crate) enum Attempt {
    /// The response was written (fully, or ended with an error after the commit).
    Done,
    /// Failed before the commit; the next candidate may be tried.
    Failed(AttemptError, GatewayError),
    /// Failed before the commit in a way another provider would not fix (4xx).
    Final(GatewayError),
    /// The client left.
    Gone(ClientGone),
    /// Shutdown's grace period ended before the commit: the client gets a 503.
    Shutdown,
}

/// Resolves when the downstream closes. Bytes after the body are a pipelined next request:
/// Pingora keeps them for it and this stays pending (see [`crate::edge::connection`]).
pub(crate) async fn client_gone(session: &mut Session) {
    let _ = session.downstream_session.read_body_or_idle(true).await;
}

/// Logs and counts in `sluice_upstream_attempts_total{outcome="stale_connection"}` the
/// hidden resend of a request whose reused connection turned out stale
/// ([`SendError::unprocessed`]), and returns the attempt to add to the request's attempts
/// (`x-sluice-attempts`, the access log and the ledger's `attempts`).
pub(crate) fn stale_resend(ctx: &RequestCtx, route: &Route, e: &SendError) -> AttemptError {
    log::debug!(target: "sluice::proxy::attempt",
        "stale pooled upstream connection request_id={} provider={}: {}; sending again on a fresh one",
        ctx.request_id,
        route.provider.id,
        e.error
    );
    metrics()
        .upstream_attempts_total
        .with_label_values(&[route.provider.id.as_str(), STALE_CONNECTION])
        .inc();
    AttemptError {
        provider: route.provider.id.clone(),
        upstream_model: route.upstream_model.clone(),
        failure: AttemptFailure::Reset,
        retry_after: None,
        detail: format!("stale pooled connection: {}", e.error),
    }
}

/// The `outcome` of `sluice_upstream_attempts_total` for a request sent again because its
/// pooled connection was stale.
pub(crate) const STALE_CONNECTION: &str = "stale_connection";

/// A failure before the commit on `route`: the next candidate may be tried.
pub(crate) fn failed(
    route: &Route,
    failure: AttemptFailure,
    detail: String,
    err: GatewayError,
) -> Attempt {
    Attempt::Failed(
        AttemptError {
            provider: route.provider.id.clone(),
            upstream_model: route.upstream_model.clone(),
            failure,
            retry_after: err.retry_after(),
            detail,
        },
        err,
    )
}

/// A stream of `route` committed: while a half-open trial of the route is in flight, this
/// answer proves the route serves, so the trial ends as a success now rather than when the
/// (possibly minutes long) stream ends, and the route's other traffic returns at once. One
/// registry lookup per committed stream; nothing else when no trial is in flight.
pub(crate) fn trial_answered(route: &Route) {
    let health = crate::routing::health::registry().route(&route.provider.id, &route.health_key);
    if health.trial_in_flight() {
        health.record_success(&route.provider.passive_health, None);
    }
}

/// Now as Unix seconds (the `created` of translated answers).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Returns a finished stream's upstream connection to the pool when its body was read to
/// the end (waiting at most [`DONE_DRAIN`] for the terminator after `[DONE]`), else closes
/// it: a connection with unread body bytes is never reused. Callers box it: its future is
/// ~4 KiB and would otherwise be part of every held stream's future.
pub(crate) async fn release_or_close(
    connector: &Connector,
    mut up: UpstreamSession,
    peer: &pingora::upstreams::peer::HttpPeer,
) {
    if !up.response_done() {
        // Boxed, as it is rare and large (a body read): the stream's future stays small.
        let drain = Box::pin(async {
            let mut left = MAX_ERROR_BODY_BYTES;
            while let Ok(Some(b)) = up.read_response_body().await {
                left = left.saturating_sub(b.len());
                if left == 0 {
                    break;
                }
            }
        });
        let _ = tokio::time::timeout(DONE_DRAIN, drain).await;
    }
    if up.response_done() {
        connector
            .release_http_session(up, peer, Some(POOL_IDLE))
            .await;
    } else {
        up.shutdown().await;
    }
}

/// Records `u` (all classes) as the request's usage.
pub(crate) fn set_usage(ctx: &mut RequestCtx, u: &protocol::Usage, estimated: bool) {
    let o = &mut ctx.outcome;
    o.input_tokens = u.input_tokens;
    o.output_tokens = u.output_tokens;
    o.cached_input_tokens = u.cache_read_tokens;
    o.cache_write_tokens = u.cache_write_tokens;
    o.reasoning_tokens = u.reasoning_tokens;
    o.usage_estimated = estimated;
    o.input_unknown = false;
}

/// Records an estimated usage for an answer without the provider's final usage: what the
/// provider reported so far (`partial`, e.g. Anthropic's `message_start`), and the larger
/// of its output figure and `streamed_tokens` (the tokenizer count of the text streamed).
/// When it reported no input, the input is marked unknown: the attempt loop's caller, which
/// holds the request, fills in its estimate ([`crate::outcome::Outcome::fill_input_estimate`]),
/// so the tokenizer runs only for such answers (over the prompt, or over the sample of it a
/// committed stream keeps: `InferenceRequest::release_payload`).
pub(crate) fn estimate_usage(
    ctx: &mut RequestCtx,
    partial: Option<protocol::Usage>,
    streamed_tokens: u64,
) {
    let mut u = partial.unwrap_or_default();
    u.output_tokens = u.output_tokens.max(streamed_tokens);
    set_usage(ctx, &u, true);
    ctx.outcome.input_unknown = u.input_tokens == 0;
}
