//! Owns one attempt's exchange with its upstream, in two phases: [`prepare`] encodes the
//! request for the route's provider (as is, only `model` replaced, when it speaks the
//! client's dialect; else through the canonical model), opens the upstream request
//! (connect, sign, send; a stale pooled connection resent once), reads the head,
//! normalizes a refusal into the client's error, and for a stream holds the first data
//! event ([`Ready`]); [`commit`] then writes the answer (the stream pump or the unary
//! exchange). `prepare` touches no downstream state, so the attempt loop
//! ([`crate::engine::attempt`]) and the hedge race ([`crate::engine::hedge`]) can race and drop it.

use std::time::Duration;

use crate::engine::pool::Connector;
use bytes::Bytes;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use crate::config::{HopTimeouts, Model, Route, Unsupported};
use crate::engine::state::{AttemptState, ReadyParts};
pub use crate::engine::upstream::ClientGone;
use crate::engine::upstream::{failed, Attempt, MAX_ERROR_BODY_BYTES};
use crate::error::{upstream_retry_after, AttemptFailure, GatewayError};
use crate::ingress::request::InferenceRequest;
use crate::protocol::{self, ClientDialect};
use crate::providers;
use crate::providers::encoding::{ContentCoding, Decoder};
use crate::providers::exchange::{self, OpenError};
use crate::proxy::ctx::RequestCtx;
use crate::routing::retryable_status;
use crate::stream::adapt;
use crate::stream::pump;
use crate::stream::unary;

/// Serializes the request for the route's provider ([`dialect_body`]) with the client's
/// `anthropic-beta` opt-ins where the provider takes them in the body
/// ([`providers::add_client_betas`]).
fn upstream_body(
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
) -> Result<Vec<u8>, GatewayError> {
    let body = dialect_body(req, model, route)?;
    providers::add_client_betas(
        &route.provider,
        &route.upstream_model,
        body,
        req.anthropic_beta.as_deref(),
    )
    .map_err(|e| GatewayError::Internal(format!("cannot serialize request: {e}")))
}

/// Serializes the request for the route's provider: as is (only `model` replaced) when
/// the provider speaks the client's dialect, else encoded from the canonical request with
/// the protocol layer.
fn dialect_body(
    req: &InferenceRequest,
    model: &Model,
    route: &Route,
) -> Result<Vec<u8>, GatewayError> {
    let upstream = route.dialect();
    // Nothing is sent after the commit that releases the payload; a stream that continues
    // after a break (`continue_on_break`) keeps it.
    let payload = req
        .payload()
        .ok_or_else(|| GatewayError::Internal("the request body was released".into()))?;
    if req.dialect.same_as(upstream) {
        // Metering: a Chat stream always asks for the final usage chunk (stripped from the
        // client's stream when it did not ask; see `StreamPipe`).
        // A provider that rejects `stream_options` (`stream_usage: false`) is metered by
        // estimate instead.
        let ask_usage = req.stream
            && !req.include_usage
            && req
                .dialect
                .wire()
                .fast_path
                .is_some_and(|f| f.requested_usage.is_some())
            && route.provider.stream_usage;
        return providers::passthrough_body_forwarded(
            &payload.body,
            &route.upstream_model,
            ask_usage,
            providers::model_placement(route),
            req.dialect.wire().fast_path.and_then(|f| f.forwarding),
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
    let canonical = payload.canonical().map_err(refused)?;
    let opts = upstream_options(model, route);
    if model.unsupported == Unsupported::Refuse {
        if let Some(d) = protocol::dropped_toward(upstream, canonical, &opts).first() {
            return Err(GatewayError::invalid(
                format!(
                    "unsupported `{}`: {} (the route's provider cannot carry it; \
                     models.{}.unsupported is `refuse`)",
                    d.field, d.reason, model.id
                ),
                Some(&d.field),
            ));
        }
    }
    protocol::encode_request(upstream, canonical, &opts).map_err(|e| refused(&e))
}

/// The options of a translated request's encoding toward `route`.
fn upstream_options<'a>(model: &Model, route: &'a Route) -> protocol::UpstreamOptions<'a> {
    protocol::UpstreamOptions {
        model: &route.upstream_model,
        default_max_tokens: model.default_max_tokens,
        stream_usage: route.provider.stream_usage,
        placement: providers::model_placement(route),
        thinking: route.thinking,
    }
}

