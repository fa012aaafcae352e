//! The dialect-agnostic stream translator: one upstream decoder and one
//! client encoder, chosen by the [`UpstreamDialect`] and the [`ClientDialect`], event by event.

use bytes::BytesMut;

use super::continuation::{Splice, Transcript};
use super::{
    chat, converse, gemini, messages, responses, ClientDialect, ErrorKind, ProtocolError,
    UpstreamDialect, Usage,
};

/// What a client stream encoder needs besides the events.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// The model id echoed to the client (the standard model).
    pub model: String,
    /// Creation time for the client's chunks, Unix seconds.
    pub created: u64,
    /// Whether the client asked for usage in the stream (Chat
    /// `stream_options.include_usage`; ignored by dialects that always send it).
    pub include_usage: bool,
    /// What of the client's request its answer reflects ([`super::ClientEcho`]).
    pub echo: super::ClientEcho,
    /// The wall clock, Unix seconds (a Responses stream's `completed_at`; tests fix it).
    pub clock: fn() -> u64,
}

#[derive(Debug)]
enum Decoder {
    Chat(chat::StreamDecoder),
    Messages(messages::StreamDecoder),
    Gemini(gemini::StreamDecoder),
    Converse(converse::StreamDecoder),
    Responses(responses::upstream_stream::StreamDecoder),
}

#[derive(Debug)]
enum Encoder {
    Chat(chat::StreamEncoder),
    Messages(messages::StreamEncoder),
    Responses(responses::StreamEncoder),
}

/// Translates an upstream SSE stream of one dialect into client SSE frames of
/// another, event by event (a text delta goes out in the same call that
/// received it).
///
/// Use: for each upstream event framed by [`crate::sse::SseNormalizer`],
/// call [`on_event`](Self::on_event) with its name and data; on an error
/// (upstream `error` event, unparseable data) call
/// [`error`](Self::error) with the kind and message, which writes the
/// client dialect's in-stream error and ends the stream.
#[derive(Debug)]
pub struct StreamTranslator {
    decoder: Decoder,
    encoder: Encoder,
    client: ClientDialect,
    /// Canonical content events seen (text, reasoning, tool call, arguments).
    content_events: u64,
    /// A [`StreamEvent::Stop`](super::StreamEvent::Stop) was translated.
    stopped: bool,
    /// What the client stream carried so far (only for a stream that may be continued,
    /// see [`record_transcript`](Self::record_transcript)).
    transcript: Option<Transcript>,
    /// The continuation's mapping, once [`resume`](Self::resume) switched the upstream.
    splice: Option<Splice>,
}

impl StreamTranslator {
    /// A translator from `upstream` to `client`. `None` when no translation
    /// is needed (the same dialect).
    pub fn new(
        upstream: UpstreamDialect,
        client: ClientDialect,
        opts: &StreamOptions,
    ) -> Option<Self> {
        if client.same_as(upstream) {
            return None;
        }
        Some(Self::canonical(upstream, client, opts))
    }

    /// A translator from `upstream` to `client` through the canonical model even for the
    /// same dialect (a stream that may be continued on another route needs the client's
    /// encoder state).
    pub fn canonical(
        upstream: UpstreamDialect,
        client: ClientDialect,
        opts: &StreamOptions,
    ) -> Self {
        let decoder = Self::decoder(upstream);
        let encoder = match client {
            ClientDialect::ChatCompletions => Encoder::Chat(chat::StreamEncoder::new(opts)),
            ClientDialect::Messages => Encoder::Messages(messages::StreamEncoder::new(opts)),
            ClientDialect::Responses => Encoder::Responses(responses::StreamEncoder::new(opts)),
        };
        StreamTranslator {
            decoder,
            encoder,
            client,
            content_events: 0,
            stopped: false,
            transcript: None,
            splice: None,
        }
    }

    fn decoder(upstream: UpstreamDialect) -> Decoder {
        match upstream {
            UpstreamDialect::ChatCompletions => Decoder::Chat(chat::StreamDecoder::new()),
            UpstreamDialect::Messages => Decoder::Messages(messages::StreamDecoder::new()),
            UpstreamDialect::Gemini => Decoder::Gemini(gemini::StreamDecoder::new()),
            UpstreamDialect::Converse => Decoder::Converse(converse::StreamDecoder::new()),
            UpstreamDialect::Responses => {
                Decoder::Responses(responses::upstream_stream::StreamDecoder::new())
            }
        }
    }

    /// Starts recording what the client stream carries ([`Transcript`], at most
    /// `cap_bytes` of text) so that it can be continued on another route.
    pub fn record_transcript(&mut self, cap_bytes: usize) {
        self.transcript = Some(Transcript::new(cap_bytes));
    }

