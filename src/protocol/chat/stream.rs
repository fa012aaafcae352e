//! Chat Completions streaming
//! (<https://platform.openai.com/docs/api-reference/chat/streaming>):
//! `data: {"id","object":"chat.completion.chunk","created","model","choices":[{"index":0,
//! "delta":{"role","content","reasoning_content","tool_calls":[{"index","id","type",
//! "function":{"name","arguments"}}]},"finish_reason"}],"usage"}` events, ended by
//! `data: [DONE]`. The decoder reads upstream chunks into canonical events
//! with borrowed strings (no allocation for a text chunk); the encoder writes
//! client chunks straight into the output buffer.

use bytes::BytesMut;
use serde::{Deserialize, Serialize};

use super::super::json::{opt, prefixed, write_data, First, Str};
use super::super::{ErrorKind, ProtocolError, StreamEvent, StreamOptions, Usage};
use super::{stop_from_wire, stop_to_wire, UsageIn};

#[derive(Deserialize)]
struct ChunkIn<'a> {
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(borrow, default)]
    choices: First<ChoiceIn<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(borrow, default)]
    error: Option<super::super::json::ErrorObj<'a>>,
}

#[derive(Deserialize)]
struct ChoiceIn<'a> {
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    content: Option<Str<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Str<'a>>,
    /// vLLM/OpenRouter spelling of `reasoning_content`.
    #[serde(borrow, default)]
    reasoning: Option<Str<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Str<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolDeltaIn<'a>>>,
}

#[derive(Deserialize)]
struct ToolDeltaIn<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(borrow, default)]
    id: Option<Str<'a>>,
    #[serde(borrow, default)]
    function: Option<FunctionDeltaIn<'a>>,
}

#[derive(Deserialize)]
struct FunctionDeltaIn<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    arguments: Option<Str<'a>>,
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
        let c: ChunkIn<'_> = serde_json::from_slice(data)
            .map_err(|e| ProtocolError::InvalidUpstream(format!("chat chunk: {e}")))?;
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
                for (k, t) in d.tool_calls.into_iter().flatten().enumerate() {
                    let index = t.index.unwrap_or(k as u32);
                    let (name, args) = match t.function {
                        Some(f) => (f.name, f.arguments),
                        None => (None, None),
                    };
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

#[derive(Serialize)]
struct ChunkOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [ChoiceOut<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
}

#[derive(Serialize)]
struct ChoiceOut<'a> {
    index: u32,
    delta: DeltaOut<'a>,
    logprobs: (),
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct DeltaOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallOut<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallOut<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    ty: Option<&'static str>,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
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
                    tool_calls: Some([ToolCallOut {
                        index: *index,
                        id: Some(id),
                        ty: Some("function"),
                        function: FunctionOut {
                            name: Some(name),
                            arguments: "",
                        },
                    }]),
                    ..DeltaOut::default()
                };
                self.chunk(out, d, None);
            }
            StreamEvent::ToolArgumentsDelta { index, fragment } => {
                let d = DeltaOut {
                    tool_calls: Some([ToolCallOut {
                        index: *index,
                        id: None,
                        ty: None,
                        function: FunctionOut {
                            name: None,
                            arguments: fragment,
                        },
                    }]),
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
                        choices: &[],
                        usage: Some(Some(self.usage.into())),
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
            super::super::Dialect::ChatCompletions,
            kind,
            message,
            0,
            out,
        );
    }

    fn chunk(&self, out: &mut BytesMut, delta: DeltaOut<'_>, finish_reason: Option<&str>) {
        let choice = ChoiceOut {
            index: 0,
            delta,
            logprobs: (),
            finish_reason,
        };
        let c = ChunkOut {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage: if self.include_usage { Some(None) } else { None },
        };
        write_data(out, &c);
    }
}
