//! Gemini streaming (`models/{model}:streamGenerateContent?alt=sse`,
//! <https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent>): every
//! SSE `data:` is one whole `GenerateContentResponse` holding the next parts of
//! `candidates[0].content`, the running `usageMetadata`, and on the last chunk the
//! `finishReason`. There is no terminator event: the body ends after the last chunk (the
//! stream pipe adds the client's terminator once a finish reason was seen). An error after
//! the head arrives as a `data: {"error": {...}}` chunk.

use std::borrow::Cow;

use super::super::{ProtocolError, StopReason, StreamEvent};
use super::{call_id, stop_from_wire, ResponseIn};

/// Upstream Gemini stream → canonical events.
///
/// Emits [`StreamEvent::Start`] on the first chunk (response id, model version, the prompt
/// usage), text and reasoning deltas per part, a tool call as
/// [`StreamEvent::ToolCallStart`] plus one [`StreamEvent::ToolArgumentsDelta`] with the
/// whole arguments (Gemini sends a call whole), [`StreamEvent::Usage`] for every
/// `usageMetadata` (cumulative) and [`StreamEvent::Stop`] on `finishReason` (or a
/// `promptFeedback.blockReason` without candidates).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Tool calls seen (their indexes; `STOP` after calls is a tool use).
    calls: u32,
}

impl StreamDecoder {
    /// A decoder for one stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one upstream SSE event's data, calling `emit` for each canonical event.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidUpstream`] for unparseable data,
    /// [`ProtocolError::Upstream`] for an `{"error":…}` chunk, or whatever `emit` returns.
    pub fn decode<F>(
        &mut self,
        _event: Option<&str>,
        data: &[u8],
        emit: &mut F,
    ) -> Result<(), ProtocolError>
    where
        F: FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    {
        let data = data.trim_ascii();
        if data.is_empty() {
            return Ok(());
        }
        let chunk: ResponseIn<'_> = serde_json::from_slice(data)
            .map_err(|e| ProtocolError::InvalidUpstream(format!("Gemini stream chunk: {e}")))?;
        if let Some(e) = &chunk.error {
            return Err(e.to_error(500));
        }
        let usage = chunk.usage_metadata.map(|u| u.canonical());
        if !self.started {
            self.started = true;
            emit(&StreamEvent::Start {
                id: Cow::Borrowed(chunk.response_id.as_deref().unwrap_or("")),
                model: Cow::Borrowed(chunk.model_version.as_deref().unwrap_or("")),
                usage: usage.unwrap_or_default(),
            })?;
        }
        let mut finish = None;
        if let Some(c) = chunk.candidates.first() {
            for p in c.content.iter().flat_map(|c| c.parts.iter()) {
                if let Some(f) = &p.function_call {
                    let index = self.calls;
                    self.calls += 1;
                    let id = match (f.id.as_deref(), p.thought_signature.as_deref()) {
                        (Some(id), None) => Cow::Borrowed(id),
                        (own, sig) => Cow::Owned(call_id(index, own, sig)),
                    };
                    emit(&StreamEvent::ToolCallStart {
                        index,
                        id,
                        name: Cow::Borrowed(&f.name),
                    })?;
                    emit(&StreamEvent::ToolArgumentsDelta {
                        index,
                        fragment: Cow::Owned(f.arguments()),
                    })?;
                } else if let Some(t) = p.text.as_deref().filter(|t| !t.is_empty()) {
                    emit(&if p.thought {
                        StreamEvent::ReasoningDelta(Cow::Borrowed(t))
                    } else {
                        StreamEvent::TextDelta(Cow::Borrowed(t))
                    })?;
                }
            }
            finish = c
                .finish_reason
                .as_deref()
                .map(|r| stop_from_wire(r, self.calls > 0));
        } else if chunk
            .prompt_feedback
            .as_ref()
            .is_some_and(|f| f.block_reason.is_some())
        {
            finish = Some(StopReason::ContentFilter);
        }
        if let Some(u) = usage {
            emit(&StreamEvent::Usage(u))?;
        }
        if let Some(reason) = finish {
            emit(&StreamEvent::Stop {
                reason,
                stop_sequence: None,
            })?;
        }
        Ok(())
    }
}
