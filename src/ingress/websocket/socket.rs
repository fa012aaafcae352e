//! Owns the life of one accepted Responses WebSocket: the loop that reads frames from the
//! client, runs one response at a time ([`super::turn`]), writes its events, pings, and
//! closes.
//!
//! - **One response at a time.** A `response.create` while a response is in flight gets an
//!   `error` event (`conversation_already_has_active_response`, the code OpenAI's Realtime
//!   API uses for the same case) and the socket stays open. One that arrives after the
//!   previous answer was sent but before its subrequest finished (its access line and ledger
//!   row) waits for it (one such message at most).
//! - **State only.** A `response.create` with `generate: false` (Codex warms its socket
//!   with one) is answered here without a subrequest: `response.created` and
//!   `response.completed` with no output, its input kept as the socket's conversation
//!   ([`super::state::Conversation::prepare_only`]).
//! - **Cancellation.** `response.cancel` (Sluice's extension) cancels the response in
//!   flight at once (the upstream request is dropped; its ledger row is `client_abort`) and
//!   answers an `error` event with code `response_cancelled`; the socket stays usable. A
//!   client that closes the socket, or whose connection fails, cancels it the same way.
//! - **Heartbeats.** A ping every `server.heartbeat_interval_ms`; a peer from which nothing
//!   (no pong, no frame) arrived for a whole interval after a ping is closed (1011).
//!   Client pings are answered. Once the process shuts down, an idle socket is closed with
//!   1001 at the next heartbeat, and a busy one after its response (or when the shutdown
//!   grace period ends).
//! - **Bounds.** A message over `server.max_request_body_bytes` closes the socket with 1009;
//!   the kept conversation is bounded by the same figure ([`super::state`]); the subrequest's
//!   channels hold at most 4 tasks, and the socket writes each batch of frames before it
//!   reads more of the response (a slow client slows the upstream, as over HTTP).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pingora::protocols::http::HttpTask;
use pingora::proxy::Session;
use serde_json::{Map, Value};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Utf8Bytes;

use super::codec::{Codec, Failure, Incoming};
use super::frames;
use super::state::{ClientMessage, Conversation, Refusal};
use super::turn::Turn;
use crate::engine::attempt::ClientGone;
use crate::proxy::ctx::RequestCtx;

/// Most bytes one read of the socket takes (the size of the body buffer an open socket keeps).
pub const READ_SIZE: usize = 4096;

/// Sessions open now, process-wide (`server.responses_websocket_max_sessions` bounds it).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// One open session: counted in [`OPEN`] and `sluice_websocket_sessions` while alive.
#[derive(Debug)]
pub struct Open(());

impl Open {
    /// A session, if fewer than `max` are open.
    pub fn try_new(max: usize) -> Option<Self> {
        OPEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
        crate::metrics::metrics().websocket_sessions.inc();
        Some(Self(()))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::metrics().websocket_sessions.dec();
    }
}

/// Counts a client message by its `type` label.
fn count_client(kind: &str) {
    crate::metrics::metrics()
        .websocket_messages_total
        .with_label_values(&["client", kind])
        .inc();
}

/// A socket's mutable state between events.
struct Socket {
    codec: Codec,
    conversation: Conversation,
    turn: Option<Turn>,
    /// A `response.create` waiting for the previous subrequest to finish.
    pending: Option<Box<Map<String, Value>>>,
    /// Frames to send.
    out: Vec<Utf8Bytes>,
    /// Responses started on this socket (the subrequests' request id suffix).
    started: u64,
    /// Whether a ping is unanswered.
    awaiting_pong: bool,
}

