//! Owns the Responses API's WebSocket mode on `GET /v1/responses` (`Upgrade: websocket`):
//! one socket, many responses, each a `response.create` message answered with the same
//! events as the HTTP stream, one JSON text frame each
//! (<https://platform.openai.com/docs/guides/websocket-mode>; the client side is the
//! `openai` SDK's `client.responses.connect()`).
//!
//! - [`handshake`]: the RFC 6455 opening handshake (`Sec-WebSocket-Key` →
//!   `Sec-WebSocket-Accept`, version 13);
//! - [`codec`]: the framing (tungstenite over an in-memory pipe; Pingora keeps the socket,
//!   whose body reads and writes are raw bytes once the `101` is written);
//! - [`state`]: what the socket remembers (the last response's conversation) and how a
//!   message becomes a request body;
//! - [`turn`]: one response, run as an in-process `POST /v1/responses` subrequest, so that
//!   limits, budgets, routing, metering and the ledger are the HTTP path's;
//! - [`frames`]: the JSON Sluice writes itself (`error` events);
//! - [`socket`]: the loop that ties them together (heartbeats, cancellation, close).
//!
//! Before the upgrade the virtual key is checked as for HTTP (401 in OpenAI's shape) and a
//! malformed handshake is a 400; with `server.responses_websocket: false` (or over HTTP/2,
//! which has no `Upgrade`) the answer is 426, which sends OpenAI's clients to plain HTTP.
//! Past `server.responses_websocket_max_sessions` sessions open at once an upgrade gets 503
//! (`websocket_sessions`, with `Retry-After`); each session's memory is bounded
//! ([`socket`]), so this bounds the mode's.

pub mod codec;
pub mod frames;
pub mod handshake;
pub mod socket;
pub mod state;
pub mod turn;

use pingora::proxy::Session;

use crate::engine::attempt::ClientGone;
use crate::error::GatewayError;
use crate::ingress::access::authenticate;
use crate::ingress::respond::ChatError;
use crate::protocol::ClientDialect;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;

pub use handshake::wants_websocket;
pub use turn::rewrite_head;

/// Serves a WebSocket upgrade of `/v1/responses` to its end (the socket's close).
///
/// # Errors
/// A [`ChatError`] written as an HTTP answer before the upgrade (426 when the mode is off
/// or the connection is HTTP/2; 400 for a malformed handshake; 401 for the key; 503 with
/// `Retry-After` past `server.responses_websocket_max_sessions`), or
/// [`ClientGone`] when the client left before the `101` was written.
pub(crate) async fn serve(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> Result<(), ChatError> {
    ctx.dialect = ClientDialect::Responses;
    if !ctx.config.server.responses_websocket {
        return Err(GatewayError::UpgradeRequired(
            "the Responses API's WebSocket mode is off here (server.responses_websocket: false); use HTTP: POST /v1/responses".into(),
        )
        .into());
    }
    if session.downstream_session.is_http2() || session.subrequest_spawner.is_none() {
        return Err(GatewayError::UpgradeRequired(
            "the Responses API's WebSocket mode needs an HTTP/1.1 connection; use HTTP: POST /v1/responses".into(),
        )
        .into());
    }
    let key = handshake::check(session.req_header())?;
    authenticate(gw, session, ctx)?;
    let max = ctx.config.server.responses_websocket_max_sessions;
    let Some(open) = socket::Open::try_new(max) else {
        crate::metrics::metrics()
            .rejected_total
            .with_label_values(&["websocket_sessions"])
            .inc();
        return Err(GatewayError::Overloaded {
            message: format!(
                "this gateway holds its most WebSocket sessions ({max}, server.responses_websocket_max_sessions); retry later or use HTTP: POST /v1/responses"
            ),
            reason: "websocket_sessions",
            retry_after: std::time::Duration::from_secs(1),
        }
        .into());
    };
    // An upgraded socket reads into its body buffer for as long as it is open: a small one
    // (messages larger than a read arrive in several reads), set before the `101` makes it.
    session
        .downstream_session
        .set_body_read_size(Some(socket::READ_SIZE));
    let head = handshake::accept_head(&key, &ctx.request_id)
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    session
        .write_response_header(Box::new(head), false)
        .await
        .map_err(|_| ChatError::Gone(ClientGone("writing")))?;
    socket::run(session, ctx, open)
        .await
        .map_err(ChatError::Gone)
}
