//! Mock model provider ("mock upstream") for Sluice's tests and its built-in demo provider.
//!
//! This crate owns a small raw HTTP/1.1 server on tokio that speaks the provider wire
//! formats byte for byte:
//!
//! - `POST {prefix}/chat/completions` — OpenAI Chat Completions, non-stream
//!   (<https://platform.openai.com/docs/api-reference/chat/object>) and SSE stream
//!   (<https://platform.openai.com/docs/api-reference/chat/streaming>);
//! - `POST {prefix}/messages` — Anthropic Messages, non-stream
//!   (<https://docs.anthropic.com/en/api/messages>) and SSE stream
//!   (<https://docs.anthropic.com/en/api/messages-streaming>);
//! - `POST {prefix}/messages/count_tokens` — Anthropic's token count
//!   (<https://docs.anthropic.com/en/api/messages-count-tokens>): `{"input_tokens": N}` with
//!   N the `prompt_tokens` knob, else the words of `system` and every message (min 1); a
//!   body with a member Anthropic does not take there (`max_tokens`, `stream`, …) gets its
//!   400 `invalid_request_error`;
//! - `POST {prefix}/responses` (and Azure OpenAI's `POST /openai/v1/responses`, `api-key`
//!   checked) — OpenAI Responses, non-stream and SSE stream, reasoning items with
//!   `encrypted_content`, function calls, usage with cached and reasoning tokens, a failure
//!   mid-stream as `response.failed` ([`responses`]);
//! - `GET {prefix}/models` — an OpenAI-style model list (health probes);
//! - `POST /openai/deployments/{deployment}/chat/completions?api-version=...` — Azure
//!   OpenAI: OpenAI's format with Azure's content-filter annotations; a request without
//!   `api-version` gets Azure's 404, one without `api-key` (or with another key than the
//!   `api_key` knob) its 401, and the `content_filter` knob its `content_filter` 400;
//! - `POST {prefix}/models/{model}:generateContent` and
//!   `:streamGenerateContent?alt=sse` — the Gemini API
//!   (<https://ai.google.dev/api/generate-content>); without `x-goog-api-key` Google's 403,
//!   with another key than the `api_key` knob its 400 `API_KEY_INVALID`;
//! - `POST .../projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict` and
//!   `:streamRawPredict` (Claude on Vertex AI: Messages bodies with `anthropic_version:
//!   vertex-2023-10-16` and no `model`), `.../publishers/google/models/{m}:generateContent`
//!   and `:streamGenerateContent?alt=sse` (Gemini on Vertex AI), each only with a bearer
//!   token the mock issued and that has not expired (else Google's 401 `UNAUTHENTICATED`);
//! - `POST .../token` — Google's OAuth2 token endpoint for service-account assertions: the
//!   RS256 JWT verified against the `token_public_key` knob, tokens of `token_lifetime_s`
//!   (see [`google`] for what it checks). Token requests are logged like any request;
//! - `POST /model/{id}/invoke`, `/invoke-with-response-stream` (Claude on Bedrock: Messages
//!   bodies with `anthropic_version: bedrock-2023-05-31`), `/converse` and
//!   `/converse-stream` (every other Bedrock model, `converse.rs`), streams in AWS's binary
//!   event-stream framing, every request's SigV4 signature verified ([`sigv4`]; Bedrock's
//!   403s), Bedrock's errors and in-stream exceptions (`bedrock.rs`).
//!
//! Answers carry text, and on request reasoning (OpenAI-compatible `reasoning_content`,
//! Anthropic thinking blocks with signatures), tool calls (one or parallel: OpenAI
//! `tool_calls` deltas, Anthropic `tool_use` blocks with `input_json_delta` fragments),
//! cached prompt tokens and a dated model id. With the `tool_loop` knob the mock plays a
//! model that calls one tool the request offers and then answers its result, so that real
//! agents run a whole tool loop against it.
//!
//! Its behaviour (latency, failures, stalls, abrupt closes, SSE framing quirks, write
//! splitting, slow-reader back-pressure) is scripted with [`Behavior`] knobs, per request
//! (body field `"mock"`), per process (`POST /_mock/behavior`) or at startup. Every
//! provider request is recorded in a [`RequestRecord`] log (`GET /_mock/log`), including
//! when the peer closed the connection early; the socket is watched for EOF/RST while the
//! response is delayed, stalled or streamed.
//!
//! Control endpoints (never logged): `GET /_mock/log`, `POST /_mock/reset`,
//! `GET /_mock/healthz`, `GET|POST /_mock/behavior`.
//!
//! Peer-close detection treats EOF on the read side as "the peer is gone", so a client
//! that half-closes (shuts down its write side) after sending a request gets its response
//! aborted. Malformed requests (400/413/431 answered by the HTTP layer) are not logged.
//!
//! The crate is self-contained (it does not depend on the gateway), so the gateway embeds
//! it (demo provider, see [`MockState::demo`]) and so does the `sluice-mock-upstream` binary
//! (a bin of the `sluice` package). Sluice's own tests check its signers against the
//! independent verifiers here ([`sigv4`], the token endpoint).
//!
//! Demo mode ([`MockState::demo`], what the gateway's built-in demo provider runs) is not
//! scriptable and keeps nothing: no request log, no control endpoints (`/_mock/*` is a 404
//! like any unknown path), no per-request steering (the body field `mock` and the
//! `x-mock-behavior` header are ignored), and it is reached in process through
//! [`serve_stream`], never through a listening socket.

