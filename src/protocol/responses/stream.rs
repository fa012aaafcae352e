//! Responses streaming
//! (<https://platform.openai.com/docs/api-reference/responses-streaming>):
//! `event: response.<x>\ndata: {"type":"response.<x>","sequence_number":n,…}`
//! frames. A stream is `response.created`, `response.in_progress`, then per
//! output item `response.output_item.added`, its parts and deltas
//! (`response.content_part.added` + `response.output_text.delta` for a
//! message, `response.reasoning_summary_part.added` +
//! `response.reasoning_summary_text.delta` for reasoning,
//! `response.function_call_arguments.delta` for a function call), the
//! matching `.done` events and `response.output_item.done`, and finally
//! `response.completed` (or `response.incomplete`, or `error` +
//! `response.failed`) carrying the whole response.

use bytes::BytesMut;
use serde::Serialize;
use serde_json::{json, Value};

use super::super::json::{
    error_event, openai_type, prefixed, push_sse_head, push_str, push_u64, write_sse,
};
use super::super::{
    ClientDialect, ErrorKind, OutputItem, ProtocolError, Response, StopReason, StreamEvent,
    StreamOptions, ToolCall, Usage,
};
use super::{response_json, CallForm};

/// Appends one per-token delta event, byte for byte what serde_json writes
/// for `{"type":name,"sequence_number":seq,"item_id":…,"output_index":n,
/// <extra>"delta":…<tail>}` (`extra` is e.g. `"content_index":0,`).
#[expect(clippy::too_many_arguments, reason = "the fields of one wire event")]
fn write_delta(
    out: &mut BytesMut,
    name: &str,
    seq: u64,
    item_id: &str,
    output_index: usize,
    extra: &[u8],
    delta: &str,
    tail: &[u8],
) {
    push_sse_head(out, name);
    out.extend_from_slice(b"{\"type\":");
    push_str(out, name);
    out.extend_from_slice(b",\"sequence_number\":");
    push_u64(out, seq);
    out.extend_from_slice(b",\"item_id\":");
    push_str(out, item_id);
    out.extend_from_slice(b",\"output_index\":");
    push_u64(out, output_index as u64);
    out.extend_from_slice(b",");
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\"delta\":");
    push_str(out, delta);
    out.extend_from_slice(tail);
    out.extend_from_slice(b"}\n\n");
}

// ---------------------------------------------------------------- typed output
//
// The structural events (item added/done, parts, the response snapshots) as
// borrowed `Serialize` structs: no `serde_json::Value` tree (tens of
// allocations per event). Their fields are in sorted key order, so the bytes
// are exactly what the `Value`-based builders of `super` write (serde_json's
// map sorts its keys).

/// `[]` or `[t]`.
struct OneOrNone<T>(Option<T>);

impl<T: Serialize> Serialize for OneOrNone<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct ItemTextPartOut<'a> {
    annotations: [(); 0],
    logprobs: [(); 0],
    text: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct PartOut<'a> {
    annotations: [(); 0],
    text: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct SummaryPartOut<'a> {
    text: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

/// An output item as `super::item_json` writes it (`done`) or as
/// `response.output_item.added` announces it (in progress, no content yet).
#[derive(Serialize)]
#[serde(untagged)]
enum ItemOut<'a> {
    Message {
        content: OneOrNone<ItemTextPartOut<'a>>,
        id: &'a str,
        role: &'static str,
        status: &'static str,
        #[serde(rename = "type")]
        ty: &'static str,
    },
    Reasoning {
        encrypted_content: Option<&'a str>,
        id: &'a str,
        summary: OneOrNone<SummaryPartOut<'a>>,
        #[serde(rename = "type")]
        ty: &'static str,
    },
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
    Custom {
        call_id: &'a str,
        id: &'a str,
        input: std::borrow::Cow<'a, str>,
        name: &'a str,
        status: &'static str,
        #[serde(rename = "type")]
        ty: &'static str,
    },
}

