//! Owns the attempt loop of the LLM endpoints: try the candidate routes in order over
//! Pingora's `Connector` (its pool, TLS, H1/H2 client), commit to the client only on a good
//! upstream answer, then pump the stream.
//!
//! Why a loop inside `request_filter` and not Pingora's native retry: the native path replays
//! at most 64 KiB of request body and has no timer hook (see `PINGORA-NOTES.md` 1.4-1.6).
//! Here the body is read once and replayed to any number of providers, and every wait is a
//! `select!` over the upstream, timers and the downstream noticing a close.
//!
//! The line it never crosses: **fallback only before the first byte** reaches the client.
//! For streams the response head is held until the first upstream SSE data event arrives,
//! so a provider that fails before that is invisible to the client. After the commit a
//! failure ends the stream with an SSE error event; a non-streaming answer whose body broke
//! gets 502. A request is never sent again after any byte of its response was received.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::connectors::http::Connector;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;
use tokio::time::{sleep_until, Instant};

use super::ctx::RequestCtx;
use super::pipe::{PipeError, StreamPipe};
use super::request::InferenceRequest;
use super::respond;
use crate::config::{HopTimeouts, Model, Provider, ProviderKind, Route};
use crate::error::{parse_retry_after, AttemptError, AttemptFailure, GatewayError};
use crate::metrics::metrics;
use crate::protocol::{self, Dialect};
use crate::providers::encoding::{ContentCoding, DecodeError, Decoder};
use crate::providers::{self, openai};
use crate::routing::Candidate;
use crate::sse;

/// Largest upstream error body read for pass-through (bytes).
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// Idle time a pooled upstream connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// After `[DONE]`, how long the upstream's end of body is awaited to pool its connection.
const DONE_DRAIN: Duration = Duration::from_millis(200);
/// Most output bytes gathered from already-received upstream chunks into one downstream
/// write (see [`coalesce_ready`]).
const COALESCE_BYTES: usize = 16 * 1024;

/// The client disconnected; the phase is the `sluice_client_aborts_total` label.
#[derive(Debug, Clone, Copy)]
pub struct ClientGone(pub &'static str);

/// How one attempt ended.
enum Attempt {
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
/// Pingora keeps them for it and this stays pending (see [`super::connection`]).
async fn client_gone(session: &mut Session) {
    let _ = session.downstream_session.read_body_or_idle(true).await;
}

/// Whether an upstream status is worth another provider (the active probes use the same
/// predicate to call a provider down).
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 401 | 403 | 408 | 409 | 429 | 500..=599)
}

