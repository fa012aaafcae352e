//! Writing a streamed answer: each provider's event sequence (text, reasoning, tool calls,
//! usage, the finish), in its own wire framing (SSE, Bedrock's event stream), with the
//! behaviour knobs that split, delay, break or corrupt it.

use super::*;

/// One logical SSE event.
struct Ev {
    name: Option<&'static str>,
    data: String,
    /// A content token event.
    token: bool,
    /// Part of the prelude (before any content); stall/drop/error checks skip these.
    prelude: bool,
    /// The first finish event: stall/drop/error checks run before it too.
    first_finish: bool,
    /// The stream's terminator (`[DONE]`, `message_stop`), left out by `no_done`.
    terminator: bool,
}

impl Ev {
    fn new(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            name,
            data,
            token: false,
            prelude: false,
            first_finish: false,
            terminator: false,
        }
    }

    fn prelude(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            prelude: true,
            ..Ev::new(name, data)
        }
    }

    fn token(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            token: true,
            ..Ev::new(name, data)
        }
    }
}

/// The content events of an answer with reasoning or tool calls, appended to `queue` in
/// the provider's order: reasoning, text, tool calls. Returns the index of the last
/// Anthropic content block, whose `content_block_stop` is left to [`finish_events`].
fn structured_events(
    m: &ReplyMeta,
    text: &[String],
    oa_name: Option<&'static str>,
    tool_first: bool,
    queue: &mut VecDeque<Ev>,
) -> usize {
    let x = &m.extras;
    if m.provider == Provider::Gemini {
        for w in &x.reasoning {
            queue.push_back(Ev::token(None, cloud::gemini_text_chunk(m, w, true)));
        }
        for t in text {
            queue.push_back(Ev::token(None, cloud::gemini_text_chunk(m, t, false)));
        }
        for (i, call) in x.tool_calls.iter().enumerate() {
            queue.push_back(Ev::token(None, cloud::gemini_call_chunk(m, i, call)));
        }
        return 0;
    }
    if m.provider == Provider::OpenAi {
        for w in &x.reasoning {
            queue.push_back(Ev::token(oa_name, wire::openai_reasoning_chunk(m, w)));
        }
        for t in text {
            queue.push_back(Ev::token(oa_name, wire::openai_token_chunk(m, t)));
        }
        for (i, call) in x.tool_calls.iter().enumerate() {
            let start = wire::openai_tool_start_chunk(m, i, call, tool_first && i == 0);
            queue.push_back(Ev::token(oa_name, start));
            for f in call.fragments() {
                let data = wire::openai_tool_arguments_chunk(m, i, f);
                queue.push_back(Ev::token(oa_name, data));
            }
        }
        return 0;
    }
    let delta = Some("content_block_delta");
    let mut blocks = Blocks::default();
    if !x.reasoning.is_empty() {
        let i = blocks.open(queue, false, wire::anthropic_thinking_start);
        for w in &x.reasoning {
            queue.push_back(Ev::token(delta, wire::anthropic_thinking_delta(i, w)));
        }
        queue.push_back(Ev::new(
            delta,
            wire::anthropic_signature_delta(i, &x.signature),
        ));
    }
    if !text.is_empty() {
        let i = blocks.open(queue, false, wire::anthropic_text_start);
        for t in text {
            queue.push_back(Ev::token(delta, wire::anthropic_text_delta(i, t)));
        }
    }
    for call in &x.tool_calls {
        let i = blocks.open(queue, true, |i| wire::anthropic_tool_start(i, call));
        // Anthropic starts a tool_use block's input with an empty fragment.
        queue.push_back(Ev::new(delta, wire::anthropic_json_delta(i, "")));
        for f in call.fragments() {
            queue.push_back(Ev::token(delta, wire::anthropic_json_delta(i, f)));
        }
    }
    blocks.open.unwrap_or(0)
}

/// Anthropic content block numbering while the content events are built.
#[derive(Default)]
struct Blocks {
    next: usize,
    open: Option<usize>,
}

