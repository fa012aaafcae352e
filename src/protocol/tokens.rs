//! The local input-token estimate of a canonical [`Request`], for token counts that no
//! provider answers (`POST /v1/messages/count_tokens` on an OpenAI-compatible route, or
//! when the Anthropic provider's own count failed).
//!
//! Text is tokenized with OpenAI's `o200k_base` BPE (GPT-4o and later), counted exactly as
//! the `tiktoken-rs` crate counts it by a compact table built from its data ([`super::bpe`];
//! loaded once per process, at start, and kept). What is counted, in tokens:
//!
//! - every system text, message text and reasoning text;
//! - a tool call's function name and its arguments (the JSON text);
//! - a tool result's call id and content (text tokenized, images as below);
//! - every tool definition as the JSON of `{"name","description","parameters"}`;
//! - a plain-text document's title and text;
//! - an image: [`IMAGE_TOKENS`] (the image is not decoded, so its size is unknown);
//! - a base64 PDF: [`PDF_PAGE_TOKENS`] per page (its page objects counted, without parsing
//!   it); a PDF whose pages cannot be counted (a URL, compressed object streams):
//!   [`PDF_TOKENS`];
//! - [`MESSAGE_OVERHEAD_TOKENS`] per system text and message (role and framing) and
//!   [`REPLY_PRIMING_TOKENS`] once (OpenAI's documented chat framing for o200k models).
//!
//! The figure is an estimate: another model's tokenizer differs, typically by 10-20 %.

use super::{Part, Request, Source};

/// Tokens counted for one image. Anthropic bills an image at about `width × height / 750`
/// tokens and scales images down to about 1.15 megapixels, so ~1,600 is the most an image
/// costs there; OpenAI's high-detail 1024×1024 image is 765. The larger figure is used
/// (an estimate for admission and context budgets should not undercount).
pub const IMAGE_TOKENS: u64 = 1_600;

/// Tokens counted for one PDF document (its pages are not read): Anthropic's guide gives
/// 1,500-3,000 text tokens per page plus an image per page; this is about one page.
pub const PDF_TOKENS: u64 = 3_000;

/// Tokens counted per page of a PDF whose pages are counted: the most Anthropic's PDF guide
/// (<https://docs.anthropic.com/en/docs/build-with-claude/pdf-support>) gives for a page's text
/// (3,000) plus its page image ([`IMAGE_TOKENS`]), so the estimate is an upper bound for a
/// budget's reservation.
pub const PDF_PAGE_TOKENS: u64 = 3_000 + IMAGE_TOKENS;

/// The pages of a base64 PDF: its `/Type /Page` objects (not `/Pages`), found with a byte
/// scan of the decoded file. `None` when it does not decode or no page object is visible
/// (pages inside compressed object streams).
pub fn pdf_pages(base64: &str) -> Option<u64> {
    let bytes = base64_simd::STANDARD
        .decode_to_vec(base64.as_bytes())
        .ok()?;
    let mut pages = 0u64;
    for at in memchr::memmem::find_iter(&bytes, b"/Type") {
        let rest = &bytes[at + 5..];
        let skip = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let rest = &rest[skip..];
        if rest.starts_with(b"/Page") && !rest.get(5).is_some_and(|b| b.is_ascii_alphanumeric()) {
            pages += 1;
        }
    }
    (pages > 0).then_some(pages)
}

/// Framing tokens per message and per system text (OpenAI's cookbook figure for o200k).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 3;

/// Framing tokens of the reply the model is primed with, counted once per request.
pub const REPLY_PRIMING_TOKENS: u64 = 3;

/// Loads the `o200k_base` table now (once per process; the server does it at start, so no
/// estimate waits for it) and returns the heap bytes it keeps.
pub fn load() -> usize {
    super::bpe::load()
}

/// Text is tokenized in pieces of at most this many bytes, cut before whitespace where
/// there is some (where `o200k_base` splits anyway, so the count is the whole text's):
/// BPE merging is quadratic in the length of one run without whitespace, so a client's
/// megabyte of letters would otherwise cost CPU seconds.
pub const PIECE_BYTES: usize = 1024;

/// Text up to this many bytes is counted exactly; longer text is estimated from its first
/// and last `EXACT_BYTES / 2` bytes, scaled by length (bounded CPU per call, about 50 ms
/// of a debug build at most).
pub const EXACT_BYTES: usize = 64 * 1024;

