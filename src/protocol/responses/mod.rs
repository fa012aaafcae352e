//! OpenAI Responses (<https://platform.openai.com/docs/api-reference/responses>): on the
//! client side the request decoder, the response encoder ([`object`]: the Response object)
//! and (in [`stream`]) the stream encoder; on the upstream side (a route with
//! `routes[].api: responses`) the request encoder and answer decoder ([`upstream`]) and the
//! stream decoder ([`upstream_stream`]).
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
//! {"reasoning_tokens"},"total_tokens"}}` with every other member the specification requires
//! and the request's members echoed ([`object`]). Conversation state (`store`,
//! `previous_response_id`, `item_reference`) is resolved before this decoder runs
//! ([`crate::conversation`]); `conversation` (the Conversations API) is refused.

pub mod object;
pub mod stream;
pub mod upstream;
pub mod upstream_stream;
mod wire;

pub use wire::WIRE;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use object::ResponsesEcho;
pub use stream::StreamEncoder;

use super::json::{decode_client, image_source, parse_data_url, to_vec};
use super::{
    invalid, unsupported, ClientDialect, Message, OutputItem, Part, ProtocolError, Request,
    Response, ResponseFormat, Role, Source, Tool, ToolCall, ToolChoice, ToolOrigin, WebSearch,
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
    /// Every other member: none has a canonical counterpart (recorded as dropped).
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
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
        /// The namespace of a namespaced function (flattened as its tool was).
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        arguments: Option<String>,
    },
    CustomToolCall {
        call_id: String,
        name: String,
        #[serde(default)]
        input: String,
    },
    CustomToolCallOutput {
        call_id: String,
        output: ContentIn,
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
    /// An item type Sluice does not translate (`web_search_call`, `local_shell_call`, …).
    #[serde(other)]
    Other,
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
    /// A part type Sluice does not translate (`input_audio`, …).
    #[serde(other)]
    Other,
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
    /// A namespace's functions.
    #[serde(default)]
    tools: Option<Vec<ToolIn>>,
    /// A custom tool's input format (`text`, or a `grammar` with `syntax`, `definition`).
    #[serde(default)]
    format: Option<Value>,
    /// Web search: `filters.allowed_domains`.
    #[serde(default)]
    filters: Option<Value>,
    /// Web search: the user's approximate location.
    #[serde(default)]
    user_location: Option<Value>,
    /// Web search: `false` allows cached results only (Codex), which no other provider
    /// offers.
    #[serde(default)]
    external_web_access: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ToolChoiceIn {
    Mode(String),
    Named {
        name: String,
    },
    /// A form Sluice does not translate (`allowed_tools`, a hosted tool, …).
    Other(Value),
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
/// [`ProtocolError::Unsupported`] for `conversation` (the Conversations API is not
/// served), `background: true`, `prompt`, `item_reference` (resolved before decoding by
/// [`crate::conversation::expand`]; one left here is refused) and `file_id` inputs;
/// `previous_response_id` and `store` are read before decoding, not here; [`ProtocolError::InvalidRequest`]
/// naming the field otherwise. What has no counterpart (hosted tools other than web search,
/// unknown members, items, parts, roles, efforts, tool choices) is dropped with a record.
pub fn decode_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let v = add_message_types(body)?;
    let echo = match &v {
        Value::Object(members) => Some(std::sync::Arc::new(ResponsesEcho::of_request(members))),
        _ => None,
    };
    let bytes = serde_json::to_vec(&v).map_err(|e| invalid("body", e.to_string()))?;
    let r: RequestIn = decode_client(&bytes)?;
    // `previous_response_id` and `store` were handled before decoding
    // ([`crate::conversation::expand`]: the history is in `input`); the Conversations API
    // is not served.
    let _ = (r.previous_response_id, r.store);
    if r.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(unsupported(
            "conversation",
            "the Conversations API is not supported; use previous_response_id or send the full input",
        ));
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
        responses_echo: echo,
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
    for (k, v) in &r.rest {
        if !v.is_null() {
            req.drop_field(k.as_str(), "no counterpart in the translation");
        }
    }
    for (i, t) in r.tools.unwrap_or_default().into_iter().enumerate() {
        decode_tool(&mut req, t, &format!("tools[{i}]"), None)?;
    }
    req.tool_choice = match r.tool_choice {
        None => None,
        Some(ToolChoiceIn::Mode(m)) => req.openai_tool_mode(&m),
        Some(ToolChoiceIn::Named { name }) => Some(ToolChoice::Function(name)),
        Some(ToolChoiceIn::Other(v)) => {
            req.unknown_tool_choice(&v);
            None
        }
    };
    if let Some(e) = r.reasoning.and_then(|r| r.effort) {
        req.openai_effort("reasoning.effort", &e);
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

/// The separator of a namespaced function's flattened name (`{namespace}__{name}`).
const NAMESPACE_SEPARATOR: &str = "__";

/// Adds tool `t` (at `path`; `namespace`: the namespace it is a function of) to `req`:
///
/// * `function`: as it is;
/// * `namespace`: each of its functions, named `{namespace}__{name}` (calls go back under
///   their own name with the `namespace`, [`ToolOrigin::Namespaced`]);
/// * `custom` (free-form input, <https://platform.openai.com/docs/guides/function-calling#custom-tools>):
///   a function with one string parameter, `input`, its grammar (if any) in the
///   description (calls go back as `custom_tool_call` items, [`ToolOrigin::Custom`]);
/// * `web_search` (and `web_search_preview`): the canonical [`WebSearch`] (the target's own
///   search where it has one); with `external_web_access: false` (cached results only, as
///   Codex sends it) dropped with a record;
/// * another hosted tool (`file_search`, `code_interpreter`, …): dropped with a record (the
///   providers behind a translation run no OpenAI-hosted tools).
fn decode_tool(
    req: &mut Request,
    t: ToolIn,
    path: &str,
    namespace: Option<&str>,
) -> Result<(), ProtocolError> {
    let flat = |name: String| match namespace {
        Some(ns) => format!("{ns}{NAMESPACE_SEPARATOR}{name}"),
        None => name,
    };
    let origin = |name: &str| match namespace {
        Some(ns) => ToolOrigin::Namespaced {
            namespace: ns.to_string(),
            name: name.to_string(),
        },
        None => ToolOrigin::Function,
    };
    match t.ty.as_str() {
        "function" => {
            let name = t
                .name
                .ok_or_else(|| invalid(format!("{path}.name"), "missing"))?;
            req.tools.push(Tool {
                origin: origin(&name),
                name: flat(name),
                description: t.description,
                parameters: t
                    .parameters
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                strict: t.strict,
            });
        }
        "namespace" if namespace.is_none() => {
            let ns = t
                .name
                .ok_or_else(|| invalid(format!("{path}.name"), "missing"))?;
            for (j, f) in t.tools.unwrap_or_default().into_iter().enumerate() {
                decode_tool(req, f, &format!("{path}.tools[{j}]"), Some(&ns))?;
            }
        }
        "custom" if namespace.is_none() => {
            let name = t
                .name
                .ok_or_else(|| invalid(format!("{path}.name"), "missing"))?;
            let mut description = t.description.unwrap_or_default();
            if let Some(f) = t.format.as_ref().filter(|f| f["type"] == "grammar") {
                let syntax = f["syntax"].as_str().unwrap_or("grammar");
                let definition = f["definition"].as_str().unwrap_or("");
                description.push_str(&format!(
                    "\n\nThe input must follow this {syntax} grammar:\n{definition}"
                ));
            }
            req.tools.push(Tool {
                name,
                description: (!description.is_empty()).then_some(description),
                parameters: json!({
                    "type": "object",
                    "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's free-form input."}},
                    "required": [CUSTOM_INPUT]
                }),
                strict: None,
                origin: ToolOrigin::Custom,
            });
        }
        "web_search"
        | "web_search_preview"
        | "web_search_2025_08_26"
        | "web_search_preview_2025_03_11"
            if namespace.is_none() =>
        {
            if t.external_web_access == Some(false) {
                // Cached results only: the other providers' searches are live.
                req.drop_field(path, "web search without live access has no counterpart");
            } else {
                req.web_search = Some(WebSearch {
                    field: path.to_string(),
                    allowed_domains: WebSearch::strings(
                        t.filters.as_ref().and_then(|f| f.get("allowed_domains")),
                    ),
                    user_location: WebSearch::location_from(t.user_location.as_ref()),
                    ..WebSearch::default()
                });
            }
        }
        other => req.drop_field(path, format!("hosted tool `{other}` is not translated")),
    }
    Ok(())
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

/// A `message` item's decoded `parts` by `role`: `system` and `developer` text joins the
/// system prompt (any other part is dropped with a record), `user` and `assistant` become
/// canonical messages, another role is dropped with a record.
fn decode_message(req: &mut Request, role: &str, parts: Vec<Part>, path: &str) {
    match role {
        "system" | "developer" => {
            let mut text = String::new();
            for p in parts {
                match p {
                    Part::Text(t) => text.push_str(&t),
                    _ => req.drop_field(
                        format!("{path}.content"),
                        "only text is kept of a system message",
                    ),
                }
            }
            if !text.is_empty() {
                req.system.push(text);
            }
        }
        "user" => push(req, Role::User, parts),
        "assistant" => push(req, Role::Assistant, parts),
        other => req.drop_field(
            format!("{path}.role"),
            format!("a message of role `{other}` is not translated"),
        ),
    }
}

fn decode_item(req: &mut Request, item: ItemIn, i: usize) -> Result<(), ProtocolError> {
    let path = format!("input[{i}]");
    match item {
        ItemIn::Message { role, content } => {
            let parts = content_parts(req, content, &format!("{path}.content"))?;
            decode_message(req, &role, parts, &path);
        }
        ItemIn::FunctionCall {
            call_id,
            name,
            namespace,
            arguments,
        } => {
            let name = match namespace {
                Some(ns) => format!("{ns}{NAMESPACE_SEPARATOR}{name}"),
                None => name,
            };
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
        ItemIn::CustomToolCall {
            call_id,
            name,
            input,
        } => push(
            req,
            Role::Assistant,
            vec![Part::ToolCall(ToolCall {
                id: call_id,
                name,
                arguments: json!({ CUSTOM_INPUT: input }).to_string(),
            })],
        ),
        ItemIn::FunctionCallOutput { call_id, output }
        | ItemIn::CustomToolCallOutput { call_id, output } => {
            let content = content_parts(req, output, &format!("{path}.output"))?;
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
        // Resolved before decoding ([`crate::conversation::expand`]); one left here had no
        // store to resolve it.
        ItemIn::ItemReference {} => {
            return Err(unsupported(
                format!("{path}.type"),
                "item references need the response store; send the item itself",
            ))
        }
        ItemIn::Other => req.drop_field(path, "an item of this type is not translated"),
    }
    Ok(())
}

fn content_parts(
    req: &mut Request,
    content: ContentIn,
    path: &str,
) -> Result<Vec<Part>, ProtocolError> {
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
            PartIn::Other => req.drop_field(ppath, "a content part of this type is not translated"),
        }
    }
    Ok(out)
}

/// How a tool call goes back to a Responses client: the form its request gave the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallForm {
    /// A `function_call`, named as called.
    Function,
    /// A `function_call` of a namespace's function: its own name and the `namespace`.
    Namespaced {
        /// The namespace.
        namespace: String,
        /// The function's own name.
        name: String,
    },
    /// A `custom_tool_call`, its `input` the canonical call's `input` argument.
    Custom,
}

impl CallForm {
    /// The form of a call to the tool `name`.
    pub(crate) fn of(origins: &super::ToolOrigins, name: &str) -> Self {
        match super::origin_of(origins, name) {
            ToolOrigin::Function => CallForm::Function,
            ToolOrigin::Custom => CallForm::Custom,
            ToolOrigin::Namespaced { namespace, name } => CallForm::Namespaced {
                namespace: namespace.clone(),
                name: name.clone(),
            },
        }
    }
}

/// The free-form input of a custom tool call whose canonical arguments are `arguments`
/// (`{"input": "…"}`; anything else is given as it is).
pub(crate) fn custom_input(arguments: &str) -> std::borrow::Cow<'_, str> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut o)) => match o.remove(CUSTOM_INPUT) {
            Some(Value::String(s)) => s.into(),
            _ => arguments.into(),
        },
        _ => arguments.into(),
    }
}

