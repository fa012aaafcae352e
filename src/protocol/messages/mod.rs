//! Anthropic Messages (<https://docs.anthropic.com/en/api/messages>): the
//! client request decoder, the upstream request encoder, the response
//! decoder and encoder, and (in [`stream`]) the stream decoder and encoder
//! (<https://docs.anthropic.com/en/api/messages-streaming>).
//!
//! Shapes: request `{"model","max_tokens","system": string | [{"type":"text","text"}],
//! "messages":[{"role":"user|assistant","content": string | [block]}],"tools":[{"name",
//! "description","input_schema"}],"tool_choice":{"type":"auto|any|tool|none","name",
//! "disable_parallel_tool_use"},"thinking":{"type":"enabled","budget_tokens"},
//! "output_config":{"effort","format":{"type":"json_schema","schema"}},
//! "metadata":{"user_id"},"stop_sequences","temperature","top_p","stream"}` with blocks
//! `text`, `image`/`document` (`source`: `base64`/`url`/`text`), `tool_use`,
//! `tool_result`, `thinking` (with `signature`), `redacted_thinking`; response
//! `{"id","type":"message","role":"assistant","model","content":[block],"stop_reason",
//! "stop_sequence","usage":{"input_tokens","output_tokens","cache_read_input_tokens",
//! "cache_creation_input_tokens"}}`. Anthropic's `input_tokens` excludes cache reads and
//! writes; the canonical [`Usage::input_tokens`] includes them.

pub mod count;
pub mod stream;
mod wire;

pub use wire::{FAST_PATH, TEXT_KEYS, WIRE};

use serde::Deserialize;
use serde_json::{json, Map, Value};

pub use stream::{StreamDecoder, StreamEncoder};

use super::json::{decode_client, opt, prefixed, to_vec, ErrorObj, Str};
use super::{
    invalid, ClientDialect, Effort, ErrorKind, Message, OutputItem, Part, ProtocolError, Reasoning,
    Request, Response, ResponseFormat, Role, Source, StopReason, Tool, ToolCall, ToolChoice,
    UpstreamOptions, Usage, WebSearch,
};

/// Value of the `anthropic-version` header sent upstream.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Anthropic's minimum thinking budget, in tokens.
const MIN_THINKING_BUDGET: u64 = 1024;

// ---------------------------------------------------------------- client request

