//! Messages streaming (<https://docs.anthropic.com/en/api/messages-streaming>):
//! `event: message_start` (`message` with id, model, input usage), per block
//! `content_block_start` / `content_block_delta` (`text_delta`,
//! `input_json_delta`, `thinking_delta`, `signature_delta`) /
//! `content_block_stop`, `message_delta` (`stop_reason`, cumulative usage),
//! `message_stop`; `ping` at any time and `error` mid-stream.

use bytes::BytesMut;
use serde::{Deserialize, Serialize};

use super::super::json::{
    opt, prefixed, push_sse_head, push_str, push_u64, write_sse, ErrorObj, Str,
};
use super::super::scan::Scan;
use super::super::{
    ClientDialect, ErrorKind, ProtocolError, StopReason, StreamEvent, StreamOptions, Usage,
};
use super::{stop_from_wire, stop_to_wire, ContentBlockIn, UsageIn};

/// One upstream event, read by [`EventIn::parse`] (hand-written: the
/// per-token hot path); the rare sub-objects (`message`, `content_block`,
/// `usage`, `error`) go through serde.
#[derive(Default)]
struct EventIn<'a> {
    ty: Option<Str<'a>>,
    index: Option<u64>,
    message: Option<MessageIn<'a>>,
    content_block: Option<ContentBlockIn<'a>>,
    delta: Option<DeltaIn<'a>>,
    usage: Option<UsageIn>,
    error: Option<ErrorObj<'a>>,
}

#[derive(Deserialize)]
struct MessageIn<'a> {
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Default)]
struct DeltaIn<'a> {
    ty: Option<Str<'a>>,
    text: Option<Str<'a>>,
    thinking: Option<Str<'a>>,
    signature: Option<Str<'a>>,
    partial_json: Option<Str<'a>>,
    stop_reason: Option<Str<'a>>,
    stop_sequence: Option<Str<'a>>,
}

const WHAT: &str = "messages event";

impl<'a> EventIn<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut s = Scan::new(data, WHAT);
        let mut ev = EventIn::default();
        s.object(|s, name| {
            match name {
                b"type" => ev.ty = s.opt_str()?.map(Str),
                b"index" => ev.index = s.opt_u64()?,
                b"delta" => {
                    if !s.null()? {
                        ev.delta = Some(DeltaIn::parse(s)?);
                    }
                }
                b"message" => ev.message = s.serde()?,
                b"content_block" => ev.content_block = s.serde()?,
                b"usage" => ev.usage = s.serde()?,
                b"error" => ev.error = s.serde()?,
                _ => s.skip()?,
            }
            Ok(())
        })?;
        s.end()?;
        Ok(ev)
    }
}

impl<'a> DeltaIn<'a> {
    fn parse(s: &mut Scan<'a>) -> Result<Self, ProtocolError> {
        let mut d = DeltaIn::default();
        s.object(|s, name| {
            let slot = match name {
                b"type" => &mut d.ty,
                b"text" => &mut d.text,
                b"thinking" => &mut d.thinking,
                b"signature" => &mut d.signature,
                b"partial_json" => &mut d.partial_json,
                b"stop_reason" => &mut d.stop_reason,
                b"stop_sequence" => &mut d.stop_sequence,
                _ => return s.skip(),
            };
            *slot = s.opt_str()?.map(Str);
            Ok(())
        })?;
        Ok(d)
    }
}

/// Upstream Messages stream → canonical events.
///
/// `tool_use` blocks become tool calls numbered 0, 1, … in order;
/// `input_json_delta` fragments their arguments; thinking blocks reasoning
/// deltas plus their signature; `message_delta` a `Stop` and a `Usage`;
/// `message_stop` the `End`. `ping`, `content_block_stop`, server-tool and
/// unknown blocks produce nothing; an `error` event is returned as
/// [`ProtocolError::Upstream`].
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// (content block index, tool-call index) of the tool_use blocks.
    tool_blocks: Vec<(u64, u32)>,
    usage: Usage,
    done: bool,
}

