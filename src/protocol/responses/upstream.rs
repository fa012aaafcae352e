//! OpenAI Responses as an **upstream** dialect
//! (<https://platform.openai.com/docs/api-reference/responses/create>): the canonical
//! request encoded as a Responses request, a Responses answer body decoded into the
//! canonical response, the Responses `usage` object, and what the same dialect in and
//! out forwards untranslated ([`FAST_PATH`], [`FORWARDING`]). The stream decoder is
//! [`super::upstream_stream`].
//!
//! Sluice is the store of record: every upstream request says `store: false`, carries the
//! whole conversation in `input` (no `previous_response_id`) and asks for
//! `include: ["reasoning.encrypted_content"]` when reasoning is in play, so that a
//! reasoning item's `encrypted_content` (the canonical reasoning signature) can be sent
//! back in a later turn's `input`.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::super::json::{data_url, opt, to_vec, ErrorObj, Str};
use super::super::wire::{FastPath, Finish, Forwarding, InBandError, Terminal};
use super::super::{
    ErrorKind, OutputItem, Part, ProtocolError, Reasoning, Request, Response, ResponseFormat, Role,
    Source, StopReason, ToolCall, ToolChoice, UpstreamOptions, Usage,
};
use crate::sse::ModelPath;

/// The `include` value that makes a stateless (`store: false`) answer carry its reasoning
/// items' `encrypted_content`.
pub const ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

/// The smallest `max_output_tokens` OpenAI's Responses API takes (a smaller value is a
/// 400, <https://platform.openai.com/docs/api-reference/responses/create#responses-create-max_output_tokens>).
pub const MIN_OUTPUT_TOKENS: u64 = 16;

/// The members that carry generated text in Responses events and bodies (`delta` of the
/// text, reasoning and argument deltas; `text` of whole parts; `arguments`), most frequent
/// first.
pub const TEXT_KEYS: &[&[u8]] = &[b"\"delta\"", b"\"text\"", b"\"arguments\""];

/// Responses in and out: the stream has no `[DONE]`; it ends with `response.completed`,
/// `response.incomplete` or `response.failed` (the last an in-band error, like an
/// `event: error`); the model is named in `response.model` of the `response.*` snapshot
/// events and in the top-level `model` of a whole answer; usage comes in the final
/// snapshot's `response.usage`.
pub static FAST_PATH: FastPath = FastPath {
    terminal: Terminal::Events(&["response.completed", "response.incomplete"]),
    terminator: b"",
    keepalive: None,
    error_event: "error",
    error_events: &["response.failed"],
    error_data_prefix: None,
    decode_error: in_band_error,
    has_content,
    finish: Finish::Events(&["response.completed", "response.incomplete"]),
    requested_usage: None,
    stream_model: ModelPath::new(&["response", "model"]),
    body_model: ModelPath::new(&["model"]),
    forwarding: Some(&FORWARDING),
};

/// What a Responses body forwarded to a Responses upstream has changed besides `model`:
/// `previous_response_id` is left out (Sluice keeps the conversation and has expanded it
/// into `input`), `store` is `false` (nothing is kept at the provider) and `include` gains
/// `reasoning.encrypted_content` (the client's own values kept), so that reasoning survives
/// being sent back.
pub static FORWARDING: Forwarding = Forwarding {
    dropped: &["previous_response_id"],
    set: &[
        ("store", store_false),
        ("include", with_encrypted_reasoning),
    ],
};

/// What a body forwarded to a Responses route's `POST /responses/input_tokens` or
/// `POST /responses/compact` has changed besides `model`: `previous_response_id` is left
/// out (Sluice has expanded it into `input`); neither endpoint takes `store` or `include`.
pub static AUX_FORWARDING: Forwarding = Forwarding {
    dropped: &["previous_response_id"],
    set: &[],
};

fn store_false(_: Option<&Value>) -> Value {
    Value::Bool(false)
}

/// The client's `include` list with `reasoning.encrypted_content` added (once).
fn with_encrypted_reasoning(client: Option<&Value>) -> Value {
    let mut list: Vec<Value> = client
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !list.iter().any(|v| v.as_str() == Some(ENCRYPTED_REASONING)) {
        list.push(ENCRYPTED_REASONING.into());
    }
    Value::Array(list)
}

