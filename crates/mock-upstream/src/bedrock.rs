//! AWS Bedrock's runtime API, byte for byte: `POST /model/{modelId}/invoke` (an Anthropic
//! Messages JSON answer) and `/model/{modelId}/invoke-with-response-stream` (an
//! `application/vnd.amazon.eventstream` body: one binary event-stream message per Anthropic
//! event, `:event-type: chunk`, payload `{"bytes":"<base64 event JSON>","p":"<padding>"}`;
//! in-stream failures as `:message-type: exception` messages), every request's SigV4
//! signature verified by the mock's own implementation ([`super::sigv4`]), Bedrock's body
//! rules for Claude (`anthropic_version: "bedrock-2023-05-31"` required, no `model` or
//! `stream` member) and its error answers (`x-amzn-ErrorType` header, `{"message": ...}`
//! body). `POST /model/{modelId}/converse` and `/converse-stream` (every other model) are
//! [`super::converse`]'s: the same signature check and errors, the Converse body and events.
//!
//! References: <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html>.

use std::time::SystemTime;

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use serde_json::Value;

use super::h1::Request;
use super::sigv4;

/// A Bedrock runtime call: `(model id, stream)` from `/model/{id}/invoke`,
/// `/model/{id}/invoke-with-response-stream`, `/model/{id}/converse` or
/// `/model/{id}/converse-stream`, the id percent-decoded.
pub(crate) fn invoke_method(req: &Request) -> Option<(String, bool)> {
    let rest = req.path().strip_prefix("/model/")?;
    let (id, method) = rest.split_once('/')?;
    let stream = match method {
        "invoke" | "converse" => false,
        "invoke-with-response-stream" | "converse-stream" => true,
        _ => return None,
    };
    Some((percent_decode(id), stream))
}

/// Whether `req` is a Converse call (`/converse` or `/converse-stream`).
pub(crate) fn is_converse(req: &Request) -> bool {
    let path = req.path();
    path.starts_with("/model/")
        && (path.ends_with("/converse") || path.ends_with("/converse-stream"))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hexval = |c: u8| char::from(c).to_digit(16);
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An error answer: `(status, x-amzn-ErrorType, body)`.
pub(crate) type BedrockError = (u16, String, String);

/// Bedrock's error body: `{"message": ...}`.
pub(crate) fn error_body(message: &str) -> String {
    serde_json::json!({ "message": message }).to_string()
}

/// The exception name of an HTTP error status, as `x-amzn-ErrorType` carries it.
pub(crate) fn error_type_for(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// Bedrock's default message for an error status.
pub(crate) fn default_message(status: u16) -> String {
    match status {
        400 => "Malformed input request, please reformat your input and try again.".into(),
        403 => "You don't have access to the model with the specified model ID.".into(),
        404 => "The provided model identifier is invalid.".into(),
        408 => "Model has timed out in processing the request.".into(),
        424 => "The model returned an error while processing the request.".into(),
        429 => "Too many requests, please wait before trying again.".into(),
        503 => "Bedrock is unable to process your request.".into(),
        s => format!("The server encountered an internal error (mock status {s})."),
    }
}

/// What Bedrock answers before running the model: the signature check (403s), then the
/// Claude body rules (400 `ValidationException`).
pub(crate) fn gate(req: &Request, body: Option<&Value>, now: SystemTime) -> Option<BedrockError> {
    if let Err(r) = sigv4::verify(
        &req.method,
        &req.target,
        &req.headers,
        &req.body,
        "bedrock",
        now,
        sigv4::IDENTITIES,
    ) {
        return Some((403, r.error_type.to_string(), error_body(&r.message)));
    }
    let validation = |m: &str| Some((400, "ValidationException".to_string(), error_body(m)));
    let Some(obj) = body.and_then(Value::as_object) else {
        return validation("Malformed input request: expected a JSON object, please reformat your input and try again.");
    };
    if is_converse(req) {
        return super::converse::body_refusal(obj).and_then(|m| validation(&m));
    }
    for extraneous in ["model", "stream"] {
        if obj.contains_key(extraneous) {
            return validation(&format!(
                "Malformed input request: #: extraneous key [{extraneous}] is not permitted, please reformat your input and try again."
            ));
        }
    }
    match obj.get("anthropic_version").and_then(Value::as_str) {
        Some("bedrock-2023-05-31") => None,
        Some(v) => validation(&format!("invalid anthropic_version `{v}`: the only supported value is bedrock-2023-05-31")),
        None => validation("Malformed input request: #: required key [anthropic_version] not found, please reformat your input and try again."),
    }
}

/// The padding member Bedrock adds to each payload, of a length that varies by event.
pub(crate) fn padding(n: usize) -> &'static str {
    const P: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    &P[..(n * 7) % P.len()]
}

/// One event-stream message with string headers.
pub(crate) fn frame(headers: &[(&str, &str)], payload: Vec<u8>) -> Vec<u8> {
    let headers = headers
        .iter()
        .map(|(k, v)| {
            Header::new(
                (*k).to_string(),
                HeaderValue::String((*v).to_string().into()),
            )
        })
        .collect();
    let msg = Message::new_from_parts(headers, payload);
    let mut out = Vec::with_capacity(128);
    // Writing to a Vec fails only for a message over the format's limits (16 MiB).
    let _ = write_message_to(&msg, &mut out);
    out
}

/// The `chunk` message carrying one Anthropic stream event's data JSON.
pub(crate) fn chunk_message(event_json: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(event_json.as_bytes());
    let payload = format!(r#"{{"bytes":"{b64}","p":"{}"}}"#, padding(event_json.len()));
    frame(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.into_bytes(),
    )
}

/// An in-stream exception message (`modelStreamErrorException`, `throttlingException`,
/// `internalServerException`, ...).
pub(crate) fn exception_message(exception_type: &str, message: &str) -> Vec<u8> {
    frame(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        error_body(message).into_bytes(),
    )
}

/// The in-stream exception name of an error status (camel case, as the stream sends it).
pub(crate) fn exception_type_for(status: u16) -> &'static str {
    match status {
        429 => "throttlingException",
        503 => "serviceUnavailableException",
        408 => "modelTimeoutException",
        400 => "validationException",
        424 => "modelStreamErrorException",
        _ => "internalServerException",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_messages_decode_with_the_crate_and_carry_base64_json() {
        let bytes = chunk_message(r#"{"type":"ping"}"#);
        let msg = aws_smithy_eventstream::frame::read_message_from(&mut &bytes[..]).unwrap();
        let payload: Value = serde_json::from_slice(msg.payload()).unwrap();
        let b64 = payload["bytes"].as_str().unwrap();
        let json = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(json, br#"{"type":"ping"}"#);
        assert!(payload["p"].is_string());
        let e = exception_message("throttlingException", "slow down");
        let msg = aws_smithy_eventstream::frame::read_message_from(&mut &e[..]).unwrap();
        assert!(msg
            .headers()
            .iter()
            .any(|h| h.name().as_str() == ":message-type"
                && h.value().as_string().map(|s| s.as_str()) == Ok("exception")));
    }

    #[test]
    fn errors_are_named_by_status() {
        assert_eq!(error_type_for(429), "ThrottlingException");
        assert_eq!(error_type_for(400), "ValidationException");
        assert_eq!(error_type_for(500), "InternalServerException");
        assert_eq!(exception_type_for(424), "modelStreamErrorException");
        assert_eq!(
            percent_decode("us.anthropic.c-v1%3A0"),
            "us.anthropic.c-v1:0"
        );
    }
}
