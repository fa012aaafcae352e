//! Owns the resume endpoints of resumable streams ([`crate::stream::resume`]):
//!
//! - `GET /v1/streams/{id}`: with the virtual key that started the stream and
//!   `Last-Event-ID: <id>:<seq>` (or `?last_event_id=`; absent: from the first event), a
//!   200 `text/event-stream` with exactly the events after that one, then the live rest,
//!   as the stream's reader (a resume takes the stream over from a reader still attached;
//!   its drop detaches it again and restarts the grace clock).
//! - `DELETE /v1/streams/{id}`: 204, and the generation is cancelled at once.
//! - a `POST` on an inference endpoint whose `Last-Event-ID` names one of Sluice's stream
//!   ids (a client library retrying the request): its body is dropped and it is answered
//!   as the `GET` ([`resume_post`]).
//!
//! Errors are in the stream's dialect (the letter in its id): 404 for an unknown id and
//! for another key's or tenant's (the same body), 410 for a stream that can no longer be
//! resumed (saying which: `stream_expired`, `stream_overflowed`, `stream_cancelled`,
//! `stream_completed`, `event_too_old`), 421 for another replica's id (naming it), 400 for a
//! `Last-Event-ID` of another stream or of an event not sent yet. The resume itself writes
//! no ledger row: the generation's request has the only one, with its `resumptions`. A
//! stream whose final event was written stays resumable for the grace window for the events
//! of its kept tail (`server.resume_linger_bytes`): such a replay is counted as `replayed`
//! in `sluice_stream_resumes_total`, not in the row (written when the final event was).

use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use tokio::time::Instant;

use crate::auth::{hash_key, presented_key};
use crate::engine::upstream::{client_gone, ClientGone};
use crate::error::GatewayError;
use crate::ingress::access::authenticate;
use crate::ingress::respond::ChatError;
use crate::metrics::metrics;
use crate::protocol::{self, ClientDialect};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;
use crate::stream::resume::entry::{Ended, Entry, Next, Owner, Refused};
use crate::stream::resume::id;
use crate::stream::resume::registry::{registry, Found};
use crate::stream::resume::STREAM_ID_HEADER;

/// Counts one answer in `sluice_stream_resumes_total`.
fn count(outcome: &'static str) {
    metrics()
        .stream_resumes_total
        .with_label_values(&[outcome])
        .inc();
}

/// The 404 of an id this key may not see (unknown, or another key's or tenant's).
fn not_found(id: &str) -> GatewayError {
    count("not_found");
    let shown: String = id.chars().take(80).collect();
    GatewayError::NotFound {
        message: format!("no resumable stream `{shown}`"),
        code: "stream_not_found",
    }
}

/// The 410 of a stream that ended.
fn gone(why: Ended) -> GatewayError {
    count("expired");
    GatewayError::StreamGone {
        message: why.message().to_string(),
        code: why.code(),
    }
}

/// `GET` or `DELETE` on `/v1/streams/{id}` (`path` after the `/v1` prefix).
///
/// # Errors
/// The client's error (written in the stream's dialect by the caller), or
/// [`ChatError::Gone`] when the client left.
pub(crate) async fn handle(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    path: &str,
    method: &str,
) -> Result<(), ChatError> {
    serve(
        gw,
        session,
        ctx,
        path.trim_start_matches("/streams/"),
        method,
    )
    .await
}

/// [`handle`] for stream `sid`.
async fn serve(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    sid: &str,
    method: &str,
) -> Result<(), ChatError> {
    let parsed = id::parse(sid);
    // The stream's dialect (its id says it) for every answer, errors included.
    ctx.dialect = parsed.map_or(ClientDialect::ChatCompletions, |p| p.dialect);
    let caller = authenticate(gw, session, ctx)?;
    let Some(parsed) = parsed else {
        return Err(not_found(sid).into());
    };
    let here = ctx.config.server.replica_id.as_str();
    if parsed.replica != here {
        count("misdirected");
        return Err(GatewayError::Misdirected(format!(
            "stream `{sid}` is held by replica `{}`, this is replica `{here}`: send resumes to the replica named in the stream id (sticky load balancing on it)",
            parsed.replica
        ))
        .into());
    }
    let h = &session.req_header().headers;
    let key = presented_key(
        h.get("authorization").map(|v| v.as_bytes()),
        h.get("x-api-key").map(|v| v.as_bytes()),
    )
    .unwrap_or_default();
    let owner = Owner {
        key: hash_key(&key),
        tenant: caller.tenant.as_str().into(),
    };
    let found = registry().find(sid, &owner);
    match (method, found) {
        (_, Found::Unknown) => Err(not_found(sid).into()),
        ("DELETE", found) => {
            if let Found::Live(entry) = found {
                entry.cancel();
                if entry.lingering() {
                    // A completed stream's kept tail: nothing runs to end it, free it now.
                    registry().retire(&entry, Ended::Cancelled);
                }
                log::info!(target: "sluice::stream::resume",
                    "resumable stream cancelled stream_id={sid} request_id={}", ctx.request_id);
            }
            // An ended stream is cancelled already: DELETE is idempotent.
            count("cancelled");
            no_content(session, ctx).await
        }
        (_, Found::Ended(why)) => Err(gone(why).into()),
        (_, Found::Live(entry)) => {
            let after = last_event_id(session, sid)?;
            Box::pin(resume(session, ctx, &entry, after)).await
        }
    }
}