/// Whether a Responses event's data carries generated output: a non-empty `delta` (text,
/// refusal, reasoning, argument deltas). A byte check.
fn has_content(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"delta\":\"";
    memchr::memmem::find(data, KEY)
        .is_some_and(|at| data.get(at + KEY.len()).is_some_and(|&b| b != b'"'))
}

/// An in-band `error` event (`{"type":"error","code","message"}`) or `response.failed`
/// (`{"response":{"error":{"code","message"}}}`) of a Responses stream.
#[cold]
fn in_band_error(data: &[u8]) -> InBandError {
    let e = match decode_stream_error(data) {
        ProtocolError::Upstream { kind, message } => (kind, message),
        other => (ErrorKind::Api, other.to_string()),
    };
    InBandError {
        kind: e.0,
        error_type: e.0.openai_type().to_string(),
        message: e.1,
    }
}

/// The canonical error of an `error` event or a `response.failed` snapshot.
pub(crate) fn decode_stream_error(data: &[u8]) -> ProtocolError {
    #[derive(Deserialize)]
    struct Failed<'a> {
        #[serde(borrow, default)]
        response: Option<FailedResponse<'a>>,
        #[serde(borrow, default)]
        code: Option<Str<'a>>,
        #[serde(borrow, default)]
        message: Option<Str<'a>>,
        #[serde(borrow, default)]
        error: Option<ErrorObj<'a>>,
    }
    #[derive(Deserialize)]
    struct FailedResponse<'a> {
        #[serde(borrow, default)]
        error: Option<ErrorObj<'a>>,
    }
    match serde_json::from_slice::<Failed<'_>>(data) {
        Ok(f) => {
            if let Some(e) = f.response.and_then(|r| r.error).or(f.error) {
                return e.to_error(ErrorKind::Api);
            }
            ErrorObj {
                ty: None,
                code: f.code,
                message: f.message,
            }
            .to_error(ErrorKind::Api)
        }
        Err(e) => ProtocolError::InvalidUpstream(format!("responses error event: {e}")),
    }
}

// ---------------------------------------------------------------- request

/// Encodes the canonical request as a Responses upstream body: system prompts as
/// `instructions`, the conversation as `input` items (`message`, `function_call`,
/// `function_call_output`, `reasoning` with its signature as `encrypted_content`; reasoning
/// without a signature is left out, OpenAI cannot take it back), function tools, web
/// search as the hosted `web_search` tool, effort as `reasoning.effort`, structured output
/// as `text.format`, and always `store: false`.
///
/// # Errors
/// [`ProtocolError::Unsupported`] for text given as an image source.
pub fn encode_request(req: &Request, opts: &UpstreamOptions<'_>) -> Result<Vec<u8>, ProtocolError> {
    let (input, has_reasoning_history) = encode_input(req)?;
    let mut out = Map::new();
    out.insert("model".into(), opts.model.into());
    if !req.system.is_empty() {
        out.insert("instructions".into(), req.system.join("\n\n").into());
    }
    out.insert("input".into(), Value::Array(input));
    encode_tools(req, &mut out);
    if let Some(n) = req.max_output_tokens {
        // OpenAI refuses a limit below its minimum (a 400): a smaller one is raised to it.
        out.insert("max_output_tokens".into(), n.max(MIN_OUTPUT_TOKENS).into());
    }
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(u) = &req.user {
        out.insert("user".into(), u.as_str().into());
    }
    let effort = req.reasoning.as_ref().and_then(Reasoning::effort);
    if let Some(e) = effort {
        out.insert("reasoning".into(), json!({"effort": e.openai()}));
    }
    let reasoning_on = req.reasoning.as_ref().is_some_and(|r| !r.off());
    if reasoning_on || has_reasoning_history {
        out.insert("include".into(), json!([ENCRYPTED_REASONING]));
    }
    match &req.response_format {
        None => {}
        Some(ResponseFormat::JsonObject) => {
            out.insert("text".into(), json!({"format": {"type": "json_object"}}));
        }
        Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
            description,
        }) => {
            let mut f = Map::new();
            f.insert("type".into(), "json_schema".into());
            f.insert("name".into(), name.as_str().into());
            f.insert("schema".into(), schema.clone());
            if let Some(s) = strict {
                f.insert("strict".into(), (*s).into());
            }
            if let Some(d) = description {
                f.insert("description".into(), d.as_str().into());
            }
            out.insert("text".into(), json!({"format": f}));
        }
    }
    out.insert("store".into(), false.into());
    if req.stream {
        out.insert("stream".into(), true.into());
    }
    Ok(to_vec(&Value::Object(out)))
}