#[derive(Deserialize)]
struct RequestIn {
    #[serde(default)]
    model: String,
    /// Required by [`decode_request`]; not part of a token-count request ([`count`]).
    #[serde(default)]
    max_tokens: Option<u64>,
    messages: Vec<MessageIn>,
    #[serde(default)]
    system: Option<SystemIn>,
    #[serde(default)]
    metadata: Option<MetadataIn>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    tool_choice: Option<ToolChoiceIn>,
    /// Read tolerantly ([`decode_thinking`]): a form Sluice does not know is dropped, not
    /// refused.
    #[serde(default)]
    thinking: Option<Value>,
    /// `effort` and `format` read here ([`decode_output_config`]); other members are
    /// recorded.
    #[serde(default)]
    output_config: Option<Value>,
    /// The structured-output beta's form of `output_config.format` ([`decode_format`]).
    #[serde(default)]
    output_format: Option<Value>,
    #[serde(default)]
    mcp_servers: Option<Value>,
    #[serde(default)]
    container: Option<Value>,
    /// Every other member: none has a canonical counterpart (recorded as dropped when
    /// translated).
    #[serde(flatten)]
    rest: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SystemIn {
    Text(String),
    Blocks(Vec<SystemBlockIn>),
}

#[derive(Deserialize)]
struct SystemBlockIn {
    text: String,
}

#[derive(Deserialize)]
struct MetadataIn {
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RoleIn {
    User,
    Assistant,
    /// A system message inside `messages` (current Anthropic SDKs type it; Claude takes it
    /// after a user turn): its text joins the system prompt when translated.
    System,
}

#[derive(Deserialize)]
struct MessageIn {
    role: RoleIn,
    content: ContentIn,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    /// Blocks as JSON values: each is decoded on its own ([`blocks`]), so that one of a type
    /// Sluice does not know is dropped with a record instead of failing the request.
    Blocks(Vec<Value>),
}

/// The block types Sluice translates: one of these that does not decode is malformed (a
/// 400); any other type is dropped with a record.
const KNOWN_BLOCKS: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
];

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockIn {
    Text {
        text: String,
    },
    Image {
        source: SourceIn,
    },
    Document {
        source: SourceIn,
        #[serde(default)]
        title: Option<String>,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<ContentIn>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {},
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum SourceIn {
    Base64 {
        media_type: String,
        data: String,
    },
    Url {
        url: String,
    },
    Text {
        data: String,
    },
    /// A source Sluice does not translate (`file`, `content`, …): the block is dropped.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct ToolIn {
    #[serde(rename = "type", default)]
    ty: Option<String>,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
    /// Server web search's settings (`web_search_*` tools).
    #[serde(default)]
    max_uses: Option<u64>,
    #[serde(default)]
    allowed_domains: Option<Value>,
    #[serde(default)]
    blocked_domains: Option<Value>,
    #[serde(default)]
    user_location: Option<Value>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToolChoiceIn {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
    /// A choice Sluice does not know: dropped with a record.
    #[serde(other)]
    Other,
}

/// Decodes a Messages client request into the canonical request.
///
/// # Errors
/// [`ProtocolError::InvalidRequest`] naming the field (missing `max_tokens`, a malformed
/// block of a known type, …). Nothing the canonical model cannot carry is refused: it is
/// recorded in [`Request::dropped`].
pub fn decode_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let r: RequestIn = decode_client(body)?;
    if r.max_tokens.is_none() {
        return Err(invalid("max_tokens", "missing field `max_tokens`"));
    }
    decode_fields(r)
}

/// The canonical request of decoded wire fields (`max_tokens` optional here: a
/// token-count request has none). Tolerant: what has no canonical counterpart (server
/// tools, MCP servers, containers, unknown members, blocks and values) is recorded in
/// [`Request::dropped`], never refused.
#[expect(
    clippy::too_many_lines,
    reason = "one field of the Messages request after another, as Anthropic's API reference lists them"
)]
fn decode_fields(r: RequestIn) -> Result<Request, ProtocolError> {
    let mut req = Request {
        model: r.model,
        source: Some(ClientDialect::Messages),
        max_output_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        stop: r.stop_sequences.unwrap_or_default(),
        stream: r.stream.unwrap_or(false),
        include_usage: true,
        user: r.metadata.and_then(|m| m.user_id),
        ..Request::default()
    };
    if r.mcp_servers.as_ref().is_some_and(|v| !v.is_null()) {
        req.drop_field("mcp_servers", "MCP connectors are Anthropic's own");
    }
    if r.container.as_ref().is_some_and(|v| !v.is_null()) {
        req.drop_field("container", "containers are Anthropic's own");
    }
    for (k, v) in &r.rest {
        if !v.is_null() {
            req.drop_field(k.as_str(), "no counterpart in the translation");
        }
    }
    match r.system {
        None => {}
        Some(SystemIn::Text(s)) if s.is_empty() => {}
        Some(SystemIn::Text(s)) => req.system.push(s),
        Some(SystemIn::Blocks(b)) => req
            .system
            .extend(b.into_iter().map(|b| b.text).filter(|t| !t.is_empty())),
    }
    for (i, m) in r.messages.into_iter().enumerate() {
        let path = format!("messages[{i}].content");
        let role = match m.role {
            RoleIn::User => Role::User,
            RoleIn::Assistant => Role::Assistant,
            RoleIn::System => {
                // Hoisted into the system prompt: the translation targets take system text
                // only ahead of the conversation.
                for p in blocks(&mut req, m.content, &path)? {
                    match p {
                        Part::Text(t) => req.system.push(t),
                        _ => req.drop_field(path.clone(), "only text is kept of a system message"),
                    }
                }
                continue;
            }
        };
        let parts = blocks(&mut req, m.content, &path)?;
        if parts.is_empty() {
            continue;
        }
        match req.messages.last_mut() {
            Some(last) if last.role == role => last.parts.extend(parts),
            _ => req.messages.push(Message { role, parts }),
        }
    }
    for (i, t) in r.tools.unwrap_or_default().into_iter().enumerate() {
        match t.ty.as_deref() {
            None | Some("custom") => {}
            Some(web) if web.starts_with("web_search_") => {
                req.web_search = Some(WebSearch {
                    field: format!("tools[{i}]"),
                    max_uses: t.max_uses,
                    allowed_domains: WebSearch::strings(t.allowed_domains.as_ref()),
                    blocked_domains: WebSearch::strings(t.blocked_domains.as_ref()),
                    user_location: WebSearch::location_from(t.user_location.as_ref()),
                });
                continue;
            }
            Some(other) => {
                req.drop_field(
                    format!("tools[{i}]"),
                    format!("server tool `{other}` is Anthropic's own"),
                );
                continue;
            }
        }
        req.tools.push(Tool {
            name: t.name,
            description: t.description,
            parameters: t
                .input_schema
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            strict: None,
            origin: super::ToolOrigin::Function,
        });
    }
    if let Some(c) = r.tool_choice {
        let (choice, disable) = match c {
            ToolChoiceIn::Auto {
                disable_parallel_tool_use: d,
            } => (Some(ToolChoice::Auto), d),
            ToolChoiceIn::Any {
                disable_parallel_tool_use: d,
            } => (Some(ToolChoice::Required), d),
            ToolChoiceIn::Tool {
                name,
                disable_parallel_tool_use: d,
            } => (Some(ToolChoice::Function(name)), d),
            ToolChoiceIn::None {} => (Some(ToolChoice::None), None),
            ToolChoiceIn::Other => {
                req.drop_field("tool_choice.type", "unknown tool choice");
                (None, None)
            }
        };
        req.tool_choice = choice;
        if disable == Some(true) {
            req.parallel_tool_calls = Some(false);
        }
    }
    req.reasoning = decode_thinking(&mut req, r.thinking.as_ref());
    if let Some(config) = r.output_config.as_ref() {
        decode_output_config(&mut req, config)?;
    }
    if let Some(format) = r.output_format.as_ref().filter(|f| !f.is_null()) {
        if req.response_format.is_some() {
            req.drop_field("output_format", "superseded by `output_config.format`");
        } else {
            decode_format(&mut req, "output_format", format)?;
        }
    }
    Ok(req)
}

/// Reads Messages' `thinking` (<https://platform.claude.com/docs/en/build-with-claude/extended-thinking>,
/// <https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking>): `enabled` with
/// `budget_tokens`, `disabled`, `adaptive` (with `display: omitted` or `summarized`). A
/// type Sluice does not know, or a member it does not read, is recorded as dropped.
fn decode_thinking(req: &mut Request, thinking: Option<&Value>) -> Option<Reasoning> {
    let t = thinking.filter(|t| !t.is_null())?;
    let mut out = Reasoning::default();
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_u64) {
            Some(b) => out.budget_tokens = Some(b),
            None => out.adaptive = true,
        },
        Some("disabled") => out.disabled = true,
        Some("adaptive") => out.adaptive = true,
        other => {
            req.drop_field(
                "thinking.type",
                format!("unknown thinking type `{}`", other.unwrap_or("")),
            );
            return None;
        }
    }
    match t.get("display").and_then(Value::as_str) {
        None | Some("summarized") => {}
        Some("omitted") => out.omit_text = true,
        Some(other) => req.drop_field("thinking.display", format!("unknown display `{other}`")),
    }
    Some(out)
}

