//! The Gemini API dialect (upstream side only): `GenerateContentRequest` encoded from the
//! canonical request, `GenerateContentResponse` decoded into the canonical response, its
//! `usageMetadata` mapped to canonical usage, and Google's error model. The stream decoder
//! ([`StreamDecoder`]) reads `streamGenerateContent?alt=sse`, whose every SSE `data:` is
//! one `GenerateContentResponse` chunk. Vertex AI serves the same body for its Gemini
//! models, so a Vertex kind reuses these converters with its own address and signer.
//!
//! Wire format (<https://ai.google.dev/api/generate-content>,
//! <https://ai.google.dev/api/caching#Content>, <https://ai.google.dev/api/caching#Tool>):
//!
//! * request: `contents: [{role: "user"|"model", parts: [...]}]`, `systemInstruction:
//!   {parts: [{text}]}`, `tools: [{functionDeclarations: [{name, description,
//!   parametersJsonSchema}]}]`, `toolConfig.functionCallingConfig {mode: AUTO|ANY|NONE,
//!   allowedFunctionNames}`, `generationConfig {maxOutputTokens, temperature, topP,
//!   stopSequences, responseMimeType, responseJsonSchema, thinkingConfig.thinkingBudget}`;
//!   parts are `{text}`, `{inlineData: {mimeType, data}}`, `{functionCall: {name, args}}`,
//!   `{functionResponse: {name, response}}`;
//! * response: `candidates[0].content.parts` (`text`, `thought: true` for reasoning,
//!   `functionCall`), `candidates[0].finishReason`, `promptFeedback.blockReason`,
//!   `usageMetadata {promptTokenCount, candidatesTokenCount, cachedContentTokenCount,
//!   thoughtsTokenCount}`, `modelVersion`, `responseId`;
//! * errors (<https://ai.google.dev/gemini-api/docs/troubleshooting>,
//!   <https://cloud.google.com/apis/design/errors>): `{"error": {"code": 429, "message",
//!   "status": "RESOURCE_EXHAUSTED", "details": [...]}}`.
//!
//! Mapping notes: Gemini function calls carry no id (newer models may send one, which is
//! kept); Sluice names them `call_<16 hex>_<n>` and finds a tool result's function name
//! from the call with that id earlier in the conversation (`functionResponse` is matched
//! by name). A call's `thoughtSignature` (thinking models; Gemini 3 rejects a function-call
//! turn sent back without it, <https://ai.google.dev/gemini-api/docs/thought-signatures>)
//! travels inside the id, `call_<16 hex>_<n>_<signature in base64url>`, so every client
//! dialect carries it back verbatim and the call gets it again. A tool result becomes `response: {"output": …}` (`{"error": …}` when the
//! tool failed; a JSON object result is sent as is), as the `FunctionResponse` reference
//! describes. Images and PDFs go inline (`inlineData`); a URL source is refused (the Gemini
//! API fetches no http URLs). Reasoning history and thinking signatures are dropped.
//! Canonical usage: `input_tokens` = `promptTokenCount` (cached included),
//! `cache_read_tokens` = `cachedContentTokenCount`, `output_tokens` =
//! `candidatesTokenCount + thoughtsTokenCount`, `reasoning_tokens` = `thoughtsTokenCount`.

mod stream;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Map, Value};

pub use stream::StreamDecoder;

/// The members that carry generated text: Gemini parts carry text (answer and thoughts) in
/// `text`; `functionCall.args` is an object, not counted.
pub const TEXT_KEYS: &[&[u8]] = &[b"\"text\""];

use super::json::to_vec;
use super::{
    invalid, unsupported, ClientDialect, ErrorKind, Message, OutputItem, Part, ProtocolError,
    Request, Response, ResponseFormat, Role, Source, StopReason, ToolCall, ToolChoice,
    UpstreamOptions, Usage,
};

// ---------------------------------------------------------------- request

