//! Anthropic's token-count request (`POST /v1/messages/count_tokens`,
//! <https://docs.anthropic.com/en/api/messages-count-tokens>): the client request decoder
//! and the upstream request encoder.
//!
//! Shape: a Messages request without `max_tokens`: `{"model","messages","system","tools",
//! "tool_choice","thinking"}` (plus Anthropic's newer `context_management`,
//! `output_config`, `output_format`, forwarded untouched); the answer is
//! `{"input_tokens": N}`. Members that only generation has (`max_tokens`, `stream`,
//! `temperature`, `metadata`, …) are accepted from the client, so that a client may send
//! its generation request as is, and dropped upstream, where Anthropic refuses them.

use serde_json::{Map, Value};

use super::super::json::decode_client;
use super::super::{invalid, ProtocolError, Request};
use super::{decode_fields, RequestIn};

/// The top-level members a token-count request forwards to an Anthropic upstream (every
/// member its API reference lists); the others are dropped.
pub const FORWARDED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "context_management",
    "output_config",
    "output_format",
];

/// Decodes a token-count client request into the canonical request, validated as a
/// Messages request is (blocks, tools, tool choice, thinking) except that `max_tokens` is
/// optional; `max_output_tokens` is `None` unless the client sent one.
///
/// # Errors
/// [`ProtocolError::InvalidRequest`] naming the field (malformed JSON, missing or empty
/// `messages`, unknown block types, …); [`ProtocolError::Unsupported`] for server tools,
/// `mcp_servers` and `container`, as for Messages.
pub fn decode_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let r: RequestIn = decode_client(body)?;
    if r.messages.is_empty() {
        return Err(invalid(
            "messages",
            "at least one message is required to count tokens",
        ));
    }
    decode_fields(r)
}

/// The upstream body of a token-count request: the members of `client` named in
/// [`FORWARDED_FIELDS`], as sent, with `model` replaced by `upstream_model`.
pub fn encode_request(client: &Map<String, Value>, upstream_model: &str) -> Vec<u8> {
    let mut out = Map::new();
    out.insert("model".into(), Value::String(upstream_model.to_string()));
    for key in FORWARDED_FIELDS.iter().filter(|k| **k != "model") {
        if let Some(v) = client.get(*key).filter(|v| !v.is_null()) {
            out.insert((*key).to_string(), v.clone());
        }
    }
    serde_json::to_vec(&Value::Object(out)).unwrap_or_else(|_| b"{}".to_vec())
}

/// The `input_tokens` of an upstream token-count answer (`{"input_tokens": N}`).
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when the body is not that shape.
pub fn decode_response(body: &[u8]) -> Result<u64, ProtocolError> {
    #[derive(serde::Deserialize)]
    struct CountOut {
        input_tokens: u64,
    }
    serde_json::from_slice::<CountOut>(body)
        .map(|c| c.input_tokens)
        .map_err(|e| ProtocolError::InvalidUpstream(format!("not a token-count answer ({e})")))
}

/// The client answer `{"input_tokens": N}`.
pub fn encode_response(input_tokens: u64) -> Vec<u8> {
    format!("{{\"input_tokens\":{input_tokens}}}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Part, ToolChoice};

    #[test]
    fn a_count_request_needs_no_max_tokens_but_generation_still_does() {
        let body = br#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],
            "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}"#;
        let r = decode_request(body).unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(r.system, vec!["s".to_string()]);
        assert_eq!(r.messages[0].parts, vec![Part::Text("hi".into())]);
        assert_eq!(r.tools[0].name, "f");
        assert_eq!(r.tool_choice, Some(ToolChoice::Required));
        assert_eq!(r.max_output_tokens, None);
        let e = super::super::decode_request(body).unwrap_err();
        assert_eq!(e.field(), Some("max_tokens"), "{e}");
    }

    #[test]
    fn bad_count_requests_name_the_field() {
        for (body, field) in [
            (&br#"{"model":"m"}"#[..], "body"),
            (br#"{"model":"m","messages":[]}"#, "messages"),
            (
                br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                br#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
                "messages[0].role",
            ),
        ] {
            let e = decode_request(body).unwrap_err();
            assert!(e.is_client_error(), "{e}");
            assert_eq!(e.field(), Some(field), "{e}");
        }
    }

    #[test]
    fn the_upstream_body_keeps_the_documented_members_only() {
        let client: Map<String, Value> = serde_json::from_str(
            r#"{"model":"std","max_tokens":10,"stream":true,"temperature":0.5,"metadata":{},
               "provider":{"order":["a"]},"system":"s","messages":[{"role":"user","content":"x"}],
               "tools":[],"tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":2000}}"#,
        )
        .unwrap();
        let out: Value = serde_json::from_slice(&encode_request(&client, "claude-up")).unwrap();
        let mut keys: Vec<&str> = out
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "messages",
                "model",
                "system",
                "thinking",
                "tool_choice",
                "tools"
            ]
        );
        assert_eq!(out["model"], "claude-up");
        assert_eq!(out["system"], "s");
    }

    #[test]
    fn answers_are_read_and_written_as_input_tokens() {
        assert_eq!(decode_response(br#"{"input_tokens":42}"#).unwrap(), 42);
        assert!(decode_response(br#"{"tokens":42}"#).is_err());
        assert!(decode_response(b"<html>").is_err());
        assert_eq!(encode_response(7), br#"{"input_tokens":7}"#);
    }
}