/// Records what the translation toward `route`, the one that answers, left out of the
/// client's request (`models.<id>.unsupported: drop`): the `x-sluice-dropped` header (from
/// `ctx.outcome.dropped`), `sluice_dropped_fields_total` and an info log line. Nothing for
/// the same dialect in and out but the members the provider's placement rules leave out of
/// the body (Bedrock's `metadata` and `service_tier`; `stream` is said by the path).
fn record_dropped(ctx: &mut RequestCtx, req: &InferenceRequest, model: &Model, route: &Route) {
    let upstream = route.dialect();
    let Some(payload) = req.payload() else {
        return;
    };
    let dropped = if req.dialect.same_as(upstream) {
        let protocol::ModelPlacement::Path { dropped, .. } = providers::model_placement(route)
        else {
            return;
        };
        dropped
            .iter()
            .filter(|k| **k != "stream" && payload.body.contains_key(**k))
            .map(|k| protocol::Dropped {
                field: (*k).to_string(),
                reason: format!("provider kind {:?} does not take it", route.provider.kind),
            })
            .collect()
    } else {
        let Some(canonical) = payload.decoded() else {
            return;
        };
        protocol::dropped_toward(upstream, canonical, &upstream_options(model, route))
    };
    if dropped.is_empty() {
        return;
    }
    crate::metrics::metrics()
        .dropped_fields_total
        .with_label_values(&[req.dialect.as_str(), upstream.as_str()])
        .inc_by(dropped.len() as u64);
    let listed: Vec<String> = dropped
        .iter()
        .map(|d| format!("{} ({})", d.field, d.reason))
        .collect();
    log::info!(
        target: "sluice::proxy::attempt",
        "request_id={} dropped in translation {}->{} for provider `{}`: {}",
        ctx.request_id,
        req.dialect.as_str(),
        upstream.as_str(),
        route.provider.id,
        listed.join("; ")
    );
    ctx.outcome.dropped = Some(protocol::dropped_header(&dropped));
}

/// An attempt that is ready to commit: the upstream answered 2xx and, for a stream, its
/// first data event is held ([`pump::Held`]). Nothing was written to the client yet.
///
/// Boxed: the upstream session and the held event are ~2.3 KiB, and a `Ready` is moved
/// through the pre-commit, the hedge race and into the commit; every future that holds one
/// across an `.await` would otherwise carry those bytes, and every move would copy them.
pub(crate) enum Ready<'r> {
    /// A stream, up to its first data event.
    Stream(Box<ReadyParts<pump::Held<'r>>>),
    /// A non-streaming answer: its body is read whole at the commit, in this coding.
    Unary(Box<ReadyParts<ContentCoding>>),
}

impl Ready<'_> {
    /// Whether this is a stream committed early (`early_commit_after_ms`), before any event.
    pub(crate) fn early_committed(&self) -> bool {
        matches!(self, Ready::Stream(p) if p.body.first_event_at.is_none())
    }
}

/// Where a [`prepare`] is, for the `sluice_client_aborts_total` phase of a client that
/// leaves meanwhile (shared with the racing caller; atomic as the future must be `Send`),
/// and the hidden resend it made on a stale pooled connection, which the caller counts as
/// an attempt ([`Phase::settle`]) since the future holds the ctx only to read.
#[derive(Debug, Default)]
pub(crate) struct Phase {
    at: std::sync::atomic::AtomicU8,
    stale_resend: std::sync::Mutex<Option<crate::error::AttemptError>>,
}

impl Phase {
    fn set(&self, p: u8) {
        self.at.store(p, std::sync::atomic::Ordering::Relaxed);
    }

    /// The phase label: `connecting`, `waiting_head` or `waiting_first_event`.
    pub(crate) fn label(&self) -> &'static str {
        match self.at.load(std::sync::atomic::Ordering::Relaxed) {
            0 => "connecting",
            1 => "waiting_head",
            _ => "waiting_first_event",
        }
    }

    /// Logs and counts (`sluice_upstream_attempts_total{outcome="stale_connection"}`) the
    /// resend of a request whose reused connection was stale, and keeps it for [`Self::settle`].
    fn note_stale_resend(
        &self,
        ctx: &RequestCtx,
        route: &Route,
        e: &crate::engine::upstream::SendError,
    ) {
        let ae = crate::engine::upstream::stale_resend(ctx, route, e);
        *self
            .stale_resend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ae);
    }

    /// Adds the stale-connection resend this phase made (if any) to the request's attempts:
    /// `x-sluice-attempts`, the access log and the ledger's `attempts`.
    pub(crate) fn settle(&self, ctx: &mut RequestCtx) {
        let taken = self
            .stale_resend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(ae) = taken {
            ctx.attempts.count += 1;
            ctx.attempts.failed.push(ae);
        }
    }
}

