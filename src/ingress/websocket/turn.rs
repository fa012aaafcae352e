//! Owns one response of a Responses WebSocket: a `response.create` run as an in-process
//! `POST /v1/responses` through Pingora's own subrequest machinery
//! (`pingora_proxy::SubrequestSpawner::create_subrequest`, a
//! `pingora_core::protocols::http::subrequest` session whose reads and writes are channels
//! of `HttpTask`s), so that it passes every phase an HTTP request passes: edge limits,
//! authentication by the same virtual key, body bounds, admission (rate, concurrency,
//! queue), budget, routing, fallback, translation to every provider kind, metering, the
//! access log and one ledger row.
//!
//! The subrequest inherits the upgrade request's head; [`rewrite_head`] (called from
//! `early_request_filter`, which knows it by its [`TurnCtx`]) makes it `POST /v1/responses`
//! with the body's `Content-Length`, no upgrade or content-coding headers, and
//! `x-sluice-resumable: false` (a socket's response is never a resumable stream). Its output is
//! read here: a 2xx `text/event-stream` answer becomes one text frame per SSE event (the
//! event's `data`, heartbeat comments dropped); any other answer becomes one `error` event
//! ([`super::frames::http_error`]).
//!
//! Cancelling is dropping the input channel's sender: the subrequest's disconnect watch
//! (`crate::engine::upstream::client_gone`, its `read_body_or_idle`) then resolves, as for
//! an HTTP client that hung up, and the upstream request is cancelled at once and recorded
//! as `client_abort`.

use bytes::Bytes;
use pingora::protocols::http::HttpTask;
use pingora::proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora::proxy::Session;
use serde_json::Value;
use tokio::sync::mpsc;
use tungstenite::Utf8Bytes;

use super::frames;
use super::state::Prepared;
use crate::proxy::ctx::RequestCtx;
use crate::sse::SseNormalizer;

/// Most bytes of a refused answer's body kept for its `error` event.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What a subrequest knows of its socket (the subrequest context's user context).
#[derive(Debug)]
pub struct TurnCtx {
    /// The request id of this response (`<socket request id>.<n>`).
    pub request_id: String,
    /// The body's length, bytes.
    pub body_len: usize,
}

/// Headers of the upgrade request that a `POST` must not carry.
const DROPPED: [&str; 10] = [
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "accept-encoding",
    "content-encoding",
    "transfer-encoding",
    "last-event-id",
];

/// Makes a WebSocket turn's subrequest `POST /v1/responses` (see the module doc) and gives
/// it its request id; nothing for any other request. Returns whether it was one.
///
/// # Errors
/// Only if a header cannot be set (never with the values used here).
pub fn rewrite_head(session: &mut Session, ctx: &mut RequestCtx) -> pingora::Result<bool> {
    let Some(turn) = session
        .subrequest_ctx
        .as_ref()
        .and_then(|c| c.user_ctx())
        .and_then(|u| u.downcast_ref::<TurnCtx>())
    else {
        return Ok(false);
    };
    ctx.request_id.clone_from(&turn.request_id);
    let len = turn.body_len;
    let req = session.req_header_mut();
    req.set_method(http::Method::POST);
    req.set_uri(http::Uri::from_static("/v1/responses"));
    for h in DROPPED {
        req.remove_header(h);
    }
    req.insert_header("content-type", "application/json")?;
    req.insert_header("content-length", len.to_string())?;
    req.insert_header("accept", "text/event-stream")?;
    // Never a resumable stream (issue 32's `x-sluice-resumable` opts a request out where its
    // model opted in): a socket's response ends with the socket, or on `response.cancel`.
    req.insert_header("x-sluice-resumable", "false")?;
    Ok(true)
}

/// Why a turn could not start.
#[derive(Debug)]
pub struct NotStarted;

/// The state of a turn's answer.
#[derive(Debug)]
enum Answer {
    /// No head yet.
    Waiting,
    /// A 2xx event stream: events become frames.
    Events(Box<SseNormalizer>),
    /// Any other answer: its body, for the `error` event.
    Refused {
        status: u16,
        retry_after: Option<String>,
        body: Vec<u8>,
    },
}

/// One response in flight on a socket.
#[derive(Debug)]
pub struct Turn {
    /// The subrequest's input; dropped to cancel it.
    tx: Option<mpsc::Sender<HttpTask>>,
    /// The subrequest's output.
    rx: mpsc::Receiver<HttpTask>,
    answer: Answer,
    /// The lane echoed on each event.
    pub stream_id: Option<String>,
    /// The whole input sent, when the socket knows it ([`Prepared::input`]).
    pub input: Option<String>,
    /// The `response` of a `response.completed` / `response.incomplete` that was sent.
    pub terminal: Option<Value>,
    /// Whether the client has its answer (the stream or error ended, or it was
    /// cancelled): the next `response.create` may wait for the subrequest to wind down.
    pub answered: bool,
    /// Largest SSE event accepted (`server.max_event_bytes`).
    max_event_bytes: usize,
}

