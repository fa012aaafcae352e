//! Owns the token count endpoints: `POST /v1/messages/count_tokens` (Anthropic's token
//! count, <https://docs.anthropic.com/en/api/messages-count-tokens>; Claude Code calls it):
//! the provider's own count when the route is Anthropic, else a local estimate, answered as
//! `{"input_tokens": N}`; and `POST /v1/responses/input_tokens` (OpenAI's,
//! <https://platform.openai.com/docs/api-reference/responses/input-tokens>): the body of a
//! `POST /v1/responses` request, answered as `{"object":"response.input_tokens",
//! "input_tokens": N}` with the local estimate (errors in OpenAI's shape; what follows
//! about Anthropic routes is the Messages endpoint's).
//!
//! The ingress is `/v1/messages`'s: the virtual key by `x-api-key` or Bearer, the tenant's
//! model and provider allow-lists, the body bounds (413/408/503), a Messages request
//! without `max_tokens` ([`protocol::messages::count`]), errors in Anthropic's shape,
//! `x-request-id`, the access log. Routing is generation's ([`routing::plan`]: capabilities,
//! provider preference, strategy, health order), and the first route generation would use
//! decides:
//!
//! - an Anthropic route: `POST {base_url}/messages/count_tokens` with the upstream model,
//!   the provider's key and `anthropic-version`, and the client's `anthropic-beta`; the
//!   answer's `input_tokens` is returned. A failure before an answer (connect error,
//!   timeout, a retryable status such as 429/5xx or the gateway's credentials refused,
//!   a 404/405 from an Anthropic-compatible provider without this endpoint, a body that is
//!   no count) moves on to the next route; a 400/413/422 about the request is the client's
//!   answer, in Anthropic's shape.
//! - for `POST /v1/responses/input_tokens`, a route with `api: responses` (OpenAI, Azure
//!   OpenAI): `POST {responses path}/input_tokens` with the client's JSON, the upstream model
//!   and `previous_response_id` left out ([`providers::responses_endpoint_body`]); the
//!   answer's `input_tokens` is returned, failures as above.
//! - any other route, or no route left: the local estimate
//!   ([`protocol::tokens`], `o200k_base`), computed on a blocking thread.
//!
//! The answer says how it was counted in `x-sluice-token-count: provider | estimate`;
//! a provider count also carries `x-sluice-provider` and `x-sluice-fallback-depth` (when
//! `server.emit_route_headers`).
//!
//! Limits, as Anthropic meters its own count endpoint apart from generation: a count uses
//! none of the tenant's `requests_per_minute`, `tokens_per_minute` or
//! `max_concurrent_streams` (a client counting while its stream runs is not refused, and
//! counting never spends generation budget). A provider count takes a slot of
//! `server.max_concurrent_upstream_requests` while it is in flight, but never waits in the
//! admission queue: with no slot free the estimate answers. Count calls neither trip nor
//! heal a route's passive health (they are another endpoint); routes that are resting or
//! unhealthy are skipped. Estimates run on blocking threads, at most one per CPU at once
//! (the rest wait, bounded in memory by the request-buffer bound). Counted in
//! `sluice_token_counts_total{model,method}`.

use std::sync::atomic::Ordering;
use std::sync::LazyLock;
use std::time::Duration;

use crate::engine::pool::Connector;
use bytes::Bytes;
use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use crate::config::{Model, Route};
use crate::engine::upstream::client_gone;
use crate::engine::upstream::ClientGone;
use crate::error::{parse_retry_after, AttemptError, AttemptFailure, GatewayError};
use crate::ingress::access;
use crate::ingress::request::{self, PREFERENCE_HEADER};
use crate::ingress::respond;
use crate::ingress::respond::ChatError;
use crate::metrics::metrics;
use crate::protocol::{self, messages::count, ClientDialect, UpstreamDialect};
use crate::providers::encoding::{ContentCoding, Decoder};
use crate::providers::exchange::{self, OpenError};
use crate::providers::{self, anthropic};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;
use crate::routing::health::Health;
use crate::routing::{self, Preference, RouteNeeds};

/// Header naming how the answer was counted: `provider` or `estimate`.
pub const COUNT_METHOD_HEADER: &str = "x-sluice-token-count";

/// Largest upstream count answer (or error body) read, bytes: `{"input_tokens":N}` is ~25.
const MAX_UPSTREAM_BODY_BYTES: usize = 64 * 1024;

