//! Owns the stream pump: a streaming answer's head is held until the first data event (any
//! failure before it falls back), then the response is committed and upstream chunks are
//! pumped through the [`StreamPipe`] with heartbeats in the client's dialect, idle, first
//! event and duration limits, coalesced writes and client-disconnect detection. After the
//! commit a failure ends the stream with the client's in-stream error event, unless the
//! model opted in to mid-stream continuation ([`crate::engine::continuation`]), which may splice the
//! rest of the answer from the next candidate into the same stream first. At the commit the
//! request's parsed body is released (nothing is replayed after it; continuation keeps it).
//!
//! The pump names no provider kind and no dialect module: the pipe holds the
//! [`crate::protocol::StreamTranslator`] (or nothing, on the same-dialect fast path).

use std::time::Duration;

use crate::engine::pool::Connector;
use bytes::Bytes;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;
use tokio::time::{sleep_until, Instant};

use crate::config::{HopTimeouts, Model, Route};
use crate::engine::continuation;
use crate::engine::state::AttemptState;
use crate::engine::state::ReadyParts;
use crate::engine::upstream::{
    client_gone, estimate_usage, failed, release_or_close, set_usage, unix_now, Attempt, ClientGone,
};
use crate::error::{AttemptFailure, GatewayError};
use crate::ingress::request::InferenceRequest;
use crate::ingress::respond;
use crate::metrics::metrics;
use crate::protocol;
use crate::providers;
use crate::providers::encoding::ContentCoding;
use crate::proxy::ctx::RequestCtx;
use crate::stream::end::{Pumped, StreamError};
use crate::stream::pipe::{PipeError, StreamPipe};
use crate::stream::resume::{
    self,
    writer::{Resumable, Stop},
};

/// Shortest interval between two upstream keepalives relayed to the client of a translated
/// stream (see [`StreamPipe::take_keepalive`]).
const KEEPALIVE_RELAY_INTERVAL: Duration = Duration::from_secs(1);

/// Most output bytes gathered from already-received upstream chunks into one downstream
/// write (see [`coalesce_ready`]).
const COALESCE_BYTES: usize = 16 * 1024;

/// A stream held before its commit: the upstream answered 2xx and its first data event (or
/// the early-commit deadline) arrived; nothing was written to the client yet. What
/// [`first_event`] hands to [`stream`].
pub(crate) struct Held<'r> {
    /// The pipe, holding the complete events read so far.
    pub(crate) pipe: StreamPipe<'r>,
    /// The upstream body already ended (the whole answer arrived before the commit).
    pub(crate) ended: bool,
    /// When the first data event is due (`first_event_timeout_ms` after the head).
    pub(crate) first_event_deadline: Instant,
    /// When the read that brought the first data event completed (`None`: early commit
    /// before any event).
    pub(crate) first_event_at: Option<Instant>,
}