/// Runs the attempt loop and writes the response.
///
/// # Errors
/// [`ClientGone`] when the client disconnected (nothing more can be written).
pub async fn run(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    candidates: &[Candidate<'_>],
) -> Result<(), ClientGone> {
    let mut last_error: Option<GatewayError> = None;
    let mut previous: Option<(String, &'static str)> = None;
    for (i, cand) in candidates.iter().enumerate() {
        if !cand.health.admit() {
            continue;
        }
        let route = cand.route;
        if let Some((from, reason)) = previous.take() {
            metrics()
                .fallback_total
                .with_label_values(&[
                    model.id.as_str(),
                    from.as_str(),
                    route.provider.id.as_str(),
                    reason,
                ])
                .inc();
        }
        let mut same_route_retry_used = false;
        loop {
            ctx.attempt_count += 1;
            let outcome = attempt(connector, session, ctx, req, model, route).await;
            match outcome {
                Attempt::Done => {
                    metrics()
                        .upstream_attempts_total
                        .with_label_values(&[route.provider.id.as_str(), "ok"])
                        .inc();
                    if ctx.outcome.upstream_broke {
                        // Answered, then broke mid-way: the client got an error, so does health.
                        cand.health
                            .record_failure(&route.provider.passive_health, None);
                    } else {
                        cand.health
                            .record_success(&route.provider.passive_health, ctx.outcome.ttft);
                    }
                    #[expect(clippy::cast_precision_loss, reason = "small counts")]
                    metrics()
                        .fallback_depth
                        .observe(ctx.fallback_depth() as f64);
                    return Ok(());
                }
                Attempt::Final(err) => {
                    // The provider answered (a 4xx about the request): it is healthy.
                    cand.health
                        .record_success(&route.provider.passive_health, None);
                    ctx.outcome.provider = Some(route.provider.id.clone());
                    let _ = respond::write_error(session, ctx, &err).await;
                    return Ok(());
                }
                Attempt::Shutdown => {
                    cand.health.release_trial();
                    let err = GatewayError::Overloaded {
                        message: "the gateway is shutting down; retry the request".into(),
                        reason: "shutting_down",
                        retry_after: Duration::from_secs(1),
                    };
                    let _ = respond::write_error(session, ctx, &err).await;
                    return Ok(());
                }
                Attempt::Gone(g) => {
                    cand.health.release_trial();
                    return Err(g);
                }
                Attempt::Failed(ae, err) => {
                    let reason = ae.failure.label();
                    log::info!(
                        target: "sluice::proxy::attempt",
                        "attempt failed request_id={} provider={} upstream_model={} reason={} detail={:?}",
                        ctx.request_id, ae.provider, ae.upstream_model, reason, ae.detail
                    );
                    metrics()
                        .upstream_attempts_total
                        .with_label_values(&[route.provider.id.as_str(), reason])
                        .inc();
                    cand.health
                        .record_failure(&route.provider.passive_health, ae.retry_after);
                    let transient = matches!(
                        ae.failure,
                        AttemptFailure::Connect | AttemptFailure::Status(502 | 503)
                    ) && ae.retry_after.is_none();
                    ctx.attempts.push(ae);
                    last_error = Some(err);
                    // The same-route retry is for the last resort only: with another
                    // candidate available, falling back at once is as good for the client
                    // and costs only the failed provider's own response time (no backoff,
                    // no second request to a struggling provider). A route that just started
                    // resting (turned unhealthy, or its half-open trial failed) gets no
                    // second request either: the trial is a single request.
                    let resting = cand.health.cooldown_remaining().is_some();
                    let alternative = candidates[i + 1..].iter().any(|c| c.health.is_available());
                    if transient && !same_route_retry_used && !resting && !alternative {
                        same_route_retry_used = true;
                        metrics()
                            .upstream_retries_total
                            .with_label_values(&[route.provider.id.as_str(), reason])
                            .inc();
                        let backoff = Duration::from_millis(20 + fastrand::u64(..40));
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = client_gone(session) => return Err(ClientGone("retry_backoff")),
                        }
                        continue;
                    }
                    previous = Some((route.provider.id.clone(), reason));
                    ctx.failed_routes += 1;
                    break;
                }
            }
        }
    }
    let err = last_error.unwrap_or_else(|| GatewayError::NoRoute {
        message: format!("no healthy provider for model `{}` right now", model.id),
        retry_after: None,
    });
    let _ = respond::write_error(session, ctx, &err).await;
    Ok(())
}

/// Serializes the request for the route's provider: as is (only `model` replaced) when
/// the provider speaks the client's dialect, else encoded from the canonical request with
/// the protocol layer.
fn upstream_body(
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
) -> Result<Vec<u8>, GatewayError> {
    let upstream = route.provider.kind.dialect();
    if req.dialect == upstream {
        // Metering: a Chat stream always asks for the final usage chunk (stripped from the
        // client's stream when it did not ask; see `StreamPipe`).
        let ask_usage = req.stream && !req.include_usage && upstream == Dialect::ChatCompletions;
        return openai::request_body(&req.body, &route.upstream_model, ask_usage)
            .map_err(|e| GatewayError::Internal(format!("cannot serialize request: {e}")));
    }
    let refused = |e: &protocol::ProtocolError| {
        if e.is_client_error() {
            GatewayError::invalid(e.to_string(), e.field())
        } else {
            GatewayError::Internal(e.to_string())
        }
    };
    let canonical = req.canonical().map_err(refused)?;
    let opts = protocol::UpstreamOptions {
        model: &route.upstream_model,
        default_max_tokens: model.default_max_tokens,
    };
    protocol::encode_request(upstream, canonical, &opts).map_err(|e| refused(&e))
}

fn failed(route: &Route, failure: AttemptFailure, detail: String, err: GatewayError) -> Attempt {
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

/// Sends the request head and body (none for a `GET`) and reads the final (non-1xx)
/// response head. Also used by the active health probes.
///
/// # Errors
/// Pingora's write/read errors (connection closed, reset, protocol).
pub(crate) async fn exchange(
    up: &mut UpstreamSession,
    head: pingora::http::RequestHeader,
    body: Option<Bytes>,
) -> pingora::Result<()> {
    up.write_request_header(Box::new(head)).await?;
    if let Some(body) = body {
        up.write_request_body(body, true).await?;
    }
    up.finish_request_body().await?;
    loop {
        up.read_response_header().await?;
        match up.response_header() {
            Some(h) if h.status.as_u16() < 200 => {}
            _ => return Ok(()),
        }
    }
}

/// One attempt against one route.
async fn attempt(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
) -> Attempt {
    let provider = &route.provider;
    let timeouts = ctx.config.timeouts_for(provider, model);
    let body = match upstream_body(req, model, route) {
        Ok(b) => Bytes::from(b),
        Err(e) => return Attempt::Final(e),
    };
    let target = match providers::target(provider).await {
        Ok(t) => t,
        Err(m) => {
            let err = GatewayError::UpstreamUnavailable {
                message: format!("provider `{}` is unreachable", provider.id),
                retry_after: None,
            };
            return failed(route, AttemptFailure::Connect, m, err);
        }
    };
    let path = providers::chat_path(provider.kind);
    let head = match providers::request_head(
        provider,
        &target,
        path,
        body.len(),
        req.stream,
        &ctx.request_id,
    ) {
        Ok(h) => h,
        Err(e) => {
            return Attempt::Final(GatewayError::Internal(format!("bad upstream request: {e}")))
        }
    };
    let mut head = head;
    if let Some(beta) = req
        .anthropic_beta
        .as_deref()
        .filter(|_| provider.kind == ProviderKind::Anthropic)
    {
        if head.insert_header("anthropic-beta", beta).is_err() {
            return Attempt::Final(GatewayError::invalid(
                "the `anthropic-beta` header is not a valid header value",
                None,
            ));
        }
    }

    // Connect (a stale pooled connection gets one fresh retry), send, read the head.
    let mut fresh_tries = 0;
    let mut up = loop {
        let connect = tokio::select! {
            // Boxed: Pingora's connect future is ~9 KiB and would otherwise stay inlined in
            // every held stream's future long after the connect (memory per open stream).
            r = tokio::time::timeout(timeouts.connect, Box::pin(connector.get_http_session(&target.peer))) => r,
            () = client_gone(session) => return Attempt::Gone(ClientGone("connecting")),
            () = crate::shutdown::streams_cancelled() => return Attempt::Shutdown,
        };
        let (mut up, reused) = match connect {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                // Pingora's own connect timer (the peer's, same length as ours) may win the race.
                let message = if matches!(e.etype(), pingora::ErrorType::ConnectTimedout) {
                    format!("connecting to provider `{}` timed out", provider.id)
                } else {
                    format!("cannot connect to provider `{}`", provider.id)
                };
                let err = GatewayError::UpstreamUnavailable {
                    message,
                    retry_after: None,
                };
                return failed(route, AttemptFailure::Connect, e.to_string(), err);
            }
            Err(_) => {
                let err = GatewayError::UpstreamUnavailable {
                    message: format!("connecting to provider `{}` timed out", provider.id),
                    retry_after: None,
                };
                return failed(
                    route,
                    AttemptFailure::Connect,
                    "connect timeout".into(),
                    err,
                );
            }
        };
        let exchanged = tokio::select! {
            r = tokio::time::timeout(timeouts.first_byte, exchange(&mut up, head.clone(), Some(body.clone()))) => r,
            () = client_gone(session) => {
                up.shutdown().await;
                return Attempt::Gone(ClientGone("waiting_head"));
            }
            () = crate::shutdown::streams_cancelled() => {
                up.shutdown().await;
                return Attempt::Shutdown;
            }
        };
        match exchanged {
            Ok(Ok(())) => break up,
            Ok(Err(e)) if reused && fresh_tries == 0 => {
                // A pooled connection the provider had closed: not the provider's fault.
                log::debug!("stale pooled upstream connection: {e}");
                fresh_tries += 1;
            }
            Ok(Err(e)) => {
                up.shutdown().await;
                let err = GatewayError::UpstreamUnavailable {
                    message: format!("provider `{}` failed before answering", provider.id),
                    retry_after: None,
                };
                return failed(route, AttemptFailure::Protocol, e.to_string(), err);
            }
            Err(_) => {
                up.shutdown().await;
                let err = GatewayError::UpstreamTimeout(format!(
                    "provider `{}` sent no response head within {} ms",
                    provider.id,
                    timeouts.first_byte.as_millis()
                ));
                return failed(
                    route,
                    AttemptFailure::FirstByteTimeout,
                    "first byte timeout".into(),
                    err,
                );
            }
        }
    };
    // The upstream session keeps its own copy; ours would live as long as the stream.
    drop(head);
    drop(body);

    let Some(resp) = up.response_header() else {
        up.shutdown().await;
        return Attempt::Final(GatewayError::Internal("no upstream response head".into()));
    };
    let status = resp.status.as_u16();
    if !(200..300).contains(&status) {
        let retry_after = resp
            .headers
            .get("retry-after")
            .and_then(|v| parse_retry_after(v.as_bytes()));
        return upstream_error(
            session,
            &mut up,
            route,
            status,
            retry_after,
            timeouts,
            ctx.dialect,
        )
        .await;
    }
    if !req.stream && is_event_stream(resp.headers.get("content-type").map(|v| v.as_bytes())) {
        // A provider that ignored `stream: false`: its events are no chat completion object,
        // and the client was promised JSON. Nothing was committed: the next route may answer.
        up.shutdown().await;
        let err = GatewayError::UpstreamUnavailable {
            message: format!(
                "provider `{}` answered a non-streaming request with a stream (text/event-stream)",
                provider.id
            ),
            retry_after: None,
        };
        return failed(
            route,
            AttemptFailure::Protocol,
            "text/event-stream answer to stream:false".into(),
            err,
        );
    }
    let coding = match ContentCoding::from_header(
        resp.headers.get("content-encoding").map(|v| v.as_bytes()),
    ) {
        Ok(c) => c,
        Err(name) => {
            up.shutdown().await;
            let err = GatewayError::UpstreamUnavailable {
                message: format!(
                    "provider `{}` answered in content coding `{name}`, which Sluice does not decode",
                    provider.id
                ),
                retry_after: None,
            };
            return failed(
                route,
                AttemptFailure::Protocol,
                format!("unsupported content-encoding {name:?}"),
                err,
            );
        }
    };
    if req.stream {
        stream(
            connector,
            session,
            ctx,
            req,
            model,
            route,
            &target.peer,
            up,
            timeouts,
            coding,
        )
        .await
    } else {
        unary(
            connector,
            session,
            ctx,
            route,
            &target.peer,
            up,
            timeouts,
            coding,
        )
        .await
    }
}

/// Whether a `Content-Type` value names `text/event-stream` (media type compared without
/// its parameters, case-insensitively, RFC 9110 §8.3.1).
fn is_event_stream(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|v| {
        let media = v.split(|&b| b == b';').next().unwrap_or_default();
        media
            .trim_ascii()
            .eq_ignore_ascii_case(b"text/event-stream")
    })
}

