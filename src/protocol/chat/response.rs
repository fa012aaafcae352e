//! Chat Completions non-streaming responses: the upstream `chat.completion`
//! decoder and the client body encoder, plus the usage and `finish_reason`
//! mappings shared with [`super::stream`].

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::super::json::{opt, prefixed, to_vec, ErrorObj, Str};
use super::super::{ErrorKind, OutputItem, ProtocolError, Response, StopReason, ToolCall, Usage};

#[derive(Deserialize, Default, Clone, Copy)]
pub(crate) struct UsageIn {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl UsageIn {
    pub(crate) fn canonical(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cache_read_tokens: self
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: self
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// Chat `finish_reason` → canonical.
pub(crate) fn stop_from_wire(s: &str) -> StopReason {
    match s {
        "length" => StopReason::MaxTokens,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "content_filter" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

/// Canonical → Chat `finish_reason`.
pub(crate) fn stop_to_wire(s: StopReason) -> &'static str {
    match s {
        StopReason::EndTurn | StopReason::StopSequence | StopReason::PauseTurn => "stop",
        StopReason::MaxTokens => "length",
        StopReason::ToolUse => "tool_calls",
        StopReason::ContentFilter => "content_filter",
    }
}

#[derive(Deserialize)]
struct ResponseIn<'a> {
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(borrow, default)]
    choices: Vec<ChoiceIn<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(borrow, default)]
    error: Option<ErrorObj<'a>>,
}

#[derive(Deserialize)]
struct ChoiceIn<'a> {
    /// `index` (absent: a single choice).
    #[serde(default)]
    index: Option<u32>,
    #[serde(borrow)]
    message: ResponseMessageIn<'a>,
    #[serde(borrow, default)]
    finish_reason: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct ResponseMessageIn<'a> {
    #[serde(borrow, default)]
    content: Option<Str<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Str<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Str<'a>>,
    #[serde(borrow, default)]
    tool_calls: Vec<ResponseToolCallIn<'a>>,
}

#[derive(Deserialize)]
struct ResponseToolCallIn<'a> {
    #[serde(borrow)]
    id: Str<'a>,
    #[serde(borrow)]
    function: ResponseFunctionIn<'a>,
}

#[derive(Deserialize)]
struct ResponseFunctionIn<'a> {
    #[serde(borrow)]
    name: Str<'a>,
    #[serde(borrow, default)]
    arguments: Option<Str<'a>>,
}

/// Decodes a non-streaming `chat.completion` upstream body: the choice of index 0 (the
/// first when none says its index); other choices (`n` > 1, a provider's extra) are not
/// part of the canonical answer, the rule of every translation (see `crate::protocol`).
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable or without choices;
/// [`ProtocolError::Upstream`] for an `{"error":…}` body.
pub fn decode_response(body: &[u8], now_unix_s: u64) -> Result<Response, ProtocolError> {
    let r: ResponseIn<'_> = serde_json::from_slice(body)
        .map_err(|e| ProtocolError::InvalidUpstream(format!("chat completion: {e}")))?;
    if let Some(e) = &r.error {
        return Err(e.to_error(ErrorKind::Api));
    }
    let at = r
        .choices
        .iter()
        .position(|c| c.index == Some(0))
        .unwrap_or(0);
    let choice =
        r.choices.into_iter().nth(at).ok_or_else(|| {
            ProtocolError::InvalidUpstream("chat completion without choices".into())
        })?;
    let mut output = Vec::new();
    if let Some(t) = opt(&choice.message.reasoning_content).filter(|t| !t.is_empty()) {
        output.push(OutputItem::Reasoning {
            text: t.to_owned(),
            signature: None,
        });
    }
    if let Some(t) = opt(&choice.message.content).filter(|t| !t.is_empty()) {
        output.push(OutputItem::Text(t.to_owned()));
    }
    if let Some(t) = opt(&choice.message.refusal).filter(|t| !t.is_empty()) {
        output.push(OutputItem::Text(t.to_owned()));
    }
    for c in choice.message.tool_calls {
        let args = opt(&c.function.arguments).unwrap_or("");
        output.push(OutputItem::ToolCall(ToolCall {
            id: c.id.as_str().to_owned(),
            name: c.function.name.as_str().to_owned(),
            arguments: if args.is_empty() {
                "{}".into()
            } else {
                args.to_owned()
            },
        }));
    }
    Ok(Response {
        id: opt(&r.id).unwrap_or("").to_owned(),
        created: r.created.unwrap_or(now_unix_s),
        model: opt(&r.model).unwrap_or("").to_owned(),
        output,
        stop_reason: stop_from_wire(opt(&choice.finish_reason).unwrap_or("stop")),
        stop_sequence: None,
        usage: r.usage.unwrap_or_default().canonical(),
    })
}

/// OpenAI `usage` object of canonical usage.
pub(crate) fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}
    })
}

/// Encodes the canonical response as a `chat.completion` client body. The
/// id gets the `chatcmpl-` prefix; text items are joined; reasoning goes to
/// `reasoning_content` (signatures are dropped: Chat has no field for them).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for item in &resp.output {
        match item {
            OutputItem::Text(t) => text.push_str(t),
            OutputItem::Reasoning { text: r, .. } => reasoning.push_str(r),
            OutputItem::ToolCall(c) => calls.push(json!({
                "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}
            })),
        }
    }
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    msg.insert(
        "content".into(),
        if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            text.into()
        },
    );
    if !reasoning.is_empty() {
        msg.insert("reasoning_content".into(), reasoning.into());
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    to_vec(&json!({
        "id": prefixed("chatcmpl-", &resp.id),
        "object": "chat.completion",
        "created": resp.created,
        "model": resp.model,
        "choices": [{
            "index": 0,
            "message": msg,
            "logprobs": null,
            "finish_reason": stop_to_wire(resp.stop_reason)
        }],
        "usage": usage_json(&resp.usage)
    }))
}