fn item_out<'a>(id: &'a str, item: &'a OutputItem, form: &'a CallForm, done: bool) -> ItemOut<'a> {
    let status = if done { "completed" } else { "in_progress" };
    match item {
        OutputItem::Text(t) => ItemOut::Message {
            content: OneOrNone(done.then_some(ItemTextPartOut {
                annotations: [],
                logprobs: [],
                text: t,
                ty: "output_text",
            })),
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

#[derive(Serialize)]
struct ItemEventOut<'a> {
    item: ItemOut<'a>,
    output_index: usize,
    sequence_number: u64,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct ContentPartEventOut<'a> {
    content_index: u32,
    item_id: &'a str,
    output_index: usize,
    part: PartOut<'a>,
    sequence_number: u64,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct SummaryPartEventOut<'a> {
    item_id: &'a str,
    output_index: usize,
    part: SummaryPartOut<'a>,
    sequence_number: u64,
    summary_index: u32,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct TextDoneOut<'a> {
    content_index: u32,
    item_id: &'a str,
    logprobs: [(); 0],
    output_index: usize,
    sequence_number: u64,
    text: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct SummaryTextDoneOut<'a> {
    item_id: &'a str,
    output_index: usize,
    sequence_number: u64,
    summary_index: u32,
    text: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct ArgsDoneOut<'a> {
    arguments: &'a str,
    item_id: &'a str,
    output_index: usize,
    sequence_number: u64,
    #[serde(rename = "type")]
    ty: &'static str,
}

/// The items of the final response.
struct ItemsOut<'a>(&'a [Item]);

impl Serialize for ItemsOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.0
                .iter()
                .map(|i| item_out(&i.id, &i.item, &i.form, true)),
        )
    }
}

#[derive(Serialize)]
struct ReasonOut {
    reason: &'static str,
}

#[derive(Serialize)]
struct ReasoningCfgOut {
    effort: (),
    summary: (),
}

#[derive(Serialize)]
struct FormatOut {
    #[serde(rename = "type")]
    ty: &'static str,
}

#[derive(Serialize)]
struct TextCfgOut {
    format: FormatOut,
}

#[derive(Serialize)]
struct CachedOut {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct ReasoningTokensOut {
    reasoning_tokens: u64,
}

#[derive(Serialize)]
struct UsageOut {
    input_tokens: u64,
    input_tokens_details: CachedOut,
    output_tokens: u64,
    output_tokens_details: ReasoningTokensOut,
    total_tokens: u64,
}

/// `super::response_json` of the streamed response, typed.
#[derive(Serialize)]
struct ResponseOut<'a> {
    created_at: u64,
    error: (),
    id: &'a str,
    incomplete_details: Option<ReasonOut>,
    instructions: (),
    max_output_tokens: (),
    metadata: Empty,
    model: &'a str,
    object: &'static str,
    output: ItemsOut<'a>,
    parallel_tool_calls: bool,
    previous_response_id: (),
    reasoning: ReasoningCfgOut,
    status: &'static str,
    store: bool,
    temperature: (),
    text: TextCfgOut,
    tool_choice: &'static str,
    tools: [(); 0],
    top_p: (),
    truncation: &'static str,
    usage: Option<UsageOut>,
}

#[derive(Serialize)]
struct ResponseEventOut<'a> {
    response: ResponseOut<'a>,
    sequence_number: u64,
    #[serde(rename = "type")]
    ty: &'static str,
}

/// One output item being streamed.
#[derive(Debug)]
struct Item {
    /// Item id (`msg_…`, `rs_…`, `fc_…`).
    id: String,
    /// Canonical content so far.
    item: OutputItem,
    /// Tool-call index for function calls.
    tool_index: Option<u32>,
    /// The form a tool call goes back in (the client's tool).
    form: CallForm,
}

/// Canonical events → Responses client events, with a `sequence_number` on
/// every event (from 0). Text, reasoning and arguments are accumulated (the
/// `.done` events and `response.completed` repeat them in full).
#[derive(Debug)]
pub struct StreamEncoder {
    id: String,
    model: String,
    created: u64,
    seq: u64,
    items: Vec<Item>,
    /// Whether the last item is still open (no `.done` yet).
    open: bool,
    usage: Usage,
    stop: StopReason,
    started: bool,
    finished: bool,
    /// The client's tool forms.
    origins: crate::protocol::ToolOrigins,
}

