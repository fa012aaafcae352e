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

use super::super::json::{error_event, openai_type, push_sse_head, push_str, push_u64, write_sse};
use super::super::{
    ClientDialect, ErrorKind, OutputItem, ProtocolError, StopReason, StreamEvent, StreamOptions,
    ToolCall, Usage,
};
use super::object::{
    echo_or_default, item_id, item_out, ErrorOut, ItemOut, ObjectParts, Phase, ResponseObject,
    ResponsesEcho, SummaryPartOut, TextPartOut,
};
use super::CallForm;

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
// The structural events (item added/done, parts, the response snapshots) as borrowed
// `Serialize` structs: no `serde_json::Value` tree (tens of allocations per event).

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
    part: TextPartOut<'a>,
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
struct ResponseEventOut<'a> {
    response: ResponseObject<'a, ItemsOut<'a>>,
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
    /// The request members the Response object echoes.
    echo: std::sync::Arc<ResponsesEcho>,
    /// The wall clock (`completed_at`).
    clock: fn() -> u64,
}

impl StreamEncoder {
    /// An encoder for one client stream (`opts.model` is echoed as
    /// `response.model`, `opts.created` as `created_at`).
    pub fn new(opts: &StreamOptions) -> Self {
        StreamEncoder {
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
            clock: opts.clock,
            echo: match &opts.echo.responses {
                Some(e) => e.clone(),
                None => std::sync::Arc::new(echo_or_default(&None).into_owned()),
            },
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

    fn bare_id(&self) -> &str {
        let id = self.echo.id();
        id.strip_prefix("resp_").unwrap_or(id)
    }

    /// The parts of the Response object (`error`: a failed stream's).
    fn parts<'a>(&'a self, error: Option<ErrorOut<'a>>) -> ObjectParts<'a> {
        ObjectParts {
            model: &self.model,
            created_at: self.created,
            stop: self.stop,
            usage: &self.usage,
            echo: &self.echo,
            error,
            completed_at: (self.clock)().max(self.created),
        }
    }

    /// Writes a `response.*` event carrying the Response object in `phase` (in progress:
    /// no output, no usage).
    fn write_response_event(
        &mut self,
        name: &'static str,
        phase: Phase,
        error: Option<(&str, &str)>,
        out: &mut BytesMut,
    ) {
        let sequence_number = self.next_seq();
        let error = error.map(|(code, message)| ErrorOut { code, message });
        let items: &[Item] = if phase == Phase::InProgress {
            &[]
        } else {
            &self.items
        };
        let ev = ResponseEventOut {
            response: self.parts(error).object(phase, ItemsOut(items)),
            sequence_number,
            ty: name,
        };
        write_sse(out, name, &ev);
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
            if let StreamEvent::Start { usage, .. } = ev {
                self.usage = *usage;
            }
            self.write_response_event("response.created", Phase::InProgress, None, out);
            self.write_response_event("response.in_progress", Phase::InProgress, None, out);
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
                self.write_response_event(name, Phase::Done, None, out);
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
        self.write_response_event(
            "response.failed",
            Phase::Failed,
            Some((openai_type(kind), message)),
            out,
        );
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
        let form = match &item {
            OutputItem::ToolCall(c) => CallForm::of(&self.origins, &c.name),
            _ => CallForm::Function,
        };
        let id = item_id(self.bare_id(), n, &item, &form);
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
                        part: TextPartOut::new(""),
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
                        part: TextPartOut::new(t),
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
