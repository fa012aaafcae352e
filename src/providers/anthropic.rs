//! OpenAI Chat Completions ⇄ Anthropic Messages translation (pure logic, no I/O).
//!
//! Sluice exposes an OpenAI-compatible `POST /v1/chat/completions`. When the
//! selected provider has `kind: anthropic`, the gateway's attempt loop uses this
//! module to:
//!
//! * turn the client's OpenAI request body into an Anthropic Messages request
//!   body ([`chat_request_to_messages`]), sent to `{base_url}`[`MESSAGES_PATH`]
//!   with the `anthropic-version: `[`ANTHROPIC_VERSION`] header;
//! * turn a non-streaming Anthropic `message` into an OpenAI `chat.completion`
//!   ([`messages_response_to_chat`]);
//! * turn an Anthropic SSE stream, event by event, into OpenAI
//!   `chat.completion.chunk` SSE events terminated by `data: [DONE]`
//!   ([`StreamTranslator`]);
//! * map Anthropic error responses onto OpenAI error types
//!   ([`error_to_openai`]).
//!
//! It owns nothing else: HTTP, SSE framing of the *upstream* byte stream
//! (splitting into `event:`/`data:` fields), retries and metrics live in the
//! gateway.
//!
//! Wire formats:
//! * Anthropic Messages: <https://docs.anthropic.com/en/api/messages>
//! * Anthropic streaming: <https://docs.anthropic.com/en/api/messages-streaming>
//! * Anthropic errors: <https://docs.anthropic.com/en/api/errors>
//! * OpenAI Chat Completions: <https://platform.openai.com/docs/api-reference/chat/create>
//! * OpenAI streaming chunks: <https://platform.openai.com/docs/api-reference/chat/streaming>
//!
//! Deliberately not translated (dropped silently): `logprobs`, `top_logprobs`,
//! `response_format`, `seed`, `presence_penalty`, `frequency_penalty`,
//! `logit_bias`, `reasoning_effort`, `service_tier`, `store`, `metadata`,
//! `stream_options` (use [`stream_include_usage`] to read it), message `name`s.
//! `n > 1`, the legacy `functions` field and the `function` role are rejected
//! with [`TranslateError::Unsupported`].
#![warn(missing_docs)]

use std::borrow::Cow;
use std::fmt;

use bytes::{BufMut, BytesMut};
use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Value of the `anthropic-version` request header the gateway must send.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Path of the Messages endpoint, appended to a provider `base_url` that
/// already ends with `/v1` (e.g. `https://api.anthropic.com/v1`).
pub const MESSAGES_PATH: &str = "/messages";

/// `max_tokens` sent upstream when the client gives neither `max_tokens` nor
/// `max_completion_tokens` (Anthropic requires the field).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Translation failure.
///
/// [`InvalidRequest`](TranslateError::InvalidRequest) and
/// [`Unsupported`](TranslateError::Unsupported) are client errors (the gateway
/// answers with an OpenAI-style 400 whose `param` is [`TranslateError::field`]).
/// [`InvalidUpstream`](TranslateError::InvalidUpstream) means the provider sent
/// something unparseable (a 502 for the client), and
/// [`Upstream`](TranslateError::Upstream) carries an error reported by the
/// provider itself (an `error` SSE event or an error body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// The OpenAI request is malformed; `field` is a JSON path such as
    /// `messages[2].content[0].image_url`.
    #[error("invalid `{field}`: {reason}")]
    InvalidRequest {
        /// JSON path of the offending request field.
        field: String,
        /// Human-readable explanation.
        reason: String,
    },
    /// The OpenAI request is valid but uses something Anthropic cannot do
    /// (e.g. `n > 1`, audio input).
    #[error("unsupported `{field}`: {reason}")]
    Unsupported {
        /// JSON path of the offending request field.
        field: String,
        /// Human-readable explanation.
        reason: String,
    },
    /// The upstream response (body or stream event) could not be parsed.
    #[error("malformed upstream response: {0}")]
    InvalidUpstream(String),
    /// The upstream reported an error, e.g. an `event: error` in the stream
    /// (`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`).
    /// `error_type` is already mapped to an OpenAI error type (see
    /// [`error_to_openai`]).
    #[error("upstream error ({error_type}): {message}")]
    Upstream {
        /// OpenAI error type (e.g. `overloaded_error`, `api_error`).
        error_type: String,
        /// Upstream error message.
        message: String,
    },
    /// Writing the output JSON failed (should not happen; kept instead of a panic).
    #[error("internal translation error: {0}")]
    Internal(String),
}

impl TranslateError {
    /// The offending request field for client errors, `None` otherwise.
    pub fn field(&self) -> Option<&str> {
        match self {
            TranslateError::InvalidRequest { field, .. }
            | TranslateError::Unsupported { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Whether this error is the client's fault (maps to HTTP 400).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            TranslateError::InvalidRequest { .. } | TranslateError::Unsupported { .. }
        )
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::Unsupported {
        field: field.into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------
// Request: OpenAI chat.completions -> Anthropic messages
// ---------------------------------------------------------------------------

/// Whether the OpenAI request asked for a final usage chunk
/// (`stream_options.include_usage == true`); pass it to [`StreamTranslator::new`].
pub fn stream_include_usage(openai_request: &Value) -> bool {
    openai_request
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Builds the Anthropic Messages request body (JSON bytes) from an OpenAI
/// Chat Completions request.
///
/// * `system`/`developer` messages → top-level `system` (joined with a blank line);
/// * `user`/`assistant`/`tool` messages → `messages` with content blocks
///   (`text`, `image` from `data:` or http(s) URLs, `document` from PDF
///   `file_data`, `tool_use` from assistant `tool_calls`, `tool_result` from
///   `tool` messages); consecutive same-role turns are merged because
///   Anthropic requires alternation (tool results become `user` turns);
/// * `tools`/`tool_choice`/`parallel_tool_calls` → `tools`/`tool_choice`;
/// * `max_completion_tokens` or `max_tokens` → `max_tokens`
///   (default [`DEFAULT_MAX_TOKENS`]); `temperature` (clamped to Anthropic's
///   `0..=1`), `top_p`, `stop` → `stop_sequences`, `stream`,
///   `user` → `metadata.user_id`; `model` = `upstream_model`;
/// * `mock` (the test mock's steering field), `provider` and unsupported OpenAI
///   fields are dropped: nothing a client adds for a mock reaches a real provider.
///
/// # Errors
/// [`TranslateError::InvalidRequest`] for malformed input (wrong types,
/// missing `messages`, bad tool-call `arguments` JSON, …) and
/// [`TranslateError::Unsupported`] for `n > 1`, audio/unknown content parts,
/// non-function tools, the legacy `functions` API.
pub fn chat_request_to_messages(
    openai_request: &Value,
    upstream_model: &str,
) -> Result<Vec<u8>, TranslateError> {
    let req = openai_request
        .as_object()
        .ok_or_else(|| invalid("body", "expected a JSON object"))?;
    chat_object_to_messages(req, upstream_model)
}

/// As [`chat_request_to_messages`], for a request already known to be a JSON object (the
/// gateway's parsed body: no copy per attempt).
///
/// # Errors
/// As [`chat_request_to_messages`].
pub fn chat_object_to_messages(
    req: &serde_json::Map<String, Value>,
    upstream_model: &str,
) -> Result<Vec<u8>, TranslateError> {
    if let Some(n) = non_null(req.get("n")) {
        match n.as_u64() {
            Some(1) => {}
            Some(0) | None => return Err(invalid("n", "expected a positive integer")),
            Some(_) => {
                return Err(unsupported(
                    "n",
                    "Anthropic providers return a single choice; n must be 1",
                ))
            }
        }
    }
    if non_null(req.get("functions")).is_some() || non_null(req.get("function_call")).is_some() {
        return Err(unsupported(
            "functions",
            "the legacy functions API is not supported; use tools",
        ));
    }

    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "expected an array of messages"))?;

    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, msg) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let m = msg
            .as_object()
            .ok_or_else(|| invalid(path.as_str(), "expected an object"))?;
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{path}.role"), "expected a string"))?;
        let content_path = format!("{path}.content");
        match role {
            "system" | "developer" => {
                let text = text_only_content(m.get("content"), &content_path)?;
                if !text.is_empty() {
                    system.push(text);
                }
            }
            "user" => {
                let blocks = user_content_blocks(m.get("content"), &content_path)?;
                push_turn(&mut turns, "user", blocks);
            }
            "assistant" => {
                let blocks = assistant_blocks(m, &path)?;
                push_turn(&mut turns, "assistant", blocks);
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{path}.tool_call_id"), "expected a string"))?;
                let mut block = Map::new();
                block.insert("type".into(), "tool_result".into());
                block.insert("tool_use_id".into(), id.into());
                match non_null(m.get("content")) {
                    None => {}
                    Some(Value::String(s)) if s.is_empty() => {}
                    Some(Value::String(s)) => {
                        block.insert("content".into(), s.as_str().into());
                    }
                    Some(Value::Array(_)) => {
                        let blocks = user_content_blocks(m.get("content"), &content_path)?;
                        if !blocks.is_empty() {
                            block.insert("content".into(), Value::Array(blocks));
                        }
                    }
                    Some(_) => {
                        return Err(invalid(content_path, "expected a string or an array"));
                    }
                }
                push_turn(&mut turns, "user", vec![Value::Object(block)]);
            }
            "function" => {
                return Err(unsupported(
                    format!("{path}.role"),
                    "the legacy `function` role is not supported; use `tool`",
                ))
            }
            other => {
                return Err(invalid(
                    format!("{path}.role"),
                    format!("unknown role `{other}`"),
                ))
            }
        }
    }
    if turns.is_empty() {
        return Err(invalid(
            "messages",
            "at least one user or assistant message is required",
        ));
    }

    let mut out = Map::new();
    out.insert("model".into(), upstream_model.into());
    out.insert("max_tokens".into(), max_tokens(req)?.into());
    if !system.is_empty() {
        out.insert("system".into(), system.join("\n\n").into());
    }
    out.insert(
        "messages".into(),
        Value::Array(
            turns
                .into_iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect(),
        ),
    );

    let tools = translate_tools(req.get("tools"))?;
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = translate_tool_choice(req)? {
            out.insert("tool_choice".into(), Value::Object(choice));
        }
    }

