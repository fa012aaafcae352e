//! Owns the Responses API's *Response object* as Sluice writes it for a translated answer
//! (the body of a non-streaming answer, and the `response` member of `response.created`,
//! `response.in_progress`, `response.completed`, `response.incomplete` and
//! `response.failed`), and the output items inside it.
//!
//! Sources: OpenAI's API reference
//! (<https://platform.openai.com/docs/api-reference/responses/object>) and the Open Responses
//! specification's `ResponseResource` schema (<https://www.openresponses.org/specification>),
//! which requires every member below, nullable ones as `null`:
//!
//! * written by the answer: `id` (`resp_` + 32 hex digits, minted by Sluice, unique),
//!   `object` (`"response"`), `created_at` and `completed_at` (Unix seconds; `completed_at`
//!   is `null` until the response is complete), `status` (`in_progress`, `completed`,
//!   `incomplete`, `failed`), `error` (`{"code","message"}` or `null`),
//!   `incomplete_details` (`{"reason"}` or `null`), `model` (the standard model), `output`
//!   (the items), `usage` (`null` until the end);
//! * echoed from the request ([`ResponsesEcho`]): `instructions`, `max_output_tokens`,
//!   `max_tool_calls`, `temperature`, `top_p`, `presence_penalty`, `frequency_penalty`,
//!   `top_logprobs`, `tools`, `tool_choice`, `parallel_tool_calls`, `text`, `reasoning`,
//!   `truncation`, `store`, `background`, `service_tier`, `metadata`, `user`,
//!   `safety_identifier`, `prompt_cache_key`, `previous_response_id`, with the API's
//!   documented default where the request leaves one out (temperature and `top_p` 1,
//!   penalties 0, `top_logprobs` 0, `tool_choice` `"auto"`, `parallel_tool_calls` true,
//!   `text.format` `{"type":"text"}`, `truncation` `"disabled"`, `store` true, `background`
//!   false, `service_tier` `"default"`, `metadata` `{}`).
//!
//! A reasoning item carries `encrypted_content` only when there is some (the schema allows a
//! string or no member, not `null`).

use std::borrow::Cow;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::super::{OutputItem, StopReason, Usage};
use super::CallForm;

/// The members of a Responses request that its Response object echoes, with the API's
/// default for each member the request leaves out (see the module doc). Built once when the
/// request is decoded ([`ResponsesEcho::of_request`]); serialized as members of the
/// Response object (field names are the wire names).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponsesEcho {
    /// The Response object's `id` (`resp_` + 32 hex digits), minted when the request is
    /// decoded, so every attempt, the stored response and the log name one id.
    #[serde(skip)]
    id: String,
    /// `background` (only `false` is served).
    background: bool,
    /// `frequency_penalty` (default 0).
    frequency_penalty: f64,
    /// `instructions`: a string, an array of messages, or `null`.
    instructions: Value,
    /// `max_output_tokens`, tokens.
    max_output_tokens: Option<u64>,
    /// `max_tool_calls`.
    max_tool_calls: Option<u64>,
    /// `metadata` (default `{}`).
    metadata: Value,
    /// `parallel_tool_calls` (default true).
    parallel_tool_calls: bool,
    /// `presence_penalty` (default 0).
    presence_penalty: f64,
    /// `previous_response_id`.
    previous_response_id: Option<String>,
    /// `prompt_cache_key`.
    prompt_cache_key: Option<String>,
    /// `prompt_cache_retention`, written only when the request has it.
    #[serde(skip_serializing_if = "Value::is_null")]
    prompt_cache_retention: Value,
    /// `reasoning`: `{"effort","summary"}` (each `null` when not asked for).
    reasoning: Value,
    /// `safety_identifier`.
    safety_identifier: Option<String>,
    /// `service_tier` (default `"default"`).
    service_tier: Value,
    /// `store` (the spec's default is true).
    store: bool,
    /// `temperature` (default 1).
    temperature: f64,
    /// `text`: the text configuration, `format` defaulting to `{"type":"text"}`.
    text: Value,
    /// `tool_choice` (default `"auto"`).
    tool_choice: Value,
    /// `tools` as the request gave them (function tools with `description`, `parameters`
    /// and `strict` members, `null` where the request had none).
    tools: Value,
    /// `top_logprobs` (default 0).
    top_logprobs: u64,
    /// `top_p` (default 1).
    top_p: f64,
    /// `truncation` (default `"disabled"`).
    truncation: Value,
    /// `user`.
    user: Option<String>,
}