impl StreamDecoder {
    /// A decoder for one stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `message_stop` was seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes one upstream SSE event (its `event` name, joined `data`),
    /// calling `emit` for each canonical event.
    ///
    /// # Errors
    /// [`ProtocolError::Upstream`] for an `error` event,
    /// [`ProtocolError::InvalidUpstream`] for unparseable data, or what
    /// `emit` returns.
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per Anthropic stream event type, as its streaming reference lists them"
    )]
    pub fn decode<F>(
        &mut self,
        event: Option<&str>,
        data: &[u8],
        emit: &mut F,
    ) -> Result<(), ProtocolError>
    where
        F: FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    {
        if self.done || event == Some("ping") {
            return Ok(());
        }
        let data = data.trim_ascii();
        if data.is_empty() {
            return Ok(());
        }
        let ev = EventIn::parse(data)?;
        let kind = match &ev.ty {
            Some(t) => t.as_str(),
            None => event.unwrap_or(""),
        };
        match kind {
            "message_start" => {
                let Some(m) = ev.message else {
                    return Ok(());
                };
                if let Some(u) = &m.usage {
                    u.merge_into(&mut self.usage);
                }
                emit(&StreamEvent::Start {
                    id: m.id.map(|s| s.0).unwrap_or_default(),
                    model: m.model.map(|s| s.0).unwrap_or_default(),
                    usage: self.usage,
                })
            }
            "content_block_start" => {
                let Some(b) = ev.content_block else {
                    return Ok(());
                };
                match b.ty.as_str() {
                    "tool_use" => {
                        let index = self.tool_blocks.len() as u32;
                        self.tool_blocks.push((ev.index.unwrap_or(0), index));
                        emit(&StreamEvent::ToolCallStart {
                            index,
                            id: b.id.map(|s| s.0).unwrap_or_default(),
                            name: b.name.map(|s| s.0).unwrap_or_default(),
                        })
                    }
                    "text" => match b.text {
                        Some(t) if !t.as_str().is_empty() => emit(&StreamEvent::TextDelta(t.0)),
                        _ => Ok(()),
                    },
                    "thinking" => match b.thinking {
                        Some(t) if !t.as_str().is_empty() => {
                            emit(&StreamEvent::ReasoningDelta(t.0))
                        }
                        _ => Ok(()),
                    },
                    _ => Ok(()),
                }
            }
            "content_block_delta" => {
                let Some(d) = ev.delta else {
                    return Ok(());
                };
                match opt(&d.ty) {
                    Some("text_delta") => match d.text {
                        Some(t) if !t.as_str().is_empty() => emit(&StreamEvent::TextDelta(t.0)),
                        _ => Ok(()),
                    },
                    Some("thinking_delta") => match d.thinking {
                        Some(t) if !t.as_str().is_empty() => {
                            emit(&StreamEvent::ReasoningDelta(t.0))
                        }
                        _ => Ok(()),
                    },
                    Some("signature_delta") => match d.signature {
                        Some(s) if !s.as_str().is_empty() => {
                            emit(&StreamEvent::ReasoningSignature(s.0))
                        }
                        _ => Ok(()),
                    },
                    Some("input_json_delta") => {
                        let block = ev.index.unwrap_or(0);
                        let Some(&(_, index)) = self.tool_blocks.iter().find(|(b, _)| *b == block)
                        else {
                            return Ok(()); // e.g. a server_tool_use block
                        };
                        match d.partial_json {
                            Some(p) if !p.as_str().is_empty() => {
                                emit(&StreamEvent::ToolArgumentsDelta {
                                    index,
                                    fragment: p.0,
                                })
                            }
                            _ => Ok(()),
                        }
                    }
                    _ => Ok(()), // citations_delta, future deltas
                }
            }
            "message_delta" => {
                if let Some(u) = &ev.usage {
                    u.merge_into(&mut self.usage);
                }
                if let Some(d) = ev.delta {
                    if let Some(r) = opt(&d.stop_reason) {
                        emit(&StreamEvent::Stop {
                            reason: stop_from_wire(r),
                            stop_sequence: d.stop_sequence.map(|s| s.0),
                        })?;
                    }
                }
                emit(&StreamEvent::Usage(self.usage))
            }
            "message_stop" => {
                self.done = true;
                emit(&StreamEvent::End)
            }
            "error" => Err(ev
                .error
                .as_ref()
                .map(|e| e.to_error(ErrorKind::Api))
                .unwrap_or(ProtocolError::Upstream {
                    kind: ErrorKind::Api,
                    message: "upstream reported an error".into(),
                })),
            _ => Ok(()),
        }
    }
}

// ---------------------------------------------------------------- encoder

