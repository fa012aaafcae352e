//! Chat Completions streaming
//! (<https://platform.openai.com/docs/api-reference/chat/streaming>):
//! `data: {"id","object":"chat.completion.chunk","created","model","choices":[{"index":0,
//! "delta":{"role","content","reasoning_content","tool_calls":[{"index","id","type",
//! "function":{"name","arguments"}}]},"finish_reason"}],"usage"}` events, ended by
//! `data: [DONE]`. The decoder reads upstream chunks into canonical events
//! with borrowed strings (no allocation for a text chunk); the encoder writes
//! client chunks straight into the output buffer.

use bytes::BytesMut;
use serde::Serialize;

use super::super::scan::Scan;

use super::super::json::{opt, prefixed, push_str, push_u64, write_data, Few, First, Str};
use super::super::{ErrorKind, ProtocolError, StreamEvent, StreamOptions, Usage};
use super::{stop_from_wire, stop_to_wire, UsageIn};

/// One upstream chunk, read by [`ChunkIn::parse`] (hand-written: the
/// per-token hot path); `usage` and `error` go through serde.
#[derive(Default)]
struct ChunkIn<'a> {
    id: Option<Str<'a>>,
    model: Option<Str<'a>>,
    /// The choice of index 0 (an answer with more choices than asked, `n` > 1 or a
    /// provider's extra, streams the others in chunks of their own or beside it: they are
    /// skipped, the rule of every translation, see `crate::protocol`).
    choices: First<ChoiceIn<'a>>,
    usage: Option<UsageIn>,
    error: Option<super::super::json::ErrorObj<'a>>,
}

#[derive(Default)]
struct ChoiceIn<'a> {
    /// `index` (absent: 0, a single choice).
    index: Option<u32>,
    delta: Option<DeltaIn<'a>>,
    finish_reason: Option<Str<'a>>,
}

#[derive(Default)]
struct DeltaIn<'a> {
    content: Option<Str<'a>>,
    reasoning_content: Option<Str<'a>>,
    /// vLLM/OpenRouter spelling of `reasoning_content`.
    reasoning: Option<Str<'a>>,
    refusal: Option<Str<'a>>,
    /// `Few`: one tool delta per chunk is the rule, several the exception
    /// (no `Vec` allocated per argument chunk).
    tool_calls: Few<ToolDeltaIn<'a>>,
}

#[derive(Default)]
struct ToolDeltaIn<'a> {
    index: Option<u32>,
    id: Option<Str<'a>>,
    name: Option<Str<'a>>,
    arguments: Option<Str<'a>>,
}

const WHAT: &str = "chat chunk";

impl<'a> ChunkIn<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, ProtocolError> {
        let mut s = Scan::new(data, WHAT);
        let mut c = ChunkIn::default();
        s.object(|s, name| {
            match name {
                b"id" => c.id = s.opt_str()?.map(Str),
                b"model" => c.model = s.opt_str()?.map(Str),
                b"choices" => {
                    let mut first = None;
                    s.array(|s| {
                        if first.is_some() {
                            return s.skip();
                        }
                        let c = ChoiceIn::parse(s)?;
                        if c.index.unwrap_or(0) == 0 {
                            first = Some(c);
                        }
                        Ok(())
                    })?;
                    c.choices = First(first);
                }
                b"usage" => c.usage = s.serde()?,
                b"error" => c.error = s.serde()?,
                _ => s.skip()?,
            }
            Ok(())
        })?;
        s.end()?;
        Ok(c)
    }
}

impl<'a> ChoiceIn<'a> {
    fn parse(s: &mut Scan<'a>) -> Result<Self, ProtocolError> {
        let mut c = ChoiceIn::default();
        s.object(|s, name| {
            match name {
                b"delta" => {
                    if !s.null()? {
                        c.delta = Some(DeltaIn::parse(s)?);
                    }
                }
                b"finish_reason" => c.finish_reason = s.opt_str()?.map(Str),
                b"index" => c.index = s.opt_u32()?,
                _ => s.skip()?,
            }
            Ok(())
        })?;
        Ok(c)
    }
}