    /// The transcript, when recorded.
    pub fn transcript(&self) -> Option<&Transcript> {
        self.transcript.as_ref()
    }

    /// Switches to a continuation from `upstream`: a fresh decoder for its events, which
    /// reach the same client encoder through `splice` (the stream goes on as one).
    pub fn resume(&mut self, upstream: UpstreamDialect, splice: Splice) {
        self.decoder = Self::decoder(upstream);
        self.splice = Some(splice);
    }

    /// How a continuation's seam was decided ([`Splice::seam_outcome`]), once it was.
    pub fn seam_outcome(&self) -> Option<super::seam::SeamOutcome> {
        self.splice.as_ref().and_then(Splice::seam_outcome)
    }

    /// Whether a continuation's seam refused it ([`Splice::refused`]).
    pub fn seam_refused(&self) -> bool {
        self.splice.as_ref().is_some_and(Splice::refused)
    }

    /// The client dialect.
    pub fn client(&self) -> ClientDialect {
        self.client
    }

    /// Translates one upstream event (`event` name, joined `data` payload),
    /// appending complete client frames to `out`.
    ///
    /// # Errors
    /// [`ProtocolError::Upstream`] for an upstream error event,
    /// [`ProtocolError::InvalidUpstream`] for unparseable data or an
    /// inexpressible sequence. Frames of earlier events in the same call stay
    /// in `out`; the caller then writes [`error`](Self::error).
    pub fn on_event(
        &mut self,
        event: Option<&str>,
        data: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), ProtocolError> {
        let encoder = &mut self.encoder;
        let content_events = &mut self.content_events;
        let stopped = &mut self.stopped;
        let transcript = &mut self.transcript;
        let splice = &mut self.splice;
        let mut deliver = |ev: &super::StreamEvent<'_>| {
            deliver_one(
                Sink {
                    encoder,
                    content_events,
                    stopped,
                    transcript,
                },
                ev,
                out,
            )
        };
        // A continuation's events reach the encoder through its splice.
        let mut emit = |ev: &super::StreamEvent<'_>| match splice.as_mut() {
            Some(s) => s.feed(ev, &mut deliver),
            None => deliver(ev),
        };
        match &mut self.decoder {
            Decoder::Chat(d) => d.decode(event, data, &mut emit),
            Decoder::Messages(d) => d.decode(event, data, &mut emit),
            Decoder::Gemini(d) => d.decode(event, data, &mut emit),
            Decoder::Converse(d) => d.decode(event, data, &mut emit),
            Decoder::Responses(d) => d.decode(event, data, &mut emit),
        }
    }

    /// Whether the upstream said why generation stopped (a finish reason, a
    /// `message_delta` stop reason): the answer is complete even when the
    /// upstream body ends before its terminator.
    pub fn has_stop_reason(&self) -> bool {
        self.stopped
    }

    /// Ends the client stream as the upstream terminator (`[DONE]`,
    /// `message_stop`) would, for an upstream body that ended cleanly after
    /// its stop reason but without the terminator. Does nothing once finished.
    ///
    /// # Errors
    /// As [`on_event`](Self::on_event).
    pub fn finish(&mut self, out: &mut BytesMut) -> Result<(), ProtocolError> {
        if self.is_finished() {
            return Ok(());
        }
        let ev = super::StreamEvent::End;
        match &mut self.encoder {
            Encoder::Chat(e) => {
                e.encode(&ev, out);
                Ok(())
            }
            Encoder::Messages(e) => e.encode(&ev, out),
            Encoder::Responses(e) => e.encode(&ev, out),
        }
    }

    /// Appends the client dialect's in-stream error event and ends the
    /// stream (later events are ignored).
    pub fn error(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        match &mut self.encoder {
            Encoder::Chat(e) => e.error(kind, message, out),
            Encoder::Messages(e) => e.error(kind, message, out),
            Encoder::Responses(e) => e.error(kind, message, out),
        }
    }

    /// Number of content events (text, reasoning, tool-call start or
    /// arguments) translated so far: the first one marks TTFT, the count
    /// feeds the output-event metrics.
    pub fn content_events(&self) -> u64 {
        self.content_events
    }

    /// Usage seen so far (final once [`is_finished`](Self::is_finished)).
    pub fn usage(&self) -> Usage {
        match &self.encoder {
            Encoder::Chat(e) => e.usage(),
            Encoder::Messages(e) => e.usage(),
            Encoder::Responses(e) => e.usage(),
        }
    }

    /// Whether the client stream is complete (final frame or error written).
    pub fn is_finished(&self) -> bool {
        match &self.encoder {
            Encoder::Chat(e) => e.is_finished(),
            Encoder::Messages(e) => e.is_finished(),
            Encoder::Responses(e) => e.is_finished(),
        }
    }

    /// Encodes a whole answer as the client's complete stream, into `out`: for an upstream
    /// that answered a streaming request with one JSON body (it ignored `stream: true`).
    /// The canonical events are those a stream of the same answer carries, in order:
    /// `Start` (id, model, the input usage), each output item (reasoning text and its
    /// signature, text, each tool call's start and its whole arguments), `Stop`, `Usage`,
    /// `End`. It is the stream's first answer, so no continuation's splice applies.
    ///
    /// # Errors
    /// As [`on_event`](Self::on_event) (a sequence the client's encoder cannot express).
    pub fn replay(
        &mut self,
        resp: &super::Response,
        out: &mut BytesMut,
    ) -> Result<(), ProtocolError> {
        use super::{OutputItem, StreamEvent};
        use std::borrow::Cow;
        let input = Usage {
            output_tokens: 0,
            reasoning_tokens: 0,
            ..resp.usage
        };
        deliver_one(
            self.sink(),
            &StreamEvent::Start {
                id: Cow::Borrowed(&resp.id),
                model: Cow::Borrowed(&resp.model),
                usage: input,
            },
            out,
        )?;
        let mut tool_index = 0u32;
        for item in &resp.output {
            match item {
                OutputItem::Reasoning { text, signature } => {
                    if !text.is_empty() {
                        deliver_one(
                            self.sink(),
                            &StreamEvent::ReasoningDelta(Cow::Borrowed(text)),
                            out,
                        )?;
                    }
                    if let Some(sig) = signature {
                        deliver_one(
                            self.sink(),
                            &StreamEvent::ReasoningSignature(Cow::Borrowed(sig)),
                            out,
                        )?;
                    }
                }
                OutputItem::Text(text) => {
                    deliver_one(
                        self.sink(),
                        &StreamEvent::TextDelta(Cow::Borrowed(text)),
                        out,
                    )?;
                }
                OutputItem::ToolCall(call) => {
                    deliver_one(
                        self.sink(),
                        &StreamEvent::ToolCallStart {
                            index: tool_index,
                            id: Cow::Borrowed(&call.id),
                            name: Cow::Borrowed(&call.name),
                        },
                        out,
                    )?;
                    deliver_one(
                        self.sink(),
                        &StreamEvent::ToolArgumentsDelta {
                            index: tool_index,
                            fragment: Cow::Borrowed(&call.arguments),
                        },
                        out,
                    )?;
                    tool_index += 1;
                }
            }
        }
        deliver_one(
            self.sink(),
            &StreamEvent::Stop {
                reason: resp.stop_reason,
                stop_sequence: resp.stop_sequence.as_deref().map(Cow::Borrowed),
            },
            out,
        )?;
        deliver_one(self.sink(), &StreamEvent::Usage(resp.usage), out)?;
        deliver_one(self.sink(), &StreamEvent::End, out)
    }
}

