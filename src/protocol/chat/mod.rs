//! OpenAI Chat Completions
//! (<https://platform.openai.com/docs/api-reference/chat>): the client
//! request decoder, the upstream request encoder, the response decoder and
//! encoder, and (in [`stream`]) the stream decoder and encoder.
//!
//! Shapes: request `{"model","messages":[{"role":"system|developer|user|assistant|tool",
//! "content": string | [{"type":"text"|"image_url"|"file",…}], "tool_calls":[…],
//! "tool_call_id"}],"tools":[{"type":"function","function":{"name","description",
//! "parameters"}}],"tool_choice","max_completion_tokens","stream_options",…}`;
//! response `{"id","object":"chat.completion","created","model","choices":[{"index":0,
//! "message":{"role":"assistant","content","reasoning_content","tool_calls"},
//! "finish_reason"}],"usage":{"prompt_tokens","completion_tokens","total_tokens",
//! "prompt_tokens_details":{"cached_tokens"},"completion_tokens_details":{"reasoning_tokens"}}}`.
//! `reasoning_content` is the de-facto field of reasoning providers
//! (DeepSeek, vLLM); OpenAI itself returns no reasoning text.

mod response;
pub mod stream;
mod wire;

pub use wire::{default_type, error_parts, FAST_PATH, TEXT_KEYS, WIRE};

use serde::Deserialize;
use serde_json::{json, Map, Value};

pub use response::{decode_response, encode_response};
pub(crate) use response::{stop_from_wire, stop_to_wire, UsageIn};
pub use stream::{StreamDecoder, StreamEncoder};

use super::json::{decode_client, image_source, parse_data_url, to_vec};
use super::{
    invalid, unsupported, Message, Part, ProtocolError, Reasoning, Request, ResponseFormat, Role,
    Source, Tool, ToolCall, ToolChoice, UpstreamOptions, WebSearch,
};

// ---------------------------------------------------------------- client request