impl<'a> DeltaIn<'a> {
    fn parse(s: &mut Scan<'a>) -> Result<Self, ProtocolError> {
        let mut d = DeltaIn::default();
        s.object(|s, name| {
            let slot = match name {
                b"content" => &mut d.content,
                b"reasoning_content" => &mut d.reasoning_content,
                b"reasoning" => &mut d.reasoning,
                b"refusal" => &mut d.refusal,
                b"tool_calls" => {
                    return s.array(|s| {
                        d.tool_calls.push(ToolDeltaIn::parse(s)?);
                        Ok(())
                    })
                }
                _ => return s.skip(),
            };
            *slot = s.opt_str()?.map(Str);
            Ok(())
        })?;
        Ok(d)
    }
}

impl<'a> ToolDeltaIn<'a> {
    fn parse(s: &mut Scan<'a>) -> Result<Self, ProtocolError> {
        let mut t = ToolDeltaIn::default();
        s.object(|s, name| {
            match name {
                b"index" => t.index = s.opt_u32()?,
                b"id" => t.id = s.opt_str()?.map(Str),
                b"function" => {
                    if !s.null()? {
                        s.object(|s, name| {
                            match name {
                                b"name" => t.name = s.opt_str()?.map(Str),
                                b"arguments" => t.arguments = s.opt_str()?.map(Str),
                                _ => s.skip()?,
                            }
                            Ok(())
                        })?;
                    }
                }
                _ => s.skip()?,
            }
            Ok(())
        })?;
        Ok(t)
    }
}

/// Upstream Chat Completions stream → canonical events.
///
/// Emits [`StreamEvent::Start`] on the first chunk, deltas as they come, a
/// [`StreamEvent::Stop`] on `finish_reason`, [`StreamEvent::Usage`] on a
/// usage chunk and [`StreamEvent::End`] on `data: [DONE]`.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    done: bool,
}

impl StreamDecoder {
    /// A decoder for one stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `[DONE]` was seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes one upstream SSE event (`event` name if any, joined `data`),
    /// calling `emit` for each canonical event.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidUpstream`] for unparseable data,
    /// [`ProtocolError::Upstream`] for an `{"error":…}` event, or whatever
    /// `emit` returns.
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
        if data == b"[DONE]" {
            self.done = true;
            return emit(&StreamEvent::End);
        }
        let c = ChunkIn::parse(data)?;
        if let Some(e) = &c.error {
            return Err(e.to_error(ErrorKind::Api));
        }
        if event == Some("error") {
            return Err(ProtocolError::Upstream {
                kind: ErrorKind::Api,
                message: "upstream stream error".into(),
            });
        }
        if !self.started {
            self.started = true;
            emit(&StreamEvent::Start {
                id: opt(&c.id).unwrap_or("").into(),
                model: opt(&c.model).unwrap_or("").into(),
                usage: Usage::default(),
            })?;
        }
        if let Some(choice) = c.choices.0 {
            if let Some(d) = choice.delta {
                let reasoning = d.reasoning_content.or(d.reasoning);
                if let Some(r) = reasoning.filter(|r| !r.as_str().is_empty()) {
                    emit(&StreamEvent::ReasoningDelta(r.0))?;
                }
                if let Some(t) = d.content.filter(|t| !t.as_str().is_empty()) {
                    emit(&StreamEvent::TextDelta(t.0))?;
                }
                if let Some(t) = d.refusal.filter(|t| !t.as_str().is_empty()) {
                    emit(&StreamEvent::TextDelta(t.0))?;
                }
                for (k, t) in d.tool_calls.into_iter().enumerate() {
                    let index = t.index.unwrap_or(k as u32);
                    let (name, args) = (t.name, t.arguments);
                    if let Some(id) = t.id {
                        emit(&StreamEvent::ToolCallStart {
                            index,
                            id: id.0,
                            name: name.map(|n| n.0).unwrap_or_default(),
                        })?;
                    }
                    if let Some(a) = args {
                        if !a.as_str().is_empty() {
                            emit(&StreamEvent::ToolArgumentsDelta {
                                index,
                                fragment: a.0,
                            })?;
                        }
                    }
                }
            }
            if let Some(r) = opt(&choice.finish_reason) {
                emit(&StreamEvent::Stop {
                    reason: stop_from_wire(r),
                    stop_sequence: None,
                })?;
            }
        }
        if let Some(u) = &c.usage {
            emit(&StreamEvent::Usage(u.canonical()))?;
        }
        Ok(())
    }
}

