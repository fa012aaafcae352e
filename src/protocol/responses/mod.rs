//! OpenAI Responses (<https://platform.openai.com/docs/api-reference/responses>),
//! client side only and stateless: the request decoder, the response
//! encoder and (in [`stream`]) the stream encoder.
//!
//! Shapes: request `{"model","input": string | [item],"instructions","tools":[{"type":
//! "function","name","description","parameters","strict"}],"tool_choice","max_output_tokens",
//! "reasoning":{"effort"},"text":{"format":{"type":"text|json_object|json_schema",…}},
//! "stream","user","metadata"}` with items `{"type":"message","role","content": string |
//! [{"type":"input_text|output_text|input_image|input_file",…}]}`, `function_call`
//! (`call_id`, `name`, `arguments`), `function_call_output` (`call_id`, `output`),
//! `reasoning` (`summary`, `encrypted_content`); response `{"id":"resp_…","object":
//! "response","created_at","status","model","output":[item],"usage":{"input_tokens",
//! "input_tokens_details":{"cached_tokens"},"output_tokens","output_tokens_details":
//! {"reasoning_tokens"},"total_tokens"}}`. There is no response storage:
//! `previous_response_id`, `store: true` and `conversation` are refused.

pub mod stream;
mod wire;

pub use wire::WIRE;

use serde::Deserialize;
use serde_json::{json, Value};

pub use stream::StreamEncoder;

use super::json::{decode_client, image_source, parse_data_url, prefixed, to_vec};
use super::{
    invalid, unsupported, ClientDialect, Effort, Message, OutputItem, Part, ProtocolError,
    Reasoning, Request, Response, ResponseFormat, Role, Source, StopReason, Tool, ToolCall,
    ToolChoice, Usage,
};

#[derive(Deserialize)]
struct RequestIn {
    #[serde(default)]
    model: String,
    input: InputIn,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    tool_choice: Option<ToolChoiceIn>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    reasoning: Option<ReasoningIn>,
    #[serde(default)]
    text: Option<TextIn>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    conversation: Option<Value>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    prompt: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum InputIn {
    Text(String),
    Items(Vec<ItemIn>),
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemIn {
    Message {
        role: String,
        content: ContentIn,
    },
    FunctionCall {
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: Option<String>,
    },
    FunctionCallOutput {
        call_id: String,
        output: ContentIn,
    },
    Reasoning {
        #[serde(default)]
        summary: Vec<SummaryIn>,
        #[serde(default)]
        encrypted_content: Option<String>,
    },
    ItemReference {},
}

/// An item without `type` is a message (the easy input form
/// `{"role":"user","content":"…"}`); serde's tag needs it, so it is
/// inserted before decoding.
fn add_message_types(body: &[u8]) -> Result<Value, ProtocolError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| invalid("body", format!("not JSON: {e}")))?;
    if let Some(Value::Array(items)) = v.get_mut("input") {
        for it in items {
            if let Value::Object(o) = it {
                if !o.contains_key("type") && o.contains_key("role") {
                    o.insert("type".into(), "message".into());
                }
            }
        }
    }
    Ok(v)
}

#[derive(Deserialize)]
struct SummaryIn {
    text: String,
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
    InputText {
        text: String,
    },
    OutputText {
        text: String,
    },
    Refusal {
        refusal: String,
    },
    InputImage {
        #[serde(default)]
        image_url: Option<String>,
        #[serde(default)]
        file_id: Option<String>,
    },
    InputFile {
        #[serde(default)]
        file_data: Option<String>,
        #[serde(default)]
        filename: Option<String>,
        #[serde(default)]
        file_id: Option<String>,
    },
}

#[derive(Deserialize)]
struct ToolIn {
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    name: Option<String>,
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
    Named { name: String },
}

#[derive(Deserialize)]
struct ReasoningIn {
    #[serde(default)]
    effort: Option<String>,
}

#[derive(Deserialize)]
struct TextIn {
    #[serde(default)]
    format: Option<FormatIn>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FormatIn {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        #[serde(default)]
        schema: Option<Value>,
        #[serde(default)]
        strict: Option<bool>,
        #[serde(default)]
        description: Option<String>,
    },
}