    if let Some(t) = non_null(req.get("temperature")) {
        let t = t
            .as_f64()
            .filter(|t| *t >= 0.0)
            .ok_or_else(|| invalid("temperature", "expected a non-negative number"))?;
        if t > 1.0 {
            log::debug!("clamping temperature {t} to Anthropic's maximum of 1.0");
            out.insert("temperature".into(), json!(1.0));
        } else {
            out.insert("temperature".into(), json!(t));
        }
    }
    if let Some(p) = non_null(req.get("top_p")) {
        if !p.is_number() {
            return Err(invalid("top_p", "expected a number"));
        }
        out.insert("top_p".into(), p.clone());
    }
    match non_null(req.get("stop")) {
        None => {}
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(Value::Array(arr)) => {
            let mut seqs = Vec::with_capacity(arr.len());
            for (i, s) in arr.iter().enumerate() {
                let s = s
                    .as_str()
                    .ok_or_else(|| invalid(format!("stop[{i}]"), "expected a string"))?;
                seqs.push(Value::from(s));
            }
            if !seqs.is_empty() {
                out.insert("stop_sequences".into(), Value::Array(seqs));
            }
        }
        Some(_) => return Err(invalid("stop", "expected a string or an array of strings")),
    }
    if let Some(s) = non_null(req.get("stream")) {
        let s = s
            .as_bool()
            .ok_or_else(|| invalid("stream", "expected a boolean"))?;
        out.insert("stream".into(), s.into());
    }
    if let Some(u) = non_null(req.get("user")) {
        let u = u
            .as_str()
            .ok_or_else(|| invalid("user", "expected a string"))?;
        out.insert("metadata".into(), json!({ "user_id": u }));
    }
    serde_json::to_vec(&Value::Object(out)).map_err(|e| TranslateError::Internal(e.to_string()))
}

fn non_null(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn push_turn(turns: &mut Vec<(&'static str, Vec<Value>)>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some((last_role, last)) if *last_role == role => last.extend(blocks),
        _ => turns.push((role, blocks)),
    }
}

fn max_tokens(req: &Map<String, Value>) -> Result<u64, TranslateError> {
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(v) = non_null(req.get(key)) {
            return v
                .as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid(key, "expected a positive integer"));
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// Text of a system/developer message: a string or an array of `text` parts.
fn text_only_content(content: Option<&Value>, path: &str) -> Result<String, TranslateError> {
    match non_null(content) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let ppath = format!("{path}[{j}]");
                match part_type(part, &ppath)? {
                    "text" => texts.push(part_text(part, &ppath)?),
                    other => {
                        return Err(unsupported(
                            format!("{ppath}.type"),
                            format!("content part `{other}` is not allowed here"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(invalid(
            path,
            "expected a string or an array of content parts",
        )),
    }
}

fn part_type<'v>(part: &'v Value, path: &str) -> Result<&'v str, TranslateError> {
    part.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{path}.type"), "expected a string"))
}

fn part_text<'v>(part: &'v Value, path: &str) -> Result<&'v str, TranslateError> {
    part.get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{path}.text"), "expected a string"))
}

/// Content blocks of a user (or tool) message.
fn user_content_blocks(content: Option<&Value>, path: &str) -> Result<Vec<Value>, TranslateError> {
    match non_null(content) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![text_block(s)]),
        Some(Value::Array(parts)) => {
            let mut blocks = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let ppath = format!("{path}[{j}]");
                match part_type(part, &ppath)? {
                    "text" => {
                        let t = part_text(part, &ppath)?;
                        if !t.is_empty() {
                            blocks.push(text_block(t));
                        }
                    }
                    "image_url" => {
                        let upath = format!("{ppath}.image_url");
                        let url = match part.get("image_url") {
                            Some(Value::String(s)) => Some(s.as_str()),
                            Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
                            _ => None,
                        }
                        .ok_or_else(|| invalid(upath.as_str(), "expected {\"url\": string}"))?;
                        blocks.push(image_block(url, &upath)?);
                    }
                    "file" => blocks.push(file_block(part, &ppath)?),
                    other => {
                        return Err(unsupported(
                            format!("{ppath}.type"),
                            format!(
                                "content part `{other}` is not supported by Anthropic providers"
                            ),
                        ))
                    }
                }
            }
            Ok(blocks)
        }
        Some(_) => Err(invalid(
            path,
            "expected a string or an array of content parts",
        )),
    }
}