impl Default for ResponsesEcho {
    /// The API's defaults, with the id `resp_` + 32 zeros (an answer encoded without its
    /// request: unit tests).
    fn default() -> Self {
        ResponsesEcho::with_id(format!("resp_{:032x}", 0), &Map::new())
    }
}

/// `v` when it is a string.
fn string(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

/// `v` when it is not absent or `null`, else `default`.
fn or(v: Option<&Value>, default: Value) -> Value {
    match v {
        Some(v) if !v.is_null() => v.clone(),
        _ => default,
    }
}

impl ResponsesEcho {
    /// The echo of a Responses request body (its top-level members; the body has been
    /// decoded, so the members that matter have their documented types; a member of
    /// another type is given its default).
    pub fn of_request(body: &Map<String, Value>) -> Self {
        ResponsesEcho::with_id(new_response_id(), body)
    }

    /// [`ResponsesEcho::of_request`] with the given response id.
    fn with_id(id: String, body: &Map<String, Value>) -> Self {
        let num = |k: &str, default: f64| body.get(k).and_then(Value::as_f64).unwrap_or(default);
        let int = |k: &str| body.get(k).and_then(Value::as_u64);
        let mut text = match body.get("text") {
            Some(Value::Object(t)) => t.clone(),
            _ => Map::new(),
        };
        if text.get("format").is_none_or(Value::is_null) {
            text.insert("format".into(), serde_json::json!({"type": "text"}));
        }
        let mut reasoning = match body.get("reasoning") {
            Some(Value::Object(r)) => r.clone(),
            _ => Map::new(),
        };
        for k in ["effort", "summary"] {
            reasoning.entry(k).or_insert(Value::Null);
        }
        let tools = match body.get("tools") {
            Some(Value::Array(tools)) => Value::Array(tools.iter().map(tool_echo).collect()),
            _ => Value::Array(Vec::new()),
        };
        ResponsesEcho {
            id,
            background: body.get("background").and_then(Value::as_bool) == Some(true),
            frequency_penalty: num("frequency_penalty", 0.0),
            instructions: or(body.get("instructions"), Value::Null),
            max_output_tokens: int("max_output_tokens"),
            max_tool_calls: int("max_tool_calls"),
            metadata: match body.get("metadata") {
                Some(m @ Value::Object(_)) => m.clone(),
                _ => Value::Object(Map::new()),
            },
            parallel_tool_calls: body
                .get("parallel_tool_calls")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            presence_penalty: num("presence_penalty", 0.0),
            previous_response_id: string(body.get("previous_response_id")),
            prompt_cache_key: string(body.get("prompt_cache_key")),
            prompt_cache_retention: or(body.get("prompt_cache_retention"), Value::Null),
            reasoning: Value::Object(reasoning),
            safety_identifier: string(body.get("safety_identifier")),
            service_tier: match body.get("service_tier") {
                Some(s @ Value::String(_)) => s.clone(),
                _ => "default".into(),
            },
            store: body.get("store").and_then(Value::as_bool).unwrap_or(true),
            temperature: num("temperature", 1.0),
            text: Value::Object(text),
            tool_choice: or(body.get("tool_choice"), "auto".into()),
            tools,
            top_logprobs: int("top_logprobs").unwrap_or(0),
            top_p: num("top_p", 1.0),
            truncation: match body.get("truncation") {
                Some(s @ Value::String(_)) => s.clone(),
                _ => "disabled".into(),
            },
            user: string(body.get("user")),
        }
    }

    /// The response's id (`resp_…`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the client asked for the response to be stored (`store`, default true).
    pub fn store(&self) -> bool {
        self.store
    }

    /// The `previous_response_id` the request continues, if any.
    pub fn previous_response_id(&self) -> Option<&str> {
        self.previous_response_id.as_deref()
    }
}

/// A tool as the Response object lists it: a `function` tool gets `description`,
/// `parameters` and `strict` (`null` when the request had none: the schema requires them);
/// any other tool as the request gave it.
fn tool_echo(t: &Value) -> Value {
    let mut t = t.clone();
    if let Value::Object(o) = &mut t {
        if o.get("type").and_then(Value::as_str) == Some("function") {
            for k in ["description", "parameters", "strict"] {
                o.entry(k).or_insert(Value::Null);
            }
        }
    }
    t
}

/// The echo a Response object carries: the request's, or the defaults (an answer encoded
/// without its request, as in unit tests).
pub(crate) fn echo_or_default(echo: &Option<Arc<ResponsesEcho>>) -> Cow<'_, ResponsesEcho> {
    match echo {
        Some(e) => Cow::Borrowed(e),
        None => Cow::Owned(ResponsesEcho::default()),
    }
}