mod bedrock;
mod behavior;
mod cloud;
mod converse;
mod google;
mod h1;
mod record;
mod respond;
mod responses;
pub mod sigv4;
mod tool_loop;
mod wire;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use self::behavior::{Behavior, Drift, DriftEvent, MockToolCall, Split};
pub use self::record::{Phase, RequestRecord, BODY_COPY_LIMIT, SELECTED_HEADERS};
pub use self::tool_loop::{DONE_MARKER, TOOL_MARKER};

use self::h1::{read_request, simple_response, Rd, ReadError, Wr};
use self::record::{lock, mark_peer_closed, RecordHandle};
use self::respond::After;

/// Most prompt prefixes one mock process remembers for the `prompt_cache` knob.
pub const PROMPT_CACHE_ENTRIES: usize = 4096;

/// Stop watching the socket for EOF when this many pipelined bytes are buffered (bytes).
const MAX_PIPELINE_BUFFER: usize = 8 * 1024 * 1024;

/// Shared state of one mock upstream process: default behaviour, request log and
/// `fail_first` counters. Times in records are ms since this state was created.
#[derive(Debug)]
pub struct MockState {
    start: Instant,
    default: Mutex<Behavior>,
    log: Mutex<Vec<RecordHandle>>,
    seq: AtomicU64,
    ids: AtomicU64,
    conns: AtomicU64,
    fail_counters: Mutex<HashMap<String, u64>>,
    /// Access tokens issued by the OAuth2 token endpoint, with their expiry.
    google: Mutex<google::Issued>,
    /// Prompt prefixes answered so far (`prompt_cache` knob): hashes, at most
    /// [`PROMPT_CACHE_ENTRIES`].
    prompt_cache: Mutex<std::collections::HashSet<u64>>,
    /// Demo mode: fixed behaviour, no log, no control endpoints, no steering.
    demo: bool,
}

impl MockState {
    /// New state whose process-wide default behaviour is `default_behavior`.
    /// Wrap it in an `Arc` to pass it to [`serve`] / [`MockServer::start`].
    pub fn new(default_behavior: Behavior) -> Self {
        MockState {
            start: Instant::now(),
            default: Mutex::new(default_behavior),
            log: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            ids: AtomicU64::new(0),
            conns: AtomicU64::new(0),
            fail_counters: Mutex::new(HashMap::new()),
            google: Mutex::new(google::Issued::default()),
            prompt_cache: Mutex::new(std::collections::HashSet::new()),
            demo: false,
        }
    }

    /// State for the gateway's built-in demo provider ([`Behavior::demo`]: deterministic
    /// "Hello from Sluice's built-in demo provider. You said: …" replies, 20 ms per token).
    ///
    /// Demo mode retains nothing per request (the [`MockState::log`] stays empty), answers
    /// no control endpoint and ignores every per-request behaviour a client could send.
    pub fn demo() -> Self {
        Self {
            demo: true,
            ..Self::new(Behavior::demo())
        }
    }

    /// Whether this state is in demo mode (see [`MockState::demo`]).
    pub fn is_demo(&self) -> bool {
        self.demo
    }

    /// Milliseconds since this state was created (the clock of all record times).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Current process-wide default behaviour.
    pub fn default_behavior(&self) -> Behavior {
        lock(&self.default).clone()
    }

    /// Replace the process-wide default behaviour (what `POST /_mock/behavior` does).
    pub fn set_default_behavior(&self, behavior: Behavior) {
        *lock(&self.default) = behavior;
    }

    /// Snapshot of the request log, oldest first.
    pub fn log(&self) -> Vec<RequestRecord> {
        lock(&self.log).iter().map(|r| lock(r).clone()).collect()
    }

    /// Clear the request log, restart sequence numbers and clear `fail_first` counters.
    pub fn reset(&self) {
        let mut log = lock(&self.log);
        log.clear();
        self.seq.store(0, Ordering::SeqCst);
        lock(&self.fail_counters).clear();
        lock(&self.prompt_cache).clear();
    }