/// Splits a `data:` URL into (media type, base64 payload).
fn parse_data_url<'u>(url: &'u str, path: &str) -> Result<(&'u str, &'u str), TranslateError> {
    let rest = url.get(5..).unwrap_or("");
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| invalid(path, "malformed data URL (missing `,`)"))?;
    let mut params = meta.split(';');
    let media_type = params.next().unwrap_or("");
    if !params.any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(unsupported(
            path,
            "only base64-encoded data URLs are supported",
        ));
    }
    if media_type.is_empty() {
        return Err(invalid(path, "data URL has no media type"));
    }
    Ok((media_type, data))
}

fn has_prefix_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn image_block(url: &str, path: &str) -> Result<Value, TranslateError> {
    if has_prefix_ci(url, "data:") {
        let (media_type, data) = parse_data_url(url, path)?;
        Ok(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data}
        }))
    } else if has_prefix_ci(url, "https://") || has_prefix_ci(url, "http://") {
        Ok(json!({"type": "image", "source": {"type": "url", "url": url}}))
    } else {
        Err(invalid(
            path,
            "image URL must be a data: URL or an http(s) URL",
        ))
    }
}

/// OpenAI `{"type":"file","file":{"file_data":"data:application/pdf;base64,..."}}`
/// → Anthropic `document` block. Uploaded `file_id`s cannot be resolved.
fn file_block(part: &Value, path: &str) -> Result<Value, TranslateError> {
    let fpath = format!("{path}.file.file_data");
    let data_url = part
        .get("file")
        .and_then(|f| f.get("file_data"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            unsupported(
                fpath.as_str(),
                "only inline file_data (data: URL) is supported",
            )
        })?;
    if !has_prefix_ci(data_url, "data:") {
        return Err(unsupported(fpath, "file_data must be a base64 data: URL"));
    }
    let (media_type, data) = parse_data_url(data_url, &fpath)?;
    Ok(json!({
        "type": "document",
        "source": {"type": "base64", "media_type": media_type, "data": data}
    }))
}

fn assistant_blocks(m: &Map<String, Value>, path: &str) -> Result<Vec<Value>, TranslateError> {
    let content_path = format!("{path}.content");
    let mut blocks = Vec::new();
    match non_null(m.get("content")) {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => blocks.push(text_block(s)),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let ppath = format!("{content_path}[{j}]");
                let text = match part_type(part, &ppath)? {
                    "text" => part_text(part, &ppath)?,
                    "refusal" => part
                        .get("refusal")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("{ppath}.refusal"), "expected a string"))?,
                    other => {
                        return Err(unsupported(
                            format!("{ppath}.type"),
                            format!("content part `{other}` is not allowed in assistant messages"),
                        ))
                    }
                };
                if !text.is_empty() {
                    blocks.push(text_block(text));
                }
            }
        }
        Some(_) => {
            return Err(invalid(
                content_path,
                "expected a string or an array of content parts",
            ))
        }
    }
    if let Some(calls) = non_null(m.get("tool_calls")) {
        let calls = calls
            .as_array()
            .ok_or_else(|| invalid(format!("{path}.tool_calls"), "expected an array"))?;
        for (k, call) in calls.iter().enumerate() {
            let cpath = format!("{path}.tool_calls[{k}]");
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("{cpath}.id"), "expected a string"))?;
            let function = call
                .get("function")
                .ok_or_else(|| invalid(format!("{cpath}.function"), "expected an object"))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("{cpath}.function.name"), "expected a string"))?;
            let args_path = format!("{cpath}.function.arguments");
            let input = match non_null(function.get("arguments")) {
                None => Value::Object(Map::new()),
                Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                    .map_err(|e| invalid(args_path.as_str(), format!("not valid JSON: {e}")))?,
                Some(_) => return Err(invalid(args_path, "expected a JSON-encoded string")),
            };
            if !input.is_object() {
                return Err(invalid(args_path, "must encode a JSON object"));
            }
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
    }
    Ok(blocks)
}

fn translate_tools(tools: Option<&Value>) -> Result<Vec<Value>, TranslateError> {
    let Some(tools) = non_null(tools) else {
        return Ok(Vec::new());
    };
    let arr = tools
        .as_array()
        .ok_or_else(|| invalid("tools", "expected an array"))?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, tool) in arr.iter().enumerate() {
        let path = format!("tools[{i}]");
        let ty = tool
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("function");
        if ty != "function" {
            return Err(unsupported(
                format!("{path}.type"),
                format!("tool type `{ty}` is not supported; only `function`"),
            ));
        }
        let f = tool
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(format!("{path}.function"), "expected an object"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{path}.function.name"), "expected a string"))?;
        let mut t = Map::new();
        t.insert("name".into(), name.into());
        if let Some(d) = non_null(f.get("description")) {
            let d = d.as_str().ok_or_else(|| {
                invalid(format!("{path}.function.description"), "expected a string")
            })?;
            t.insert("description".into(), d.into());
        }
        let schema = match non_null(f.get("parameters")) {
            None => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(invalid(
                    format!("{path}.function.parameters"),
                    "expected a JSON Schema object",
                ))
            }
        };
        t.insert("input_schema".into(), schema);
        out.push(Value::Object(t));
    }
    Ok(out)
}

fn translate_tool_choice(
    req: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, TranslateError> {
    let mut choice = match non_null(req.get("tool_choice")) {
        None => None,
        Some(Value::String(s)) => {
            let ty = match s.as_str() {
                "auto" => "auto",
                "required" => "any",
                "none" => "none",
                other => {
                    return Err(invalid(
                        "tool_choice",
                        format!("unknown value `{other}` (expected auto, required or none)"),
                    ))
                }
            };
            let mut m = Map::new();
            m.insert("type".into(), ty.into());
            Some(m)
        }
        Some(Value::Object(o)) => {
            match o.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(unsupported(
                        "tool_choice.type",
                        format!("tool_choice type `{other}` is not supported"),
                    ))
                }
                None => return Err(invalid("tool_choice.type", "expected a string")),
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.function.name", "expected a string"))?;
            let mut m = Map::new();
            m.insert("type".into(), "tool".into());
            m.insert("name".into(), name.into());
            Some(m)
        }
        Some(_) => return Err(invalid("tool_choice", "expected a string or an object")),
    };
    match non_null(req.get("parallel_tool_calls")) {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            let c = choice.get_or_insert_with(|| {
                let mut m = Map::new();
                m.insert("type".into(), "auto".into());
                m
            });
            if c.get("type").and_then(Value::as_str) != Some("none") {
                c.insert("disable_parallel_tool_use".into(), true.into());
            }
        }
        Some(_) => return Err(invalid("parallel_tool_calls", "expected a boolean")),
    }
    Ok(choice)
}

// ---------------------------------------------------------------------------
// Shared response helpers
// ---------------------------------------------------------------------------

/// Maps an Anthropic `stop_reason` to an OpenAI `finish_reason`:
/// `end_turn`/`stop_sequence`/`pause_turn` → `stop`, `max_tokens` and
/// `model_context_window_exceeded` → `length`, `tool_use` → `tool_calls`,
/// `refusal` → `content_filter`; anything else → `stop`.
pub fn map_stop_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// A string borrowed from the input when it has no JSON escapes, owned
/// otherwise. (`Option<Cow<str>>` with `#[serde(borrow)]` always allocates.)
struct Str<'a>(Cow<'a, str>);

impl<'a> Str<'a> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

fn opt_str<'s>(s: &'s Option<Str<'_>>) -> Option<&'s str> {
    s.as_ref().map(Str::as_str)
}