/// A fresh response id: `resp_` and 32 hex digits (128 random bits).
fn new_response_id() -> String {
    format!("resp_{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

// ---------------------------------------------------------------- output items

/// `[]` or `[t]`.
pub(crate) struct OneOrNone<T>(pub(crate) Option<T>);

impl<T: Serialize> Serialize for OneOrNone<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

/// An `output_text` content part (`annotations` and `logprobs` empty: Sluice has neither).
#[derive(Serialize)]
pub(crate) struct TextPartOut<'a> {
    pub(crate) annotations: [(); 0],
    pub(crate) logprobs: [(); 0],
    pub(crate) text: &'a str,
    #[serde(rename = "type")]
    pub(crate) ty: &'static str,
}

impl<'a> TextPartOut<'a> {
    /// The `output_text` part of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        TextPartOut {
            annotations: [],
            logprobs: [],
            text,
            ty: "output_text",
        }
    }
}

/// A `summary_text` part of a reasoning item.
#[derive(Serialize)]
pub(crate) struct SummaryPartOut<'a> {
    pub(crate) text: &'a str,
    #[serde(rename = "type")]
    pub(crate) ty: &'static str,
}

/// An output item: done (as the final response and `response.output_item.done` carry it)
/// or in progress (as `response.output_item.added` announces it: no content yet).
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum ItemOut<'a> {
    /// A `message` item.
    Message {
        content: OneOrNone<TextPartOut<'a>>,
        id: &'a str,
        role: &'static str,
        status: &'static str,
        #[serde(rename = "type")]
        ty: &'static str,
    },
    /// A `reasoning` item.
    Reasoning {
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<&'a str>,
        id: &'a str,
        summary: OneOrNone<SummaryPartOut<'a>>,
        #[serde(rename = "type")]
        ty: &'static str,
    },
    /// A `function_call` item.
    Call {
        arguments: &'a str,
        call_id: &'a str,
        id: &'a str,
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        status: &'static str,
        #[serde(rename = "type")]
        ty: &'static str,
    },
    /// A `custom_tool_call` item.
    Custom {
        call_id: &'a str,
        id: &'a str,
        input: Cow<'a, str>,
        name: &'a str,
        status: &'static str,
        #[serde(rename = "type")]
        ty: &'static str,
    },
}

/// The id of output item `n` of response `resp_bare` (its id without `resp_`): `msg_…`,
/// `rs_…`, `fc_{call id}`, `ctc_{call id}`.
pub(crate) fn item_id(resp_bare: &str, n: usize, item: &OutputItem, form: &CallForm) -> String {
    match item {
        OutputItem::Text(_) => format!("msg_{resp_bare}_{n}"),
        OutputItem::Reasoning { .. } => format!("rs_{resp_bare}_{n}"),
        OutputItem::ToolCall(c) if *form == CallForm::Custom => format!("ctc_{}", c.id),
        OutputItem::ToolCall(c) => format!("fc_{}", c.id),
    }
}

/// Output item `item` (id `id`) in the client's form (`form`: how its request gave the
/// tool a call is to), done or in progress.
pub(crate) fn item_out<'a>(
    id: &'a str,
    item: &'a OutputItem,
    form: &'a CallForm,
    done: bool,
) -> ItemOut<'a> {
    let status = if done { "completed" } else { "in_progress" };
    match item {
        OutputItem::Text(t) => ItemOut::Message {
            content: OneOrNone(done.then(|| TextPartOut::new(t))),
            id,
            role: "assistant",
            status,
            ty: "message",
        },
        OutputItem::Reasoning { text, signature } => ItemOut::Reasoning {
            encrypted_content: signature.as_deref(),
            id,
            summary: OneOrNone((done && !text.is_empty()).then_some(SummaryPartOut {
                text,
                ty: "summary_text",
            })),
            ty: "reasoning",
        },
        OutputItem::ToolCall(c) => match form {
            CallForm::Custom => ItemOut::Custom {
                call_id: &c.id,
                id,
                input: if done {
                    super::custom_input(&c.arguments)
                } else {
                    "".into()
                },
                name: &c.name,
                status,
                ty: "custom_tool_call",
            },
            CallForm::Function => ItemOut::Call {
                arguments: &c.arguments,
                call_id: &c.id,
                id,
                name: &c.name,
                namespace: None,
                status,
                ty: "function_call",
            },
            CallForm::Namespaced { namespace, name } => ItemOut::Call {
                arguments: &c.arguments,
                call_id: &c.id,
                id,
                name,
                namespace: Some(namespace),
                status,
                ty: "function_call",
            },
        },
    }
}