/// Encodes the canonical request as a `GenerateContentRequest` body (the model and the
/// stream choice are in the URL, not the body).
///
/// # Errors
/// [`ProtocolError::Unsupported`] for URL images or documents and for a tool result whose
/// call is not in the conversation; [`ProtocolError::InvalidRequest`] for a conversation
/// with no message.
pub fn encode_request(req: &Request, opts: &UpstreamOptions<'_>) -> Result<Vec<u8>, ProtocolError> {
    let mut contents = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let mut parts = Vec::with_capacity(m.parts.len());
        for (j, p) in m.parts.iter().enumerate() {
            part_json(req, i, j, p, &mut parts)?;
        }
        if parts.is_empty() {
            continue;
        }
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "model",
        };
        contents.push(json!({"role": role, "parts": parts}));
    }
    if contents.is_empty() {
        return Err(invalid(
            "messages",
            "at least one user or assistant message is required",
        ));
    }
    let mut out = Map::new();
    out.insert("contents".into(), Value::Array(contents));
    if !req.system.is_empty() {
        let parts: Vec<Value> = req.system.iter().map(|s| json!({"text": s})).collect();
        out.insert("systemInstruction".into(), json!({"parts": parts}));
    }
    if !req.tools.is_empty() {
        let decls: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("name".into(), t.name.as_str().into());
                if let Some(d) = &t.description {
                    o.insert("description".into(), d.as_str().into());
                }
                if !t.parameters.is_null() {
                    // JSON Schema as the client wrote it (`parameters` would need Google's
                    // OpenAPI subset).
                    o.insert("parametersJsonSchema".into(), t.parameters.clone());
                }
                Value::Object(o)
            })
            .collect();
        let mut tools = vec![json!({ "functionDeclarations": decls })];
        if req.web_search.is_some() {
            tools.push(json!({"googleSearch": {}}));
        }
        out.insert("tools".into(), Value::Array(tools));
        let config = match &req.tool_choice {
            None => None,
            Some(ToolChoice::Auto) => Some(json!({"mode": "AUTO"})),
            Some(ToolChoice::Required) => Some(json!({"mode": "ANY"})),
            Some(ToolChoice::None) => Some(json!({"mode": "NONE"})),
            Some(ToolChoice::Function(n)) => {
                Some(json!({"mode": "ANY", "allowedFunctionNames": [n]}))
            }
        };
        if let Some(c) = config {
            out.insert("toolConfig".into(), json!({ "functionCallingConfig": c }));
        }
    } else if req.web_search.is_some() {
        // Google Search grounding, Gemini's own web search.
        out.insert("tools".into(), json!([{"googleSearch": {}}]));
    }
    let mut gen = Map::new();
    if let Some(n) = req.max_output_tokens {
        gen.insert("maxOutputTokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        gen.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        gen.insert("topP".into(), json!(p));
    }
    if !req.stop.is_empty() {
        gen.insert("stopSequences".into(), json!(req.stop));
    }
    match &req.response_format {
        None => {}
        Some(ResponseFormat::JsonObject) => {
            gen.insert("responseMimeType".into(), "application/json".into());
        }
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            gen.insert("responseMimeType".into(), "application/json".into());
            gen.insert("responseJsonSchema".into(), schema.clone());
        }
    }
    if let Some(r) = &req.reasoning {
        if let Some(t) = thinking_config(r, opts.model) {
            gen.insert("thinkingConfig".into(), t);
        }
    }
    if !gen.is_empty() {
        out.insert("generationConfig".into(), Value::Object(gen));
    }
    Ok(to_vec(&Value::Object(out)))
}

/// Gemini's `thinkingConfig` for canonical reasoning `r`
/// (<https://ai.google.dev/gemini-api/docs/thinking>): Gemini 3 models take a
/// `thinkingLevel` (`minimal`, `low`, `medium`, `high`: `none` becomes `minimal`, `xhigh`
/// and `max` `high`); earlier ones a `thinkingBudget` in tokens (reasoning off: 0; adaptive
/// without an effort: -1, the model decides).
fn thinking_config(r: &super::Reasoning, model: &str) -> Option<Value> {
    use super::Effort;
    if model.contains("gemini-3") {
        let effort = if r.off() {
            Some(Effort::None)
        } else {
            r.effort()
        }?;
        let level = match effort {
            Effort::None | Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High | Effort::XHigh | Effort::Max => "high",
        };
        return Some(json!({ "thinkingLevel": level }));
    }
    if r.off() {
        return Some(json!({"thinkingBudget": 0}));
    }
    // Gemini 2.5's largest budgets (Pro 32768, Flash and Flash-Lite 24576): a bigger one is
    // a 400, so Anthropic's `xhigh` and `max` budgets are cut to them.
    let ceiling = if model.contains("pro") {
        32_768
    } else {
        24_576
    };
    match r.budget() {
        Some(b) => Some(json!({ "thinkingBudget": b.min(ceiling) })),
        None if r.adaptive => Some(json!({"thinkingBudget": -1})),
        None => None,
    }
}

