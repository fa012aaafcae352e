//! Owns the canonical side of mid-stream continuation (`models.<id>.continue_on_break`):
//! what a stream wrote so far ([`Transcript`]), the request that asks the next route to go
//! on from there ([`continuation_request`]), and the splice that makes the continuation's
//! events part of the first stream ([`Splice`]).
//!
//! Everything here works on canonical [`StreamEvent`]s, so it is the same for every pair of
//! upstream and client dialects: the client's encoder ([`super::StreamTranslator`]) keeps
//! running across both attempts, so the message/response id, the content block indices and
//! the sequence numbers simply continue, and no second `message_start` /
//! `response.created` / role chunk is written.
//!
//! How the next route is asked (current Claude models reject assistant prefill):
//!
//! * [`ContinueStyle::UserTurn`] (default): the original messages, an assistant message with
//!   the text so far, and a user message [`CONTINUE_INSTRUCTION`];
//! * [`ContinueStyle::Prefill`] (`routes[].supports_prefill: true`): the original messages and
//!   a trailing assistant message with the text so far (trailing whitespace removed, which
//!   Anthropic's API requires), which the model continues.
//!
//! Either way, the continuation's text joins the text so far through a [`Seam`]
//! ([`super::seam`]): a restart or repeat of what the client has is dropped, a space is
//! added after a sentence's end, leading whitespace after whitespace is dropped, and a
//! restart that diverges ends the stream with an error event instead of doubled text.

use std::borrow::Cow;

use super::seam::{Seam, SeamOutcome, SeamText};
use super::{Message, Part, ProtocolError, Request, Role, StreamEvent, Usage};

/// The user message that asks for the rest of a reply that was cut off
/// ([`ContinueStyle::UserTurn`]).
pub const CONTINUE_INSTRUCTION: &str = "Your previous reply was cut off. Continue it exactly \
where it stopped: output only the remaining text, starting with the very next character, \
without repeating anything already written and without any preamble or comment.";

/// How a continuation request carries the text so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinueStyle {
    /// A trailing assistant message the model continues (assistant prefill).
    Prefill,
    /// An assistant message with the text so far, then a user message asking to continue.
    UserTurn,
}

/// What a client stream carried so far, recorded for a continuation: the answer text (at
/// most `cap` bytes) and whether anything that cannot be continued began.
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    /// Answer text written to the client so far (complete only when not
    /// [`overflowed`](Self::overflowed)).
    text: String,
    /// Most bytes of text kept.
    cap: usize,
    /// More text than `cap` was written.
    overflowed: bool,
    /// A tool call began in the output.
    tool_call: bool,
    /// Generation stopped (a stop reason was written).
    stopped: bool,
}

impl Transcript {
    /// An empty transcript keeping at most `cap` bytes of text.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    /// Records one canonical event as it goes to the client's encoder.
    pub fn observe(&mut self, ev: &StreamEvent<'_>) {
        match ev {
            StreamEvent::TextDelta(t) if !self.overflowed => {
                if self.text.len() + t.len() > self.cap {
                    self.overflowed = true;
                    self.text = String::new();
                } else {
                    self.text.push_str(t);
                }
            }
            StreamEvent::ToolCallStart { .. } | StreamEvent::ToolArgumentsDelta { .. } => {
                self.tool_call = true;
            }
            StreamEvent::Stop { .. } => self.stopped = true,
            _ => {}
        }
    }

    /// The answer text so far (empty once [`overflowed`](Self::overflowed)).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether more text than the cap was written (the stream cannot be continued).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Whether a tool call began in the output (the stream cannot be continued).
    pub fn tool_call_began(&self) -> bool {
        self.tool_call
    }

