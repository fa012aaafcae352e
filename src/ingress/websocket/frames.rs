//! Owns the JSON of the messages Sluice itself sends on a Responses WebSocket: the `error`
//! event (OpenAI's WebSocket error shape, `openai` SDK 3.57.0 `ResponseWsError`:
//! `{"type":"error","status":N,"error":{"type","code","message","param"}}`, `status` the
//! HTTP status the same request would have had), the echo of a `stream_id` in each event of
//! a response created with one, and the bounded `type` label of
//! `sluice_websocket_messages_total`.

use serde_json::{json, Map, Value};
use tungstenite::Utf8Bytes;

use crate::error::GatewayError;

/// An `error` event with `status` whose `error` member is `error` (an object with `type`,
/// `code`, `message`, `param`), echoing `stream_id` when the request had one.
pub fn error_event(status: u16, error: Value, stream_id: Option<&str>) -> Utf8Bytes {
    let mut ev = Map::new();
    ev.insert("type".into(), "error".into());
    ev.insert("status".into(), status.into());
    ev.insert("error".into(), error);
    if let Some(s) = stream_id {
        ev.insert("stream_id".into(), s.into());
    }
    Utf8Bytes::from(Value::Object(ev).to_string())
}

/// The `error` event of a refusal Sluice decided itself.
pub fn gateway_error(e: &GatewayError, stream_id: Option<&str>) -> Utf8Bytes {
    let mut error = json!({
        "type": e.openai_type(),
        "code": e.code(),
        "message": e.to_string(),
        "param": e.param(),
    });
    if let Some(after) = e.retry_after() {
        error["headers"] = json!({"retry-after": after.as_secs().max(1).to_string()});
    }
    error_event(e.status(), error, stream_id)
}

/// An `error` event of Sluice's own with an explicit `code` (400 unless said otherwise).
pub fn own_error(
    status: u16,
    code: &str,
    message: &str,
    param: Option<&str>,
    stream_id: Option<&str>,
) -> Utf8Bytes {
    let kind = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    error_event(
        status,
        json!({"type": kind, "code": code, "message": message, "param": param}),
        stream_id,
    )
}

/// The `error` event of a refused HTTP answer: the JSON error body the subrequest wrote
/// (`{"error":{...}}`) with its `status`, and its `Retry-After` (seconds) as
/// `error.headers`. An unknown `previous_response_id` (a 400 naming it) gets OpenAI's code
/// `previous_response_not_found`.
pub fn http_error(
    status: u16,
    body: &[u8],
    retry_after: Option<&str>,
    stream_id: Option<&str>,
) -> Utf8Bytes {
    let mut error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut("error").map(Value::take))
        .filter(Value::is_object)
        .unwrap_or_else(|| {
            json!({
                "type": if status >= 500 { "server_error" } else { "invalid_request_error" },
                "code": null,
                "message": String::from_utf8_lossy(body),
                "param": null,
            })
        });
    if status == 400 && error["param"] == "previous_response_id" {
        error["code"] = "previous_response_not_found".into();
    }
    if let Some(r) = retry_after {
        error["headers"] = json!({"retry-after": r});
    }
    error_event(status, error, stream_id)
}

/// `data` (one event's JSON object) with `"stream_id":…` added as its first member; `data`
/// unchanged when it is not an object.
pub fn with_stream_id(data: &[u8], stream_id: &str) -> Vec<u8> {
    let start = data.iter().position(|b| !b.is_ascii_whitespace());
    let Some(i) = start.filter(|&i| data[i] == b'{') else {
        return data.to_vec();
    };
    let id = crate::sse::json_string(stream_id);
    let mut out = Vec::with_capacity(data.len() + id.len() + 16);
    out.extend_from_slice(&data[..=i]);
    out.extend_from_slice(b"\"stream_id\":");
    out.extend_from_slice(id.as_bytes());
    let rest = &data[i + 1..];
    if rest.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}

/// The event types of the Responses API's stream
/// (<https://platform.openai.com/docs/api-reference/responses-streaming>) that label
/// `sluice_websocket_messages_total{direction="server"}` by name; any other is `other`.
const SERVER_TYPES: &[&str] = &[
    "error",
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.output_text.annotation.added",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
];

/// The `type` label of a server event named `name`.
pub fn server_label(name: &str) -> &'static str {
    SERVER_TYPES
        .iter()
        .find(|t| **t == name)
        .copied()
        .unwrap_or("other")
}

/// The `type` of an event's JSON `data`, found without parsing the whole event when it is
/// the first member (Sluice's and OpenAI's events start with it); `None` otherwise.
pub fn event_type(data: &[u8]) -> Option<&str> {
    let rest = data.trim_ascii_start().strip_prefix(b"{\"type\":\"")?;
    let end = memchr::memchr(b'"', rest)?;
    std::str::from_utf8(&rest[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_are_spliced_into_objects() {
        assert_eq!(
            with_stream_id(br#"{"type":"x"}"#, "lane"),
            br#"{"stream_id":"lane","type":"x"}"#
        );
        assert_eq!(with_stream_id(b" {}", "a"), br#" {"stream_id":"a"}"#);
        assert_eq!(with_stream_id(b"[1]", "a"), b"[1]");
    }

    #[test]
    fn http_errors_keep_the_body_and_name_a_lost_previous_response() {
        let body = br#"{"error":{"message":"Previous response with id 'r' not found.","type":"invalid_request_error","param":"previous_response_id","code":null}}"#;
        let ev: Value = serde_json::from_str(&http_error(400, body, None, None)).unwrap();
        assert_eq!(ev["type"], "error");
        assert_eq!(ev["status"], 400);
        assert_eq!(ev["error"]["code"], "previous_response_not_found");
        let ev: Value =
            serde_json::from_str(&http_error(429, b"{}", Some("3"), Some("l"))).unwrap();
        assert_eq!(
            (
                &ev["error"]["headers"]["retry-after"],
                &ev["stream_id"],
                &ev["error"]["type"]
            ),
            (&json!("3"), &json!("l"), &json!("invalid_request_error"))
        );
    }

    #[test]
    fn event_types_label_known_names_only() {
        assert_eq!(
            event_type(br#"{"type":"response.completed","x":1}"#),
            Some("response.completed")
        );
        assert_eq!(event_type(br#"{"x":1}"#), None);
        assert_eq!(
            server_label("response.output_text.delta"),
            "response.output_text.delta"
        );
        assert_eq!(server_label("made.up"), "other");
    }
}
