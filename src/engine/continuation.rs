//! Owns mid-stream continuation (`models.<id>.continue_on_break: true`, opt-in): a committed
//! stream that breaks after answer text reached the client (the upstream cut it, went
//! silent past the idle timeout, sent an in-stream error, or ended it unfinished) is
//! continued on the next candidate route, and the rest of the answer is spliced into the
//! same client stream.
//!
//! * **Where it hooks in**: the stream pump's post-commit failure path
//!   ([`crate::stream::pump::stream`]), after the events completed before the failure were written.
//!   The candidates are the routes after the one that broke, in the attempt loop's order,
//!   then the routes of the later models of the request's fallback chain
//!   (`fallback_models`, the body's `models`; planned with the chain's checks, see
//!   [`crate::engine::fallback::Chain::peek_later`]); health admission applies; each gets
//!   one try, until one answers 2xx. The answer keeps the `model` it started with.
//! * **The seam** ([`crate::protocol::seam`]): the continuation's first text is held
//!   until Sluice can tell whether it restarts or repeats what the client has; a repeat is
//!   dropped, a space is added after a sentence's end, and a restart that diverges ends the
//!   stream with the error event (code `continuation_seam`).
//!   `sluice_continuation_seams_total{model,outcome}` counts each by `clean`, `trimmed`,
//!   `space_added`, `refused`.
//! * **What the next route is asked**: the canonical request with the text so far, as a
//!   trailing user message or as assistant prefill where the route declares
//!   `supports_prefill: true` ([`crate::protocol::continuation`]).
//! * **The splice**: the client's encoder ([`crate::stream::pipe::StreamPipe::resume`]) keeps
//!   running, so ids, content block indices and sequence numbers continue, and no second
//!   `message_start` / `response.created` / role chunk is written. Before the continuation's
//!   first event the client gets the SSE comment `: sluice-continued provider=<id>
//!   reason=<break reason>` (a comment is valid SSE in every dialect; SDKs ignore it).
//!   The final usage is the sum of both attempts (the first one's output estimated from its
//!   text when the provider had not reported it), and so is what metering records
//!   (`estimated` then).
//! * **What is never continued** (the stream ends with the client's in-stream error event,
//!   as without the feature, its message saying why): a stream in which a tool call began,
//!   one with no answer text yet, one whose text outgrew [`TRANSCRIPT_CAP_BYTES`], one that
//!   had already stopped, a break that is not the upstream's (max duration, shutdown), and a
//!   continuation that every remaining route rejected or failed before answering. A
//!   continuation that breaks too ends with the error event: at most one per request.
//!
//! `sluice_stream_continuations_total{model,outcome}` counts each eligible break by
//! [`OUTCOMES`]. A stream of a model with the feature on goes through the canonical
//! translator even for the same dialect (see [`crate::stream::pipe`]).

use crate::engine::pool::Connector;
use bytes::Bytes;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use crate::backpressure::provider as provider_cap;
use crate::config::{HopTimeouts, Model, Route};
use crate::engine::state::AttemptState;
use crate::engine::upstream::{client_gone, Attempt, ClientGone};
use crate::error::AttemptFailure;
use crate::ingress::request::InferenceRequest;
use crate::metrics::metrics;
use crate::protocol::continuation::{continuation_request, ContinueStyle, Splice};
use crate::protocol::{self, tokens};
use crate::providers;
use crate::providers::encoding::ContentCoding;
use crate::providers::exchange::{self, OpenError};
use crate::proxy::ctx::RequestCtx;
use crate::stream::end::{Pumped, StreamError};
use crate::stream::pipe::StreamPipe;
use crate::stream::pump;

/// Most bytes of answer text a continuable stream records (its transcript); a stream
/// whose text grew past it is not continued (outcome `too_long`).
pub(crate) const TRANSCRIPT_CAP_BYTES: usize = 256 * 1024;

/// Every `outcome` of `sluice_stream_continuations_total`: `continued` (the rest was
/// spliced in and the stream completed), `failed` (spliced, then the continuation broke
/// too), `client_abort` (the client left during the continuation), and the refusals:
/// `tool_call`, `no_text`, `too_long`, `complete` (the answer had stopped already),
/// `unsupported` (the request cannot be re-encoded), `no_route` (no candidate left),
/// `rejected` (every remaining route failed or refused before answering, or shutdown began
/// meanwhile).
pub(crate) const OUTCOMES: [&str; 10] = [
    "continued",
    "failed",
    "client_abort",
    "tool_call",
    "no_text",
    "too_long",
    "complete",
    "unsupported",
    "no_route",
    "rejected",
];

