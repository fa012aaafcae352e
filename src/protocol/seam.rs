//! Owns the seam of a mid-stream continuation ([`Seam`]): where the continuation's text
//! meets the text the client already has. A model asked to go on from a cut often starts
//! its answer again, or repeats the last words before going on; spliced in unchecked, the
//! client would read the answer twice, with no space at the join ("…still open.A gateway
//! earns trust…"). The seam holds the continuation's first text (at most
//! [`DECIDE_BYTES`]) until it can tell which it is, then:
//!
//! - **restart** (the continuation starts with the whole text delivered): the repeated text
//!   is dropped, the rest goes on ([`SeamOutcome::Trimmed`]); a restart longer than the
//!   held bytes is followed and dropped as it streams;
//! - **overlap** (the continuation starts with the last words delivered, at least
//!   [`OVERLAP_MIN_BYTES`], from a word boundary): those words are dropped
//!   ([`SeamOutcome::Trimmed`]);
//! - **restart that diverges** (the continuation starts like the delivered text, at least
//!   [`RESTART_MIN_BYTES`], then says something else, or ends before reaching the cut): no
//!   splice is right, and the stream ends with the client's error event
//!   ([`SeamOutcome::Refused`]) rather than deliver doubled text;
//! - otherwise the text joins as it is ([`SeamOutcome::Clean`]), with one space added where
//!   the delivered text ended a sentence or clause and the continuation starts a word
//!   ([`SeamOutcome::SpaceAdded`]); when the delivered text ended in whitespace, the
//!   continuation's leading whitespace is dropped.
//!
//! All lengths are bytes of UTF-8; every cut is at a character boundary.

/// Most bytes of continuation text held before the seam is decided (a continuation that
/// matches the delivered text's start for this long is a restart).
pub const DECIDE_BYTES: usize = 1024;

/// Bytes of the delivered text's start a continuation must repeat to count as a restart.
pub const RESTART_MIN_BYTES: usize = 24;

/// Fewest bytes of the delivered text's end a continuation must repeat to be trimmed as an
/// overlap (shorter repeats are ordinary coincidences: "the", "a").
pub const OVERLAP_MIN_BYTES: usize = 12;

/// How a continuation's text met the delivered text (`sluice_continuation_seams_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeamOutcome {
    /// Joined as it came.
    Clean,
    /// A repeat of the delivered text (a restart or an overlap) was dropped.
    Trimmed,
    /// A space was added between a sentence's end and the continuation's first word.
    SpaceAdded,
    /// The continuation restarted and diverged: the stream ended with an error event.
    Refused,
}

impl SeamOutcome {
    /// Every outcome, in label order.
    pub const ALL: [SeamOutcome; 4] = [
        SeamOutcome::Clean,
        SeamOutcome::Trimmed,
        SeamOutcome::SpaceAdded,
        SeamOutcome::Refused,
    ];

    /// The metric label: `clean`, `trimmed`, `space_added`, `refused`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Clean => "clean",
            Self::Trimmed => "trimmed",
            Self::SpaceAdded => "space_added",
            Self::Refused => "refused",
        }
    }
}

/// The continuation restarted the answer and diverged from the delivered text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeamRefused;

/// What to do with one piece of continuation text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeamText {
    /// Deliver it unchanged.
    Pass,
    /// Deliver this instead (the held text, trimmed or joined; may be empty).
    Replace(String),
    /// Nothing now (held, or dropped as a repeat).
    Hold,
}

/// Where the seam is.
#[derive(Debug, Clone)]
enum State {
    /// Holding the continuation's first text.
    Deciding(String),
    /// A restart: the continuation is repeating the delivered text, matched up to this byte.
    Skipping(usize),
    /// A repeat was dropped up to the cut: the next text joins the delivered text (the
    /// whitespace and space rules), then text passes.
    Joining,
    /// Decided: text passes.
    Passing,
}

/// The seam between the delivered text and a continuation (see the module docs).
#[derive(Debug, Clone)]
pub struct Seam {
    /// The text the client has.
    delivered: String,
    state: State,
    outcome: Option<SeamOutcome>,
}

impl Seam {
    /// A seam after `delivered`, the answer text the client has.
    pub fn new(delivered: &str) -> Self {
        Self {
            delivered: delivered.to_string(),
            state: State::Deciding(String::new()),
            outcome: None,
        }
    }

    /// How the seam was decided (`None` while undecided).
    pub fn outcome(&self) -> Option<SeamOutcome> {
        self.outcome
    }

    /// Takes one piece of continuation text.
    ///
    /// # Errors
    /// [`SeamRefused`] when the continuation restarted and diverged.
    pub fn text(&mut self, t: &str) -> Result<SeamText, SeamRefused> {
        match &mut self.state {
            State::Passing => Ok(SeamText::Pass),
            State::Joining => Ok(self.trimmed(t)),
            State::Skipping(pos) => {
                let remaining = &self.delivered[*pos..];
                if t.len() < remaining.len() {
                    if remaining.starts_with(t) {
                        *pos += t.len();
                        return Ok(SeamText::Hold);
                    }
                } else if let Some(rest) = t.strip_prefix(remaining) {
                    return Ok(self.trimmed(rest));
                }
                self.refuse()
            }
            State::Deciding(buf) => {
                buf.push_str(t);
                self.decide(false)
            }
        }
    }