/// Reads Messages' `output_config` (<https://platform.claude.com/docs/en/build-with-claude/effort>):
/// its `effort` joins the reasoning settings (every level, `xhigh` and `max` included; an
/// unknown one is recorded as dropped), its `format` is the structured output
/// ([`decode_format`]). Members not read here are recorded as dropped.
fn decode_output_config(req: &mut Request, config: &Value) -> Result<(), ProtocolError> {
    let Some(config) = config.as_object() else {
        return Ok(());
    };
    for (k, v) in config {
        match k.as_str() {
            "effort" => match v.as_str().and_then(Effort::parse) {
                Some(effort) => {
                    req.reasoning.get_or_insert_with(Reasoning::default).effort = Some(effort);
                }
                None if v.is_null() => {}
                None => req.drop_field("output_config.effort", format!("unknown effort {v}")),
            },
            "format" if v.is_null() => {}
            "format" => decode_format(req, "output_config.format", v)?,
            other => req.drop_field(
                format!("output_config.{other}"),
                "no counterpart in the translation",
            ),
        }
    }
    Ok(())
}

/// The name a Messages structured output gets in the canonical request (Anthropic's
/// formats have none; OpenAI's and Converse's take one).
pub(crate) const FORMAT_NAME: &str = "output";

/// Reads a structured-output format at `path` (`output_config.format`, or the beta's
/// top-level `output_format`;
/// <https://platform.claude.com/docs/en/build-with-claude/structured-outputs>):
/// `{"type": "json_schema", "schema": {…}}` becomes [`ResponseFormat::JsonSchema`] named
/// [`FORMAT_NAME`], with no `strict` (OpenAI's strict mode wants every property required,
/// which Anthropic's schemas need not be). Another type, or a member other than `type` and
/// `schema`, is recorded as dropped.
///
/// # Errors
/// [`ProtocolError::InvalidRequest`] for a `json_schema` format without a schema object.
fn decode_format(req: &mut Request, path: &str, format: &Value) -> Result<(), ProtocolError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        other => {
            let reason = format!("unknown format type `{}`", other.unwrap_or(""));
            req.drop_field(path, reason);
            return Ok(());
        }
    }
    let schema = format
        .get("schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| invalid(format!("{path}.schema"), "expected a JSON Schema object"))?;
    if let Some(members) = format.as_object() {
        for k in members
            .keys()
            .filter(|k| !["type", "schema"].contains(&k.as_str()))
        {
            req.drop_field(format!("{path}.{k}"), "no counterpart in the translation");
        }
    }
    req.response_format = Some(ResponseFormat::JsonSchema {
        name: FORMAT_NAME.into(),
        schema: schema.clone(),
        strict: None,
        description: None,
    });
    Ok(())
}

