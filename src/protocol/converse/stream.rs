//! ConverseStream (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html>):
//! the event-stream messages arrive here as SSE events named by their `:event-type`
//! ([`crate::providers::bedrock::eventstream`]), each data the event's JSON:
//!
//! * `messageStart {role}`;
//! * `contentBlockStart {start: {toolUse: {toolUseId, name}}, contentBlockIndex}` (tool
//!   blocks only: a text block starts with its first delta);
//! * `contentBlockDelta {delta: {text} | {toolUse: {input}} | {reasoningContent: {text} |
//!   {signature} | {redactedContent}}, contentBlockIndex}` (`input` is a fragment of the
//!   arguments' JSON text);
//! * `contentBlockStop {contentBlockIndex}`;
//! * `messageStop {stopReason}`;
//! * `metadata {usage, metrics: {latencyMs}}`, the stream's last event;
//! * an exception (`throttlingException`, `modelStreamErrorException`, ...) as an Anthropic
//!   `event: error` (what the framing decoder writes for every Bedrock stream).

use std::borrow::Cow;

use serde::Deserialize;

use super::super::json::decode_error_body;
use super::super::{ProtocolError, StreamEvent, UpstreamDialect};
use super::{answer_id, stop_from_wire, UsageIn};

/// Upstream ConverseStream events → canonical events.
///
/// Emits [`StreamEvent::Start`] on `messageStart` (a Sluice id, no model), text, reasoning
/// and signature deltas, a tool block as [`StreamEvent::ToolCallStart`] plus its
/// [`StreamEvent::ToolArgumentsDelta`]s, [`StreamEvent::Stop`] on `messageStop`, and
/// [`StreamEvent::Usage`] then [`StreamEvent::End`] on `metadata`.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    done: bool,
    /// `(contentBlockIndex, tool-call index)` of the tool blocks seen.
    tool_blocks: Vec<(u64, u32)>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct EventIn<'a> {
    #[serde(default)]
    content_block_index: Option<u64>,
    #[serde(borrow, default)]
    start: Option<StartIn<'a>>,
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StartIn<'a> {
    #[serde(borrow, default)]
    tool_use: Option<ToolStartIn<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ToolStartIn<'a> {
    #[serde(borrow, default)]
    tool_use_id: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_use: Option<ToolDeltaIn<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<ReasoningDeltaIn<'a>>,
}

#[derive(Deserialize, Default)]
struct ToolDeltaIn<'a> {
    #[serde(borrow, default)]
    input: Cow<'a, str>,
}

#[derive(Deserialize, Default)]
struct ReasoningDeltaIn<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
}

impl StreamDecoder {
    /// A decoder for one stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one upstream event (`event` = its `:event-type`, `data` = its JSON),
    /// calling `emit` for each canonical event.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidUpstream`] for unparseable data,
    /// [`ProtocolError::Upstream`] for an `error` event, or whatever `emit` returns.
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
        if self.done || data.is_empty() {
            return Ok(());
        }
        if event == Some("error") {
            let (kind, message) = decode_error_body(UpstreamDialect::Messages, 502, data);
            return Err(ProtocolError::Upstream { kind, message });
        }
        let ev: EventIn<'_> = serde_json::from_slice(data)
            .map_err(|e| ProtocolError::InvalidUpstream(format!("ConverseStream event: {e}")))?;
        if !self.started && event != Some("metadata") {
            self.started = true;
            emit(&StreamEvent::Start {
                id: Cow::Owned(answer_id()),
                model: Cow::Borrowed(""),
                usage: Default::default(),
            })?;
        }
        match event.unwrap_or("") {
            "contentBlockStart" => {
                let Some(t) = ev.start.and_then(|s| s.tool_use) else {
                    return Ok(());
                };
                let index = self.tool_blocks.len() as u32;
                self.tool_blocks
                    .push((ev.content_block_index.unwrap_or(0), index));
                emit(&StreamEvent::ToolCallStart {
                    index,
                    id: t.tool_use_id,
                    name: t.name,
                })
            }
            "contentBlockDelta" => {
                let Some(d) = ev.delta else {
                    return Ok(());
                };
                if let Some(t) = d.text.filter(|t| !t.is_empty()) {
                    return emit(&StreamEvent::TextDelta(t));
                }
                if let Some(t) = d.tool_use {
                    let block = ev.content_block_index.unwrap_or(0);
                    let Some(&(_, index)) = self.tool_blocks.iter().find(|(b, _)| *b == block)
                    else {
                        return Err(ProtocolError::InvalidUpstream(format!(
                            "ConverseStream toolUse delta for block {block}, which did not start as a tool"
                        )));
                    };
                    if t.input.is_empty() {
                        return Ok(());
                    }
                    return emit(&StreamEvent::ToolArgumentsDelta {
                        index,
                        fragment: t.input,
                    });
                }
                if let Some(r) = d.reasoning_content {
                    if let Some(t) = r.text.filter(|t| !t.is_empty()) {
                        emit(&StreamEvent::ReasoningDelta(t))?;
                    }
                    if let Some(s) = r.signature.filter(|s| !s.is_empty()) {
                        emit(&StreamEvent::ReasoningSignature(s))?;
                    }
                }
                Ok(())
            }
            "messageStop" => emit(&StreamEvent::Stop {
                reason: stop_from_wire(ev.stop_reason.as_deref().unwrap_or("end_turn")),
                stop_sequence: None,
            }),
            "metadata" => {
                self.done = true;
                if let Some(u) = ev.usage {
                    emit(&StreamEvent::Usage(u.canonical()))?;
                }
                emit(&StreamEvent::End)
            }
            // messageStart (handled above), contentBlockStop, events Bedrock may add later.
            _ => Ok(()),
        }
    }
}