/// The client-dialect name of the messages array, for refused fields.
fn messages_field(req: &Request) -> &'static str {
    match req.source {
        Some(ClientDialect::Responses) => "input",
        _ => "messages",
    }
}

/// Appends the Gemini parts of canonical part `p` (message `i`, part `j`).
fn part_json(
    req: &Request,
    i: usize,
    j: usize,
    p: &Part,
    parts: &mut Vec<Value>,
) -> Result<(), ProtocolError> {
    let field = || format!("{}[{i}].content[{j}]", messages_field(req));
    match p {
        Part::Text(t) if t.is_empty() => {}
        Part::Text(t) => parts.push(json!({"text": t})),
        Part::Image(s) | Part::Document { source: s, .. } => {
            match s {
                Source::Base64 { media_type, data } => {
                    parts.push(json!({"inlineData": {"mimeType": media_type, "data": data}}));
                }
                Source::Text(t) => parts.push(json!({"text": t})),
                Source::Url(_) => return Err(unsupported(
                    field(),
                    "the Gemini API takes images and documents inline (base64 data), not by URL",
                )),
            }
        }
        Part::ToolCall(c) => {
            let args: Value = serde_json::from_str(&c.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::Object(Map::new()));
            let mut part = json!({"functionCall": {"name": c.name, "args": args}});
            if let Some(sig) = signature_of(&c.id) {
                part["thoughtSignature"] = sig.into();
            }
            parts.push(part);
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => {
            let name = call_name(&req.messages[..i], call_id).ok_or_else(|| {
                unsupported(
                    field(),
                    format!(
                        "no earlier assistant tool call has id `{call_id}` (Gemini matches tool results by function name)"
                    ),
                )
            })?;
            let mut text = String::new();
            let mut inline = Vec::new();
            for c in content {
                match c {
                    Part::Text(t) => text.push_str(t),
                    Part::Image(Source::Base64 { media_type, data }) => {
                        inline.push(json!({"inlineData": {"mimeType": media_type, "data": data}}))
                    }
                    _ => {
                        return Err(unsupported(
                            field(),
                            "a tool result for the Gemini API holds text and inline images only",
                        ))
                    }
                }
            }
            let response = match serde_json::from_str::<Value>(&text) {
                Ok(v @ Value::Object(_)) if !is_error => v,
                _ if *is_error => json!({ "error": text }),
                _ => json!({ "output": text }),
            };
            parts.push(json!({"functionResponse": {"name": name, "response": response}}));
            parts.extend(inline);
        }
        // Gemini's thought signatures have no canonical carrier: reasoning history is dropped.
        Part::Reasoning { .. } => {}
    }
    Ok(())
}

/// The function name of the tool call `call_id` in `history`, latest first.
fn call_name<'r>(history: &'r [Message], call_id: &str) -> Option<&'r str> {
    history.iter().rev().find_map(|m| {
        m.parts.iter().find_map(|p| match p {
            Part::ToolCall(c) if c.id == call_id => Some(c.name.as_str()),
            _ => None,
        })
    })
}

// ---------------------------------------------------------------- response

/// `usageMetadata` of a `GenerateContentResponse` (token counts).
#[derive(Debug, Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageIn {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
    #[serde(default)]
    tool_use_prompt_token_count: Option<u64>,
}

