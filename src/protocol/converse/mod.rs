//! The Bedrock Converse dialect (upstream side only): the body of `Converse` /
//! `ConverseStream` encoded from the canonical request, the `Converse` answer decoded into
//! the canonical response, its `usage` mapped to canonical usage. The stream decoder
//! ([`StreamDecoder`]) reads the ConverseStream events after the event-stream framing was
//! turned into SSE (`event: {event type}` + `data: {event JSON}`,
//! [`crate::providers::bedrock::eventstream`]). Bedrock serves every model it hosts in this
//! one shape, so a route to `amazon.nova-pro-v1:0` or `meta.llama3-3-70b-instruct-v1:0`
//! reaches every client dialect through the canonical model.
//!
//! Wire format (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ContentBlock.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolConfiguration.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_TokenUsage.html>):
//!
//! * request: `messages: [{role: "user"|"assistant", content: [block]}]` with blocks
//!   `{text}`, `{image: {format: png|jpeg|gif|webp, source: {bytes: base64}}}`,
//!   `{document: {format, name, source: {bytes}}}`, `{toolUse: {toolUseId, name, input}}`,
//!   `{toolResult: {toolUseId, content: [{text}|{image}], status: success|error}}`;
//!   `system: [{text}]`; `inferenceConfig {maxTokens, temperature, topP, stopSequences}`;
//!   `toolConfig {tools: [{toolSpec: {name, description, inputSchema: {json}}}],
//!   toolChoice: {auto: {}}|{any: {}}|{tool: {name}}}`; `outputConfig {textFormat: {type:
//!   "json_schema", structure: {jsonSchema: {schema, name, description}}}}`
//!   (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_OutputConfig.html>);
//!   the model id is in the path;
//! * response: `output.message.content` (`text`, `toolUse`, `reasoningContent:
//!   {reasoningText: {text, signature}}`), `stopReason` (`end_turn`, `tool_use`,
//!   `max_tokens`, `stop_sequence`, `guardrail_intervened`, `content_filtered`,
//!   `model_context_window_exceeded`), `usage {inputTokens, outputTokens, totalTokens,
//!   cacheReadInputTokens, cacheWriteInputTokens}`, `metrics {latencyMs}`;
//! * errors: Bedrock's `{"message": ...}` bodies typed by status and `x-amzn-ErrorType`
//!   (see [`crate::providers::bedrock`]).
//!
//! Mapping notes: consecutive messages of one role are merged into one (Converse wants the
//! roles to alternate); empty text is left out (Converse refuses blank text blocks).
//! Images and PDFs go inline; a URL source is refused (Converse takes bytes or S3
//! locations only). Text documents become text blocks. A tool result's text and images
//! become its `content`, `is_error` its `status: error`. Call ids keep to Converse's
//! `[a-zA-Z0-9_-]{1,64}` (other characters become `_`, longer ids are cut, alike in a call
//! and its result). A temperature above 1 is clamped to 1 (Converse's range is 0 to 1). A conversation with tool
//! blocks always gets a `toolConfig` (Bedrock refuses it without one): a turn without tools
//! (summarising, compaction) gets one spec per tool the history calls, with a permissive
//! schema. `tool_choice: none` has no Converse equivalent: the tools are left out when the
//! conversation has no tool blocks, else only the tools the history calls go, with the
//! choice left to the model (recorded as dropped). Reasoning history, reasoning settings (model
//! specific, `additionalModelRequestFields`), `parallel_tool_calls`, `user` and a tool's
//! `strict` are dropped. A JSON Schema structured output goes as `outputConfig.textFormat`
//! (`type: json_schema`, the schema as a JSON string); JSON mode has no Converse
//! counterpart and is left out with a record. The answer has no id and no model: Sluice names it `converse-<16 hex>`, the
//! model echo is the standard model anyway. Canonical usage: `input_tokens` =
//! `inputTokens + cacheReadInputTokens + cacheWriteInputTokens` (Bedrock's `inputTokens`
//! leaves the cached ones out, as Anthropic's does), `cache_read_tokens` /
//! `cache_write_tokens` from their members, `output_tokens` = `outputTokens`.

mod stream;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Map, Value};

pub use stream::StreamDecoder;

/// The members that carry generated text: Converse carries answer and reasoning text in
/// `text`, a streamed tool call's argument fragments in `input` (a string there; the
/// non-stream `toolUse.input` is an object, not counted).
pub const TEXT_KEYS: &[&[u8]] = &[b"\"text\"", b"\"input\""];