/// The conversation as `input` items, and whether it gives reasoning back.
fn encode_input(req: &Request) -> Result<(Vec<Value>, bool), ProtocolError> {
    let mut input = Vec::with_capacity(req.messages.len());
    let mut has_reasoning_history = false;
    for m in &req.messages {
        match m.role {
            Role::User => {
                let mut content = Vec::new();
                for p in &m.parts {
                    match p {
                        Part::ToolResult {
                            call_id,
                            content: c,
                            ..
                        } => {
                            flush_message(&mut input, "user", &mut content);
                            input.push(json!({
                                "type": "function_call_output",
                                "call_id": call_id,
                                "output": tool_output(c)?,
                            }));
                        }
                        other => content.push(input_part(other)?),
                    }
                }
                flush_message(&mut input, "user", &mut content);
            }
            Role::Assistant => {
                let mut content = Vec::new();
                for p in &m.parts {
                    match p {
                        Part::Text(t) => {
                            content.push(json!({"type": "output_text", "text": t}));
                        }
                        Part::ToolCall(c) => {
                            flush_message(&mut input, "assistant", &mut content);
                            input.push(json!({
                                "type": "function_call", "call_id": c.id, "name": c.name,
                                "arguments": c.arguments
                            }));
                        }
                        Part::Reasoning {
                            text,
                            signature: Some(sig),
                        } => {
                            flush_message(&mut input, "assistant", &mut content);
                            has_reasoning_history = true;
                            let summary = if text.is_empty() {
                                json!([])
                            } else {
                                json!([{"type": "summary_text", "text": text}])
                            };
                            input.push(json!({
                                "type": "reasoning", "summary": summary, "encrypted_content": sig
                            }));
                        }
                        // Unsigned reasoning (another provider's thinking text) cannot be
                        // given back to OpenAI; images and results belong to user turns.
                        _ => {}
                    }
                }
                flush_message(&mut input, "assistant", &mut content);
            }
        }
    }
    Ok((input, has_reasoning_history))
}

/// `tools` (functions, `strict` only when the client asked for it, and web search as the
/// hosted `web_search` tool), `parallel_tool_calls` and `tool_choice` into `out`.
fn encode_tools(req: &Request, out: &mut Map<String, Value>) {
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            let mut f = Map::new();
            f.insert("type".into(), "function".into());
            f.insert("name".into(), t.name.as_str().into());
            if let Some(d) = &t.description {
                f.insert("description".into(), d.as_str().into());
            }
            f.insert("parameters".into(), t.parameters.clone());
            // The Responses API takes a function as strict unless told otherwise (Chat
            // Completions and Messages do not): a tool that did not ask for it says so.
            f.insert("strict".into(), t.strict.unwrap_or(false).into());
            Value::Object(f)
        })
        .collect();
    if let Some(ws) = &req.web_search {
        let mut t = Map::new();
        t.insert("type".into(), "web_search".into());
        if !ws.allowed_domains.is_empty() {
            t.insert(
                "filters".into(),
                json!({"allowed_domains": ws.allowed_domains}),
            );
        }
        if let Some(loc) = &ws.user_location {
            let mut l = loc.clone();
            l.insert("type".into(), "approximate".into());
            t.insert("user_location".into(), Value::Object(l));
        }
        tools.push(Value::Object(t));
    }
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        if let Some(p) = req.parallel_tool_calls {
            out.insert("parallel_tool_calls".into(), p.into());
        }
    }
    if let Some(c) = &req.tool_choice {
        out.insert(
            "tool_choice".into(),
            match c {
                ToolChoice::Auto => "auto".into(),
                ToolChoice::Required => "required".into(),
                ToolChoice::None => "none".into(),
                ToolChoice::Function(n) => json!({"type": "function", "name": n}),
            },
        );
    }
}