/// Commits a [`Ready`] attempt: a stream is committed and pumped, a non-streaming answer is
/// read whole and written. `candidates[served]` is the route that answered; the candidates
/// after it are where a broken stream may continue ([`crate::engine::continuation`]).
///
/// The pump's or the unary exchange's state (~6 KiB) lives in a box of its own, allocated
/// here once per answered request, so that the callers' futures (the hedge race, the attempt
/// loop and `request_filter`'s, which Pingora boxes per request) stay small.
pub(crate) async fn commit(s: AttemptState<'_, '_>, served: usize, ready: Ready<'_>) -> Attempt {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates,
        later,
    } = s;
    let route = candidates[served].route;
    let rest = &candidates[served + 1..];
    record_dropped(ctx, req, model, route);
    ctx.outcome.served_model = Some(model.served_name(route).to_string());
    match ready {
        // The parts go to the stream's own boxed future whole and are moved out of their box
        // there: nothing of them stays in this future, nor the box on the heap, for the
        // stream's life.
        Ready::Stream(parts) => {
            Box::pin(pump::stream(
                AttemptState {
                    connector,
                    session,
                    ctx,
                    req,
                    model,
                    candidates: rest,
                    later,
                },
                route,
                parts,
            ))
            .await
        }
        Ready::Unary(parts) => {
            let echo = req.echo();
            Box::pin(commit_unary(
                connector,
                session,
                ctx,
                route,
                model.echoed_name(route),
                &echo,
                parts,
            ))
            .await
        }
    }
}

/// [`commit`] of a non-streaming answer: its parts are moved out here, in a boxed future of
/// their own, so that they are not part of [`commit`]'s future, which every held stream keeps.
async fn commit_unary(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: &Route,
    standard_model: &str,
    echo: &protocol::ClientEcho,
    parts: Box<ReadyParts<ContentCoding>>,
) -> Attempt {
    unary::unary(
        connector,
        session,
        ctx,
        route,
        standard_model,
        echo,
        ReadyParts::take(parts),
    )
    .await
}

