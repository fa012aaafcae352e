//! The local input-token estimate of a canonical [`Request`], for token counts that no
//! provider answers (`POST /v1/messages/count_tokens` on an OpenAI-compatible route, or
//! when the Anthropic provider's own count failed).
//!
//! Text is tokenized with OpenAI's `o200k_base` BPE (GPT-4o and later; the `tiktoken-rs`
//! crate, whose table is loaded once per process, on the first estimate, and kept). What
//! is counted, in tokens:
//!
//! - every system text, message text and reasoning text;
//! - a tool call's function name and its arguments (the JSON text);
//! - a tool result's call id and content (text tokenized, images as below);
//! - every tool definition as the JSON of `{"name","description","parameters"}`;
//! - a plain-text document's title and text;
//! - an image: [`IMAGE_TOKENS`] (the image is not decoded, so its size is unknown);
//! - a PDF (base64 or URL): [`PDF_TOKENS`];
//! - [`MESSAGE_OVERHEAD_TOKENS`] per system text and message (role and framing) and
//!   [`REPLY_PRIMING_TOKENS`] once (OpenAI's documented chat framing for o200k models).
//!
//! The figure is an estimate: another model's tokenizer differs, typically by 10-20 %.

use tiktoken_rs::CoreBPE;

use super::{Part, Request, Source};

/// Tokens counted for one image. Anthropic bills an image at about `width × height / 750`
/// tokens and scales images down to about 1.15 megapixels, so ~1,600 is the most an image
/// costs there; OpenAI's high-detail 1024×1024 image is 765. The larger figure is used
/// (an estimate for admission and context budgets should not undercount).
pub const IMAGE_TOKENS: u64 = 1_600;

/// Tokens counted for one PDF document (its pages are not read): Anthropic's guide gives
/// 1,500-3,000 text tokens per page plus an image per page; this is about one page.
pub const PDF_TOKENS: u64 = 3_000;

/// Framing tokens per message and per system text (OpenAI's cookbook figure for o200k).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 3;

/// Framing tokens of the reply the model is primed with, counted once per request.
pub const REPLY_PRIMING_TOKENS: u64 = 3;

/// The BPE table, loaded on first use (2.2 s of CPU in a debug build, far less optimized;
/// call from a blocking thread) and then shared for the process's life.
fn bpe() -> &'static CoreBPE {
    tiktoken_rs::o200k_base_singleton()
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
    let bpe = bpe();
    let mut n = 0u64;
    while text.len() > PIECE_BYTES {
        let hard = floor_boundary(text, PIECE_BYTES);
        let cut = text[..hard]
            .rfind(char::is_whitespace)
            .filter(|&i| i > 0)
            .unwrap_or(hard);
        n += bpe.encode_ordinary(&text[..cut]).len() as u64;
        text = &text[cut..];
    }
    n + bpe.encode_ordinary(text).len() as u64
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The estimated input tokens of `req` (see the module doc for what is counted). CPU time
/// grows with the text (1.2 s for 1 MB in a debug build): call it from a blocking thread.
pub fn estimate_input_tokens(req: &Request) -> u64 {
    let mut n = REPLY_PRIMING_TOKENS;
    for s in &req.system {
        n += MESSAGE_OVERHEAD_TOKENS + text_tokens(s);
    }
    for m in &req.messages {
        n += MESSAGE_OVERHEAD_TOKENS;
        n += m.parts.iter().map(part_tokens).sum::<u64>();
    }
    for t in &req.tools {
        let def = serde_json::json!({
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        });
        n += text_tokens(&def.to_string());
    }
    n
}

fn part_tokens(p: &Part) -> u64 {
    match p {
        Part::Text(t) => text_tokens(t),
        Part::Reasoning { text, .. } => text_tokens(text),
        Part::Image(_) => IMAGE_TOKENS,
        Part::Document { source, title } => {
            let title = title.as_deref().map_or(0, text_tokens);
            title
                + match source {
                    Source::Text(t) => text_tokens(t),
                    Source::Url(_) | Source::Base64 { .. } => PDF_TOKENS,
                }
        }
        Part::ToolCall(c) => text_tokens(&c.name) + text_tokens(&c.arguments),
        Part::ToolResult {
            call_id, content, ..
        } => text_tokens(call_id) + content.iter().map(part_tokens).sum::<u64>(),
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
        let whole = bpe().encode_ordinary(&prose).len() as u64;
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
        let exact = bpe().encode_ordinary(&huge).len() as u64;
        let est = text_tokens(&huge);
        assert!(est.abs_diff(exact) * 100 <= exact * 2, "{est} vs {exact}");
        // Multi-byte text is cut on char boundaries.
        assert!(text_tokens(&"é".repeat(100_000)) > 0);
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
}
