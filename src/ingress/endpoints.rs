//! Owns the downstream API surface: which path and method does what.
//!
//! - `POST /v1/chat/completions`: OpenAI Chat Completions, streaming or not
//!   (<https://platform.openai.com/docs/api-reference/chat/create>).
//! - `POST /v1/messages`: Anthropic Messages, streaming or not
//!   (<https://docs.anthropic.com/en/api/messages>); auth by `x-api-key` or Bearer,
//!   `anthropic-version` accepted, `anthropic-beta` forwarded to Anthropic upstreams (and
//!   Claude on Vertex AI; to Claude on Bedrock as the body member `anthropic_beta`).
//! - `POST /v1/messages/count_tokens`: Anthropic's token count
//!   (<https://docs.anthropic.com/en/api/messages-count-tokens>), answered by the Anthropic
//!   provider of the route or estimated locally ([`crate::ingress::count_tokens`]).
//! - `POST /v1/responses`: OpenAI Responses, streaming or not
//!   (<https://platform.openai.com/docs/api-reference/responses/create>). With the response store on
//!   (`response_store:`, default), `store` (default `true`) keeps the answer,
//!   `previous_response_id` continues a stored conversation and `item_reference` inputs name
//!   stored items, all by the tenant of the virtual key ([`crate::conversation`]);
//!   `conversation` (the Conversations API) is a 400. With it off, `store: true`,
//!   `previous_response_id` and `item_reference` are 400s naming the field.
//! - `GET /v1/responses` with `Upgrade: websocket`: the Responses API's WebSocket mode
//!   ([`crate::ingress::websocket`]; 426 with `server.responses_websocket: false`).
//! - `POST /v1/responses/input_tokens`: the Responses API's token count, the provider's own
//!   on a route with `api: responses`, else estimated locally
//!   ([`crate::ingress::count_tokens`]).
//! - `POST /v1/responses/compact`: checked, then 501 ([`crate::ingress::compact`]).
//! - `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`,
//!   `GET /v1/responses/{id}/input_items`: the stored response, its deletion
//!   (`{"id","object":"response","deleted":true}`), its input items in OpenAI's list shape
//!   (`limit`, `order`, `after`); tenant-scoped, an unknown or another tenant's id is a 404
//!   ([`crate::ingress::stored_responses`];
//!   <https://platform.openai.com/docs/api-reference/responses/get>).
//! - `GET /v1/streams/{id}`, `DELETE /v1/streams/{id}`: resume or cancel a resumable
//!   stream ([`crate::ingress::streams`], [`crate::stream::resume`]).
//! - `GET /v1/models`, `GET /v1/models/{id}`: the standard models the presented key may use,
//!   in OpenAI's list format (<https://platform.openai.com/docs/api-reference/models/list>).
//!
//! Everything else is a 404 (unknown path) or 405 (known path, wrong method) in OpenAI's error
//! shape (Anthropic's for `/v1/messages` and `/v1/messages/count_tokens`). The `/v1` prefix is optional, as SDK base URLs differ.

use pingora::proxy::Session;
use serde_json::json;

use crate::backpressure::Admission;
use crate::engine::attempt::{self, ClientGone};
use crate::error::GatewayError;
use crate::ingress::access::{authenticate, read_body};
use crate::ingress::request::{self, PREFERENCE_HEADER};
use crate::ingress::respond;
use crate::ingress::respond::ChatError;
use crate::ingress::{compact, count_tokens};
use crate::protocol::ClientDialect;
use crate::proxy::ctx::{ActiveStreamGuard, RequestCtx};
use crate::proxy::gateway::Gateway;
use crate::routing;