fn source(s: SourceIn) -> Option<Source> {
    Some(match s {
        SourceIn::Base64 { media_type, data } => Source::Base64 { media_type, data },
        SourceIn::Url { url } => Source::Url(url),
        SourceIn::Text { data } => Source::Text(data),
        SourceIn::Other => return None,
    })
}

/// The canonical parts of a message's (or tool result's) content at `path`. A block of a
/// type Sluice does not translate ([`KNOWN_BLOCKS`]), or with a source it does not know, is
/// recorded as dropped; a known block that does not decode is a 400.
fn blocks(req: &mut Request, content: ContentIn, path: &str) -> Result<Vec<Part>, ProtocolError> {
    let list = match content {
        ContentIn::Text(s) if s.is_empty() => return Ok(Vec::new()),
        ContentIn::Text(s) => return Ok(vec![Part::Text(s)]),
        ContentIn::Blocks(b) => b,
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, v) in list.into_iter().enumerate() {
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        if !KNOWN_BLOCKS.contains(&ty) {
            let reason = format!("content block type `{ty}` is not translated");
            req.drop_field(format!("{path}[{j}]"), reason);
            continue;
        }
        let b: BlockIn = serde_json::from_value(v)
            .map_err(|e| invalid(format!("{path}[{j}]"), e.to_string()))?;
        match b {
            BlockIn::Text { text } => {
                if !text.is_empty() {
                    out.push(Part::Text(text));
                }
            }
            BlockIn::Image { source: s } => match source(s) {
                Some(s) => out.push(Part::Image(s)),
                None => {
                    req.drop_field(format!("{path}[{j}].source"), "image source not translated")
                }
            },
            BlockIn::Document { source: s, title } => match source(s) {
                Some(source) => out.push(Part::Document { source, title }),
                None => {
                    req.drop_field(
                        format!("{path}[{j}].source"),
                        "document source not translated",
                    );
                }
            },
            BlockIn::ToolUse { id, name, input } => {
                let input = input.unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(invalid(format!("{path}[{j}].input"), "expected an object"));
                }
                out.push(Part::ToolCall(ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                }));
            }
            BlockIn::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let content = match content {
                    None => Vec::new(),
                    Some(c) => blocks(req, c, &format!("{path}[{j}].content"))?,
                };
                out.push(Part::ToolResult {
                    call_id: tool_use_id,
                    content,
                    is_error: is_error.unwrap_or(false),
                });
            }
            BlockIn::Thinking {
                thinking,
                signature,
            } => out.push(Part::Reasoning {
                text: thinking,
                signature,
            }),
            BlockIn::RedactedThinking {} => {}
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- upstream request

/// The client's name for the structured-output field.
pub(crate) fn response_format_field(req: &Request) -> &'static str {
    match req.source {
        Some(ClientDialect::Responses) => "text.format",
        _ => "response_format",
    }
}