    /// Decides on what is held, before an event that is not text (a stop, a tool call, the
    /// end): the text to deliver before it.
    ///
    /// # Errors
    /// [`SeamRefused`] when the held text is a restart that ends short of the cut.
    pub fn flush(&mut self) -> Result<SeamText, SeamRefused> {
        match self.state {
            State::Deciding(_) => self.decide(true),
            State::Skipping(_) => self.refuse(),
            State::Joining | State::Passing => Ok(SeamText::Hold),
        }
    }

    /// A repeat was dropped; `rest` is what followed it: joined to the delivered text, or,
    /// when nothing is left of it, the next text is.
    fn trimmed(&mut self, rest: &str) -> SeamText {
        self.outcome = Some(SeamOutcome::Trimmed);
        let joined = join(&self.delivered, rest);
        if joined.is_empty() {
            self.state = State::Joining;
            SeamText::Hold
        } else {
            self.state = State::Passing;
            SeamText::Replace(joined)
        }
    }

    fn refuse(&mut self) -> Result<SeamText, SeamRefused> {
        self.outcome = Some(SeamOutcome::Refused);
        self.state = State::Passing;
        Err(SeamRefused)
    }

    fn settle(&mut self, outcome: SeamOutcome, text: String) -> Result<SeamText, SeamRefused> {
        self.outcome = Some(outcome);
        self.state = State::Passing;
        Ok(SeamText::Replace(text))
    }

    /// Decides on the held text (`at_end`: no more text comes before the next event).
    fn decide(&mut self, at_end: bool) -> Result<SeamText, SeamRefused> {
        let State::Deciding(buf) = &self.state else {
            return Ok(SeamText::Hold);
        };
        let delivered = self.delivered.as_str();
        let lead = delivered.trim_start();
        let offset = delivered.len() - lead.len();
        // A restart is judged on both texts without their leading whitespace.
        let c = buf.trim_start();
        if c.is_empty() {
            return Ok(SeamText::Hold);
        }
        let p = common_prefix(c, lead);
        if p == lead.len() {
            // The whole delivered text again: drop it.
            let rest = c[p..].to_string();
            return Ok(self.trimmed(&rest));
        }
        if p == c.len() && c.len() >= DECIDE_BYTES {
            // A long restart: follow it and drop it as it streams.
            self.outcome = Some(SeamOutcome::Trimmed);
            self.state = State::Skipping(offset + p);
            return Ok(SeamText::Hold);
        }
        // The continuation as it joins: without leading whitespace after whitespace.
        let joined = if delivered.ends_with(char::is_whitespace) {
            c
        } else {
            buf.as_str()
        };
        // Still a possible restart or overlap: wait for more (bounded).
        if !at_end && buf.len() < DECIDE_BYTES && (p == c.len() || delivered.contains(joined)) {
            return Ok(SeamText::Hold);
        }
        if p >= RESTART_MIN_BYTES {
            return self.refuse();
        }
        if let Some(k) = overlap(delivered, joined) {
            let rest = joined[k..].to_string();
            return Ok(self.trimmed(&rest));
        }
        let joined = joined.to_string();
        if needs_space(delivered, &joined) {
            return self.settle(SeamOutcome::SpaceAdded, format!(" {joined}"));
        }
        self.settle(SeamOutcome::Clean, joined)
    }
}

/// Bytes `a` and `b` share at their start, cut back to a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The longest repeat of `delivered`'s end at `c`'s start: at least [`OVERLAP_MIN_BYTES`],
/// starting in `delivered` at a word boundary.
fn overlap(delivered: &str, c: &str) -> Option<usize> {
    let most = c.len().min(delivered.len());
    (OVERLAP_MIN_BYTES..=most).rev().find(|&k| {
        c.is_char_boundary(k) && delivered.ends_with(&c[..k]) && {
            let before = &delivered[..delivered.len() - k];
            before.is_empty() || before.ends_with(|ch: char| !ch.is_alphanumeric())
        }
    })
}

/// `c` as it follows `delivered`: without leading whitespace after whitespace, with a space
/// where [`needs_space`] says.
fn join(delivered: &str, c: &str) -> String {
    let c = if delivered.ends_with(char::is_whitespace) {
        c.trim_start()
    } else {
        c
    };
    if needs_space(delivered, c) {
        format!(" {c}")
    } else {
        c.to_string()
    }
}