/// Estimates running at once, process-wide: one per CPU. An estimate is CPU-bound (about
/// 1 µs per byte of text in a debug build, 2 s for the first one there while the BPE
/// table loads), so more would only slow the proxy's own threads; the others wait (their
/// bodies are bounded by `server.max_buffered_request_bytes`) or leave.
static ESTIMATE_SLOTS: LazyLock<Semaphore> = LazyLock::new(|| {
    Semaphore::new(std::thread::available_parallelism().map_or(2, std::num::NonZero::get))
});

/// Idle time a pooled upstream connection is kept (as generation's).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// A parsed token-count request.
struct CountRequest {
    /// The canonical request (what the estimate counts).
    canonical: protocol::Request,
    /// The client's object (what an Anthropic upstream gets, reduced to its members).
    body: Map<String, Value>,
    /// What routing needs to know.
    needs: RouteNeeds,
    /// The client's provider preference.
    preference: Option<Preference>,
}

/// Decodes and validates the body of a count in `dialect` (400 naming the field, in the
/// dialect's shape).
fn parse(
    dialect: ClientDialect,
    body: &[u8],
    preference_header: Option<&[u8]>,
    config: &crate::config::Config,
) -> Result<CountRequest, GatewayError> {
    let mut map = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(GatewayError::invalid(
                "request body must be a JSON object",
                None,
            ))
        }
        Err(e) => {
            return Err(GatewayError::invalid(
                format!("request body is not valid JSON: {e}"),
                None,
            ))
        }
    };
    let canonical = match dialect {
        ClientDialect::Responses => protocol::responses::decode_request(body),
        _ => count::decode_request(body),
    }
    .map_err(|e| GatewayError::invalid(e.to_string(), e.field()))?;
    if canonical.model.trim().is_empty() {
        return Err(GatewayError::invalid(
            "you must provide a `model` parameter",
            Some("model"),
        ));
    }
    let preference = request::preference(map.remove("provider"), preference_header, config)?;
    let needs = request::canonical_needs(&canonical);
    Ok(CountRequest {
        canonical,
        body: map,
        needs,
        preference,
    })
}

/// How one provider count ended.
pub(crate) enum Counted {
    /// The provider's `input_tokens`.
    Tokens(u64),
    /// No answer (or none usable): the next route, else the estimate.
    Failed(AttemptError),
    /// The provider refused the request itself (a 4xx): the client's answer.
    Refused(GatewayError),
    /// The client left.
    Gone(ClientGone),
}

