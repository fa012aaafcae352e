//! Owns the per-stream transform of a streaming answer on its way to the client: content
//! decoding, SSE re-framing (UTF-8 repair included), the model echo or the translation
//! between the upstream's and the client's dialect, and the verdict on how the upstream
//! body ended.
//!
//! Two paths: the same dialect in and out (the fast path: events forwarded with the model
//! echo rewritten), or any other pair through [`protocol::StreamTranslator`]. The fast path
//! follows the dialect's own description ([`protocol::FastPath`]: terminal event and
//! terminator, keepalive, in-band error, content, finish and usage probes, where the model
//! sits). The pipe names no provider kind, no dialect and no dialect module: it only
//! chooses these objects.
//!
//! A stream that may be continued on another route (`models.<id>.continue_on_break`)
//! always takes the translator, the same dialect included: the client's encoder and the
//! transcript of what it wrote must outlive the first upstream ([`StreamPipe::resume`],
//! [`crate::engine::continuation`]). Fields without a canonical equivalent (Chat `logprobs`,
//! `system_fingerprint`) are then dropped, as for any translated pair.
//!
//! Only data events of the answer count toward the commit ([`StreamPipe::data_events`]):
//! comments and Anthropic `ping`s do not, so an upstream that pings and then fails before
//! its first event still falls back. A data event that is not JSON (a provider's bad line)
//! neither commits nor ends the stream, and is never forwarded (the client's SDK would fail
//! on it mid-stream): it is dropped on both paths, counted
//! (`sluice_sse_malformed_events_total`) and logged once per stream. On the fast path the
//! check is the structural one ([`protocol::is_balanced_json`], no parse per event) once
//! the answer is committed; unknown events that are JSON still pass through untouched.
//! Upstream keepalive chatter on a translated stream (comments, Anthropic `ping`) produces
//! no output; the pipe notes it ([`StreamPipe::take_keepalive`]) and the pump relays it as
//! the client dialect's own keepalive.
//!
//! The pump ([`crate::stream::pump`]) feeds it upstream chunks and writes what lands in its output;
//! it never looks at events itself. End of body (`feed(None)`): a stream is complete with
//! `[DONE]` (forwarded or translated), or with a finish reason and no `[DONE]` (then
//! exactly one `data: [DONE]` is added); a body that ends without a finish reason, or in the
//! middle of an event, broke off and becomes an error ([`PipeError::Framing`]).

use bytes::{Bytes, BytesMut};

use crate::billing::metering::{self, OutputEstimator};
use crate::config::Route;
use crate::metrics::metrics;
use crate::protocol::wire::RequestedUsage;
use crate::protocol::{self, ClientDialect, ErrorKind, FastPath, ProtocolError, UpstreamDialect};
use crate::providers;
use crate::providers::encoding::{ContentCoding, Decoder};
use crate::providers::framing::Unframer;
use crate::sse::{self, ModelRewriter, SseError, SseNormalizer};

/// Why a stream cannot go on.
#[derive(Debug)]
pub(crate) enum PipeError {
    /// The upstream sent an in-band error event (error type already OpenAI-shaped).
    Upstream {
        /// Canonical kind (the client's in-stream error event is typed by it).
        kind: ErrorKind,
        /// OpenAI error type: the provider's own (`overloaded_error`, `rate_limit_error`, ...).
        error_type: String,
        /// The provider's message.
        message: String,
    },
    /// The body broke: framing, encoding, an event over its limit, a truncated end.
    Framing {
        /// The `sluice_stream_errors_total` reason (also the error event's `code`).
        reason: &'static str,
        /// What the client is told (before the commit in the 502, after it in the error
        /// event): names the provider and the cause, never upstream bytes or secrets.
        message: String,
    },
}

