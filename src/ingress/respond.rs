//! Owns responses Sluice writes itself: JSON bodies (model lists, errors in the client's
//! dialect with `Retry-After`) and the response head of a proxied answer (SSE headers, route headers,
//! `x-request-id`). Both carry the tenant's `x-ratelimit-*` headers when it has limits.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use crate::engine::upstream::ClientGone;
use crate::error::{retry_after_header, retry_after_ms_header, GatewayError};
use crate::logging::{format_line, Field};
use crate::proxy::ctx::RequestCtx;

/// Writes a complete JSON response.
///
/// # Errors
/// When the downstream write fails (the client is gone).
pub async fn write_json(
    session: &mut Session,
    ctx: &mut RequestCtx,
    status: u16,
    body: Vec<u8>,
    extra_headers: &[(&'static str, String)],
) -> pingora::Result<()> {
    // Without Pingora's case map, as in `proxied_head`.
    let mut h = ResponseHeader::build_no_case(status, Some(6))?;
    h.insert_header("content-type", "application/json")?;
    h.insert_header("content-length", body.len().to_string())?;
    h.insert_header("x-request-id", &ctx.request_id)?;
    for (k, v) in extra_headers {
        h.insert_header(*k, v)?;
    }
    for (k, v) in ctx.admission.rate_limit.iter().flat_map(|s| s.headers()) {
        h.insert_header(k, v)?;
    }
    ctx.outcome.status = status;
    ctx.outcome.bytes_out += body.len() as u64;
    ctx.attempts.downstream_committed = true;
    session.write_response_header(Box::new(h), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// Writes `err` as a JSON error in the client's dialect (`ctx.dialect`: OpenAI's shape for
/// Chat Completions and Responses, Anthropic's for Messages) with its status, `Retry-After`
/// and `retry-after-ms`.
///
/// # Errors
/// When the downstream write fails.
pub async fn write_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    err: &GatewayError,
) -> pingora::Result<()> {
    ctx.outcome.label = err.metric_label();
    if matches!(err.status(), 400 | 404 | 405 | 413 | 422) {
        // A client's mistake: the reason is in the answer, and here for the operator (the
        // access line has only the outcome label).
        // Client text (the model, the reason quoting it) goes through the access log's
        // escaping: it can never start a line of its own.
        let reason = err.to_string();
        let fields = [
            ("request_id", Field::Text(&ctx.request_id)),
            ("dialect", Field::Text(ctx.dialect.as_str())),
            (
                "model",
                Field::Text(ctx.standard_model.as_deref().unwrap_or("-")),
            ),
            ("status", Field::Count(u64::from(err.status()))),
            ("reason", Field::Text(&reason)),
        ];
        log::info!(
            target: "sluice::proxy::request",
            "request refused {}",
            format_line(&fields, ctx.config.server.log_format)
        );
    }
    let mut extra = Vec::new();
    if let Some(ra) = err.retry_after() {
        // Both forms: `retry-after-ms` is what OpenAI's SDKs read first (a provider's own
        // value passes through to the millisecond), `Retry-After` whole seconds rounded up.
        extra.push(("retry-after", retry_after_header(ra)));
        extra.push(("retry-after-ms", retry_after_ms_header(ra)));
    }
    if let Some(m) = &ctx.outcome.served_model {
        // An upstream's own answer (a 4xx about the request): which model's route gave it.
        extra.push((SERVED_MODEL_HEADER, m.clone()));
    }
    if ctx.attempts.count > 0 && ctx.config.server.emit_route_headers {
        // How many upstream attempts the failure took (retries and fallbacks included).
        extra.push(("x-sluice-attempts", ctx.attempts.count.to_string()));
    }
    if err.status() == 405 {
        // The model list is read with GET, a resumable stream with GET (or cancelled with
        // DELETE); everything else Sluice serves takes POST.
        let path = session.req_header().uri.path();
        let allow = if path.contains("/models") {
            "GET"
        } else if path.contains("/streams/") {
            "GET, DELETE"
        } else {
            "POST"
        };
        extra.push(("allow", allow.to_string()));
    }
    // Chat Completions clients keep the full OpenAI body (with `code`), and so do Responses
    // clients for a budget refusal; the others get their own dialect's error shape (each
    // dialect's `ClientWire` says which).
    let body = err.body_for(ctx.dialect, err.param());
    write_json(session, ctx, err.status(), body, &extra).await
}

/// The response header naming what a translation left out of the client's request: JSON
/// paths in the client's dialect, comma-separated (`models.<id>.unsupported: drop`).
pub const DROPPED_HEADER: &str = "x-sluice-dropped";

/// The response header naming the model that served an answer (or whose provider gave the
/// error that is the answer): the serving route's `display_model`, else the standard model's
/// id (the fallback model's after a model-level fallback); never the upstream model id unless
/// the operator made it the display id.
pub const SERVED_MODEL_HEADER: &str = "x-sluice-served-model";

/// The response head of a proxied answer: status, content type, `x-request-id`, route
/// headers, and for streams the SSE headers (`text/event-stream`, `no-cache`,
/// `X-Accel-Buffering: no`, chunked framing, no `Content-Length`).
///
/// # Errors
/// Only for invalid header values.
pub fn proxied_head(
    ctx: &RequestCtx,
    status: u16,
    stream: bool,
    content_length: Option<usize>,
    provider: &str,
) -> pingora::Result<ResponseHeader> {
    // Without Pingora's case map: every name here is lowercase, which is what goes on the
    // wire either way, and the map would be one more allocation kept for the stream's life.
    let mut h = ResponseHeader::build_no_case(status, Some(8))?;
    if stream {
        h.insert_header("content-type", "text/event-stream; charset=utf-8")?;
        h.insert_header("cache-control", "no-cache")?;
        h.insert_header("x-accel-buffering", "no")?;
        h.insert_header("transfer-encoding", "chunked")?;
    } else {
        h.insert_header("content-type", "application/json")?;
        if let Some(n) = content_length {
            h.insert_header("content-length", n.to_string())?;
        }
    }
    h.insert_header("x-request-id", &ctx.request_id)?;
    if let Some(d) = &ctx.outcome.dropped {
        h.insert_header(DROPPED_HEADER, d.as_str())?;
    }
    if let Some(m) = &ctx.outcome.served_model {
        h.insert_header(SERVED_MODEL_HEADER, m.as_str())?;
    }
    for (k, v) in ctx.admission.rate_limit.iter().flat_map(|s| s.headers()) {
        h.insert_header(k, v)?;
    }
    if ctx.config.server.emit_route_headers {
        h.insert_header("x-sluice-provider", provider)?;
        h.insert_header("x-sluice-fallback-depth", ctx.fallback_depth().to_string())?;
        h.insert_header("x-sluice-attempts", ctx.attempts.count.to_string())?;
        if let Some(o) = ctx.outcome.overhead {
            h.insert_header(
                "x-sluice-overhead-ms",
                format!("{:.3}", o.as_secs_f64() * 1e3),
            )?;
        }
    }
    Ok(h)
}

/// Why a request ended without a proxied answer.
pub(crate) enum ChatError {
    /// Answer the client this error (in its dialect).
    Client(GatewayError),
    /// The client left.
    Gone(ClientGone),
}

impl From<GatewayError> for ChatError {
    fn from(e: GatewayError) -> Self {
        Self::Client(e)
    }
}