#[derive(Deserialize, Default, Clone, Copy)]
struct AUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl AUsage {
    /// Total prompt tokens, or `None` when no input counter is present.
    fn prompt_tokens(&self) -> Option<u64> {
        if self.input_tokens.is_none()
            && self.cache_read_input_tokens.is_none()
            && self.cache_creation_input_tokens.is_none()
        {
            return None;
        }
        Some(
            self.input_tokens.unwrap_or(0)
                + self.cache_read_input_tokens.unwrap_or(0)
                + self.cache_creation_input_tokens.unwrap_or(0),
        )
    }
}

#[derive(Deserialize)]
struct AError<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    message: Option<Str<'a>>,
}

#[derive(Serialize, Clone, Copy)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

impl UsageOut {
    fn new(prompt: u64, completion: u64) -> Self {
        UsageOut {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt.saturating_add(completion),
        }
    }
}

fn upstream_error(err: Option<&AError<'_>>) -> TranslateError {
    let ty = err.and_then(|e| opt_str(&e.ty)).unwrap_or("api_error");
    let message = err
        .and_then(|e| opt_str(&e.message))
        .unwrap_or("upstream reported an error");
    TranslateError::Upstream {
        error_type: map_error_type(ty).unwrap_or("api_error").to_owned(),
        message: message.to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Non-streaming response
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
struct AMessage<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    content: Vec<ABlock<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Str<'a>>,
    #[serde(default)]
    usage: Option<AUsage>,
    #[serde(borrow, default)]
    error: Option<AError<'a>>,
}

#[derive(Deserialize)]
struct ABlock<'a> {
    #[serde(rename = "type", borrow)]
    ty: Str<'a>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Str<'a>>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(default)]
    input: Option<Value>,
}

/// Converts a non-streaming Anthropic `message` body into an OpenAI
/// `chat.completion` body:
///
/// ```json
/// {"id":"chatcmpl-<msg id>","object":"chat.completion","created":<created_unix_s>,
///  "model":"<standard_model>",
///  "choices":[{"index":0,"message":{"role":"assistant","content":"<joined text>|null",
///     "tool_calls":[{"id","type":"function","function":{"name","arguments":"<json>"}}]},
///   "logprobs":null,"finish_reason":"stop|length|tool_calls|content_filter"}],
///  "usage":{"prompt_tokens","completion_tokens","total_tokens"}}
/// ```
///
/// `tool_calls` is present only when the message has `tool_use` blocks;
/// `reasoning_content` only when it has `thinking` blocks. `prompt_tokens`
/// includes cache read/creation tokens.
///
/// # Errors
/// [`TranslateError::InvalidUpstream`] if the body is not a parseable message,
/// [`TranslateError::Upstream`] if it is an Anthropic error body.
pub fn messages_response_to_chat(
    anthropic_body: &[u8],
    standard_model: &str,
    created_unix_s: u64,
) -> Result<Vec<u8>, TranslateError> {
    let msg: AMessage<'_> = serde_json::from_slice(anthropic_body)
        .map_err(|e| TranslateError::InvalidUpstream(format!("message body: {e}")))?;
    if opt_str(&msg.ty) == Some("error") {
        return Err(upstream_error(msg.error.as_ref()));
    }
    let id = opt_str(&msg.id)
        .ok_or_else(|| TranslateError::InvalidUpstream("message body has no `id`".into()))?;

    let mut text: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut tool_calls = Vec::new();
    for block in &msg.content {
        match block.ty.as_str() {
            "text" => {
                if let Some(t) = opt_str(&block.text) {
                    text.get_or_insert_with(String::new).push_str(t);
                }
            }
            "thinking" => {
                if let Some(t) = opt_str(&block.thinking) {
                    reasoning.get_or_insert_with(String::new).push_str(t);
                }
            }
            "tool_use" => {
                let arguments = match &block.input {
                    Some(v) => serde_json::to_string(v)
                        .map_err(|e| TranslateError::Internal(e.to_string()))?,
                    None => "{}".to_owned(),
                };
                tool_calls.push(json!({
                    "id": opt_str(&block.id).unwrap_or(""),
                    "type": "function",
                    "function": {"name": opt_str(&block.name).unwrap_or(""), "arguments": arguments}
                }));
            }
            other => log::debug!("anthropic: dropping `{other}` content block"),
        }
    }

    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert("content".into(), text.map_or(Value::Null, Value::String));
    if let Some(r) = reasoning {
        message.insert("reasoning_content".into(), r.into());
    }
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    let finish_reason = map_stop_reason(opt_str(&msg.stop_reason).unwrap_or("end_turn"));
    let usage = msg.usage.unwrap_or_default();
    let usage = UsageOut::new(
        usage.prompt_tokens().unwrap_or(0),
        usage.output_tokens.unwrap_or(0),
    );
    let out = json!({
        "id": format!("chatcmpl-{id}"),
        "object": "chat.completion",
        "created": created_unix_s,
        "model": standard_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
        "usage": usage,
    });
    serde_json::to_vec(&out).map_err(|e| TranslateError::Internal(e.to_string()))
}

// ---------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
struct SEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    message: Option<SMessage<'a>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    content_block: Option<SBlock<'a>>,
    #[serde(borrow, default)]
    delta: Option<SDelta<'a>>,
    #[serde(default)]
    usage: Option<AUsage>,
    #[serde(borrow, default)]
    error: Option<AError<'a>>,
}

#[derive(Deserialize)]
struct SMessage<'a> {
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(default)]
    usage: Option<AUsage>,
}

#[derive(Deserialize)]
struct SBlock<'a> {
    #[serde(rename = "type", borrow)]
    ty: Str<'a>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct SDelta<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
    #[serde(borrow, default)]
    partial_json: Option<Str<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Str<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Str<'a>>,
}

#[derive(Serialize)]
struct ChunkOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [ChoiceOut<'a>],
    /// `None` → omitted, `Some(None)` → `null`, `Some(Some(u))` → object.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
}

#[derive(Serialize)]
struct ChoiceOut<'a> {
    index: u32,
    delta: DeltaOut<'a>,
    logprobs: (),
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct DeltaOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallOut<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallOut<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    ty: Option<&'static str>,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// Per-stream state turning Anthropic Messages SSE events into OpenAI
/// `chat.completion.chunk` SSE events.
///
/// Feed every upstream SSE event (its `event:` name if any, and its joined
/// `data:` payload) to [`on_event`](StreamTranslator::on_event). Every emitted
/// chunk looks like
/// `data: {"id":"chatcmpl-<msg id>","object":"chat.completion.chunk","created":…,"model":"<standard_model>","choices":[{"index":0,"delta":{…},"logprobs":null,"finish_reason":null}]}\n\n`
/// (plus `"usage":null` when `include_usage` is set), and the stream ends with
/// an optional usage chunk (`"choices":[]`) and `data: [DONE]\n\n` on
/// `message_stop`.
#[derive(Debug, Clone)]
pub struct StreamTranslator {
    model: String,
    created: u64,
    include_usage: bool,
    id: String,
    input_tokens: u64,
    output_tokens: u64,
    /// (Anthropic content block index, OpenAI tool call index).
    tool_blocks: Vec<(u64, u32)>,
    /// `message_delta` (the stop reason) was translated.
    stopped: bool,
    finished: bool,
}

impl StreamTranslator {
    /// Creates the translator for one stream. `standard_model` is the model
    /// name reported to the client, `created_unix_s` the `created` timestamp,
    /// `include_usage` the client's `stream_options.include_usage`
    /// (see [`stream_include_usage`]).
    pub fn new(standard_model: &str, created_unix_s: u64, include_usage: bool) -> Self {
        StreamTranslator {
            model: standard_model.to_owned(),
            created: created_unix_s,
            include_usage,
            id: String::from("chatcmpl-"),
            input_tokens: 0,
            output_tokens: 0,
            tool_blocks: Vec::new(),
            stopped: false,
            finished: false,
        }
    }

