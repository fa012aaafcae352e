//! Owns metering: what one request used and what it costs.
//!
//! * [`Prices`]: a price list in USD per million tokens (`*_usd_per_mtok` config keys), and
//!   the price arithmetic ([`Prices::usd`]);
//! * [`Metered`]: the per-request result (tokens per class, `estimated`, `cost_usd`,
//!   `charge_usd`), built at the end of the request by [`meter`] from the usage the proxy
//!   recorded in [`Outcome`];
//! * [`OutputEstimator`]: the output-token estimate of a stream that ended without the
//!   provider's usage, counted incrementally with the `o200k_base` tokenizer
//!   ([`crate::protocol::tokens`]) from the text actually streamed, in bounded memory
//!   (about 1 KiB per stream) and bounded CPU (short answers are tokenized only when the
//!   estimate is needed, long ones one piece in [`ESTIMATE_SAMPLE_EVERY`]);
//! * [`stream_text`]: the generated text of one upstream event or body, found with a byte
//!   scan (no JSON parse).
//!
//! # Prices and defaults
//!
//! The **charge** (what the tenant pays) uses the standard model's sell prices
//! (`models.<id>.input_usd_per_mtok`, `output_usd_per_mtok`, `cached_input_usd_per_mtok`,
//! `cache_write_usd_per_mtok`); the **cost** (what the provider bills Sluice's operator)
//! uses the serving route's prices (`models.<id>.routes[].…`, same key names). Defaults:
//!
//! * `cached_input_usd_per_mtok` and `cache_write_usd_per_mtok` absent: the input price
//!   (a cache discount or surcharge applies only when configured);
//! * a sell `input_usd_per_mtok` / `output_usd_per_mtok` absent: 0 (a model without any sell
//!   price is free; one priced in part is warned about at load, see
//!   [`Config::warnings`](crate::config::Config::warnings));
//! * route prices absent: 0 (as for `lowest_cost` routing).
//!
//! Classes priced (canonical [`Usage`](crate::protocol::Usage), where input includes the
//! cache): uncached input × input price + cache reads × cached price + cache writes × cache
//! write price + output × output price. Reasoning tokens are part of the output (priced as
//! output) and recorded separately. Amounts are `f64` USD rounded to the nano-dollar
//! (1e-9 USD, [`round_usd`]): well below one token at any real price (0.01 USD/Mtok is
//! 1e-8 USD per token), and sums over millions of requests keep that precision.
//!
//! # Final usage, streamed or not
//!
//! The figures come from the provider's own `usage`, the last value of the stream (Chat: the
//! final usage chunk; Messages: `message_start` merged with the cumulative `message_delta`;
//! any other pair: the translator's canonical usage). A stream and a non-stream answer with
//! the same provider usage get the same [`Metered`] (one code path prices both). A stream
//! that ended without its final usage (client abort, upstream break, a provider that omits
//! it) is `estimated`: input from the admission estimate (canonical request →
//! [`tokens::estimate_input_tokens`](crate::protocol::tokens::estimate_input_tokens)),
//! output the larger of what the provider reported so far and the tokenizer count of the
//! text streamed.

use memchr::memmem::Finder;
use std::sync::OnceLock;

use crate::config::{Config, Model, Route};
use crate::protocol::{tokens, Usage};
use crate::proxy::ctx::Outcome;

/// One million: prices are per million tokens.
const MTOK: f64 = 1_000_000.0;

/// Rounds a USD amount to the nano-dollar (1e-9 USD).
pub fn round_usd(usd: f64) -> f64 {
    (usd * 1e9).round() / 1e9
}

/// A price list, USD per million tokens. `None` for the cache classes means "the input
/// price".
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    /// Uncached input tokens.
    pub input: f64,
    /// Output tokens (reasoning included).
    pub output: f64,
    /// Input tokens read from the prompt cache (`None`: `input`).
    pub cached_input: Option<f64>,
    /// Input tokens written to the prompt cache (`None`: `input`).
    pub cache_write: Option<f64>,
}

impl Prices {
    /// The sell prices of a standard model (absent ones 0, see the module doc).
    pub fn sell(model: &Model) -> Self {
        Self {
            input: model.input_usd_per_mtok.unwrap_or(0.0),
            output: model.output_usd_per_mtok.unwrap_or(0.0),
            cached_input: model.cached_input_usd_per_mtok,
            cache_write: model.cache_write_usd_per_mtok,
        }
    }

    /// The cost prices of a route.
    pub fn cost(route: &Route) -> Self {
        Self {
            input: route.input_usd_per_mtok,
            output: route.output_usd_per_mtok,
            cached_input: route.cached_input_usd_per_mtok,
            cache_write: route.cache_write_usd_per_mtok,
        }
    }

