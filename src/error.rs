//! Owns what a client sees when a request fails: [`GatewayError`] (status, OpenAI error type
//! and code, `Retry-After`, metric label, JSON body) and [`AttemptError`], the record of one
//! failed upstream attempt kept in order per request (logged, never sent to the client).
//!
//! The JSON shape is OpenAI's: `{"error":{"message","type","param","code"}}`
//! (<https://platform.openai.com/docs/guides/error-codes>).

use std::time::Duration;

/// A client-facing error. Each variant knows its HTTP status and OpenAI error type.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// 400: malformed JSON, missing `model`, bad field.
    #[error("{message}")]
    InvalidRequest {
        /// Human-readable reason.
        message: String,
        /// The offending parameter, if known.
        param: Option<String>,
    },
    /// 401: missing or unknown virtual key.
    #[error("{0}")]
    InvalidVirtualKey(String),
    /// 403: the key may not use this model.
    #[error("{0}")]
    PermissionDenied(String),
    /// 404: unknown standard model or path.
    #[error("{message}")]
    NotFound {
        /// Human-readable reason.
        message: String,
        /// `model_not_found` or `not_found`.
        code: &'static str,
    },
    /// 410: a resumable stream that can no longer be resumed (its grace window passed, its
    /// replay buffer overflowed, the event named is no longer kept, or it was cancelled).
    #[error("{message}")]
    StreamGone {
        /// Which, and what to do.
        message: String,
        /// `stream_expired`, `stream_overflowed`, `event_too_old`, `stream_cancelled`,
        /// `stream_completed`.
        code: &'static str,
    },
    /// 421: a resumable stream id of another replica (the deployment routes resumes by the
    /// stream id's replica tag).
    #[error("{0}")]
    Misdirected(String),
    /// 405: wrong method for the path.
    #[error("method {0} is not allowed on this path")]
    MethodNotAllowed(String),
    /// 426: a protocol upgrade Sluice does not serve (the Responses API's WebSocket mode):
    /// the client should use plain HTTP, which clients do at once on a 426.
    #[error("{0}")]
    UpgradeRequired(String),
    /// 501: an endpoint Sluice serves only for some routes, asked of a model none of whose
    /// routes can answer it (`POST /v1/responses/compact` without a Responses-API route).
    #[error("{0}")]
    NotImplemented(String),
    /// 413: request body over `server.max_request_body_bytes`.
    #[error("request body exceeds the limit of {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The configured limit, bytes.
        limit_bytes: usize,
    },
    /// 414: the request target is longer than `server.max_uri_bytes`.
    #[error("the request URI exceeds the limit of {limit_bytes} bytes")]
    UriTooLong {
        /// The configured limit, bytes.
        limit_bytes: usize,
    },
    /// 431: the request head is over `server.max_request_header_bytes` or has more fields
    /// than `server.max_request_headers`.
    #[error("{message}")]
    HeaderTooLarge {
        /// Which limit, the request's figure and the limit.
        message: String,
        /// Metric label and error code (`header_too_large`, `too_many_headers`).
        reason: &'static str,
    },
    /// 408: the request body did not arrive within `server.body_read_timeout_ms`.
    #[error("{0}")]
    RequestTimeout(String),
    /// 402: the tenant's budget has no room for the request's reservation
    /// ([`crate::billing::budget`]).
    #[error("{message}")]
    BudgetExceeded {
        /// Which window, its budget, what is left and what the request needs.
        message: String,
    },
    /// 429: a tenant limit.
    #[error("{message}")]
    RateLimited {
        /// Which limit.
        message: String,
        /// Metric label (`tenant_rpm`, …).
        reason: &'static str,
        /// When to come back.
        retry_after: Duration,
    },
    /// 503: the gateway is overloaded (queue full or timed out).
    #[error("{message}")]
    Overloaded {
        /// Why.
        message: String,
        /// Metric label (`queue_full`, `queue_timeout`).
        reason: &'static str,
        /// When to come back.
        retry_after: Duration,
    },
    /// 503: no candidate route is left (unhealthy, excluded, lacking a capability).
    #[error("{message}")]
    NoRoute {
        /// Why nothing is left.
        message: String,
        /// Suggested wait, if a cool-down is known.
        retry_after: Option<Duration>,
    },
    /// 502: every provider failed or was unreachable.
    #[error("{message}")]
    UpstreamUnavailable {
        /// Summary (never includes provider keys).
        message: String,
        /// Suggested wait from an upstream `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 504: the upstream did not answer in time.
    #[error("{0}")]
    UpstreamTimeout(String),
    /// An upstream error passed through with its status, normalized to OpenAI's shape.
    #[error("{message}")]
    Upstream {
        /// The upstream status.
        status: u16,
        /// OpenAI error type.
        error_type: String,
        /// OpenAI error code, if any.
        code: Option<String>,
        /// Message (scrubbed of provider keys).
        message: String,
        /// Upstream `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 500: a bug or an impossible state.
    #[error("{0}")]
    Internal(String),
}

impl GatewayError {
    /// The 404 `model_not_found` for a model id that names no configured standard model
    /// (echoing at most 256 characters of what the client sent).
    pub fn model_not_found(id: &str) -> Self {
        let shown: String = id.chars().take(256).collect();
        let ellipsis = if shown.len() < id.len() { "…" } else { "" };
        GatewayError::NotFound {
            message: format!(
                "The model `{shown}{ellipsis}` does not exist or you do not have access to it."
            ),
            code: "model_not_found",
        }
    }

    /// A 400 with a parameter name.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    /// HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            Self::InvalidRequest { .. } => 400,
            Self::InvalidVirtualKey(_) => 401,
            Self::BudgetExceeded { .. } => 402,
            Self::PermissionDenied(_) => 403,
            Self::NotFound { .. } => 404,
            Self::StreamGone { .. } => 410,
            Self::Misdirected(_) => 421,
            Self::MethodNotAllowed(_) => 405,
            Self::UpgradeRequired(_) => 426,
            Self::NotImplemented(_) => 501,
            Self::PayloadTooLarge { .. } => 413,
            Self::UriTooLong { .. } => 414,
            Self::HeaderTooLarge { .. } => 431,
            Self::RequestTimeout(_) => 408,
            Self::RateLimited { .. } => 429,
            Self::Overloaded { .. } | Self::NoRoute { .. } => 503,
            Self::UpstreamUnavailable { .. } => 502,
            Self::UpstreamTimeout(_) => 504,
            Self::Upstream { status, .. } => *status,
            Self::Internal(_) => 500,
        }
    }

    /// OpenAI `error.type`.
    pub fn openai_type(&self) -> &str {
        match self {
            Self::InvalidRequest { .. }
            | Self::NotFound { .. }
            | Self::StreamGone { .. }
            | Self::Misdirected(_)
            | Self::MethodNotAllowed(_)
            | Self::UpgradeRequired(_)
            | Self::NotImplemented(_)
            | Self::PayloadTooLarge { .. }
            | Self::UriTooLong { .. }
            | Self::HeaderTooLarge { .. }
            | Self::RequestTimeout(_) => "invalid_request_error",
            Self::InvalidVirtualKey(_) => "authentication_error",
            Self::PermissionDenied(_) => "permission_error",
            // OpenAI's type for an exhausted quota (429 there; 402 here, as a budget is not a
            // rate: retrying soon does not help).
            Self::BudgetExceeded { .. } => "insufficient_quota",
            Self::RateLimited { .. } => "rate_limit_error",
            Self::Overloaded { .. } | Self::NoRoute { .. } => "overloaded_error",
            Self::UpstreamUnavailable { .. } | Self::UpstreamTimeout(_) | Self::Internal(_) => {
                "api_error"
            }
            Self::Upstream { error_type, .. } => error_type,
        }
    }

    /// OpenAI `error.code`.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::InvalidRequest { .. } => Some("invalid_request"),
            Self::InvalidVirtualKey(_) => Some("invalid_api_key"),
            Self::PermissionDenied(_) => Some("model_not_allowed"),
            Self::BudgetExceeded { .. } => Some("budget_exceeded"),
            Self::NotFound { code, .. } | Self::StreamGone { code, .. } => Some(code),
            Self::Misdirected(_) => Some("misdirected_request"),
            Self::MethodNotAllowed(_) => Some("method_not_allowed"),
            Self::UpgradeRequired(_) => Some("websocket_not_supported"),
            Self::NotImplemented(_) => Some("not_implemented"),
            Self::PayloadTooLarge { .. } => Some("request_too_large"),
            Self::UriTooLong { .. } => Some("uri_too_long"),
            Self::HeaderTooLarge { reason, .. } => Some(reason),
            Self::RequestTimeout(_) => Some("request_timeout"),
            Self::RateLimited { reason, .. } | Self::Overloaded { reason, .. } => Some(reason),
            Self::NoRoute { .. } => Some("no_route_available"),
            Self::UpstreamUnavailable { .. } => Some("upstream_unavailable"),
            Self::UpstreamTimeout(_) => Some("upstream_timeout"),
            Self::Upstream { code, .. } => code.as_deref(),
            Self::Internal(_) => Some("internal_error"),
        }
    }

    /// The `param` field.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::InvalidRequest { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// `Retry-After`, when the client should come back.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Overloaded { retry_after, .. } => {
                Some(*retry_after)
            }
            Self::NoRoute { retry_after, .. }
            | Self::UpstreamUnavailable { retry_after, .. }
            | Self::Upstream { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Low-cardinality label for metrics and the access log's `outcome`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } => "invalid_request",
            Self::InvalidVirtualKey(_) => "unauthorized",
            Self::PermissionDenied(_) => "forbidden",
            Self::BudgetExceeded { .. } => "budget_exceeded",
            Self::NotFound { .. } => "not_found",
            Self::StreamGone { .. } => "stream_gone",
            Self::Misdirected(_) => "misdirected",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::UpgradeRequired(_) => "upgrade_required",
            Self::NotImplemented(_) => "not_implemented",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::UriTooLong { .. } => "uri_too_long",
            Self::HeaderTooLarge { reason, .. } => reason,
            Self::RequestTimeout(_) => "request_timeout",
            Self::RateLimited { reason, .. } | Self::Overloaded { reason, .. } => reason,
            Self::NoRoute { .. } => "no_route",
            Self::UpstreamUnavailable { .. } => "upstream_unavailable",
            Self::UpstreamTimeout(_) => "upstream_timeout",
            Self::Upstream { .. } => "upstream_error",
            Self::Internal(_) => "internal",
        }
    }

    /// The body this error takes for a client of `dialect`: OpenAI's full body
    /// ([`to_json`](Self::to_json), `code` included) where the dialect keeps it for the
    /// gateway's errors ([`crate::protocol::GatewayErrorBody`]), else the dialect's own
    /// error body with `param`.
    pub fn body_for(
        &self,
        dialect: crate::protocol::ClientDialect,
        param: Option<&str>,
    ) -> Vec<u8> {
        let budget = matches!(self, GatewayError::BudgetExceeded { .. });
        if dialect.wire().gateway_error_body.openai(budget) {
            self.to_json()
        } else {
            crate::protocol::error_body(
                dialect,
                self.status(),
                &self.to_string(),
                param,
                self.code(),
            )
        }
    }

    /// The OpenAI-style JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.openai_type(),
                "param": self.param(),
                "code": self.code(),
            }
        });
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{\"error\":{}}".to_vec())
    }
}