/// A token count end to end (see the module doc): `dialect` Messages for
/// `POST /v1/messages/count_tokens`, Responses for `POST /v1/responses/input_tokens`.
///
/// # Errors
/// [`ChatError::Client`] for an error the caller writes in the dialect's shape;
/// [`ChatError::Gone`] when the client left.
#[expect(
    clippy::too_many_lines,
    reason = "authentication, body, plan and the provider-or-estimate decision in request order"
)]
pub(crate) async fn handle(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: ClientDialect,
) -> Result<(), ChatError> {
    ctx.dialect = dialect;
    ctx.outcome.count_only = true;
    let caller = access::authenticate(gw, session, ctx)?;
    let config = ctx.config.clone();
    let held = access::read_body(gw, session, ctx, &config).await?;
    let pref_header = session
        .req_header()
        .headers
        .get(PREFERENCE_HEADER)
        .map(|v| v.as_bytes().to_vec());
    let request::HeldBody {
        bytes,
        reservation: _reservation,
    } = held;
    let mut req = parse(dialect, &bytes, pref_header.as_deref(), &config).inspect_err(|_| {
        ctx.standard_model = request::raw_model(&bytes);
    })?;
    // The parsed copies stay accounted by the reservation (to the end of this function).
    drop(bytes);
    ctx.standard_model = Some(req.canonical.model.clone());
    let model = config
        .models
        .get(&req.canonical.model)
        .filter(|_| caller.may_use_model(&req.canonical.model))
        .ok_or_else(|| GatewayError::model_not_found(&req.canonical.model))?;
    if routing::uses_input_estimate(model, &caller) {
        req.needs.estimated_input_tokens = protocol::tokens::estimate_input_tokens(&req.canonical);
    }
    let candidates = routing::plan(model, &caller, &req.needs, req.preference.as_ref())?;
    let beta = session
        .req_header()
        .headers
        .get("anthropic-beta")
        .map(|v| v.as_bytes().to_vec());

    for cand in &candidates {
        let health = &cand.health;
        if !health.is_available() || health.state() == Health::Unhealthy {
            continue;
        }
        let route = cand.route;
        // Where the route counts, and the body it is sent (encoded per route: the upstream
        // model differs): Anthropic's count endpoint for a Messages count, the Responses
        // route's own `input_tokens` for a Responses count; else generation would take this
        // route and its count is the estimate.
        let counter = match dialect {
            ClientDialect::Messages if providers::adapter(route.provider.kind).counts_tokens() => {
                Some((
                    std::borrow::Cow::Borrowed(anthropic::COUNT_TOKENS_PATH),
                    count::encode_request(&req.body, &route.upstream_model),
                    UpstreamDialect::Messages,
                ))
            }
            ClientDialect::Responses => route
                .responses_endpoint_path(providers::ResponsesEndpoint::InputTokens)
                .map(|path| {
                    providers::responses_endpoint_body(route, &req.body)
                        .map(|b| (path, b, UpstreamDialect::Responses))
                        .map_err(|e| {
                            GatewayError::Internal(format!("cannot serialize request: {e}"))
                        })
                })
                .transpose()?,
            _ => None,
        };
        let Some((path, body, upstream)) = counter else {
            break;
        };
        let Some(_slot) = gw.admission.try_admit_global() else {
            // The gateway is at its upstream cap: a count never queues behind generation.
            break;
        };
        ctx.attempts.count += 1;
        match provider_count(
            &gw.connector,
            session,
            ctx,
            model,
            route,
            Counter {
                path: &path,
                body: Bytes::from(body),
                upstream,
                max_bytes: MAX_UPSTREAM_BODY_BYTES,
            },
            beta.as_deref()
                .filter(|_| upstream == UpstreamDialect::Messages),
        )
        .await
        {
            Counted::Tokens(n) => {
                ctx.outcome.provider = Some(route.provider.id.clone());
                ctx.outcome.upstream_model = Some(route.upstream_model.clone());
                let mut extra = vec![(COUNT_METHOD_HEADER, "provider".to_string())];
                if config.server.emit_route_headers {
                    extra.push(("x-sluice-provider", route.provider.id.clone()));
                    extra.push(("x-sluice-fallback-depth", ctx.fallback_depth().to_string()));
                }
                return answer(session, ctx, dialect, model, "provider", n, &extra).await;
            }
            Counted::Refused(err) => {
                ctx.outcome.provider = Some(route.provider.id.clone());
                ctx.outcome.upstream_model = Some(route.upstream_model.clone());
                return Err(err.into());
            }
            Counted::Gone(g) => return Err(ChatError::Gone(g)),
            Counted::Failed(ae) => {
                log::info!(target: "sluice::proxy::count_tokens",
                    "token count failed request_id={} provider={} upstream_model={} reason={} detail={:?}",
                    ctx.request_id, ae.provider, ae.upstream_model, ae.failure.label(), ae.detail
                );
                ctx.attempts.failed.push(ae);
                ctx.attempts.failed_routes += 1;
            }
        }
    }
    let canonical = req.canonical;
    let n = {
        let slot = tokio::select! {
            s = ESTIMATE_SLOTS.acquire() => s
                .map_err(|_| GatewayError::Internal("the token estimator is closed".into()))?,
            () = client_gone(session) => return Err(ChatError::Gone(ClientGone("queued"))),
        };
        let n = tokio::task::spawn_blocking(move || {
            protocol::tokens::estimate_input_tokens(&canonical)
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("the token estimate failed: {e}")))?;
        drop(slot);
        n
    };
    answer(
        session,
        ctx,
        dialect,
        model,
        "estimate",
        n,
        &[(COUNT_METHOD_HEADER, "estimate".to_string())],
    )
    .await
}

