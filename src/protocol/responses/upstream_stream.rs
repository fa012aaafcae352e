//! OpenAI Responses streaming as an **upstream** dialect
//! (<https://platform.openai.com/docs/api-reference/responses-streaming>): the provider's
//! `response.*` events read into canonical [`StreamEvent`]s.
//!
//! `response.created` starts the answer; `response.output_text.delta` (and
//! `response.refusal.delta`) is text, `response.reasoning_summary_text.delta` (and
//! `response.reasoning_text.delta`) reasoning, a reasoning item's `encrypted_content` at its
//! `response.output_item.done` the reasoning's signature; a `function_call` item's
//! `response.output_item.added` starts a tool call and `response.function_call_arguments.delta`
//! fragments its arguments; `response.completed` / `response.incomplete` carry the final usage
//! and the stop reason and end the stream; `response.failed` and `error` are in-band errors.
//! Every other event (content part bookkeeping, hosted tool progress, events Sluice does not
//! know) produces nothing.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use super::super::json::{opt, Str};
use super::super::{OutputItem, ProtocolError, StreamEvent, Usage};
use super::upstream::{call_name, decode_stream_error, output_of, stop_of, ResponseIn};

/// One upstream event: the members the decoder reads (the snapshot `response` and the
/// `item` only on the rare structural events).
#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    delta: Option<Str<'a>>,
    #[serde(borrow, default)]
    item_id: Option<Str<'a>>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(default)]
    item: Option<Value>,
    #[serde(borrow, default)]
    response: Option<ResponseIn<'a>>,
}

/// Upstream Responses stream → canonical events.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// (item id, tool-call index, arguments seen) of the function calls.
    calls: Vec<(String, u32, bool)>,
    /// A reasoning summary text was emitted for the current reasoning item.
    reasoning_text: bool,
    done: bool,
}