/// Appends a `message` item of `role` with `content` (emptied), if there is any.
fn flush_message(input: &mut Vec<Value>, role: &str, content: &mut Vec<Value>) {
    if content.is_empty() {
        return;
    }
    input.push(json!({
        "type": "message", "role": role, "content": std::mem::take(content)
    }));
}

/// A user content part as a Responses input part.
fn input_part(p: &Part) -> Result<Value, ProtocolError> {
    Ok(match p {
        Part::Text(t) => json!({"type": "input_text", "text": t}),
        Part::Image(Source::Url(u)) => json!({"type": "input_image", "image_url": u}),
        Part::Image(Source::Base64 { media_type, data }) => {
            json!({"type": "input_image", "image_url": data_url(media_type, data)})
        }
        Part::Image(Source::Text(_)) => {
            return Err(super::super::unsupported(
                "image.source",
                "text is not an image source",
            ))
        }
        Part::Document {
            source: Source::Base64 { media_type, data },
            title,
        } => json!({
            "type": "input_file", "file_data": data_url(media_type, data),
            "filename": title.as_deref().unwrap_or("document.pdf")
        }),
        Part::Document {
            source: Source::Url(u),
            ..
        } => json!({"type": "input_file", "file_url": u}),
        Part::Document {
            source: Source::Text(t),
            ..
        } => json!({"type": "input_text", "text": t}),
        Part::Reasoning { .. } | Part::ToolCall(_) | Part::ToolResult { .. } => {
            return Err(super::super::invalid(
                "messages",
                "reasoning and tool calls belong to assistant turns",
            ))
        }
    })
}