use super::json::to_vec;
use super::{
    invalid, unsupported, ClientDialect, OutputItem, Part, ProtocolError, Request, Response, Role,
    Source, StopReason, ToolCall, ToolChoice, UpstreamOptions, Usage,
};

// ---------------------------------------------------------------- request

/// Encodes the canonical request as a `Converse` / `ConverseStream` body (the model and
/// the stream choice are in the path, not the body).
///
/// # Errors
/// [`ProtocolError::Unsupported`] for URL images or documents, or a media type Converse
/// does not take; [`ProtocolError::InvalidRequest`] for a
/// conversation with no message.
pub fn encode_request(req: &Request, opts: &UpstreamOptions<'_>) -> Result<Vec<u8>, ProtocolError> {
    let mut messages: Vec<(Role, Vec<Value>)> = Vec::with_capacity(req.messages.len());
    let mut tool_blocks = false;
    for (i, m) in req.messages.iter().enumerate() {
        let mut blocks = Vec::with_capacity(m.parts.len());
        for (j, p) in m.parts.iter().enumerate() {
            tool_blocks |= matches!(p, Part::ToolCall(_) | Part::ToolResult { .. });
            block_json(req, i, j, p, &mut blocks)?;
        }
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((role, prev)) if *role == m.role => prev.extend(blocks),
            _ => messages.push((m.role, blocks)),
        }
    }
    if messages.is_empty() {
        return Err(invalid(
            messages_field(req),
            "at least one user or assistant message is required",
        ));
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| {
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            json!({"role": role, "content": content})
        })
        .collect();
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    let system: Vec<Value> = req
        .system
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| json!({"text": s}))
        .collect();
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    let mut inference = Map::new();
    if let Some(n) = req.max_output_tokens {
        inference.insert("maxTokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        // Converse takes 0 to 1 (OpenAI's scale goes to 2), as Anthropic's.
        inference.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(p) = req.top_p {
        inference.insert("topP".into(), json!(p));
    }
    if !req.stop.is_empty() {
        inference.insert("stopSequences".into(), json!(req.stop));
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if let Some(config) = tool_config(req, tool_blocks) {
        out.insert("toolConfig".into(), config);
    }
    if let Some(config) = output_config(req) {
        out.insert("outputConfig".into(), config);
    }
    if let Some(fields) = claude_reasoning(req, opts) {
        out.insert("additionalModelRequestFields".into(), fields);
    }
    Ok(to_vec(&Value::Object(out)))
}

/// The `outputConfig` of a JSON Schema structured output
/// (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_OutputConfig.html>,
/// <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_OutputFormat.html>,
/// <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_JsonSchemaDefinition.html>):
/// `{"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {"schema": "<the
/// schema as a JSON string>", "name", "description"}}}}`. `None` for plain text and for
/// JSON mode, which Converse lacks (recorded by [`super::dropped_toward`]); `strict` needs
/// no counterpart (the output follows the schema).
fn output_config(req: &Request) -> Option<Value> {
    let Some(super::ResponseFormat::JsonSchema {
        name,
        schema,
        description,
        ..
    }) = &req.response_format
    else {
        return None;
    };
    let mut def = Map::new();
    def.insert("schema".into(), schema.to_string().into());
    if !name.is_empty() {
        def.insert("name".into(), name.as_str().into());
    }
    if let Some(d) = description.as_deref().filter(|d| !d.is_empty()) {
        def.insert("description".into(), d.into());
    }
    Some(json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": def}}}))
}

/// The `toolConfig` of a request
/// (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolConfiguration.html>),
/// `None` when it needs none. `tool_blocks`: the conversation has `toolUse` or `toolResult`
/// blocks, which Bedrock refuses without a `toolConfig` (400 `ValidationException` "The
/// toolConfig field must be defined when using toolUse and toolResult content blocks.").
///
/// * the client's tools, with its choice (`auto` → `{auto: {}}`, `required` → `{any: {}}`,
///   a function → `{tool: {name}}`);
/// * no tools but tool blocks (a summarising or compaction turn): one spec per tool the
///   history calls, in order of first use, with a permissive `{"type": "object",
///   "properties": {}}` schema, and no `toolChoice`;
/// * `tool_choice: none`, which Converse lacks: no `toolConfig` without tool blocks; with
///   them, only the tools the history calls (the client's definition where it gave one),
///   no `toolChoice`: the model could call them ([`tool_choice_dropped`] records it).
fn tool_config(req: &Request, tool_blocks: bool) -> Option<Value> {
    let none = req.tool_choice == Some(ToolChoice::None);
    let client_tools = !req.tools.is_empty() && !none;
    let tools: Vec<Value> = if client_tools {
        req.tools.iter().map(tool_spec).collect()
    } else if tool_blocks {
        let mut names: Vec<&str> = Vec::new();
        for m in &req.messages {
            for p in &m.parts {
                if let Part::ToolCall(c) = p {
                    if !names.contains(&c.name.as_str()) {
                        names.push(&c.name);
                    }
                }
            }
        }
        names
            .into_iter()
            .map(|n| match req.tools.iter().find(|t| t.name == n) {
                Some(t) => tool_spec(t),
                None => tool_spec(&super::Tool {
                    name: n.to_owned(),
                    ..super::Tool::default()
                }),
            })
            .collect()
    } else {
        Vec::new()
    };
    if tools.is_empty() {
        return None;
    }
    let mut config = Map::new();
    config.insert("tools".into(), Value::Array(tools));
    let choice = match &req.tool_choice {
        _ if !client_tools => None,
        Some(ToolChoice::Auto) => Some(json!({"auto": {}})),
        Some(ToolChoice::Required) => Some(json!({"any": {}})),
        Some(ToolChoice::Function(n)) => Some(json!({"tool": {"name": n}})),
        None | Some(ToolChoice::None) => None,
    };
    if let Some(c) = choice {
        config.insert("toolChoice".into(), c);
    }
    Some(Value::Object(config))
}

/// One `toolSpec` (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolSpecification.html>):
/// `{name, description, inputSchema: {json}}`, the schema `{"type": "object",
/// "properties": {}}` when the tool's is not an object.
fn tool_spec(t: &super::Tool) -> Value {
    let mut spec = Map::new();
    spec.insert("name".into(), t.name.as_str().into());
    if let Some(d) = t.description.as_deref().filter(|d| !d.is_empty()) {
        spec.insert("description".into(), d.into());
    }
    let schema = if t.parameters.is_object() {
        t.parameters.clone()
    } else {
        json!({"type": "object", "properties": {}})
    };
    spec.insert("inputSchema".into(), json!({ "json": schema }));
    json!({ "toolSpec": spec })
}

/// Whether a request's `tool_choice: none` cannot be kept toward Converse: the
/// conversation has tool blocks, so a `toolConfig` must go, and Converse has no choice
/// that forbids calls ([`tool_config`]).
pub(crate) fn tool_choice_dropped(req: &Request) -> bool {
    req.tool_choice == Some(ToolChoice::None)
        && req.messages.iter().any(|m| {
            m.parts
                .iter()
                .any(|p| matches!(p, Part::ToolCall(_) | Part::ToolResult { .. }))
        })
}

/// Whether a Bedrock model id is Claude's, which takes Anthropic's thinking settings in
/// `additionalModelRequestFields`
/// (<https://docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-extended-thinking.html>).
pub fn takes_claude_thinking(model: &str) -> bool {
    model.contains("anthropic.claude") || model.contains("claude-")
}

/// The `additionalModelRequestFields` of a request's reasoning settings toward a Claude
/// model: Anthropic's `thinking` (and `output_config.effort`) in the form the model takes
/// ([`super::ThinkingForm`]); `None` without reasoning settings or for another model
/// (recorded as dropped by [`super::dropped_toward`]).
fn claude_reasoning(req: &Request, opts: &UpstreamOptions<'_>) -> Option<Value> {
    let r = req.reasoning.as_ref()?;
    if !takes_claude_thinking(opts.model) {
        return None;
    }
    let form = opts
        .thinking
        .unwrap_or_else(|| super::ThinkingForm::for_model(opts.model));
    let max_tokens = req.max_output_tokens.unwrap_or(opts.default_max_tokens);
    let (thinking, effort) = super::messages::thinking_json(r, max_tokens, form);
    let mut fields = Map::new();
    fields.insert("thinking".into(), thinking?);
    if let Some(e) = effort {
        fields.insert("output_config".into(), json!({ "effort": e }));
    }
    Some(Value::Object(fields))
}

/// The client-dialect name of the messages array, for refused fields.
fn messages_field(req: &Request) -> &'static str {
    match req.source {
        Some(ClientDialect::Responses) => "input",
        _ => "messages",
    }
}

/// The Converse `image.format` of a MIME type.
fn image_format(media_type: &str) -> Option<&'static str> {
    Some(match media_type.to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return None,
    })
}