/// Per-stream transform state: decoder, normalizer, model rewrite or the dialect translator,
/// counters. Reused buffers: no allocation per event in the steady state.
pub(crate) struct StreamPipe<'r> {
    decoder: Option<Decoder>,
    /// Most bytes one compressed chunk may decode to.
    max_decoded: usize,
    /// The provider's stream framing into SSE when it is not SSE (Bedrock's event stream).
    unframer: Option<Unframer>,
    /// `server.max_event_bytes` (a continuation's normalizer gets the same bound).
    max_event_bytes: usize,
    normalizer: SseNormalizer,
    route: &'r Route,
    /// The client's dialect.
    client: ClientDialect,
    /// Upstream and client dialects differ: the translator (`None` = the fast path).
    protocol: Option<protocol::StreamTranslator>,
    /// The same dialect in and out: the dialect's own fast path and its model echo (`Some`
    /// exactly when `protocol` is `None`).
    fast: Option<Fast>,
    /// Where this stream's events name the model (see [`sse::EchoMemo`]).
    echo: sse::EchoMemo,
    /// Output for the client, taken with [`take`](Self::take).
    pub out: BytesMut,
    /// Data events that produced client output.
    pub data_events: u64,
    /// Events that carried generated content.
    pub content_events: u64,
    /// Some event carried generated content (TTFT).
    pub first_content: bool,
    /// Usage as last reported (canonical, all classes; cumulative: the last value is the
    /// stream's), `None` until the upstream sent some.
    pub usage: Option<protocol::Usage>,
    /// The upstream's dialect (how its usage objects read).
    upstream: UpstreamDialect,
    /// Same-dialect stream whose client did not ask for usage that Sluice asked for (Chat's
    /// `stream_options.include_usage`): the usage-only chunk is not forwarded and the
    /// `"usage":null` member that ends every other chunk is removed.
    strip_usage: Option<RequestedUsage>,
    /// Output-token estimate of the text streamed, for a stream that ends without usage.
    pub estimator: OutputEstimator,
    /// A finish reason was seen (fast path; the translator tracks its own).
    finish_seen: bool,
    /// The fast path's terminal event went into `out`.
    done: bool,
    /// Keep the client-bound chunk that carries the Responses terminal event (the response
    /// is stored, [`crate::conversation::capture`]).
    capture_terminal: bool,
    /// That chunk, once taken.
    terminal: Option<Bytes>,
    /// The upstream dialect's keepalive event name (Messages `ping`), for a translated
    /// stream, which does not forward it.
    upstream_keepalive: Option<&'static str>,
    /// A translated stream's upstream sent keepalive chatter (a comment, a `ping`) since the
    /// last [`take_keepalive`](Self::take_keepalive): the pump relays it in the client's
    /// dialect, rate-limited.
    keepalive_seen: bool,
    /// Data events dropped because they are not JSON (`sluice_sse_malformed_events_total`).
    pub malformed: u64,
}

/// The fast path of one stream: the dialect's description and its model echo.
struct Fast {
    path: &'static FastPath,
    rewriter: ModelRewriter,
}