#[derive(Serialize)]
struct MessageStartOut<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    message: MessageHeadOut<'a>,
}

#[derive(Serialize)]
struct MessageHeadOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    role: &'static str,
    content: [(); 0],
    model: &'a str,
    stop_reason: (),
    stop_sequence: (),
    usage: UsageOut,
}

#[derive(Serialize, Clone, Copy)]
struct UsageOut {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        UsageOut {
            input_tokens: u.uncached_input_tokens(),
            cache_creation_input_tokens: u.cache_write_tokens,
            cache_read_input_tokens: u.cache_read_tokens,
            output_tokens: u.output_tokens,
        }
    }
}

#[derive(Serialize)]
struct BlockStartOut<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    index: u32,
    content_block: BlockOut<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockOut<'a> {
    Text {
        text: &'static str,
    },
    Thinking {
        thinking: &'static str,
        signature: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Empty,
    },
}

#[derive(Serialize)]
struct Empty {}

/// A `content_block_delta`'s `delta`: `{"type":"<kind>_delta","<field>":…}`
/// (written by hand: the per-token frame).
#[derive(Clone, Copy)]
#[expect(
    clippy::enum_variant_names,
    reason = "the wire names all end in `_delta`"
)]
enum DeltaOut<'a> {
    TextDelta { text: &'a str },
    ThinkingDelta { thinking: &'a str },
    SignatureDelta { signature: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct BlockStopOut {
    #[serde(rename = "type")]
    ty: &'static str,
    index: u32,
}

#[derive(Serialize)]
struct MessageDeltaOut<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    delta: StopOut<'a>,
    usage: UsageOut,
}

#[derive(Serialize)]
struct StopOut<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

#[derive(Serialize)]
struct TypeOnly {
    #[serde(rename = "type")]
    ty: &'static str,
}

/// The kind of the open content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
    Tool(u32),
}

/// Canonical events → Messages client events.
///
/// Opens a content block when the kind of output changes (text, thinking,
/// one block per tool call) and closes the previous one; the stop reason and
/// usage are held until `End`, which writes `content_block_stop`,
/// `message_delta` (stop reason, stop sequence, usage with cache figures) and
/// `message_stop`. Tool-call arguments for a tool whose block was already
/// closed (interleaved parallel calls) cannot be expressed in Messages and
/// end the stream with an error.
#[derive(Debug)]
pub struct StreamEncoder {
    model: String,
    usage: Usage,
    stop: StopReason,
    stop_sequence: Option<String>,
    open: Open,
    /// Index of the next content block.
    next_block: u32,
    started: bool,
    finished: bool,
    /// The client asked for no reasoning text (`thinking.display: omitted`): thinking
    /// blocks carry their signature only.
    omit_reasoning_text: bool,
}

impl StreamEncoder {
    /// An encoder for one client stream (`opts.model` is the model echoed).
    pub fn new(opts: &StreamOptions) -> Self {
        StreamEncoder {
            model: opts.model.clone(),
            usage: Usage::default(),
            stop: StopReason::EndTurn,
            stop_sequence: None,
            open: Open::None,
            next_block: 0,
            started: false,
            finished: false,
            omit_reasoning_text: opts.echo.omit_reasoning_text,
        }
    }

    /// Usage seen so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Whether `message_stop` was written.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Appends the client events for `ev` to `out`.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidUpstream`] for arguments of an already closed
    /// tool call (nothing is appended).
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per canonical stream event, each writing its Messages events"
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
            let (id, usage) = match ev {
                StreamEvent::Start { id, usage, .. } => (prefixed("msg_", id), *usage),
                _ => (String::from("msg_sluice"), Usage::default()),
            };
            self.usage = usage;
            write_sse(
                out,
                "message_start",
                &MessageStartOut {
                    ty: "message_start",
                    message: MessageHeadOut {
                        id: &id,
                        ty: "message",
                        role: "assistant",
                        content: [],
                        model: &self.model,
                        stop_reason: (),
                        stop_sequence: (),
                        usage: usage.into(),
                    },
                },
            );
        }
        match ev {
            StreamEvent::Start { .. } => {}
            StreamEvent::TextDelta(t) => {
                let i = self.ensure(Open::Text, out, || BlockOut::Text { text: "" });
                self.delta(out, i, DeltaOut::TextDelta { text: t });
            }
            StreamEvent::ReasoningDelta(t) => {
                let i = self.ensure(Open::Thinking, out, || BlockOut::Thinking {
                    thinking: "",
                    signature: "",
                });
                if !self.omit_reasoning_text {
                    self.delta(out, i, DeltaOut::ThinkingDelta { thinking: t });
                }
            }
            StreamEvent::ReasoningSignature(s) => {
                let i = self.ensure(Open::Thinking, out, || BlockOut::Thinking {
                    thinking: "",
                    signature: "",
                });
                self.delta(out, i, DeltaOut::SignatureDelta { signature: s });
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                self.close(out);
                self.open_block(
                    Open::Tool(*index),
                    out,
                    BlockOut::ToolUse {
                        id,
                        name,
                        input: Empty {},
                    },
                );
            }
            StreamEvent::ToolArgumentsDelta { index, fragment } => {
                if self.open != Open::Tool(*index) {
                    return Err(ProtocolError::InvalidUpstream(format!(
                        "arguments for tool call {index} after its block was closed"
                    )));
                }
                let i = self.next_block - 1;
                self.delta(
                    out,
                    i,
                    DeltaOut::InputJsonDelta {
                        partial_json: fragment,
                    },
                );
            }
            StreamEvent::Stop {
                reason,
                stop_sequence,
            } => {
                self.stop = *reason;
                self.stop_sequence = stop_sequence.as_deref().map(str::to_owned);
            }
            StreamEvent::Usage(u) => self.usage = *u,
            StreamEvent::End => {
                self.close(out);
                self.finished = true;
                write_sse(
                    out,
                    "message_delta",
                    &MessageDeltaOut {
                        ty: "message_delta",
                        delta: StopOut {
                            stop_reason: stop_to_wire(self.stop),
                            stop_sequence: self.stop_sequence.as_deref(),
                        },
                        usage: self.usage.into(),
                    },
                );
                write_sse(out, "message_stop", &TypeOnly { ty: "message_stop" });
            }
        }
        Ok(())
    }

    /// Appends Anthropic's `event: error` and ends the stream.
    pub fn error(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        self.finished = true;
        super::super::json::error_event(ClientDialect::Messages, kind, message, 0, out);
    }

    /// Makes `kind` the open block (opening it with `block()` if needed) and
    /// returns its index.
    fn ensure<'b>(
        &mut self,
        kind: Open,
        out: &mut BytesMut,
        block: impl FnOnce() -> BlockOut<'b>,
    ) -> u32 {
        if self.open != kind {
            self.close(out);
            self.open_block(kind, out, block());
        }
        self.next_block - 1
    }

    fn open_block(&mut self, kind: Open, out: &mut BytesMut, block: BlockOut<'_>) {
        write_sse(
            out,
            "content_block_start",
            &BlockStartOut {
                ty: "content_block_start",
                index: self.next_block,
                content_block: block,
            },
        );
        self.next_block += 1;
        self.open = kind;
    }

    fn close(&mut self, out: &mut BytesMut) {
        if self.open != Open::None {
            write_sse(
                out,
                "content_block_stop",
                &BlockStopOut {
                    ty: "content_block_stop",
                    index: self.next_block - 1,
                },
            );
            self.open = Open::None;
        }
    }

    /// `event: content_block_delta` with
    /// `{"type":"content_block_delta","index":…,"delta":{…}}`, byte for byte
    /// what serde_json writes.
    fn delta(&self, out: &mut BytesMut, index: u32, delta: DeltaOut<'_>) {
        push_sse_head(out, "content_block_delta");
        out.extend_from_slice(b"{\"type\":\"content_block_delta\",\"index\":");
        push_u64(out, u64::from(index));
        let (head, value): (&[u8], &str) = match delta {
            DeltaOut::TextDelta { text } => {
                (b",\"delta\":{\"type\":\"text_delta\",\"text\":", text)
            }
            DeltaOut::ThinkingDelta { thinking } => (
                b",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":",
                thinking,
            ),
            DeltaOut::SignatureDelta { signature } => (
                b",\"delta\":{\"type\":\"signature_delta\",\"signature\":",
                signature,
            ),
            DeltaOut::InputJsonDelta { partial_json } => (
                b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":",
                partial_json,
            ),
        };
        out.extend_from_slice(head);
        push_str(out, value);
        out.extend_from_slice(b"}}\n\n");
    }
}
