//! Owns `POST /v1/responses/compact`, the Responses API's conversation compaction
//! (<https://platform.openai.com/docs/api-reference/responses/compact>; Codex calls it for
//! remote compaction). Its answer is a `response.compaction` object whose `compaction`
//! item carries the provider's own `encrypted_content`, which only that provider can read
//! back, so Sluice cannot make one up from another provider's answer.
//!
//! The request is checked like `POST /v1/responses` (the virtual key, the body bounds, a
//! JSON object with a `model` the key may use: 400, 401, 403, 404, 413 in OpenAI's shape);
//! a valid request gets **501** `not_implemented` naming the model, as no route Sluice
//! serves compacts. A client that gets it compacts on its own (Codex summarizes through
//! `POST /v1/responses`).

use serde_json::Value;

use crate::error::GatewayError;
use crate::ingress::endpoints;
use crate::ingress::request::{self, HeldBody};
use crate::ingress::respond::ChatError;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;
use pingora::proxy::Session;

/// `POST /v1/responses/compact` end to end (see the module doc).
///
/// # Errors
/// [`ChatError::Client`] for every answer (the checks' errors and the 501), written by the
/// caller in OpenAI's shape; [`ChatError::Gone`] when the client left.
pub(crate) async fn handle(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> Result<(), ChatError> {
    let caller = endpoints::authenticate(gw, session, ctx)?;
    let config = ctx.config.clone();
    let HeldBody {
        bytes,
        reservation: _reservation,
    } = endpoints::read_body(gw, session, ctx, &config).await?;
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::invalid(format!("request body is not valid JSON: {e}"), None))?;
    let Value::Object(members) = body else {
        return Err(GatewayError::invalid("request body must be a JSON object", None).into());
    };
    let model = match members.get("model") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        _ => {
            ctx.standard_model = request::raw_model(&bytes);
            return Err(GatewayError::invalid(
                "you must provide a `model` parameter",
                Some("model"),
            )
            .into());
        }
    };
    ctx.standard_model = Some(model.clone());
    if !config.models.contains_key(&model) || !caller.may_use_model(&model) {
        return Err(GatewayError::model_not_found(&model).into());
    }
    Err(GatewayError::NotImplemented(format!(
        "conversation compaction is not available for model `{model}`: none of its routes \
         offers it (compaction items are encrypted by the provider that makes them); \
         compact the conversation with POST /v1/responses instead"
    ))
    .into())
}