/// The pre-commit phase of one attempt against one route: connect (a stale pooled
/// connection gets one fresh retry), send, read the head, and for a stream its first data
/// event. It touches no downstream state and nothing of `ctx` but reads, so a caller may
/// race it against the client's disconnect and against another route's (a hedge); dropping
/// it drops its upstream connection. `phase` follows where it is.
#[expect(
    clippy::too_many_lines,
    reason = "one attempt's steps in order: encode, sign, open, judge the head, hold the first event"
)]
pub(crate) async fn prepare<'r>(
    connector: &Connector,
    ctx: &RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &'r Route,
    phase: &Phase,
) -> Result<Ready<'r>, Attempt> {
    let provider = &route.provider;
    let timeouts = ctx.config.timeouts_for(provider, model);
    let body = match upstream_body(req, model, route) {
        Ok(b) => Bytes::from(b),
        Err(e) => return Err(Attempt::Final(e)),
    };
    let resolved = ctx.registry.upstream(provider);
    let target = match providers::target(provider, &resolved).await {
        Ok(t) => t,
        Err(m) => {
            let err = GatewayError::UpstreamUnavailable {
                message: format!("provider `{}` is unreachable", provider.id),
                retry_after: None,
            };
            return Err(failed(route, AttemptFailure::Connect, m, err));
        }
    };
    let path = route.path(req.stream);
    // The head is built (and, for a signing provider, signed) again for a stale-connection
    // resend rather than cloned for every request: the resend is rare, the clone was ~16
    // allocations per request.
    let build_head = || -> Result<pingora::http::RequestHeader, HeadRefused> {
        let mut head = providers::request_head(
            provider,
            &resolved,
            &target,
            &path,
            &body,
            req.stream,
            &ctx.request_id,
        )
        .map_err(HeadRefused::Bad)?;
        providers::forward_client_headers(
            provider,
            &route.upstream_model,
            &mut head,
            req.anthropic_beta.as_deref(),
        )
        .map_err(|_| HeadRefused::Beta)?;
        Ok(head)
    };
    let mut head = Some(build_head().map_err(HeadRefused::attempt)?);

    // Connect, send, read the head. A pooled connection found stale before the request can
    // have been processed gets one resend on a fresh connection, counted as an attempt (by
    // the caller, from `phase`: this future holds the ctx only to read).
    let opened = exchange::open(
        // Boxed: Pingora's connect future is ~9 KiB and would otherwise stay inlined in
        // every held stream's future long after the connect (memory per open stream).
        || Box::pin(connector.get_http_session(&target.peer)),
        exchange::Deadlines {
            connect: Some(timeouts.connect),
            first_byte: Some(timeouts.head(req.stream)),
        },
        exchange::Resend::Unprocessed,
        || match head.take() {
            Some(h) => Ok(h),
            None => build_head(),
        },
        Some(body.clone()),
        |step| match step {
            exchange::Step::Connecting => phase.set(0),
            exchange::Step::Sending => phase.set(1),
            exchange::Step::Resending(e) => phase.note_stale_resend(ctx, route, e),
        },
    )
    .await;
    // The upstream session keeps its own copy; ours would live as long as the stream.
    drop(body);
    let mut up = match opened {
        Ok(up) => up,
        Err(OpenError::Head(refused)) => return Err(HeadRefused::attempt(refused)),
        Err(OpenError::Connect(e)) => {
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
            return Err(failed(route, AttemptFailure::Connect, e.to_string(), err));
        }
        Err(OpenError::ConnectTimeout) => {
            let err = GatewayError::UpstreamUnavailable {
                message: format!("connecting to provider `{}` timed out", provider.id),
                retry_after: None,
            };
            return Err(failed(
                route,
                AttemptFailure::Connect,
                "connect timeout".into(),
                err,
            ));
        }
        Err(OpenError::Send(e)) => {
            let err = GatewayError::UpstreamUnavailable {
                message: format!("provider `{}` failed before answering", provider.id),
                retry_after: None,
            };
            return Err(failed(
                route,
                AttemptFailure::Reset,
                e.error.to_string(),
                err,
            ));
        }
        Err(OpenError::FirstByteTimeout) => {
            let err = GatewayError::UpstreamTimeout(format!(
                "provider `{}` sent no response head within {} ms",
                provider.id,
                timeouts.head(req.stream).as_millis()
            ));
            return Err(failed(
                route,
                AttemptFailure::FirstByteTimeout,
                "first byte timeout".into(),
                err,
            ));
        }
    };

    let Some(resp) = up.response_header() else {
        up.shutdown().await;
        return Err(Attempt::Final(GatewayError::Internal(
            "no upstream response head".into(),
        )));
    };
    let status = resp.status.as_u16();
    if !(200..300).contains(&status) {
        // `retry-after-ms` (OpenAI, Azure) is the more precise: it wins over `Retry-After`,
        // for the route's cool-down and for what the client is told.
        let retry_after = upstream_retry_after(
            resp.headers.get("retry-after-ms").map(|v| v.as_bytes()),
            resp.headers.get("retry-after").map(|v| v.as_bytes()),
        );
        return Err(upstream_error(
            &mut up,
            route,
            &ctx.registry.upstream(&route.provider),
            Refusal {
                status,
                retry_after,
                client: ctx.dialect,
                standard_model: &model.id,
            },
            timeouts,
        )
        .await);
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
        return Err(failed(
            route,
            AttemptFailure::Protocol,
            "text/event-stream answer to stream:false".into(),
            err,
        ));
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
            return Err(failed(
                route,
                AttemptFailure::Protocol,
                format!("unsupported content-encoding {name:?}"),
                err,
            ));
        }
    };
    let peer = target.peer;
    if !req.stream {
        return Ok(Ready::Unary(Box::new(ReadyParts {
            up,
            peer,
            timeouts,
            body: coding,
        })));
    }
    phase.set(2);
    let json = up
        .response_header()
        .and_then(|h| h.headers.get("content-type"))
        .is_some_and(|v| adapt::is_json_type(Some(v.as_bytes())));
    let held = if json {
        // A provider that ignored `stream: true`: its one JSON answer becomes the stream.
        adapt::whole_answer(ctx, req, model, route, &mut up, timeouts, coding).await?
    } else {
        pump::first_event(ctx, req, model, route, &mut up, timeouts, coding).await?
    };
    Ok(Ready::Stream(Box::new(ReadyParts {
        up,
        peer,
        timeouts,
        body: held,
    })))
}