/// Reads a non-2xx answer's body (bounded) and turns it into a client error.
async fn upstream_error(
    session: &mut Session,
    up: &mut UpstreamSession,
    route: &Route,
    status: u16,
    retry_after: Option<Duration>,
    timeouts: HopTimeouts,
    client: Dialect,
) -> Attempt {
    let provider = &route.provider;
    let mut body = Vec::new();
    // A compressed error body is decoded (bounded) like any answer; an unknown or broken
    // coding leaves what was decoded so far (the status still speaks).
    let coding = up
        .response_header()
        .map(|h| {
            ContentCoding::from_header(h.headers.get("content-encoding").map(|v| v.as_bytes()))
        })
        .and_then(Result::ok);
    let mut decoder = coding
        .filter(|c| *c != ContentCoding::Identity)
        .and_then(|c| Decoder::new(c).ok());
    let read_all = async {
        loop {
            let chunk = match up.read_response_body().await {
                Ok(c) => c,
                Err(_) => break,
            };
            let end = chunk.is_none();
            let room = MAX_ERROR_BODY_BYTES.saturating_sub(body.len());
            let raw = chunk.as_deref().unwrap_or_default();
            let piece = match decoder.as_mut() {
                Some(d) => match d.decode(raw, end, room) {
                    Ok(p) => p,
                    Err(_) => break,
                },
                None => raw,
            };
            body.extend_from_slice(&piece[..piece.len().min(room)]);
            if end || room <= piece.len() {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(timeouts.first_byte, read_all) => {}
        () = client_gone(session) => {
            up.shutdown().await;
            return Attempt::Gone(ClientGone("waiting_head"));
        }
    }
    up.shutdown().await;
    let err = normalize_upstream_error(provider, status, &body, retry_after, client);
    if retryable_status(status) {
        failed(
            route,
            AttemptFailure::Status(status),
            format!("HTTP {status}"),
            err,
        )
    } else {
        Attempt::Final(err)
    }
}

/// An upstream error body in OpenAI's shape, provider keys scrubbed. A provider's 401/403 is
/// about the gateway's credentials, not the client's: the client gets 502. Anthropic's 529
/// stays 529 for Messages clients (their API has it) and is a 503 for the others.
fn normalize_upstream_error(
    provider: &Provider,
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
    client: Dialect,
) -> GatewayError {
    let (error_type, code, message) = match provider.kind.dialect() {
        // OpenAI-compatible bodies pass through with their own type and code.
        Dialect::ChatCompletions => openai::error_parts(status, body),
        up => {
            let (kind, message) = protocol::decode_error_body(up, status, body);
            (kind.openai_type().to_string(), None, message)
        }
    };
    let message = providers::scrub_key(provider, &message);
    // Every field the client sees is scrubbed, not only the message.
    let error_type = providers::scrub_key(provider, &error_type);
    let code = code.map(|c| providers::scrub_key(provider, &c));
    if matches!(status, 401 | 403) {
        return GatewayError::UpstreamUnavailable {
            message: format!(
                "provider `{}` rejected the gateway's credentials",
                provider.id
            ),
            retry_after: None,
        };
    }
    // Anthropic's 529 "overloaded" is a 503 to OpenAI clients.
    let status = if status == 529 && client != Dialect::Messages {
        503
    } else {
        status
    };
    GatewayError::Upstream {
        status,
        error_type,
        code,
        message,
        retry_after,
    }
}

/// Why a non-streaming answer could not be read whole.
enum UnaryBreak {
    /// The read failed or timed out (detail for the log).
    Broken(String),
    /// The (decoded) answer is over `server.max_response_body_bytes`.
    TooLarge,
    /// The content coding is broken.
    Encoding(DecodeError),
}

/// A non-streaming answer: read it all (bounded, decoded), rewrite `model`, write it.
#[expect(
    clippy::too_many_arguments,
    reason = "the attempt's state is passed explicitly, not hidden in the ctx"
)]
async fn unary(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: &Route,
    peer: &pingora::upstreams::peer::HttpPeer,
    mut up: UpstreamSession,
    timeouts: HopTimeouts,
    coding: ContentCoding,
) -> Attempt {
    let limit = ctx.config.server.max_response_body_bytes;
    let mut decoder = match Decoder::new(coding) {
        Ok(d) => d,
        Err(e) => return Attempt::Final(GatewayError::Internal(e.to_string())),
    };
    let mut body = BytesMut::new();
    let broken: Option<UnaryBreak> = loop {
        let next = tokio::select! {
            r = tokio::time::timeout(timeouts.idle.max(timeouts.first_byte), up.read_response_body()) => r,
            () = client_gone(session) => {
                up.shutdown().await;
                return Attempt::Gone(ClientGone("waiting_body"));
            }
            () = crate::shutdown::streams_cancelled() => {
                up.shutdown().await;
                return Attempt::Shutdown;
            }
        };
        match next {
            Ok(Ok(chunk)) => {
                let end = chunk.is_none();
                let room = limit.saturating_sub(body.len());
                match decoder.decode(chunk.as_deref().unwrap_or_default(), end, room) {
                    Ok(piece) => body.extend_from_slice(piece),
                    Err(DecodeError::TooLarge { .. }) => break Some(UnaryBreak::TooLarge),
                    Err(e) => break Some(UnaryBreak::Encoding(e)),
                }
                if end {
                    break None;
                }
            }
            Ok(Err(e)) => break Some(UnaryBreak::Broken(e.to_string())),
            Err(_) => break Some(UnaryBreak::Broken("upstream body read timed out".into())),
        }
    };
    if let Some(why) = broken {
        // Bytes of the answer were received: never send the request again (no double billing).
        up.shutdown().await;
        let provider = &route.provider.id;
        let err = match why {
            UnaryBreak::Broken(detail) => {
                log::warn!(
                    "upstream body broke request_id={} provider={provider} detail={detail:?}",
                    ctx.request_id
                );
                GatewayError::UpstreamUnavailable {
                    message: format!("provider `{provider}` broke off its answer"),
                    retry_after: None,
                }
            }
            UnaryBreak::TooLarge => {
                log::warn!(
                    "upstream answer too large request_id={} provider={provider} limit_bytes={limit}",
                    ctx.request_id
                );
                GatewayError::Upstream {
                    status: 502,
                    error_type: "api_error".into(),
                    code: Some("upstream_response_too_large".into()),
                    message: format!(
                        "provider `{provider}` sent an answer larger than the gateway's limit of \
                         {limit} bytes (server.max_response_body_bytes)"
                    ),
                    retry_after: None,
                }
            }
            UnaryBreak::Encoding(e) => {
                log::warn!(
                    "upstream answer undecodable request_id={} provider={provider} error={e}",
                    ctx.request_id
                );
                GatewayError::UpstreamUnavailable {
                    message: format!("provider `{provider}` sent an unreadable answer: {e}"),
                    retry_after: None,
                }
            }
        };
        ctx.outcome.provider = Some(route.provider.id.clone());
        ctx.outcome.upstream_broke = true;
        let _ = respond::write_error(session, ctx, &err).await;
        return Attempt::Done;
    }
    if up.response_done() {
        connector
            .release_http_session(up, peer, Some(POOL_IDLE))
            .await;
    } else {
        up.shutdown().await;
    }
    // Invalid UTF-8 would break the client's JSON decode (and the Anthropic translation):
    // replaced with U+FFFD as in streams, and counted.
    if let Some((repaired, invalid)) = sse::repair_utf8(&body) {
        metrics()
            .sse_invalid_utf8_total
            .with_label_values(&[route.provider.id.as_str()])
            .inc_by(invalid);
        body = BytesMut::from(&repaired[..]);
    }
    let standard = ctx.standard_model.clone().unwrap_or_default();
    let upstream = route.provider.kind.dialect();
    // Metering: the provider's usage object, read from the upstream body with all classes
    // (the translated path's decoded usage is the same figures).
    let mut usage = protocol::Usage::default();
    let mut usage_seen = sse::merge_usage(upstream, &body, &mut usage);
    let out: Vec<u8> = match (ctx.dialect, upstream) {
        (client, up) if client == up => {
            let mut out = BytesMut::with_capacity(body.len() + 32);
            route.rewriter.rewrite_json(&body, &mut out);
            out.to_vec()
        }
        (client, up) => match protocol::decode_response(up, &body, unix_now()) {
            Ok(mut resp) => {
                resp.model.clone_from(&standard);
                if resp.usage != protocol::Usage::default() {
                    usage = resp.usage;
                    usage_seen = true;
                }
                protocol::encode_response(client, &resp)
            }
            Err(e) => {
                let err = GatewayError::UpstreamUnavailable {
                    message: providers::scrub_key(
                        &route.provider,
                        &format!(
                            "provider `{}` sent an unreadable answer: {}",
                            route.provider.id,
                            e.message()
                        ),
                    ),
                    retry_after: None,
                };
                let _ = respond::write_error(session, ctx, &err).await;
                return Attempt::Done;
            }
        },
    };
    if usage_seen {
        set_usage(ctx, &usage, false);
    } else {
        // No usage in the body: estimated from its text.
        let mut est = crate::metering::OutputEstimator::default();
        crate::metering::stream_text(upstream, &body, true, |t| est.push_json(t));
        estimate_usage(ctx, None, est.tokens());
    }
    ctx.outcome.provider = Some(route.provider.id.clone());
    ctx.outcome.upstream_model = Some(route.upstream_model.clone());
    ctx.outcome.ttft = Some(ctx.received.elapsed());
    ctx.outcome.label = "ok";
    let head = match respond::proxied_head(ctx, 200, false, Some(out.len()), &route.provider.id) {
        Ok(h) => h,
        Err(e) => return Attempt::Final(GatewayError::Internal(e.to_string())),
    };
    ctx.downstream_committed = true;
    ctx.outcome.status = 200;
    ctx.outcome.bytes_out = out.len() as u64;
    if session
        .write_response_header(Box::new(head), false)
        .await
        .is_err()
        || session
            .write_response_body(Some(Bytes::from(out)), true)
            .await
            .is_err()
    {
        return Attempt::Gone(ClientGone("writing"));
    }
    Attempt::Done
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A streaming answer: hold the head until the first data event, then commit and pump with
/// heartbeats, idle and duration limits, and client-disconnect detection.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state is passed explicitly, not hidden in the ctx"
)]
#[expect(
    clippy::too_many_lines,
    reason = "one linear state machine reads best in one place"
)]
async fn stream(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
    peer: &pingora::upstreams::peer::HttpPeer,
    mut up: UpstreamSession,
    timeouts: HopTimeouts,
    coding: ContentCoding,
) -> Attempt {
    let standard = ctx.standard_model.clone().unwrap_or_default();
    let server = &ctx.config.server;
    let mut pipe = match StreamPipe::new(
        route,
        ctx.dialect,
        &standard,
        req.include_usage,
        coding,
        server.max_event_bytes,
        server.max_buffered_bytes_per_stream,
        unix_now(),
    ) {
        Ok(p) => p,
        Err(e) => {
            up.shutdown().await;
            return Attempt::Final(GatewayError::Internal(format!("{e:?}")));
        }
    };
    let coalesce_bytes = COALESCE_BYTES.min(server.max_buffered_bytes_per_stream);
    let head_at = Instant::now();
    let first_event_deadline = head_at + timeouts.first_event;
    let early_commit_at = model.early_commit_after.map(|d| ctx.received + d);
    let mut ended = false;

    // Phase 1: before the commit. Any failure here falls back.
    while pipe.data_events == 0 {
        enum Ev {
            Chunk(pingora::Result<Option<Bytes>>),
            FirstEventTimeout,
            EarlyCommit,
            Gone,
            Shutdown,
        }
        let ev = tokio::select! {
            biased;
            () = client_gone(session) => Ev::Gone,
            r = up.read_response_body() => Ev::Chunk(r),
            () = sleep_until(first_event_deadline) => Ev::FirstEventTimeout,
            () = sleep_until(early_commit_at.unwrap_or(first_event_deadline)), if early_commit_at.is_some() => Ev::EarlyCommit,
            () = crate::shutdown::streams_cancelled() => Ev::Shutdown,
        };
        match ev {
            Ev::Shutdown => {
                up.shutdown().await;
                return Attempt::Shutdown;
            }
            Ev::Gone => {
                up.shutdown().await;
                return Attempt::Gone(ClientGone("waiting_first_event"));
            }
            Ev::FirstEventTimeout => {
                up.shutdown().await;
                let err = GatewayError::UpstreamTimeout(format!(
                    "provider `{}` sent no event within {} ms",
                    route.provider.id,
                    timeouts.first_event.as_millis()
                ));
                return failed(
                    route,
                    AttemptFailure::FirstEventTimeout,
                    "first event timeout".into(),
                    err,
                );
            }
            Ev::EarlyCommit => break,
            Ev::Chunk(Ok(chunk)) => {
                let end = chunk.is_none();
                match pipe.feed(chunk.as_deref()) {
                    Ok(()) => {}
                    Err(PipeError::Upstream {
                        error_type,
                        message,
                        ..
                    }) => {
                        up.shutdown().await;
                        let err = GatewayError::Upstream {
                            status: 502,
                            error_type: providers::scrub_key(&route.provider, &error_type),
                            code: None,
                            message: providers::scrub_key(&route.provider, &message),
                            retry_after: None,
                        };
                        return failed(
                            route,
                            AttemptFailure::Protocol,
                            "in-band error before first event".into(),
                            err,
                        );
                    }
                    Err(PipeError::Framing { reason, message: m }) => {
                        up.shutdown().await;
                        // The client is told the real cause (the pipe's messages name the
                        // provider and the limit or break, never the upstream's bytes).
                        let err = GatewayError::UpstreamUnavailable {
                            message: providers::scrub_key(&route.provider, &m),
                            retry_after: None,
                        };
                        return failed(
                            route,
                            AttemptFailure::Protocol,
                            format!("{reason}: {m}"),
                            err,
                        );
                    }
                }
                if end {
                    ended = true;
                    if pipe.data_events == 0 {
                        let err = GatewayError::UpstreamUnavailable {
                            message: format!(
                                "provider `{}` closed the stream before its first event",
                                route.provider.id
                            ),
                            retry_after: None,
                        };
                        return failed(
                            route,
                            AttemptFailure::Protocol,
                            "closed before first event".into(),
                            err,
                        );
                    }
                }
            }
            Ev::Chunk(Err(e)) => {
                up.shutdown().await;
                let err = GatewayError::UpstreamUnavailable {
                    message: format!(
                        "provider `{}` broke the stream before its first event",
                        route.provider.id
                    ),
                    retry_after: None,
                };
                return failed(route, AttemptFailure::Protocol, e.to_string(), err);
            }
        }
    }

    // Commit: the response head goes out with whatever complete events we hold.
    ctx.outcome.provider = Some(route.provider.id.clone());
    ctx.outcome.upstream_model = Some(route.upstream_model.clone());
    ctx.outcome.label = "ok";
    ctx.outcome.status = 200;
    let mut head = match respond::proxied_head(ctx, 200, true, None, &route.provider.id) {
        Ok(h) => h,
        Err(e) => {
            up.shutdown().await;
            return Attempt::Final(GatewayError::Internal(e.to_string()));
        }
    };
    if session.req_header().version == http::Version::HTTP_10 {
        // HTTP/1.0 has no chunked encoding (RFC 9112 §7.1): the stream ends with the connection.
        head.remove_header("transfer-encoding");
        session.set_keepalive(None);
    }
    ctx.downstream_committed = true;
    if session
        .write_response_header(Box::new(head), false)
        .await
        .is_err()
    {
        up.shutdown().await;
        return Attempt::Gone(ClientGone("writing"));
    }
    let first = pipe.take();
    if pipe.first_content {
        ctx.outcome.ttft = Some(ctx.received.elapsed());
    }
    // The whole answer may already be here (`[DONE]` seen): end the response at once.
    let complete = ended || pipe.finished();
    if !first.is_empty() || complete {
        ctx.outcome.bytes_out += first.len() as u64;
        let body = (!first.is_empty()).then_some(first);
        if session.write_response_body(body, complete).await.is_err() {
            up.shutdown().await;
            return Attempt::Gone(ClientGone("streaming"));
        }
    }
    if complete {
        Box::pin(release_or_close(connector, up, peer)).await;
        finish_stream(ctx, &pipe);
        return Attempt::Done;
    }

    // Phase 2: committed. Pump until the end; failures become an SSE error event.
    let max_end = ctx
        .config
        .server
        .max_stream_duration
        .map(|d| ctx.received + d);
    // Timers are armed once and re-armed only when they fire (lazy deadlines): a chunk
    // just stamps `last_upstream` / `last_write`, so the per-event path touches no timer.
    // The heartbeat clock runs on bytes written to the client: `last_write` is the last
    // write of events or of a heartbeat. Upstream events that produce no client bytes
    // (Anthropic `ping`, dropped comments) do not postpone a heartbeat.
    let idle = timeouts.idle.max(Duration::from_millis(1));
    let mut last_upstream = Instant::now();
    let mut last_write = last_upstream;
    let idle_timer = sleep_until(last_upstream + idle);
    let heartbeat_timer = sleep_until(last_write + timeouts.heartbeat);
    let first_event_timer = sleep_until(first_event_deadline);
    let max_end_timer = sleep_until(max_end.unwrap_or(first_event_deadline));
    tokio::pin!(
        idle_timer,
        heartbeat_timer,
        first_event_timer,
        max_end_timer
    );
    let stream_error: Option<StreamError> = loop {
        enum Ev {
            Chunk(pingora::Result<Option<Bytes>>),
            Gone,
            Idle,
            MaxDuration,
            FirstEventTimeout,
            Shutdown,
        }
        let ev = {
            let read = up.read_response_body();
            tokio::pin!(read);
            loop {
                let waiting_first = pipe.data_events == 0;
                enum Tick {
                    Ev(Ev),
                    Idle,
                    Heartbeat,
                }
                let tick = tokio::select! {
                    biased;
                    () = client_gone(session) => Tick::Ev(Ev::Gone),
                    r = &mut read => Tick::Ev(Ev::Chunk(r)),
                    () = &mut idle_timer => Tick::Idle,
                    () = &mut first_event_timer, if waiting_first => Tick::Ev(Ev::FirstEventTimeout),
                    () = &mut max_end_timer, if max_end.is_some() => Tick::Ev(Ev::MaxDuration),
                    () = crate::shutdown::streams_cancelled() => Tick::Ev(Ev::Shutdown),
                    () = &mut heartbeat_timer => Tick::Heartbeat,
                };
                match tick {
                    Tick::Ev(ev) => break ev,
                    Tick::Idle => {
                        let due = last_upstream + idle;
                        if Instant::now() >= due {
                            break Ev::Idle;
                        }
                        idle_timer.as_mut().reset(due);
                    }
                    Tick::Heartbeat => {
                        let due = last_write + timeouts.heartbeat;
                        if Instant::now() < due {
                            heartbeat_timer.as_mut().reset(due);
                            continue;
                        }
                        // Between events only: `out` is always drained after each chunk.
                        metrics()
                            .heartbeats_total
                            .with_label_values(&[route.provider.id.as_str()])
                            .inc();
                        let beat = protocol::heartbeat(ctx.dialect);
                        ctx.outcome.bytes_out += beat.len() as u64;
                        if session
                            .write_response_body(Some(Bytes::from_static(beat)), false)
                            .await
                            .is_err()
                        {
                            break Ev::Gone;
                        }
                        last_write = Instant::now();
                        heartbeat_timer
                            .as_mut()
                            .reset(last_write + timeouts.heartbeat);
                    }
                }
            }
        };
        match ev {
            Ev::Gone => {
                up.shutdown().await;
                finish_stream(ctx, &pipe);
                return Attempt::Gone(ClientGone("streaming"));
            }
            Ev::Idle => {
                break Some(StreamError::gateway(
                    "idle_timeout",
                    format!(
                        "provider `{}` sent nothing for {} ms",
                        route.provider.id,
                        timeouts.idle.as_millis()
                    ),
                ))
            }
            Ev::MaxDuration => {
                break Some(StreamError::gateway(
                    "max_stream_duration",
                    "the stream reached its maximum duration".to_string(),
                ))
            }
            Ev::Shutdown => {
                break Some(StreamError::gateway(
                    "shutdown",
                    "the gateway is shutting down; retry the request".to_string(),
                ))
            }
            Ev::FirstEventTimeout => {
                break Some(StreamError::gateway(
                    "first_event_timeout",
                    format!(
                        "provider `{}` sent no event within {} ms",
                        route.provider.id,
                        timeouts.first_event.as_millis()
                    ),
                ))
            }
            Ev::Chunk(Err(e)) => break Some(stream_broken(&ctx.request_id, route, &e)),
            Ev::Chunk(Ok(chunk)) => {
                let end = chunk.is_none();
                if let Err(e) = pipe.feed(chunk.as_deref()) {
                    break Some(pipe_failure(route, e));
                }
                // Events that arrived together leave together: one write, not one per event.
                let stop = if end || pipe.finished() {
                    ReadyStop::Pending
                } else {
                    coalesce_ready(&mut up, &mut pipe, coalesce_bytes).await
                };
                let end = end || matches!(stop, ReadyStop::End);
                let had_content = ctx.outcome.ttft.is_some();
                let out = pipe.take();
                if !had_content && pipe.first_content {
                    ctx.outcome.ttft = Some(ctx.received.elapsed());
                }
                last_upstream = Instant::now();
                if !out.is_empty() {
                    last_write = last_upstream;
                }
                // After `[DONE]` nothing more is for the client (no heartbeat either): end
                // its response now rather than when the upstream gets round to closing.
                let complete = end || pipe.finished();
                if !out.is_empty() || complete {
                    ctx.outcome.bytes_out += out.len() as u64;
                    let body = (!out.is_empty()).then_some(out);
                    if session.write_response_body(body, complete).await.is_err() {
                        up.shutdown().await;
                        finish_stream(ctx, &pipe);
                        return Attempt::Gone(ClientGone("streaming"));
                    }
                }
                if complete {
                    break None;
                }
                match stop {
                    ReadyStop::Pending | ReadyStop::End => {}
                    ReadyStop::Broken(e) => break Some(stream_broken(&ctx.request_id, route, &e)),
                    ReadyStop::Pipe(e) => {
                        break Some(pipe_failure(route, e));
                    }
                }
            }
        }
    };

    match stream_error {
        None => Box::pin(release_or_close(connector, up, peer)).await,
        Some(StreamError {
            reason,
            kind,
            error_type,
            message,
        }) => {
            up.shutdown().await;
            metrics()
                .stream_errors_total
                .with_label_values(&[reason])
                .inc();
            ctx.outcome.label = "stream_error";
            // Events completed before the failure (in the chunk that failed, or gathered
            // with it) are the client's: they go out before the error event, never dropped.
            let pending = pipe.take();
            if !pending.is_empty() {
                if ctx.outcome.ttft.is_none() && pipe.first_content {
                    ctx.outcome.ttft = Some(ctx.received.elapsed());
                }
                ctx.outcome.bytes_out += pending.len() as u64;
                if session
                    .write_response_body(Some(pending), false)
                    .await
                    .is_err()
                {
                    finish_stream(ctx, &pipe);
                    return Attempt::Gone(ClientGone("streaming"));
                }
            }
            let ev = pipe.error_event(kind, &error_type, &message, reason);
            ctx.outcome.bytes_out += ev.len() as u64;
            if !matches!(
                reason,
                "max_stream_duration" | "shutdown" | "first_event_timeout"
            ) {
                ctx.outcome.upstream_broke = true;
            }
            if session.write_response_body(Some(ev), true).await.is_err() {
                finish_stream(ctx, &pipe);
                return Attempt::Gone(ClientGone("streaming"));
            }
        }
    }
    finish_stream(ctx, &pipe);
    Attempt::Done
}