/// Break reasons (`sluice_stream_errors_total` reasons) that are the upstream's fault and
/// may be continued.
const CONTINUABLE: [&str; 5] = [
    "upstream_broken",
    "idle_timeout",
    "upstream_error",
    "upstream_incomplete",
    "upstream_truncated",
];

/// Tries to continue a committed stream that failed with `err` on the candidates in
/// `rest`. The events completed before the failure have been written and the broken
/// upstream closed.
///
/// # Errors
/// The stream error to end the stream with when it is not continued (`err`, its message
/// saying why not when the break was eligible); `Ok` is how the stream ended otherwise.
#[expect(
    clippy::too_many_lines,
    reason = "eligibility, re-encoding and the splice are one linear sequence"
)]
pub(crate) async fn resume<'r>(
    s: AttemptState<'_, 'r>,
    pipe: &mut StreamPipe<'r>,
    err: StreamError,
) -> Result<Attempt, StreamError> {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates: rest,
        later,
    } = s;
    if !CONTINUABLE.contains(&err.reason) {
        return Err(err);
    }
    // The route that broke is charged the failure whatever happens next.
    ctx.outcome.upstream_broke = true;
    let refuse = |ctx: &RequestCtx, outcome: &'static str, why: &str, mut err: StreamError| {
        count(model, outcome);
        log::info!(target: "sluice::proxy::continuation",
            "stream not continued request_id={} reason={} outcome={outcome}",
            ctx.request_id, err.reason
        );
        err.message = format!("{} (not continued: {why})", err.message);
        err
    };
    let Some(transcript) = pipe.transcript() else {
        return Err(refuse(
            ctx,
            "unsupported",
            "the stream has no transcript",
            err,
        ));
    };
    if transcript.tool_call_began() {
        return Err(refuse(ctx, "tool_call", "a tool call had begun", err));
    }
    if transcript.overflowed() {
        return Err(refuse(
            ctx,
            "too_long",
            "the answer so far is too long",
            err,
        ));
    }
    if transcript.stopped() {
        return Err(refuse(
            ctx,
            "complete",
            "the answer had already stopped",
            err,
        ));
    }
    if transcript.text().is_empty() {
        return Err(refuse(
            ctx,
            "no_text",
            "no answer text had been streamed",
            err,
        ));
    }
    let text = transcript.text().to_string();
    // A model that continues after a break keeps the payload past the commit.
    let payload = req.payload();
    let canonical = match payload
        .as_deref()
        .map(crate::ingress::request::Payload::canonical)
    {
        Some(Ok(c)) => c,
        Some(Err(_)) | None => {
            return Err(refuse(
                ctx,
                "unsupported",
                "the request cannot be re-encoded",
                err,
            ))
        }
    };
    // The first attempt's usage: what its provider reported, its output at least the
    // tokenizer count of the text streamed, its input the request's estimate if unknown.
    let mut base = pipe.usage.unwrap_or_default();
    base.output_tokens = base.output_tokens.max(pipe.estimator.tokens());
    if base.input_tokens == 0 {
        base.input_tokens = tokens::estimate_input_tokens(canonical);
    }

    let mut tried = false;
    let mut opened = None;
    // The routes after the one that broke, then those of the later models of the fallback
    // chain (planned with the chain's checks), each with the model it serves.
    let candidates = rest
        .iter()
        .map(|c| (model, c))
        .chain(later.iter().map(|l| (l.model, &l.cand)));
    for (cmodel, cand) in candidates {
        // A provider at its own cap is skipped, as in the attempt loop; the place taken is
        // held until the continuation ends.
        let slot = match provider_cap::try_take(&cand.route.provider) {
            provider_cap::ProviderAdmission::Full => continue,
            other => other,
        };
        if !cand.admit() {
            continue;
        }
        tried = true;
        let route = cand.route;
        let style = if route.supports_prefill {
            ContinueStyle::Prefill
        } else {
            ContinueStyle::UserTurn
        };
        let creq = continuation_request(canonical, &text, base.output_tokens, style);
        let opts = protocol::UpstreamOptions {
            model: &route.upstream_model,
            default_max_tokens: cmodel.default_max_tokens,
            stream_usage: route.provider.stream_usage,
            placement: providers::model_placement(route),
            thinking: route.thinking,
        };
        let Ok(body) = protocol::encode_request(route.dialect(), &creq, &opts).and_then(|b| {
            providers::add_client_betas(
                &route.provider,
                &route.upstream_model,
                b,
                req.anthropic_beta.as_deref(),
            )
            .map_err(|e| protocol::ProtocolError::InvalidUpstream(e.to_string()))
        }) else {
            cand.release_trial();
            continue;
        };
        ctx.attempts.count += 1;
        let timeouts = ctx.config.timeouts_for(&route.provider, cmodel);
        match open(
            connector,
            session,
            ctx,
            req,
            route,
            Bytes::from(body),
            timeouts,
        )
        .await
        {
            Opened::Up(answer) => {
                let (up, target, coding) = *answer;
                opened = Some((cmodel, cand, up, target, coding, timeouts, slot));
                break;
            }
            Opened::Failed(failure, detail) => {
                log::info!(target: "sluice::proxy::continuation",
                    "continuation attempt failed request_id={} provider={} reason={} detail={detail:?}",
                    ctx.request_id, route.provider.id, failure.label()
                );
                metrics()
                    .upstream_attempts_total
                    .with_label_values(&[route.provider.id.as_str(), failure.label()])
                    .inc();
                cand.health
                    .record_failure(&route.provider.passive_health, None);
            }
            Opened::Gone(g) => {
                cand.release_trial();
                return Ok(Attempt::Gone(g));
            }
            Opened::Shutdown => {
                cand.release_trial();
                return Err(refuse(ctx, "rejected", "the gateway is shutting down", err));
            }
        }
    }
    let Some((cmodel, cand, mut up, target, coding, timeouts, _slot)) = opened else {
        return Err(if tried {
            refuse(ctx, "rejected", "no other route took the continuation", err)
        } else {
            refuse(ctx, "no_route", "no other route is available", err)
        });
    };
    let route = cand.route;
    if pipe
        .resume(route, coding, Splice::new(base, &text))
        .is_err()
    {
        up.shutdown().await;
        cand.release_trial();
        return Err(refuse(
            ctx,
            "unsupported",
            "the answer cannot be decoded",
            err,
        ));
    }
    metrics()
        .upstream_attempts_total
        .with_label_values(&[route.provider.id.as_str(), "ok"])
        .inc();

    // The seam: an SSE comment, then the continuation's events.
    let marker = Bytes::from(format!(
        ": sluice-continued provider={} reason={}\n\n",
        route.provider.id, err.reason
    ));
    ctx.outcome.bytes_out += marker.len() as u64;
    if pump::emit(session, ctx, Some(marker), false).await.is_err() {
        up.shutdown().await;
        cand.release_trial();
        count(model, "client_abort");
        return Ok(Attempt::Gone(ClientGone("streaming")));
    }
    ctx.outcome.provider = Some(route.provider.id.clone());
    ctx.outcome.upstream_model = Some(route.upstream_model.clone());
    ctx.attempts.failed_routes += 1;
    log::info!(target: "sluice::proxy::continuation",
        "stream continued request_id={} reason={} provider={} model={} text_bytes={}",
        ctx.request_id, err.reason, route.provider.id, cmodel.id, text.len()
    );

    let first_event_deadline = tokio::time::Instant::now() + timeouts.first_event;
    let pumped = pump::pump_body(
        session,
        ctx,
        &mut up,
        pipe,
        route,
        timeouts,
        first_event_deadline,
        None,
    )
    .await;
    if let Some(o) = pipe.seam_outcome() {
        metrics()
            .continuation_seams_total
            .with_label_values(&[model.id.as_str(), o.label()])
            .inc();
        log::info!(target: "sluice::proxy::continuation",
            "continuation seam request_id={} outcome={}", ctx.request_id, o.label()
        );
    }
    Ok(match pumped {
        Pumped::Gone => {
            up.shutdown().await;
            cand.release_trial();
            count(model, "client_abort");
            pump::finish_stream(ctx, pipe);
            Attempt::Gone(ClientGone("streaming"))
        }
        Pumped::End(last) => {
            cand.health
                .record_success(&route.provider.passive_health, None);
            count(model, "continued");
            let done =
                pump::end_cleanly(connector, session, ctx, up, &target.peer, pipe, last).await;
            // The provider's final usage covers the continuation only; the first attempt's
            // share is an estimate.
            ctx.outcome.usage_estimated = true;
            done
        }
        Pumped::Failed(e) => {
            up.shutdown().await;
            cand.health
                .record_failure(&route.provider.passive_health, None);
            count(model, "failed");
            if let Err(gone) = pump::write_pending(session, ctx, pipe).await {
                return Ok(gone);
            }
            pump::end_with_error(session, ctx, pipe, e).await
        }
    })
}

