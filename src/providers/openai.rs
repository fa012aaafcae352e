//! Owns the OpenAI Chat Completions wire format on the upstream side
//! (<https://platform.openai.com/docs/api-reference/chat/create>): its endpoint path, and
//! reading an OpenAI-shaped error body
//! (<https://platform.openai.com/docs/guides/error-codes>).

use std::borrow::Cow;

use pingora::http::RequestHeader;
use serde_json::Value;

use super::adapter::{Adapter, Credential};
use crate::config::Provider;
use crate::protocol::Dialect;

/// Path of the endpoint under the base URL.
pub const CHAT_COMPLETIONS_PATH: &str = "/chat/completions";

/// Extracts `(type, code, message)` from an upstream error body in OpenAI's shape
/// (`{"error":{"message","type","code"}}`), or a plain-text/other-JSON body.
pub fn error_parts(status: u16, body: &[u8]) -> (String, Option<String>, String) {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let err = v.get("error").unwrap_or(&v);
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| err.as_str())
            .map(str::to_string);
        if let Some(message) = message {
            let etype = err
                .get("type")
                .and_then(Value::as_str)
                .map_or_else(|| default_type(status).to_string(), str::to_string);
            let code = err.get("code").and_then(|c| match c {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            });
            return (etype, code, message);
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let cut: String = text.chars().take(512).collect();
    let message = if cut.is_empty() {
        format!("upstream returned HTTP {status}")
    } else {
        format!("upstream returned HTTP {status}: {cut}")
    };
    (default_type(status).to_string(), None, message)
}

/// The OpenAI error type for a status.
pub fn default_type(status: u16) -> &'static str {
    match status {
        400 | 404 | 409 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "api_error",
    }
}

/// The adapter of `kind: openai`: OpenAI-compatible Chat Completions, `Authorization:
/// Bearer` with the provider key.
#[derive(Debug)]
pub struct OpenAi;

impl Adapter for OpenAi {
    fn base_dialect(&self) -> Dialect {
        Dialect::ChatCompletions
    }

    fn path(&self, _: &Provider, _: &str, _: bool) -> Cow<'static, str> {
        CHAT_COMPLETIONS_PATH.into()
    }

    fn authorize(
        &self,
        provider: &Provider,
        _: &Credential,
        req: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        authorize_bearer(provider, req)
    }
}

/// `Authorization: Bearer` with the provider key, when it has one.
///
/// # Errors
/// If the key is not a valid header value.
pub fn authorize_bearer(provider: &Provider, req: &mut RequestHeader) -> pingora::Result<()> {
    if let Some(k) = &provider.api_key {
        req.insert_header("authorization", format!("Bearer {}", k.expose()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shapes() {
        let (t, c, m) = error_parts(429, br#"{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#);
        assert_eq!(
            (t.as_str(), c.as_deref(), m.as_str()),
            ("rate_limit_error", Some("rate_limit_exceeded"), "slow down")
        );
        let (t, c, m) = error_parts(502, b"Bad Gateway");
        assert_eq!(
            (t.as_str(), c, m.as_str()),
            ("api_error", None, "upstream returned HTTP 502: Bad Gateway")
        );
    }
}