/// The Converse `document.format` of a MIME type.
fn document_format(media_type: &str) -> Option<&'static str> {
    Some(match media_type.to_ascii_lowercase().as_str() {
        "application/pdf" => "pdf",
        "text/csv" => "csv",
        "text/html" => "html",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "application/msword" => "doc",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/vnd.ms-excel" => "xls",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        _ => return None,
    })
}

/// A document name Converse accepts (letters, digits, single spaces, `-`, `(`, `)`, `[`,
/// `]`), from the client's title or `document {i} {j}`.
fn document_name(title: Option<&str>, i: usize, j: usize) -> String {
    let mut name = String::new();
    for c in title.unwrap_or("").chars() {
        let c = if c.is_ascii_alphanumeric() || "-()[]".contains(c) {
            c
        } else {
            ' '
        };
        if c == ' ' && (name.is_empty() || name.ends_with(' ')) {
            continue;
        }
        name.push(c);
    }
    let name = name.trim_end().chars().take(200).collect::<String>();
    if name.is_empty() {
        format!("document {i} {j}")
    } else {
        name
    }
}

/// The Converse image block of an inline image, or the refusal naming `field`.
fn image_block(source: &Source, field: &dyn Fn() -> String) -> Result<Value, ProtocolError> {
    match source {
        Source::Base64 { media_type, data } => {
            let format = image_format(media_type).ok_or_else(|| {
                unsupported(
                    field(),
                    format!("Bedrock's Converse API takes png, jpeg, gif and webp images, not `{media_type}`"),
                )
            })?;
            Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
        }
        _ => Err(unsupported(
            field(),
            "Bedrock's Converse API takes images inline (base64 data), not by URL",
        )),
    }
}