    /// What `u` costs at these prices, USD rounded to the nano-dollar.
    pub fn usd(&self, u: &Usage) -> f64 {
        // Integer token counts are exact in f64 up to 2^53.
        let uncached = u.uncached_input_tokens() as f64;
        let read = u.cache_read_tokens as f64;
        let write = u.cache_write_tokens as f64;
        let out = u.output_tokens as f64;
        let micro = uncached * self.input
            + read * self.cached_input.unwrap_or(self.input)
            + write * self.cache_write.unwrap_or(self.input)
            + out * self.output;
        round_usd(micro / MTOK)
    }
}

/// What one request used and what it costs: filled at the end of the request (Pingora's
/// `logging` phase) and exported to the access log, the metrics and the usage ledger (whose
/// record has the same field names).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Metered {
    /// Prompt tokens, cached ones included (canonical convention).
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the provider's cache (part of `input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`), when the provider says.
    pub reasoning_tokens: u64,
    /// The figures are Sluice's estimate (the stream ended without the provider's usage).
    pub estimated: bool,
    /// What the provider bills for it at the route's prices, USD.
    pub cost_usd: f64,
    /// What the tenant is charged at the standard model's sell prices, USD.
    pub charge_usd: f64,
}

impl Metered {
    /// The figures as canonical usage.
    pub fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_read_tokens: self.cached_input_tokens,
            cache_write_tokens: self.cache_write_tokens,
            reasoning_tokens: self.reasoning_tokens,
        }
    }

    /// Prices `usage` at `sell` (charge) and `cost`.
    pub fn priced(usage: &Usage, estimated: bool, sell: &Prices, cost: &Prices) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            estimated,
            cost_usd: cost.usd(usage),
            charge_usd: sell.usd(usage),
        }
    }
}

/// The request's [`Metered`], or `None` when no provider answered (nothing was used).
/// `standard_model` must name a configured model; the serving route is the one with the
/// outcome's provider and upstream model (cost 0 if a reload removed it: the config is the
/// request's pinned snapshot, so it cannot).
pub fn meter(config: &Config, standard_model: Option<&str>, o: &Outcome) -> Option<Metered> {
    let provider = o.provider.as_deref()?;
    let model = config.models.get(standard_model?)?;
    let route = model.routes.iter().find(|r| {
        r.provider.id == provider && o.upstream_model.as_deref() == Some(&r.upstream_model)
    });
    let usage = Usage {
        input_tokens: o.input_tokens,
        output_tokens: o.output_tokens,
        cache_read_tokens: o.cached_input_tokens,
        cache_write_tokens: o.cache_write_tokens,
        reasoning_tokens: o.reasoning_tokens,
    };
    let cost = route.map(Prices::cost).unwrap_or_default();
    Some(Metered::priced(
        &usage,
        o.usage_estimated,
        &Prices::sell(model),
        &cost,
    ))
}

/// Text is tokenized in pieces of about this many bytes (cut before whitespace, so that a
/// token is rarely split): the most one stream's estimator holds.
pub const ESTIMATE_CHUNK_BYTES: usize = 1024;

/// One full piece in this many is tokenized; the others are counted at the tokens per byte
/// of the tokenized ones (the tokenizer costs about 1 µs a byte, far more than relaying
/// the byte, and the estimate is only needed for a stream that ends without usage).
pub const ESTIMATE_SAMPLE_EVERY: u64 = 8;

/// Counts the output tokens of a stream from its generated text, incrementally: text is
/// buffered up to [`ESTIMATE_CHUNK_BYTES`], a piece at a time, never kept. Pieces are cut
/// before whitespace, where `o200k_base` splits words anyway. A stream shorter than one
/// piece is tokenized exactly, and only if its count is asked for (it ended without
/// usage); of longer ones, the first piece and every [`ESTIMATE_SAMPLE_EVERY`]th are
/// tokenized and the rest scaled by their tokens per byte.
#[derive(Debug, Default)]
pub struct OutputEstimator {
    /// Text not counted yet (at most about [`ESTIMATE_CHUNK_BYTES`] + one delta).
    pending: String,
    /// Full pieces seen.
    pieces: u64,
    /// Bytes and tokens of the tokenized pieces.
    sampled_bytes: u64,
    sampled_tokens: u64,
    /// Bytes of the pieces counted by ratio.
    scaled_bytes: u64,
}