/// Decodes a Responses client request into the canonical request.
///
/// # Errors
/// [`ProtocolError::Unsupported`] for `previous_response_id`, `store: true`,
/// `conversation` (there is no response storage), `background: true`,
/// `prompt`, `item_reference`, non-function tools and `file_id` inputs;
/// [`ProtocolError::InvalidRequest`] naming the field otherwise.
#[expect(
    clippy::too_many_lines,
    reason = "one field of the Responses request after another, as OpenAI's API reference lists them"
)]
pub fn decode_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let v = add_message_types(body)?;
    let bytes = serde_json::to_vec(&v).map_err(|e| invalid("body", e.to_string()))?;
    let r: RequestIn = decode_client(&bytes)?;
    const NO_STORAGE: &str = "there is no response storage; send the full input";
    if r.previous_response_id.is_some() {
        return Err(unsupported("previous_response_id", NO_STORAGE));
    }
    if r.store == Some(true) {
        return Err(unsupported("store", NO_STORAGE));
    }
    if r.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(unsupported("conversation", NO_STORAGE));
    }
    if r.background == Some(true) {
        return Err(unsupported(
            "background",
            "background responses need response storage",
        ));
    }
    if r.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(unsupported(
            "prompt",
            "stored prompt templates are not supported",
        ));
    }
    let mut req = Request {
        model: r.model,
        source: Some(ClientDialect::Responses),
        max_output_tokens: r.max_output_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        stream: r.stream.unwrap_or(false),
        include_usage: true,
        user: r.user,
        parallel_tool_calls: r.parallel_tool_calls,
        ..Request::default()
    };
    if let Some(i) = r.instructions.filter(|i| !i.is_empty()) {
        req.system.push(i);
    }
    match r.input {
        InputIn::Text(t) => req.messages.push(Message {
            role: Role::User,
            parts: vec![Part::Text(t)],
        }),
        InputIn::Items(items) => {
            for (i, item) in items.into_iter().enumerate() {
                decode_item(&mut req, item, i)?;
            }
        }
    }
    for (i, t) in r.tools.unwrap_or_default().into_iter().enumerate() {
        if t.ty != "function" {
            return Err(unsupported(
                format!("tools[{i}].type"),
                format!("tool type `{}` is not supported; only function tools", t.ty),
            ));
        }
        req.tools.push(Tool {
            name: t
                .name
                .ok_or_else(|| invalid(format!("tools[{i}].name"), "missing"))?,
            description: t.description,
            parameters: t
                .parameters
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            strict: t.strict,
        });
    }
    req.tool_choice = match r.tool_choice {
        None => None,
        Some(ToolChoiceIn::Mode(m)) => Some(match m.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            other => return Err(invalid("tool_choice", format!("unknown value `{other}`"))),
        }),
        Some(ToolChoiceIn::Named { name }) => Some(ToolChoice::Function(name)),
    };
    if let Some(e) = r.reasoning.and_then(|r| r.effort) {
        let effort = Effort::parse(&e)
            .ok_or_else(|| invalid("reasoning.effort", format!("unknown effort `{e}`")))?;
        req.reasoning = Some(Reasoning {
            effort: Some(effort),
            budget_tokens: None,
            disabled: false,
        });
    }
    req.response_format = match r.text.and_then(|t| t.format) {
        None | Some(FormatIn::Text) => None,
        Some(FormatIn::JsonObject) => Some(ResponseFormat::JsonObject),
        Some(FormatIn::JsonSchema {
            name,
            schema,
            strict,
            description,
        }) => Some(ResponseFormat::JsonSchema {
            name,
            schema: schema.unwrap_or_else(|| json!({})),
            strict,
            description,
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

fn decode_item(req: &mut Request, item: ItemIn, i: usize) -> Result<(), ProtocolError> {
    let path = format!("input[{i}]");
    match item {
        ItemIn::Message { role, content } => {
            let parts = content_parts(content, &format!("{path}.content"))?;
            match role.as_str() {
                "system" | "developer" => {
                    let mut text = String::new();
                    for p in parts {
                        match p {
                            Part::Text(t) => text.push_str(&t),
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
                "user" => push(req, Role::User, parts),
                "assistant" => push(req, Role::Assistant, parts),
                other => {
                    return Err(invalid(
                        format!("{path}.role"),
                        format!("unknown role `{other}`"),
                    ))
                }
            }
        }
        ItemIn::FunctionCall {
            call_id,
            name,
            arguments,
        } => {
            let args = arguments.unwrap_or_default();
            push(
                req,
                Role::Assistant,
                vec![Part::ToolCall(ToolCall {
                    id: call_id,
                    name,
                    arguments: if args.trim().is_empty() {
                        "{}".into()
                    } else {
                        args
                    },
                })],
            );
        }
        ItemIn::FunctionCallOutput { call_id, output } => {
            let content = content_parts(output, &format!("{path}.output"))?;
            push(
                req,
                Role::User,
                vec![Part::ToolResult {
                    call_id,
                    content,
                    is_error: false,
                }],
            );
        }
        ItemIn::Reasoning {
            summary,
            encrypted_content,
        } => {
            let text = summary
                .into_iter()
                .map(|s| s.text)
                .collect::<Vec<_>>()
                .join("\n\n");
            push(
                req,
                Role::Assistant,
                vec![Part::Reasoning {
                    text,
                    signature: encrypted_content,
                }],
            );
        }
        ItemIn::ItemReference {} => {
            return Err(unsupported(
                format!("{path}.type"),
                "there is no response storage; item references cannot be resolved",
            ))
        }
    }
    Ok(())
}

fn content_parts(content: ContentIn, path: &str) -> Result<Vec<Part>, ProtocolError> {
    let parts = match content {
        ContentIn::Text(t) if t.is_empty() => return Ok(Vec::new()),
        ContentIn::Text(t) => return Ok(vec![Part::Text(t)]),
        ContentIn::Parts(p) => p,
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.into_iter().enumerate() {
        let ppath = format!("{path}[{j}]");
        match p {
            PartIn::InputText { text }
            | PartIn::OutputText { text }
            | PartIn::Refusal { refusal: text } => {
                if !text.is_empty() {
                    out.push(Part::Text(text));
                }
            }
            PartIn::InputImage { image_url, file_id } => {
                if file_id.is_some() {
                    return Err(unsupported(
                        format!("{ppath}.file_id"),
                        "uploaded files cannot be resolved; send image_url",
                    ));
                }
                let url =
                    image_url.ok_or_else(|| invalid(format!("{ppath}.image_url"), "missing"))?;
                out.push(Part::Image(image_source(
                    &url,
                    &format!("{ppath}.image_url"),
                )?));
            }
            PartIn::InputFile {
                file_data,
                filename,
                file_id,
            } => {
                if file_id.is_some() {
                    return Err(unsupported(
                        format!("{ppath}.file_id"),
                        "uploaded files cannot be resolved; send file_data",
                    ));
                }
                let data =
                    file_data.ok_or_else(|| invalid(format!("{ppath}.file_data"), "missing"))?;
                let source = match parse_data_url(&data, &format!("{ppath}.file_data"))? {
                    Some((media_type, d)) => Source::Base64 {
                        media_type: media_type.to_owned(),
                        data: d.to_owned(),
                    },
                    // The Responses API also takes bare base64 (a PDF).
                    None => Source::Base64 {
                        media_type: "application/pdf".into(),
                        data,
                    },
                };
                out.push(Part::Document {
                    source,
                    title: filename,
                });
            }
        }
    }
    Ok(out)
}

/// Responses `usage` JSON of canonical usage.
pub(crate) fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens
    })
}

/// `status` and `incomplete_details` for a stop reason.
pub(crate) fn status_of(stop: StopReason) -> (&'static str, Value) {
    match stop {
        StopReason::MaxTokens => ("incomplete", json!({"reason": "max_output_tokens"})),
        StopReason::ContentFilter => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// One output item as Responses JSON; `n` numbers the items for their ids.
pub(crate) fn item_json(resp_id: &str, n: usize, item: &OutputItem) -> Value {
    match item {
        OutputItem::Text(t) => json!({
            "id": format!("msg_{resp_id}_{n}"), "type": "message", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": [], "logprobs": []}]
        }),
        OutputItem::Reasoning { text, signature } => {
            let summary = if text.is_empty() {
                json!([])
            } else {
                json!([{"type": "summary_text", "text": text}])
            };
            json!({
                "id": format!("rs_{resp_id}_{n}"), "type": "reasoning",
                "summary": summary, "encrypted_content": signature
            })
        }
        OutputItem::ToolCall(c) => json!({
            "id": format!("fc_{}", c.id), "type": "function_call", "status": "completed",
            "call_id": c.id, "name": c.name, "arguments": c.arguments
        }),
    }
}

/// The full Responses `response` object (shared by the body and the
/// stream's final event).
pub(crate) fn response_json(resp: &Response, id: &str) -> Value {
    let (status, incomplete) = status_of(resp.stop_reason);
    let bare = id.strip_prefix("resp_").unwrap_or(id);
    let output: Vec<Value> = resp
        .output
        .iter()
        .enumerate()
        .map(|(n, it)| item_json(bare, n, it))
        .collect();
    json!({
        "id": id,
        "object": "response",
        "created_at": resp.created,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": null,
        "max_output_tokens": null,
        "model": resp.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": usage_json(&resp.usage),
        "metadata": {}
    })
}

/// Encodes the canonical response as a Responses client body (`resp_` id,
/// `status` `completed` or `incomplete` with `incomplete_details.reason`
/// `max_output_tokens`; reasoning as reasoning items whose signature is
/// `encrypted_content`; tool calls as `function_call` items).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    to_vec(&response_json(resp, &prefixed("resp_", &resp.id)))
}