/// Anthropic's server web search tool for a canonical [`WebSearch`]:
/// `{"type":"web_search_20250305","name":"web_search"}` with `max_uses`, `allowed_domains`,
/// `blocked_domains` and `user_location` (`{"type":"approximate",…}`) when set.
fn web_search_tool(ws: &WebSearch) -> Value {
    let mut o = Map::new();
    o.insert("type".into(), "web_search_20250305".into());
    o.insert("name".into(), "web_search".into());
    if let Some(n) = ws.max_uses {
        o.insert("max_uses".into(), n.into());
    }
    if !ws.allowed_domains.is_empty() {
        o.insert("allowed_domains".into(), json!(ws.allowed_domains));
    }
    if !ws.blocked_domains.is_empty() {
        o.insert("blocked_domains".into(), json!(ws.blocked_domains));
    }
    if let Some(loc) = &ws.user_location {
        let mut l = loc.clone();
        l.insert("type".into(), "approximate".into());
        o.insert("user_location".into(), Value::Object(l));
    }
    Value::Object(o)
}

/// What of a request's structured output Anthropic's `output_config.format` cannot carry,
/// by client field: JSON mode (`json_object`: Anthropic's formats are JSON Schemas, whose
/// objects must close with `additionalProperties: false`, so no schema means "any
/// object"), and a schema's `description` (Anthropic's format has no member for it). The
/// schema's name and `strict` need no counterpart (Anthropic's output always follows the
/// schema). Bedrock's Converse takes the same formats, so it loses JSON mode too.
pub(crate) fn format_dropped(
    req: &Request,
    upstream: super::UpstreamDialect,
) -> Vec<super::Dropped> {
    let field = response_format_field(req);
    match &req.response_format {
        Some(ResponseFormat::JsonObject) => vec![super::Dropped {
            field: field.into(),
            reason: "JSON mode has no counterpart: structured output takes a JSON Schema".into(),
        }],
        Some(ResponseFormat::JsonSchema {
            description: Some(_),
            ..
        }) if upstream == super::UpstreamDialect::Messages => {
            let field = match req.source {
                Some(ClientDialect::Responses) => "text.format.description",
                _ => "response_format.json_schema.description",
            };
            vec![super::Dropped {
                field: field.into(),
                reason: "Anthropic's output format has no description".into(),
            }]
        }
        _ => Vec::new(),
    }
}