/// Why an upstream request head could not be built (see [`prepare`]).
enum HeadRefused {
    /// The provider's head builder refused (a bad path or header value, a signing failure).
    Bad(Box<pingora::Error>),
    /// The client's `anthropic-beta` header is not a valid header value.
    Beta,
}

impl HeadRefused {
    /// The attempt's final answer: a gateway fault, or the client's 400.
    fn attempt(self) -> Attempt {
        Attempt::Final(match self {
            Self::Bad(e) => GatewayError::Internal(format!("bad upstream request: {e}")),
            Self::Beta => GatewayError::invalid(
                "the `anthropic-beta` header is not a valid header value",
                None,
            ),
        })
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

/// A non-2xx answer's head: what [`upstream_error`] needs beside the body.
struct Refusal<'a> {
    /// The upstream status.
    status: u16,
    /// Its `Retry-After` (`retry-after-ms` first).
    retry_after: Option<Duration>,
    /// The client's dialect.
    client: ClientDialect,
    /// The standard model the route serves (named in place of the upstream model).
    standard_model: &'a str,
}

/// Reads a non-2xx answer's body (bounded) and turns it into a client error. A retryable
/// status, or a provider that does not know the route's model
/// ([`providers::upstream_errors::is_model_not_found`]: the route rests, the request falls
/// back), is a failed attempt; any other is the client's answer.
async fn upstream_error(
    up: &mut UpstreamSession,
    route: &Route,
    resolved: &providers::Upstream,
    refusal: Refusal<'_>,
    timeouts: HopTimeouts,
) -> Attempt {
    let Refusal {
        status,
        retry_after,
        client,
        standard_model,
    } = refusal;
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
    let _ = tokio::time::timeout(timeouts.first_byte, read_all).await;
    up.shutdown().await;
    let status = providers::error_status(resolved, status, &body);
    let (err, model_not_found) =
        normalize_upstream_error(route, status, &body, retry_after, client, standard_model);
    if model_not_found {
        failed(
            route,
            AttemptFailure::ModelNotFound,
            format!("HTTP {status}: the provider does not know the upstream model"),
            err,
        )
    } else if retryable_status(status) {
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

/// An upstream error body in OpenAI's shape, provider keys scrubbed and the route's upstream
/// model id replaced by `standard_model` wherever it is named; and whether it says the
/// provider does not know the route's model. A provider's 401/403 is about the gateway's
/// credentials, not the client's: the client gets 502. Anthropic's 529 stays 529 for
/// Messages clients (their API has it) and is a 503 for the others.
fn normalize_upstream_error(
    route: &Route,
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
    client: ClientDialect,
    standard_model: &str,
) -> (GatewayError, bool) {
    let provider = &route.provider;
    let (error_type, code, message) =
        providers::provider_error_parts(provider, route.dialect(), status, body);
    let model_not_found = providers::upstream_errors::is_model_not_found(
        status,
        code.as_deref(),
        &message,
        &route.upstream_model,
    );
    let mask = |t: &str| {
        providers::upstream_errors::mask_upstream_model(t, &route.upstream_model, standard_model)
    };
    let message = mask(&providers::scrub_key(provider, &message));
    // Every field the client sees is scrubbed, not only the message.
    let error_type = providers::scrub_key(provider, &error_type);
    let code = code.map(|c| mask(&providers::scrub_key(provider, &c)));
    if matches!(status, 401 | 403) {
        let err = GatewayError::UpstreamUnavailable {
            message: format!(
                "provider `{}` rejected the gateway's credentials",
                provider.id
            ),
            retry_after: None,
        };
        return (err, false);
    }
    // Anthropic's 529 "overloaded" is a 503 to OpenAI clients.
    let status = if status == 529 && !client.wire().keeps_529 {
        503
    } else {
        status
    };
    let err = GatewayError::Upstream {
        status,
        error_type,
        code,
        message,
        retry_after,
    };
    (err, model_not_found)
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