/// Where [`coalesce_ready`] stopped; handled after the gathered output is written.
enum ReadyStop {
    /// Nothing more was ready without waiting, or the batch is full.
    Pending,
    /// The upstream body ended.
    End,
    /// Reading the upstream failed.
    Broken(Box<pingora::Error>),
    /// A chunk held an upstream error event or broke the framing; the events completed
    /// before the failure are in the output and are written before the error event.
    Pipe(PipeError),
}

/// Feeds the upstream chunks that are ready *without waiting* into `pipe` (up to
/// [`COALESCE_BYTES`] of output), so that events the provider sent in a burst reach the
/// client in one write and one HTTP chunk instead of one per event: the same syscall
/// count as nginx with `proxy_buffering off`, and no added latency. A read that is not
/// ready is dropped after one poll; Pingora's body reads (H1 and H2) commit no state until
/// their I/O completes, so that is safe.
async fn coalesce_ready(
    up: &mut UpstreamSession,
    pipe: &mut StreamPipe<'_>,
    max_bytes: usize,
) -> ReadyStop {
    while pipe.out.len() < max_bytes && !pipe.finished() {
        let ready = {
            let mut read = std::pin::pin!(up.read_response_body());
            std::future::poll_fn(|cx| {
                std::task::Poll::Ready(match std::future::Future::poll(read.as_mut(), cx) {
                    std::task::Poll::Ready(r) => Some(r),
                    std::task::Poll::Pending => None,
                })
            })
            .await
        };
        match ready {
            None => return ReadyStop::Pending,
            Some(Err(e)) => return ReadyStop::Broken(e),
            Some(Ok(chunk)) => {
                let end = chunk.is_none();
                if let Err(e) = pipe.feed(chunk.as_deref()) {
                    // The events completed before the failure stay in `pipe.out`: they are
                    // written before the error event.
                    return ReadyStop::Pipe(e);
                }
                if end {
                    return ReadyStop::End;
                }
            }
        }
    }
    ReadyStop::Pending
}

