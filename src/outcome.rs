//! Owns the record of how one request ended ([`Outcome`]): status, who answered, timings
//! and token usage. The proxy fills it in; billing, routing (affinity), admission and the
//! access log read it. It sits low in the module graph so that its readers need not know
//! the proxy's per-request context.

use std::time::Duration;

use tokio::time::Instant;

/// What finally happened, for the access log and metrics.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Final downstream status (0 = nothing was written).
    pub status: u16,
    /// Provider that answered, if any.
    pub provider: Option<String>,
    /// Upstream model that answered, if any.
    pub upstream_model: Option<String>,
    /// Label: `ok`, `client_abort`, an error's metric label, or `stream_error`.
    pub label: &'static str,
    /// Request received → first content event written downstream.
    pub ttft: Option<Duration>,
    /// Body bytes written downstream.
    pub bytes_out: u64,
    /// Input tokens, cached ones included (the provider's final `usage`, else the
    /// admission estimate; see `crate::billing::metering`).
    pub input_tokens: u64,
    /// Output tokens, reasoning included (the provider's final `usage`, else the tokenizer
    /// count of the text streamed).
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's prompt cache (part of `input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`), when the provider says.
    pub reasoning_tokens: u64,
    /// The token figures are Sluice's estimate: the answer ended without the provider's
    /// final usage.
    pub usage_estimated: bool,
    /// The answer ended without any input figure from the provider: `input_tokens` is to be
    /// the request's input estimate, filled in by [`Outcome::fill_input_estimate`] where the
    /// request is at hand (the tokenizer runs only for such answers; a committed stream's
    /// request keeps a sample of its prompt for it).
    pub input_unknown: bool,
    /// The upstream answered, then broke off (mid-stream error, broken body): the route
    /// is charged a failure although a response was written.
    pub upstream_broke: bool,
    /// No answer reached the client, but the provider of [`Outcome::provider`] was sent the
    /// prompt and worked on it until Sluice stopped waiting (a timed-out attempt, see
    /// [`crate::error::AttemptFailure::provider_worked`]): metered at the route's cost with
    /// the input estimate, never charged to the tenant.
    pub cost_only: bool,
    /// The request only counted tokens (`/v1/messages/count_tokens`): nothing was generated,
    /// so it stays out of the generation metrics (durations, TTFT, `sluice_tokens_total`).
    pub count_only: bool,
    /// When the first upstream attempt started (before its connect).
    pub upstream_started: Option<Instant>,
    /// When Sluice first held upstream output it could send: the read that brought the
    /// first data event (streams), or the end of the answer body (non-stream answers).
    pub upstream_first_event: Option<Instant>,
    /// The time Sluice itself added before the first byte of the answer
    /// (`sluice_gateway_overhead_seconds`, `x-sluice-overhead-ms`), set when the response
    /// head is written; see [`Outcome::overhead_at`].
    pub overhead: Option<Duration>,
    /// What the translation for the route that answered left out of the client's request
    /// (`x-sluice-dropped`: comma-separated JSON paths in the client's dialect); `None`
    /// when nothing was (always for the same dialect in and out).
    pub dropped: Option<String>,
    /// The public name of the model whose route answered (`x-sluice-served-model`): the
    /// route's `display_model`, else the standard model's id; set when an attempt commits,
    /// or when a provider's own error (a 4xx about the request) is the answer.
    pub served_model: Option<String>,
    /// How many times a client reattached to this resumable stream after its connection
    /// dropped (`GET /v1/streams/{id}`); 0 for every other request. The ledger's
    /// `resumptions` column.
    pub resumptions: u32,
}

impl Outcome {
    /// Sluice's own share of `elapsed` (request received → now, the first byte being
    /// written): `elapsed` minus the upstream's time (first upstream attempt started → first
    /// data event, or the whole non-stream body, received). That leaves admission, request
    /// parsing and translation before the first attempt, plus the time from holding the
    /// upstream's first event to writing it; failed attempts and fallbacks count as
    /// upstream time. `None` before the upstream sent anything.
    pub fn overhead_at(&self, elapsed: Duration) -> Option<Duration> {
        let upstream = self
            .upstream_first_event?
            .saturating_duration_since(self.upstream_started?);
        Some(elapsed.saturating_sub(upstream))
    }
}

impl Outcome {
    /// Sets `input_tokens` to `estimate()` (the parsed request's input estimate) when the
    /// answer ended without the provider's input figure ([`Outcome::input_unknown`]); else
    /// leaves it and never calls `estimate`.
    pub fn fill_input_estimate(&mut self, estimate: impl FnOnce() -> u64) {
        if std::mem::take(&mut self.input_unknown) {
            self.input_tokens = estimate();
        }
    }
}
