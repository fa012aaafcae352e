//! Owns what every endpoint does before it reads a request: the virtual key
//! (`authenticate`) and the request body within its bounds (`read_body`: size, global
//! buffer bytes, time). The endpoints ([`super::endpoints`], [`super::count_tokens`],
//! [`super::compact`], [`super::stored_responses`]) call these; this module calls none of
//! them.

use pingora::proxy::Session;

use crate::auth::{presented_key, Caller};
use crate::backpressure::Admission;
use crate::engine::attempt::ClientGone;
use crate::error::GatewayError;
use crate::ingress::request::{self, BodyError, BodyLimits};
use crate::ingress::respond::ChatError;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;

/// Authenticates the presented virtual key (and attaches the tenant's rate-limit status for the
/// `x-ratelimit-*` headers).
pub(crate) fn authenticate(
    gw: &Gateway,
    session: &Session,
    ctx: &mut RequestCtx,
) -> Result<Caller, GatewayError> {
    let h = &session.req_header().headers;
    let key = presented_key(
        h.get("authorization").map(|v| v.as_bytes()),
        h.get("x-api-key").map(|v| v.as_bytes()),
    )
    .ok_or_else(|| {
        // Each dialect's SDK sends the key its own way: say that way.
        GatewayError::InvalidVirtualKey(
            match ctx.dialect {
                crate::protocol::ClientDialect::Messages => {
                    "missing API key: send `x-api-key: <virtual key>`"
                }
                _ => "missing API key: send `Authorization: Bearer <virtual key>`",
            }
            .into(),
        )
    })?;
    let caller = ctx
        .config
        .keys
        .authenticate(&key)
        .cloned()
        .ok_or_else(|| GatewayError::InvalidVirtualKey("invalid API key".into()))?;
    ctx.admission.rate_limit = gw.admission.status(&ctx.config, &caller.tenant, None);
    ctx.caller = Some(caller.clone());
    Ok(caller)
}

/// Counts a request whose body never fully arrived (`sluice_request_read_aborts_total`).
fn body_aborted(ctx: &RequestCtx, reason: &'static str) {
    crate::metrics::metrics()
        .request_read_aborts_total
        .with_label_values(&["body", reason])
        .inc();
    log::debug!(target: "sluice::proxy::request",
        "request body not received request_id={} reason={reason}",
        ctx.request_id
    );
}

/// Reads the request body within the configured bounds (size, global buffer bytes, time),
/// answering 413, 503, 408 or 400 (malformed framing) in the client's dialect.
pub(crate) async fn read_body(
    gw: &Gateway,
    session: &mut Session,
    ctx: &RequestCtx,
    config: &crate::config::Config,
) -> Result<request::HeldBody, ChatError> {
    match request::read_body(session, BodyLimits::of(config), gw.admission.buffers()).await {
        Ok(b) => Ok(b),
        Err(BodyError::TooLarge(limit_bytes)) => {
            Err(GatewayError::PayloadTooLarge { limit_bytes }.into())
        }
        Err(BodyError::BuffersFull(full)) => Err(Admission::buffers_full(full).into()),
        Err(BodyError::TimedOut(after)) => {
            body_aborted(ctx, "timeout");
            Err(GatewayError::RequestTimeout(format!(
                "the request body did not arrive within {} ms",
                after.as_millis()
            ))
            .into())
        }
        Err(BodyError::Downstream(_)) => {
            body_aborted(ctx, "closed");
            Err(ChatError::Gone(ClientGone("reading_body")))
        }
        Err(BodyError::Malformed(detail)) => {
            // The framing is lost: the connection cannot carry another request.
            session.set_keepalive(None);
            Err(
                GatewayError::invalid(format!("the request body is malformed: {detail}"), None)
                    .into(),
            )
        }
    }
}