/// Phase 1 of a streaming answer, before the commit: reads the upstream until its first data
/// event (or `models.<id>.early_commit_after_ms` after the request arrived), holding the
/// head. Any failure here is the attempt's ([`Attempt::Failed`] / [`Attempt::Final`]): the
/// next candidate may serve. It touches no downstream state, so the attempt loop races it
/// against the client's disconnect and shutdown (and, hedged, against another attempt);
/// dropping it drops the upstream connection.
#[expect(
    clippy::too_many_lines,
    reason = "one linear state machine reads best in one place"
)]
pub(crate) async fn first_event<'r>(
    ctx: &RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &'r Route,
    up: &mut UpstreamSession,
    timeouts: HopTimeouts,
    coding: ContentCoding,
) -> Result<Held<'r>, Attempt> {
    let mut pipe = open_pipe(ctx, req, model, route, up, coding).await?;
    let head_at = Instant::now();
    let first_event_deadline = head_at + timeouts.first_event;
    let early_commit_at = model.early_commit_after.map(|d| ctx.received + d);
    let mut ended = false;
    let mut first_event_at = None;

    while pipe.data_events == 0 {
        enum Ev {
            Chunk(pingora::Result<Option<Bytes>>),
            FirstEventTimeout,
            EarlyCommit,
        }
        let ev = tokio::select! {
            biased;
            r = up.read_response_body() => Ev::Chunk(r),
            () = sleep_until(first_event_deadline) => Ev::FirstEventTimeout,
            () = sleep_until(early_commit_at.unwrap_or(first_event_deadline)), if early_commit_at.is_some() => Ev::EarlyCommit,
        };
        match ev {
            Ev::FirstEventTimeout => {
                up.shutdown().await;
                let err = GatewayError::UpstreamTimeout(format!(
                    "provider `{}` sent no event within {} ms",
                    route.provider.id,
                    timeouts.first_event.as_millis()
                ));
                return Err(failed(
                    route,
                    AttemptFailure::FirstEventTimeout,
                    "first event timeout".into(),
                    err,
                ));
            }
            Ev::EarlyCommit => break,
            Ev::Chunk(Ok(chunk)) => {
                let end = chunk.is_none();
                match pipe.feed(chunk.as_deref()) {
                    Ok(()) if pipe.data_events > 0 => {
                        first_event_at = Some(Instant::now());
                    }
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
                            message: providers::upstream_errors::mask_upstream_model(
                                &providers::scrub_key(&route.provider, &message),
                                &route.upstream_model,
                                &model.id,
                            ),
                            retry_after: None,
                        };
                        return Err(failed(
                            route,
                            AttemptFailure::Protocol,
                            "in-band error before first event".into(),
                            err,
                        ));
                    }
                    Err(PipeError::Framing { reason, message: m }) => {
                        up.shutdown().await;
                        // The client is told the real cause (the pipe's messages name the
                        // provider and the limit or break, never the upstream's bytes).
                        let err = GatewayError::UpstreamUnavailable {
                            message: providers::scrub_key(&route.provider, &m),
                            retry_after: None,
                        };
                        return Err(failed(
                            route,
                            AttemptFailure::Protocol,
                            format!("{reason}: {m}"),
                            err,
                        ));
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
                        return Err(failed(
                            route,
                            AttemptFailure::Reset,
                            "closed before first event".into(),
                            err,
                        ));
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
                return Err(failed(route, AttemptFailure::Reset, e.to_string(), err));
            }
        }
    }
    Ok(Held {
        pipe,
        ended,
        first_event_deadline,
        first_event_at,
    })
}

/// The pipe of a streaming answer of `route` in `coding`, for the client of `ctx` (closes
/// `up` when it cannot be made).
pub(crate) async fn open_pipe<'r>(
    ctx: &RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    route: &'r Route,
    up: &mut UpstreamSession,
    coding: ContentCoding,
) -> Result<StreamPipe<'r>, Attempt> {
    let server = &ctx.config.server;
    // The model that answers names itself (a fallback model its own id, as its routes do;
    // the route's public name when the model reports the served model).
    let mut pipe = match StreamPipe::new(
        route,
        ctx.dialect,
        model.echoed_name(route),
        req.include_usage,
        req.echo(),
        coding,
        server.max_event_bytes,
        server.max_buffered_bytes_per_stream,
        unix_now(),
        model
            .continue_on_break
            .then_some(continuation::TRANSCRIPT_CAP_BYTES),
    ) {
        Ok(p) => p,
        Err(e) => {
            up.shutdown().await;
            return Err(Attempt::Final(GatewayError::Internal(format!("{e:?}"))));
        }
    };
    if ctx.response_capture.is_some() {
        pipe.capture_terminal();
    }
    Ok(pipe)
}