/// How one upstream attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// TCP/TLS connect failed or timed out.
    Connect,
    /// No response head within `first_byte_timeout_ms`.
    FirstByteTimeout,
    /// No first SSE data event within `first_event_timeout_ms`.
    FirstEventTimeout,
    /// A retryable status (408/409/429/5xx).
    Status(u16),
    /// The upstream answered against the protocol before its first event (a stream to a
    /// non-stream request, an unknown content coding, bad framing, an in-band error).
    Protocol,
    /// The connection failed, was reset or closed cleanly before the answer's first event
    /// (the same `protocol` label; retried under `retry.on: connection_reset`).
    Reset,
    /// The provider rejected the request as too long for the route's context window
    /// (see [`crate::engine::fallback::is_context_rejection`]): never retried on the route,
    /// it goes on to a larger route or a `context_fallback_models` model.
    ContextLength,
    /// The provider does not know the route's upstream model (a 404 naming the model or its
    /// deployment: retired, misspelled, not deployed in that region; Bedrock's 400 "invalid
    /// model identifier"): never retried, the route rests at once
    /// ([`crate::routing::health::RouteHealth::record_attempt_failure`]) and the request
    /// falls back.
    ModelNotFound,
}

impl AttemptFailure {
    /// Whether the provider was sent the whole request and was working on it when Sluice
    /// gave up waiting (a head or first-event timeout): it may bill the prompt, so a request
    /// that ends on it is metered at the route's cost ([`crate::outcome::Outcome::cost_only`]).
    pub fn provider_worked(self) -> bool {
        matches!(self, Self::FirstByteTimeout | Self::FirstEventTimeout)
    }