/// Encodes the canonical request as a Messages upstream body.
///
/// `max_tokens` is the client's limit or `opts.default_max_tokens`; a
/// thinking budget is capped below it (Anthropic requires `budget_tokens <
/// max_tokens`, at least 1024, else thinking is left off); temperature is
/// clamped to Anthropic's `0..=1`; tool results are put first in their user
/// turn; reasoning without a signature (from an OpenAI client) is dropped,
/// because Anthropic rejects unsigned thinking.
///
/// A JSON Schema structured output goes as `output_config.format` (beside the effort);
/// JSON mode has no counterpart and is left out (named by [`super::dropped_toward`]).
///
/// # Errors
/// [`ProtocolError::InvalidRequest`] for tool-call arguments that are not a JSON object.
#[expect(
    clippy::too_many_lines,
    reason = "one field of the canonical request after another into Anthropic Messages' shape"
)]
pub fn encode_request(req: &Request, opts: &UpstreamOptions<'_>) -> Result<Vec<u8>, ProtocolError> {
    let mut messages = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let mut content: Vec<Value> = Vec::with_capacity(m.parts.len());
        for p in &m.parts {
            if let Some(b) = block_json(p)? {
                content.push(b);
            }
        }
        if m.role == Role::User {
            // Anthropic wants tool results before other content in a turn.
            content.sort_by_key(|b| b.get("type").and_then(Value::as_str) != Some("tool_result"));
        }
        if content.is_empty() {
            continue;
        }
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        messages.push(json!({"role": role, "content": content}));
    }
    if messages.is_empty() {
        return Err(invalid(
            "messages",
            "at least one user or assistant message is required",
        ));
    }
    let max_tokens = req.max_output_tokens.unwrap_or(opts.default_max_tokens);
    let mut out = Map::new();
    match opts.placement {
        super::ModelPlacement::Body => {
            out.insert("model".into(), opts.model.into());
        }
        super::ModelPlacement::Path {
            anthropic_version, ..
        } => {
            out.insert("anthropic_version".into(), anthropic_version.into());
        }
    }
    out.insert("max_tokens".into(), max_tokens.into());
    match req.system.len() {
        0 => {}
        1 => {
            out.insert("system".into(), req.system[0].as_str().into());
        }
        _ => {
            let blocks: Vec<Value> = req
                .system
                .iter()
                .map(|s| json!({"type": "text", "text": s}))
                .collect();
            out.insert("system".into(), Value::Array(blocks));
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() || req.web_search.is_some() {
        let mut tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("name".into(), t.name.as_str().into());
                if let Some(d) = &t.description {
                    o.insert("description".into(), d.as_str().into());
                }
                o.insert("input_schema".into(), t.parameters.clone());
                Value::Object(o)
            })
            .collect();
        if let Some(ws) = &req.web_search {
            tools.push(web_search_tool(ws));
        }
        out.insert("tools".into(), Value::Array(tools));
        let mut choice = match &req.tool_choice {
            None => None,
            Some(ToolChoice::Auto) => Some(json!({"type": "auto"})),
            Some(ToolChoice::Required) => Some(json!({"type": "any"})),
            Some(ToolChoice::None) => Some(json!({"type": "none"})),
            Some(ToolChoice::Function(n)) => Some(json!({"type": "tool", "name": n})),
        };
        if req.parallel_tool_calls == Some(false) && req.tool_choice != Some(ToolChoice::None) {
            let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
            c["disable_parallel_tool_use"] = true.into();
        }
        if let Some(c) = choice {
            out.insert("tool_choice".into(), c);
        }
    }
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if !req.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(req.stop));
    }
    if let Some(u) = &req.user {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    if let Some(r) = &req.reasoning {
        let form = opts
            .thinking
            .unwrap_or_else(|| super::ThinkingForm::for_model(opts.model));
        let (thinking, effort) = thinking_json(r, max_tokens, form);
        if let Some(t) = thinking {
            out.insert("thinking".into(), t);
        }
        if let Some(e) = effort {
            output_config(&mut out).insert("effort".into(), e.into());
        }
    }
    if let Some(ResponseFormat::JsonSchema { schema, .. }) = &req.response_format {
        // JSON mode (any object) has none: left out, recorded by `format_dropped`.
        output_config(&mut out).insert(
            "format".into(),
            json!({"type": "json_schema", "schema": schema}),
        );
    }
    if req.stream {
        out.insert("stream".into(), true.into());
    }
    if let super::ModelPlacement::Path { dropped, .. } = opts.placement {
        for k in dropped {
            out.remove(*k);
        }
    }
    Ok(to_vec(&Value::Object(out)))
}

/// Claude's thinking settings for canonical reasoning `r`, in `form`: the `thinking`
/// member and the `output_config.effort` value.
///
/// * adaptive form: reasoning off (`disabled`, effort `none`) is `{"type":"disabled"}`;
///   anything else is `{"type":"adaptive"}` (`"display":"omitted"` when the client asked
///   for no reasoning text) with the effort (the client's, else the one closest to its
///   budget; `minimal` becomes `low`);
/// * budget form: `{"type":"enabled","budget_tokens"}` from the budget or the effort
///   ([`Effort::budget_tokens`]; adaptive without either: `medium`'s), capped below
///   `max_tokens` and left out under Anthropic's minimum of 1024.
pub(crate) fn thinking_json(
    r: &Reasoning,
    max_tokens: u64,
    form: super::ThinkingForm,
) -> (Option<Value>, Option<&'static str>) {
    if r.off() {
        return (Some(json!({"type": "disabled"})), None);
    }
    match form {
        super::ThinkingForm::Adaptive => {
            let mut t = Map::new();
            t.insert("type".into(), "adaptive".into());
            if r.omit_text {
                t.insert("display".into(), "omitted".into());
            }
            let effort = r.effort().and_then(Effort::anthropic);
            (Some(Value::Object(t)), effort)
        }
        super::ThinkingForm::Budget => {
            let b = r
                .budget()
                .unwrap_or_else(|| Effort::Medium.budget_tokens())
                .min(max_tokens.saturating_sub(1));
            let thinking =
                (b >= MIN_THINKING_BUDGET).then(|| json!({"type": "enabled", "budget_tokens": b}));
            (thinking, None)
        }
    }
}