/// The usage-only chunk (`"choices":[]`), the one chunk still written
/// through serde (once per stream).
#[derive(Serialize)]
struct ChunkOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [(); 0],
    usage: UsageOut,
}

/// The `delta` of one client chunk; `None` fields are left out. Written by
/// [`DeltaOut::write`] as serde_json would write
/// `{"role","content","reasoning_content","tool_calls":[…]}`.
#[derive(Default)]
struct DeltaOut<'a> {
    role: Option<&'static str>,
    content: Option<&'a str>,
    reasoning_content: Option<&'a str>,
    tool_calls: Option<ToolCallOut<'a>>,
}

/// One element of `delta.tool_calls`: `{"index","id"?,"type"?,"function":{"name"?,"arguments"}}`.
struct ToolCallOut<'a> {
    index: u32,
    id: Option<&'a str>,
    ty: Option<&'static str>,
    name: Option<&'a str>,
    arguments: &'a str,
}

impl DeltaOut<'_> {
    fn write(&self, out: &mut BytesMut) {
        out.extend_from_slice(b"{");
        let mut sep: &[u8] = b"";
        let mut field = |out: &mut BytesMut, key: &[u8], value: Option<&str>| {
            if let Some(v) = value {
                out.extend_from_slice(sep);
                out.extend_from_slice(key);
                push_str(out, v);
                sep = b",";
            }
        };
        field(out, b"\"role\":", self.role);
        field(out, b"\"content\":", self.content);
        field(out, b"\"reasoning_content\":", self.reasoning_content);
        let sep =
            if self.role.is_some() || self.content.is_some() || self.reasoning_content.is_some() {
                &b","[..]
            } else {
                b""
            };
        if let Some(t) = &self.tool_calls {
            out.extend_from_slice(sep);
            out.extend_from_slice(b"\"tool_calls\":[{\"index\":");
            push_u64(out, u64::from(t.index));
            if let Some(id) = t.id {
                out.extend_from_slice(b",\"id\":");
                push_str(out, id);
            }
            if let Some(ty) = t.ty {
                out.extend_from_slice(b",\"type\":");
                push_str(out, ty);
            }
            out.extend_from_slice(b",\"function\":{");
            if let Some(name) = t.name {
                out.extend_from_slice(b"\"name\":");
                push_str(out, name);
                out.extend_from_slice(b",");
            }
            out.extend_from_slice(b"\"arguments\":");
            push_str(out, t.arguments);
            out.extend_from_slice(b"}}]");
        }
        out.extend_from_slice(b"}");
    }
}

#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: CachedOut,
    completion_tokens_details: ReasoningOut,
}

#[derive(Serialize)]
struct CachedOut {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct ReasoningOut {
    reasoning_tokens: u64,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        UsageOut {
            prompt_tokens: u.input_tokens,
            completion_tokens: u.output_tokens,
            total_tokens: u.input_tokens + u.output_tokens,
            prompt_tokens_details: CachedOut {
                cached_tokens: u.cache_read_tokens,
            },
            completion_tokens_details: ReasoningOut {
                reasoning_tokens: u.reasoning_tokens,
            },
        }
    }
}

/// Canonical events → Chat Completions client chunks.
///
/// `Start` writes the role chunk, each delta one chunk, `Stop` the
/// `finish_reason` chunk, `End` the usage chunk (`"choices":[]`, only when
/// the client asked with `stream_options.include_usage`) and `data: [DONE]`.
/// Reasoning signatures are dropped (Chat has no field for them).
#[derive(Debug)]
pub struct StreamEncoder {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    usage: Usage,
    started: bool,
    finished: bool,
    /// Every chunk's constant start, `data: {"id":…,"object":…,"created":…,
    /// "model":…,"choices":[{"index":0,"delta":`, written once the id is
    /// known (the first event) and copied per chunk.
    head: BytesMut,
}