    /// Metric label (`reason`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::FirstByteTimeout => "first_byte_timeout",
            Self::FirstEventTimeout => "first_event_timeout",
            Self::Status(429) => "status_429",
            Self::Status(s) if s >= 500 => "status_5xx",
            Self::Status(_) => "status_4xx",
            Self::Protocol | Self::Reset => "protocol",
            Self::ContextLength => "context_length",
            Self::ModelNotFound => "model_not_found",
        }
    }
}

/// One failed attempt, kept in order in the request context.
#[derive(Debug, Clone)]
pub struct AttemptError {
    /// Provider id.
    pub provider: String,
    /// Upstream model.
    pub upstream_model: String,
    /// What went wrong.
    pub failure: AttemptFailure,
    /// Detail for the log (never provider keys).
    pub detail: String,
    /// Upstream `Retry-After`, if any.
    pub retry_after: Option<Duration>,
}

/// Parses a `Retry-After` header value (delta-seconds; HTTP dates are ignored).
pub fn parse_retry_after(v: &[u8]) -> Option<Duration> {
    let s = std::str::from_utf8(v).ok()?.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Parses a `retry-after-ms` header value (milliseconds, integer or decimal), as OpenAI
/// and Azure OpenAI send it beside `Retry-After` and OpenAI's SDKs read it first.
pub fn parse_retry_after_ms(v: &[u8]) -> Option<Duration> {
    let s = std::str::from_utf8(v).ok()?.trim();
    if let Ok(ms) = s.parse::<u64>() {
        return Some(Duration::from_millis(ms));
    }
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0 && *f < 1e12)
        .map(|f| Duration::from_secs_f64(f / 1000.0))
}