impl Turn {
    /// Starts `prepared` as a subrequest of the upgraded `session`, as request `request_id`.
    ///
    /// # Errors
    /// [`NotStarted`] when the session cannot spawn subrequests (never for a session
    /// [`super::serve`] accepted).
    pub fn start(
        session: &Session,
        prepared: Prepared,
        request_id: String,
        max_event_bytes: usize,
    ) -> Result<Self, NotStarted> {
        let spawner = session.subrequest_spawner.as_ref().ok_or(NotStarted)?;
        let sub_ctx = SubrequestCtx::builder()
            .body_mode(BodyMode::ExpectBody)
            .user_ctx(Box::new(TurnCtx {
                request_id,
                body_len: prepared.body.len(),
            }))
            .build();
        let (sub, handle) = spawner.create_subrequest(&session.downstream_session, sub_ctx);
        // The channel holds 4 tasks and is new: the whole body fits at once.
        handle
            .tx
            .try_send(HttpTask::Body(Some(prepared.body), true))
            .map_err(|_| NotStarted)?;
        tokio::spawn(sub.run());
        Ok(Self {
            tx: Some(handle.tx),
            rx: handle.rx,
            answer: Answer::Waiting,
            stream_id: prepared.stream_id,
            input: prepared.input,
            terminal: None,
            answered: false,
            max_event_bytes,
        })
    }

    /// The subrequest's next output; `None` once it has finished (cancel-safe).
    pub async fn recv(&mut self) -> Option<HttpTask> {
        self.rx.recv().await
    }

    /// Cancels the response: the subrequest sees its client leave.
    pub fn cancel(&mut self) {
        self.tx = None;
        self.answered = true;
    }

    /// Whether it was cancelled.
    pub fn cancelled(&self) -> bool {
        self.tx.is_none()
    }

    /// Handles one output task of the subrequest (`None`: it finished), appending the
    /// frames it makes to `out`.
    pub fn handle(&mut self, task: Option<HttpTask>, out: &mut Vec<Utf8Bytes>) {
        if self.cancelled() {
            return;
        }
        let end = match task {
            Some(HttpTask::Header(head, end)) => {
                let status = head.status.as_u16();
                let sse = head
                    .headers
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                self.answer = if (200..300).contains(&status) && sse {
                    Answer::Events(Box::new(SseNormalizer::new(self.max_event_bytes)))
                } else {
                    Answer::Refused {
                        status,
                        retry_after: head
                            .headers
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string),
                        body: Vec::new(),
                    }
                };
                end
            }
            Some(HttpTask::Body(Some(b), end) | HttpTask::UpgradedBody(Some(b), end)) => {
                self.body(&b, out);
                end
            }
            Some(
                HttpTask::Body(None, _)
                | HttpTask::UpgradedBody(None, _)
                | HttpTask::Trailer(_)
                | HttpTask::Done
                | HttpTask::Failed(_),
            )
            | None => true,
        };
        if end && !self.answered {
            self.finish(out);
        }
    }

    fn body(&mut self, b: &Bytes, out: &mut Vec<Utf8Bytes>) {
        match &mut self.answer {
            Answer::Events(sse) => {
                if sse.push(b).is_err() {
                    // Sluice's own stream: events are within the bound it enforces.
                    return;
                }
                self.drain_events(out);
            }
            Answer::Refused { body, .. } => {
                let room = MAX_ERROR_BODY.saturating_sub(body.len());
                body.extend_from_slice(&b[..b.len().min(room)]);
            }
            Answer::Waiting => {}
        }
    }

    /// Turns the complete events buffered so far into frames.
    fn drain_events(&mut self, out: &mut Vec<Utf8Bytes>) {
        let Answer::Events(sse) = &mut self.answer else {
            return;
        };
        while let Some(ev) = sse.next_event() {
            if ev.is_done() {
                continue;
            }
            let name = ev.event_name();
            let Some(data) = ev.data() else { continue };
            // The SSE event name is the event's `type` (Sluice writes both).
            let kind = name.or_else(|| frames::event_type(&data)).unwrap_or("");
            crate::metrics::metrics()
                .websocket_messages_total
                .with_label_values(&["server", frames::server_label(kind)])
                .inc();
            if matches!(kind, "response.completed" | "response.incomplete") {
                self.terminal = serde_json::from_slice::<Value>(&data)
                    .ok()
                    .and_then(|mut v| v.get_mut("response").map(Value::take));
            }
            // The client has its final event (the end of the body may come in a later task):
            // its next `response.create` may come at once, and waits for this one's end.
            if matches!(
                kind,
                "response.completed" | "response.incomplete" | "response.failed"
            ) {
                self.answered = true;
            }
            let bytes = match &self.stream_id {
                Some(id) => frames::with_stream_id(&data, id),
                None => data.into_owned(),
            };
            let text = match String::from_utf8(bytes) {
                Ok(s) => Utf8Bytes::from(s),
                Err(e) => Utf8Bytes::from(String::from_utf8_lossy(e.as_bytes()).into_owned()),
            };
            out.push(text);
        }
    }

    /// The answer ended: flushes the last events, or makes the `error` event of a refusal.
    fn finish(&mut self, out: &mut Vec<Utf8Bytes>) {
        self.answered = true;
        let sid = self.stream_id.as_deref();
        match &mut self.answer {
            Answer::Events(sse) => {
                let _ = sse.finish();
                self.drain_events(out);
            }
            Answer::Refused {
                status,
                retry_after,
                body,
            } => {
                out.push(frames::http_error(
                    *status,
                    body,
                    retry_after.as_deref(),
                    sid,
                ));
                crate::metrics::metrics()
                    .websocket_messages_total
                    .with_label_values(&["server", "error"])
                    .inc();
            }
            Answer::Waiting => {
                out.push(frames::own_error(
                    500,
                    "internal_error",
                    "the gateway ended the response before answering",
                    None,
                    sid,
                ));
            }
        }
    }
}