    /// Whether the model had already said why it stopped (nothing is left to continue).
    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

/// The request that asks a route for the rest of an answer: `original` with the text so far
/// appended as `style` says, and the output limit reduced by `output_tokens_so_far` (at
/// least 1 token is left).
pub fn continuation_request(
    original: &Request,
    text_so_far: &str,
    output_tokens_so_far: u64,
    style: ContinueStyle,
) -> Request {
    let mut req = original.clone();
    req.stream = true;
    req.max_output_tokens = req
        .max_output_tokens
        .map(|m| m.saturating_sub(output_tokens_so_far).max(1));
    match style {
        ContinueStyle::Prefill => {
            req.messages.push(Message {
                role: Role::Assistant,
                parts: vec![Part::Text(text_so_far.trim_end().to_string())],
            });
        }
        ContinueStyle::UserTurn => {
            req.messages.push(Message {
                role: Role::Assistant,
                parts: vec![Part::Text(text_so_far.to_string())],
            });
            req.messages.push(Message {
                role: Role::User,
                parts: vec![Part::Text(CONTINUE_INSTRUCTION.to_string())],
            });
        }
    }
    req
}

/// The sum of two attempts' usage, class by class.
pub fn add_usage(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens + b.input_tokens,
        output_tokens: a.output_tokens + b.output_tokens,
        cache_read_tokens: a.cache_read_tokens + b.cache_read_tokens,
        cache_write_tokens: a.cache_write_tokens + b.cache_write_tokens,
        reasoning_tokens: a.reasoning_tokens + b.reasoning_tokens,
    }
}

/// The message of the error that ends a stream whose continuation restarted the answer and
/// diverged ([`SeamOutcome::Refused`]); [`Splice::refused`] tells it apart.
pub const SEAM_REFUSED: &str = "the continuation restarted the answer and diverged from the text \
already sent; the stream ends here rather than repeat text";

/// Maps a continuation's canonical events into the first stream's: its `Start` becomes a
/// usage update (the client's stream has started already), every usage figure is added to
/// the first attempt's (`base`), its reasoning is dropped (the client's answer went past
/// reasoning already), and its text goes through the [`Seam`] with the text so far (a
/// repeat dropped, a space added at a sentence's end, a diverging restart refused).
#[derive(Debug, Clone)]
pub struct Splice {
    /// The first attempt's usage.
    base: Usage,
    /// Where the continuation's text meets the text so far.
    seam: Seam,
}

impl Splice {
    /// A splice over the first attempt's `base` usage, after a stream whose text so far is
    /// `text_so_far`.
    pub fn new(base: Usage, text_so_far: &str) -> Self {
        Self {
            base,
            seam: Seam::new(text_so_far),
        }
    }

    /// How the seam was decided, once it was.
    pub fn seam_outcome(&self) -> Option<SeamOutcome> {
        self.seam.outcome()
    }

    /// Whether the seam refused the continuation (the error of [`Self::feed`] is then
    /// [`SEAM_REFUSED`]'s).
    pub fn refused(&self) -> bool {
        self.seam.outcome() == Some(SeamOutcome::Refused)
    }