impl StreamTranslator {
    /// The translator's parts an event goes through ([`deliver_one`]).
    fn sink(&mut self) -> Sink<'_> {
        Sink {
            encoder: &mut self.encoder,
            content_events: &mut self.content_events,
            stopped: &mut self.stopped,
            transcript: &mut self.transcript,
        }
    }
}

/// What one canonical event goes through on its way to the client's encoder (the
/// translator's fields, borrowed apart from its decoder and a continuation's splice).
struct Sink<'a> {
    encoder: &'a mut Encoder,
    content_events: &'a mut u64,
    stopped: &'a mut bool,
    transcript: &'a mut Option<Transcript>,
}

/// One canonical event into the transcript (if recorded), the counters and the client's
/// encoder (after a continuation's splice, when there is one).
fn deliver_one(
    sink: Sink<'_>,
    ev: &super::StreamEvent<'_>,
    out: &mut BytesMut,
) -> Result<(), ProtocolError> {
    if let Some(t) = sink.transcript.as_mut() {
        t.observe(ev);
    }
    if ev.is_content() {
        *sink.content_events += 1;
    }
    if matches!(ev, super::StreamEvent::Stop { .. }) {
        *sink.stopped = true;
    }
    match sink.encoder {
        Encoder::Chat(e) => {
            e.encode(ev, out);
            Ok(())
        }
        Encoder::Messages(e) => e.encode(ev, out),
        Encoder::Responses(e) => e.encode(ev, out),
    }
}