impl StreamEncoder {
    /// An encoder for one client stream (`opts.model` is echoed as
    /// `response.model`, `opts.created` as `created_at`).
    pub fn new(opts: &StreamOptions) -> Self {
        StreamEncoder {
            id: String::from("resp_sluice"),
            model: opts.model.clone(),
            created: opts.created,
            seq: 0,
            items: Vec::new(),
            open: false,
            usage: Usage::default(),
            stop: StopReason::EndTurn,
            started: false,
            finished: false,
            origins: opts.echo.tool_origins.clone(),
        }
    }

    /// Usage seen so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Whether the final event was written.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    fn emit(&mut self, name: &'static str, mut v: Value, out: &mut BytesMut) {
        if let Value::Object(o) = &mut v {
            o.insert("type".into(), name.into());
            o.insert("sequence_number".into(), self.next_seq().into());
        }
        write_sse(out, name, &v);
    }

    fn bare_id(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    /// The response as `response.created`/`in_progress` (`final` false: no
    /// output, no usage) or the final event carries it.
    fn response_out(&self, final_: bool) -> ResponseOut<'_> {
        let incomplete_details = match self.stop {
            StopReason::MaxTokens => Some(ReasonOut {
                reason: "max_output_tokens",
            }),
            StopReason::ContentFilter => Some(ReasonOut {
                reason: "content_filter",
            }),
            _ => None,
        };
        let status = if !final_ {
            "in_progress"
        } else if incomplete_details.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let u = self.usage;
        ResponseOut {
            created_at: self.created,
            error: (),
            id: &self.id,
            incomplete_details,
            instructions: (),
            max_output_tokens: (),
            metadata: Empty {},
            model: &self.model,
            object: "response",
            output: ItemsOut(if final_ { &self.items } else { &[] }),
            parallel_tool_calls: true,
            previous_response_id: (),
            reasoning: ReasoningCfgOut {
                effort: (),
                summary: (),
            },
            status,
            store: false,
            temperature: (),
            text: TextCfgOut {
                format: FormatOut { ty: "text" },
            },
            tool_choice: "auto",
            tools: [],
            top_p: (),
            truncation: "disabled",
            usage: final_.then_some(UsageOut {
                input_tokens: u.input_tokens,
                input_tokens_details: CachedOut {
                    cached_tokens: u.cache_read_tokens,
                },
                output_tokens: u.output_tokens,
                output_tokens_details: ReasoningTokensOut {
                    reasoning_tokens: u.reasoning_tokens,
                },
                total_tokens: u.input_tokens + u.output_tokens,
            }),
        }
    }

    fn write_response_event(&mut self, name: &'static str, final_: bool, out: &mut BytesMut) {
        let sequence_number = self.next_seq();
        let ev = ResponseEventOut {
            response: self.response_out(final_),
            sequence_number,
            ty: name,
        };
        write_sse(out, name, &ev);
    }

    /// The `Value` snapshot, for the (rare) `response.failed` event.
    fn snapshot(&self, status: &str) -> Value {
        let resp = Response {
            id: String::new(),
            created: self.created,
            model: self.model.clone(),
            output: self.items.iter().map(|i| i.item.clone()).collect(),
            stop_reason: self.stop,
            stop_sequence: None,
            usage: self.usage,
        };
        let mut v = response_json(&resp, &self.id);
        if status != "final" {
            v["status"] = status.into();
            v["usage"] = Value::Null;
            v["output"] = json!([]);
        }
        v
    }

    /// Appends the client events for `ev` to `out`.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidUpstream`] for arguments of an already closed
    /// function call.
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per canonical stream event, each writing its Responses events"
    )]
    pub fn encode(
        &mut self,
        ev: &StreamEvent<'_>,
        out: &mut BytesMut,
    ) -> Result<(), ProtocolError> {
        if self.finished {
            return Ok(());
        }
        if !self.started {
            self.started = true;
            if let StreamEvent::Start { id, usage, .. } = ev {
                if !id.is_empty() {
                    self.id = prefixed("resp_", id);
                }
                self.usage = *usage;
            }
            self.write_response_event("response.created", false, out);
            self.write_response_event("response.in_progress", false, out);
        }
        match ev {
            StreamEvent::Start { .. } => {}
            StreamEvent::TextDelta(t) => {
                if !matches!(self.current(), Some(OutputItem::Text(_))) {
                    self.open_item(OutputItem::Text(String::new()), None, out);
                }
                let seq = self.next_seq();
                let n = self.items.len() - 1;
                let item = &mut self.items[n];
                if let OutputItem::Text(s) = &mut item.item {
                    s.push_str(t);
                }
                write_delta(
                    out,
                    "response.output_text.delta",
                    seq,
                    &item.id,
                    n,
                    b"\"content_index\":0,",
                    t,
                    b",\"logprobs\":[]",
                );
            }
            StreamEvent::ReasoningDelta(t) => {
                self.ensure_reasoning(out);
                let seq = self.next_seq();
                let n = self.items.len() - 1;
                let item = &mut self.items[n];
                if let OutputItem::Reasoning { text, .. } = &mut item.item {
                    text.push_str(t);
                }
                write_delta(
                    out,
                    "response.reasoning_summary_text.delta",
                    seq,
                    &item.id,
                    n,
                    b"\"summary_index\":0,",
                    t,
                    b"",
                );
            }
            StreamEvent::ReasoningSignature(s) => {
                self.ensure_reasoning(out);
                if let Some(Item {
                    item: OutputItem::Reasoning { signature, .. },
                    ..
                }) = self.items.last_mut()
                {
                    signature.get_or_insert_with(String::new).push_str(s);
                }
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                let call = ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: String::new(),
                };
                self.open_item(OutputItem::ToolCall(call), Some(*index), out);
            }
            StreamEvent::ToolArgumentsDelta { index, fragment } => {
                let n = self.items.len().wrapping_sub(1);
                if !self.open || self.items.get(n).and_then(|i| i.tool_index) != Some(*index) {
                    return Err(ProtocolError::InvalidUpstream(format!(
                        "arguments for function call {index} after it was closed"
                    )));
                }
                let item = &mut self.items[n];
                if let OutputItem::ToolCall(c) = &mut item.item {
                    c.arguments.push_str(fragment);
                }
                if item.form == CallForm::Custom {
                    // A custom tool's input is the `input` argument's text: given whole
                    // when the call is done.
                    return Ok(());
                }
                let seq = self.next_seq();
                let item = &self.items[n];
                write_delta(
                    out,
                    "response.function_call_arguments.delta",
                    seq,
                    &item.id,
                    n,
                    b"",
                    fragment,
                    b"",
                );
            }
            StreamEvent::Stop { reason, .. } => self.stop = *reason,
            StreamEvent::Usage(u) => self.usage = *u,
            StreamEvent::End => {
                self.close_item(out);
                self.finished = true;
                let name = match self.stop {
                    StopReason::MaxTokens | StopReason::ContentFilter => "response.incomplete",
                    _ => "response.completed",
                };
                self.write_response_event(name, true, out);
            }
        }
        Ok(())
    }

    /// Appends an `error` event and `response.failed`, ending the stream.
    pub fn error(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        if self.finished {
            return;
        }
        self.finished = true;
        let seq = self.next_seq();
        error_event(ClientDialect::Responses, kind, message, seq, out);
        let mut r = self.snapshot("final");
        r["status"] = "failed".into();
        r["incomplete_details"] = Value::Null;
        r["error"] = json!({"code": openai_type(kind), "message": message});
        self.emit("response.failed", json!({ "response": r }), out);
    }

    fn current(&self) -> Option<&OutputItem> {
        if self.open {
            self.items.last().map(|i| &i.item)
        } else {
            None
        }
    }

    fn ensure_reasoning(&mut self, out: &mut BytesMut) {
        if !matches!(self.current(), Some(OutputItem::Reasoning { .. })) {
            self.open_item(
                OutputItem::Reasoning {
                    text: String::new(),
                    signature: None,
                },
                None,
                out,
            );
        }
    }

    fn open_item(&mut self, item: OutputItem, tool_index: Option<u32>, out: &mut BytesMut) {
        self.close_item(out);
        let n = self.items.len();
        let id = match &item {
            OutputItem::Text(_) => format!("msg_{}_{n}", self.bare_id()),
            OutputItem::Reasoning { .. } => format!("rs_{}_{n}", self.bare_id()),
            OutputItem::ToolCall(c) => format!("fc_{}", c.id),
        };
        let form = match &item {
            OutputItem::ToolCall(c) => CallForm::of(&self.origins, &c.name),
            _ => CallForm::Function,
        };
        let name = "response.output_item.added";
        let sequence_number = self.next_seq();
        write_sse(
            out,
            name,
            &ItemEventOut {
                item: item_out(&id, &item, &form, false),
                output_index: n,
                sequence_number,
                ty: name,
            },
        );
        match &item {
            OutputItem::Text(_) => {
                let name = "response.content_part.added";
                let sequence_number = self.next_seq();
                write_sse(
                    out,
                    name,
                    &ContentPartEventOut {
                        content_index: 0,
                        item_id: &id,
                        output_index: n,
                        part: PartOut {
                            annotations: [],
                            text: "",
                            ty: "output_text",
                        },
                        sequence_number,
                        ty: name,
                    },
                );
            }
            OutputItem::Reasoning { .. } => {
                let name = "response.reasoning_summary_part.added";
                let sequence_number = self.next_seq();
                write_sse(
                    out,
                    name,
                    &SummaryPartEventOut {
                        item_id: &id,
                        output_index: n,
                        part: SummaryPartOut {
                            text: "",
                            ty: "summary_text",
                        },
                        sequence_number,
                        summary_index: 0,
                        ty: name,
                    },
                );
            }
            OutputItem::ToolCall(_) => {}
        }
        self.items.push(Item {
            id,
            item,
            tool_index,
            form,
        });
        self.open = true;
    }

    #[expect(
        clippy::too_many_lines,
        reason = "closing an output item writes the done events of each item type, in wire order"
    )]
    fn close_item(&mut self, out: &mut BytesMut) {
        if !self.open {
            return;
        }
        self.open = false;
        let n = self.items.len() - 1;
        let mut seq = self.seq;
        let mut next = || {
            seq += 1;
            seq - 1
        };
        let Item { id, item, form, .. } = &self.items[n];
        match item {
            OutputItem::Text(t) => {
                let name = "response.output_text.done";
                write_sse(
                    out,
                    name,
                    &TextDoneOut {
                        content_index: 0,
                        item_id: id,
                        logprobs: [],
                        output_index: n,
                        sequence_number: next(),
                        text: t,
                        ty: name,
                    },
                );
                let name = "response.content_part.done";
                write_sse(
                    out,
                    name,
                    &ContentPartEventOut {
                        content_index: 0,
                        item_id: id,
                        output_index: n,
                        part: PartOut {
                            annotations: [],
                            text: t,
                            ty: "output_text",
                        },
                        sequence_number: next(),
                        ty: name,
                    },
                );
            }
            OutputItem::Reasoning { text, .. } => {
                let name = "response.reasoning_summary_text.done";
                write_sse(
                    out,
                    name,
                    &SummaryTextDoneOut {
                        item_id: id,
                        output_index: n,
                        sequence_number: next(),
                        summary_index: 0,
                        text,
                        ty: name,
                    },
                );
                let name = "response.reasoning_summary_part.done";
                write_sse(
                    out,
                    name,
                    &SummaryPartEventOut {
                        item_id: id,
                        output_index: n,
                        part: SummaryPartOut {
                            text,
                            ty: "summary_text",
                        },
                        sequence_number: next(),
                        summary_index: 0,
                        ty: name,
                    },
                );
            }
            OutputItem::ToolCall(c) if *form == CallForm::Custom => {
                let input = super::custom_input(&c.arguments);
                for name in [
                    "response.custom_tool_call_input.delta",
                    "response.custom_tool_call_input.done",
                ] {
                    let key = if name.ends_with("delta") {
                        "delta"
                    } else {
                        "input"
                    };
                    let mut v = json!({
                        "item_id": id, "output_index": n, "sequence_number": next(), "type": name
                    });
                    v[key] = Value::String(input.to_string());
                    write_sse(out, name, &v);
                }
            }
            OutputItem::ToolCall(c) => {
                let name = "response.function_call_arguments.done";
                write_sse(
                    out,
                    name,
                    &ArgsDoneOut {
                        arguments: &c.arguments,
                        item_id: id,
                        output_index: n,
                        sequence_number: next(),
                        ty: name,
                    },
                );
            }
        }
        let name = "response.output_item.done";
        write_sse(
            out,
            name,
            &ItemEventOut {
                item: item_out(id, item, form, true),
                output_index: n,
                sequence_number: next(),
                ty: name,
            },
        );
        self.seq = seq;
    }
}