impl OutputEstimator {
    /// Adds generated text.
    pub fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.pending.push_str(text);
        if self.pending.len() < ESTIMATE_CHUNK_BYTES {
            return;
        }
        // Cut before the last whitespace (ASCII: a char boundary): `o200k_base` attaches a
        // space to the word after it. None: count it all.
        let cut = self
            .pending
            .rfind(|c: char| c.is_ascii_whitespace())
            .filter(|&i| i > 0)
            .unwrap_or(self.pending.len());
        let cut = if cut * 2 < self.pending.len() {
            // Whitespace only near the start: do not keep a big tail (a huge delta is
            // tokenized in bounded pieces by `text_tokens`).
            self.pending.len()
        } else {
            cut
        };
        if self.pieces.is_multiple_of(ESTIMATE_SAMPLE_EVERY) {
            self.sampled_tokens += tokens::text_tokens(&self.pending[..cut]);
            self.sampled_bytes += cut as u64;
        } else {
            self.scaled_bytes += cut as u64;
        }
        self.pieces += 1;
        self.pending.drain(..cut);
        if self.pending.capacity() > 2 * ESTIMATE_CHUNK_BYTES {
            self.pending.shrink_to(ESTIMATE_CHUNK_BYTES);
        }
    }

    /// The tokens of everything pushed (tokenizes the pending rest; call at the end).
    pub fn tokens(&mut self) -> u64 {
        if !self.pending.is_empty() {
            self.sampled_tokens += tokens::text_tokens(&self.pending);
            self.sampled_bytes += self.pending.len() as u64;
            self.pending.clear();
        }
        let scaled = if self.sampled_bytes == 0 {
            0
        } else {
            (self.scaled_bytes as f64 * self.sampled_tokens as f64 / self.sampled_bytes as f64)
                .round() as u64
        };
        self.sampled_tokens + scaled
    }
}

/// Keys whose string value is generated text, in Chat Completions chunks and bodies
/// (`content`, `reasoning_content`, `reasoning`, `refusal`, tool-call `arguments`) and
/// Anthropic Messages events and bodies (`text`, `thinking`, `partial_json`).
const TEXT_KEYS: [&[u8]; 8] = [
    b"\"content\"",
    b"\"reasoning_content\"",
    b"\"reasoning\"",
    b"\"refusal\"",
    b"\"arguments\"",
    b"\"text\"",
    b"\"thinking\"",
    b"\"partial_json\"",
];

/// Feeds the generated text of one upstream event's (or non-stream body's) JSON to `f`,
/// one string value at a time, unescaped. A byte scan for [`TEXT_KEYS`] followed by `:`
/// and a string (a quoted key inside string content has escaped quotes and never matches);
/// only values with escapes are decoded (with `serde_json`), others are passed as they
/// are. Anthropic's `tool_use` `input` object of a non-stream body is not text and is not
/// counted.
pub fn stream_text(data: &[u8], mut f: impl FnMut(&str)) {
    static FINDERS: OnceLock<Vec<Finder<'static>>> = OnceLock::new();
    let finders = FINDERS.get_or_init(|| TEXT_KEYS.iter().map(|k| Finder::new(*k)).collect());
    for finder in finders {
        for pos in finder.find_iter(data) {
            let rest = data.get(pos + finder.needle().len()..).unwrap_or_default();
            let Some(value) = member_string(rest) else {
                continue;
            };
            if value.contains(&b'\\') {
                // `value` is the quoted string, escapes and all.
                if let Ok(s) = serde_json::from_slice::<String>(value) {
                    f(&s);
                }
            } else if let Ok(s) = std::str::from_utf8(&value[1..value.len() - 1]) {
                f(s);
            }
        }
    }
}

