//! Owns the unary exchange: a non-streaming answer read whole (bounded by
//! `server.max_response_body_bytes`, content-decoded, UTF-8 repaired), its model echo
//! rewritten or translated into the client's dialect, and written in one go. Bytes of the
//! answer were received once it runs, so a body that broke off (read failure, too large,
//! bad content coding) is a 502, never a fallback; a body that arrived whole but cannot be
//! read in its dialect (an HTML page under a 200, text, JSON that is not the dialect's
//! answer) is a failed attempt, on the same-dialect path as on the translated one: the
//! client's SDK could not parse it, and nothing was written yet, so the next candidate may
//! answer (the route is charged a failure; 502 when no candidate is left).

use crate::engine::pool::Connector;
use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

use crate::config::Route;
use crate::engine::state::ReadyParts;
use crate::engine::upstream::{
    client_gone, estimate_usage, failed, set_usage, unix_now, Attempt, ClientGone, POOL_IDLE,
};
use crate::error::{AttemptFailure, GatewayError};
use crate::ingress::respond;
use crate::metrics::metrics;
use crate::protocol;
use crate::providers;
use crate::providers::encoding::{ContentCoding, DecodeError, Decoder};
use crate::proxy::ctx::RequestCtx;
use crate::sse;

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
    clippy::too_many_lines,
    reason = "read, decode, translate and write one answer, with each way it can fail"
)]
pub(crate) async fn unary(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: &Route,
    standard_model: &str,
    echo: &protocol::ClientEcho,
    parts: ReadyParts<ContentCoding>,
) -> Attempt {
    let ReadyParts {
        mut up,
        peer,
        timeouts,
        body: coding,
    } = parts;
    let peer = &peer;
    let limit = ctx.config.server.max_response_body_bytes;
    let mut decoder = match Decoder::new(coding) {
        Ok(d) => d,
        Err(e) => return Attempt::Final(GatewayError::Internal(e.to_string())),
    };
    let mut body = BytesMut::new();
    let broken: Option<UnaryBreak> = loop {
        let next = tokio::select! {
            r = tokio::time::timeout(timeouts.idle.max(timeouts.first_byte_non_stream), up.read_response_body()) => r,
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
                    ctx.outcome.upstream_first_event = Some(tokio::time::Instant::now());
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
                log::warn!(target: "sluice::proxy::unary", "upstream body broke request_id={} provider={provider} detail={detail:?}",
                    ctx.request_id
                );
                GatewayError::UpstreamUnavailable {
                    message: format!("provider `{provider}` broke off its answer"),
                    retry_after: None,
                }
            }
            UnaryBreak::TooLarge => {
                log::warn!(target: "sluice::proxy::unary", "upstream answer too large request_id={} provider={provider} limit_bytes={limit}",
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
                log::warn!(target: "sluice::proxy::unary", "upstream answer undecodable request_id={} provider={provider} error={e}",
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
    let upstream = route.dialect();
    // Metering: the provider's usage object, read from the upstream body with all classes
    // (the translated path's decoded usage is the same figures).
    let mut usage = protocol::Usage::default();
    let mut usage_seen = protocol::merge_chunk_usage(upstream, &body, &mut usage);
    // Written as is: no copy of the answer between the rewrite and the socket.
    let client = ctx.dialect;
    let fast = client.wire().fast_path.filter(|_| client.same_as(upstream));
    let out: Bytes = match fast {
        // An answer the client's SDK cannot parse (an HTML error page or text under a 200,
        // a body cut short) is the provider's failure, as on the translated path: nothing
        // was written, so the next candidate may answer.
        Some(_) if !is_json_object(&body) => {
            return unreadable(
                ctx,
                route,
                standard_model,
                "the answer is not a JSON object".into(),
            );
        }
        Some(fast) => {
            let mut out = BytesMut::with_capacity(body.len() + 32);
            fast.rewriter(false, standard_model)
                .rewrite_json(&body, &mut out);
            out.freeze()
        }
        None => match protocol::decode_response(upstream, &body, unix_now()) {
            Ok(mut resp) => {
                // The model that answered (a fallback model names itself).
                resp.model = ctx.answering_model().unwrap_or_default().to_string();
                if resp.usage != protocol::Usage::default() {
                    usage = resp.usage;
                    usage_seen = true;
                }
                if echo.omit_reasoning_text {
                    for item in &mut resp.output {
                        if let protocol::OutputItem::Reasoning { text, .. } = item {
                            text.clear();
                        }
                    }
                }
                Bytes::from(protocol::encode_response_for(client, &resp, echo))
            }
            Err(e) => return unreadable(ctx, route, standard_model, e.message()),
        },
    };
    if usage_seen {
        set_usage(ctx, &usage, false);
    } else {
        // No usage in the body: estimated from its text.
        let mut est = crate::billing::metering::OutputEstimator::default();
        crate::billing::metering::stream_text(upstream, &body, true, |t| est.push_json(t));
        estimate_usage(ctx, None, est.tokens());
    }
    ctx.outcome.provider = Some(route.provider.id.clone());
    ctx.outcome.upstream_model = Some(route.upstream_model.clone());
    ctx.outcome.ttft = Some(ctx.received.elapsed());
    ctx.outcome.label = "ok";
    ctx.outcome.overhead = ctx.outcome.overhead_at(ctx.received.elapsed());
    let head = match respond::proxied_head(ctx, 200, false, Some(out.len()), &route.provider.id) {
        Ok(h) => h,
        Err(e) => return Attempt::Final(GatewayError::Internal(e.to_string())),
    };
    ctx.attempts.downstream_committed = true;
    ctx.outcome.status = 200;
    ctx.outcome.bytes_out = out.len() as u64;
    if let Some(c) = ctx.response_capture.as_deref_mut() {
        // What the client receives is what is stored (a reference, not a copy).
        c.answer = Some(crate::conversation::capture::Answer::Unary(out.clone()));
    }
    if session
        .write_response_header(Box::new(head), false)
        .await
        .is_err()
        || session.write_response_body(Some(out), true).await.is_err()
    {
        return Attempt::Gone(ClientGone("writing"));
    }
    Attempt::Done
}

/// Whether a whole answer is framed as one JSON object (what every dialect's answer is):
/// its first and last bytes other than whitespace are `{` and `}`. That tells an HTML
/// page, text or an empty body under a 200 from an answer at the cost of two bytes; a
/// body cut short was already caught by the HTTP framing (`content-length` or chunked
/// end) as a broken read. A full validating pass on every same-dialect answer (which is
/// otherwise never parsed) measured ~11k instructions per 100-token answer under
/// callgrind, and even the stream pipe's structural check ~6k, 3-5 % of the request.
fn is_json_object(body: &[u8]) -> bool {
    let body = body.trim_ascii();
    body.first() == Some(&b'{') && body.last() == Some(&b'}')
}

/// The attempt's end for a whole answer that cannot be read in its dialect (not JSON, or
/// not the dialect's answer): a failed attempt ([`AttemptFailure::Protocol`]), so the route
/// is charged a failure and the next candidate may answer (nothing was written to the
/// client); the client's 502 when none does. The message names the provider and the
/// cause, never the answer's bytes.
fn unreadable(ctx: &RequestCtx, route: &Route, standard_model: &str, why: String) -> Attempt {
    let provider = &route.provider.id;
    log::warn!(target: "sluice::proxy::unary",
        "unreadable upstream answer request_id={} provider={provider} upstream_model={} detail={why:?}",
        ctx.request_id, route.upstream_model
    );
    // The provider's words name no upstream model.
    let message = providers::upstream_errors::mask_upstream_model(
        &providers::scrub_key(
            &route.provider,
            &format!("provider `{provider}` sent an unreadable answer: {why}"),
        ),
        &route.upstream_model,
        standard_model,
    );
    failed(
        route,
        AttemptFailure::Protocol,
        format!("unreadable answer: {why}"),
        GatewayError::UpstreamUnavailable {
            message,
            retry_after: None,
        },
    )
}
