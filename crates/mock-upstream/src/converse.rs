//! AWS Bedrock's Converse API, byte for byte: `POST /model/{modelId}/converse` (a JSON
//! answer: `output.message.content`, `stopReason`, `usage`, `metrics`) and
//! `/model/{modelId}/converse-stream` (an `application/vnd.amazon.eventstream` body: one
//! binary event-stream message per event, `:event-type` naming it, the payload the event's
//! JSON with Bedrock's padding member `"p"`). The answer is the mock's Anthropic answer
//! (text, reasoning, tool calls, usage, failure knobs) recast into the Converse shape, event
//! by event; the signature check, the errors and the in-stream exceptions are
//! [`super::bedrock`]'s. The gate checks the body rules Bedrock enforces before running the
//! model ([`body_refusal`]).
//!
//! References: <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ContentBlock.html>.

use serde_json::{json, Map, Value};

use super::bedrock::{frame, padding};
use super::wire::ReplyMeta;

/// Top-level members of a Converse body (`mock` is the mock's own knob).
const MEMBERS: &[&str] = &[
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "promptVariables",
    "requestMetadata",
    "performanceConfig",
    "outputConfig",
    "mock",
];

/// Content block kinds of a message.
const BLOCKS: &[&str] = &[
    "text",
    "image",
    "document",
    "toolUse",
    "toolResult",
    "reasoningContent",
    "video",
    "guardContent",
    "cachePoint",
];

/// Why Bedrock refuses a Converse body (its `ValidationException` message), `None` when it
/// takes it: unknown members (`model`, `stream`, `anthropic_version`), no messages, a
/// conversation that does not start with the user or whose roles do not alternate, blocks
/// that are not one known member, blank text, an image format other than png/jpeg/gif/webp,
/// tool blocks without `toolConfig`, an `outputConfig` not in Bedrock's shape.
pub(crate) fn body_refusal(body: &Map<String, Value>) -> Option<String> {
    if let Some(k) = body.keys().find(|k| !MEMBERS.contains(&k.as_str())) {
        return Some(format!(
            "Malformed input request: #: extraneous key [{k}] is not permitted, please reformat your input and try again."
        ));
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Some("The model returned the following errors: messages: field required".into());
    };
    if messages.is_empty() {
        return Some("A conversation must start with a user message. Try again with a conversation that starts with a user message.".into());
    }
    let mut tool_blocks = false;
    let mut last_role = "";
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if i == 0 && role != "user" {
            return Some("A conversation must start with a user message. Try again with a conversation that starts with a user message.".into());
        }
        if role != "user" && role != "assistant" {
            return Some(format!("messages.{i}.role: must be user or assistant"));
        }
        if role == last_role {
            return Some("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.".into());
        }
        last_role = role;
        let blocks = m.get("content").and_then(Value::as_array);
        let Some(blocks) = blocks.filter(|b| !b.is_empty()) else {
            return Some(format!("The content field in the Message object at messages.{i} is empty. Add a ContentBlock object to the content field and try again."));
        };
        for (j, b) in blocks.iter().enumerate() {
            let keys: Vec<&str> = b
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            if keys.len() != 1 || !BLOCKS.contains(&keys[0]) {
                return Some(format!(
                    "messages.{i}.content.{j}: a ContentBlock has exactly one member of {BLOCKS:?}"
                ));
            }
            match keys[0] {
                "text" if b["text"].as_str().is_none_or(|t| t.trim().is_empty()) => {
                    return Some(format!("The text field in the ContentBlock object at messages.{i}.content.{j} is blank. Add text to the text field, and try again."));
                }
                "image" => {
                    let format = b["image"]["format"].as_str().unwrap_or("");
                    if !["png", "jpeg", "gif", "webp"].contains(&format)
                        || !b["image"]["source"]["bytes"].is_string()
                    {
                        return Some(format!("messages.{i}.content.{j}.image: format must be png, jpeg, gif or webp, with source.bytes"));
                    }
                }
                "toolUse" | "toolResult" => tool_blocks = true,
                _ => {}
            }
        }
    }
    if tool_blocks && !body.contains_key("toolConfig") {
        return Some("The toolConfig field must be defined when using toolUse and toolResult content blocks.".into());
    }
    body.get("outputConfig").and_then(output_config_refusal)
}

