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
//!   (a 1 KiB sample per stream) and no tokenizer work while the stream runs;
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
//! Classes priced (canonical [`crate::protocol::Usage`], where input includes the
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
//! [`crate::protocol::tokens::estimate_input_tokens`]),
//! output the larger of what the provider reported so far and the tokenizer count of the
//! text streamed.
//!
//! # Cancelled hedges
//!
//! An attempt that a hedge race cancelled (see `crate::engine::hedge`) delivered no event,
//! but its provider was sent the prompt and may bill it: it is metered apart from the
//! request's answer ([`Metered::cancelled_hedge`]), as `estimated` input tokens (the same
//! admission estimate, computed at most once per request) at its own route's input price,
//! output 0, charge 0. It is Sluice's cost only: budgets never see it.

use memchr::memmem::Finder;
use std::sync::OnceLock;
use std::time::Duration;

use crate::config::{Config, Model, Route};
use crate::outcome::Outcome;
use crate::protocol::{tokens, UpstreamDialect, Usage};

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
    /// Records one metering (a request's, or a cancelled hedge attempt's): tokens by kind, cost and charge.
    pub fn record_metrics(&self, tenant: &str, model: &str) {
        let m = self;
        // The pair's children, resolved once (created at 0 on its first metering; past
        // `server.metrics_max_series_per_family`, the overflow pair's).
        let series = crate::metrics::series::metering(tenant, model);
        for (counter, n) in series.tokens.iter().zip([
            m.input_tokens,
            m.output_tokens,
            m.cached_input_tokens,
            m.cache_write_tokens,
            m.reasoning_tokens,
        ]) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        if m.cost_usd > 0.0 {
            series.cost_usd.inc_by(m.cost_usd);
        }
        if m.charge_usd > 0.0 {
            crate::metrics::series::add_charge(&series, m.charge_usd);
        }
    }

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

    /// What an attempt cancelled by a hedge race likely cost Sluice ([`crate::proxy`]'s
    /// hedging): the provider was sent the prompt, so `input_tokens` (the request's input
    /// estimate) at the route's input price (`cost`); no output, since it delivered no
    /// event; `estimated`; never the tenant's: the charge is 0.
    pub fn cancelled_hedge(input_tokens: u64, cost: &Prices) -> Self {
        let usage = Usage {
            input_tokens,
            ..Usage::default()
        };
        Self::priced(&usage, true, &Prices::default(), cost)
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

/// The request's [`Metered`], or `None` when no provider answered (nothing was used) or the
/// request was a token count.
/// `standard_model` must name a configured model; the serving route is the one with the
/// outcome's provider and upstream model (cost 0 if a reload removed it: the config is the
/// request's pinned snapshot, so it cannot).
pub fn meter(config: &Config, standard_model: Option<&str>, o: &Outcome) -> Option<Metered> {
    if o.count_only {
        // A token count (`/v1/messages/count_tokens`) generates nothing and is not charged.
        return None;
    }
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
    // A timed-out attempt that answered nothing costs Sluice, never the tenant.
    let sell = if o.cost_only {
        Prices::default()
    } else {
        Prices::sell(model)
    };
    Some(Metered::priced(&usage, o.usage_estimated, &sell, &cost))
}

/// The generated text kept per stream as the tokenizer's sample, bytes: the most one
/// stream's estimator holds.
pub const ESTIMATE_SAMPLE_BYTES: usize = 1024;

/// Counts the output tokens of a stream from its generated text, incrementally and in
/// bounded memory and CPU: the first [`ESTIMATE_SAMPLE_BYTES`] of text are kept (cut
/// before whitespace, where `o200k_base` splits anyway), later text only counted in bytes.
/// Nothing is tokenized while the stream runs (the tokenizer costs about 1 µs a byte, far
/// more than relaying the byte, and the estimate is needed only for a stream that ends
/// without usage): [`tokens`](Self::tokens) tokenizes the sample, exact for an answer that
/// fits in it, and scales the rest by the sample's tokens per byte.
#[derive(Debug, Default)]
pub struct OutputEstimator {
    /// The sample: the first text, at most about [`ESTIMATE_SAMPLE_BYTES`].
    sample: String,
    /// The sample is complete; later text is only counted.
    full: bool,
    /// Bytes of text after the sample.
    rest_bytes: u64,
}

impl OutputEstimator {
    /// Adds one generated JSON string value: once the sample is full only its length is
    /// counted (no UTF-8 check, no unescaping).
    pub fn push_json(&mut self, value: JsonText<'_>) {
        if self.full {
            self.rest_bytes += value.raw_len() as u64;
        } else if let Some(t) = value.text() {
            self.push(&t);
        }
    }

    /// Adds generated text.
    pub fn push(&mut self, text: &str) {
        if self.full {
            self.rest_bytes += text.len() as u64;
            return;
        }
        let room = ESTIMATE_SAMPLE_BYTES.saturating_sub(self.sample.len());
        if text.len() <= room {
            self.sample.push_str(text);
            return;
        }
        // Fill the sample up to the last whitespace that fits (a char boundary), else to
        // the last char boundary; the rest is counted.
        let mut cut = room;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(ws) = text[..cut].rfind(|c: char| c.is_ascii_whitespace()) {
            cut = ws;
        }
        self.sample.push_str(&text[..cut]);
        self.rest_bytes += (text.len() - cut) as u64;
        self.full = true;
    }

    /// Bytes of text pushed so far (as they are in the JSON text after the sample): the
    /// running output measure of a stream (no tokenizer work).
    pub fn bytes(&self) -> u64 {
        self.sample.len() as u64 + self.rest_bytes
    }

    /// The estimated tokens of everything pushed (tokenizes the sample; call at the end).
    pub fn tokens(&self) -> u64 {
        let sampled = tokens::text_tokens(&self.sample);
        if self.rest_bytes == 0 || self.sample.is_empty() {
            // Text without a sample (a first delta over the sample size with no
            // whitespace): 4 bytes a token, the usual English ratio.
            return sampled + self.rest_bytes.div_ceil(4);
        }
        let per_byte = sampled as f64 / self.sample.len() as f64;
        sampled + (self.rest_bytes as f64 * per_byte).round() as u64
    }
}

/// One JSON string value as it is in the JSON text (quotes and escapes included).
#[derive(Debug, Clone, Copy)]
pub struct JsonText<'a>(&'a [u8]);