/// Runs an upgraded socket until it closes; `_open` is its place among the open sessions.
///
/// # Errors
/// [`ClientGone`] when a write to the client fails (the response in flight, if any, is
/// cancelled).
pub async fn run(
    session: &mut Session,
    ctx: &mut RequestCtx,
    _open: Open,
) -> Result<(), ClientGone> {
    let server = &ctx.config.server;
    let max_event_bytes = server.max_event_bytes;
    let interval = server
        .default_timeouts
        .heartbeat
        .max(Duration::from_millis(1));
    // Liveness is the heartbeat's job: no per-read timeout on an idle socket.
    session.downstream_session.set_read_timeout(None);
    let mut s = Socket {
        codec: Codec::new(server.max_request_body_bytes),
        conversation: Conversation::new(server.max_request_body_bytes),
        turn: None,
        pending: None,
        out: Vec::new(),
        started: 0,
        awaiting_pong: false,
    };
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        for f in s.out.drain(..) {
            s.codec.send_text(f);
        }
        if let Some(bytes) = s.codec.take_output() {
            session
                .write_response_body(Some(bytes), false)
                .await
                .map_err(|_| ClientGone("writing"))?;
        }
        if !s.codec.open() {
            // Closed (by either side): the response in flight, if any, is cancelled as
            // `s` drops.
            return Ok(());
        }
        tokio::select! {
            read = session.read_request_body() => match read {
                Ok(Some(bytes)) => {
                    s.awaiting_pong = false;
                    s.codec.feed(&bytes);
                    s.messages(session, &ctx.request_id, max_event_bytes);
                }
                // The client left without a close frame.
                Ok(None) | Err(_) => return Ok(()),
            },
            task = recv(&mut s.turn) => {
                s.response_task(task, session, &ctx.request_id, max_event_bytes);
            }
            _ = ticker.tick() => {
                if s.awaiting_pong {
                    s.codec.close(CloseCode::Error, "no answer to the heartbeat ping");
                } else if session.is_process_shutting_down() && s.turn.is_none() {
                    s.codec.close(CloseCode::Away, "the server is shutting down");
                } else {
                    s.codec.ping(b"sluice");
                    s.awaiting_pong = true;
                }
            }
            () = crate::shutdown::streams_cancelled() => {
                s.codec.close(CloseCode::Away, "the server is shutting down");
            }
        }
    }
}

/// The next output of the response in flight (pends forever without one).
async fn recv(turn: &mut Option<Turn>) -> Option<HttpTask> {
    match turn {
        Some(t) => t.recv().await,
        None => std::future::pending().await,
    }
}

impl Socket {
    /// Handles every whole message fed so far.
    fn messages(&mut self, session: &Session, socket_id: &str, max_event_bytes: usize) {
        loop {
            match self.codec.next_message() {
                Ok(Some(Incoming::Text(t))) => {
                    self.message(&t, session, socket_id, max_event_bytes)
                }
                Ok(Some(Incoming::Binary)) => {
                    count_client("binary");
                    self.refuse(
                        &Refusal {
                            status: 400,
                            code: "unsupported_message",
                            message: "binary messages are not supported: send JSON text".into(),
                            param: None,
                        },
                        None,
                    );
                }
                Ok(Some(Incoming::Pong)) => {}
                Ok(Some(Incoming::Close)) => {
                    self.cancel();
                    return;
                }
                Ok(None) => return,
                Err(f) => {
                    if f == Failure::TooBig {
                        log::debug!(target: "sluice::proxy::websocket", "message over the size bound request_id={socket_id}");
                    }
                    self.cancel();
                    return;
                }
            }
        }
    }

    /// Handles one text message.
    fn message(&mut self, text: &str, session: &Session, socket_id: &str, max_event_bytes: usize) {
        let msg = match super::state::decode(text) {
            Ok(m) => m,
            Err(r) => {
                count_client("invalid");
                return self.refuse(&r, None);
            }
        };
        match msg {
            ClientMessage::Create(req) => {
                count_client("response.create");
                match &self.turn {
                    None => self.start(*req, session, socket_id, max_event_bytes),
                    Some(t) if t.answered && self.pending.is_none() => self.pending = Some(req),
                    Some(_) => {
                        let sid = stream_id(&req);
                        self.refuse(
                            &Refusal {
                                status: 400,
                                code: "conversation_already_has_active_response",
                                message: "a response is already in progress on this socket; wait for its final event or send response.cancel".into(),
                                param: None,
                            },
                            sid.as_deref(),
                        );
                    }
                }
            }
            ClientMessage::Cancel => {
                count_client("response.cancel");
                match self.turn.as_mut() {
                    Some(t) if !t.answered => {
                        let sid = t.stream_id.clone();
                        t.cancel();
                        self.out.push(frames::error_event(
                            499,
                            serde_json::json!({
                                "type": "cancelled",
                                "code": "response_cancelled",
                                "message": "the response was cancelled (response.cancel)",
                                "param": null,
                            }),
                            sid.as_deref(),
                        ));
                    }
                    _ => self.refuse(
                        &Refusal {
                            status: 400,
                            code: "no_active_response",
                            message: "there is no response in progress to cancel".into(),
                            param: None,
                        },
                        None,
                    ),
                }
            }
            ClientMessage::Unknown(kind) => {
                count_client("unknown");
                self.refuse(
                    &Refusal {
                        status: 400,
                        code: "unknown_message_type",
                        message: format!(
                            "unknown message type `{kind}`: this socket accepts `response.create` and `response.cancel`"
                        ),
                        param: Some("type"),
                    },
                    None,
                );
            }
        }
    }