// ---------------------------------------------------------------- the object

/// `incomplete_details`.
#[derive(Serialize)]
pub(crate) struct ReasonOut {
    reason: &'static str,
}

/// `error` of a failed response.
#[derive(Serialize)]
pub(crate) struct ErrorOut<'a> {
    /// The error's type (`server_error`, `rate_limit_exceeded`, …).
    pub(crate) code: &'a str,
    /// Human-readable message.
    pub(crate) message: &'a str,
}

#[derive(Serialize)]
struct CachedOut {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct ReasoningTokensOut {
    reasoning_tokens: u64,
}

/// `usage`: `input_tokens` is the whole prompt (cached tokens included).
#[derive(Serialize)]
pub(crate) struct UsageOut {
    input_tokens: u64,
    input_tokens_details: CachedOut,
    output_tokens: u64,
    output_tokens_details: ReasoningTokensOut,
    total_tokens: u64,
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        UsageOut {
            input_tokens: u.input_tokens,
            input_tokens_details: CachedOut {
                cached_tokens: u.cache_read_tokens,
            },
            output_tokens: u.output_tokens,
            output_tokens_details: ReasoningTokensOut {
                reasoning_tokens: u.reasoning_tokens,
            },
            total_tokens: u.input_tokens + u.output_tokens,
        }
    }
}

/// The state a Response object is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `response.created` / `response.in_progress`: no output, no usage.
    InProgress,
    /// The answer is complete (`completed`, or `incomplete` by the stop reason).
    Done,
    /// The stream failed (`response.failed`).
    Failed,
}

/// `status` and `incomplete_details` of a finished answer.
pub(crate) fn finished_status(stop: StopReason) -> (&'static str, Option<ReasonOut>) {
    match stop {
        StopReason::MaxTokens => (
            "incomplete",
            Some(ReasonOut {
                reason: "max_output_tokens",
            }),
        ),
        StopReason::ContentFilter => (
            "incomplete",
            Some(ReasonOut {
                reason: "content_filter",
            }),
        ),
        _ => ("completed", None),
    }
}

/// The Response object (see the module doc). `O` is the output list; the id is the echo's.
#[derive(Serialize)]
pub(crate) struct ResponseObject<'a, O: Serialize> {
    pub(crate) completed_at: Option<u64>,
    pub(crate) created_at: u64,
    pub(crate) error: Option<ErrorOut<'a>>,
    pub(crate) id: &'a str,
    pub(crate) incomplete_details: Option<ReasonOut>,
    pub(crate) model: &'a str,
    pub(crate) object: &'static str,
    pub(crate) output: O,
    pub(crate) status: &'static str,
    pub(crate) usage: Option<UsageOut>,
    /// The request's members.
    #[serde(flatten)]
    pub(crate) echo: &'a ResponsesEcho,
}

/// What a Response object is made of, apart from its output.
pub(crate) struct ObjectParts<'a> {
    /// The standard model.
    pub(crate) model: &'a str,
    /// Unix seconds.
    pub(crate) created_at: u64,
    /// Why the answer ended.
    pub(crate) stop: StopReason,
    /// Usage so far.
    pub(crate) usage: &'a Usage,
    /// The request's echo.
    pub(crate) echo: &'a ResponsesEcho,
    /// The error of a failed response.
    pub(crate) error: Option<ErrorOut<'a>>,
    /// When the answer completed, Unix seconds (written only when it did).
    pub(crate) completed_at: u64,
}

impl<'a> ObjectParts<'a> {
    /// The object in `phase` with `output`.
    pub(crate) fn object<O: Serialize>(self, phase: Phase, output: O) -> ResponseObject<'a, O> {
        let (status, incomplete_details, completed_at, usage) = match phase {
            Phase::InProgress => ("in_progress", None, None, None),
            Phase::Done => {
                let (status, details) = finished_status(self.stop);
                let completed = (status == "completed").then_some(self.completed_at);
                (status, details, completed, Some(UsageOut::from(self.usage)))
            }
            Phase::Failed => ("failed", None, None, Some(UsageOut::from(self.usage))),
        };
        ResponseObject {
            completed_at,
            created_at: self.created_at,
            error: self.error,
            id: &self.echo.id,
            incomplete_details,
            model: self.model,
            object: "response",
            output,
            status,
            usage,
            echo: self.echo,
        }
    }
}
