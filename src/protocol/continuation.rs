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
//! Either way, when the text so far ends in whitespace, leading whitespace of the
//! continuation is dropped (no doubled space at the seam).

use std::borrow::Cow;

use super::{Message, Part, Request, Role, StreamEvent, Usage};

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

/// Maps a continuation's canonical events into the first stream's: its `Start` becomes a
/// usage update (the client's stream has started already), every usage figure is added to
/// the first attempt's (`base`), its reasoning is dropped (the client's answer went past
/// reasoning already), and leading whitespace is dropped when the text so far ended in
/// whitespace.
#[derive(Debug, Clone)]
pub struct Splice {
    /// The first attempt's usage.
    base: Usage,
    /// Drop leading whitespace until the first other text.
    trim_leading_ws: bool,
}

impl Splice {
    /// A splice over the first attempt's `base` usage, after a stream whose text so far is
    /// `text_so_far`.
    pub fn new(base: Usage, text_so_far: &str) -> Self {
        Self {
            base,
            trim_leading_ws: text_so_far.ends_with(char::is_whitespace),
        }
    }

    /// The event to give the client's encoder for the continuation's `ev` (`None`: drop it).
    pub fn map<'a>(&mut self, ev: &StreamEvent<'a>) -> Option<StreamEvent<'a>> {
        Some(match ev {
            StreamEvent::Start { usage, .. } | StreamEvent::Usage(usage) => {
                StreamEvent::Usage(add_usage(self.base, *usage))
            }
            StreamEvent::ReasoningDelta(_) | StreamEvent::ReasoningSignature(_) => return None,
            StreamEvent::TextDelta(t) if self.trim_leading_ws => {
                let rest = t.trim_start();
                if rest.is_empty() {
                    return None;
                }
                self.trim_leading_ws = false;
                StreamEvent::TextDelta(match t {
                    Cow::Borrowed(b) => Cow::Borrowed(b.trim_start()),
                    Cow::Owned(o) => Cow::Owned(o.trim_start().to_string()),
                })
            }
            other => {
                if matches!(other, StreamEvent::TextDelta(_)) {
                    self.trim_leading_ws = false;
                }
                other.clone()
            }
        })
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
            s.map(&start),
            Some(StreamEvent::Usage(Usage {
                input_tokens: 24,
                output_tokens: 3,
                ..Usage::default()
            }))
        );
        assert_eq!(s.map(&StreamEvent::ReasoningDelta("r".into())), None);
        assert_eq!(s.map(&StreamEvent::TextDelta(" ".into())), None);
        assert_eq!(
            s.map(&StreamEvent::TextDelta("  world ".into())),
            Some(StreamEvent::TextDelta("world ".into()))
        );
        assert_eq!(
            s.map(&StreamEvent::TextDelta(" again".into())),
            Some(StreamEvent::TextDelta(" again".into()))
        );
        let mut s = Splice::new(base, "Hel");
        assert_eq!(
            s.map(&StreamEvent::TextDelta(" lo".into())),
            Some(StreamEvent::TextDelta(" lo".into()))
        );
    }
}