impl StreamEncoder {
    /// An encoder for one client stream.
    pub fn new(opts: &StreamOptions) -> Self {
        StreamEncoder {
            id: String::from("chatcmpl-"),
            model: opts.model.clone(),
            created: opts.created,
            include_usage: opts.include_usage,
            usage: Usage::default(),
            started: false,
            finished: false,
            head: BytesMut::new(),
        }
    }

    /// The usage seen so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Whether `data: [DONE]` was written.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Appends the client frames for `ev` to `out`.
    pub fn encode(&mut self, ev: &StreamEvent<'_>, out: &mut BytesMut) {
        if self.finished {
            return;
        }
        if !self.started {
            if let StreamEvent::Start { id, .. } = ev {
                if !id.is_empty() {
                    self.id = prefixed("chatcmpl-", id);
                }
            }
            self.started = true;
            self.write_head();
            let d = DeltaOut {
                role: Some("assistant"),
                content: Some(""),
                ..DeltaOut::default()
            };
            self.chunk(out, d, None);
        }
        match ev {
            StreamEvent::Start { usage, .. } => self.usage = *usage,
            StreamEvent::TextDelta(t) => {
                let d = DeltaOut {
                    content: Some(t),
                    ..DeltaOut::default()
                };
                self.chunk(out, d, None);
            }
            StreamEvent::ReasoningDelta(t) => {
                let d = DeltaOut {
                    reasoning_content: Some(t),
                    ..DeltaOut::default()
                };
                self.chunk(out, d, None);
            }
            StreamEvent::ReasoningSignature(_) => {}
            StreamEvent::ToolCallStart { index, id, name } => {
                let d = DeltaOut {
                    tool_calls: Some(ToolCallOut {
                        index: *index,
                        id: Some(id),
                        ty: Some("function"),
                        name: Some(name),
                        arguments: "",
                    }),
                    ..DeltaOut::default()
                };
                self.chunk(out, d, None);
            }
            StreamEvent::ToolArgumentsDelta { index, fragment } => {
                let d = DeltaOut {
                    tool_calls: Some(ToolCallOut {
                        index: *index,
                        id: None,
                        ty: None,
                        name: None,
                        arguments: fragment,
                    }),
                    ..DeltaOut::default()
                };
                self.chunk(out, d, None);
            }
            StreamEvent::Stop { reason, .. } => {
                self.chunk(out, DeltaOut::default(), Some(stop_to_wire(*reason)));
            }
            StreamEvent::Usage(u) => self.usage = *u,
            StreamEvent::End => {
                self.finished = true;
                if self.include_usage {
                    let c = ChunkOut {
                        id: &self.id,
                        object: "chat.completion.chunk",
                        created: self.created,
                        model: &self.model,
                        choices: [],
                        usage: self.usage.into(),
                    };
                    write_data(out, &c);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
    }

    /// Appends OpenAI's in-stream error frame and ends the stream.
    pub fn error(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        self.finished = true;
        super::super::json::error_event(
            super::super::ClientDialect::ChatCompletions,
            kind,
            message,
            0,
            out,
        );
    }

    fn write_head(&mut self) {
        let h = &mut self.head;
        h.clear();
        // One allocation: 100 constant bytes, up to 20 digits, the id and
        // model (a few more bytes when they need escapes).
        h.reserve(128 + self.id.len() + self.model.len());
        h.extend_from_slice(b"data: {\"id\":");
        push_str(h, &self.id);
        h.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        push_u64(h, self.created);
        h.extend_from_slice(b",\"model\":");
        push_str(h, &self.model);
        h.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
    }

    /// One chunk: `head`, the delta, `"logprobs":null,"finish_reason":…}]`,
    /// `"usage":null` when the client asked for usage, `\n\n`.
    fn chunk(&self, out: &mut BytesMut, delta: DeltaOut<'_>, finish_reason: Option<&str>) {
        out.extend_from_slice(&self.head);
        delta.write(out);
        out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish_reason {
            Some(r) => push_str(out, r),
            None => out.extend_from_slice(b"null"),
        }
        if self.include_usage {
            out.extend_from_slice(b"}],\"usage\":null}\n\n");
        } else {
            out.extend_from_slice(b"}]}\n\n");
        }
    }
}