/// The id of one of Sluice's streams a `POST` names in `Last-Event-ID` (`<stream id>:<n>`),
/// if it does. A client library that reconnects by sending the same request again with the
/// header (`@microsoft/fetch-event-source` and its kin, the way to stream SSE from a `POST`
/// in a browser) asks for the resume of that stream, not a new generation.
pub(crate) fn named_by_post(session: &Session) -> Option<String> {
    let v = session.req_header().headers.get("last-event-id")?;
    let s = std::str::from_utf8(v.as_bytes()).ok()?.trim();
    let (sid, _) = s.rsplit_once(':')?;
    id::parse(sid)?;
    Some(sid.to_string())
}

/// A `POST` on an inference endpoint of `dialect` whose `Last-Event-ID` names stream `sid`
/// ([`named_by_post`]): its body is read and dropped (it never starts a generation), then
/// it is answered exactly as `GET /v1/streams/<sid>` with that header.
///
/// # Errors
/// 400 when the stream is of another API than the endpoint, else as [`handle`].
pub(crate) async fn resume_post(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: ClientDialect,
    sid: &str,
) -> Result<(), ChatError> {
    ctx.dialect = dialect;
    if id::parse(sid).is_some_and(|p| p.dialect != dialect) {
        return Err(GatewayError::invalid(
            format!("`Last-Event-ID` names stream `{sid}`, which is not of this endpoint's API"),
            Some("last_event_id"),
        )
        .into());
    }
    if session.drain_request_body().await.is_err() {
        return Err(ChatError::Gone(ClientGone("reading")));
    }
    log::debug!(target: "sluice::stream::resume",
        "a POST with Last-Event-ID resumes stream_id={sid} request_id={}", ctx.request_id);
    serve(gw, session, ctx, sid, "GET").await
}

/// The event the client names (`Last-Event-ID`, else `?last_event_id=`; 0: none).
fn last_event_id(session: &Session, sid: &str) -> Result<u64, GatewayError> {
    let req = session.req_header();
    let raw = match req.headers.get("last-event-id") {
        Some(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        None => req
            .uri
            .query()
            .and_then(|q| {
                url_query_value(q, "last_event_id").map(|v| {
                    percent_encoding::percent_decode_str(v)
                        .decode_utf8_lossy()
                        .into_owned()
                })
            })
            .unwrap_or_default(),
    };
    id::event_seq(sid, &raw).map_err(|()| {
        GatewayError::invalid(
            format!("`Last-Event-ID` must be an event id of this stream (`{sid}:<n>`)"),
            Some("last_event_id"),
        )
    })
}

/// The value of `name` in the query string `q` (undecoded).
fn url_query_value<'q>(q: &'q str, name: &str) -> Option<&'q str> {
    q.split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `204 No Content`.
async fn no_content(session: &mut Session, ctx: &mut RequestCtx) -> Result<(), ChatError> {
    let write = async {
        let mut h = ResponseHeader::build_no_case(204, Some(2))?;
        h.insert_header("x-request-id", &ctx.request_id)?;
        ctx.outcome.status = 204;
        ctx.outcome.label = "ok";
        ctx.attempts.downstream_committed = true;
        session.write_response_header(Box::new(h), true).await
    };
    write
        .await
        .map_err(|_| ChatError::Gone(ClientGone("writing")))
}

/// Takes the stream over after event `after` and writes the events after it, then the live
/// rest, until the stream's end (or this client's drop: the stream is detached again).
async fn resume(
    session: &mut Session,
    ctx: &mut RequestCtx,
    entry: &Entry,
    after: u64,
) -> Result<(), ChatError> {
    let reader = match entry.take_over(after) {
        Ok(r) => r,
        Err(Refused::Ended(why)) => return Err(gone(why).into()),
        Err(Refused::TooOld(t)) => {
            count("expired");
            return Err(GatewayError::StreamGone {
                message: format!(
                    "event {after} is no longer kept: the replay buffer (server.resume_buffer_bytes) starts after event {}",
                    t.oldest - 1
                ),
                code: "event_too_old",
            }
            .into());
        }
        Err(Refused::Unknown) => {
            return Err(GatewayError::invalid(
                format!("`Last-Event-ID` names event {after}, which the stream has not sent"),
                Some("last_event_id"),
            )
            .into())
        }
    };
    // However this reader ends (its write fails, its task is dropped), the stream is
    // detached from it (nothing when another took over or the stream ended).
    let _attached = Attached { entry, reader };
    // A completed stream's kept tail: its ledger row is written already (this resume is
    // counted here and logged, not in its `resumptions`).
    let replay = entry.lingering();
    count(if replay { "replayed" } else { "resumed" });
    log::info!(target: "sluice::stream::resume",
        "resumable stream resumed stream_id={} after={after} reader={reader} completed={replay} request_id={}",
        entry.id, ctx.request_id
    );
    let head = sse_head(ctx, &entry.id).map_err(|e| GatewayError::Internal(e.to_string()))?;
    ctx.outcome.status = 200;
    ctx.outcome.label = "ok";
    ctx.attempts.downstream_committed = true;
    if session
        .write_response_header(Box::new(head), false)
        .await
        .is_err()
    {
        return Err(ChatError::Gone(ClientGone("writing")));
    }
    read_on(session, ctx, entry, reader, after).await
}