/// Returns a finished stream's upstream connection to the pool when its body was read to
/// the end (waiting at most [`DONE_DRAIN`] for the terminator after `[DONE]`), else closes
/// it: a connection with unread body bytes is never reused. Callers box it: its future is
/// ~4 KiB and would otherwise be part of every held stream's future.
async fn release_or_close(
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

/// How a committed stream ends badly: the SSE error event's fields.
struct StreamError {
    /// `sluice_stream_errors_total` reason, and the event's `code`.
    reason: &'static str,
    /// Canonical kind (types the error event of non-Chat clients).
    kind: protocol::ErrorKind,
    /// OpenAI error type: the provider's own for an in-band error, else `api_error`.
    error_type: String,
    /// What the client is told.
    message: String,
}

impl StreamError {
    /// An error Sluice itself ends the stream with.
    fn gateway(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            kind: match reason {
                "shutdown" => protocol::ErrorKind::Overloaded,
                "idle_timeout" | "first_event_timeout" => protocol::ErrorKind::Timeout,
                _ => protocol::ErrorKind::Api,
            },
            error_type: "api_error".into(),
            message,
        }
    }
}

/// The stream error for an upstream read that failed mid-stream.
fn stream_broken(request_id: &str, route: &Route, e: &pingora::Error) -> StreamError {
    log::warn!(
        "upstream stream broke request_id={request_id} provider={} error={e}",
        route.provider.id
    );
    StreamError::gateway(
        "upstream_broken",
        format!("provider `{}` broke off the stream", route.provider.id),
    )
}

