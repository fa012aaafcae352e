//! Owns the answer of a provider that ignored `stream: true`: its response head says JSON
//! (`application/json`), not an event stream. Sluice reads that one answer whole (bounded by
//! `server.max_response_body_bytes`, content-decoded, UTF-8 repaired), decodes it in the
//! route's dialect, and hands the stream pump a complete stream in the client's dialect made
//! from it ([`crate::stream::pipe::StreamPipe::replay`]): the client that asked for a stream
//! gets one, with every event its SDK expects, instead of an error about a stream that
//! "ended in the middle of an event". An answer that cannot be read is a failed attempt
//! before the commit (the next candidate may answer), with a message that says what the
//! provider did. A body labelled JSON that is not a JSON object (an event stream under the
//! wrong `Content-Type`) is read through the stream pipe as the stream it is.

use bytes::BytesMut;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use tokio::time::Instant;

use crate::config::{HopTimeouts, Model, Route};
use crate::engine::upstream::{failed, unix_now, Attempt};
use crate::error::{AttemptFailure, GatewayError};
use crate::ingress::request::InferenceRequest;
use crate::metrics::metrics;
use crate::protocol;
use crate::providers;
use crate::providers::encoding::{ContentCoding, DecodeError, Decoder};
use crate::proxy::ctx::RequestCtx;
use crate::sse;
use crate::stream::pipe::PipeError;
use crate::stream::pump::{open_pipe, Held};

/// Whether a `Content-Type` value names JSON (`application/json`, or a `+json` type),
/// media type compared without its parameters, case-insensitively (RFC 9110 §8.3.1).
pub(crate) fn is_json_type(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|v| {
        let media = v
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        media.eq_ignore_ascii_case(b"application/json")
            || media
                .len()
                .checked_sub(5)
                .is_some_and(|at| media[at..].eq_ignore_ascii_case(b"+json"))
    })
}

/// The held stream of a streaming request whose upstream answered with one JSON body: read
/// whole and turned into the client's complete stream (see the module docs). Before the
/// commit, like [`crate::stream::pump::first_event`]: any failure is the attempt's.
pub(crate) async fn whole_answer<'r>(
    ctx: &RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &'r Route,
    up: &mut UpstreamSession,
    timeouts: HopTimeouts,
    coding: ContentCoding,
) -> Result<Held<'r>, Attempt> {
    let provider = &route.provider.id;
    let head_at = Instant::now();
    let body = match read_whole(ctx, route, up, timeouts, coding).await {
        Ok(b) => b,
        Err(why) => {
            up.shutdown().await;
            let err = GatewayError::UpstreamUnavailable {
                message: format!(
                    "provider `{provider}` answered a streaming request with JSON (it ignored \
                     `stream: true`), and that answer {why}"
                ),
                retry_after: None,
            };
            return Err(failed(
                route,
                AttemptFailure::Protocol,
                format!("JSON answer to stream:true: {why}"),
                err,
            ));
        }
    };
    if !body.trim_ascii_start().starts_with(b"{") {
        // Labelled JSON but not a JSON object: a stream under the wrong `Content-Type` (a
        // misconfigured proxy in front of the provider) is read as the stream it is.
        return mislabelled_stream(ctx, req, model, route, up, timeouts, &body, head_at).await;
    }
    let upstream = route.dialect();
    let unreadable = |why: String| {
        let message = providers::scrub_key(
            &route.provider,
            &format!(
                "provider `{provider}` answered a streaming request with JSON (it ignored \
                 `stream: true`) that cannot be read: {why}"
            ),
        );
        failed(
            route,
            AttemptFailure::Protocol,
            format!("JSON answer to stream:true: {why}"),
            GatewayError::UpstreamUnavailable {
                message,
                retry_after: None,
            },
        )
    };
    let mut resp = match protocol::decode_response(upstream, &body, unix_now()) {
        Ok(r) => r,
        Err(e) => return Err(unreadable(e.message())),
    };
    // The model that answers names itself (a fallback model its own id; the route's public
    // name when the model reports the served model), as a stream's events do.
    let echoed = model.echoed_name(route);
    echoed.clone_into(&mut resp.model);
    let mut pipe = open_pipe(ctx, req, model, route, up, coding).await?;
    let opts = protocol::StreamOptions {
        model: echoed.to_string(),
        created: unix_now(),
        include_usage: req.include_usage,
        echo: req.echo(),
        clock: unix_now,
    };
    if let Err(e) = pipe.replay(&body, &resp, &opts) {
        let PipeError::Framing { message, .. } = e else {
            return Err(unreadable("an upstream error".into()));
        };
        return Err(failed(
            route,
            AttemptFailure::Protocol,
            message.clone(),
            GatewayError::UpstreamUnavailable {
                message: providers::scrub_key(&route.provider, &message),
                retry_after: None,
            },
        ));
    }
    log::warn!(target: "sluice::proxy::adapt",
        "provider answered a streaming request with one JSON answer (it ignored stream:true); \
         sent to the client as a stream request_id={} provider={provider} upstream_model={} bytes={}",
        ctx.request_id, route.upstream_model, body.len()
    );
    Ok(Held {
        pipe,
        ended: true,
        first_event_deadline: head_at + timeouts.first_event,
        first_event_at: Some(Instant::now()),
    })
}