#[derive(Deserialize)]
struct RequestIn {
    #[serde(default)]
    model: String,
    messages: Vec<MessageIn>,
    #[serde(default)]
    tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    tool_choice: Option<ToolChoiceIn>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stop: Option<StopIn>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptionsIn>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(default)]
    response_format: Option<ResponseFormatIn>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    functions: Option<Value>,
    #[serde(default)]
    function_call: Option<Value>,
    #[serde(default)]
    modalities: Option<Vec<String>>,
    #[serde(default)]
    audio: Option<Value>,
    #[serde(default)]
    web_search_options: Option<Value>,
    /// Every other member: none has a canonical counterpart (recorded as dropped when
    /// translated).
    #[serde(flatten)]
    rest: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StopIn {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptionsIn {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum MessageIn {
    System {
        content: Option<ContentIn>,
    },
    Developer {
        content: Option<ContentIn>,
    },
    User {
        content: Option<ContentIn>,
    },
    Assistant {
        #[serde(default)]
        content: Option<ContentIn>,
        #[serde(default)]
        tool_calls: Option<Vec<ToolCallIn>>,
        #[serde(default)]
        reasoning_content: Option<String>,
        #[serde(default)]
        refusal: Option<String>,
    },
    Tool {
        tool_call_id: String,
        #[serde(default)]
        content: Option<ContentIn>,
    },
    Function {},
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Parts(Vec<PartIn>),
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartIn {
    Text { text: String },
    ImageUrl { image_url: ImageUrlIn },
    File { file: FileIn },
    InputAudio {},
    Refusal { refusal: String },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ImageUrlIn {
    Url(String),
    Object { url: String },
}

#[derive(Deserialize)]
struct FileIn {
    #[serde(default)]
    file_data: Option<String>,
    #[serde(default)]
    file_id: Option<String>,
    #[serde(default)]
    filename: Option<String>,
}

#[derive(Deserialize)]
struct ToolCallIn {
    id: String,
    function: FunctionIn,
}

#[derive(Deserialize)]
struct FunctionIn {
    name: String,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ToolIn {
    #[serde(rename = "type", default)]
    ty: Option<String>,
    #[serde(default)]
    function: Option<ToolFunctionIn>,
}

#[derive(Deserialize)]
struct ToolFunctionIn {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ToolChoiceIn {
    Mode(String),
    Named {
        function: NamedFunction,
    },
    /// A form Sluice does not translate (`allowed_tools`, `custom`, …).
    Other(Value),
}

#[derive(Deserialize)]
struct NamedFunction {
    name: String,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormatIn {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaIn },
}

#[derive(Deserialize)]
struct JsonSchemaIn {
    name: String,
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
    #[serde(default)]
    description: Option<String>,
}

/// Decodes a Chat Completions client request into the canonical request.
///
/// # Errors
/// [`ProtocolError::InvalidRequest`] naming the field for malformed input;
/// [`ProtocolError::Unsupported`] for `n` > 1, `logprobs: true`, audio,
/// `functions`/`function_call`, the `function` role, `web_search_options`,
/// non-function tools, `input_audio` parts and `file_id` files.
#[expect(
    clippy::too_many_lines,
    reason = "one field of the Chat Completions request after another, as OpenAI's API reference lists them"
)]
pub fn decode_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let r: RequestIn = decode_client(body)?;
    match r.n {
        None | Some(1) => {}
        Some(0) => return Err(invalid("n", "expected a positive integer")),
        Some(_) => {
            return Err(unsupported(
                "n",
                "only one choice can be translated; n must be 1",
            ))
        }
    }
    if r.logprobs == Some(true) {
        return Err(unsupported("logprobs", "the provider returns no logprobs"));
    }
    if r.functions.as_ref().is_some_and(|v| !v.is_null())
        || r.function_call.as_ref().is_some_and(|v| !v.is_null())
    {
        return Err(unsupported(
            "functions",
            "the legacy functions API is not supported; use tools",
        ));
    }
    if r.audio.as_ref().is_some_and(|v| !v.is_null())
        || r.modalities
            .as_ref()
            .is_some_and(|m| m.iter().any(|m| m == "audio"))
    {
        return Err(unsupported("audio", "audio output is not supported"));
    }
    let mut req = Request {
        model: r.model,
        source: Some(super::ClientDialect::ChatCompletions),
        ..Request::default()
    };
    if let Some(o) = r.web_search_options.as_ref().filter(|v| !v.is_null()) {
        req.web_search = Some(WebSearch {
            field: "web_search_options".into(),
            user_location: WebSearch::location_from(o.get("user_location")),
            ..WebSearch::default()
        });
    }
    for (k, v) in &r.rest {
        if !v.is_null() {
            req.drop_field(k.as_str(), "no counterpart in the translation");
        }
    }
    for (i, m) in r.messages.into_iter().enumerate() {
        decode_message(&mut req, m, i)?;
    }
    if let Some(tools) = r.tools {
        for (i, t) in tools.into_iter().enumerate() {
            if let Some(ty) = t.ty.as_deref().filter(|t| *t != "function") {
                req.drop_field(
                    format!("tools[{i}]"),
                    format!("tool type `{ty}` is not translated; only function tools"),
                );
                continue;
            }
            let f = t
                .function
                .ok_or_else(|| invalid(format!("tools[{i}].function"), "expected an object"))?;
            req.tools.push(Tool {
                name: f.name,
                description: f.description,
                parameters: f
                    .parameters
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                strict: f.strict,
                origin: super::ToolOrigin::Function,
            });
        }
    }
    req.tool_choice = match r.tool_choice {
        None => None,
        Some(ToolChoiceIn::Mode(m)) => req.openai_tool_mode(&m),
        Some(ToolChoiceIn::Named { function }) => Some(ToolChoice::Function(function.name)),
        Some(ToolChoiceIn::Other(v)) => {
            req.unknown_tool_choice(&v);
            None
        }
    };
    req.parallel_tool_calls = r.parallel_tool_calls;
    req.max_output_tokens = r.max_completion_tokens.or(r.max_tokens);
    req.temperature = r.temperature;
    req.top_p = r.top_p;
    req.stop = match r.stop {
        None => Vec::new(),
        Some(StopIn::One(s)) => vec![s],
        Some(StopIn::Many(v)) => v,
    };
    req.stream = r.stream.unwrap_or(false);
    req.include_usage = r
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    req.user = r.user;
    if let Some(e) = r.reasoning_effort {
        req.openai_effort("reasoning_effort", &e);
    }
    req.response_format = match r.response_format {
        None | Some(ResponseFormatIn::Text) => None,
        Some(ResponseFormatIn::JsonObject) => Some(ResponseFormat::JsonObject),
        Some(ResponseFormatIn::JsonSchema { json_schema: s }) => Some(ResponseFormat::JsonSchema {
            name: s.name,
            schema: s.schema.unwrap_or_else(|| json!({})),
            strict: s.strict,
            description: s.description,
        }),
    };
    Ok(req)
}

fn push(req: &mut Request, role: Role, parts: Vec<Part>) {
    if parts.is_empty() {
        return;
    }
    match req.messages.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => req.messages.push(Message { role, parts }),
    }
}

fn decode_message(req: &mut Request, m: MessageIn, i: usize) -> Result<(), ProtocolError> {
    let path = format!("messages[{i}]");
    match m {
        MessageIn::System { content } | MessageIn::Developer { content } => {
            let parts = content_parts(content, &format!("{path}.content"))?;
            let mut text = String::new();
            for p in parts {
                match p {
                    Part::Text(t) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&t);
                    }
                    _ => {
                        return Err(unsupported(
                            format!("{path}.content"),
                            "only text is allowed in system messages",
                        ))
                    }
                }
            }
            if !text.is_empty() {
                req.system.push(text);
            }
        }
        MessageIn::User { content } => {
            let parts = content_parts(content, &format!("{path}.content"))?;
            push(req, Role::User, parts);
        }
        MessageIn::Assistant {
            content,
            tool_calls,
            reasoning_content,
            refusal,
        } => {
            let mut parts = Vec::new();
            if let Some(r) = reasoning_content.filter(|r| !r.is_empty()) {
                parts.push(Part::Reasoning {
                    text: r,
                    signature: None,
                });
            }
            parts.extend(content_parts(content, &format!("{path}.content"))?);
            if let Some(r) = refusal.filter(|r| !r.is_empty()) {
                parts.push(Part::Text(r));
            }
            for (k, c) in tool_calls.unwrap_or_default().into_iter().enumerate() {
                let args = c.function.arguments.unwrap_or_default();
                let args = if args.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    match serde_json::from_str::<Value>(&args) {
                        Ok(Value::Object(_)) => args,
                        _ => {
                            return Err(invalid(
                                format!("{path}.tool_calls[{k}].function.arguments"),
                                "must be a JSON-encoded object",
                            ))
                        }
                    }
                };
                parts.push(Part::ToolCall(ToolCall {
                    id: c.id,
                    name: c.function.name,
                    arguments: args,
                }));
            }
            push(req, Role::Assistant, parts);
        }
        MessageIn::Tool {
            tool_call_id,
            content,
        } => {
            let content = content_parts(content, &format!("{path}.content"))?;
            push(
                req,
                Role::User,
                vec![Part::ToolResult {
                    call_id: tool_call_id,
                    content,
                    is_error: false,
                }],
            );
        }
        MessageIn::Function {} => {
            return Err(unsupported(
                format!("{path}.role"),
                "the legacy `function` role is not supported; use `tool`",
            ))
        }
    }
    Ok(())
}