/// The stream error for an in-band upstream error (the provider's error type kept) or a
/// body that broke (framing, encoding, truncation, a missing finish).
fn pipe_failure(route: &Route, e: PipeError) -> StreamError {
    match e {
        PipeError::Upstream {
            kind,
            error_type,
            message,
        } => StreamError {
            reason: "upstream_error",
            kind,
            error_type: providers::scrub_key(&route.provider, &error_type),
            message: providers::scrub_key(&route.provider, &message),
        },
        PipeError::Framing { reason, message } => {
            log::warn!(
                "upstream stream ended badly provider={} reason={reason} detail={message:?}",
                route.provider.id
            );
            StreamError::gateway(reason, message)
        }
    }
}

/// Records usage for a finished stream (metering): the provider's final `usage` when the
/// stream completed with one, else an estimate (see [`estimate_usage`]).
fn finish_stream(ctx: &mut RequestCtx, pipe: &StreamPipe<'_>) {
    match pipe.final_usage() {
        Some(u) => set_usage(ctx, &u, false),
        None => {
            let streamed = pipe.estimator.tokens();
            estimate_usage(ctx, pipe.usage, streamed);
        }
    }
}

/// Records `u` (all classes) as the request's usage.
fn set_usage(ctx: &mut RequestCtx, u: &protocol::Usage, estimated: bool) {
    let o = &mut ctx.outcome;
    o.input_tokens = u.input_tokens;
    o.output_tokens = u.output_tokens;
    o.cached_input_tokens = u.cache_read_tokens;
    o.cache_write_tokens = u.cache_write_tokens;
    o.reasoning_tokens = u.reasoning_tokens;
    o.usage_estimated = estimated;
}

/// Records an estimated usage for an answer without the provider's final usage: what the
/// provider reported so far (`partial`, e.g. Anthropic's `message_start`), the admission
/// estimate for the input when it reported none, and the larger of its output figure and
/// `streamed_tokens` (the tokenizer count of the text streamed).
fn estimate_usage(ctx: &mut RequestCtx, partial: Option<protocol::Usage>, streamed_tokens: u64) {
    let mut u = partial.unwrap_or_default();
    if u.input_tokens == 0 {
        u.input_tokens = ctx.estimated_input_tokens;
    }
    u.output_tokens = u.output_tokens.max(streamed_tokens);
    set_usage(ctx, &u, true);
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_stream_content_types_are_recognised_with_parameters_and_any_case() {
        for v in [
            &b"text/event-stream"[..],
            b"text/event-stream; charset=utf-8",
            b" Text/Event-Stream ;charset=UTF-8",
        ] {
            assert!(super::is_event_stream(Some(v)), "{v:?}");
        }
        for v in [&b"application/json"[..], b"text/event-streamx", b""] {
            assert!(!super::is_event_stream(Some(v)), "{v:?}");
        }
        assert!(!super::is_event_stream(None));
    }
}