impl StreamDecoder {
    /// A decoder for one stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the final event (`response.completed`, `response.incomplete`) was seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes one upstream SSE event (its `event` name, joined `data`), calling `emit` for
    /// each canonical event.
    ///
    /// # Errors
    /// [`ProtocolError::Upstream`] for `error` and `response.failed`,
    /// [`ProtocolError::InvalidUpstream`] for unparseable data, or what `emit` returns.
    pub fn decode<F>(
        &mut self,
        event: Option<&str>,
        data: &[u8],
        emit: &mut F,
    ) -> Result<(), ProtocolError>
    where
        F: FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    {
        let data = data.trim_ascii();
        if data.is_empty() || self.done {
            return Ok(());
        }
        let ev: EventIn<'_> = serde_json::from_slice(data)
            .map_err(|e| ProtocolError::InvalidUpstream(format!("responses event: {e}")))?;
        let kind = opt(&ev.ty).or(event).unwrap_or("");
        match kind {
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_text.delta" => {
                let Some(d) = ev.delta.filter(|d| !d.as_str().is_empty()) else {
                    return Ok(());
                };
                if kind.starts_with("response.reasoning") {
                    self.reasoning_text = true;
                    emit(&StreamEvent::ReasoningDelta(d.0))
                } else {
                    emit(&StreamEvent::TextDelta(d.0))
                }
            }
            "response.function_call_arguments.delta" => {
                let item = opt(&ev.item_id).unwrap_or_default();
                let Some(call) = self.calls.iter_mut().find(|(id, _, _)| id == item) else {
                    return Ok(());
                };
                let Some(d) = ev.delta.filter(|d| !d.as_str().is_empty()) else {
                    return Ok(());
                };
                call.2 = true;
                emit(&StreamEvent::ToolArgumentsDelta {
                    index: call.1,
                    fragment: d.0,
                })
            }
            "response.reasoning_summary_part.added" => {
                // Summary parts of one reasoning item are separated by a blank line.
                if ev.summary_index.unwrap_or(0) > 0 && self.reasoning_text {
                    emit(&StreamEvent::ReasoningDelta(Cow::Borrowed("\n\n")))
                } else {
                    Ok(())
                }
            }
            "response.output_item.added" => self.item_added(ev.item.as_ref(), emit),
            "response.output_item.done" => self.item_done(ev.item.as_ref(), emit),
            "response.created" => {
                let (id, model) = match &ev.response {
                    Some(r) => (
                        opt(&r.id).unwrap_or_default().to_string(),
                        opt(&r.model).unwrap_or_default().to_string(),
                    ),
                    None => (String::new(), String::new()),
                };
                emit(&StreamEvent::Start {
                    id: id.into(),
                    model: model.into(),
                    usage: Usage::default(),
                })
            }
            "response.completed" | "response.incomplete" => {
                self.done = true;
                let Some(r) = ev.response else {
                    emit(&StreamEvent::Stop {
                        reason: stop_of(Some(kind.trim_start_matches("response.")), None, false),
                        stop_sequence: None,
                    })?;
                    return emit(&StreamEvent::End);
                };
                if let Some(u) = r.usage {
                    emit(&StreamEvent::Usage(u.canonical()))?;
                }
                let called = !self.calls.is_empty()
                    || r.output.iter().any(|i| {
                        matches!(
                            i.get("type").and_then(Value::as_str),
                            Some("function_call" | "custom_tool_call")
                        )
                    });
                let status = opt(&r.status).or(Some(kind.trim_start_matches("response.")));
                emit(&StreamEvent::Stop {
                    reason: stop_of(
                        status,
                        r.incomplete_details.as_ref().and_then(|d| opt(&d.reason)),
                        called,
                    ),
                    stop_sequence: None,
                })?;
                emit(&StreamEvent::End)
            }
            "response.failed" | "error" => Err(decode_stream_error(data)),
            _ => Ok(()),
        }
    }

    /// `response.output_item.added`: a function call (or a custom tool call) starts.
    fn item_added<F>(&mut self, item: Option<&Value>, emit: &mut F) -> Result<(), ProtocolError>
    where
        F: FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    {
        let Some(item) = item else {
            return Ok(());
        };
        let s = |k: &str| item.get(k).and_then(Value::as_str);
        match s("type") {
            Some("function_call" | "custom_tool_call") => {
                let index = self.calls.len() as u32;
                let id = s("id").unwrap_or_default().to_string();
                self.calls.push((id, index, false));
                let name = match s("type") {
                    Some("function_call") => {
                        call_name(s("name").unwrap_or_default(), s("namespace"))
                    }
                    _ => s("name").unwrap_or_default().to_string(),
                };
                emit(&StreamEvent::ToolCallStart {
                    index,
                    id: Cow::Owned(s("call_id").unwrap_or_default().to_string()),
                    name: Cow::Owned(name),
                })
            }
            Some("reasoning") => {
                self.reasoning_text = false;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `response.output_item.done`: a reasoning item's `encrypted_content` (and its summary,
    /// when no delta carried it) and a call's arguments when no delta carried them.
    fn item_done<F>(&mut self, item: Option<&Value>, emit: &mut F) -> Result<(), ProtocolError>
    where
        F: FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    {
        let Some(item) = item else {
            return Ok(());
        };
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        for out in output_of(item) {
            match out {
                OutputItem::Reasoning { text, signature } => {
                    if !self.reasoning_text && !text.is_empty() {
                        emit(&StreamEvent::ReasoningDelta(Cow::Owned(text)))?;
                    }
                    if let Some(sig) = signature {
                        emit(&StreamEvent::ReasoningSignature(Cow::Owned(sig)))?;
                    }
                }
                OutputItem::ToolCall(c) => {
                    let Some(call) = self.calls.iter_mut().find(|(i, _, _)| i == id) else {
                        continue;
                    };
                    if !call.2 {
                        call.2 = true;
                        emit(&StreamEvent::ToolArgumentsDelta {
                            index: call.1,
                            fragment: Cow::Owned(c.arguments),
                        })?;
                    }
                }
                // The text came in its deltas.
                OutputItem::Text(_) => {}
            }
        }
        Ok(())
    }
}
