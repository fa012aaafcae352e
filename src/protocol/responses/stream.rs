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
use serde_json::{json, Value};

use super::super::json::{
    error_event, openai_type, prefixed, push_sse_head, push_str, push_u64, write_json, write_sse,
};
use super::super::{
    Dialect, ErrorKind, OutputItem, ProtocolError, Response, StopReason, StreamEvent,
    StreamOptions, ToolCall, Usage,
};
use super::{item_json, response_json};

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

/// Appends `event: name` with `{"response":r,"sequence_number":seq,"type":name}`:
/// what [`StreamEncoder::emit`] writes for `{"response": r}` (serde_json's
/// map writes its keys sorted), without building the wrapper object.
fn write_response_event(out: &mut BytesMut, name: &str, r: &Value, seq: u64) {
    push_sse_head(out, name);
    out.extend_from_slice(b"{\"response\":");
    write_json(out, r);
    out.extend_from_slice(b",\"sequence_number\":");
    push_u64(out, seq);
    out.extend_from_slice(b",\"type\":");
    push_str(out, name);
    out.extend_from_slice(b"}\n\n");
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
            // One snapshot for both events (they carry the same response).
            let r = self.snapshot("in_progress");
            for name in ["response.created", "response.in_progress"] {
                let seq = self.next_seq();
                write_response_event(out, name, &r, seq);
            }
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
                let seq = self.next_seq();
                let item = &mut self.items[n];
                if let OutputItem::ToolCall(c) = &mut item.item {
                    c.arguments.push_str(fragment);
                }
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
                let r = self.snapshot("final");
                let name = match self.stop {
                    StopReason::MaxTokens | StopReason::ContentFilter => "response.incomplete",
                    _ => "response.completed",
                };
                let seq = self.next_seq();
                write_response_event(out, name, &r, seq);
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
        error_event(Dialect::Responses, kind, message, seq, out);
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
        let mut v = item_json(self.bare_id(), n, &item);
        let id = v["id"].as_str().unwrap_or_default().to_owned();
        match &item {
            OutputItem::Text(_) => {
                v["status"] = "in_progress".into();
                v["content"] = json!([]);
            }
            OutputItem::ToolCall(_) => v["status"] = "in_progress".into(),
            OutputItem::Reasoning { .. } => v["summary"] = json!([]),
        }
        self.emit(
            "response.output_item.added",
            json!({"output_index": n, "item": v}),
            out,
        );
        match &item {
            OutputItem::Text(_) => self.emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": n, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
                out,
            ),
            OutputItem::Reasoning { .. } => self.emit(
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": n, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
                out,
            ),
            OutputItem::ToolCall(_) => {}
        }
        self.items.push(Item {
            id,
            item,
            tool_index,
        });
        self.open = true;
    }

    fn close_item(&mut self, out: &mut BytesMut) {
        if !self.open {
            return;
        }
        self.open = false;
        let n = self.items.len() - 1;
        // Taken out while the `.done` events are written (`emit` needs
        // `&mut self`), put back below: no copy of the accumulated text.
        let id = std::mem::take(&mut self.items[n].id);
        let item = std::mem::replace(&mut self.items[n].item, OutputItem::Text(String::new()));
        match &item {
            OutputItem::Text(t) => {
                self.emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0,
                           "text": t, "logprobs": []}),
                    out,
                );
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0,
                           "part": {"type": "output_text", "text": t, "annotations": []}}),
                    out,
                );
            }
            OutputItem::Reasoning { text, .. } => {
                self.emit(
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": n, "summary_index": 0, "text": text}),
                    out,
                );
                self.emit(
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": n, "summary_index": 0,
                           "part": {"type": "summary_text", "text": text}}),
                    out,
                );
            }
            OutputItem::ToolCall(c) => self.emit(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": n, "arguments": c.arguments}),
                out,
            ),
        }
        let v = item_json(self.bare_id(), n, &item);
        self.emit(
            "response.output_item.done",
            json!({"output_index": n, "item": v}),
            out,
        );
        self.items[n].id = id;
        self.items[n].item = item;
    }
}