/// After a quoted key: the quoted string value (quotes included) when `:` and a string
/// follow.
fn member_string(after_key: &[u8]) -> Option<&[u8]> {
    let ws = |s: &[u8]| s.iter().take_while(|b| b" \t\r\n".contains(b)).count();
    let s = &after_key[ws(after_key)..];
    let s = s.strip_prefix(b":")?;
    let s = &s[ws(s)..];
    if s.first() != Some(&b'"') {
        return None;
    }
    let mut escaped = false;
    for (i, &b) in s.iter().enumerate().skip(1) {
        if escaped {
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            return Some(&s[..=i]);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, read: u64, write: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: read,
            cache_write_tokens: write,
            reasoning_tokens: 0,
        }
    }

    #[test]
    fn prices_are_per_million_tokens_per_class_and_rounded_to_the_nano_dollar() {
        let p = Prices {
            input: 0.30,
            output: 1.20,
            cached_input: Some(0.075),
            cache_write: Some(0.375),
        };
        // 1M uncached input, 1M output.
        assert_eq!(p.usd(&usage(1_000_000, 1_000_000, 0, 0)), 1.5);
        // 1000 input of which 600 cache reads and 100 cache writes, 50 output:
        // 300 × 0.30 + 600 × 0.075 + 100 × 0.375 + 50 × 1.20 = 232.5 µUSD.
        assert_eq!(p.usd(&usage(1000, 50, 600, 100)), 0.000_232_5);
        // One token at the cached price: 7.5e-8 USD, kept exactly after rounding.
        assert_eq!(p.usd(&usage(1, 0, 1, 0)), 0.000_000_075);
        // Sums of many small amounts stay at the nano-dollar.
        let one = p.usd(&usage(7, 3, 2, 0));
        assert_eq!(
            round_usd(one * 1000.0),
            round_usd(p.usd(&usage(7000, 3000, 2000, 0)))
        );
        assert_eq!(p.usd(&Usage::default()), 0.0);
    }

    #[test]
    fn cache_prices_fall_back_to_the_input_price() {
        let p = Prices {
            input: 2.0,
            output: 8.0,
            cached_input: None,
            cache_write: None,
        };
        assert_eq!(
            p.usd(&usage(1000, 0, 400, 100)),
            p.usd(&usage(1000, 0, 0, 0))
        );
        assert_eq!(p.usd(&usage(1000, 0, 400, 100)), 0.002);
    }

    #[test]
    fn metered_prices_charge_and_cost_separately_and_keeps_the_classes() {
        let sell = Prices {
            input: 0.30,
            output: 1.20,
            cached_input: Some(0.075),
            cache_write: None,
        };
        let cost = Prices {
            input: 0.15,
            output: 0.60,
            cached_input: None,
            cache_write: None,
        };
        let mut u = usage(2000, 100, 1000, 0);
        u.reasoning_tokens = 40;
        let m = Metered::priced(&u, false, &sell, &cost);
        assert_eq!(m.usage(), u);
        assert_eq!(m.charge_usd, 0.000_495); // 1000×0.30 + 1000×0.075 + 100×1.20
        assert_eq!(m.cost_usd, 0.000_36); // 2000×0.15 + 100×0.60
        assert!(!m.estimated);
    }

    #[test]
    fn the_estimator_counts_like_the_whole_text_in_bounded_memory() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(200);
        let whole = tokens::text_tokens(&text);
        let mut e = OutputEstimator::default();
        // Deltas of a few characters, as a stream sends them.
        let mut max_pending = 0;
        for piece in text.as_bytes().chunks(7) {
            e.push(std::str::from_utf8(piece).unwrap());
            max_pending = max_pending.max(e.pending.capacity());
        }
        assert!(max_pending <= 4 * ESTIMATE_CHUNK_BYTES, "{max_pending}");
        let n = e.tokens();
        assert!(n.abs_diff(whole) * 100 <= whole, "{n} vs {whole}");
        // Short text (one piece) is counted exactly.
        let mut e = OutputEstimator::default();
        for w in ["Hello", " there,", " how", " are", " you?"] {
            e.push(w);
        }
        assert_eq!(e.tokens(), tokens::text_tokens("Hello there, how are you?"));
        // Varied text is estimated within a few per cent.
        let varied: String = (0..3000)
            .map(|i| {
                format!(
                    "{} ",
                    [
                        "alpha", "beta", "gamma", "delta", "epsilon", "of", "the", "Zürich",
                        "naïve", "42"
                    ][i * 7 % 10]
                )
            })
            .collect();
        let whole = tokens::text_tokens(&varied);
        let mut e = OutputEstimator::default();
        for piece in varied.split_inclusive(' ') {
            e.push(piece);
        }
        let n = e.tokens();
        assert!(n.abs_diff(whole) * 100 <= whole * 5, "{n} vs {whole}");
        // Text without whitespace is still counted (cut where it must be).
        let mut e = OutputEstimator::default();
        for _ in 0..500 {
            e.push("abcdefgh");
        }
        let n = e.tokens();
        let whole = tokens::text_tokens(&"abcdefgh".repeat(500));
        assert!(n.abs_diff(whole) <= 8, "{n} vs {whole}");
    }

    #[test]
    fn stream_text_finds_generated_text_of_both_dialects_and_unescapes_it() {
        let mut got = Vec::new();
        let chat = br#"{"id":"x","choices":[{"index":0,"delta":{"content":"Hel\"lo \u00e9"},"finish_reason":null}]}"#;
        stream_text(chat, |s| got.push(s.to_string()));
        assert_eq!(got, ["Hel\"lo é"]);
        got.clear();
        let args = br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#;
        stream_text(args, |s| got.push(s.to_string()));
        assert_eq!(got, ["{\"city\":"]);
        got.clear();
        let anthropic = br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi there"}}"#;
        stream_text(anthropic, |s| got.push(s.to_string()));
        assert_eq!(got, ["hi there"]);
        got.clear();
        // Values that are not strings, and the key inside a string, count nothing.
        let none =
            br#"{"type":"message_start","message":{"content":[],"usage":{"input_tokens":3}}}"#;
        stream_text(none, |s| got.push(s.to_string()));
        let quoted = br#"{"choices":[{"delta":{"role":"assistant"},"x":"say \"content\": no"}]}"#;
        stream_text(quoted, |s| got.push(s.to_string()));
        assert!(got.is_empty(), "{got:?}");
    }
}