/// Why Bedrock refuses an `outputConfig` (structured output,
/// <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_OutputConfig.html>):
/// `textFormat` must be `{type: "json_schema", structure: {jsonSchema: {schema, name?,
/// description?}}}` with `schema` a string holding a JSON object.
fn output_config_refusal(config: &Value) -> Option<String> {
    let format = config.get("textFormat")?;
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Some("1 validation error detected: Value at 'outputConfig.textFormat.type' failed to satisfy constraint: Member must satisfy enum value set: [json_schema]".into());
    }
    let schema = format["structure"]["jsonSchema"]["schema"].as_str();
    match schema.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(_))) => None,
        Some(_) => Some("The JSON schema in outputConfig.textFormat.structure.jsonSchema.schema is not valid JSON. Fix the schema and try again.".into()),
        None => Some("1 validation error detected: Value at 'outputConfig.textFormat.structure.jsonSchema.schema' failed to satisfy constraint: Member must be a string".into()),
    }
}

/// A Bedrock tool-use id for the mock's Anthropic one (`toolu_…` → `tooluse_…`).
fn tool_use_id(id: &str) -> String {
    match id.strip_prefix("toolu_") {
        Some(rest) => format!("tooluse_{rest}"),
        None => id.to_string(),
    }
}

/// The Converse `usage` of the answer: `inputTokens` without the cached ones (as Bedrock
/// counts them), the cache members when the mock has cache reads or writes.
fn usage(m: &ReplyMeta, output_tokens: u64) -> Value {
    let read = m.cached_tokens.unwrap_or(0);
    let write = m.cache_write_tokens;
    let input = m.prompt_tokens - read - write;
    let mut u = json!({
        "inputTokens": input,
        "outputTokens": output_tokens,
        "totalTokens": input + output_tokens + read + write,
    });
    if m.cached_tokens.is_some() || write > 0 {
        u["cacheReadInputTokens"] = read.into();
        u["cacheWriteInputTokens"] = write.into();
    }
    u
}

/// The Converse answer for the mock's Anthropic `message` JSON.
pub(crate) fn answer(m: &ReplyMeta, anthropic: &str) -> String {
    let msg: Value = serde_json::from_str(anthropic).unwrap_or_default();
    let mut content = Vec::new();
    for b in msg["content"].as_array().into_iter().flatten() {
        match b["type"].as_str() {
            Some("thinking") => content.push(json!({"reasoningContent": {"reasoningText": {
                "text": b["thinking"], "signature": b["signature"]}}})),
            Some("text") => content.push(json!({"text": b["text"]})),
            Some("tool_use") => content.push(json!({"toolUse": {
                "toolUseId": tool_use_id(b["id"].as_str().unwrap_or("")),
                "name": b["name"],
                "input": b["input"],
            }})),
            _ => {}
        }
    }
    let output_tokens = msg["usage"]["output_tokens"].as_u64().unwrap_or(0);
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": m.finish_reason,
        "usage": usage(m, output_tokens),
        "metrics": {"latencyMs": 120},
    })
    .to_string()
}