/// The held stream of an answer labelled JSON whose body is not a JSON object: read whole
/// (already content-decoded) through the stream pipe as the event stream it may be. A body
/// that is no stream either fails the attempt as a stream before its first event does.
#[expect(
    clippy::too_many_arguments,
    reason = "the attempt's parts, passed explicitly as first_event takes them"
)]
async fn mislabelled_stream<'r>(
    ctx: &RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &'r Route,
    up: &mut UpstreamSession,
    timeouts: HopTimeouts,
    body: &[u8],
    head_at: Instant,
) -> Result<Held<'r>, Attempt> {
    let provider = &route.provider.id;
    let mut pipe = open_pipe(ctx, req, model, route, up, ContentCoding::Identity).await?;
    let fed = pipe.feed(Some(body)).and_then(|()| pipe.feed(None));
    let why = match fed {
        Err(PipeError::Upstream { message, .. }) => Some(message),
        Err(PipeError::Framing { message, .. }) => Some(message),
        Ok(()) if pipe.data_events == 0 => Some(format!(
            "provider `{provider}` answered a streaming request with a body labelled JSON \
             that is neither a JSON answer nor an event stream"
        )),
        Ok(()) => None,
    };
    if let Some(message) = why {
        return Err(failed(
            route,
            AttemptFailure::Protocol,
            format!("JSON-labelled answer to stream:true: {message}"),
            GatewayError::UpstreamUnavailable {
                message: providers::scrub_key(&route.provider, &message),
                retry_after: None,
            },
        ));
    }
    log::warn!(target: "sluice::proxy::adapt",
        "provider answered a streaming request with an event stream labelled JSON; read whole \
         request_id={} provider={provider} upstream_model={} bytes={}",
        ctx.request_id, route.upstream_model, body.len()
    );
    Ok(Held {
        pipe,
        ended: true,
        first_event_deadline: head_at + timeouts.first_event,
        first_event_at: Some(Instant::now()),
    })
}

/// Reads a whole JSON answer: each read within the longer of the idle and first-event
/// limits, decoded, at most `server.max_response_body_bytes`, invalid UTF-8 replaced (and
/// counted). `Err` says what went wrong, for the client's message.
async fn read_whole(
    ctx: &RequestCtx,
    route: &Route,
    up: &mut UpstreamSession,
    timeouts: HopTimeouts,
    coding: ContentCoding,
) -> Result<Vec<u8>, String> {
    let limit = ctx.config.server.max_response_body_bytes;
    let mut decoder = Decoder::new(coding).map_err(|e| e.to_string())?;
    let mut body = BytesMut::new();
    let wait = timeouts.idle.max(timeouts.first_event);
    loop {
        let chunk = match tokio::time::timeout(wait, up.read_response_body()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(format!("broke off: {e}")),
            Err(_) => return Err(format!("did not arrive within {} ms", wait.as_millis())),
        };
        let end = chunk.is_none();
        let room = limit.saturating_sub(body.len());
        match decoder.decode(chunk.as_deref().unwrap_or_default(), end, room) {
            Ok(piece) => body.extend_from_slice(piece),
            Err(DecodeError::TooLarge { .. }) => {
                return Err(format!(
                    "is larger than the gateway's limit of {limit} bytes \
                     (server.max_response_body_bytes)"
                ))
            }
            Err(e) => return Err(format!("cannot be decoded: {e}")),
        }
        if end {
            break;
        }
    }
    Ok(match sse::repair_utf8(&body) {
        Some((repaired, invalid)) => {
            metrics()
                .sse_invalid_utf8_total
                .with_label_values(&[route.provider.id.as_str()])
                .inc_by(invalid);
            repaired
        }
        None => body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_content_types_are_recognised_with_parameters_and_any_case() {
        for v in [
            &b"application/json"[..],
            b"application/json; charset=utf-8",
            b" Application/JSON ;charset=UTF-8",
            b"application/problem+json",
        ] {
            assert!(super::is_json_type(Some(v)), "{v:?}");
        }
        for v in [
            &b"text/event-stream"[..],
            b"text/html",
            b"application/jsonx",
            b"",
        ] {
            assert!(!super::is_json_type(Some(v)), "{v:?}");
        }
        assert!(!super::is_json_type(None));
    }
}
