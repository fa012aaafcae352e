//! Owns `POST /v1/responses/compact`, the Responses API's conversation compaction
//! (<https://platform.openai.com/docs/api-reference/responses/compact>; Codex calls it for
//! remote compaction). Its answer is a `response.compaction` object whose `compaction`
//! item carries the provider's own `encrypted_content`, which only that provider can read
//! back, so Sluice cannot make one up from another provider's answer.
//!
//! The request is checked like `POST /v1/responses` (the virtual key, the body bounds, a
//! JSON object with a `model` the key may use: 400, 401, 403, 404, 413 in OpenAI's shape).
//! When generation's first route speaks Responses (`routes[].api: responses`, OpenAI or
//! Azure OpenAI), the request goes to that provider's own `POST {responses path}/compact`
//! (then to the next Responses route on a failure before an answer), its answer passed with
//! the standard model named. Otherwise a valid request gets **501** `not_implemented`
//! naming the model: no other route compacts. A client that gets it compacts on its own
//! (Codex summarizes through `POST /v1/responses`).

use serde_json::Value;

use crate::error::GatewayError;
use crate::ingress::access;
use crate::ingress::request::{self, HeldBody};
use crate::ingress::respond::ChatError;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;
use pingora::proxy::Session;

/// Forwards the compaction to the routes of `model` that speak Responses (`api:
/// responses`), in generation's order, as long as generation's own first route is one:
/// `POST {responses path}/compact` with the client's JSON (the upstream model,
/// `previous_response_id` left out), the answer's `model` the standard model. A failure
/// before an answer moves on to the next such route; an error answer (a 4xx about the
/// request) is the client's. `Ok(None)`: no route compacts (the caller answers 501).
///
/// # Errors
/// The client's error ([`ChatError::Client`]) or its leaving ([`ChatError::Gone`]).
async fn forward(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    model: &crate::config::Model,
    caller: &crate::auth::Caller,
    members: &serde_json::Map<String, Value>,
) -> Result<Option<()>, ChatError> {
    use crate::ingress::count_tokens::{provider_exchange, Counted, Counter};
    use crate::protocol::UpstreamDialect;
    use crate::providers::{self, ResponsesEndpoint};
    let needs = crate::routing::RouteNeeds {
        capabilities: Vec::new(),
        estimated_input_tokens: 0,
        max_output_tokens: 0,
        requested_max_output_tokens: None,
    };
    let candidates = crate::routing::plan(model, caller, &needs, None)?;
    let max_bytes = ctx.config.server.max_request_body_bytes;
    let mut tried = false;
    for cand in &candidates {
        if !cand.health.is_available() {
            continue;
        }
        let route = cand.route;
        let Some(path) = route.responses_endpoint_path(ResponsesEndpoint::Compact) else {
            if tried {
                continue;
            }
            // Generation would take a route that does not speak Responses first: its
            // answers could not read another provider's compaction.
            return Ok(None);
        };
        tried = true;
        let body = providers::responses_endpoint_body(route, members)
            .map_err(|e| GatewayError::Internal(format!("cannot serialize request: {e}")))?;
        ctx.attempts.count += 1;
        let exchanged = provider_exchange(
            &gw.connector,
            session,
            ctx,
            model,
            route,
            Counter {
                path: &path,
                body: bytes::Bytes::from(body),
                upstream: UpstreamDialect::Responses,
                max_bytes,
            },
            None,
        )
        .await;
        let (status, retry_after, answer) = match exchanged {
            Ok(a) => a,
            Err(Counted::Gone(g)) => return Err(ChatError::Gone(g)),
            Err(Counted::Refused(e)) => return Err(e.into()),
            Err(Counted::Failed(ae)) => {
                ctx.attempts.failed.push(ae);
                ctx.attempts.failed_routes += 1;
                continue;
            }
            // The exchange reads no count: never a token answer.
            Err(Counted::Tokens(_)) => continue,
        };
        ctx.outcome.provider = Some(route.provider.id.clone());
        ctx.outcome.upstream_model = Some(route.upstream_model.clone());
        if (200..300).contains(&status) {
            let mut out = bytes::BytesMut::with_capacity(answer.len() + 16);
            crate::protocol::responses::upstream::FAST_PATH
                .rewriter(false, &model.id)
                .rewrite_json(&answer, &mut out);
            ctx.outcome.label = "ok";
            let mut extra = Vec::new();
            if ctx.config.server.emit_route_headers {
                extra.push(("x-sluice-provider", route.provider.id.clone()));
                extra.push(("x-sluice-fallback-depth", ctx.fallback_depth().to_string()));
            }
            crate::ingress::respond::write_json(session, ctx, 200, out.to_vec(), &extra)
                .await
                .map_err(|_| ChatError::Gone(crate::engine::upstream::ClientGone("writing")))?;
            return Ok(Some(()));
        }
        if crate::routing::retryable_status(status) || matches!(status, 404 | 405) {
            ctx.attempts.failed.push(crate::error::AttemptError {
                provider: route.provider.id.clone(),
                upstream_model: route.upstream_model.clone(),
                failure: crate::error::AttemptFailure::Status(status),
                retry_after,
                detail: format!("HTTP {status}"),
            });
            ctx.attempts.failed_routes += 1;
            continue;
        }
        let (kind, message) =
            crate::protocol::decode_error_body(UpstreamDialect::Responses, status, &answer);
        return Err(GatewayError::Upstream {
            status,
            error_type: kind.openai_type().to_string(),
            code: None,
            message: providers::scrub_key(&route.provider, &message),
            retry_after,
        }
        .into());
    }
    Ok(None)
}

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
    let caller = access::authenticate(gw, session, ctx)?;
    let config = ctx.config.clone();
    let HeldBody {
        bytes,
        reservation: _reservation,
    } = access::read_body(gw, session, ctx, &config).await?;
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
    let Some(m) = config
        .models
        .get(&model)
        .filter(|_| caller.may_use_model(&model))
    else {
        return Err(GatewayError::model_not_found(&model).into());
    };
    if let Some(answered) = forward(gw, session, ctx, m, &caller, &members).await? {
        return Ok(answered);
    }
    Err(GatewayError::NotImplemented(format!(
        "conversation compaction is not available for model `{model}`: its first route does \
         not speak the OpenAI Responses API (`routes[].api: responses`), and compaction items \
         are encrypted by the provider that makes them; compact the conversation with \
         POST /v1/responses instead"
    ))
    .into())
}