/// The `output_config` object of a Messages body under construction, created empty when
/// absent (its members: `effort`, `format`).
fn output_config(out: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let v = out
        .entry("output_config")
        .or_insert_with(|| Value::Object(Map::new()));
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("set to an object above"),
    }
}

fn source_json(s: &Source) -> Value {
    match s {
        Source::Url(u) => json!({"type": "url", "url": u}),
        Source::Base64 { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        Source::Text(t) => json!({"type": "text", "media_type": "text/plain", "data": t}),
    }
}

fn block_json(p: &Part) -> Result<Option<Value>, ProtocolError> {
    Ok(Some(match p {
        Part::Text(t) if t.is_empty() => return Ok(None),
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Image(s) => json!({"type": "image", "source": source_json(s)}),
        Part::Document { source, title } => {
            let mut o = Map::new();
            o.insert("type".into(), "document".into());
            o.insert("source".into(), source_json(source));
            if let Some(t) = title {
                o.insert("title".into(), t.as_str().into());
            }
            Value::Object(o)
        }
        Part::ToolCall(c) => {
            let input: Value = if c.arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&c.arguments).map_err(|_| {
                    invalid("tool_calls.function.arguments", "must be a JSON object")
                })?
            };
            if !input.is_object() {
                return Err(invalid(
                    "tool_calls.function.arguments",
                    "must be a JSON object",
                ));
            }
            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => {
            let mut o = Map::new();
            o.insert("type".into(), "tool_result".into());
            o.insert("tool_use_id".into(), call_id.as_str().into());
            match content.as_slice() {
                [] => {}
                [Part::Text(t)] => {
                    o.insert("content".into(), t.as_str().into());
                }
                parts => {
                    let mut blocks = Vec::with_capacity(parts.len());
                    for p in parts {
                        if let Some(b) = block_json(p)? {
                            blocks.push(b);
                        }
                    }
                    o.insert("content".into(), Value::Array(blocks));
                }
            }
            if *is_error {
                o.insert("is_error".into(), true.into());
            }
            Value::Object(o)
        }
        Part::Reasoning {
            text,
            signature: Some(sig),
        } => json!({"type": "thinking", "thinking": text, "signature": sig}),
        Part::Reasoning {
            signature: None, ..
        } => return Ok(None),
    }))
}

// ---------------------------------------------------------------- response

/// Anthropic `usage` as read from the wire (every field optional: stream
/// events carry partial usage).
#[derive(Deserialize, Default, Clone, Copy)]
pub(crate) struct UsageIn {
    #[serde(default)]
    pub(crate) input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) output_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) cache_creation_input_tokens: Option<u64>,
}

impl UsageIn {
    /// Merges these (partial, cumulative) figures into `u`.
    pub(crate) fn merge_into(&self, u: &mut Usage) {
        if self.input_tokens.is_some()
            || self.cache_read_input_tokens.is_some()
            || self.cache_creation_input_tokens.is_some()
        {
            let read = self.cache_read_input_tokens.unwrap_or(u.cache_read_tokens);
            let write = self
                .cache_creation_input_tokens
                .unwrap_or(u.cache_write_tokens);
            let uncached = self
                .input_tokens
                .unwrap_or_else(|| u.uncached_input_tokens());
            u.cache_read_tokens = read;
            u.cache_write_tokens = write;
            u.input_tokens = uncached + read + write;
        }
        if let Some(o) = self.output_tokens {
            u.output_tokens = o;
        }
    }
}

/// Anthropic `stop_reason` → canonical.
pub(crate) fn stop_from_wire(s: &str) -> StopReason {
    match s {
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "tool_use" => StopReason::ToolUse,
        "refusal" => StopReason::ContentFilter,
        "pause_turn" => StopReason::PauseTurn,
        _ => StopReason::EndTurn,
    }
}

/// Canonical → Anthropic `stop_reason`.
pub(crate) fn stop_to_wire(s: StopReason) -> &'static str {
    match s {
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::ToolUse => "tool_use",
        StopReason::ContentFilter => "refusal",
        StopReason::PauseTurn => "pause_turn",
    }
}

#[derive(Deserialize)]
struct MessageOut<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(borrow, default)]
    content: Vec<ContentBlockIn<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Str<'a>>,
    #[serde(borrow, default)]
    stop_sequence: Option<Str<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(borrow, default)]
    error: Option<ErrorObj<'a>>,
}