impl JsonText<'_> {
    /// Bytes of the value as written (escapes counted as written, quotes not).
    pub fn raw_len(&self) -> usize {
        self.0.len().saturating_sub(2)
    }

    /// The unescaped text: borrowed when it has no escapes, decoded with `serde_json`
    /// otherwise; `None` if it is not valid.
    pub fn text(&self) -> Option<std::borrow::Cow<'_, str>> {
        let inner = self.0.get(1..self.0.len().saturating_sub(1))?;
        if memchr::memchr(b'\\', inner).is_none() {
            return std::str::from_utf8(inner)
                .ok()
                .map(std::borrow::Cow::Borrowed);
        }
        serde_json::from_slice::<String>(self.0)
            .ok()
            .map(std::borrow::Cow::Owned)
    }
}

/// Feeds the generated text of one upstream JSON text of `dialect` (an SSE event's data,
/// or with `all` a whole non-stream body) to `f`, one string value at a time, as written
/// ([`JsonText`]). A byte scan for the dialect's text keys followed by `:` and a string (a
/// quoted key inside string content has escaped quotes and never matches; a value's end is
/// found with `memchr2`). Without `all` (a stream
/// event, which carries one delta) the scan stops at the first non-empty text member, so
/// a typical event costs one `memmem` search up to its delta. Anthropic's `tool_use`
/// `input` object of a non-stream body is not text and is not counted. The keys are the
/// dialect's own ([`UpstreamDialect::text_keys`]).
pub fn stream_text(
    dialect: UpstreamDialect,
    data: &[u8],
    all: bool,
    mut f: impl FnMut(JsonText<'_>),
) {
    // One finder set per upstream dialect (its own text keys), built on first use.
    static FINDERS: [OnceLock<Vec<Finder<'static>>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let Some(cell) = FINDERS.get(dialect as usize) else {
        return;
    };
    let finders = cell.get_or_init(|| {
        dialect
            .text_keys()
            .iter()
            .map(|k| Finder::new(*k))
            .collect()
    });
    for finder in finders {
        for pos in finder.find_iter(data) {
            let rest = data.get(pos + finder.needle().len()..).unwrap_or_default();
            let Some(value) = member_string(rest) else {
                continue;
            };
            if value.len() <= 2 {
                continue; // ""
            }
            f(JsonText(value));
            if !all {
                return;
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
    // Jump from quote or backslash to the next with `memchr2`: an escape skips one byte.
    let mut i = 1;
    while let Some(off) = memchr::memchr2(b'"', b'\\', s.get(i..)?) {
        let at = i + off;
        if s[at] == b'"' {
            return Some(&s[..=at]);
        }
        i = at + 2;
    }
    None
}

/// An attempt of a hedged pair that the race cancelled before its first event
/// (`crate::engine::hedge`). Its provider was sent the prompt, so at the request's end it is
/// metered apart ([`Metered::cancelled_hedge`]): a `hedge_cancelled` ledger row of its own
/// and Sluice's cost in the metrics, never the tenant's charge. Built only when a hedge
/// loses.
#[derive(Debug, Clone)]
pub struct CancelledHedge {
    /// The standard model whose route it was (the stage's model: the one asked for, or a
    /// fallback model).
    pub model: String,
    /// Its provider.
    pub provider: String,
    /// Its upstream model.
    pub upstream_model: String,
    /// Its route's cost prices, USD per million tokens (only the input price applies).
    pub prices: Prices,
    /// Attempt started → cancelled.
    pub ran: Duration,
    /// The request's fallback depth when the pair ran.
    pub fallback_depth: usize,
    /// The request's input-token estimate, filled in by
    /// `RequestCtx::fill_cancelled_hedges` where the request is at hand (0 before): the
    /// winner's input figure from its provider when it gave one before the commit, else
    /// Sluice's estimate.
    pub input_tokens: u64,
}

impl CancelledHedge {
    /// What it likely cost: its estimated input at its route's input price, charge 0.
    pub fn metered(&self) -> Metered {
        Metered::cancelled_hedge(self.input_tokens, &self.prices)
    }
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
    fn a_cancelled_hedge_costs_its_estimated_input_at_the_route_price_and_is_never_charged() {
        let cost = Prices {
            input: 2.5,
            output: 10.0,
            cached_input: Some(0.5),
            cache_write: None,
        };
        let m = Metered::cancelled_hedge(1200, &cost);
        assert_eq!((m.input_tokens, m.output_tokens), (1200, 0));
        assert_eq!(
            (
                m.cached_input_tokens,
                m.cache_write_tokens,
                m.reasoning_tokens
            ),
            (0, 0, 0)
        );
        assert!(m.estimated);
        assert_eq!(m.cost_usd, 0.003); // 1200 × 2.5 / 1e6
        assert_eq!(m.charge_usd, 0.0);
        assert_eq!(Metered::cancelled_hedge(0, &cost).cost_usd, 0.0);
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
    fn the_estimator_counts_from_a_bounded_sample() {
        // Short text (within the sample) is counted exactly.
        let mut e = OutputEstimator::default();
        for w in ["Hello", " there,", " how", " are", " you?"] {
            e.push(w);
        }
        assert_eq!(e.tokens(), tokens::text_tokens("Hello there, how are you?"));
        // Long text, in deltas of a few characters: bounded memory, close to the whole.
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(200);
        let whole = tokens::text_tokens(&text);
        let mut e = OutputEstimator::default();
        for piece in text.as_bytes().chunks(7) {
            e.push(std::str::from_utf8(piece).unwrap());
        }
        assert!(
            e.sample.capacity() <= 2 * ESTIMATE_SAMPLE_BYTES,
            "{}",
            e.sample.capacity()
        );
        let n = e.tokens();
        assert!(n.abs_diff(whole) * 100 <= whole * 2, "{n} vs {whole}");
        // Varied multi-byte text within a few per cent.
        let varied: String = (0..3000)
            .map(|i| {
                let w = [
                    "alpha",
                    "beta",
                    "gamma",
                    "of",
                    "the",
                    "Zürich",
                    "naïve",
                    "42",
                    "δέλτα",
                ];
                format!("{} ", w[i * 7 % w.len()])
            })
            .collect();
        let whole = tokens::text_tokens(&varied);
        let mut e = OutputEstimator::default();
        for piece in varied.split_inclusive(' ') {
            e.push(piece);
        }
        let n = e.tokens();
        assert!(n.abs_diff(whole) * 100 <= whole * 5, "{n} vs {whole}");
        // One huge delta without whitespace is still counted.
        let mut e = OutputEstimator::default();
        e.push(&"x".repeat(10_000));
        assert!(e.tokens() > 100);
    }

    #[test]
    fn stream_text_finds_generated_text_of_both_dialects_and_unescapes_it() {
        let mut got = Vec::new();
        let chat = br#"{"id":"x","choices":[{"index":0,"delta":{"content":"Hel\"lo \u00e9"},"finish_reason":null}]}"#;
        stream_text(UpstreamDialect::ChatCompletions, chat, false, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        assert_eq!(got, ["Hel\"lo é"]);
        got.clear();
        let args = br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#;
        stream_text(UpstreamDialect::ChatCompletions, args, false, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        assert_eq!(got, ["{\"city\":"]);
        got.clear();
        let anthropic = br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi there"}}"#;
        stream_text(UpstreamDialect::Messages, anthropic, false, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        assert_eq!(got, ["hi there"]);
        got.clear();
        // Values that are not strings, and the key inside a string, count nothing.
        let none =
            br#"{"type":"message_start","message":{"content":[],"usage":{"input_tokens":3}}}"#;
        stream_text(UpstreamDialect::Messages, none, true, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        stream_text(UpstreamDialect::ChatCompletions, none, true, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        let quoted = br#"{"choices":[{"delta":{"role":"assistant"},"x":"say \"content\": no"}]}"#;
        stream_text(UpstreamDialect::ChatCompletions, quoted, true, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        assert!(got.is_empty(), "{got:?}");
        // A whole body: every text member.
        let body = br#"{"content":[{"type":"text","text":"one"},{"type":"thinking","thinking":"two"},{"type":"text","text":"three"}]}"#;
        stream_text(UpstreamDialect::Messages, body, true, |s| {
            got.push(s.text().unwrap().into_owned())
        });
        assert_eq!(got, ["one", "three", "two"]);
    }
}