impl<'r> StreamPipe<'r> {
    /// A pipe for one answer of `route` in `coding`; `max_event_bytes` bounds one event,
    /// `max_buffered_bytes` (with it) what one compressed chunk may decode to.
    /// `continuable`: the stream may be continued on another route; its transcript keeps at
    /// most this many bytes of answer text (the translator is used even for the same
    /// dialect).
    ///
    /// # Errors
    /// [`PipeError::Framing`] if the decoder cannot be set up.
    #[expect(
        clippy::too_many_arguments,
        reason = "the stream's parameters are passed explicitly"
    )]
    pub(crate) fn new(
        route: &'r Route,
        client: ClientDialect,
        standard_model: &str,
        include_usage: bool,
        echo: protocol::ClientEcho,
        coding: ContentCoding,
        max_event_bytes: usize,
        max_buffered_bytes: usize,
        created_unix_s: u64,
        continuable: Option<usize>,
    ) -> Result<Self, PipeError> {
        let upstream = route.dialect();
        let opts = protocol::StreamOptions {
            model: standard_model.to_string(),
            created: created_unix_s,
            include_usage,
            echo,
            clock: crate::engine::upstream::unix_now,
        };
        let fast = client
            .wire()
            .fast_path
            .filter(|_| continuable.is_none() && client.same_as(upstream))
            .map(|path| Fast {
                path,
                rewriter: path.rewriter(true, standard_model),
            });
        let protocol = match (&fast, continuable) {
            (Some(_), _) => None,
            (None, cap) => {
                let mut t = protocol::StreamTranslator::canonical(upstream, client, &opts);
                if let Some(cap) = cap {
                    t.record_transcript(cap);
                }
                Some(t)
            }
        };
        // The upstream dialect's keepalive event (Messages `ping`), named by its own wire
        // description: a translated stream relays it in the client's dialect.
        let upstream_keepalive = [
            ClientDialect::ChatCompletions,
            ClientDialect::Messages,
            ClientDialect::Responses,
        ]
        .into_iter()
        .find(|c| c.same_as(upstream))
        .and_then(|c| c.wire().fast_path)
        .and_then(|f| f.keepalive);
        let strip_usage = fast
            .as_ref()
            .and_then(|f| f.path.requested_usage)
            .filter(|_| !include_usage);
        let decoder = content_decoder(route, coding)?;
        Ok(Self {
            decoder,
            max_decoded: max_event_bytes.saturating_add(max_buffered_bytes),
            unframer: Unframer::for_route(route, max_event_bytes),
            max_event_bytes,
            normalizer: SseNormalizer::new(max_event_bytes),
            route,
            client,
            protocol,
            fast,
            echo: sse::EchoMemo::default(),
            // Small: thousands of held streams each own one; it grows with the events.
            out: BytesMut::with_capacity(512),
            data_events: 0,
            content_events: 0,
            first_content: false,
            usage: None,
            upstream,
            strip_usage,
            estimator: OutputEstimator::default(),
            finish_seen: false,
            done: false,
            capture_terminal: false,
            terminal: None,
            upstream_keepalive,
            keepalive_seen: false,
            malformed: 0,
        })
    }

    /// Takes a whole answer instead of a stream: `resp`, decoded from `body` (an upstream
    /// that answered a streaming request with one JSON body), becomes the client's complete
    /// stream in `out`, through this pipe's translator or, on the same-dialect path, a
    /// canonical one made with `opts`. The pipe is then finished, with the answer's usage
    /// (or, when it has none, the output estimate of its text).
    ///
    /// # Errors
    /// [`PipeError::Framing`] (`upstream_error`) when the client's encoder cannot express it.
    pub(crate) fn replay(
        &mut self,
        body: &[u8],
        resp: &protocol::Response,
        opts: &protocol::StreamOptions,
    ) -> Result<(), PipeError> {
        let mut own;
        let t = match self.protocol.as_mut() {
            Some(t) => t,
            None => {
                own = protocol::StreamTranslator::canonical(self.upstream, self.client, opts);
                &mut own
            }
        };
        let before = t.content_events();
        t.replay(resp, &mut self.out)
            .map_err(|e| PipeError::Framing {
                reason: "upstream_error",
                message: format!(
                    "provider `{}` answered a streaming request with one JSON answer that \
                     cannot be sent as a stream: {e}",
                    self.route.provider.id
                ),
            })?;
        let content = t.content_events() - before;
        self.data_events += 1;
        self.content_events += content;
        self.first_content |= content > 0;
        self.finish_seen = true;
        self.done = true;
        if resp.usage == protocol::Usage::default() {
            metering::stream_text(self.upstream, body, true, |s| self.estimator.push_json(s));
        } else {
            self.usage = Some(resp.usage);
        }
        Ok(())
    }

    /// Whether a translated stream's upstream sent keepalive chatter since the last call
    /// (and forgets it): the pump relays it as the client dialect's own keepalive.
    pub(crate) fn take_keepalive(&mut self) -> bool {
        std::mem::take(&mut self.keepalive_seen)
    }

    /// The transcript of what the client stream carried, for a continuable stream.
    pub(crate) fn transcript(&self) -> Option<&protocol::continuation::Transcript> {
        self.protocol.as_ref().and_then(|t| t.transcript())
    }

    /// How a continuation's seam was decided, once it was ([`protocol::seam`]).
    pub(crate) fn seam_outcome(&self) -> Option<protocol::seam::SeamOutcome> {
        self.protocol
            .as_ref()
            .and_then(protocol::StreamTranslator::seam_outcome)
    }

    /// Switches the pipe to a continuation answered by `route` in `coding`: its events are
    /// framed afresh and reach the client's encoder through `splice`, so the client's
    /// stream goes on as one (no second start, block indices and ids continue).
    ///
    /// # Errors
    /// [`PipeError::Framing`] when the stream is not continuable (no translator) or the
    /// decoder cannot be set up; the pipe is unchanged then.
    pub(crate) fn resume(
        &mut self,
        route: &'r Route,
        coding: ContentCoding,
        splice: protocol::continuation::Splice,
    ) -> Result<(), PipeError> {
        let decoder = content_decoder(route, coding)?;
        let upstream = route.dialect();
        let Some(t) = self.protocol.as_mut() else {
            return Err(PipeError::Framing {
                reason: "upstream_error",
                message: "this stream cannot be continued".into(),
            });
        };
        t.resume(upstream, splice);
        self.decoder = decoder;
        self.unframer = Unframer::for_route(route, self.max_event_bytes);
        self.normalizer = SseNormalizer::new(self.max_event_bytes);
        self.route = route;
        self.upstream = upstream;
        self.finish_seen = false;
        Ok(())
    }

    /// Feeds a chunk (or the end of body, with `None`); complete events land in `self.out`.
    ///
    /// # Errors
    /// [`PipeError`] when the stream cannot go on; `out` may hold the events completed
    /// before the failure in the same chunk.
    pub(crate) fn feed(&mut self, chunk: Option<&[u8]>) -> Result<(), PipeError> {
        let r = self.push(chunk);
        let invalid = self.normalizer.take_invalid_utf8();
        if invalid > 0 {
            metrics()
                .sse_invalid_utf8_total
                .with_label_values(&[self.route.provider.id.as_str()])
                .inc_by(invalid);
        }
        r?;
        self.drain()?;
        if chunk.is_none() {
            self.end_of_body()?;
        }
        Ok(())
    }

    /// Decodes and frames the chunk.
    fn push(&mut self, chunk: Option<&[u8]>) -> Result<(), PipeError> {
        let route = self.route;
        let provider = &route.provider.id;
        let framing = |e: SseError| {
            match e {
            SseError::LineTooLong { limit_bytes } => PipeError::Framing {
                reason: "event_too_large",
                message: format!(
                    "provider `{provider}` sent an SSE event over {limit_bytes} bytes (server.max_event_bytes)"
                ),
            },
            SseError::Truncated { .. } => PipeError::Framing {
                reason: "upstream_truncated",
                message: format!("provider `{provider}` ended the stream in the middle of an event"),
            },
        }
        };
        let decoded: Option<&[u8]> = match (&mut self.decoder, chunk) {
            (None, c) => c,
            (Some(d), c) => Some(
                d.decode(c.unwrap_or_default(), c.is_none(), self.max_decoded)
                    .map_err(|e| PipeError::Framing {
                        reason: "upstream_encoding",
                        message: format!("provider `{provider}`: {e}"),
                    })?,
            ),
        };
        let unframed = |e: providers::framing::FramingError| PipeError::Framing {
            reason: e.reason,
            message: format!("provider `{provider}` sent a broken stream: {}", e.detail),
        };
        if let Some(bytes) = decoded {
            match self.unframer.as_mut() {
                Some(u) => {
                    let r = u.push(bytes);
                    // The events before a bad message still go to the normalizer.
                    self.normalizer.push(u.output()).map_err(framing)?;
                    r.map_err(unframed)?;
                }
                None => self.normalizer.push(bytes).map_err(framing)?,
            }
        }
        if chunk.is_none() {
            if let Some(u) = &self.unframer {
                u.finish().map_err(unframed)?;
            }
            self.normalizer.finish().map_err(framing)?;
        }
        Ok(())
    }

    /// Moves the complete events into `out`.
    #[expect(
        clippy::too_many_lines,
        reason = "the per-event hot path stays one loop: no call per event that the compiler may not inline"
    )]
    fn drain(&mut self) -> Result<(), PipeError> {
        while let Some(ev) = self.normalizer.next_event() {
            let Some(data) = ev.data() else {
                // Comments and field-only events pass through (same-dialect path only); a
                // translated stream relays them as the client's keepalive.
                if self.protocol.is_none() {
                    self.out.extend_from_slice(ev.raw());
                } else {
                    self.keepalive_seen = true;
                }
                continue;
            };
            if let Some(t) = self.protocol.as_mut() {
                if self.upstream_keepalive.is_some() && ev.event_name() == self.upstream_keepalive {
                    // Keepalive chatter (Anthropic `ping`): no output of its own; the pump
                    // relays it in the client's dialect.
                    self.keepalive_seen = true;
                    continue;
                }
                let before = self.out.len();
                let content_before = t.content_events();
                match t.on_event(ev.event_name(), &data, &mut self.out) {
                    Ok(()) => {}
                    Err(ProtocolError::Upstream { kind, message }) => {
                        return Err(PipeError::Upstream {
                            kind,
                            error_type: kind.openai_type().to_string(),
                            message,
                        })
                    }
                    // One event whose data is not JSON at all cannot be translated: it is
                    // skipped and counted, and the stream goes on.
                    Err(ProtocolError::InvalidUpstream(_)) if !protocol::is_json(&data) => {
                        self.malformed += 1;
                        count_malformed(self.route, self.malformed);
                        continue;
                    }
                    // A continuation that restarted the answer and diverged: no splice
                    // is right (`protocol::seam`).
                    Err(_) if t.seam_refused() => {
                        return Err(PipeError::Framing {
                            reason: "continuation_seam",
                            message: format!(
                                "provider `{}`: {}",
                                self.route.provider.id,
                                protocol::continuation::SEAM_REFUSED
                            ),
                        })
                    }
                    Err(e) => {
                        return Err(PipeError::Framing {
                            reason: "upstream_error",
                            message: format!(
                                "provider `{}` sent an unreadable stream: {e}",
                                self.route.provider.id
                            ),
                        })
                    }
                }
                if self.out.len() > before {
                    self.data_events += 1;
                }
                let content = t.content_events() - content_before;
                if content > 0 {
                    self.content_events += content;
                    self.first_content = true;
                    metering::stream_text(self.upstream, &data, false, |s| {
                        self.estimator.push_json(s);
                    });
                }
                let u = t.usage();
                if u != protocol::Usage::default() {
                    self.usage = Some(u);
                }
                continue;
            }
            let Some(fast) = self.fast.as_ref() else {
                continue; // unreachable: no translator means the fast path
            };
            let path = fast.path;
            if self.done {
                continue; // nothing after the terminator is for the client
            }
            let name = ev.event_name();
            if path.is_terminal(name, ev.is_done()) {
                // A terminal event may carry the final usage and name the model (Responses'
                // `response.completed`); `[DONE]` and `message_stop` pass unchanged.
                let mut u = self.usage.unwrap_or_default();
                if protocol::merge_chunk_usage(self.upstream, &data, &mut u) {
                    self.usage = Some(u);
                }
                if path.is_finish(name, &data) {
                    self.finish_seen = true;
                }
                fast.rewriter
                    .rewrite_event(&ev, &mut self.echo, &mut self.out);
                self.done = true;
                continue;
            }
            if path.is_keepalive(name) {
                // Keepalive chatter, not the answer: it never commits the response (a ping
                // before `message_start` followed by a failure must still fall back), and
                // before the first data event it is dropped (the client's stream opens with
                // `message_start`; Sluice's own heartbeats keep a committed line alive).
                if self.data_events > 0 {
                    self.out.extend_from_slice(ev.raw());
                }
                continue;
            }
            if path.is_error(name, &data) {
                let e = (path.decode_error)(&data);
                return Err(PipeError::Upstream {
                    kind: e.kind,
                    error_type: e.error_type,
                    message: e.message,
                });
            }
            // Until an event has committed the answer, each is validated in full (a
            // malformed one must not commit it); after that the cheaper structural check
            // finds the usual ones (cut short, run together) without a validating parse per
            // event. Either way a malformed event is dropped and counted.
            let well_formed = if self.data_events == 0 {
                protocol::is_json(&data)
            } else {
                protocol::is_balanced_json(&data)
            };
            if !well_formed {
                // A malformed event is never forwarded (the client's SDK would fail on it
                // mid-stream): it is dropped, counted and logged; it does not commit the
                // answer and it does not end the stream (a stream that then ends without
                // its finish is `upstream_incomplete`, as any).
                self.malformed += 1;
                count_malformed(self.route, self.malformed);
                continue;
            }
            // Usage (all classes) from the upstream's own object; only a chunk with a usage
            // object is looked at twice (`"usage":null` chunks are skipped by one scan).
            let mut u = self.usage.unwrap_or_default();
            if protocol::merge_chunk_usage(self.upstream, &data, &mut u) {
                self.usage = Some(u);
                if self
                    .strip_usage
                    .is_some_and(|r| (r.usage_only_chunk)(&data))
                {
                    continue; // Sluice asked for it, the client did not
                }
            }
            self.data_events += 1;
            if (path.has_content)(&data) {
                self.content_events += 1;
                self.first_content = true;
                metering::stream_text(self.upstream, &data, false, |s| {
                    self.estimator.push_json(s);
                });
            }
            if !self.finish_seen && path.is_finish(name, &data) {
                self.finish_seen = true;
            }
            fast.rewriter
                .rewrite_event(&ev, &mut self.echo, &mut self.out);
            if let Some(r) = self.strip_usage {
                if self.out.ends_with(r.null_usage_end) {
                    // With `include_usage` every chunk ends `"usage":null` (OpenAI's
                    // format): removed, so the client gets the chunks it would have got
                    // without it.
                    let keep = self.out.len() - r.null_usage_end.len();
                    self.out.truncate(keep);
                    self.out.extend_from_slice(b"}\n\n");
                }
            }
        }
        Ok(())
    }

    /// The verdict at a clean end of the upstream body.
    fn end_of_body(&mut self) -> Result<(), PipeError> {
        if self.finished() {
            return Ok(());
        }
        if !self.stopped() {
            return Err(PipeError::Framing {
                reason: "upstream_incomplete",
                message: format!(
                    "provider `{}` ended the stream before the answer was finished",
                    self.route.provider.id
                ),
            });
        }
        // Complete, only the terminator is missing: add exactly one.
        match self.protocol.as_mut() {
            Some(t) => t.finish(&mut self.out).map_err(|e| PipeError::Framing {
                reason: "upstream_error",
                message: format!(
                    "provider `{}` sent an unreadable stream: {e}",
                    self.route.provider.id
                ),
            })?,
            None => {
                if let Some(fast) = &self.fast {
                    self.out.extend_from_slice(fast.path.terminator);
                }
                self.done = true;
            }
        }
        Ok(())
    }

    /// The in-stream error event that ends the client's stream, in its dialect (Chat
    /// Completions: OpenAI's `event: error` frame with `code` = `reason`).
    pub(crate) fn error_event(
        &mut self,
        kind: ErrorKind,
        error_type: &str,
        message: &str,
        reason: &str,
    ) -> Bytes {
        if self.client.wire().openai_error_frame {
            return sse::openai_error_event(message, error_type, reason);
        }
        let mut out = BytesMut::new();
        match self.protocol.as_mut() {
            Some(t) => t.error(kind, message, &mut out),
            // The events forwarded so far: a numbered stream (Responses) goes on counting.
            None => {
                protocol::error_event_at(self.client, kind, message, self.data_events, &mut out)
            }
        }
        out.freeze()
    }

    /// Whether the client-facing stream is complete (`[DONE]` forwarded or translated):
    /// nothing after it is for the client, so no heartbeat may follow it.
    pub(crate) fn finished(&self) -> bool {
        self.done
            || self
                .protocol
                .as_ref()
                .is_some_and(protocol::StreamTranslator::is_finished)
    }

    /// Whether the upstream said the answer is finished (a finish or stop reason), though its
    /// terminator may not have come yet: what can still follow is usage and the end, no
    /// more content, so there is nothing left to stop.
    pub(crate) fn stopped(&self) -> bool {
        self.finished()
            || match self.protocol.as_ref() {
                Some(t) => t.has_stop_reason(),
                None => self.finish_seen,
            }
    }

    /// The provider's final usage: the last reported, if the stream completed (a stream
    /// that broke off or was abandoned has not reported its final figures).
    pub(crate) fn final_usage(&self) -> Option<protocol::Usage> {
        self.usage.filter(|_| self.finished())
    }

    /// The output gathered so far, for one downstream write.
    pub(crate) fn take(&mut self) -> Bytes {
        let out = self.out.split().freeze();
        if self.capture_terminal && crate::conversation::capture::may_be_terminal(&out) {
            self.terminal = Some(out.clone());
        }
        out
    }

    /// Keeps the client-bound chunk that carries the terminal `response.completed` /
    /// `response.incomplete` event (a byte search per chunk; parsed once, after the end).
    pub(crate) fn capture_terminal(&mut self) {
        self.capture_terminal = true;
    }

    /// The chunk [`capture_terminal`](Self::capture_terminal) kept (a reference).
    pub(crate) fn terminal(&self) -> Option<Bytes> {
        self.terminal.clone()
    }
}

/// The content decoder of an answer in `coding` (`None`: identity).
fn content_decoder(route: &Route, coding: ContentCoding) -> Result<Option<Decoder>, PipeError> {
    match coding {
        ContentCoding::Identity => Ok(None),
        c => Decoder::new(c).map(Some).map_err(|e| PipeError::Framing {
            reason: "upstream_encoding",
            message: format!("provider `{}`: {e}", route.provider.id),
        }),
    }
}

/// Counts one data event of `route`'s provider that is not JSON and was dropped
/// (`sluice_sse_malformed_events_total`); the stream's first one (`nth` 1) is logged, the
/// rest only counted (a provider that sends many would flood the log).
#[cold]
fn count_malformed(route: &Route, nth: u64) {
    metrics()
        .sse_malformed_events_total
        .with_label_values(&[route.provider.id.as_str()])
        .inc();
    if nth == 1 {
        log::warn!(target: "sluice::proxy::pipe",
            "dropped an upstream stream event that is not JSON provider={} upstream_model={} \
             (later ones of this stream are only counted in sluice_sse_malformed_events_total)",
            route.provider.id, route.upstream_model
        );
    }
}