/// The wait an upstream answer asks for: its `retry-after-ms` (more precise) when it has
/// a readable one, else its `Retry-After` (delta-seconds).
pub fn upstream_retry_after(
    retry_after_ms: Option<&[u8]>,
    retry_after: Option<&[u8]>,
) -> Option<Duration> {
    retry_after_ms
        .and_then(parse_retry_after_ms)
        .or_else(|| retry_after.and_then(parse_retry_after))
}

/// Formats a `retry-after-ms` value: whole milliseconds, rounded up, at least 1.
pub fn retry_after_ms_header(d: Duration) -> String {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    ms.max(1).to_string()
}

/// Formats a `Retry-After` value: whole seconds, rounded up, at least 1.
pub fn retry_after_header(d: Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_and_status() {
        let e = GatewayError::invalid("missing `model`", Some("model"));
        assert_eq!(e.status(), 400);
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["message"], "missing `model`");
    }

    #[test]
    fn retry_after_round_trip() {
        assert_eq!(parse_retry_after(b" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(b"1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after_header(Duration::from_millis(1200)), "2");
        assert_eq!(retry_after_header(Duration::ZERO), "1");
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after_and_round_trips() {
        assert_eq!(
            parse_retry_after_ms(b"1500"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after_ms(b" 20.5 "),
            Some(Duration::from_micros(20_500))
        );
        assert_eq!(parse_retry_after_ms(b"soon"), None);
        assert_eq!(parse_retry_after_ms(b"-3"), None);
        assert_eq!(
            upstream_retry_after(Some(b"250"), Some(b"3")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            upstream_retry_after(Some(b"x"), Some(b"3")),
            Some(Duration::from_secs(3))
        );
        assert_eq!(upstream_retry_after(None, None), None);
        assert_eq!(retry_after_ms_header(Duration::from_millis(250)), "250");
        assert_eq!(retry_after_ms_header(Duration::from_micros(20_500)), "21");
        assert_eq!(retry_after_ms_header(Duration::ZERO), "1");
    }
}