/// Phase 2 of a streaming answer: commits the held stream ([`first_event`]) to the client
/// and pumps it with heartbeats, idle and duration limits, and client-disconnect detection;
/// a break after the commit may continue on `rest` ([`continuation`], opt-in).
#[expect(
    clippy::too_many_lines,
    reason = "the commit, the pump and each way a stream ends (clean, broken, continued) in order"
)]
pub(crate) async fn stream(
    s: AttemptState<'_, '_>,
    route: &Route,
    parts: Box<ReadyParts<Held<'_>>>,
) -> Attempt {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates: rest,
        later,
    } = s;
    // Moved out of their box in one statement: the box is freed at once, and only these
    // locals (not also the parts, the box or a `Held`) are part of the stream's future.
    let ReadyParts {
        mut up,
        peer,
        timeouts,
        body:
            Held {
                mut pipe,
                ended,
                first_event_deadline,
                first_event_at,
            },
    } = ReadyParts::take(parts);
    let peer = &peer;
    if first_event_at.is_some() {
        ctx.outcome.upstream_first_event = first_event_at;
    }

    // Commit: the response head goes out with whatever complete events we hold.
    ctx.outcome.provider = Some(route.provider.id.clone());
    ctx.outcome.upstream_model = Some(route.upstream_model.clone());
    ctx.outcome.label = "ok";
    ctx.outcome.status = 200;
    ctx.outcome.overhead = ctx.outcome.overhead_at(ctx.received.elapsed());
    let mut head = match respond::proxied_head(ctx, 200, true, None, &route.provider.id) {
        Ok(h) => h,
        Err(e) => {
            up.shutdown().await;
            return Attempt::Final(GatewayError::Internal(e.to_string()));
        }
    };
    if let Some(r) = ctx.resumable.as_deref_mut() {
        if head
            .insert_header(crate::stream::resume::STREAM_ID_HEADER, r.id())
            .is_err()
        {
            up.shutdown().await;
            return Attempt::Final(GatewayError::Internal("stream id header".into()));
        }
        r.commit();
    }
    if session.req_header().version == http::Version::HTTP_10 {
        // HTTP/1.0 has no chunked encoding (RFC 9112 §7.1): the stream ends with the connection.
        head.remove_header("transfer-encoding");
        session.set_keepalive(None);
    }
    let first = pipe.take();
    // The whole answer may already be here (`[DONE]` seen): end the response at once.
    let complete = ended || pipe.finished();
    // (Not for a resumable stream: its ids change the length.)
    if complete && ctx.resumable.is_none() && head.headers.get("transfer-encoding").is_some() {
        // Its length is known: with `content-length` Pingora does not flush the head on its
        // own, so head and events leave in one write where they fit the connection's write
        // buffer (a short answer), else in two, instead of head, chunk and last chunk.
        head.remove_header("transfer-encoding");
        if head
            .insert_header("content-length", first.len().to_string())
            .is_err()
        {
            up.shutdown().await;
            return Attempt::Final(GatewayError::Internal("content-length header".into()));
        }
    }
    ctx.attempts.downstream_committed = true;
    if !first.is_empty() {
        // The first events are written right after the head, and their write flushes both:
        // one send instead of two where they fit the connection's write buffer (the patched
        // pingora-core, `vendor/`). Early commit writes the head alone, flushed.
        session.hold_response_header_flush();
    }
    if session
        .write_response_header(Box::new(head), false)
        .await
        .is_err()
    {
        up.shutdown().await;
        return Attempt::Gone(ClientGone("writing"));
    }
    crate::engine::upstream::trial_answered(route);
    if pipe.first_content {
        ctx.outcome.ttft = Some(ctx.received.elapsed());
    }
    ctx.outcome.bytes_out += first.len() as u64;
    let body = (!first.is_empty()).then_some(first);
    if complete {
        // Pooled before the client sees the end (see the end of phase 2).
        Box::pin(release_or_close(connector, up, peer)).await;
        if emit(session, ctx, body, true).await.is_err() {
            finish_stream(ctx, &pipe);
            return Attempt::Gone(ClientGone("streaming"));
        }
        finish_stream(ctx, &pipe);
        return Attempt::Done;
    }
    if let Some(body) = body {
        if emit(session, ctx, Some(body), false).await.is_err() {
            up.shutdown().await;
            return Attempt::Gone(ClientGone("streaming"));
        }
    }

    // Nothing is sent upstream again (fallback ends at the commit), so the parsed body and
    // its buffer reservation go now, not at the stream's end (after the first write: not on
    // the first byte's path); a model that continues after a break (`continue_on_break`)
    // re-encodes it for the next route and keeps it. The input figure stays: the provider's,
    // if it gave one already, else a small sample of the prompt to estimate it from.
    if !model.continue_on_break {
        req.release_payload(pipe.usage.map(|u| u.input_tokens).filter(|&n| n > 0));
    }

    // Phase 2: committed. Pump until the end; failures become an SSE error event.
    let since = ctx.outcome.upstream_first_event;
    let pumped = pump_body(
        session,
        ctx,
        &mut up,
        &mut pipe,
        route,
        timeouts,
        first_event_deadline,
        since,
    )
    .await;
    match pumped {
        Pumped::Gone => {
            up.shutdown().await;
            finish_stream(ctx, &pipe);
            Attempt::Gone(ClientGone("streaming"))
        }
        Pumped::End(last) => end_cleanly(connector, session, ctx, up, peer, &pipe, last).await,
        Pumped::Failed(err) => {
            up.shutdown().await;
            if let Err(gone) = write_pending(session, ctx, &mut pipe).await {
                return gone;
            }
            // Mid-stream continuation (opt-in, `models.<id>.continue_on_break`): the rest of
            // the answer may come from the next candidate, spliced into this stream.
            let err = if model.continue_on_break {
                // Boxed: a rare path, kept out of every held stream's future.
                let resumed = Box::pin(continuation::resume(
                    AttemptState {
                        connector,
                        session: &mut *session,
                        ctx: &mut *ctx,
                        req,
                        model,
                        candidates: rest,
                        later,
                    },
                    &mut pipe,
                    err,
                ));
                match resumed.await {
                    Ok(done) => return done,
                    Err(err) => err,
                }
            } else {
                err
            };
            end_with_error(session, ctx, &mut pipe, err).await
        }
    }
}