/// Writes the events of `entry` after `after` as its reader `reader`, then waits for the
/// live ones, until the stream ends (or this client drops, or another resume takes over).
async fn read_on(
    session: &mut Session,
    ctx: &mut RequestCtx,
    entry: &Entry,
    reader: u64,
    after: u64,
) -> Result<(), ChatError> {
    let heartbeat = ctx.config.server.default_timeouts.heartbeat;
    let beat = protocol::heartbeat(entry.dialect);
    let mut rx = entry.subscribe();
    let mut cursor = after;
    let mut last_write = Instant::now();
    let shutdown = crate::shutdown::streams_cancelled();
    tokio::pin!(shutdown);
    loop {
        drop(rx.borrow_and_update());
        let step = entry.next(reader, cursor);
        let (body, end, last) = match step {
            Next::Events(events, last) => {
                let mut out = BytesMut::with_capacity(events.iter().map(Bytes::len).sum());
                for e in &events {
                    out.extend_from_slice(e);
                }
                (Some(out.freeze()), false, last)
            }
            Next::End => (None, true, cursor),
            Next::Lost => {
                // Taken over by a newer resume, or ended without its final event: this
                // response cannot be completed.
                session.set_keepalive(None);
                session.downstream_session.shutdown().await;
                return Err(ChatError::Gone(ClientGone("streaming")));
            }
            Next::Wait => {
                let wake = last_write + heartbeat;
                tokio::select! {
                    biased;
                    () = client_gone(session) => {
                        return Err(ChatError::Gone(ClientGone("streaming")));
                    }
                    _ = rx.changed() => {}
                    () = &mut shutdown => {
                        session.set_keepalive(None);
                        session.downstream_session.shutdown().await;
                        return Err(ChatError::Gone(ClientGone("streaming")));
                    }
                    () = tokio::time::sleep_until(wake) => {
                        let b = heartbeat_bytes(beat, &entry.id, cursor);
                        if session.write_response_body(Some(b), false).await.is_err() {
                            return Err(ChatError::Gone(ClientGone("streaming")));
                        }
                        last_write = Instant::now();
                    }
                }
                continue;
            }
        };
        if let Some(b) = &body {
            ctx.outcome.bytes_out += b.len() as u64;
        }
        if session.write_response_body(body, end).await.is_err() {
            return Err(ChatError::Gone(ClientGone("streaming")));
        }
        last_write = Instant::now();
        // The overflow of a stream is its generation's to act on.
        let _ = entry.sent(reader, last, end);
        if end {
            return Ok(());
        }
        cursor = last;
    }
}

/// Detaches reader `reader` from `entry` when dropped.
struct Attached<'e> {
    entry: &'e Entry,
    reader: u64,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        self.entry.detach(self.reader);
    }
}

/// The heartbeat of a resumed stream: a comment as it is, an event (Anthropic's `ping`)
/// with the last event's id (none before the first).
fn heartbeat_bytes(beat: &'static [u8], sid: &str, cursor: u64) -> Bytes {
    if beat.first() == Some(&b':') || cursor == 0 {
        return Bytes::from_static(beat);
    }
    let mut b = BytesMut::from(format!("id: {sid}:{cursor}\n").as_bytes());
    b.extend_from_slice(beat);
    b.freeze()
}

/// The head of a resumed stream: the SSE headers, `x-request-id`, the stream id.
fn sse_head(ctx: &RequestCtx, sid: &str) -> pingora::Result<ResponseHeader> {
    let mut h = ResponseHeader::build_no_case(200, Some(6))?;
    h.insert_header("content-type", "text/event-stream; charset=utf-8")?;
    h.insert_header("cache-control", "no-cache")?;
    h.insert_header("x-accel-buffering", "no")?;
    h.insert_header("transfer-encoding", "chunked")?;
    h.insert_header("x-request-id", &ctx.request_id)?;
    h.insert_header(STREAM_ID_HEADER, sid)?;
    Ok(h)
}