    /// Gives the client's encoder (`emit`) the events for the continuation's `ev`, in order:
    /// none, one, or held text before a non-text event.
    ///
    /// # Errors
    /// `emit`'s; [`ProtocolError::InvalidUpstream`] with [`SEAM_REFUSED`] when the seam
    /// refused the continuation.
    pub fn feed(
        &mut self,
        ev: &StreamEvent<'_>,
        emit: &mut impl FnMut(&StreamEvent<'_>) -> Result<(), ProtocolError>,
    ) -> Result<(), ProtocolError> {
        let refused = |_| ProtocolError::InvalidUpstream(SEAM_REFUSED.to_string());
        match ev {
            StreamEvent::Start { usage, .. } | StreamEvent::Usage(usage) => {
                emit(&StreamEvent::Usage(add_usage(self.base, *usage)))
            }
            StreamEvent::ReasoningDelta(_) | StreamEvent::ReasoningSignature(_) => Ok(()),
            StreamEvent::TextDelta(t) => match self.seam.text(t).map_err(refused)? {
                SeamText::Pass => emit(ev),
                SeamText::Replace(r) if !r.is_empty() => {
                    emit(&StreamEvent::TextDelta(Cow::Owned(r)))
                }
                SeamText::Replace(_) | SeamText::Hold => Ok(()),
            },
            other => {
                if let SeamText::Replace(r) = self.seam.flush().map_err(refused)? {
                    if !r.is_empty() {
                        emit(&StreamEvent::TextDelta(Cow::Owned(r)))?;
                    }
                }
                emit(other)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::StopReason;

    #[test]
    fn transcript_keeps_text_until_the_cap_and_notes_tool_calls_and_stops() {
        let mut t = Transcript::new(8);
        t.observe(&StreamEvent::TextDelta("Hello ".into()));
        t.observe(&StreamEvent::ReasoningDelta("thinking".into()));
        assert_eq!(t.text(), "Hello ");
        assert!(!t.overflowed() && !t.tool_call_began() && !t.stopped());
        t.observe(&StreamEvent::TextDelta("world".into()));
        assert!(t.overflowed());
        assert_eq!(t.text(), "");
        t.observe(&StreamEvent::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: "f".into(),
        });
        t.observe(&StreamEvent::Stop {
            reason: StopReason::ToolUse,
            stop_sequence: None,
        });
        assert!(t.tool_call_began() && t.stopped());
    }

    #[test]
    fn continuation_requests_carry_the_text_as_prefill_or_as_a_user_turn() {
        let original = Request {
            messages: vec![Message {
                role: Role::User,
                parts: vec![Part::Text("hi".into())],
            }],
            max_output_tokens: Some(100),
            ..Request::default()
        };
        let r = continuation_request(&original, "Hello wor ", 30, ContinueStyle::Prefill);
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.messages[1].role, Role::Assistant);
        assert_eq!(r.messages[1].parts, vec![Part::Text("Hello wor".into())]);
        assert_eq!(r.max_output_tokens, Some(70));
        assert!(r.stream);
        let r = continuation_request(&original, "Hello wor ", 300, ContinueStyle::UserTurn);
        assert_eq!(r.messages.len(), 3);
        assert_eq!(r.messages[1].parts, vec![Part::Text("Hello wor ".into())]);
        assert_eq!(r.messages[2].role, Role::User);
        assert_eq!(
            r.messages[2].parts,
            vec![Part::Text(CONTINUE_INSTRUCTION.into())]
        );
        assert_eq!(r.max_output_tokens, Some(1));
    }

    /// The events `s` gives the encoder for `ev` (their debug form).
    fn fed(s: &mut Splice, ev: &StreamEvent<'_>) -> Result<Vec<String>, ProtocolError> {
        let mut out = Vec::new();
        s.feed(ev, &mut |e| {
            out.push(format!("{e:?}"));
            Ok(())
        })?;
        Ok(out)
    }

    fn dbg(evs: &[StreamEvent<'_>]) -> Vec<String> {
        evs.iter().map(|e| format!("{e:?}")).collect()
    }

    #[test]
    fn the_splice_sums_usage_drops_reasoning_and_trims_the_seam() {
        let base = Usage {
            input_tokens: 10,
            output_tokens: 3,
            ..Usage::default()
        };
        let mut s = Splice::new(base, "Hello ");
        let start = StreamEvent::Start {
            id: "x".into(),
            model: "m".into(),
            usage: Usage {
                input_tokens: 14,
                ..Usage::default()
            },
        };
        assert_eq!(
            fed(&mut s, &start).unwrap(),
            dbg(&[StreamEvent::Usage(Usage {
                input_tokens: 24,
                output_tokens: 3,
                ..Usage::default()
            })])
        );
        assert!(fed(&mut s, &StreamEvent::ReasoningDelta("r".into()))
            .unwrap()
            .is_empty());
        assert!(fed(&mut s, &StreamEvent::TextDelta(" ".into()))
            .unwrap()
            .is_empty());
        assert_eq!(
            fed(&mut s, &StreamEvent::TextDelta("  world ".into())).unwrap(),
            dbg(&[StreamEvent::TextDelta("world ".into())])
        );
        assert_eq!(
            fed(&mut s, &StreamEvent::TextDelta(" again".into())).unwrap(),
            dbg(&[StreamEvent::TextDelta(" again".into())])
        );
        assert_eq!(s.seam_outcome(), Some(SeamOutcome::Clean));
        // Held text goes out before the next event that is not text.
        let mut s = Splice::new(base, "Hello");
        assert!(fed(&mut s, &StreamEvent::TextDelta("Hel".into()))
            .unwrap()
            .is_empty());
        let stop = StreamEvent::Stop {
            reason: StopReason::EndTurn,
            stop_sequence: None,
        };
        assert_eq!(
            fed(&mut s, &stop).unwrap(),
            dbg(&[StreamEvent::TextDelta("Hel".into()), stop.clone()])
        );
        // A diverging restart is refused.
        let mut s = Splice::new(base, "The answer is forty-two, and that is final.");
        let e = fed(
            &mut s,
            &StreamEvent::TextDelta("The answer is forty-two, or maybe not.".into()),
        )
        .unwrap_err();
        assert!(s.refused(), "{e}");
    }
}