    /// Token usage seen so far: (input tokens incl. cache reads/creations,
    /// output tokens). Final once [`is_finished`](Self::is_finished).
    pub fn usage(&self) -> (u64, u64) {
        (self.input_tokens, self.output_tokens)
    }

    /// Whether `message_stop` has been seen (and `data: [DONE]` emitted).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether the answer's stop reason (`message_delta`) was translated: the answer is
    /// complete even if the upstream body ends before `message_stop`.
    pub fn has_stop_reason(&self) -> bool {
        self.stopped
    }

    /// Ends the client stream as `message_stop` would (the usage chunk when asked for,
    /// then `data: [DONE]`); for an upstream body that ended cleanly after
    /// `message_delta` but before `message_stop`. Does nothing once finished.
    ///
    /// # Errors
    /// [`TranslateError::Internal`] if the usage chunk cannot be serialized.
    pub fn finish(&mut self, out: &mut BytesMut) -> Result<(), TranslateError> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        if self.include_usage {
            let chunk = ChunkOut {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: &[],
                usage: Some(Some(UsageOut::new(self.input_tokens, self.output_tokens))),
            };
            write_event(out, &chunk)?;
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Ok(())
    }

    /// Translates one upstream SSE event, appending zero or more complete
    /// OpenAI SSE events to `out`.
    ///
    /// `event_name` is the `event:` field (may be `None`; the JSON `type` in
    /// `data` takes precedence anyway), `data` the event's data payload.
    /// `ping`, `content_block_stop`, unknown events and events after
    /// `message_stop` produce nothing.
    ///
    /// # Errors
    /// [`TranslateError::Upstream`] for an `error` event (the caller should
    /// write an OpenAI error event and end the stream);
    /// [`TranslateError::InvalidUpstream`] when `data` is not valid JSON.
    /// Nothing is appended to `out` when an error is returned.
    pub fn on_event(
        &mut self,
        event_name: Option<&[u8]>,
        data: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), TranslateError> {
        if self.finished || event_name == Some(b"ping".as_slice()) {
            return Ok(());
        }
        let data = data.trim_ascii();
        if data.is_empty() {
            return Ok(());
        }
        let ev: SEvent<'_> = serde_json::from_slice(data)
            .map_err(|e| TranslateError::InvalidUpstream(format!("stream event: {e}")))?;
        let kind: &[u8] = match &ev.ty {
            Some(t) => t.as_str().as_bytes(),
            None => event_name.unwrap_or_default(),
        };
        match kind {
            b"message_start" => {
                if let Some(m) = &ev.message {
                    if let Some(id) = opt_str(&m.id) {
                        self.id.truncate("chatcmpl-".len());
                        self.id.push_str(id);
                    }
                    if let Some(u) = &m.usage {
                        self.absorb_usage(u);
                    }
                }
                let delta = DeltaOut {
                    role: Some("assistant"),
                    content: Some(""),
                    ..DeltaOut::default()
                };
                self.write_chunk(out, delta, None)
            }
            b"content_block_start" => {
                let Some(block) = &ev.content_block else {
                    return Ok(());
                };
                match block.ty.as_str() {
                    "tool_use" => {
                        let tool_index = self.tool_blocks.len() as u32;
                        self.tool_blocks.push((ev.index.unwrap_or(0), tool_index));
                        let delta = DeltaOut {
                            tool_calls: Some([ToolCallOut {
                                index: tool_index,
                                id: Some(opt_str(&block.id).unwrap_or("")),
                                ty: Some("function"),
                                function: FunctionOut {
                                    name: Some(opt_str(&block.name).unwrap_or("")),
                                    arguments: "",
                                },
                            }]),
                            ..DeltaOut::default()
                        };
                        self.write_chunk(out, delta, None)
                    }
                    "text" => match opt_str(&block.text) {
                        Some(t) if !t.is_empty() => self.write_chunk(
                            out,
                            DeltaOut {
                                content: Some(t),
                                ..DeltaOut::default()
                            },
                            None,
                        ),
                        _ => Ok(()),
                    },
                    "thinking" => match opt_str(&block.thinking) {
                        Some(t) if !t.is_empty() => self.write_chunk(
                            out,
                            DeltaOut {
                                reasoning_content: Some(t),
                                ..DeltaOut::default()
                            },
                            None,
                        ),
                        _ => Ok(()),
                    },
                    _ => Ok(()),
                }
            }
            b"content_block_delta" => {
                let Some(d) = &ev.delta else {
                    return Ok(());
                };
                let delta = match opt_str(&d.ty) {
                    Some("text_delta") => match opt_str(&d.text) {
                        Some(t) if !t.is_empty() => DeltaOut {
                            content: Some(t),
                            ..DeltaOut::default()
                        },
                        _ => return Ok(()),
                    },
                    Some("thinking_delta") => match opt_str(&d.thinking) {
                        Some(t) if !t.is_empty() => DeltaOut {
                            reasoning_content: Some(t),
                            ..DeltaOut::default()
                        },
                        _ => return Ok(()),
                    },
                    Some("input_json_delta") => {
                        let block_index = ev.index.unwrap_or(0);
                        let Some(&(_, tool_index)) =
                            self.tool_blocks.iter().find(|(b, _)| *b == block_index)
                        else {
                            // e.g. a server_tool_use block: not exposed to the client.
                            return Ok(());
                        };
                        match opt_str(&d.partial_json) {
                            Some(p) if !p.is_empty() => DeltaOut {
                                tool_calls: Some([ToolCallOut {
                                    index: tool_index,
                                    id: None,
                                    ty: None,
                                    function: FunctionOut {
                                        name: None,
                                        arguments: p,
                                    },
                                }]),
                                ..DeltaOut::default()
                            },
                            _ => return Ok(()),
                        }
                    }
                    _ => return Ok(()), // signature_delta, citations_delta, …
                };
                self.write_chunk(out, delta, None)
            }
            b"message_delta" => {
                if let Some(u) = &ev.usage {
                    self.absorb_usage(u);
                }
                let reason = ev
                    .delta
                    .as_ref()
                    .and_then(|d| opt_str(&d.stop_reason))
                    .unwrap_or("end_turn");
                self.stopped = true;
                self.write_chunk(out, DeltaOut::default(), Some(map_stop_reason(reason)))
            }
            b"message_stop" => self.finish(out),
            b"error" => Err(upstream_error(ev.error.as_ref())),
            _ => Ok(()), // ping, content_block_stop, future event types
        }
    }

    fn absorb_usage(&mut self, u: &AUsage) {
        if let Some(p) = u.prompt_tokens() {
            self.input_tokens = p;
        }
        if let Some(o) = u.output_tokens {
            self.output_tokens = o;
        }
    }

    fn write_chunk(
        &self,
        out: &mut BytesMut,
        delta: DeltaOut<'_>,
        finish_reason: Option<&str>,
    ) -> Result<(), TranslateError> {
        let choice = ChoiceOut {
            index: 0,
            delta,
            logprobs: (),
            finish_reason,
        };
        let chunk = ChunkOut {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage: if self.include_usage { Some(None) } else { None },
        };
        write_event(out, &chunk)
    }
}