/// Most characters of a Converse `toolUseId`.
const TOOL_USE_ID_MAX_CHARS: usize = 64;

/// A call id as Converse takes it (`[a-zA-Z0-9_-]{1,64}`): other characters become `_`, a
/// longer id is cut. The same for a call and its result, so they still match; ids Bedrock
/// and the common clients make (`tooluse_…`, `call_…`, `toolu_…`) pass unchanged.
fn tool_use_id(id: &str) -> Cow<'_, str> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !id.is_empty() && id.len() <= TOOL_USE_ID_MAX_CHARS && id.chars().all(ok) {
        return Cow::Borrowed(id);
    }
    let mut out: String = id
        .chars()
        .take(TOOL_USE_ID_MAX_CHARS)
        .map(|c| if ok(c) { c } else { '_' })
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    Cow::Owned(out)
}

/// Appends the Converse blocks of canonical part `p` (message `i`, part `j`).
fn block_json(
    req: &Request,
    i: usize,
    j: usize,
    p: &Part,
    blocks: &mut Vec<Value>,
) -> Result<(), ProtocolError> {
    let field = || format!("{}[{i}].content[{j}]", messages_field(req));
    match p {
        Part::Text(t) if t.trim().is_empty() => {}
        Part::Text(t) => blocks.push(json!({"text": t})),
        Part::Image(s) => blocks.push(image_block(s, &field)?),
        Part::Document { source, title } => match source {
            Source::Text(t) if !t.trim().is_empty() => blocks.push(json!({"text": t})),
            Source::Text(_) => {}
            Source::Base64 { media_type, data } => {
                let format = document_format(media_type).ok_or_else(|| {
                    unsupported(
                        field(),
                        format!("Bedrock's Converse API takes no `{media_type}` documents"),
                    )
                })?;
                blocks.push(json!({"document": {
                    "format": format,
                    "name": document_name(title.as_deref(), i, j),
                    "source": {"bytes": data},
                }}));
            }
            Source::Url(_) => {
                return Err(unsupported(
                    field(),
                    "Bedrock's Converse API takes documents inline (base64 data), not by URL",
                ))
            }
        },
        Part::ToolCall(c) => {
            let input: Value = serde_json::from_str(&c.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::Object(Map::new()));
            blocks.push(json!({"toolUse": {
                "toolUseId": tool_use_id(&c.id),
                "name": c.name,
                "input": input,
            }}));
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => {
            let mut out = Vec::with_capacity(content.len());
            for c in content {
                match c {
                    Part::Text(t) if t.is_empty() => {}
                    Part::Text(t) => out.push(json!({"text": t})),
                    Part::Image(s) => out.push(image_block(s, &field)?),
                    _ => {
                        return Err(unsupported(
                            field(),
                            "a tool result for Bedrock's Converse API holds text and images only",
                        ))
                    }
                }
            }
            if out.is_empty() {
                // Converse wants at least one content block, and no blank text.
                out.push(json!({"json": {}}));
            }
            blocks.push(json!({"toolResult": {
                "toolUseId": tool_use_id(call_id),
                "content": out,
                "status": if *is_error { "error" } else { "success" },
            }}));
        }
        // Reasoning blocks are model specific in Converse; history is dropped.
        Part::Reasoning { .. } => {}
    }
    Ok(())
}

// ---------------------------------------------------------------- response

/// `usage` of a Converse answer or of a ConverseStream `metadata` event (`TokenUsage`).
#[derive(Debug, Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageIn {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_write_input_tokens: Option<u64>,
}