/// Phase 2 of a stream, after the commit: pumps `up` through `pipe` to the client until the
/// end, with heartbeats, the idle, first event (`first_event_deadline`, while no data event
/// came) and duration limits, coalesced writes and client-disconnect detection. `since`: the
/// arrival of the last content event before this upstream's (inter-token gaps).
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state is passed explicitly, not hidden in the ctx"
)]
#[expect(
    clippy::too_many_lines,
    reason = "one linear state machine reads best in one place"
)]
pub(crate) async fn pump_body(
    session: &mut Session,
    ctx: &mut RequestCtx,
    up: &mut UpstreamSession,
    pipe: &mut StreamPipe<'_>,
    route: &Route,
    timeouts: HopTimeouts,
    first_event_deadline: Instant,
    since: Option<Instant>,
) -> Pumped {
    let standard = ctx.standard_model.as_deref().unwrap_or_default();
    let coalesce_bytes = COALESCE_BYTES.min(ctx.config.server.max_buffered_bytes_per_stream);
    let mut gaps = crate::metrics::InterTokenClock::new(
        standard,
        &route.provider.id,
        pipe.content_events,
        since,
    );
    let max_end = ctx
        .config
        .server
        .max_stream_duration
        .map(|d| ctx.received + d);
    // Timers are armed once and re-armed only when they fire (lazy deadlines): a chunk
    // just stamps `last_upstream` / `last_write`, so the per-event path touches no timer.
    // The heartbeat clock runs on bytes written to the client: `last_write` is the last
    // write of events or of a heartbeat. Upstream events that produce no client bytes
    // (a dropped malformed event) do not postpone a heartbeat; upstream keepalives are
    // relayed (at most one a second) and so do, as any write.
    let idle = timeouts.idle.max(Duration::from_millis(1));
    let mut last_upstream = Instant::now();
    let mut last_write = last_upstream;
    let idle_timer = sleep_until(last_upstream + idle);
    let heartbeat_timer = sleep_until(last_write + timeouts.heartbeat);
    let first_event_timer = sleep_until(first_event_deadline);
    let max_end_timer = sleep_until(max_end.unwrap_or(first_event_deadline));
    // Subscribed once per stream, not once per chunk: each subscription registers with
    // (and its drop unregisters from, under a lock) the shutdown channel's waiters.
    let shutdown = crate::shutdown::streams_cancelled();
    // A resumable stream's grace window and cancel are watched too: one future for the
    // whole pump (boxed, allocated for resumable streams only).
    let mut control = ctx
        .resumable
        .as_deref()
        .map(|r| resume::writer::control(r.entry()));
    tokio::pin!(
        idle_timer,
        heartbeat_timer,
        first_event_timer,
        max_end_timer,
        shutdown
    );
    // `Ok(last)`: the stream ended cleanly and `last` is its final output, written after the
    // upstream connection went back to the pool; `Err`: it failed.
    let stream_end: Result<Option<Bytes>, StreamError> = loop {
        enum Ev {
            Chunk(pingora::Result<Option<Bytes>>),
            Gone,
            Idle,
            MaxDuration,
            FirstEventTimeout,
            Shutdown,
            Stopped(Stop),
        }
        let ev = {
            let read = up.read_response_body();
            tokio::pin!(read);
            loop {
                let waiting_first = pipe.data_events == 0;
                // A resumable stream whose client dropped watches no connection.
                let watching = ctx
                    .resumable
                    .as_deref()
                    .is_none_or(Resumable::watches_client);
                enum Tick {
                    Ev(Ev),
                    Idle,
                    Heartbeat,
                }
                let tick = tokio::select! {
                    biased;
                    () = client_gone(session), if watching => Tick::Ev(Ev::Gone),
                    r = &mut read => Tick::Ev(Ev::Chunk(r)),
                    stop = resume::writer::stopped(&mut control), if control.is_some() => Tick::Ev(Ev::Stopped(stop)),
                    () = &mut idle_timer => Tick::Idle,
                    () = &mut first_event_timer, if waiting_first => Tick::Ev(Ev::FirstEventTimeout),
                    () = &mut max_end_timer, if max_end.is_some() => Tick::Ev(Ev::MaxDuration),
                    () = &mut shutdown => Tick::Ev(Ev::Shutdown),
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
                        if !watching {
                            // A detached resumable stream: no heartbeat to nobody.
                            heartbeat_timer
                                .as_mut()
                                .reset(Instant::now() + timeouts.heartbeat);
                            continue;
                        }
                        // Between events only: `out` is always drained after each chunk.
                        metrics()
                            .heartbeats_total
                            .with_label_values(&[route.provider.id.as_str()])
                            .inc();
                        let beat = protocol::heartbeat(ctx.dialect);
                        ctx.outcome.bytes_out += beat.len() as u64;
                        if let Some(r) = ctx.resumable.as_deref_mut() {
                            // To the original client while it holds the stream; a resume
                            // writes its own.
                            Box::pin(r.heartbeat(session, beat)).await;
                        } else if session
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
            Ev::Gone => match ctx.resumable.as_deref_mut() {
                // Detached, not ended: the generation runs on into the buffer.
                Some(r) => {
                    Box::pin(r.drop_session(session)).await;
                    continue;
                }
                None => return Pumped::Gone,
            },
            Ev::Stopped(stop) => {
                if let Some(r) = ctx.resumable.as_deref_mut() {
                    r.stop(stop);
                }
                return Pumped::Gone;
            }
            Ev::Idle => {
                break Err(StreamError::gateway(
                    "idle_timeout",
                    format!(
                        "provider `{}` sent nothing for {} ms",
                        route.provider.id,
                        timeouts.idle.as_millis()
                    ),
                ))
            }
            Ev::MaxDuration => {
                break Err(StreamError::gateway(
                    "max_stream_duration",
                    "the stream reached its maximum duration".to_string(),
                ))
            }
            Ev::Shutdown => {
                break Err(StreamError::gateway(
                    "shutdown",
                    "the gateway is shutting down; retry the request".to_string(),
                ))
            }
            Ev::FirstEventTimeout => {
                break Err(StreamError::gateway(
                    "first_event_timeout",
                    format!(
                        "provider `{}` sent no event within {} ms",
                        route.provider.id,
                        timeouts.first_event.as_millis()
                    ),
                ))
            }
            Ev::Chunk(Err(e)) => break Err(stream_broken(&ctx.request_id, route, &e)),
            Ev::Chunk(Ok(chunk)) => {
                let end = chunk.is_none();
                if let Err(e) = pipe.feed(chunk.as_deref()) {
                    break Err(pipe_failure(route, served_as(ctx), e));
                }
                // Events that arrived together leave together: one write, not one per event.
                let stop = if end || pipe.finished() {
                    ReadyStop::Pending
                } else {
                    coalesce_ready(up, pipe, coalesce_bytes).await
                };
                let end = end || matches!(stop, ReadyStop::End);
                // A budgeted tenant's running charge is held against its budget before the
                // output that makes it goes out (nothing to do for other tenants). Not at the
                // end, nor once the upstream said the answer is finished (its usage may come in
                // a read of its own before the terminator): a complete answer is billed whole,
                // and cutting it would stop nothing.
                if ctx.billing.budget.is_some() && !end && !pipe.stopped() {
                    if let Err(e) = super::budget::check(ctx, pipe).await {
                        break Err(e);
                    }
                }
                let had_content = ctx.outcome.ttft.is_some();
                let mut out = pipe.take();
                // An upstream keepalive the translation turned into nothing (Anthropic `ping`
                // during a long think, a comment) is relayed as the client dialect's own
                // keepalive, at most one a second: the client sees traffic as often as the
                // upstream sends it, not only every `heartbeat_interval_ms`.
                if pipe.take_keepalive()
                    && out.is_empty()
                    && !end
                    && !pipe.finished()
                    && last_write.elapsed() >= KEEPALIVE_RELAY_INTERVAL
                {
                    metrics()
                        .heartbeats_total
                        .with_label_values(&[route.provider.id.as_str()])
                        .inc();
                    let beat = protocol::heartbeat(ctx.dialect);
                    match ctx.resumable.as_deref_mut() {
                        // A keepalive is no event of the stream: not numbered, not kept.
                        Some(r) => {
                            Box::pin(r.heartbeat(session, beat)).await;
                            last_write = Instant::now();
                        }
                        None => out = Bytes::from_static(beat),
                    }
                }
                if !had_content && pipe.first_content {
                    ctx.outcome.ttft = Some(ctx.received.elapsed());
                }
                last_upstream = Instant::now();
                gaps.arrived(pipe.content_events, last_upstream);
                if !out.is_empty() {
                    last_write = last_upstream;
                }
                // After `[DONE]` nothing more is for the client (no heartbeat either): end
                // its response now rather than when the upstream gets round to closing.
                let complete = end || pipe.finished();
                ctx.outcome.bytes_out += out.len() as u64;
                let body = (!out.is_empty()).then_some(out);
                if complete {
                    break Ok(body);
                }
                if let Some(body) = body {
                    if emit(session, ctx, Some(body), false).await.is_err() {
                        return Pumped::Gone;
                    }
                }
                match stop {
                    ReadyStop::Pending | ReadyStop::End => {}
                    ReadyStop::Broken(e) => break Err(stream_broken(&ctx.request_id, route, &e)),
                    ReadyStop::Pipe(e) => {
                        break Err(pipe_failure(route, served_as(ctx), e));
                    }
                }
            }
        }
    };

    match stream_end {
        Ok(last) => Pumped::End(last),
        Err(e) => Pumped::Failed(e),
    }
}

/// Ends a stream that completed: the upstream connection goes back to the pool before the
/// client sees the end (a client that sends its next request on `[DONE]` finds it there),
/// then `last` is written with the end of the response.
pub(crate) async fn end_cleanly(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    up: UpstreamSession,
    peer: &pingora::upstreams::peer::HttpPeer,
    pipe: &StreamPipe<'_>,
    last: Option<Bytes>,
) -> Attempt {
    Box::pin(release_or_close(connector, up, peer)).await;
    let written = emit(session, ctx, last, true).await;
    finish_stream(ctx, pipe);
    if written.is_err() {
        return Attempt::Gone(ClientGone("streaming"));
    }
    Attempt::Done
}

/// Writes the events completed before a failure (in the chunk that failed, or gathered
/// with it): they are the client's and go out before the error event, never dropped.
///
/// # Errors
/// The [`Attempt`] to return when the client left.
pub(crate) async fn write_pending(
    session: &mut Session,
    ctx: &mut RequestCtx,
    pipe: &mut StreamPipe<'_>,
) -> Result<(), Attempt> {
    let pending = pipe.take();
    if pending.is_empty() {
        return Ok(());
    }
    if ctx.outcome.ttft.is_none() && pipe.first_content {
        ctx.outcome.ttft = Some(ctx.received.elapsed());
    }
    ctx.outcome.bytes_out += pending.len() as u64;
    if emit(session, ctx, Some(pending), false).await.is_err() {
        finish_stream(ctx, pipe);
        return Err(Attempt::Gone(ClientGone("streaming")));
    }
    Ok(())
}

/// Ends a committed stream that failed with the client's in-stream error event (the
/// upstream is closed and the pending events written already).
pub(crate) async fn end_with_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    pipe: &mut StreamPipe<'_>,
    err: StreamError,
) -> Attempt {
    let StreamError {
        reason,
        kind,
        error_type,
        message,
    } = err;
    metrics()
        .stream_errors_total
        .with_label_values(&[reason])
        .inc();
    // Sluice's own cuts have their own outcome (ledger: `shutdown`, `rejected`); the rest
    // broke upstream.
    ctx.outcome.label = match reason {
        "shutdown" => "shutdown",
        "budget_exceeded" => "budget_exceeded",
        _ => "stream_error",
    };
    let ev = pipe.error_event(kind, &error_type, &message, reason);
    ctx.outcome.bytes_out += ev.len() as u64;
    if !matches!(
        reason,
        "max_stream_duration" | "shutdown" | "first_event_timeout" | "budget_exceeded"
    ) {
        ctx.outcome.upstream_broke = true;
    }
    let written = emit(session, ctx, Some(ev), true).await;
    finish_stream(ctx, pipe);
    if reason == "budget_exceeded" {
        // Metered at what the budget let through, not the batch it stopped.
        if let Some(n) = ctx.billing.budget_output_tokens {
            let o = &mut ctx.outcome;
            o.output_tokens = o.output_tokens.min(n);
            o.reasoning_tokens = o.reasoning_tokens.min(o.output_tokens);
        }
    }
    if written.is_err() {
        return Attempt::Gone(ClientGone("streaming"));
    }
    Attempt::Done
}

/// Writes `body` (and the end of the response when `end`) of a committed stream: every
/// client write after the commit goes through here. A stream that did not opt in to
/// resumption gets exactly the session's write (one branch, nothing allocated); a
/// resumable one stamps event ids, keeps the events for a resume and writes them to the
/// original client while it holds the stream ([`Resumable::emit`]: its drop detaches it,
/// the stream goes on).
///
/// # Errors
/// The client is gone (for a resumable stream: its replay buffer overflowed): the stream
/// ends as a client abort.
pub(crate) async fn emit(
    session: &mut Session,
    ctx: &mut RequestCtx,
    body: Option<Bytes>,
    end: bool,
) -> Result<(), ()> {
    match ctx.resumable.as_deref_mut() {
        None => session.write_response_body(body, end).await.map_err(drop),
        // Boxed: its state is not part of every stream's future.
        Some(r) => Box::pin(r.emit(session, body, end)).await.map_err(drop),
    }
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

/// The standard model a stream is served as: the fallback model that answered, else the
/// one asked for.
fn served_as(ctx: &RequestCtx) -> &str {
    ctx.answered_model
        .as_deref()
        .or(ctx.standard_model.as_deref())
        .unwrap_or_default()
}

/// The stream error for an upstream read that failed mid-stream.
fn stream_broken(request_id: &str, route: &Route, e: &pingora::Error) -> StreamError {
    log::warn!(target: "sluice::proxy::pump", "upstream stream broke request_id={request_id} provider={} error={e}",
        route.provider.id
    );
    StreamError::gateway(
        "upstream_broken",
        format!("provider `{}` broke off the stream", route.provider.id),
    )
}

/// The stream error for an in-band upstream error (the provider's error type kept) or a
/// body that broke (framing, encoding, truncation, a missing finish).
/// The provider's message names no upstream model: the route's is replaced by `standard`
/// ([`providers::upstream_errors::mask_upstream_model`]).
fn pipe_failure(route: &Route, standard: &str, e: PipeError) -> StreamError {
    match e {
        PipeError::Upstream {
            kind,
            error_type,
            message,
        } => StreamError {
            reason: "upstream_error",
            kind,
            error_type: providers::scrub_key(&route.provider, &error_type),
            message: providers::upstream_errors::mask_upstream_model(
                &providers::scrub_key(&route.provider, &message),
                &route.upstream_model,
                standard,
            ),
        },
        PipeError::Framing { reason, message } => {
            log::warn!(target: "sluice::proxy::pump", "upstream stream ended badly provider={} reason={reason} detail={message:?}",
                route.provider.id
            );
            StreamError::gateway(reason, message)
        }
    }
}

/// Records usage for a finished stream (metering): the provider's final `usage` when the
/// stream completed with one, else an estimate (see [`estimate_usage`]); hands the terminal
/// event the client received to the response capture, if the response is stored.
pub(crate) fn finish_stream(ctx: &mut RequestCtx, pipe: &StreamPipe<'_>) {
    if let Some(c) = ctx.response_capture.as_deref_mut() {
        c.answer = pipe
            .terminal()
            .map(crate::conversation::capture::Answer::Stream);
    }
    match pipe.final_usage() {
        Some(u) => set_usage(ctx, &u, false),
        None => {
            let streamed = pipe.estimator.tokens();
            estimate_usage(ctx, pipe.usage, streamed);
        }
    }
}