impl Blocks {
    /// Stops the open block, starts the next one (`start` makes its `content_block_start`
    /// data from its index) and returns its index; a `ping` follows the first start, as
    /// Anthropic sends it.
    /// A `tool_use` start counts as a content token (`token`), as OpenAI's tool-call start.
    fn open(
        &mut self,
        queue: &mut VecDeque<Ev>,
        token: bool,
        start: impl FnOnce(usize) -> String,
    ) -> usize {
        if let Some(i) = self.open {
            queue.push_back(Ev::new(
                Some("content_block_stop"),
                wire::anthropic_block_stop(i),
            ));
        }
        let i = self.next;
        self.next += 1;
        queue.push_back(Ev {
            token,
            ..Ev::new(Some("content_block_start"), start(i))
        });
        if i == 0 {
            queue.push_back(Ev::prelude(Some("ping"), wire::ANTHROPIC_PING.to_string()));
        }
        self.open = Some(i);
        i
    }
}

/// The events that end a stream after `sent` content tokens: OpenAI the finish chunk,
/// the usage chunk (when asked for) and `[DONE]`; Anthropic the `content_block_stop` of
/// block `last_block`, `message_delta` and `message_stop`.
fn finish_events(
    m: &ReplyMeta,
    openai: bool,
    oa_name: Option<&'static str>,
    sent: u64,
    last_block: usize,
) -> VecDeque<Ev> {
    let mut evs = VecDeque::new();
    if m.provider == Provider::Gemini {
        // The last chunk carries the finish reason and the final usage; no terminator.
        evs.push_back(Ev {
            first_finish: true,
            ..Ev::new(None, cloud::gemini_finish_chunk(m, sent))
        });
        return evs;
    }
    if openai {
        evs.push_back(Ev::new(oa_name, wire::openai_finish_chunk(m)));
        if m.usage_chunk {
            evs.push_back(Ev::new(oa_name, wire::openai_usage_chunk(m, sent)));
        }
        evs.push_back(Ev::new(oa_name, "[DONE]".to_string()));
    } else {
        evs.push_back(Ev::new(
            Some("content_block_stop"),
            wire::anthropic_block_stop(last_block),
        ));
        evs.push_back(Ev::new(
            Some("message_delta"),
            wire::anthropic_message_delta(m, sent),
        ));
        evs.push_back(Ev::new(
            Some("message_stop"),
            wire::ANTHROPIC_MESSAGE_STOP.to_string(),
        ));
    }
    if let Some(first) = evs.front_mut() {
        first.first_finish = true;
    }
    if let Some(last) = evs.back_mut() {
        last.terminator = true;
    }
    evs
}

/// How stream bytes go on the wire: write splitting, invalid UTF-8 injection, a coding.
struct Wire {
    split: Split,
    invalid_utf8: bool,
    encoder: Option<BodyEncoder>,
    /// [`Split::Burst`]: bytes held for the next [`Wire::flush`].
    pending: Vec<u8>,
}

impl Wire {
    /// Writes one event's (or any) bytes.
    async fn write(&mut self, out: &mut Out<'_>, bytes: &[u8]) -> io::Result<()> {
        let injected;
        let mut bytes = bytes;
        if self.invalid_utf8 {
            injected = wire::inject_invalid_utf8(bytes);
            bytes = &injected;
        }
        let coded;
        if let Some(enc) = self.encoder.as_mut() {
            coded = enc.encode(bytes)?;
            bytes = &coded;
        }
        if self.split == Split::Burst {
            self.pending.extend_from_slice(bytes);
            return Ok(());
        }
        for piece in wire::split_pieces(bytes, self.split) {
            out.piece(piece).await?;
        }
        Ok(())
    }