impl UsageIn {
    /// The canonical usage (see the module docs for the mapping).
    pub(crate) fn canonical(&self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_write_input_tokens.unwrap_or(0);
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0) + read + write,
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: write,
            reasoning_tokens: 0,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ResponseIn<'a> {
    #[serde(borrow, default)]
    output: Option<OutputIn<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize, Default)]
struct OutputIn<'a> {
    #[serde(borrow, default)]
    message: Option<MessageIn<'a>>,
}

#[derive(Deserialize, Default)]
struct MessageIn<'a> {
    #[serde(borrow, default)]
    content: Vec<BlockIn<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BlockIn<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_use: Option<ToolUseIn<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<ReasoningIn<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ToolUseIn<'a> {
    #[serde(borrow, default)]
    tool_use_id: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ReasoningIn<'a> {
    #[serde(borrow, default)]
    reasoning_text: Option<ReasoningTextIn<'a>>,
}

#[derive(Deserialize, Default)]
struct ReasoningTextIn<'a> {
    #[serde(borrow, default)]
    text: Cow<'a, str>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
}

/// Converse `stopReason` → canonical
/// (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html#API_runtime_Converse_ResponseSyntax>).
pub(crate) fn stop_from_wire(reason: &str) -> StopReason {
    match reason {
        "tool_use" => StopReason::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "guardrail_intervened" | "content_filtered" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

/// A fresh answer id (Converse answers carry none).
pub(crate) fn answer_id() -> String {
    format!("converse-{:016x}", fastrand::u64(..))
}

/// Decodes a non-streaming `Converse` answer.
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable or without `output.message`.
pub fn decode_response(body: &[u8], now_unix_s: u64) -> Result<Response, ProtocolError> {
    let r: ResponseIn<'_> = serde_json::from_slice(body)
        .map_err(|e| ProtocolError::InvalidUpstream(format!("Converse response: {e}")))?;
    let message = r.output.and_then(|o| o.message).ok_or_else(|| {
        ProtocolError::InvalidUpstream("Converse response has no output.message".into())
    })?;
    let mut output = Vec::with_capacity(message.content.len());
    for b in message.content {
        if let Some(t) = b.tool_use {
            output.push(OutputItem::ToolCall(ToolCall {
                id: t.tool_use_id.into_owned(),
                name: t.name.into_owned(),
                arguments: match t.input {
                    Some(v @ Value::Object(_)) => v.to_string(),
                    _ => "{}".to_string(),
                },
            }));
        } else if let Some(r) = b.reasoning_content.and_then(|r| r.reasoning_text) {
            output.push(OutputItem::Reasoning {
                text: r.text.into_owned(),
                signature: r.signature.map(Cow::into_owned),
            });
        } else if let Some(t) = b.text.filter(|t| !t.is_empty()) {
            output.push(OutputItem::Text(t.into_owned()));
        }
    }
    Ok(Response {
        id: answer_id(),
        created: now_unix_s,
        model: String::new(),
        output,
        stop_reason: stop_from_wire(r.stop_reason.as_deref().unwrap_or("end_turn")),
        stop_sequence: None,
        usage: r.usage.map(|u| u.canonical()).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