/// One Converse event message: `:event-type` `name`, the JSON `event` with padding.
fn event(name: &str, event: &Value) -> Vec<u8> {
    let mut payload = event.to_string();
    // `{...}` → `{...,"p":"…"}`, the padding Bedrock adds to every event.
    payload.pop();
    if payload.len() > 1 {
        payload.push(',');
    }
    payload.push_str(&format!("\"p\":\"{}\"}}", padding(payload.len())));
    frame(
        &[
            (":event-type", name),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.into_bytes(),
    )
}

/// The ConverseStream messages for one of the mock's Anthropic events (`name`, `data`):
/// none for `ping`, `message_stop` and a text block's start, `messageStop` plus `metadata`
/// for `message_delta`, one message for the others.
pub(crate) fn stream_messages(m: &ReplyMeta, name: Option<&str>, data: &str) -> Vec<u8> {
    let ev: Value = serde_json::from_str(data).unwrap_or_default();
    let index = ev["index"].as_u64().unwrap_or(0);
    match name.or(ev["type"].as_str()) {
        Some("message_start") => event("messageStart", &json!({"role": "assistant"})),
        Some("content_block_start") if ev["content_block"]["type"] == "tool_use" => event(
            "contentBlockStart",
            &json!({"start": {"toolUse": {
                "toolUseId": tool_use_id(ev["content_block"]["id"].as_str().unwrap_or("")),
                "name": ev["content_block"]["name"],
            }}, "contentBlockIndex": index}),
        ),
        Some("content_block_delta") => {
            let d = &ev["delta"];
            let delta = match d["type"].as_str() {
                Some("text_delta") => json!({"text": d["text"]}),
                Some("thinking_delta") => json!({"reasoningContent": {"text": d["thinking"]}}),
                Some("signature_delta") => {
                    json!({"reasoningContent": {"signature": d["signature"]}})
                }
                Some("input_json_delta") if d["partial_json"] != "" => {
                    json!({"toolUse": {"input": d["partial_json"]}})
                }
                _ => return Vec::new(),
            };
            event(
                "contentBlockDelta",
                &json!({"delta": delta, "contentBlockIndex": index}),
            )
        }
        Some("content_block_stop") => {
            event("contentBlockStop", &json!({"contentBlockIndex": index}))
        }
        Some("message_delta") => {
            let mut out = event(
                "messageStop",
                &json!({"stopReason": ev["delta"]["stop_reason"]}),
            );
            let output_tokens = ev["usage"]["output_tokens"].as_u64().unwrap_or(0);
            out.extend(event(
                "metadata",
                &json!({"usage": usage(m, output_tokens), "metrics": {"latencyMs": 120}}),
            ));
            out
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_bedrock_refuses() {
        let ok = json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "inferenceConfig": {"maxTokens": 5}});
        assert_eq!(body_refusal(ok.as_object().unwrap()), None);
        for bad in [
            json!({"model": "x", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}),
            json!({"messages": []}),
            json!({"messages": [{"role": "assistant", "content": [{"text": "hi"}]}]}),
            json!({"messages": [{"role": "user", "content": [{"text": "a"}]},
                                {"role": "user", "content": [{"text": "b"}]}]}),
            json!({"messages": [{"role": "user", "content": [{"text": " "}]}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
            json!({"messages": [{"role": "user", "content": [{"toolResult": {}}]}]}),
        ] {
            assert!(body_refusal(bad.as_object().unwrap()).is_some(), "{bad}");
        }
    }

    #[test]
    fn events_are_framed_with_their_type_and_padding() {
        let bytes = event("messageStart", &json!({"role": "assistant"}));
        let msg = aws_smithy_eventstream::frame::read_message_from(&mut &bytes[..]).unwrap();
        let payload: Value = serde_json::from_slice(msg.payload()).unwrap();
        assert_eq!(payload["role"], "assistant");
        assert!(payload["p"].is_string());
        assert!(msg
            .headers()
            .iter()
            .any(|h| h.name().as_str() == ":event-type"
                && h.value().as_string().map(|s| s.as_str()) == Ok("messageStart")));
    }

    fn refusal(body: &Value) -> Option<String> {
        body_refusal(body.as_object().expect("object"))
    }

    #[test]
    fn tool_blocks_need_a_tool_config_and_output_config_is_checked() {
        let history = json!([
            {"role": "user", "content": [{"text": "weather?"}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "w", "input": {}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "sun"}]}}]}]);
        assert_eq!(
            refusal(&json!({"messages": history})).as_deref(),
            Some("The toolConfig field must be defined when using toolUse and toolResult content blocks.")
        );
        let tools = json!({"tools": [{"toolSpec": {"name": "w", "inputSchema": {"json": {"type": "object"}}}}]});
        assert_eq!(
            refusal(&json!({"messages": history, "toolConfig": tools})),
            None
        );

        let hi = json!([{"role": "user", "content": [{"text": "hi"}]}]);
        let format = |f: Value| json!({"messages": hi, "outputConfig": {"textFormat": f}});
        let good = json!({"type": "json_schema", "structure": {"jsonSchema":
            {"schema": "{\"type\":\"object\"}", "name": "out"}}});
        assert_eq!(refusal(&format(good)), None);
        for bad in [
            json!({"type": "json_object"}),
            json!({"type": "json_schema", "structure": {"jsonSchema": {"schema": {"type": "object"}}}}),
            json!({"type": "json_schema", "structure": {"jsonSchema": {"schema": "{not json"}}}),
        ] {
            assert!(refusal(&format(bad.clone())).is_some(), "{bad}");
        }
    }
}