/// A content block as Anthropic sends it: in a non-stream message's `content`, and as a
/// stream's `content_block_start.content_block`.
#[derive(Deserialize)]
struct ContentBlockIn<'a> {
    #[serde(rename = "type", borrow)]
    ty: Str<'a>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Str<'a>>,
    #[serde(borrow, default)]
    signature: Option<Str<'a>>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(default)]
    input: Option<Value>,
}

/// Decodes a non-streaming Messages upstream body. Text blocks become text
/// items, `thinking` reasoning items (with signature), `tool_use` tool calls
/// (input re-serialized as JSON text); `redacted_thinking` and server-tool
/// blocks are dropped.
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable,
/// [`ProtocolError::Upstream`] for a `{"type":"error"}` body.
pub fn decode_response(body: &[u8], now_unix_s: u64) -> Result<Response, ProtocolError> {
    let m: MessageOut<'_> = serde_json::from_slice(body)
        .map_err(|e| ProtocolError::InvalidUpstream(format!("message: {e}")))?;
    if opt(&m.ty) == Some("error") || m.error.is_some() {
        return Err(m
            .error
            .as_ref()
            .map(|e| e.to_error(ErrorKind::Api))
            .unwrap_or(ProtocolError::Upstream {
                kind: ErrorKind::Api,
                message: "upstream reported an error".into(),
            }));
    }
    let mut output = Vec::with_capacity(m.content.len());
    for b in &m.content {
        match b.ty.as_str() {
            "text" => {
                if let Some(t) = opt(&b.text).filter(|t| !t.is_empty()) {
                    output.push(OutputItem::Text(t.to_owned()));
                }
            }
            "thinking" => output.push(OutputItem::Reasoning {
                text: opt(&b.thinking).unwrap_or("").to_owned(),
                signature: opt(&b.signature).map(str::to_owned),
            }),
            "tool_use" => output.push(OutputItem::ToolCall(ToolCall {
                id: opt(&b.id).unwrap_or("").to_owned(),
                name: opt(&b.name).unwrap_or("").to_owned(),
                arguments: b
                    .input
                    .as_ref()
                    .map(Value::to_string)
                    .unwrap_or_else(|| "{}".into()),
            })),
            _ => {}
        }
    }
    let mut usage = Usage::default();
    if let Some(u) = &m.usage {
        u.merge_into(&mut usage);
    }
    Ok(Response {
        id: opt(&m.id).unwrap_or("").to_owned(),
        created: now_unix_s,
        model: opt(&m.model).unwrap_or("").to_owned(),
        output,
        stop_reason: stop_from_wire(opt(&m.stop_reason).unwrap_or("end_turn")),
        stop_sequence: opt(&m.stop_sequence).map(str::to_owned),
        usage,
    })
}

/// Anthropic `usage` JSON of canonical usage (`input_tokens` without cache).
pub(crate) fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.uncached_input_tokens(),
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "output_tokens": u.output_tokens
    })
}

/// Encodes the canonical response as a Messages client body (`msg_` id
/// prefix; reasoning as `thinking` blocks with their signature, `""` when the
/// provider gave none; tool calls as `tool_use` with parsed `input`).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut content = Vec::with_capacity(resp.output.len());
    for item in &resp.output {
        content.push(match item {
            OutputItem::Text(t) => json!({"type": "text", "text": t}),
            OutputItem::Reasoning { text, signature } => json!({
                "type": "thinking", "thinking": text,
                "signature": signature.as_deref().unwrap_or("")
            }),
            OutputItem::ToolCall(c) => json!({
                "type": "tool_use", "id": c.id, "name": c.name,
                "input": parse_arguments(&c.arguments)
            }),
        });
    }
    to_vec(&json!({
        "id": prefixed("msg_", &resp.id),
        "type": "message",
        "role": "assistant",
        "model": resp.model,
        "content": content,
        "stop_reason": stop_to_wire(resp.stop_reason),
        "stop_sequence": resp.stop_sequence,
        "usage": usage_json(&resp.usage)
    }))
}

/// Tool arguments as a JSON object: the parsed text, or `{}` when the model
/// produced something that is not an object (Anthropic's `input` must be one).
pub(crate) fn parse_arguments(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}
