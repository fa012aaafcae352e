//! Owns the OpenAI Chat Completions wire format on the upstream side
//! (<https://platform.openai.com/docs/api-reference/chat/create>): the request body sent to an
//! OpenAI-compatible provider, and normalizing any provider's error body into OpenAI's error
//! shape (<https://platform.openai.com/docs/guides/error-codes>).

use serde_json::{Map, Value};

/// Path of the endpoint under the base URL.
pub const CHAT_COMPLETIONS_PATH: &str = "/chat/completions";

/// Request fields that are Sluice's own and never go upstream.
pub const GATEWAY_FIELDS: &[&str] = &["provider"];

/// Serializes the client's request for an OpenAI-compatible provider: `model` replaced by the
/// upstream model, gateway-only fields removed, everything else as sent. With `ask_usage`
/// (a stream whose client did not ask for usage) `stream_options.include_usage` is set to
/// `true`, other `stream_options` members kept: metering needs the provider's final usage
/// chunk, which the stream pipe then removes from the client's stream.
///
/// # Errors
/// Only if serialization fails (it cannot for a parsed `Value`).
pub fn request_body(
    request: &Map<String, Value>,
    upstream_model: &str,
    ask_usage: bool,
) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::new(&mut out);
    use serde::ser::{SerializeMap, Serializer};
    let mut map = ser.serialize_map(None)?;
    let with_usage = |opts: Option<&Value>| {
        let mut o = opts.and_then(Value::as_object).cloned().unwrap_or_default();
        o.insert("include_usage".into(), Value::Bool(true));
        Value::Object(o)
    };
    for (k, v) in request {
        if GATEWAY_FIELDS.contains(&k.as_str()) {
            continue;
        }
        if k == "model" {
            map.serialize_entry(k, upstream_model)?;
        } else if ask_usage && k == "stream_options" {
            map.serialize_entry(k, &with_usage(Some(v)))?;
        } else {
            map.serialize_entry(k, v)?;
        }
    }
    if ask_usage && !request.contains_key("stream_options") {
        map.serialize_entry("stream_options", &with_usage(None))?;
    }
    map.end()?;
    Ok(out)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_gets_upstream_model_and_loses_gateway_fields() {
        let v: Value = serde_json::from_str(
            r#"{"model":"acme/x","provider":{"only":["a"]},"stream":true,"messages":[]}"#,
        )
        .unwrap();
        let out = request_body(v.as_object().unwrap(), "m-1", false).unwrap();
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back["model"], "m-1");
        assert!(back.get("provider").is_none());
        assert_eq!(back["stream"], true);
        assert!(back.get("stream_options").is_none());
    }

    #[test]
    fn asking_for_usage_sets_include_usage_and_keeps_other_stream_options() {
        let v: Value =
            serde_json::from_str(r#"{"model":"x","stream":true,"messages":[]}"#).unwrap();
        let back: Value =
            serde_json::from_slice(&request_body(v.as_object().unwrap(), "m", true).unwrap())
                .unwrap();
        assert_eq!(
            back["stream_options"],
            serde_json::json!({"include_usage": true})
        );
        let v: Value = serde_json::from_str(
            r#"{"model":"x","stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false}}"#,
        )
        .unwrap();
        let back: Value =
            serde_json::from_slice(&request_body(v.as_object().unwrap(), "m", true).unwrap())
                .unwrap();
        assert_eq!(
            back["stream_options"],
            serde_json::json!({"include_usage": true, "include_obfuscation": false})
        );
    }

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