/// A tool result's content as a `function_call_output.output`: a string when it is all
/// text, else a list of input parts.
fn tool_output(content: &[Part]) -> Result<Value, ProtocolError> {
    if content.iter().all(|p| matches!(p, Part::Text(_))) {
        let text: Vec<&str> = content
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        return Ok(text.join("\n").into());
    }
    content
        .iter()
        .map(input_part)
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

// ---------------------------------------------------------------- usage

/// A Responses `usage` object: `input_tokens` (cached included),
/// `input_tokens_details.cached_tokens`, `output_tokens` (reasoning included),
/// `output_tokens_details.reasoning_tokens`.
#[derive(Deserialize, Default, Clone, Copy)]
pub(crate) struct UsageIn {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl UsageIn {
    /// The canonical usage (the same convention: input includes cached tokens).
    pub(crate) fn canonical(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_read_tokens: self
                .input_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: self
                .output_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

// ---------------------------------------------------------------- response

/// One Responses response object (a whole answer, or a stream's final snapshot).
#[derive(Deserialize)]
pub(crate) struct ResponseIn<'a> {
    #[serde(borrow, default)]
    pub(crate) id: Option<Str<'a>>,
    #[serde(default)]
    pub(crate) created_at: Option<u64>,
    #[serde(borrow, default)]
    pub(crate) model: Option<Str<'a>>,
    #[serde(borrow, default)]
    pub(crate) status: Option<Str<'a>>,
    #[serde(default)]
    pub(crate) output: Vec<Value>,
    #[serde(default)]
    pub(crate) usage: Option<UsageIn>,
    #[serde(borrow, default)]
    pub(crate) error: Option<ErrorObj<'a>>,
    #[serde(borrow, default)]
    pub(crate) incomplete_details: Option<IncompleteIn<'a>>,
}

/// `incomplete_details`: why an answer is incomplete.
#[derive(Deserialize)]
pub(crate) struct IncompleteIn<'a> {
    #[serde(borrow, default)]
    pub(crate) reason: Option<Str<'a>>,
}

/// The stop reason of a response of `status` (with `incomplete_details.reason`), given
/// whether it called tools: `incomplete` for `max_output_tokens` is [`StopReason::MaxTokens`],
/// for `content_filter` [`StopReason::ContentFilter`]; a completed answer with calls is
/// [`StopReason::ToolUse`].
pub(crate) fn stop_of(status: Option<&str>, reason: Option<&str>, called: bool) -> StopReason {
    match (status, reason) {
        (Some("incomplete"), Some("content_filter")) => StopReason::ContentFilter,
        (Some("incomplete"), _) => StopReason::MaxTokens,
        _ if called => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

/// A namespaced call's canonical name (`{namespace}__{name}`, as its tool was flattened).
pub(crate) fn call_name(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_string(),
    }
}

/// The canonical output of one Responses output item, if it has one: `message` text
/// (`output_text`, `refusal`), `reasoning` (summaries joined by a blank line, the
/// `encrypted_content` as its signature), `function_call`, `custom_tool_call` (its input as
/// the `input` argument). Hosted tool items (`web_search_call`, …) have none.
pub(crate) fn output_of(item: &Value) -> Vec<OutputItem> {
    let s = |k: &str| item.get(k).and_then(Value::as_str);
    match s("type") {
        Some("message") => item
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                Some("output_text") => p.get("text").and_then(Value::as_str),
                Some("refusal") => p.get("refusal").and_then(Value::as_str),
                _ => None,
            })
            .filter(|t| !t.is_empty())
            .map(|t| OutputItem::Text(t.to_string()))
            .collect(),
        Some("reasoning") => {
            let text = reasoning_text(item);
            let signature = s("encrypted_content").map(str::to_string);
            if text.is_empty() && signature.is_none() {
                return Vec::new();
            }
            vec![OutputItem::Reasoning { text, signature }]
        }
        Some("function_call") => vec![OutputItem::ToolCall(ToolCall {
            id: s("call_id").unwrap_or_default().to_string(),
            name: call_name(s("name").unwrap_or_default(), s("namespace")),
            arguments: match s("arguments") {
                Some(a) if !a.trim().is_empty() => a.to_string(),
                _ => "{}".into(),
            },
        })],
        Some("custom_tool_call") => vec![OutputItem::ToolCall(ToolCall {
            id: s("call_id").unwrap_or_default().to_string(),
            name: s("name").unwrap_or_default().to_string(),
            arguments: json!({"input": s("input").unwrap_or_default()}).to_string(),
        })],
        _ => Vec::new(),
    }
}

/// A reasoning item's text: its summaries (else its `content` reasoning text), joined by a
/// blank line.
fn reasoning_text(item: &Value) -> String {
    let texts = |k: &str| -> Vec<&str> {
        item.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()
    };
    let summary = texts("summary");
    if summary.is_empty() {
        texts("content").join("\n\n")
    } else {
        summary.join("\n\n")
    }
}

impl ResponseIn<'_> {
    /// The canonical response (`now_unix_s` when the answer has no `created_at`).
    ///
    /// # Errors
    /// [`ProtocolError::Upstream`] for a `failed` answer or one with an `error`.
    pub(crate) fn canonical(&self, now_unix_s: u64) -> Result<Response, ProtocolError> {
        if let Some(e) = &self.error {
            return Err(e.to_error(ErrorKind::Api));
        }
        if opt(&self.status) == Some("failed") {
            return Err(ProtocolError::Upstream {
                kind: ErrorKind::Api,
                message: "the upstream response failed".into(),
            });
        }
        let output: Vec<OutputItem> = self.output.iter().flat_map(output_of).collect();
        let called = output.iter().any(|o| matches!(o, OutputItem::ToolCall(_)));
        Ok(Response {
            id: opt(&self.id).unwrap_or_default().to_string(),
            created: self.created_at.unwrap_or(now_unix_s),
            model: opt(&self.model).unwrap_or_default().to_string(),
            stop_reason: stop_of(
                opt(&self.status),
                self.incomplete_details
                    .as_ref()
                    .and_then(|d| opt(&d.reason)),
                called,
            ),
            stop_sequence: None,
            usage: self.usage.map(|u| u.canonical()).unwrap_or_default(),
            output,
        })
    }
}

/// Decodes a non-streaming Responses answer (`{"id","object":"response","created_at",
/// "status","model","output":[…],"usage":{…}}`).
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable, [`ProtocolError::Upstream`] for an
/// error body or a failed response.
pub fn decode_response(body: &[u8], now_unix_s: u64) -> Result<Response, ProtocolError> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        error: Option<ErrorObj<'a>>,
    }
    let r: ResponseIn<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            if let Ok(Envelope { error: Some(err) }) = serde_json::from_slice(body) {
                return Err(err.to_error(ErrorKind::Api));
            }
            return Err(ProtocolError::InvalidUpstream(format!(
                "responses body: {e}"
            )));
        }
    };
    r.canonical(now_unix_s)
}