fn content_parts(content: Option<ContentIn>, path: &str) -> Result<Vec<Part>, ProtocolError> {
    match content {
        None => Ok(Vec::new()),
        Some(ContentIn::Text(s)) if s.is_empty() => Ok(Vec::new()),
        Some(ContentIn::Text(s)) => Ok(vec![Part::Text(s)]),
        Some(ContentIn::Parts(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.into_iter().enumerate() {
                let ppath = format!("{path}[{j}]");
                match p {
                    PartIn::Text { text } | PartIn::Refusal { refusal: text } => {
                        if !text.is_empty() {
                            out.push(Part::Text(text));
                        }
                    }
                    PartIn::ImageUrl { image_url } => {
                        let url = match image_url {
                            ImageUrlIn::Url(u) | ImageUrlIn::Object { url: u } => u,
                        };
                        out.push(Part::Image(image_source(
                            &url,
                            &format!("{ppath}.image_url"),
                        )?));
                    }
                    PartIn::File { file } => {
                        let fpath = format!("{ppath}.file");
                        if file.file_id.is_some() {
                            return Err(unsupported(
                                format!("{fpath}.file_id"),
                                "uploaded files cannot be resolved; send file_data",
                            ));
                        }
                        let data = file
                            .file_data
                            .ok_or_else(|| invalid(format!("{fpath}.file_data"), "missing"))?;
                        let (media_type, data) =
                            parse_data_url(&data, &format!("{fpath}.file_data"))?.ok_or_else(
                                || invalid(format!("{fpath}.file_data"), "expected a data: URL"),
                            )?;
                        out.push(Part::Document {
                            source: Source::Base64 {
                                media_type: media_type.to_owned(),
                                data: data.to_owned(),
                            },
                            title: file.filename,
                        });
                    }
                    PartIn::InputAudio {} => {
                        return Err(unsupported(
                            format!("{ppath}.type"),
                            "audio input is not supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
    }
}

// ---------------------------------------------------------------- upstream request

/// Encodes the canonical request as a Chat Completions upstream body.
/// Streams always ask for usage (`stream_options.include_usage`), so Sluice
/// can meter; the client's wish is applied by the stream encoder.
///
/// # Errors
/// [`ProtocolError::Unsupported`] for images inside tool results and URL
/// documents (Chat has neither).
#[expect(
    clippy::too_many_lines,
    reason = "one field of the canonical request after another into Chat Completions' shape"
)]
pub fn encode_request(req: &Request, opts: &UpstreamOptions<'_>) -> Result<Vec<u8>, ProtocolError> {
    let mut messages = Vec::with_capacity(req.messages.len() + req.system.len());
    for s in &req.system {
        messages.push(json!({"role": "system", "content": s}));
    }
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
                            let mut text = String::new();
                            for cp in c {
                                match cp {
                                    Part::Text(t) => {
                                        if !text.is_empty() {
                                            text.push('\n');
                                        }
                                        text.push_str(t);
                                    }
                                    _ => {
                                        return Err(unsupported(
                                            "tool_result.content",
                                            "the provider takes only text tool results",
                                        ))
                                    }
                                }
                            }
                            messages.push(
                                json!({"role": "tool", "tool_call_id": call_id, "content": text}),
                            );
                        }
                        other => content.push(user_part(other)?),
                    }
                }
                if !content.is_empty() {
                    messages.push(json!({"role": "user", "content": content}));
                }
            }
            Role::Assistant => {
                let mut text = String::new();
                let mut calls = Vec::new();
                for p in &m.parts {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::ToolCall(c) => calls.push(json!({
                            "id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}
                        })),
                        _ => {}
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
                if !calls.is_empty() {
                    msg.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(msg));
            }
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), opts.model.into());
    out.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.name.as_str().into());
                if let Some(d) = &t.description {
                    f.insert("description".into(), d.as_str().into());
                }
                f.insert("parameters".into(), t.parameters.clone());
                if let Some(s) = t.strict {
                    f.insert("strict".into(), s.into());
                }
                json!({"type": "function", "function": f})
            })
            .collect();
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
                ToolChoice::Function(n) => json!({"type": "function", "function": {"name": n}}),
            },
        );
    }
    if let Some(n) = req.max_output_tokens {
        out.insert("max_completion_tokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if !req.stop.is_empty() {
        out.insert("stop".into(), json!(req.stop));
    }
    if let Some(u) = &req.user {
        out.insert("user".into(), u.as_str().into());
    }
    if let Some(e) = req.reasoning.as_ref().and_then(Reasoning::effort) {
        out.insert("reasoning_effort".into(), e.openai().into());
    }
    match &req.response_format {
        None => {}
        Some(ResponseFormat::JsonObject) => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
            description,
        }) => {
            let mut s = Map::new();
            s.insert("name".into(), name.as_str().into());
            s.insert("schema".into(), schema.clone());
            if let Some(st) = strict {
                s.insert("strict".into(), (*st).into());
            }
            if let Some(d) = description {
                s.insert("description".into(), d.as_str().into());
            }
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": s}),
            );
        }
    }
    if req.stream {
        out.insert("stream".into(), true.into());
        if opts.stream_usage {
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    Ok(to_vec(&Value::Object(out)))
}

fn user_part(p: &Part) -> Result<Value, ProtocolError> {
    Ok(match p {
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Image(Source::Url(u)) => json!({"type": "image_url", "image_url": {"url": u}}),
        Part::Image(Source::Base64 { media_type, data }) => json!({
            "type": "image_url",
            "image_url": {"url": super::json::data_url(media_type, data)}
        }),
        Part::Image(Source::Text(_)) => {
            return Err(unsupported("image.source", "text is not an image source"))
        }
        Part::Document {
            source: Source::Base64 { media_type, data },
            title,
        } => {
            let mut f = Map::new();
            f.insert(
                "file_data".into(),
                super::json::data_url(media_type, data).into(),
            );
            f.insert(
                "filename".into(),
                title.as_deref().unwrap_or("document.pdf").into(),
            );
            json!({"type": "file", "file": f})
        }
        Part::Document {
            source: Source::Text(t),
            ..
        } => json!({"type": "text", "text": t}),
        Part::Document {
            source: Source::Url(_),
            ..
        } => {
            return Err(unsupported(
                "document.source",
                "the provider cannot fetch documents by URL; send base64",
            ))
        }
        Part::Reasoning { .. } | Part::ToolCall(_) | Part::ToolResult { .. } => {
            return Err(invalid(
                "messages",
                "reasoning and tool calls belong to assistant turns",
            ))
        }
    })
}
