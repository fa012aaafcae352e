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
//!
//! The unary exchange is [`super::unary`], the stream pump [`super::pump`]; what they share
//! about an attempt's end is [`super::upstream`]. None of them names a provider kind: the
//! provider's converters ([`crate::protocol`]) and its request head and signer
//! ([`crate::providers`]) are chosen from the route.

use std::time::Duration;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use super::ctx::RequestCtx;
use super::request::InferenceRequest;
use super::respond;
pub use super::upstream::ClientGone;
use super::upstream::{client_gone, failed, Attempt, MAX_ERROR_BODY_BYTES};
use super::{pump, unary};
use crate::backpressure::provider as provider_cap;
use crate::config::{HopTimeouts, Model, Route};
use crate::error::{parse_retry_after, AttemptFailure, GatewayError};
use crate::metrics::metrics;
use crate::protocol::{self, Dialect};
use crate::providers;
use crate::providers::encoding::{ContentCoding, Decoder};
use crate::routing::{retryable_status, Candidate};

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
    for cand in candidates {
        let route = cand.route;
        // A provider at its own cap (`max_concurrent_requests`) is skipped, its health
        // untouched: full is not failing.
        let _provider_slot = match provider_cap::try_take(&route.provider) {
            provider_cap::ProviderAdmission::Full => {
                if last_error.is_none() {
                    last_error = Some(provider_full(route));
                }
                previous = Some((route.provider.id.clone(), "provider_capacity"));
                continue;
            }
            provider_cap::ProviderAdmission::Slot(slot) => Some(slot),
            provider_cap::ProviderAdmission::Uncapped => None,
        };
        if !cand.health.admit() {
            continue;
        }
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
        let policy = &model.retry;
        cand.health.retry_budget().record_request();
        let mut tries_here = 0u32;
        loop {
            tries_here += 1;
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
                    // Same-route retry (`retry` policy): a listed failure, attempts left on
                    // this route, a `Retry-After` short enough to wait out (a longer one rests
                    // the route and the request falls back), and room in the route's budget.
                    let wait = match ae.retry_after {
                        Some(ra) if ra > policy.max_retry_after_wait => None,
                        Some(ra) => Some(ra),
                        None => Some(policy.backoff(tries_here)),
                    };
                    let wait = wait.filter(|_| {
                        policy.retries(ae.failure)
                            && tries_here < policy.max_attempts_per_route
                            && cand.health.retry_budget().try_retry(policy.budget_ratio)
                    });
                    // A wait this request takes on the route is not the route's cool-down.
                    cand.health.record_failure(
                        &route.provider.passive_health,
                        if wait.is_some() { None } else { ae.retry_after },
                    );
                    ctx.attempts.push(ae);
                    last_error = Some(err);
                    // A route that just started resting (turned unhealthy, or its half-open
                    // trial failed) gets no second request: the trial is a single request.
                    let resting = cand.health.cooldown_remaining().is_some();
                    if let Some(wait) = wait.filter(|_| !resting) {
                        metrics()
                            .upstream_retries_total
                            .with_label_values(&[route.provider.id.as_str(), reason])
                            .inc();
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
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
    if let Some(GatewayError::Overloaded {
        reason: "provider_capacity",
        ..
    }) = &last_error
    {
        metrics()
            .rejected_total
            .with_label_values(&["provider_capacity"])
            .inc();
    }
    let err = last_error.unwrap_or_else(|| GatewayError::NoRoute {
        message: format!("no healthy provider for model `{}` right now", model.id),
        retry_after: None,
    });
    let _ = respond::write_error(session, ctx, &err).await;
    Ok(())
}

/// The 503 of a request whose candidates' providers are all at their
/// `max_concurrent_requests` (the client may retry at once: places free up as streams end).
fn provider_full(route: &Route) -> GatewayError {
    GatewayError::Overloaded {
        message: format!(
            "provider `{}` is at its limit of concurrent requests; retry shortly",
            route.provider.id
        ),
        reason: "provider_capacity",
        retry_after: Duration::from_secs(1),
    }
}

/// Serializes the request for the route's provider: as is (only `model` replaced) when
/// the provider speaks the client's dialect, else encoded from the canonical request with
/// the protocol layer.
fn upstream_body(
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
) -> Result<Vec<u8>, GatewayError> {
    let upstream = route.dialect();
    if req.dialect == upstream {
        // Metering: a Chat stream always asks for the final usage chunk (stripped from the
        // client's stream when it did not ask; see `StreamPipe`).
        // A provider that rejects `stream_options` (`stream_usage: false`) is metered by
        // estimate instead.
        let ask_usage = req.stream
            && !req.include_usage
            && upstream == Dialect::ChatCompletions
            && route.provider.stream_usage;
        return providers::passthrough_body_placed(
            &req.body,
            &route.upstream_model,
            ask_usage,
            providers::model_placement(route),
        )
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
        stream_usage: route.provider.stream_usage,
        placement: providers::model_placement(route),
    };
    protocol::encode_request(upstream, canonical, &opts).map_err(|e| refused(&e))
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
    let path = providers::request_path(provider, &route.upstream_model, req.stream);
    let head = match providers::request_head(
        provider,
        &target,
        &path,
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
    if providers::forward_client_headers(provider, &mut head, req.anthropic_beta.as_deref())
        .is_err()
    {
        return Attempt::Final(GatewayError::invalid(
            "the `anthropic-beta` header is not a valid header value",
            None,
        ));
    }

    // Connect (a stale pooled connection gets one fresh retry), send, read the head.
    ctx.outcome
        .upstream_started
        .get_or_insert_with(tokio::time::Instant::now);
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
            r = tokio::time::timeout(timeouts.first_byte, providers::exchange(&mut up, head.clone(), Some(body.clone()))) => r,
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
                return failed(route, AttemptFailure::Reset, e.to_string(), err);
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
        pump::stream(
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
        unary::unary(
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
    let status = providers::error_status(provider, status, &body);
    let err = normalize_upstream_error(route, status, &body, retry_after, client);
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
    route: &Route,
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
    client: Dialect,
) -> GatewayError {
    let provider = &route.provider;
    let (error_type, code, message) = providers::error_parts(route.dialect(), status, body);
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