/// Handles one downstream request end to end (the response is written when this returns
/// `Ok`).
///
/// # Errors
/// [`ClientGone`] when the client disconnected.
pub async fn handle(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> Result<(), ClientGone> {
    let method = session.req_header().method.as_str().to_string();
    let path = session.req_header().uri.path().to_string();
    let path = path.strip_prefix("/v1").unwrap_or(&path);
    let websocket = crate::ingress::websocket::wants_websocket(session.req_header());
    let result = match (path, method.as_str()) {
        // The Responses API's WebSocket mode (426 when it is off: its clients then fall back
        // to plain HTTP at once; a 405 would have them retry the upgrade for seconds).
        ("/responses", _) if websocket => {
            Box::pin(crate::ingress::websocket::serve(gw, session, ctx)).await
        }
        // A retry of a resumable stream's request with `Last-Event-ID`: its resume.
        ("/chat/completions" | "/messages" | "/responses", "POST")
            if let Some(sid) = crate::ingress::streams::named_by_post(session) =>
        {
            let dialect = dialect_of(path);
            Box::pin(crate::ingress::streams::resume_post(
                gw, session, ctx, dialect, &sid,
            ))
            .await
        }
        ("/chat/completions", "POST") => {
            infer(gw, session, ctx, ClientDialect::ChatCompletions).await
        }
        ("/messages", "POST") => infer(gw, session, ctx, ClientDialect::Messages).await,
        ("/responses", "POST") => infer(gw, session, ctx, ClientDialect::Responses).await,
        // Boxed: its ~7 KiB of state would otherwise be part of every request's future.
        ("/messages/count_tokens", "POST") => {
            Box::pin(count_tokens::handle(
                gw,
                session,
                ctx,
                ClientDialect::Messages,
            ))
            .await
        }
        ("/responses/input_tokens", "POST") => {
            Box::pin(count_tokens::handle(
                gw,
                session,
                ctx,
                ClientDialect::Responses,
            ))
            .await
        }
        ("/responses/compact", "POST") => {
            ctx.dialect = ClientDialect::Responses;
            compact::handle(gw, session, ctx).await
        }
        (
            "/chat/completions"
            | "/messages"
            | "/messages/count_tokens"
            | "/responses"
            | "/responses/input_tokens"
            | "/responses/compact",
            _,
        ) => {
            ctx.dialect = dialect_of(path);
            Err(GatewayError::MethodNotAllowed(method.clone()).into())
        }
        // The stored responses (`input_tokens` and `compact` are matched above).
        (p, "GET" | "DELETE") if p.starts_with("/responses/") => {
            let m = method.clone();
            crate::ingress::stored_responses::handle(gw, session, ctx, p, &m).await
        }
        (p, "GET" | "DELETE") if p.starts_with("/streams/") => {
            let m = method.clone();
            crate::ingress::streams::handle(gw, session, ctx, p, &m).await
        }
        (p, _) if p.starts_with("/streams/") => {
            ctx.dialect = ClientDialect::ChatCompletions;
            Err(GatewayError::MethodNotAllowed(method.clone()).into())
        }
        ("/models", "GET") => models(gw, session, ctx, None).await,
        (p, "GET") if p.starts_with("/models/") => {
            // SDKs percent-encode the `/` of ids like `openai/gpt-4o-mini`.
            let raw = p.trim_start_matches("/models/");
            let id = percent_encoding::percent_decode_str(raw)
                .decode_utf8_lossy()
                .into_owned();
            models(gw, session, ctx, Some(id)).await
        }
        ("/models", _) => Err(GatewayError::MethodNotAllowed(method.clone()).into()),
        _ => Err(GatewayError::NotFound {
            message: format!("unknown path `{}`", session.req_header().uri.path()),
            code: "not_found",
        }
        .into()),
    };
    match result {
        Ok(()) => Ok(()),
        Err(ChatError::Gone(g)) => Err(g),
        Err(ChatError::Client(e)) => {
            if !session.is_body_done() {
                // The body was not read: the connection cannot be reused safely.
                session.set_keepalive(None);
            }
            respond::write_error(session, ctx, &e)
                .await
                .map_err(|_| ClientGone("writing"))
        }
    }
}

/// The client dialect of an inference path (after the `/v1` prefix).
pub(crate) fn dialect_of(path: &str) -> ClientDialect {
    match path {
        "/messages" | "/messages/count_tokens" => ClientDialect::Messages,
        p if p.starts_with("/responses") => ClientDialect::Responses,
        _ => ClientDialect::ChatCompletions,
    }
}

/// `GET /v1/models` and `GET /v1/models/{id}`: the standard models the key may use, in
/// OpenAI's shape (<https://platform.openai.com/docs/api-reference/models/list>:
/// `{object:"list", data:[{id, object:"model", created, owned_by}]}`), or in Anthropic's for a
/// client that sends `anthropic-version` (<https://docs.anthropic.com/en/api/models-list>:
/// `{data:[{type:"model", id, display_name, created_at}], has_more, first_id, last_id}`; one
/// page with every model).
async fn models(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    one: Option<String>,
) -> Result<(), ChatError> {
    // The anthropic SDKs send `anthropic-version` on every request (Anthropic's API requires
    // it); OpenAI's never do. Such a client gets Anthropic's shapes, errors included.
    let anthropic = session
        .req_header()
        .headers
        .contains_key("anthropic-version");
    if anthropic {
        ctx.dialect = ClientDialect::Messages;
    }
    let caller = authenticate(gw, session, ctx)?;
    let visible: Vec<serde_json::Value> = ctx
        .config
        .models
        .keys()
        .filter(|id| caller.may_use_model(id))
        .filter(|id| one.as_ref().is_none_or(|o| o == *id))
        .map(|id| {
            if anthropic {
                json!({
                    "type": "model",
                    "id": id,
                    "display_name": id,
                    "created_at": "1970-01-01T00:00:00Z",
                })
            } else {
                json!({
                    "id": id,
                    "object": "model",
                    "created": 0,
                    "owned_by": id.split('/').next().unwrap_or("sluice"),
                })
            }
        })
        .collect();
    let body = match one {
        Some(id) => match visible.into_iter().next() {
            Some(m) => m,
            None => return Err(GatewayError::model_not_found(&id).into()),
        },
        None if anthropic => json!({
            "data": visible,
            "has_more": false,
            "first_id": visible.first().map(|m| m["id"].clone()),
            "last_id": visible.last().map(|m| m["id"].clone()),
        }),
        None => json!({"object": "list", "data": visible}),
    };
    let bytes = serde_json::to_vec(&body).map_err(|e| GatewayError::Internal(e.to_string()))?;
    respond::write_json(session, ctx, 200, bytes, &[])
        .await
        .map_err(|_| ChatError::Gone(ClientGone("writing")))
}

/// `POST /v1/chat/completions`, `POST /v1/messages`, `POST /v1/responses`: the same
/// pipeline for every client dialect; only parsing differs (Chat Completions keeps its own
/// parse, the others decode once into the canonical request).
///
/// Order: authenticate (head), the tenant-wide concurrency slot (head, before any body byte
/// is buffered), the body (bounded in size, in global buffer bytes and in time), parse,
/// the rest of admission, the attempt loop. The body's buffer reservation is held with the
/// parsed request, which is replayed to every candidate: until a stream commits (nothing is
/// replayed after it; see [`InferenceRequest::release_payload`](request::InferenceRequest::release_payload)),
/// else to the end of the attempt loop.
#[expect(
    clippy::too_many_lines,
    reason = "authentication, body, admission, plan and the attempt loop in request order"
)]
async fn infer(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: ClientDialect,
) -> Result<(), ChatError> {
    ctx.dialect = dialect;
    let caller = authenticate(gw, session, ctx)?;
    let config = ctx.config.clone();
    let slot =
        gw.admission
            .take_tenant_slot(&config, &caller.tenant, &mut ctx.admission.rate_limit)?;
    let held = read_body(gw, session, ctx, &config).await?;
    let pref_header = session
        .req_header()
        .headers
        .get(PREFERENCE_HEADER)
        .map(|v| v.as_bytes().to_vec());
    let request::HeldBody {
        mut bytes,
        mut reservation,
    } = held;
    if dialect == ClientDialect::Responses {
        // Conversation state: `previous_response_id` and `item_reference` resolved into
        // `input` before decoding and routing, so every provider kind and every fallback
        // sees the whole conversation.
        let expanded = crate::conversation::expand::expand(
            crate::conversation::running(),
            &caller.tenant,
            &bytes,
        )
        .await
        .inspect_err(|_| ctx.standard_model = request::raw_model(&bytes))?;
        if let Some(b) = expanded.body {
            // The history is held like the body it joins: its bytes count against
            // `server.max_buffered_request_bytes` too (503 when they do not fit).
            reservation
                .ensure(
                    b.len()
                        .saturating_mul(crate::backpressure::buffers::COPIES_PER_BODY_BYTE),
                    config.server.max_buffered_request_bytes,
                )
                .map_err(Admission::buffers_full)?;
            bytes = bytes::Bytes::from(b);
        }
        ctx.response_capture = expanded.capture.map(Box::new);
    }
    let parsed = match dialect {
        ClientDialect::ChatCompletions => {
            request::parse_chat(&bytes, pref_header.as_deref(), &config)
        }
        d => request::parse_dialect(d, &bytes, pref_header.as_deref(), &config),
    };
    let mut req = parsed.inspect_err(|_| {
        // Refused while decoding: the access line, the refusal's log line and the ledger
        // row still name the model the client asked for.
        ctx.standard_model = request::raw_model(&bytes);
    })?;
    req.anthropic_beta = session
        .req_header()
        .headers
        .get("anthropic-beta")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // The raw bytes go; their reservation stays with the parsed copy every attempt
    // serializes from, released with it (at a stream's commit, else at the end).
    drop(bytes);
    req.hold_reservation(reservation);
    ctx.standard_model = Some(req.model.clone());
    ctx.stream = req.stream;
    let model = config
        .models
        .get(&req.model)
        .filter(|_| caller.may_use_model(&req.model))
        .ok_or_else(|| GatewayError::model_not_found(&req.model))?;
    // The body's `models` are checked as `model` is (refused before any admission).
    crate::engine::fallback::check_body_models(&config, &caller, &req.models)?;

    // The budget first: a tenant without money left takes no rate-limit or queue place.
    // The tokenizer runs only for a tenant with a budget (the estimate is cached).
    if crate::billing::budget::Budgets::budget_of(&config, &caller.tenant).is_some() {
        ctx.billing.budget_input_tokens = req.estimated_input_tokens();
        let reserve = crate::billing::budget::reservation_usd(
            model,
            ctx.billing.budget_input_tokens,
            req.needs.requested_max_output_tokens,
        );
        ctx.billing.budget = gw
            .admission
            .budgets()
            .reserve(&config, &caller.tenant, reserve)
            .await
            .map_err(|e| e.error(&caller.tenant))?;
    }
    let demand = crate::backpressure::Demand {
        tenant: Some(&caller.tenant),
        model: Some(&req.model),
        // The tokenizer runs only for a token limit (see `estimated_input_tokens`).
        estimated_input_tokens: if crate::backpressure::counts_tokens(
            &config,
            &caller.tenant,
            Some(&req.model),
        ) {
            req.estimated_input_tokens()
        } else {
            0
        },
    };
    let permit = match gw
        .admission
        .admit(
            session,
            &config,
            demand,
            &mut ctx.admission.rate_limit,
            slot,
        )
        .await
    {
        Ok(p) => p,
        Err(crate::backpressure::Rejected::Client(e)) => return Err(e.into()),
        Err(crate::backpressure::Rejected::Gone) => {
            return Err(ChatError::Gone(ClientGone("queued")))
        }
    };
    if routing::uses_input_estimate(model, &caller) {
        req.needs.estimated_input_tokens = req.estimated_input_tokens();
    }
    let (mut candidates, unplanned) =
        match routing::plan(model, &caller, &req.needs, req.preference.as_ref()) {
            Ok(c) => (c, None),
            // No route of the model can serve now (all resting, none with a capability):
            // its fallback models may; the reason stays the answer if none does.
            Err(e)
                if e.status() == 503
                    && crate::engine::fallback::has_model_fallbacks(model, &req.models) =>
            {
                (Vec::new(), Some(e))
            }
            Err(e) => {
                // Nothing went upstream: no tokens were used.
                permit.settle(crate::backpressure::Used::of(&ctx.outcome));
                return Err(e.into());
            }
        };
    let affinity = req.payload().and_then(|p| {
        routing::affinity::for_request(
            model,
            &caller.tenant,
            &session.req_header().headers,
            &p.body,
            p.decoded(),
            req.preference.as_ref(),
            &mut candidates,
        )
    });
    ctx.admission.active = Some(ActiveStreamGuard::new(&caller.tenant));
    if req.stream
        && crate::stream::resume::opted_in(
            session
                .req_header()
                .headers
                .get(crate::stream::resume::RESUMABLE_HEADER)
                .map(|v| v.as_bytes()),
            model.resumable,
        )
    {
        ctx.resumable = Some(start_resumable(gw, session, ctx, &caller));
    }
    let mut result = attempt::run(
        &gw.connector,
        session,
        ctx,
        &req,
        model,
        &candidates,
        unplanned,
    )
    .await;
    if let Some(key) = affinity {
        routing::affinity::served(key, &candidates, &ctx.outcome);
    }
    // An answer without the provider's input figure is metered at the estimate.
    ctx.outcome
        .fill_input_estimate(|| req.estimated_input_tokens());
    // So is an attempt a hedge race cancelled (the same cached estimate; only if one was).
    ctx.fill_cancelled_hedges(|| req.estimated_input_tokens());
    // Token limits learn the real usage (`ctx.outcome` is final here).
    permit.settle(crate::backpressure::Used::of(&ctx.outcome));
    // A resumable stream: the upstream is done (released or closed); the request ends when
    // the final event reached some client or the resume window passed, so its one ledger
    // row has the resumptions.
    if let Some(r) = ctx.resumable.take() {
        let settled = Box::pin(r.settle()).await;
        ctx.outcome.resumptions = settled.resumptions;
        // What the original client was written: the event ids in, what it missed out.
        ctx.outcome.bytes_out = ctx
            .outcome
            .bytes_out
            .saturating_add_signed(settled.bytes_out_adjust);
        if settled.started && !settled.delivered && result.is_ok() {
            result = Err(ClientGone("streaming"));
        }
    }
    // The answer was sent: a stored Responses request is queued for writing now.
    if let Some(capture) = ctx.response_capture.take() {
        if result.is_ok() && ctx.outcome.status == 200 {
            if let (Some(store), Some(stored)) = (
                crate::conversation::running(),
                capture.into_stored(crate::conversation::now_ms()),
            ) {
                store.submit(stored);
            }
        }
    }
    result.map_err(ChatError::Gone)
}

