//! Owns what OpenAI Chat Completions is on the wire besides its request and response
//! bodies: what its clients get from Sluice itself ([`WIRE`]), its same-dialect fast path
//! ([`FAST_PATH`]), its OpenAI-shaped error body
//! (<https://platform.openai.com/docs/guides/error-codes>, [`error_parts`]) and the keys
//! that carry its generated text ([`TEXT_KEYS`]).

use serde_json::Value;

use crate::protocol::wire::{ClientWire, FastPath, Finish, GatewayErrorBody, InBandError};
use crate::protocol::wire::{RequestedUsage, Terminal};
use crate::protocol::ErrorKind;
use crate::sse::{self, ModelPath};

/// What a Chat Completions client gets from Sluice itself.
pub static WIRE: ClientWire = ClientWire {
    heartbeat: sse::KEEPALIVE_COMMENT,
    gateway_error_body: GatewayErrorBody::OpenAi,
    openai_error_frame: true,
    keeps_529: false,
    fast_path: Some(&FAST_PATH),
};

/// Chat Completions in and out: chunks end with `data: [DONE]`, finish with a chunk that
/// has a `finish_reason`, name the model in their top-level `model`; an in-band error is
/// an `event: error` or a `data: {"error":…}`; usage Sluice asked for
/// (`stream_options.include_usage`) comes as a last usage-only chunk and a `"usage":null`
/// member ending every other chunk.
pub static FAST_PATH: FastPath = FastPath {
    terminal: Terminal::Done,
    terminator: b"data: [DONE]\n\n",
    keepalive: None,
    error_event: "error",
    error_events: &[],
    error_data_prefix: Some(b"{\"error\""),
    decode_error: in_band_error,
    has_content: sse::has_content,
    finish: Finish::Probe(sse::has_finish_reason),
    requested_usage: Some(RequestedUsage {
        usage_only_chunk: sse::is_usage_only_chunk,
        null_usage_end: b",\"usage\":null}\n\n",
    }),
    stream_model: ModelPath::CHAT_COMPLETIONS,
    body_model: ModelPath::CHAT_COMPLETIONS,
    forwarding: None,
};

/// The members that carry generated text in Chat Completions chunks and bodies
/// (`content`, `reasoning_content`, `reasoning`, `refusal`, tool-call `arguments`), most
/// frequent first.
pub const TEXT_KEYS: &[&[u8]] = &[
    b"\"content\"",
    b"\"reasoning_content\"",
    b"\"arguments\"",
    b"\"reasoning\"",
    b"\"refusal\"",
];

/// An in-band error event of an OpenAI-compatible stream: its own type kept, kind `Api`.
#[cold]
fn in_band_error(data: &[u8]) -> InBandError {
    let (error_type, _, message) = error_parts(502, data);
    InBandError {
        kind: ErrorKind::Api,
        error_type,
        message,
    }
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