    /// Writes what a burst holds, in one piece (before a pause, an abort or the end).
    async fn flush(&mut self, out: &mut Out<'_>) -> io::Result<()> {
        if !self.pending.is_empty() {
            out.piece(&self.pending).await?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Waits `ms`; with `ping_every` set, writes (and flushes) `ping` every that many ms in
    /// between: keepalive chatter during a pause, none at its end.
    async fn pause(
        &mut self,
        out: &mut Out<'_>,
        ms: u64,
        ping_every: Option<u64>,
        ping: &[u8],
    ) -> io::Result<()> {
        match ping_every {
            Some(every) if ms > 0 => {
                let every = every.max(1);
                let mut left = ms;
                while left > 0 {
                    let step = left.min(every);
                    sleep_ms(step).await;
                    left -= step;
                    if left > 0 {
                        self.write(out, ping).await?;
                        self.flush(out).await?;
                    }
                }
            }
            _ if ms > 0 => sleep_ms(ms).await,
            _ => {}
        }
        Ok(())
    }

    /// Ends the coded stream (its last bytes) and the body.
    async fn finish(&mut self, out: &mut Out<'_>) -> io::Result<()> {
        self.flush(out).await?;
        if let Some(enc) = self.encoder.take() {
            let tail = enc.finish()?;
            out.piece(&tail).await?;
        }
        out.finish().await
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "each provider's stream wire format, event by event, in one place"
)]
pub(super) async fn stream(plan: &Plan, out: &mut Out<'_>, close: bool) -> io::Result<After> {
    let b = &plan.behavior;
    let m = &plan.meta;
    let abort = After::Abort {
        reset: Behavior::flag(b.reset),
    };
    let gemini = m.provider == Provider::Gemini;
    let style = SseStyle {
        // Google ends its SSE lines with CRLF.
        eol: if Behavior::flag(b.crlf) || (gemini && b.lone_cr.is_none() && b.crlf.is_none()) {
            "\r\n"
        } else if Behavior::flag(b.lone_cr) {
            "\r"
        } else {
            "\n"
        },
        no_space: Behavior::flag(b.no_space),
        multi_line: Behavior::flag(b.multi_line_data),
    };
    let openai = m.provider == Provider::OpenAi;
    let oa_name = if Behavior::flag(b.event_names) {
        Some("chunk")
    } else {
        None
    };

    let mut h = base_headers(plan, "text/event-stream");
    let mut wire = Wire {
        split: b.split_mode(),
        invalid_utf8: Behavior::flag(b.invalid_utf8),
        encoder: None,
        pending: Vec::new(),
    };
    if let Some(name) = &b.content_encoding {
        let (enc, header) = BodyEncoder::for_name(name);
        wire.encoder = enc;
        h.push(("Content-Encoding".into(), header));
    }
    // A keepalive with no content: Anthropic's `ping` event, an SSE comment for OpenAI.
    let aws = m.bedrock;
    // One event on the wire: SSE, or a Bedrock event-stream `chunk` message.
    let encode = |name: Option<&str>, data: &str| -> Vec<u8> {
        if m.converse {
            converse::stream_messages(m, name, data)
        } else if aws {
            bedrock_chunk(m, name, data)
        } else {
            wire::encode_event(name, data, style)
        }
    };
    let ping = if m.converse {
        // ConverseStream has no keepalive event.
        Vec::new()
    } else if aws {
        bedrock::chunk_message(wire::ANTHROPIC_PING)
    } else if openai || gemini {
        format!(": ping{}{}", style.eol, style.eol).into_bytes()
    } else {
        wire::encode_event(Some("ping"), wire::ANTHROPIC_PING, style)
    };
    out.head(200, &h, Framing::Chunked, close).await?;
    if let Some(ms) = b.first_event_delay_ms {
        // Keepalives also while the model has not started: a ping before `message_start`.
        wire.pause(out, ms, b.ping_interval_ms, &ping).await?;
    }
    if Behavior::flag(b.close_before_first_event) {
        return Ok(abort);
    }
    if aws && b.error_after_tokens == Some(0) {
        // Bedrock reports a failure before the model starts (throttling, say) as the
        // stream's first message: no `message_start` before it.
        let status = b.status.filter(|s| *s >= 400).unwrap_or(500);
        let name = b
            .error_type
            .clone()
            .unwrap_or_else(|| bedrock::exception_type_for(status).to_string());
        let msg = b
            .error_message
            .clone()
            .unwrap_or_else(|| bedrock::default_message(status));
        wire.write(out, &bedrock::exception_message(&name, &msg))
            .await?;
        wire.finish(out).await?;
        return Ok(After::Keep);
    }
    if Behavior::flag(b.bom) && !aws {
        wire.write(out, "\u{FEFF}".as_bytes()).await?;
    }

    // Responses: every event is built ahead (sequence numbers, item ids), so its answers
    // take the structured path; its final snapshot is the finish.
    let structured = !m.extras.is_empty() || m.responses;
    let text_tokens: &[String] = match &plan.tokens {
        Tokens::List(t) => t,
        Tokens::Bulk { .. } => &[],
    };
    // The events before the text tokens (and, for answers with reasoning or tool calls,
    // all content events); the text tokens of plain answers are generated lazily.
    let mut queue: VecDeque<Ev> = VecDeque::new();
    let tool_first = structured && m.extras.reasoning.is_empty() && text_tokens.is_empty();
    let mut responses_finish: Option<VecDeque<Ev>> = None;
    if m.azure && !m.responses {
        queue.push_back(Ev::prelude(oa_name, cloud::azure_prompt_filter_chunk()));
    }
    if m.responses {
        let mut evs = super::super::responses::events(m, text_tokens);
        let last = evs.pop().map(|(name, data, _)| Ev {
            first_finish: true,
            terminator: true,
            ..Ev::new(Some(name), data)
        });
        responses_finish = Some(last.into_iter().collect());
        for (name, data, role) in evs {
            queue.push_back(match role {
                super::super::responses::Role::Prelude => Ev::prelude(Some(name), data),
                super::super::responses::Role::Token => Ev::token(Some(name), data),
                super::super::responses::Role::Other => Ev::new(Some(name), data),
            });
        }
    } else if gemini {
        // No prelude: the first chunk carries content.
    } else if openai {
        // An answer that starts with a tool call names the role in the tool call's chunk.
        if !tool_first {
            queue.push_back(Ev::prelude(oa_name, wire::openai_role_chunk(m)));
        }
    } else {
        queue.push_back(Ev::prelude(
            Some("message_start"),
            wire::anthropic_message_start(m),
        ));
        if !structured {
            queue.push_back(Ev::prelude(
                Some("content_block_start"),
                wire::anthropic_text_start(0),
            ));
            queue.push_back(Ev::prelude(Some("ping"), wire::ANTHROPIC_PING.to_string()));
        }
    }
    // The index of the last Anthropic content block: its `content_block_stop` is the
    // first finish event (as for a plain answer).
    let mut last_block = 0usize;
    if structured && !m.responses {
        last_block = structured_events(m, text_tokens, oa_name, tool_first, &mut queue);
    }

    // The `drift` knob: for the wire formats the gateway passes through (not Converse or
    // Gemini, which it always translates).
    let drift = b.drift.as_ref().filter(|_| !m.converse && !gemini);
    let mut drift_events_sent = false;
    let mut sent: u64 = 0;
    let mut malformed_sent = false;
    let mut finish: Option<VecDeque<Ev>> = responses_finish;
    // Events written so far (a Responses failure event's `sequence_number`).
    let mut written: u64 = 0;
    loop {
        // Next event.
        let next = match queue.pop_front() {
            Some(ev) => Some(ev),
            None if finish.is_none() && !structured => {
                let next_token: Option<String> = match &plan.tokens {
                    Tokens::List(t) => t.get(sent as usize).cloned(),
                    Tokens::Bulk { total, chunk } => {
                        if out.body_written() < *total {
                            Some(chunk.clone())
                        } else {
                            None
                        }
                    }
                };
                next_token.map(|tok| {
                    if gemini {
                        Ev::token(None, cloud::gemini_text_chunk(m, &tok, false))
                    } else if openai {
                        Ev::token(oa_name, wire::openai_token_chunk(m, &tok))
                    } else {
                        Ev::token(
                            Some("content_block_delta"),
                            wire::anthropic_text_delta(0, &tok),
                        )
                    }
                })
            }
            None => None,
        };
        let ev = match next {
            Some(ev) => ev,
            None => {
                if Behavior::flag(b.no_finish) {
                    break;
                }
                let fin = finish
                    .get_or_insert_with(|| finish_events(m, openai, oa_name, sent, last_block));
                match fin.pop_front() {
                    Some(ev) if ev.terminator && Behavior::flag(b.no_done) => break,
                    Some(ev) => ev,
                    None => break,
                }
            }
        };

        if !ev.prelude && (ev.token || ev.first_finish) {
            if b.stall_after_tokens == Some(sent) {
                wire.flush(out).await?;
                sleep_ms(b.stall_max()).await;
                return Ok(After::Close);
            }
            if b.drop_after_tokens == Some(sent) {
                wire.flush(out).await?;
                return Ok(abort);
            }
            if b.error_after_tokens == Some(sent) {
                let status = b.status.filter(|s| *s >= 400).unwrap_or(500);
                let msg = b
                    .error_message
                    .clone()
                    .unwrap_or_else(|| wire::default_error_message(m.provider, status));
                if aws {
                    // An in-stream exception message ends a Bedrock stream.
                    let name = b
                        .error_type
                        .clone()
                        .unwrap_or_else(|| bedrock::exception_type_for(status).to_string());
                    let msg = b
                        .error_message
                        .clone()
                        .unwrap_or_else(|| bedrock::default_message(status));
                    wire.write(out, &bedrock::exception_message(&name, &msg))
                        .await?;
                    wire.finish(out).await?;
                    return Ok(After::Keep);
                }
                let data = if m.responses {
                    super::super::responses::failed_event(
                        m,
                        written,
                        status,
                        b.error_type.as_deref(),
                        &msg,
                    )
                } else if gemini {
                    cloud::gemini_error_chunk(status, &msg, b.error_type.as_deref())
                } else {
                    wire::error_body_typed(m.provider, status, &msg, b.error_type.as_deref())
                };
                let name = if m.responses {
                    Some("response.failed")
                } else if gemini {
                    None
                } else if openai {
                    oa_name
                } else {
                    Some("error")
                };
                if Behavior::flag(b.comments) {
                    wire.write(out, &wire::encode_comment(style)).await?;
                }
                wire.write(out, &wire::encode_event(name, &data, style))
                    .await?;
                wire.finish(out).await?;
                return Ok(After::Keep);
            }
            if b.malformed_event_after_tokens == Some(sent) && !malformed_sent {
                malformed_sent = true;
                let name = if openai {
                    oa_name
                } else {
                    Some("content_block_delta")
                };
                wire.write(out, &wire::encode_event(name, MALFORMED_EVENT_DATA, style))
                    .await?;
            }
            if b.truncate_after_tokens == Some(sent) {
                let bytes = encode(ev.name, &ev.data);
                wire.write(out, &bytes[..bytes.len() / 2]).await?;
                wire.finish(out).await?;
                return Ok(After::Keep);
            }
        }
        if ev.token {
            let d = b.token_delay();
            if d > 0 {
                wire.flush(out).await?;
            }
            wire.pause(out, d, b.ping_interval_ms, &ping).await?;
        }
        if Behavior::flag(b.comments) && !aws {
            wire.write(out, &wire::encode_comment(style)).await?;
        }
        if let Some(d) = drift {
            if !ev.prelude && !drift_events_sent {
                drift_events_sent = true;
                for e in &d.events {
                    wire.write(out, &encode(e.event.as_deref(), &e.data.to_string()))
                        .await?;
                }
            }
            wire.write(out, &encode(ev.name, &d.apply(&ev.data)))
                .await?;
        } else {
            wire.write(out, &encode(ev.name, &ev.data)).await?;
        }
        // The `choices` knob: the same chunk for every other choice index.
        if openai && !m.responses {
            for i in 1..b.choices.unwrap_or(1) {
                if let Some(other) = wire::other_choice(&ev.data, i) {
                    wire.write(out, &encode(ev.name, &other)).await?;
                }
            }
        }
        if ev.token {
            sent += 1;
        }
        written += 1;
    }
    wire.finish(out).await?;
    Ok(After::Keep)
}

/// A Bedrock `chunk` message for one Anthropic event; `message_stop` carries Bedrock's
/// `amazon-bedrock-invocationMetrics` (token counts and latencies, ms) as the real service's
/// does.
fn bedrock_chunk(m: &ReplyMeta, name: Option<&str>, data: &str) -> Vec<u8> {
    if name == Some("message_stop") {
        let with_metrics = format!(
            r#"{{"type":"message_stop","amazon-bedrock-invocationMetrics":{{"inputTokenCount":{},"outputTokenCount":{},"invocationLatency":120,"firstByteLatency":35}}}}"#,
            m.prompt_tokens,
            m.extras.tokens()
        );
        // Members the event carries besides its type (the `drift` knob) are kept.
        let merged = match serde_json::from_str::<serde_json::Value>(data) {
            Ok(serde_json::Value::Object(mut o)) if o.len() > 1 => {
                if let Ok(serde_json::Value::Object(metrics)) =
                    serde_json::from_str::<serde_json::Value>(&with_metrics)
                {
                    o.extend(metrics);
                }
                serde_json::Value::Object(o).to_string()
            }
            _ => with_metrics,
        };
        return bedrock::chunk_message(&merged);
    }
    bedrock::chunk_message(data)
}