/// Tokens in `text` (`o200k_base`, special-token text counted as ordinary text): exact up
/// to [`EXACT_BYTES`], beyond it an estimate from a sample (see there).
pub fn text_tokens(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    if text.len() <= EXACT_BYTES {
        return piece_tokens(text);
    }
    let half = EXACT_BYTES / 2;
    let head = &text[..floor_boundary(text, half)];
    let tail = &text[floor_boundary(text, text.len() - half)..];
    let sampled = piece_tokens(head) + piece_tokens(tail);
    let scale = text.len() as f64 / (head.len() + tail.len()) as f64;
    (sampled as f64 * scale).round() as u64
}

/// Tokens of `text`, tokenized [`PIECE_BYTES`] at a time.
fn piece_tokens(mut text: &str) -> u64 {
    let mut n = 0u64;
    while text.len() > PIECE_BYTES {
        let hard = floor_boundary(text, PIECE_BYTES);
        let cut = text[..hard]
            .rfind(char::is_whitespace)
            .filter(|&i| i > 0)
            .unwrap_or(hard);
        n += super::bpe::count_ordinary(&text[..cut]);
        text = &text[cut..];
    }
    n + super::bpe::count_ordinary(text)
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The estimated input tokens of `req` (see the module doc for what is counted). CPU time
/// grows with the text (1.2 s for 1 MB in a debug build; ~1 ms for 32 KiB of prose in a
/// release build): call it from a blocking thread, or sample first ([`sample_input`]).
pub fn estimate_input_tokens(req: &Request) -> u64 {
    let mut sample = TextSample::new(usize::MAX);
    sample_input(req, &mut sample);
    sample.tokens()
}

/// Adds what [`estimate_input_tokens`] counts of `req` to `sample`: its framing, images and
/// documents as fixed figures, its text as text (within the sample's budget).
pub fn sample_input(req: &Request, sample: &mut TextSample) {
    sample.fixed(REPLY_PRIMING_TOKENS);
    for s in &req.system {
        sample.fixed(MESSAGE_OVERHEAD_TOKENS);
        sample.text(s);
    }
    for m in &req.messages {
        sample.fixed(MESSAGE_OVERHEAD_TOKENS);
        for p in &m.parts {
            sample_part(p, sample);
        }
    }
    for t in &req.tools {
        sample.tool(&t.name, &t.description, &t.parameters);
    }
}

fn sample_part(p: &Part, sample: &mut TextSample) {
    match p {
        Part::Text(t) => sample.text(t),
        Part::Reasoning { text, .. } => sample.text(text),
        Part::Image(_) => sample.fixed(IMAGE_TOKENS),
        Part::Document { source, title } => {
            if let Some(t) = title {
                sample.text(t);
            }
            match source {
                Source::Text(t) => sample.text(t),
                Source::Base64 { data, .. } => sample.fixed(
                    pdf_pages(data).map_or(PDF_TOKENS, |n| n.saturating_mul(PDF_PAGE_TOKENS)),
                ),
                Source::Url(_) => sample.fixed(PDF_TOKENS),
            }
        }
        Part::ToolCall(c) => {
            sample.text(&c.name);
            sample.text(&c.arguments);
        }
        Part::ToolResult {
            call_id, content, ..
        } => {
            sample.text(call_id);
            for p in content {
                sample_part(p, sample);
            }
        }
    }
}

/// The smallest sample of one text that a [`TextSample`] keeps, bytes, even when its budget
/// is spent and it holds no text yet to scale from.
pub const MIN_SAMPLE_BYTES: usize = 1024;

/// What an input estimate counts, collected as a request is walked and tokenized only when
/// counted ([`TextSample::tokens`]): fixed figures (framing, images, documents) and copies
/// of the request's text within a budget of bytes. A text within what is left of the budget
/// is kept whole (counted as [`text_tokens`] counts it: exact up to [`EXACT_BYTES`]); the
/// text that passes the budget is kept as its first and last halves of what was left (at
/// least [`MIN_SAMPLE_BYTES`]), counted scaled by length; text after the budget is spent, or
/// past [`TextSample::new`]'s bound on the number of texts kept, is counted at the tokens per
/// byte of all the text kept. An unbounded sample (`usize::MAX`) keeps nothing: it counts
/// each text as it comes, exactly as [`text_tokens`] does.
///
/// With a small budget it is a compact stand-in for the request: a stream that lets go of
/// its body at the commit keeps one ([`RELEASE_SAMPLE_BYTES`] of text and at most 64 pieces
/// of index) and tokenizes it only if the answer ends without the provider's input figure.
/// For prose the figure is within a few per cent of the whole count; for text that changes
/// character mid-way (code after prose, another script) it is as good as the sample.
#[derive(Debug, Clone, Default)]
pub struct TextSample {
    /// Fixed figures, plus the tokens of every text an unbounded sample counted at once.
    counted: u64,
    left: usize,
    /// No budget: texts are counted as they come, not kept.
    eager: bool,
    max_pieces: usize,
    text: String,
    pieces: Vec<Piece>,
    scaled_bytes: usize,
}

/// One piece of a [`TextSample`]'s text: where it ends in `text`, and how many bytes of the
/// request's text it stands for (its own length when kept whole).
#[derive(Debug, Clone, Copy)]
struct Piece {
    end: u32,
    stands_for: u32,
}

/// The budget of the [`TextSample`] a stream keeps in place of its released body, bytes.
pub const RELEASE_SAMPLE_BYTES: usize = 2 * 1024;

/// A bounded sample keeps at most one piece per this many bytes of budget (at least 8
/// pieces): a request of many tiny texts cannot make its index outgrow its text.
const BUDGET_BYTES_PER_PIECE: usize = 32;

impl TextSample {
    /// An empty sample that keeps at most about `budget_bytes` of text, in at most
    /// `budget_bytes / 32` pieces (at least 8); `usize::MAX`: none kept, every text counted
    /// at once (see the type's doc).
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            left: budget_bytes,
            eager: budget_bytes == usize::MAX,
            max_pieces: (budget_bytes / BUDGET_BYTES_PER_PIECE).max(8),
            ..Self::default()
        }
    }

    /// Adds a fixed figure, tokens.
    pub fn fixed(&mut self, tokens: u64) {
        self.counted += tokens;
    }

    /// Adds a tool definition, counted as the text of its JSON
    /// `{"name","description","parameters"}` (absent members as `null`).
    pub fn tool(
        &mut self,
        name: &impl serde::Serialize,
        description: &impl serde::Serialize,
        parameters: &impl serde::Serialize,
    ) {
        let def = serde_json::json!({
            "name": name,
            "description": description,
            "parameters": parameters,
        });
        self.text(&def.to_string());
    }

    /// Adds `text` (see the type's doc for what is kept of it).
    pub fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.eager {
            self.counted += text_tokens(text);
            return;
        }
        let room = self.pieces.len() + 2 <= self.max_pieces;
        let keep = if text.len() <= self.left && room {
            self.left -= text.len();
            EXACT_BYTES
        } else if (self.left < MIN_SAMPLE_BYTES || !room) && !self.pieces.is_empty() {
            self.scaled_bytes += text.len();
            return;
        } else {
            std::mem::take(&mut self.left).max(MIN_SAMPLE_BYTES)
        };
        if text.len() <= keep {
            self.push(text, text.len());
            return;
        }
        let half = keep / 2;
        let head = &text[..floor_boundary(text, half)];
        let tail = &text[floor_boundary(text, text.len() - half)..];
        let head_for = text.len() * head.len() / (head.len() + tail.len());
        self.push(head, head_for);
        self.push(tail, text.len() - head_for);
    }

    fn push(&mut self, text: &str, stands_for: usize) {
        self.text.push_str(text);
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.pieces.push(Piece {
            end: clamp(self.text.len()),
            stands_for: clamp(stands_for),
        });
    }

    /// The estimate, tokens: the fixed figures plus the text kept, tokenized piece by piece
    /// (`o200k_base`) and scaled to what each piece stands for, plus the text past the budget
    /// at the tokens per byte of the text kept. CPU time grows with the text kept (about
    /// 40 µs per KiB of prose in a release build).
    pub fn tokens(&self) -> u64 {
        let mut n = 0.0;
        let (mut kept_bytes, mut kept_tokens) = (0usize, 0u64);
        let mut start = 0usize;
        for p in &self.pieces {
            let end = p.end as usize;
            let piece = self.text.get(start..end).unwrap_or_default();
            start = end;
            let t = piece_tokens(piece);
            kept_bytes += piece.len();
            kept_tokens += t;
            n += if p.stands_for as usize == piece.len() || piece.is_empty() {
                t as f64
            } else {
                t as f64 * f64::from(p.stands_for) / piece.len() as f64
            };
        }
        if self.scaled_bytes > 0 && kept_bytes > 0 {
            // Rounded up: an estimate for budgets should not undercount.
            n += (self.scaled_bytes as f64 * kept_tokens as f64 / kept_bytes as f64).ceil();
        }
        self.counted + n.round() as u64
    }

    /// Frees the spare capacity of its text and index (for a sample kept a while).
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.pieces.shrink_to_fit();
    }

    /// Heap bytes the sample holds (its text and its pieces' index).
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.pieces.capacity() * std::mem::size_of::<Piece>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, Role, Tool, ToolCall};

    fn user(parts: Vec<Part>) -> Message {
        Message {
            role: Role::User,
            parts,
        }
    }

    #[test]
    fn text_is_counted_with_the_o200k_tokenizer() {
        // Reference counts of OpenAI's tiktoken (o200k_base).
        assert_eq!(text_tokens("hello world"), 2);
        assert_eq!(text_tokens(""), 0);
        assert!(text_tokens("héllo wörld, ünïcode ✓") > 4);
    }

    #[test]
    fn long_text_is_counted_in_pieces_and_huge_text_from_a_sample_in_bounded_time() {
        // Natural text: pieces cut before whitespace count as the whole.
        let prose = "The quick brown fox jumps over the lazy dog. ".repeat(1000);
        assert!(prose.len() < EXACT_BYTES);
        let whole = crate::protocol::bpe::count_ordinary(&prose);
        assert_eq!(text_tokens(&prose), whole);
        // A megabyte without whitespace (quadratic for BPE in one piece): bounded time,
        // and a figure of the right size (o200k packs runs of one letter several a token).
        let t0 = std::time::Instant::now();
        let n = text_tokens(&"a".repeat(1024 * 1024));
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t0.elapsed()
        );
        assert!(
            (1024 * 1024 / 64..=1024 * 1024).contains(&(n as usize)),
            "{n}"
        );
        // Huge prose is estimated within a few per cent.
        let huge = "The quick brown fox jumps over the lazy dog. ".repeat(20_000);
        let exact = crate::protocol::bpe::count_ordinary(&huge);
        let est = text_tokens(&huge);
        assert!(est.abs_diff(exact) * 100 <= exact * 2, "{est} vs {exact}");
        // Multi-byte text is cut on char boundaries.
        assert!(text_tokens(&"é".repeat(100_000)) > 0);
    }

    /// About `bytes` of prose that varies (word lengths, punctuation, numbers), unlike a
    /// repeated sentence, which any sample predicts exactly.
    fn varied_prose(bytes: usize) -> String {
        let words = [
            "gateway",
            "the",
            "streams",
            "of",
            "token",
            "2026",
            "provider,",
            "a",
            "latency",
            "Überprüfung",
            "fallback.",
            "is",
            "concurrency",
            "(bounded)",
            "to",
            "memory;",
        ];
        let mut s = String::new();
        let mut i = 7usize;
        while s.len() < bytes {
            i = i.wrapping_mul(31).wrapping_add(17) % 1009;
            s.push_str(words[i % words.len()]);
            s.push(' ');
        }
        s
    }

    /// The estimate of `texts` with a sample of `budget` bytes.
    fn sampled(budget: usize, texts: &[&str]) -> u64 {
        let mut s = TextSample::new(budget);
        for t in texts {
            s.text(t);
        }
        s.tokens()
    }

    #[test]
    fn a_sample_counts_exactly_within_its_budget_and_scales_past_it() {
        let prose = varied_prose(32 * 1024);
        let exact = text_tokens(&prose);
        // Within the budget: exact.
        assert_eq!(sampled(64 * 1024, &[&prose]), exact);
        assert_eq!(sampled(usize::MAX, &[&prose, "hello world"]), exact + 2);
        // Past a 2 KiB budget: its first and last KiB, scaled, within a few per cent; text
        // after the budget is spent at the tokens per byte kept.
        let n = sampled(RELEASE_SAMPLE_BYTES, &[&prose]);
        assert!(n.abs_diff(exact) * 100 <= exact * 3, "{n} vs {exact}");
        let n = sampled(RELEASE_SAMPLE_BYTES, &[&prose, &prose]);
        assert!(
            n.abs_diff(2 * exact) * 100 <= 2 * exact * 3,
            "{n} vs {}",
            2 * exact
        );
        // Nothing kept to scale from: a short text is kept whole, a long one sampled.
        assert_eq!(sampled(0, &["hello world"]), 2);
        let n = sampled(0, &[&prose]);
        assert!(n.abs_diff(exact) * 100 <= exact * 10, "{n} vs {exact}");
        // What a released stream keeps is about its budget, whatever the prompt: a few long
        // texts or many tiny ones (whose index is bounded too).
        let mut s = TextSample::new(RELEASE_SAMPLE_BYTES);
        for _ in 0..100 {
            s.text(&prose);
        }
        assert!(
            s.heap_bytes() <= 2 * RELEASE_SAMPLE_BYTES,
            "{}",
            s.heap_bytes()
        );
        let mut s = TextSample::new(RELEASE_SAMPLE_BYTES);
        for _ in 0..5000 {
            s.text("a b");
        }
        assert!(s.heap_bytes() <= RELEASE_SAMPLE_BYTES, "{}", s.heap_bytes());
        let exact = 5000 * text_tokens("a b");
        assert!(
            s.tokens().abs_diff(exact) * 100 <= exact,
            "{} vs {exact}",
            s.tokens()
        );
    }

    #[test]
    fn a_request_sampled_within_a_budget_is_close_to_the_whole_count() {
        let req = Request {
            system: vec!["You are a careful assistant.".into()],
            messages: vec![
                user(vec![Part::Text(varied_prose(24 * 1024))]),
                Message {
                    role: Role::Assistant,
                    parts: vec![Part::Text(varied_prose(4 * 1024))],
                },
                user(vec![
                    Part::Text(varied_prose(8 * 1024)),
                    Part::Image(Source::Url("https://x/y.png".into())),
                ]),
            ],
            ..Request::default()
        };
        let whole = estimate_input_tokens(&req);
        let mut sample = TextSample::new(RELEASE_SAMPLE_BYTES);
        sample_input(&req, &mut sample);
        let n = sample.tokens();
        assert!(n.abs_diff(whole) * 100 <= whole * 3, "{n} vs {whole}");
        // Small requests fit the budget: the same figure.
        let small = Request {
            system: vec!["Be brief.".into()],
            messages: vec![user(vec![Part::Text(
                "What is the capital of France?".into(),
            )])],
            ..Request::default()
        };
        let mut sample = TextSample::new(RELEASE_SAMPLE_BYTES);
        sample_input(&small, &mut sample);
        assert_eq!(sample.tokens(), estimate_input_tokens(&small));
    }

    #[test]
    fn every_part_of_the_request_counts_and_the_count_grows_with_it() {
        let base = Request {
            system: vec!["You are terse.".into()],
            messages: vec![user(vec![Part::Text(
                "What is the capital of France?".into(),
            )])],
            ..Request::default()
        };
        let n0 = estimate_input_tokens(&base);
        // 3 priming + (3 + 4) system + (3 + 7) message.
        assert_eq!(n0, 3 + 3 + text_tokens("You are terse.") + 3 + 7);

        let mut longer = base.clone();
        longer.messages[0]
            .parts
            .push(Part::Text(" And of Spain, Italy and Portugal?".repeat(10)));
        assert!(estimate_input_tokens(&longer) > n0 + 50);

        let mut image = base.clone();
        image.messages[0]
            .parts
            .push(Part::Image(Source::Url("https://x/y.png".into())));
        assert_eq!(estimate_input_tokens(&image), n0 + IMAGE_TOKENS);

        let mut tools = base.clone();
        tools.tools.push(Tool {
            name: "get_weather".into(),
            description: Some("Weather for a city".into()),
            parameters: serde_json::json!({"type":"object","properties":{"city":{"type":"string"}}}),
            strict: None,
            origin: Default::default(),
        });
        assert!(estimate_input_tokens(&tools) > n0 + 10);

        let mut calls = base.clone();
        calls.messages.push(Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall(ToolCall {
                id: "toolu_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            })],
        });
        calls.messages.push(user(vec![Part::ToolResult {
            call_id: "toolu_1".into(),
            content: vec![Part::Text("sunny, 21 °C".into())],
            is_error: false,
        }]));
        let with_calls = estimate_input_tokens(&calls);
        assert!(
            with_calls > n0 + 2 * MESSAGE_OVERHEAD_TOKENS + 8,
            "{with_calls}"
        );

        let mut pdf = base;
        pdf.messages[0].parts.push(Part::Document {
            source: Source::Base64 {
                media_type: "application/pdf".into(),
                data: "JVBERi0=".into(),
            },
            title: None,
        });
        assert_eq!(estimate_input_tokens(&pdf), n0 + PDF_TOKENS);
    }

    #[test]
    fn a_base64_pdf_is_counted_by_its_pages_as_an_upper_bound() {
        use base64::Engine as _;
        let pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n\
            2 0 obj << /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >> endobj\n\
            3 0 obj << /Type /Page /Parent 2 0 R >> endobj\n\
            4 0 obj <</Type/Page/Parent 2 0 R>> endobj\n\
            5 0 obj << /Type\n/Page >> endobj\n%%EOF";
        let b64 = base64::engine::general_purpose::STANDARD.encode(pdf);
        assert_eq!(pdf_pages(&b64), Some(3));
        // Not base64, or no visible page object: unknown.
        assert_eq!(pdf_pages("%%%"), None);
        assert_eq!(pdf_pages("JVBERi0="), None);
    }
}