/// Writes the count in the dialect's shape (Messages `{"input_tokens": n}`, Responses
/// `{"object":"response.input_tokens","input_tokens": n}`) and counts it.
async fn answer(
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: ClientDialect,
    model: &Model,
    method: &'static str,
    n: u64,
    extra: &[(&'static str, String)],
) -> Result<(), ChatError> {
    metrics()
        .token_counts_total
        .with_label_values(&[model.id.as_str(), method])
        .inc();
    ctx.outcome.label = "ok";
    let body = match dialect {
        ClientDialect::Responses => {
            format!(r#"{{"object":"response.input_tokens","input_tokens":{n}}}"#).into_bytes()
        }
        _ => count::encode_response(n),
    };
    respond::write_json(session, ctx, 200, body, extra)
        .await
        .map_err(|_| ChatError::Gone(ClientGone("writing")))
}

pub(crate) fn failed(route: &Route, failure: AttemptFailure, detail: String) -> Counted {
    Counted::Failed(AttemptError {
        provider: route.provider.id.clone(),
        upstream_model: route.upstream_model.clone(),
        failure,
        retry_after: None,
        detail,
    })
}

/// Where one side request goes (a provider count, a Responses compaction): the path under
/// the route's base URL, the body, the dialect its error answers read in, the answer's bound.
pub(crate) struct Counter<'p> {
    /// The path under the route's base URL.
    pub(crate) path: &'p str,
    /// The exact body sent.
    pub(crate) body: Bytes,
    /// The dialect the route's error answers read in.
    pub(crate) upstream: UpstreamDialect,
    /// The largest answer read, bytes (decoded).
    pub(crate) max_bytes: usize,
}

/// One count against one route (Anthropic's count endpoint, a Responses route's
/// `input_tokens`): the exchange ([`provider_exchange`]), then its answer read as a count.
async fn provider_count(
    connector: &Connector,
    session: &mut Session,
    ctx: &RequestCtx,
    model: &Model,
    route: &Route,
    counter: Counter<'_>,
    beta: Option<&[u8]>,
) -> Counted {
    let upstream = counter.upstream;
    let (status, retry_after, answer) =
        match provider_exchange(connector, session, ctx, model, route, counter, beta).await {
            Ok(a) => a,
            Err(c) => return c,
        };
    if (200..300).contains(&status) {
        return match count::decode_response(&answer) {
            Ok(n) => Counted::Tokens(n),
            Err(e) => failed(route, AttemptFailure::Protocol, e.message()),
        };
    }
    // A provider without the endpoint (an Anthropic-compatible API that lacks it) says 404
    // or 405: not the request's fault, so the estimate answers.
    if crate::routing::retryable_status(status) || matches!(status, 404 | 405) {
        let mut f = failed(
            route,
            AttemptFailure::Status(status),
            format!("HTTP {status}"),
        );
        if let Counted::Failed(ae) = &mut f {
            ae.retry_after = retry_after;
        }
        return f;
    }
    let (kind, message) = protocol::decode_error_body(upstream, status, &answer);
    Counted::Refused(GatewayError::Upstream {
        status,
        error_type: kind.openai_type().to_string(),
        code: None,
        message: providers::scrub_key(&route.provider, &message),
        retry_after,
    })
}

/// One side request (a token count, a Responses compaction) to one route: connect (a stale
/// pooled connection gets one fresh retry), send, read the head and the (bounded, decoded)
/// body, each step within the route's `connect` and `first_byte` timeouts. The answer's
/// status, `Retry-After` and body; a failure before an answer as [`Counted::Failed`], the
/// client leaving as [`Counted::Gone`].
///
/// # Errors
/// [`Counted::Failed`] or [`Counted::Gone`] as said.
#[expect(clippy::too_many_lines, reason = "one upstream exchange, in order")]
pub(crate) async fn provider_exchange(
    connector: &Connector,
    session: &mut Session,
    ctx: &RequestCtx,
    model: &Model,
    route: &Route,
    counter: Counter<'_>,
    beta: Option<&[u8]>,
) -> Result<(u16, Option<Duration>, Vec<u8>), Counted> {
    let Counter {
        path,
        body,
        upstream: _,
        max_bytes,
    } = counter;
    let provider = &route.provider;
    let timeouts = ctx.config.timeouts_for(provider, model);
    let resolved = ctx.registry.upstream(provider);
    let target = match providers::target(provider, &resolved).await {
        Ok(t) => t,
        Err(m) => return Err(failed(route, AttemptFailure::Connect, m)),
    };
    let mut head = match providers::request_head(
        provider,
        &resolved,
        &target,
        path,
        &body,
        false,
        &ctx.request_id,
    ) {
        Ok(h) => h,
        Err(e) => return Err(failed(route, AttemptFailure::Protocol, e.to_string())),
    };
    if let Some(beta) = beta {
        if head.insert_header("anthropic-beta", beta).is_err() {
            return Err(Counted::Refused(GatewayError::invalid(
                "the `anthropic-beta` header is not a valid header value",
                None,
            )));
        }
    }
    // Which step the client left in (`sluice_client_aborts_total`): connected, waiting for
    // the response head.
    let sending = std::sync::atomic::AtomicBool::new(false);
    let opening = exchange::open(
        || Box::pin(connector.get_http_session(&target.peer)),
        exchange::Deadlines {
            connect: Some(timeouts.connect),
            first_byte: Some(timeouts.first_byte),
        },
        // Nothing is generated: a failure on a pooled connection is tried once more.
        exchange::Resend::Any,
        || Ok::<_, std::convert::Infallible>(head.clone()),
        Some(body.clone()),
        |step| match step {
            exchange::Step::Connecting => sending.store(false, Ordering::Relaxed),
            exchange::Step::Sending => sending.store(true, Ordering::Relaxed),
            exchange::Step::Resending(e) => {
                log::debug!(target: "sluice::proxy::count_tokens", "stale pooled upstream connection: {}", e.error);
            }
        },
    );
    let opened = tokio::select! {
        r = opening => r,
        () = client_gone(session) => {
            let at = if sending.load(Ordering::Relaxed) { "waiting_head" } else { "connecting" };
            return Err(Counted::Gone(ClientGone(at)));
        }
    };
    let mut up = match opened {
        Ok(up) => up,
        Err(OpenError::Head(never)) => match never {},
        Err(OpenError::Connect(e)) => {
            return Err(failed(route, AttemptFailure::Connect, e.to_string()))
        }
        Err(OpenError::ConnectTimeout) => {
            return Err(failed(
                route,
                AttemptFailure::Connect,
                "connect timeout".into(),
            ))
        }
        Err(OpenError::Send(e)) => {
            return Err(failed(route, AttemptFailure::Protocol, e.error.to_string()))
        }
        Err(OpenError::FirstByteTimeout) => {
            return Err(failed(
                route,
                AttemptFailure::FirstByteTimeout,
                "first byte timeout".into(),
            ))
        }
    };
    let (status, retry_after, coding) = match up.response_header() {
        Some(h) => (
            h.status.as_u16(),
            h.headers
                .get("retry-after")
                .and_then(|v| parse_retry_after(v.as_bytes())),
            ContentCoding::from_header(h.headers.get("content-encoding").map(|v| v.as_bytes())),
        ),
        None => {
            up.shutdown().await;
            return Err(failed(
                route,
                AttemptFailure::Protocol,
                "no response head".into(),
            ));
        }
    };
    let read = tokio::select! {
        r = tokio::time::timeout(timeouts.first_byte.max(timeouts.idle), read_bounded(&mut up, coding, max_bytes)) => r,
        () = client_gone(session) => {
            up.shutdown().await;
            return Err(Counted::Gone(ClientGone("waiting_body")));
        }
    };
    let answer = match read {
        Ok(Ok(b)) => b,
        Ok(Err(detail)) => {
            up.shutdown().await;
            return Err(failed(route, AttemptFailure::Protocol, detail));
        }
        Err(_) => {
            up.shutdown().await;
            return Err(failed(
                route,
                AttemptFailure::Protocol,
                "upstream body read timed out".into(),
            ));
        }
    };
    if up.response_done() {
        connector
            .release_http_session(up, &target.peer, Some(POOL_IDLE))
            .await;
    } else {
        up.shutdown().await;
    }
    Ok((status, retry_after, answer))
}

/// Reads the whole upstream body, decoded, at most `max_bytes`.
///
/// # Errors
/// A detail for the log: an unknown or broken coding, a read error, a body over the bound.
async fn read_bounded(
    up: &mut UpstreamSession,
    coding: Result<ContentCoding, String>,
    max_bytes: usize,
) -> Result<Vec<u8>, String> {
    let coding = coding.map_err(|name| format!("unsupported content-encoding {name:?}"))?;
    let mut decoder = Decoder::new(coding).map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    loop {
        let chunk = up.read_response_body().await.map_err(|e| e.to_string())?;
        let end = chunk.is_none();
        let room = max_bytes.saturating_sub(body.len());
        let piece = decoder
            .decode(chunk.as_deref().unwrap_or_default(), end, room)
            .map_err(|e| e.to_string())?;
        body.extend_from_slice(piece);
        if end {
            return Ok(body);
        }
    }
}