/// Counts one eligible break in `sluice_stream_continuations_total`.
fn count(model: &Model, outcome: &'static str) {
    debug_assert!(OUTCOMES.contains(&outcome), "{outcome}");
    metrics()
        .stream_continuations_total
        .with_label_values(&[model.id.as_str(), outcome])
        .inc();
}

/// How opening a continuation's upstream ended.
enum Opened {
    /// A 2xx streaming answer's head was read: the session, where it goes, its coding
    /// (boxed: the session is large and the other variants small).
    Up(Box<(UpstreamSession, providers::Target, ContentCoding)>),
    /// The route failed or refused before answering (the next may be tried).
    Failed(AttemptFailure, String),
    /// The client left meanwhile.
    Gone(ClientGone),
    /// Shutdown's grace period ended meanwhile (no further route is tried).
    Shutdown,
}

/// Connects to `route`, sends the continuation request `body` and reads the answer's head
/// (the connect and first-byte timeouts of the route apply, the client's disconnect is
/// watched). A stale pooled connection gets one fresh retry under the attempt loop's rule
/// (only when the request cannot have been processed, [`crate::providers::exchange::SendError::unprocessed`]); a
/// non-2xx answer or an unknown content coding is a failure.
async fn open(
    connector: &Connector,
    session: &mut Session,
    ctx: &RequestCtx,
    req: &InferenceRequest,
    route: &Route,
    body: Bytes,
    timeouts: HopTimeouts,
) -> Opened {
    let provider = &route.provider;
    let resolved = ctx.registry.upstream(provider);
    let target = match providers::target(provider, &resolved).await {
        Ok(t) => t,
        Err(m) => return Opened::Failed(AttemptFailure::Connect, m),
    };
    let path = route.path(true);
    let mut head = match providers::request_head(
        provider,
        &resolved,
        &target,
        &path,
        &body,
        true,
        &ctx.request_id,
    ) {
        Ok(h) => h,
        Err(e) => return Opened::Failed(AttemptFailure::Protocol, e.to_string()),
    };
    if providers::forward_client_headers(
        provider,
        &route.upstream_model,
        &mut head,
        req.anthropic_beta.as_deref(),
    )
    .is_err()
    {
        return Opened::Failed(AttemptFailure::Protocol, "bad anthropic-beta".into());
    }
    let opening = exchange::open(
        || Box::pin(connector.get_http_session(&target.peer)),
        exchange::Deadlines {
            connect: Some(timeouts.connect),
            first_byte: Some(timeouts.first_byte),
        },
        exchange::Resend::Unprocessed,
        || Ok::<_, std::convert::Infallible>(head.clone()),
        Some(body.clone()),
        |step| {
            if let exchange::Step::Resending(e) = step {
                // Counted in the metric; the client's head (`x-sluice-attempts`) is long gone.
                let _ = crate::engine::upstream::stale_resend(ctx, route, e);
            }
        },
    );
    // A resumable stream whose client dropped watches no connection (it waits for a resume).
    let watching = ctx
        .resumable
        .as_deref()
        .is_none_or(crate::stream::resume::writer::Resumable::watches_client);
    let opened = tokio::select! {
        r = opening => r,
        () = client_gone(session), if watching => return Opened::Gone(ClientGone("streaming")),
        () = crate::shutdown::streams_cancelled() => return Opened::Shutdown,
    };
    let mut up = match opened {
        Ok(up) => up,
        Err(OpenError::Head(never)) => match never {},
        Err(OpenError::Connect(e)) => {
            return Opened::Failed(AttemptFailure::Connect, e.to_string())
        }
        Err(OpenError::ConnectTimeout) => {
            return Opened::Failed(AttemptFailure::Connect, "connect timeout".into())
        }
        Err(OpenError::Send(e)) => {
            return Opened::Failed(AttemptFailure::Reset, e.error.to_string())
        }
        Err(OpenError::FirstByteTimeout) => {
            return Opened::Failed(
                AttemptFailure::FirstByteTimeout,
                "first byte timeout".into(),
            )
        }
    };
    let Some(resp) = up.response_header() else {
        up.shutdown().await;
        return Opened::Failed(AttemptFailure::Protocol, "no response head".into());
    };
    let status = resp.status.as_u16();
    if !(200..300).contains(&status) {
        up.shutdown().await;
        return Opened::Failed(AttemptFailure::Status(status), format!("HTTP {status}"));
    }
    match ContentCoding::from_header(resp.headers.get("content-encoding").map(|v| v.as_bytes())) {
        Ok(coding) => Opened::Up(Box::new((up, target, coding))),
        Err(name) => {
            up.shutdown().await;
            Opened::Failed(
                AttemptFailure::Protocol,
                format!("unsupported content-encoding {name:?}"),
            )
        }
    }
}
