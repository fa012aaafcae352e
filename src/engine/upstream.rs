//! Owns what the attempt loop ([`crate::engine::attempt`]), the unary exchange ([`crate::stream::unary`])
//! and the stream pump ([`crate::stream::pump`]) share about one attempt: how it ends ([`Attempt`]),
//! the client-disconnect signal, sending the request and telling a stale pooled connection
//! from a provider that may have processed the request ([`send`]), and returning a finished
//! upstream connection to the pool. It depends on none of them, so each arrow points down:
//! attempt → unary / pump → upstream.

use std::time::Duration;

use crate::engine::pool::Connector;
use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use crate::config::Route;
use crate::error::{AttemptError, AttemptFailure, GatewayError};
use crate::metrics::metrics;
use crate::protocol;

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

/// How long after the request was written a close or reset of a *reused* connection still
/// proves the provider had closed that connection before the request reached it (a
/// connection closed while idle is refused at once: its close is already on the way or
/// the peer's kernel resets the write). A request the provider held longer may have been
/// processed, so it is never sent again on its own: that is an attempt failure for the
/// retry policy and the fallback to decide.
pub(crate) const STALE_CLOSE_WINDOW: Duration = Duration::from_millis(20);

/// Sending a request and reading its answer's head failed.
#[derive(Debug)]
pub(crate) struct SendError {
    /// What Pingora reported.
    pub error: pingora::BError,
    /// The provider cannot have processed the request: the write failed, Pingora's HTTP/2
    /// client says the stream was refused unprocessed (`REFUSED_STREAM`, `GOAWAY`), or the
    /// connection closed or reset within [`STALE_CLOSE_WINDOW`] of the write and before any
    /// response byte. Only then may the request go out again on a fresh connection.
    pub unprocessed: bool,
}

/// Sends the request head and body and reads the final (non-1xx) response head, saying on
/// failure whether the request can have been processed ([`SendError::unprocessed`]).
pub(crate) async fn send(
    up: &mut UpstreamSession,
    head: RequestHeader,
    body: Bytes,
) -> Result<(), SendError> {
    let written = async {
        // One send for head and body on HTTP/1.1 (the patched pingora-core, `vendor/`).
        up.write_request_header_and_body(Box::new(head), body)
            .await?;
        up.finish_request_body().await
    };
    if let Err(error) = written.await {
        return Err(SendError {
            error,
            unprocessed: true,
        });
    }
    let sent = tokio::time::Instant::now();
    loop {
        if let Err(error) = up.read_response_header().await {
            let unprocessed = closed_unprocessed(&error, sent.elapsed());
            return Err(SendError { error, unprocessed });
        }
        match up.response_header() {
            Some(h) if h.status.as_u16() < 200 => {}
            _ => return Ok(()),
        }
    }
}

/// Whether a response-head read error `after` the request was written proves the request
/// unprocessed (see [`SendError::unprocessed`]).
fn closed_unprocessed(e: &pingora::Error, after: Duration) -> bool {
    use pingora::RetryType;
    match e.retry {
        // Pingora's HTTP/2 client: refused before any processing (RFC 9113 §8.7).
        RetryType::Decided(true) => true,
        // A close or an I/O error (reset), safe only on a reused connection: safe here only
        // when it came at once and before any byte of an answer.
        RetryType::ReusedOnly => after <= STALE_CLOSE_WINDOW && !response_bytes_read(e),
        RetryType::Decided(false) => false,
    }
}

/// Whether Pingora's HTTP/1 client had read part of a response head when the connection
/// failed (its context says `bytes already read: N`; an HTTP/2 error carries none).
fn response_bytes_read(e: &pingora::Error) -> bool {
    e.context
        .as_ref()
        .and_then(|c| c.as_str().rsplit_once("bytes already read: "))
        .is_some_and(|(_, n)| n.trim() != "0")
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
pub const STALE_CONNECTION: &str = "stale_connection";

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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP/1.1 server: reads one request (head and `Content-Length` body), waits
    /// `hold`, writes `reply` and closes.
    async fn server(reply: &'static [u8], hold: Duration) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            // The test request has a 2-byte body.
            while !buf.windows(6).any(|w| w == b"\r\n\r\n{}") {
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
            tokio::time::sleep(hold).await;
            s.write_all(reply).await.unwrap();
        });
        addr
    }

    async fn send_to(addr: std::net::SocketAddr) -> Result<(), SendError> {
        let connector = Connector::new();
        let peer = pingora::upstreams::peer::HttpPeer::new(addr, false, String::new());
        let (mut up, _) = connector.get_http_session(&peer).await.unwrap();
        let mut head = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        head.insert_header("host", "127.0.0.1").unwrap();
        head.insert_header("content-length", "2").unwrap();
        send(&mut up, head, Bytes::from_static(b"{}")).await
    }

    #[tokio::test]
    async fn only_a_close_at_once_and_before_any_answer_byte_proves_the_request_unprocessed() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(send_to(server(ok, Duration::ZERO).await).await.is_ok());

        // Closed at once, nothing answered: unprocessed when seen within the window (checked
        // at fixed times here: a loaded machine may see the close late).
        let e = send_to(server(b"", Duration::ZERO).await)
            .await
            .unwrap_err();
        assert!(!response_bytes_read(&e.error), "{}", e.error);
        assert!(closed_unprocessed(&e.error, Duration::ZERO), "{}", e.error);
        assert!(!closed_unprocessed(&e.error, STALE_CLOSE_WINDOW * 2));

        // Part of an answer arrived: never unprocessed.
        let e = send_to(server(b"HTTP/1.1 200", Duration::ZERO).await)
            .await
            .unwrap_err();
        assert!(response_bytes_read(&e.error), "{}", e.error);
        assert!(!closed_unprocessed(&e.error, Duration::ZERO));
        assert!(!e.unprocessed);

        // Held, then closed (the silent upstream of the issue): never unprocessed.
        let e = send_to(server(b"", STALE_CLOSE_WINDOW * 5).await)
            .await
            .unwrap_err();
        assert!(!e.unprocessed, "{}", e.error);
    }
}