fn write_event(out: &mut BytesMut, chunk: &ChunkOut<'_>) -> Result<(), TranslateError> {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    if let Err(e) = serde_json::to_writer((&mut *out).writer(), chunk) {
        out.truncate(start);
        return Err(TranslateError::Internal(e.to_string()));
    }
    out.extend_from_slice(b"\n\n");
    Ok(())
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Anthropic error type → OpenAI error type, `None` if unknown.
fn map_error_type(anthropic_type: &str) -> Option<&'static str> {
    Some(match anthropic_type {
        "invalid_request_error" | "request_too_large" => "invalid_request_error",
        "authentication_error" => "authentication_error",
        "permission_error" | "billing_error" => "permission_error",
        "not_found_error" => "not_found_error",
        "rate_limit_error" => "rate_limit_error",
        "overloaded_error" => "overloaded_error",
        "api_error" | "timeout_error" => "api_error",
        _ => return None,
    })
}

fn status_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 | 403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Maps an Anthropic error response (`status` + body
/// `{"type":"error","error":{"type":…,"message":…}}`) to an OpenAI
/// `(error type, message)` pair.
///
/// Types: `invalid_request_error` (400, 413 `request_too_large`, other 4xx),
/// `authentication_error` (401), `permission_error` (403, 402 `billing_error`),
/// `not_found_error` (404), `rate_limit_error` (429), `overloaded_error` (529),
/// `api_error` (other 5xx, `timeout_error`). The body's error type wins when it
/// is a known Anthropic type; otherwise the status decides. When the body is
/// not Anthropic-shaped the message is the (truncated) body text, or
/// `upstream returned HTTP <status>` when empty.
pub fn error_to_openai(status: u16, body: &[u8]) -> (String, String) {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        error: Option<AError<'a>>,
    }
    if let Ok(env) = serde_json::from_slice::<Envelope<'_>>(body) {
        if let Some(err) = env.error {
            let ty = opt_str(&err.ty)
                .and_then(map_error_type)
                .unwrap_or_else(|| status_error_type(status));
            let message = opt_str(&err.message)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("upstream returned HTTP {status}"));
            return (ty.to_owned(), message);
        }
    }
    const MAX_BODY: usize = 512;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message = if text.is_empty() {
        format!("upstream returned HTTP {status}")
    } else if text.len() > MAX_BODY {
        let mut cut = MAX_BODY;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("upstream returned HTTP {status}: {}…", &text[..cut])
    } else {
        format!("upstream returned HTTP {status}: {text}")
    };
    (status_error_type(status).to_owned(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- helpers ---------------------------------------------------------

    fn req(v: Value) -> Value {
        let bytes = chat_request_to_messages(&v, "claude-sonnet-4-5").expect("translate");
        serde_json::from_slice(&bytes).expect("output is JSON")
    }

    fn req_err(v: Value) -> TranslateError {
        chat_request_to_messages(&v, "claude-sonnet-4-5").expect_err("should fail")
    }

    /// Splits an SSE transcript (`event: x\ndata: y\n\n` …) into (name, data).
    fn sse_events(transcript: &str) -> Vec<(Option<String>, String)> {
        transcript
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let mut name = None;
                let mut data = String::new();
                for line in e.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_owned());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                (name, data)
            })
            .collect()
    }

    /// Parses translator output into JSON chunks; `[DONE]` becomes `"[DONE]"`.
    fn openai_events(out: &[u8]) -> Vec<Value> {
        let s = std::str::from_utf8(out).expect("utf8");
        assert!(s.ends_with("\n\n") || s.is_empty(), "unterminated: {s:?}");
        s.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let d = e.strip_prefix("data: ").expect("data: prefix");
                assert!(!d.contains('\n'));
                if d == "[DONE]" {
                    Value::from("[DONE]")
                } else {
                    serde_json::from_str(d).expect("chunk JSON")
                }
            })
            .collect()
    }

    fn run_stream(t: &mut StreamTranslator, transcript: &str) -> Vec<Value> {
        let mut out = BytesMut::new();
        for (name, data) in sse_events(transcript) {
            t.on_event(
                name.as_deref().map(str::as_bytes),
                data.as_bytes(),
                &mut out,
            )
            .expect("event");
        }
        openai_events(&out)
    }

    fn chunk(id: &str, delta: Value, finish: Value) -> Value {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": 1700000000u64,
            "model": "claude-std",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        })
    }

    // ---- request translation --------------------------------------------

    #[test]
    fn request_basic_system_and_defaults() {
        let out = req(json!({
            "model": "claude-std",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
                {"role": "user", "content": "Hello"}
            ],
            "provider": "anthropic-main",
            "logprobs": true,
            "n": 1,
            "stream_options": {"include_usage": true}
        }));
        assert_eq!(
            out,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 4096,
                "system": "You are terse.\n\nAnswer in French.",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
            })
        );
    }

    #[test]
    fn request_sampling_stop_stream_user_and_no_mock_field() {
        let out = req(json!({
            "model": "x",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": 77,
            "max_tokens": 5,
            "temperature": 0.3,
            "top_p": 0.9,
            "stop": "\n\nHuman:",
            "stream": true,
            "user": "user-123",
            "mock": {"scenario": "slow", "delay_ms": 5}
        }));
        assert_eq!(
            out,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 77,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                "temperature": 0.3,
                "top_p": 0.9,
                "stop_sequences": ["\n\nHuman:"],
                "stream": true,
                "metadata": {"user_id": "user-123"}
            })
        );
        assert!(out.get("mock").is_none(), "{out}");
        let out = req(json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 12, "stop": ["a", "b"], "temperature": 1.7
        }));
        assert_eq!(out["max_tokens"], 12);
        assert_eq!(out["stop_sequences"], json!(["a", "b"]));
        assert_eq!(out["temperature"], json!(1.0));
    }

    #[test]
    fn request_images() {
        let out = req(json!({
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/a.jpg"}}
            ]}]
        }));
        assert_eq!(
            out["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/a.jpg"}}
            ]}])
        );
        let e = req_err(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]}));
        assert_eq!(e.field(), Some("messages[0].content[0].image_url"));
        let e = req_err(json!({"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "xx", "format": "wav"}}]}]}));
        assert!(matches!(e, TranslateError::Unsupported { .. }));
        assert_eq!(e.field(), Some("messages[0].content[0].type"));
    }

    #[test]
    fn request_tools_and_tool_results() {
        let out = req(json!({
            "messages": [
                {"role": "user", "content": "Weather in SF and NYC?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"San Francisco, CA\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"New York, NY\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "15 degrees"},
                {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "20 degrees"}]},
                {"role": "user", "content": "Thanks, summarize."}
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "Get the current weather",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
            }}, {"type": "function", "function": {"name": "noop"}}],
            "tool_choice": "required",
            "parallel_tool_calls": false
        }));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "Weather in SF and NYC?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"location": "San Francisco, CA"}},
                    {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"location": "New York, NY"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "15 degrees"},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "20 degrees"}]},
                    {"type": "text", "text": "Thanks, summarize."}
                ]}
            ])
        );
        assert_eq!(
            out["tools"],
            json!([
                {"name": "get_weather", "description": "Get the current weather",
                 "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}},
                {"name": "noop", "input_schema": {"type": "object", "properties": {}}}
            ])
        );
        assert_eq!(
            out["tool_choice"],
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
    }

    #[test]
    fn request_tool_choice_variants() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let choice = |tc: Value, ptc: Value| {
            req(json!({"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": tc, "parallel_tool_calls": ptc}))
                .get("tool_choice")
                .cloned()
        };
        assert_eq!(
            choice(json!("auto"), Value::Null),
            Some(json!({"type": "auto"}))
        );
        assert_eq!(
            choice(json!("none"), json!(false)),
            Some(json!({"type": "none"}))
        );
        assert_eq!(
            choice(
                json!({"type": "function", "function": {"name": "f"}}),
                json!(true)
            ),
            Some(json!({"type": "tool", "name": "f"}))
        );
        assert_eq!(
            choice(Value::Null, json!(false)),
            Some(json!({"type": "auto", "disable_parallel_tool_use": true}))
        );
        assert_eq!(choice(Value::Null, Value::Null), None);
        // No tools: tool_choice is not sent.
        let out =
            req(json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}));
        assert!(out.get("tool_choice").is_none() && out.get("tools").is_none());
        let e = req_err(
            json!({"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "sometimes"}),
        );
        assert_eq!(e.field(), Some("tool_choice"));
        let e = req_err(json!({"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search"}]}));
        assert_eq!(e.field(), Some("tools[0].type"));
    }

    #[test]
    fn request_merges_consecutive_roles() {
        let out = req(json!({"messages": [
            {"role": "user", "content": "one"},
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "a1"},
            {"role": "assistant", "content": [{"type": "text", "text": "a2"}]},
            {"role": "user", "content": "three"}
        ]}));
        assert_eq!(out["system"], "sys");
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "a1"}, {"type": "text", "text": "a2"}]},
                {"role": "user", "content": [{"type": "text", "text": "three"}]}
            ])
        );
    }

    #[test]
    fn request_errors_name_the_field() {
        let e = req_err(json!({"messages": [{"role": "user", "content": "x"}], "n": 2}));
        assert!(matches!(e, TranslateError::Unsupported { .. }));
        assert_eq!(e.field(), Some("n"));
        assert!(e.is_client_error());
        assert_eq!(req_err(json!({"model": "m"})).field(), Some("messages"));
        assert_eq!(
            req_err(json!({"messages": [{"role": "system", "content": "only"}]})).field(),
            Some("messages")
        );
        assert_eq!(
            req_err(json!({"messages": [{"role": "wizard", "content": "x"}]})).field(),
            Some("messages[0].role")
        );
        assert_eq!(
            req_err(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}))
                .field(),
            Some("max_tokens")
        );
        assert_eq!(
            req_err(json!({"messages": [{"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}))
            .field(),
            Some("messages[0].tool_calls[0].function.arguments")
        );
        assert_eq!(
            req_err(json!({"messages": [{"role": "tool", "content": "x"}]})).field(),
            Some("messages[0].tool_call_id")
        );
        assert_eq!(
            req_err(json!({"messages": [{"role": "user", "content": "x"}], "stop": 3})).field(),
            Some("stop")
        );
        assert_eq!(req_err(json!([1, 2])).field(), Some("body"));
        let msg =
            req_err(json!({"messages": [{"role": "user", "content": "x"}], "n": 3})).to_string();
        assert!(msg.contains("`n`"), "{msg}");
    }

    #[test]
    fn request_pdf_file_part() {
        let out = req(json!({"messages": [{"role": "user", "content": [
            {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}}
        ]}]}));
        assert_eq!(
            out["messages"][0]["content"][0],
            json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}})
        );
    }

    // ---- non-streaming response -------------------------------------------

    #[test]
    fn response_text_message() {
        let body = br#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":10,"cache_read_input_tokens":100}}"#;
        let out: Value = serde_json::from_slice(
            &messages_response_to_chat(body, "claude-std", 1_700_000_000).expect("ok"),
        )
        .expect("json");
        assert_eq!(
            out,
            json!({
                "id": "chatcmpl-msg_013Zva2CMHLNnXjNJJKqJ2EF",
                "object": "chat.completion",
                "created": 1700000000u64,
                "model": "claude-std",
                "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": "Hi! My name is Claude."},
                    "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 2205, "completion_tokens": 503, "total_tokens": 2708}
            })
        );
    }

    #[test]
    fn response_tool_use_message() {
        let body = br#"{
          "id": "msg_01Aq9w938a90dw8q",
          "model": "claude-sonnet-4-5",
          "stop_reason": "tool_use",
          "role": "assistant",
          "type": "message",
          "content": [
            {"type": "thinking", "thinking": "Need the weather tool.", "signature": "EqQBCgIYAhIM"},
            {"type": "text", "text": "I'll check the current weather in San Francisco for you."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
             "input": {"location": "San Francisco, CA", "unit": "celsius"}}
          ],
          "usage": {"input_tokens": 472, "output_tokens": 91, "cache_creation_input_tokens": null}
        }"#;
        let out: Value = serde_json::from_slice(
            &messages_response_to_chat(body, "claude-std", 1_700_000_000).expect("ok"),
        )
        .expect("json");
        assert_eq!(
            out,
            json!({
                "id": "chatcmpl-msg_01Aq9w938a90dw8q",
                "object": "chat.completion",
                "created": 1700000000u64,
                "model": "claude-std",
                "choices": [{"index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "I'll check the current weather in San Francisco for you.",
                        "reasoning_content": "Need the weather tool.",
                        "tool_calls": [{"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
                            "function": {"name": "get_weather",
                                         "arguments": "{\"location\":\"San Francisco, CA\",\"unit\":\"celsius\"}"}}]
                    },
                    "logprobs": null, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 472, "completion_tokens": 91, "total_tokens": 563}
            })
        );
    }

    #[test]
    fn response_tool_only_has_null_content_and_finish_mapping() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"max_tokens","usage":{"input_tokens":1,"output_tokens":2}}"#;
        let out: Value =
            serde_json::from_slice(&messages_response_to_chat(body, "m", 1).expect("ok"))
                .expect("json");
        assert_eq!(out["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(
            out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(out["choices"][0]["finish_reason"], "length");
        assert_eq!(map_stop_reason("stop_sequence"), "stop");
        assert_eq!(map_stop_reason("refusal"), "content_filter");
    }

    #[test]
    fn response_errors() {
        let e = messages_response_to_chat(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            "m",
            1,
        )
        .expect_err("error body");
        assert_eq!(
            e,
            TranslateError::Upstream {
                error_type: "overloaded_error".into(),
                message: "Overloaded".into()
            }
        );
        assert!(matches!(
            messages_response_to_chat(b"<html>", "m", 1),
            Err(TranslateError::InvalidUpstream(_))
        ));
    }

    // ---- streaming --------------------------------------------------------

    const TEXT_STREAM: &str = r#"event: message_start
data: {"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [], "model": "claude-opus-4-6", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "! \"Hi\"\n"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}

event: message_stop
data: {"type": "message_stop"}

"#;

    #[test]
    fn stream_text_transcript() {
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, false);
        let events = run_stream(&mut t, TEXT_STREAM);
        let id = "chatcmpl-msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY";
        assert_eq!(
            events,
            vec![
                chunk(id, json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(id, json!({"content": "Hello"}), Value::Null),
                chunk(id, json!({"content": "! \"Hi\"\n"}), Value::Null),
                chunk(id, json!({}), json!("stop")),
                json!("[DONE]"),
            ]
        );
        assert!(t.is_finished());
        assert_eq!(t.usage(), (25, 15));
        // Events after message_stop are ignored.
        let mut out = BytesMut::new();
        t.on_event(
            Some(b"message_stop"),
            br#"{"type":"message_stop"}"#,
            &mut out,
        )
        .expect("ok");
        assert!(out.is_empty());
    }

    #[test]
    fn stream_ended_after_message_delta_is_finished_once() {
        let cut = TEXT_STREAM
            .find("event: message_stop")
            .expect("transcript has message_stop");
        let id = "chatcmpl-msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY";
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, true);
        let events = run_stream(&mut t, &TEXT_STREAM[..cut]);
        assert_eq!(events.len(), 4);
        assert!(t.has_stop_reason());
        assert!(!t.is_finished());
        let mut out = BytesMut::new();
        t.finish(&mut out).expect("finish");
        let mut usage = chunk(id, Value::Null, Value::Null);
        usage["choices"] = json!([]);
        usage["usage"] = json!({"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40});
        assert_eq!(openai_events(&out), vec![usage, json!("[DONE]")]);
        assert!(t.is_finished());
        let mut again = BytesMut::new();
        t.finish(&mut again).expect("finish");
        assert!(again.is_empty(), "exactly one [DONE]");
        // Before `message_delta` there is no stop reason: the answer is not complete.
        let cut = TEXT_STREAM
            .find("event: message_delta")
            .expect("transcript has message_delta");
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, false);
        run_stream(&mut t, &TEXT_STREAM[..cut]);
        assert!(!t.has_stop_reason());
    }

    #[test]
    fn stream_text_with_usage_and_without_event_names() {
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, true);
        let mut out = BytesMut::new();
        for (_, data) in sse_events(TEXT_STREAM) {
            t.on_event(None, data.as_bytes(), &mut out).expect("event");
        }
        let events = openai_events(&out);
        let id = "chatcmpl-msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY";
        let with_null_usage = |mut c: Value| {
            c["usage"] = Value::Null;
            c
        };
        assert_eq!(
            events,
            vec![
                with_null_usage(chunk(
                    id,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null
                )),
                with_null_usage(chunk(id, json!({"content": "Hello"}), Value::Null)),
                with_null_usage(chunk(id, json!({"content": "! \"Hi\"\n"}), Value::Null)),
                with_null_usage(chunk(id, json!({}), json!("stop"))),
                json!({"id": id, "object": "chat.completion.chunk", "created": 1700000000u64,
                       "model": "claude-std", "choices": [],
                       "usage": {"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40}}),
                json!("[DONE]"),
            ]
        );
    }

    const TOOL_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-opus-4-6","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2,"cache_read_input_tokens":8},"content":[],"stop_reason":null}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay, let's check the weather."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_02","name":"get_time","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

"#;

    #[test]
    fn stream_tool_use_transcript() {
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, false);
        let events = run_stream(&mut t, TOOL_STREAM);
        let id = "chatcmpl-msg_014p7gG3wDgGV9EUtLvnow3U";
        assert_eq!(
            events,
            vec![
                chunk(id, json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(
                    id,
                    json!({"content": "Okay, let's check the weather."}),
                    Value::Null
                ),
                chunk(
                    id,
                    json!({"tool_calls": [{"index": 0, "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
                    Value::Null
                ),
                chunk(
                    id,
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\":"}}]}),
                    Value::Null
                ),
                chunk(
                    id,
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": " \"San Francisco, CA\"}"}}]}),
                    Value::Null
                ),
                chunk(
                    id,
                    json!({"tool_calls": [{"index": 1, "id": "toolu_02",
                    "type": "function", "function": {"name": "get_time", "arguments": ""}}]}),
                    Value::Null
                ),
                chunk(
                    id,
                    json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
                    Value::Null
                ),
                chunk(id, json!({}), json!("tool_calls")),
                json!("[DONE]"),
            ]
        );
        assert_eq!(t.usage(), (480, 89));
    }

    #[test]
    fn stream_thinking_delta() {
        let transcript = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_t","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me solve this step by step"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

"#;
        let mut t = StreamTranslator::new("claude-std", 1_700_000_000, false);
        let events = run_stream(&mut t, transcript);
        assert_eq!(
            events,
            vec![
                chunk(
                    "chatcmpl-msg_t",
                    json!({"role": "assistant", "content": ""}),
                    Value::Null
                ),
                chunk(
                    "chatcmpl-msg_t",
                    json!({"reasoning_content": "Let me solve this step by step"}),
                    Value::Null
                ),
            ]
        );
        assert!(!t.is_finished());
    }

    #[test]
    fn stream_error_event() {
        let mut t = StreamTranslator::new("claude-std", 1, false);
        let mut out = BytesMut::new();
        let err = t
            .on_event(
                Some(b"error"),
                br#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
                &mut out,
            )
            .expect_err("error event");
        assert_eq!(
            err,
            TranslateError::Upstream {
                error_type: "overloaded_error".into(),
                message: "Overloaded".into()
            }
        );
        assert!(out.is_empty());
        let err = t
            .on_event(Some(b"content_block_delta"), b"{not json", &mut out)
            .expect_err("bad json");
        assert!(matches!(err, TranslateError::InvalidUpstream(_)));
        assert!(!err.is_client_error());
        // Empty data and unknown events are no-ops.
        t.on_event(None, b"  ", &mut out).expect("empty");
        t.on_event(
            Some(b"future_event"),
            br#"{"type":"future_event"}"#,
            &mut out,
        )
        .expect("unknown");
        assert!(out.is_empty());
    }

    #[test]
    fn str_borrows_when_unescaped() {
        let d: SDelta<'_> =
            serde_json::from_slice(br#"{"type":"text_delta","text":"plain"}"#).expect("json");
        assert!(matches!(d.text, Some(Str(Cow::Borrowed("plain")))));
        let d: SDelta<'_> =
            serde_json::from_slice(br#"{"type":"text_delta","text":"a\nb"}"#).expect("json");
        assert_eq!(opt_str(&d.text), Some("a\nb"));
    }

    // ---- errors -----------------------------------------------------------

    #[test]
    fn error_mapping() {
        let body = |ty: &str| {
            format!(r#"{{"type":"error","error":{{"type":"{ty}","message":"m {ty}"}}}}"#)
        };
        let cases = [
            (400, "invalid_request_error", "invalid_request_error"),
            (401, "authentication_error", "authentication_error"),
            (403, "permission_error", "permission_error"),
            (404, "not_found_error", "not_found_error"),
            (413, "request_too_large", "invalid_request_error"),
            (429, "rate_limit_error", "rate_limit_error"),
            (500, "api_error", "api_error"),
            (529, "overloaded_error", "overloaded_error"),
            (503, "something_new", "api_error"),
        ];
        for (status, ty, want) in cases {
            let (got, msg) = error_to_openai(status, body(ty).as_bytes());
            assert_eq!(got, want, "{status} {ty}");
            assert_eq!(msg, format!("m {ty}"));
        }
        assert_eq!(
            error_to_openai(429, b"slow down"),
            (
                "rate_limit_error".to_owned(),
                "upstream returned HTTP 429: slow down".to_owned()
            )
        );
        assert_eq!(
            error_to_openai(529, b""),
            (
                "overloaded_error".to_owned(),
                "upstream returned HTTP 529".to_owned()
            )
        );
        assert_eq!(
            error_to_openai(502, b"<html>bad gateway</html>").0,
            "api_error"
        );
        assert_eq!(
            error_to_openai(422, br#"{"detail":"x"}"#).0,
            "invalid_request_error"
        );
        let long = "é".repeat(600);
        let (_, msg) = error_to_openai(500, long.as_bytes());
        assert!(msg.len() < 600 + 40);
    }

    #[test]
    fn stream_include_usage_helper() {
        assert!(stream_include_usage(
            &json!({"stream_options": {"include_usage": true}})
        ));
        assert!(!stream_include_usage(&json!({"stream": true})));
    }
}