/// The one parameter of the function a Responses `custom` tool becomes.
const CUSTOM_INPUT: &str = "input";

/// The items of an answer, each in the client's form.
struct OutputOut<'a> {
    bare: &'a str,
    items: &'a [OutputItem],
    origins: &'a super::ToolOrigins,
}

impl Serialize for OutputOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.items.len()))?;
        for (n, it) in self.items.iter().enumerate() {
            let form = match it {
                OutputItem::ToolCall(c) => CallForm::of(self.origins, &c.name),
                _ => CallForm::Function,
            };
            let id = object::item_id(self.bare, n, it, &form);
            seq.serialize_element(&object::item_out(&id, it, &form, true))?;
        }
        seq.end()
    }
}

/// Encodes the canonical response as a Responses client body: the Response object (see
/// [`object`]) with a fresh `resp_` id, `status` `completed` or `incomplete` with
/// `incomplete_details.reason` `max_output_tokens`, the request's members echoed;
/// reasoning as reasoning items whose signature is `encrypted_content`; tool calls as
/// `function_call` items (a custom tool's as `custom_tool_call`, a namespace's function
/// with its `namespace`).
pub fn encode_response_for(resp: &Response, echo: &super::ClientEcho) -> Vec<u8> {
    let members = object::echo_or_default(&echo.responses);
    let bare = members.id().strip_prefix("resp_").unwrap_or(members.id());
    let parts = object::ObjectParts {
        model: &resp.model,
        created_at: resp.created,
        stop: resp.stop_reason,
        usage: &resp.usage,
        echo: &members,
        error: None,
        // The whole answer arrived when it was decoded (`resp.created`).
        completed_at: resp.created,
    };
    to_vec(&parts.object(
        object::Phase::Done,
        OutputOut {
            bare,
            items: &resp.output,
            origins: &echo.tool_origins,
        },
    ))
}

/// [`encode_response_for`] without a request to echo (the API's defaults).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    encode_response_for(resp, &super::ClientEcho::default())
}