/// Whether a space belongs between `delivered` and the continuation `c`: the delivered text
/// ends a sentence or clause (`.`, `!`, `?`, `,`, `;`, `:`) and the continuation starts a
/// word. A cut inside a word ("Hel" + "lo") is joined as it is.
fn needs_space(delivered: &str, c: &str) -> bool {
    delivered.ends_with(['.', '!', '?', ',', ';', ':'])
        && c.starts_with(|ch: char| ch.is_alphanumeric() || matches!(ch, '"' | '\'' | '(' | '*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and a final flush; the text delivered, or the refusal.
    fn run(delivered: &str, pieces: &[&str]) -> (Result<String, SeamRefused>, Option<SeamOutcome>) {
        let mut s = Seam::new(delivered);
        let mut out = String::new();
        for p in pieces {
            match s.text(p) {
                Ok(SeamText::Pass) => out.push_str(p),
                Ok(SeamText::Replace(r)) => out.push_str(&r),
                Ok(SeamText::Hold) => {}
                Err(e) => return (Err(e), s.outcome()),
            }
        }
        match s.flush() {
            Ok(SeamText::Replace(r)) => out.push_str(&r),
            Ok(_) => {}
            Err(e) => return (Err(e), s.outcome()),
        }
        (Ok(out), s.outcome())
    }

    const SO_FAR: &str = "A gateway earns trust when the 3 a.m. page is still open.";

    #[test]
    fn a_restart_of_the_whole_answer_is_dropped() {
        let (out, o) = run(
            SO_FAR,
            &[
                "A gateway ",
                "earns trust when the 3 a.m. ",
                "page is still open.",
                " Then it",
                " closes.",
            ],
        );
        assert_eq!(out.unwrap(), " Then it closes.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
    }

    #[test]
    fn after_a_dropped_repeat_the_word_boundary_is_kept() {
        let (out, o) = run(SO_FAR, &[SO_FAR, "It", " closes."]);
        assert_eq!(out.unwrap(), " It closes.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
        let (out, o) = run(
            "The fox jumps. It is still open.",
            &["It is still open.Then", " more."],
        );
        assert_eq!(out.unwrap(), " Then more.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
    }

    #[test]
    fn a_long_restart_is_followed_past_the_held_bytes() {
        let so_far = "word ".repeat(400);
        let mut pieces: Vec<String> = (0..400).map(|_| "word ".to_string()).collect();
        pieces.push("tail".into());
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (out, o) = run(&so_far, &refs);
        assert_eq!(out.unwrap(), "tail");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
        // Diverging past the held bytes is refused.
        let mut pieces = pieces.clone();
        pieces[300] = "other".into();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            run(&so_far, &refs),
            (Err(SeamRefused), Some(SeamOutcome::Refused))
        );
    }

    #[test]
    fn a_restart_after_leading_whitespace_is_still_a_restart() {
        let (out, o) = run(
            SO_FAR,
            &[
                " A gateway",
                " earns trust when the 3 a.m. page is still open.",
                " Then.",
            ],
        );
        assert_eq!(out.unwrap(), " Then.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
    }

    #[test]
    fn a_restart_that_diverges_or_stops_short_is_refused() {
        let (out, o) = run(SO_FAR, &["A gateway earns trust when ", "nobody is awake."]);
        assert_eq!((out, o), (Err(SeamRefused), Some(SeamOutcome::Refused)));
        let (out, o) = run(SO_FAR, &["A gateway earns trust when the 3"]);
        assert_eq!((out, o), (Err(SeamRefused), Some(SeamOutcome::Refused)));
    }

    #[test]
    fn an_overlap_of_the_last_words_is_trimmed() {
        let (out, o) = run(
            "The fox jumps over the lazy ",
            &["over the lazy dog", " and runs."],
        );
        assert_eq!(out.unwrap(), "dog and runs.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
    }

    #[test]
    fn a_clean_continuation_joins_with_a_space_only_after_a_sentence() {
        let (out, o) = run(SO_FAR, &["Then it", " closes."]);
        assert_eq!(out.unwrap(), " Then it closes.");
        assert_eq!(o, Some(SeamOutcome::SpaceAdded));
        let (out, o) = run("The quick brown fox ", &["  jumps", " over."]);
        assert_eq!(out.unwrap(), "jumps over.");
        assert_eq!(o, Some(SeamOutcome::Clean));
        let (out, o) = run("Hel", &["lo there", "."]);
        assert_eq!(out.unwrap(), "lo there.");
        assert_eq!(o, Some(SeamOutcome::Clean));
        // A short coincidence with the start is no restart.
        let (out, o) = run("The cat sat on the mat and ", &["The dog barked."]);
        assert_eq!(out.unwrap(), "The dog barked.");
        assert_eq!(o, Some(SeamOutcome::Clean));
    }

    #[test]
    fn multi_byte_text_is_cut_at_character_boundaries() {
        let (out, o) = run(
            "Grüße aus Köln, schön.",
            &["Grüße aus Köln, schön. Mehr", "."],
        );
        assert_eq!(out.unwrap(), " Mehr.");
        assert_eq!(o, Some(SeamOutcome::Trimmed));
        assert_eq!(common_prefix("ä", "å"), 0);
    }
}