/// Registers the resumable stream of a streaming request that opted in: its id (in the
/// request's dialect, with this replica's tag), the owner (the presented key's hash and its
/// tenant), the grace window and buffer bound of the pinned config, and the buffer's charge
/// to the global request-buffer bound.
fn start_resumable(
    gw: &Gateway,
    session: &Session,
    ctx: &RequestCtx,
    caller: &crate::auth::Caller,
) -> Box<crate::stream::resume::writer::Resumable> {
    let server = &ctx.config.server;
    let h = &session.req_header().headers;
    let key = crate::auth::presented_key(
        h.get("authorization").map(|v| v.as_bytes()),
        h.get("x-api-key").map(|v| v.as_bytes()),
    )
    .unwrap_or_default();
    let id = crate::stream::resume::id::new_id(ctx.dialect, &server.replica_id);
    log::debug!(target: "sluice::stream::resume",
        "resumable stream opened stream_id={id} request_id={}", ctx.request_id);
    crate::stream::resume::writer::Resumable::start(
        id,
        ctx.dialect,
        crate::stream::resume::entry::Owner {
            key: crate::auth::hash_key(&key),
            tenant: caller.tenant.as_str().into(),
        },
        crate::stream::resume::entry::Limits {
            grace: server.resume_grace,
            buffer_bytes: server.resume_buffer_bytes,
            linger_bytes: server.resume_linger_bytes,
            global_bound: server.max_buffered_request_bytes,
        },
        // Nothing yet: it grows with the buffer, which never holds more than fits.
        gw.admission.buffers().empty(),
    )
}