impl UsageIn {
    /// The canonical usage (see the module docs for the mapping).
    pub(crate) fn canonical(&self) -> Usage {
        let thoughts = self.thoughts_token_count.unwrap_or(0);
        Usage {
            input_tokens: self.prompt_token_count.unwrap_or(0)
                + self.tool_use_prompt_token_count.unwrap_or(0),
            output_tokens: self.candidates_token_count.unwrap_or(0) + thoughts,
            cache_read_tokens: self.cached_content_token_count.unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: thoughts,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResponseIn<'a> {
    #[serde(borrow, default)]
    pub(crate) candidates: Vec<CandidateIn<'a>>,
    #[serde(borrow, default)]
    pub(crate) prompt_feedback: Option<PromptFeedbackIn<'a>>,
    #[serde(default)]
    pub(crate) usage_metadata: Option<UsageIn>,
    #[serde(borrow, default)]
    pub(crate) model_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) response_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) error: Option<ErrorIn<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PromptFeedbackIn<'a> {
    #[serde(borrow, default)]
    pub(crate) block_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CandidateIn<'a> {
    #[serde(borrow, default)]
    pub(crate) content: Option<ContentIn<'a>>,
    #[serde(borrow, default)]
    pub(crate) finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct ContentIn<'a> {
    #[serde(borrow, default)]
    pub(crate) parts: Vec<PartIn<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartIn<'a> {
    #[serde(borrow, default)]
    pub(crate) text: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(crate) thought: bool,
    #[serde(borrow, default)]
    pub(crate) function_call: Option<FunctionCallIn<'a>>,
    #[serde(borrow, default)]
    pub(crate) thought_signature: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct FunctionCallIn<'a> {
    #[serde(borrow, default)]
    pub(crate) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) name: Cow<'a, str>,
    #[serde(default)]
    pub(crate) args: Option<Value>,
}

impl FunctionCallIn<'_> {
    /// The arguments as JSON text (`{}` when absent or not an object).
    pub(crate) fn arguments(&self) -> String {
        match &self.args {
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => "{}".to_string(),
        }
    }
}

/// The tool-call id Sluice gives call `n` of a response: Gemini's own id when it sent one
/// and no signature, else `call_<16 hex>_<n>`, with the call's `thoughtSignature` appended
/// in base64url (`_<sig>`) when it has one (see the module docs).
pub(crate) fn call_id(n: u32, own: Option<&str>, signature: Option<&str>) -> String {
    let signature = signature.filter(|s| !s.is_empty());
    if let (Some(id), None) = (own, signature) {
        return id.to_string();
    }
    let mut id = format!("call_{:016x}_{n}", fastrand::u64(..));
    if let Some(sig) = signature {
        id.reserve(sig.len() + 1);
        id.push('_');
        for c in sig.chars() {
            match c {
                '+' => id.push('-'),
                '/' => id.push('_'),
                '=' => {}
                c => id.push(c),
            }
        }
    }
    id
}

/// The `thoughtSignature` carried in a tool-call id made by [`call_id`] (standard base64,
/// padding restored), `None` for any other id.
pub(crate) fn signature_of(call_id: &str) -> Option<String> {
    let rest = call_id.strip_prefix("call_")?;
    let (hex, rest) = rest.split_once('_')?;
    let (n, sig) = rest.split_once('_')?;
    let ok = hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && !sig.is_empty()
        && sig
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        return None;
    }
    let mut out: String = sig
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    Some(out)
}

/// Gemini `finishReason` → canonical (`STOP` with function calls is a tool use:
/// Gemini has no finish reason of its own for it).
/// <https://ai.google.dev/api/generate-content#FinishReason>
pub(crate) fn stop_from_wire(reason: &str, called_tools: bool) -> StopReason {
    match reason {
        "MAX_TOKENS" => StopReason::MaxTokens,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => StopReason::ContentFilter,
        _ if called_tools => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    }
}