    /// Queues the `error` event of a refusal.
    fn refuse(&mut self, r: &Refusal, stream_id: Option<&str>) {
        crate::metrics::metrics()
            .websocket_messages_total
            .with_label_values(&["server", "error"])
            .inc();
        self.out.push(frames::own_error(
            r.status, r.code, &r.message, r.param, stream_id,
        ));
    }

    /// Starts a response.
    fn start(
        &mut self,
        req: Map<String, Value>,
        session: &Session,
        socket_id: &str,
        max_event_bytes: usize,
    ) {
        let sid = stream_id(&req);
        if req.get("generate") == Some(&Value::Bool(false)) {
            return self.state_only(req, sid.as_deref());
        }
        let prepared = match self.conversation.prepare(req) {
            Ok(p) => p,
            Err(r) => return self.refuse(&r, sid.as_deref()),
        };
        self.started += 1;
        let request_id = format!("{socket_id}.{}", self.started);
        match Turn::start(session, prepared, request_id, max_event_bytes) {
            Ok(t) => self.turn = Some(t),
            Err(_) => self.refuse(
                &Refusal {
                    status: 500,
                    code: "internal_error",
                    message: "the gateway could not start the response".into(),
                    param: None,
                },
                sid.as_deref(),
            ),
        }
    }

    /// Answers a `generate: false` response on the socket ([`Conversation::prepare_only`]):
    /// `response.created` then `response.completed`, both with the state-only response.
    fn state_only(&mut self, req: Map<String, Value>, stream_id: Option<&str>) {
        let response = match self.conversation.prepare_only(req) {
            Ok(r) => r,
            Err(r) => return self.refuse(&r, stream_id),
        };
        for (seq, kind) in ["response.created", "response.completed"]
            .into_iter()
            .enumerate()
        {
            let mut ev = serde_json::json!({
                "type": kind,
                "sequence_number": seq,
                "response": response,
            });
            if let Some(s) = stream_id {
                ev["stream_id"] = s.into();
            }
            crate::metrics::metrics()
                .websocket_messages_total
                .with_label_values(&["server", kind])
                .inc();
            self.out.push(Utf8Bytes::from(ev.to_string()));
        }
    }

    /// Handles one output task of the response in flight.
    fn response_task(
        &mut self,
        task: Option<HttpTask>,
        session: &Session,
        socket_id: &str,
        max_event_bytes: usize,
    ) {
        let done = task.is_none();
        if let Some(t) = self.turn.as_mut() {
            t.handle(task, &mut self.out);
        }
        if !done {
            return;
        }
        // The subrequest finished (logged, its ledger row queued).
        if let Some(t) = self.turn.take() {
            if !t.cancelled() {
                if let Some(r) = &t.terminal {
                    self.conversation.answered(t.input.clone(), r);
                }
            }
        }
        if let Some(next) = self.pending.take() {
            self.start(*next, session, socket_id, max_event_bytes);
        }
    }

    /// Cancels the response in flight, if any.
    fn cancel(&mut self) {
        if let Some(t) = self.turn.as_mut() {
            t.cancel();
        }
        self.pending = None;
    }
}

/// A request's `stream_id` (its lane).
fn stream_id(req: &Map<String, Value>) -> Option<String> {
    req.get("stream_id")
        .and_then(Value::as_str)
        .map(str::to_string)
}