    /// Whether the prompt prefix `hash` was answered before (then `true`); remembers it.
    fn prompt_cache_hit(&self, hash: u64) -> bool {
        let mut seen = lock(&self.prompt_cache);
        if seen.contains(&hash) {
            return true;
        }
        if seen.len() >= PROMPT_CACHE_ENTRIES {
            seen.clear();
        }
        seen.insert(hash);
        false
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The live record of a new request; appended to the log except in demo mode, whose
    /// records live only as long as their response.
    fn push_record(&self, mut rec: RequestRecord) -> RecordHandle {
        rec.seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let h = Arc::new(Mutex::new(rec));
        if !self.demo {
            lock(&self.log).push(h.clone());
        }
        h
    }

    fn log_json(&self) -> String {
        #[derive(serde::Serialize)]
        struct LogBody {
            requests: Vec<RequestRecord>,
        }
        serde_json::to_string(&LogBody {
            requests: self.log(),
        })
        .unwrap_or_else(|_| "{\"requests\":[]}".to_string())
    }
}

/// Accept loop: serves every connection of `listener` in its own task, forever.
/// Accept errors are logged and retried after 10 ms.
pub async fn serve(listener: TcpListener, state: Arc<MockState>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let st = state.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle_connection(stream, st).await {
                        log::debug!("mock upstream: connection from {peer}: {e}");
                    }
                });
            }
            Err(e) => {
                log::warn!("mock upstream: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// A running embedded mock upstream (see [`MockServer::start`]); the accept loop is
/// aborted when this is dropped.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    state: Arc<MockState>,
    task: JoinHandle<()>,
}

impl MockServer {
    /// Bind `addr` (e.g. `"127.0.0.1:0"`) and serve with `state` in a background task.
    pub async fn start(addr: &str, state: Arc<MockState>) -> io::Result<MockServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, state.clone()));
        Ok(MockServer { addr, state, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL `http://ADDR` (append e.g. `/v1/chat/completions`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The shared state (log, default behaviour).
    pub fn state(&self) -> &Arc<MockState> {
        &self.state
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn control(state: &MockState, req: &h1::Request, wr: &mut Wr, close: bool) -> io::Result<()> {
    let path = req.path();
    let (status, body): (u16, String) = match (req.method.as_str(), path) {
        ("GET", "/_mock/healthz") => (200, "{\"ok\":true}".into()),
        ("GET", "/_mock/log") => (200, state.log_json()),
        ("POST", "/_mock/reset") => {
            state.reset();
            (200, "{\"ok\":true}".into())
        }
        ("GET", "/_mock/behavior") => (
            200,
            serde_json::to_string(&state.default_behavior()).unwrap_or_default(),
        ),
        ("POST", "/_mock/behavior") => {
            let text = String::from_utf8_lossy(&req.body);
            let parsed = if text.trim().is_empty() {
                Ok(Behavior::default())
            } else {
                Behavior::from_json(&text)
            };
            match parsed {
                Ok(b) => {
                    state.set_default_behavior(b);
                    (200, "{\"ok\":true}".into())
                }
                Err(e) => (
                    400,
                    serde_json::json!({"ok": false, "error": e.to_string()}).to_string(),
                ),
            }
        }
        _ => (
            404,
            serde_json::json!({"ok": false, "error": format!("no control endpoint {} {}", req.method, path)})
                .to_string(),
        ),
    };
    simple_response(wr, status, "application/json", body.as_bytes(), close).await
}

/// Close a connection, abruptly with RST when `reset`.
fn abort_connection(rd: OwnedReadHalf, wr: OwnedWriteHalf, reset: bool) {
    match rd.reunite(wr) {
        Ok(stream) => {
            if reset {
                if let Err(e) = stream.set_zero_linger() {
                    log::debug!("mock upstream: set_zero_linger: {e}");
                }
            }
            drop(stream);
        }
        Err(e) => log::debug!("mock upstream: reunite: {e}"),
    }
}

async fn handle_connection(stream: TcpStream, state: Arc<MockState>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    if let Some(reset) = serve_connection(&mut rd, &mut wr, &state).await? {
        abort_connection(rd, wr, reset);
    }
    Ok(())
}

/// Serves one in-process connection (any byte stream, e.g. one end of a
/// [`tokio::io::duplex`]) until the peer closes it or the behaviour ends it. This is how the
/// gateway reaches its demo provider without a listening socket. An abrupt close (the
/// `drop_after_tokens` family of knobs) simply drops the stream: there is no RST to send.
///
/// # Errors
/// I/O errors of the stream.
pub async fn serve_stream<S>(stream: S, state: Arc<MockState>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    serve_connection(&mut rd, &mut wr, &state).await.map(drop)
}

/// The request loop of one connection. `Ok(Some(reset))` asks the caller to close the
/// connection abruptly (with a TCP RST when `reset`); `Ok(None)` means it is done.
async fn serve_connection(
    rd: &mut Rd,
    wr: &mut Wr,
    state: &Arc<MockState>,
) -> io::Result<Option<bool>> {
    let conn_id = state.conns.fetch_add(1, Ordering::SeqCst) + 1;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut conn_seq = 0u64;
    loop {
        let req = match read_request(rd, wr, &mut buf).await {
            Ok(r) => r,
            Err(ReadError::Closed) => return Ok(None),
            Err(ReadError::Io(e)) => return Err(e),
            Err(ReadError::Bad(msg)) => {
                let body = wire::openai_error(400, &msg);
                simple_response(wr, 400, "application/json", body.as_bytes(), true).await?;
                return Ok(None);
            }
            Err(ReadError::TooLarge(status)) => {
                let body = wire::openai_error(status, "request too large");
                simple_response(wr, status, "application/json", body.as_bytes(), true).await?;
                return Ok(None);
            }
        };
        if !state.demo && req.path().starts_with("/_mock/") {
            let close = !req.keep_alive;
            control(state, &req, wr, close).await?;
            if close {
                let _ = wr.shutdown().await;
                return Ok(None);
            }
            continue;
        }
        conn_seq += 1;
        if !state.demo && google::is_token_request(&req) {
            let behavior = state.default_behavior();
            let (status, body) = google::token_exchange(&mut lock(&state.google), &req, &behavior);
            let mut rec = respond::make_record(&req, &None);
            rec.conn_id = conn_id;
            rec.conn_seq = conn_seq;
            rec.received_at_ms = state.now_ms();
            rec.status = Some(status);
            rec.completed = true;
            state.push_record(rec);
            let close = !req.keep_alive;
            simple_response(
                wr,
                status,
                "application/json; charset=utf-8",
                body.as_bytes(),
                close,
            )
            .await?;
            if close {
                let _ = wr.shutdown().await;
                return Ok(None);
            }
            continue;
        }
        let (rec, plan) = respond::prepare(state, &req, conn_id, conn_seq);
        let close = !req.keep_alive || Behavior::flag(plan.behavior.close);
        // The request (and its body) is not needed while the response is written.
        drop(req);
        let after = {
            let fut = respond::respond(state, &plan, &rec, wr, close);
            tokio::pin!(fut);
            let mut watch = true;
            loop {
                tokio::select! {
                    a = &mut fut => break a,
                    r = tokio::io::AsyncReadExt::read_buf(rd, &mut buf), if watch => {
                        match r {
                            Ok(0) | Err(_) => {
                                mark_peer_closed(&rec, state.now_ms());
                                break After::PeerGone;
                            }
                            Ok(_) => {
                                if buf.len() > MAX_PIPELINE_BUFFER {
                                    watch = false;
                                }
                            }
                        }
                    }
                }
            }
        };
        match after {
            After::Keep if !close => continue,
            After::Keep | After::Close => {
                let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
                return Ok(None);
            }
            After::Abort { reset } => return Ok(Some(reset)),
            After::PeerGone => return Ok(None),
        }
    }
}

/// One request as the mock's HTTP/1.1 reader decoded it (see [`decode_request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRequest {
    /// Method, e.g. `POST`.
    pub method: String,
    /// Request target as sent (path and query).
    pub target: String,
    /// Headers in order, names lowercase, values lossy UTF-8.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked if it was sent chunked.
    pub body: Vec<u8>,
    /// Whether the connection stays open after this request.
    pub keep_alive: bool,
}

/// Why [`decode_request`] read no request: `(status, message)`, the status the mock
/// answers with (400 malformed, 413/431 too large), or 0 for a clean close / I/O error.
pub type DecodeError = (u16, String);

/// Reads one request from `rd` exactly as the mock's server does on a connection: the
/// head with `httparse`, then a Content-Length or chunked body (the only chunked-body
/// decoder Sluice owns; the gateway's own downstream and upstream decoding is Pingora's).
/// A `100 Continue` interim answer is discarded. Exposed for the fuzz harness
/// (`tests/fuzz.rs`), which feeds it arbitrary bytes in arbitrary splits.
///
/// # Errors
/// A [`DecodeError`] for a malformed, oversized or truncated request.
pub async fn decode_request<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    rd: &mut R,
) -> Result<DecodedRequest, DecodeError> {
    let mut buf = BytesMut::new();
    let mut sink = tokio::io::sink();
    match read_request(rd, &mut sink, &mut buf).await {
        Ok(r) => Ok(DecodedRequest {
            method: r.method,
            target: r.target,
            headers: r.headers,
            body: r.body,
            keep_alive: r.keep_alive,
        }),
        Err(ReadError::Closed) => Err((0, "closed".into())),
        Err(ReadError::Io(e)) => Err((0, e.to_string())),
        Err(ReadError::Bad(m)) => Err((400, m)),
        Err(ReadError::TooLarge(s)) => Err((s, "too large".into())),
    }
}