/// Decodes a non-streaming `GenerateContentResponse`.
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable, [`ProtocolError::Upstream`] for an
/// error body.
pub fn decode_response(body: &[u8], now_unix_s: u64) -> Result<Response, ProtocolError> {
    let r: ResponseIn<'_> = serde_json::from_slice(body)
        .map_err(|e| ProtocolError::InvalidUpstream(format!("Gemini response: {e}")))?;
    if let Some(e) = &r.error {
        return Err(e.to_error(500));
    }
    let mut output = Vec::new();
    let mut calls = 0u32;
    let mut stop_reason = StopReason::EndTurn;
    if let Some(c) = r.candidates.first() {
        for p in c.content.iter().flat_map(|c| c.parts.iter()) {
            if let Some(f) = &p.function_call {
                output.push(OutputItem::ToolCall(ToolCall {
                    id: call_id(calls, f.id.as_deref(), p.thought_signature.as_deref()),
                    name: f.name.to_string(),
                    arguments: f.arguments(),
                }));
                calls += 1;
            } else if let Some(t) = p.text.as_deref().filter(|t| !t.is_empty()) {
                output.push(if p.thought {
                    OutputItem::Reasoning {
                        text: t.to_string(),
                        signature: None,
                    }
                } else {
                    OutputItem::Text(t.to_string())
                });
            }
        }
        stop_reason = stop_from_wire(c.finish_reason.as_deref().unwrap_or("STOP"), calls > 0);
    } else if r
        .prompt_feedback
        .as_ref()
        .is_some_and(|f| f.block_reason.is_some())
    {
        stop_reason = StopReason::ContentFilter;
    }
    Ok(Response {
        id: r.response_id.as_deref().unwrap_or("").to_string(),
        created: now_unix_s,
        model: r.model_version.as_deref().unwrap_or("").to_string(),
        output,
        stop_reason,
        stop_sequence: None,
        usage: r.usage_metadata.map(|u| u.canonical()).unwrap_or_default(),
    })
}

// ---------------------------------------------------------------- errors

/// Google's error object (`{"code", "message", "status"}`).
#[derive(Deserialize, Default)]
pub(crate) struct ErrorIn<'a> {
    #[serde(default)]
    code: Option<u16>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
}

impl ErrorIn<'_> {
    /// The canonical error: kind from the `status` name, else from the code, else from
    /// `http_status`.
    pub(crate) fn to_error(&self, http_status: u16) -> ProtocolError {
        let kind = self
            .status
            .as_deref()
            .and_then(kind_of_status)
            .unwrap_or_else(|| ErrorKind::from_status(self.code.unwrap_or(http_status)));
        ProtocolError::Upstream {
            kind,
            message: self
                .message
                .as_deref()
                .unwrap_or("upstream reported an error")
                .to_string(),
        }
    }
}

/// A `google.rpc.Code` name → canonical kind
/// (<https://cloud.google.com/apis/design/errors#handling_errors>).
fn kind_of_status(status: &str) -> Option<ErrorKind> {
    Some(match status {
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => ErrorKind::InvalidRequest,
        "UNAUTHENTICATED" => ErrorKind::Authentication,
        "PERMISSION_DENIED" => ErrorKind::Permission,
        "NOT_FOUND" => ErrorKind::NotFound,
        "RESOURCE_EXHAUSTED" => ErrorKind::RateLimit,
        "UNAVAILABLE" => ErrorKind::Overloaded,
        "DEADLINE_EXCEEDED" => ErrorKind::Timeout,
        "INTERNAL" | "UNKNOWN" | "DATA_LOSS" | "ABORTED" | "CANCELLED" => ErrorKind::Api,
        _ => return None,
    })
}

/// Reads a Google error body: `(kind, message)`, or `None` when it is not one.
pub(crate) fn decode_error_body(status: u16, body: &[u8]) -> Option<(ErrorKind, String)> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        error: Option<ErrorIn<'a>>,
    }
    let env: Envelope<'_> = serde_json::from_slice(body).ok()?;
    match env.error?.to_error(status) {
        ProtocolError::Upstream { kind, message } => Some((kind, message)),
        _ => None,
    }
}

/// Reads a body in Google's error model only when it names a `google.rpc.Code` (`status`):
/// Google's front end answering for a model of another dialect (Claude on Vertex AI: quota,
/// credentials, an unknown model), told apart from the model's own Anthropic errors.
pub(crate) fn decode_platform_error_body(status: u16, body: &[u8]) -> Option<(ErrorKind, String)> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        error: Option<ErrorIn<'a>>,
    }
    let env: Envelope<'_> = serde_json::from_slice(body).ok()?;
    let e = env.error?;
    e.status.as_ref()?;
    match e.to_error(status) {
        ProtocolError::Upstream { kind, message } => Some((kind, message)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
