//! The protocol layer: every wire API Sluice speaks, converted to and from
//! one canonical model.
//!
//! This module owns:
//!
//! * the canonical model: [`Request`], [`Response`], [`StreamEvent`],
//!   [`Usage`], [`StopReason`] and the conversion error [`ProtocolError`];
//! * the two sides' dialects as two types, [`ClientDialect`] (what a client speaks) and
//!   [`UpstreamDialect`] (what a provider speaks), so an impossible pair does not exist;
//! * one module per wire API ([`ClientDialect`], [`UpstreamDialect`]), each owning its serde wire types
//!   and its converters: [`chat`] (OpenAI Chat Completions), [`messages`]
//!   (Anthropic Messages), [`responses`] (OpenAI Responses, both sides: the upstream side
//!   for a route with `routes[].api: responses`),
//!   [`gemini`] (the Gemini API's `generateContent`, upstream side only), [`converse`]
//!   (AWS Bedrock's `Converse` / `ConverseStream`, upstream side only);
//! * the dialect-agnostic entry points the proxy calls ([`decode_request`],
//!   [`encode_request`], [`decode_response`], [`encode_response`],
//!   [`decode_error_body`], [`error_body`], [`error_event`], [`heartbeat`], [`merge_usage`],
//!   [`StreamTranslator`]): the proxy never names a dialect's module;
//! * the canonical side of mid-stream continuation ([`continuation`]: the transcript of a
//!   client stream, the request that continues it, the splice of the continuation's events);
//! * the local input-token estimate of a canonical request ([`tokens`]); the
//!   token-count request, which only Anthropic's API has, is
//!   [`messages::count`] (the one dialect module the proxy names).
//!
//! A translation is *decode source dialect → canonical → encode target
//! dialect*; a stream translation does that event by event (a text delta goes
//! out as soon as it comes in, so TTFT is kept). A new dialect adds two
//! converters, never one per pair. The same dialect in and out is not
//! translated at all (the proxy's fast path: normalize + model rewrite); each
//! dialect module describes its own fast path and what its clients get from
//! Sluice itself ([`wire`]: [`FastPath`], [`ClientWire`]), so the layers above
//! read those descriptions instead of matching on a dialect.
//!
//! Canonical conventions: [`Usage::input_tokens`] is the *total* prompt size
//! (OpenAI's meaning, cached tokens included); Anthropic's `input_tokens`
//! excludes cache reads and writes, so the Messages converters add/subtract
//! them. Tool-call arguments are kept as the JSON text the model produced.
//!
//! **One answer per answer.** The canonical answer is one choice. An upstream answer with
//! more choices (Chat Completions `n` > 1, or a provider that adds one unasked) is
//! translated from the choice of `index` 0 only, whole answer and stream alike: the other
//! choices' text, tool calls and finish reasons are skipped (in a stream, the chunks and
//! chunk members of another index). A client of another dialect (Messages, Responses) has
//! no way to receive more than one; the same dialect in and out (Chat Completions to an
//! OpenAI-compatible route) passes every choice through untouched.
//!
//! # Fields per direction
//!
//! **Same dialect in and out is a passthrough** (Chat Completions → OpenAI-compatible or
//! Azure; Messages → Anthropic, Claude on Bedrock or Vertex AI; Responses → a route with
//! `api: responses` on OpenAI or Azure OpenAI): the client's JSON goes
//! upstream with only what the gateway owns changed (`model`; Sluice's own `provider` and
//! `models`; `stream_options.include_usage` when metering needs it; the provider's placement
//! rules: Bedrock and Vertex take the model and the stream choice in the path and need
//! `anthropic_version`, Bedrock refuses `metadata` and `service_tier`, which are dropped with
//! a record; Responses: `previous_response_id` left out and `store: false`, Sluice being the
//! store of record, and `include` gains `reasoning.encrypted_content` so that reasoning can
//! be given back, [`wire::Forwarding`]). A forwarded Responses stream keeps every event,
//! the model rewritten in `response.model`, usage read from the final
//! `response.completed` / `response.incomplete`; `response.failed` and `error` are in-band
//! errors. Every member, enum value, tool type, content block, role and answer event
//! Sluice does not know passes untouched (model rewritten, usage read); the drift property
//! tests (`tests/e2e/drift.rs`) hold this.
//!
//! A translation is tolerant and visible. At decode, a member, value, block, item or tool
//! type without a canonical counterpart is **dropped with a record** ([`Request::dropped`]:
//! its JSON path in the client's dialect and why); toward a target that cannot carry a
//! canonical member, [`dropped_toward`] adds it. The record reaches the client as the
//! `x-sluice-dropped` response header, the `sluice_dropped_fields_total` metric and an info
//! log line; `models.<id>.unsupported: refuse` turns it into a 400 naming the member instead
//! (the default is `drop`). "Harmless" drops (sampling hints, tracing labels, caching
//! hints) change nothing the client can see: a top-level member among them is still named
//! in the record (Codex's `include` and `prompt_cache_key`, say), a nested one
//! (`cache_control`, image `detail`, a message's `name`) is not. "Refused" is a 400 naming the field
//! ([`ProtocolError::Unsupported`]) whatever the policy: the request cannot mean anything
//! without it.
//!
//! | source → target | mapped | dropped (harmless) | dropped with a record | refused (400) |
//! |---|---|---|---|---|
//! | Chat → canonical | messages of every role (system/developer anywhere join the system prompt), function tools, `tool_choice`, `reasoning_effort` (none…xhigh, and max), `response_format`, `web_search_options` ([`WebSearch`]) | `seed`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `service_tier`, `store`, `prediction`, `metadata` (except via `user`), message `name`, `top_logprobs` without `logprobs` | unknown members, non-function tools (`custom`), an unknown `tool_choice` or effort | `n` > 1, `logprobs: true`, audio output, `functions`/`function_call`, role `function`, `input_audio` parts, `file` parts with a `file_id` |
//! | Messages → canonical | `thinking` (`enabled` budget, `adaptive`, `disabled`, `display: omitted`), `output_config.effort` (low…max), `output_config.format` / `output_format`, `system` messages anywhere in `messages`, custom tools, `web_search_*` server tools ([`WebSearch`]) | `top_k`, `cache_control`, `citations`, `service_tier`, `metadata` keys other than `user_id`, `redacted_thinking` blocks | other server tools, `mcp_servers`, `container`, unknown members, block types (`search_result`, `server_tool_use`, …), sources, thinking types, efforts and tool choices | a missing or non-integer `max_tokens`, malformed messages |
//! | Responses → canonical | conversation state before decoding ([`crate::conversation`], for every target and across fallback): `previous_response_id` → the stored chain's input and output items, oldest first, ahead of `input` (`instructions` not carried over); `item_reference` → the stored item; both by the virtual key's tenant (another tenant's id is answered as an unknown one: OpenAI's 400 naming `previous_response_id`, 404 for an item); `store` (default `true`) → what the client receives is stored; `function`, `namespace` (flattened to `{namespace}__{name}`, named back on the way out) and `custom` tools (one string parameter `input`, given back as `custom_tool_call`), `web_search` ([`WebSearch`]), `reasoning.effort` (none…xhigh, and max), `text.format`, developer/system items anywhere | `include`, `truncation`, `service_tier`, `store: false`, `stream_options`, `reasoning.summary`, `prompt_cache_key`, `safety_identifier`, `text.verbosity`, image `detail`, `top_logprobs` | other hosted tools (`file_search`, `code_interpreter`, …), `web_search` with `external_web_access: false`, unknown members, items (`web_search_call`, …), parts, roles, efforts and tool choices | `conversation` (the Conversations API), `background: true`, `prompt`, `file_id` images/files; with `response_store.enabled: false`, `previous_response_id`, `store: true` and `item_reference` items ("there is no response storage") |
//! | canonical → Chat (upstream) | effort as `reasoning_effort` (max → xhigh), structured output | thinking signatures and redacted thinking in history (OpenAI takes no reasoning input), document `title`, a tool result's `is_error` | web search (Chat has it only on OpenAI's search models) | images inside tool results, URL documents |
//! | canonical → Messages (upstream) | reasoning as adaptive thinking + `output_config.effort` (minimal → low) for current Claude, or a `thinking` budget (low 1024, medium 8192, high 24576, xhigh 32768, max 63999, capped below `max_tokens`) for Claude before 4.6 (`routes[].thinking` overrides; [`ThinkingForm`]); `display: omitted`; web search as the `web_search_20250305` server tool; structured output (see below) | temperature above 1 is clamped to 1; unsigned reasoning in history | see *Structured output* | — |
//! | canonical → Gemini (upstream) | reasoning as `thinkingConfig` (Gemini 3: `thinkingLevel`; 2.5: `thinkingBudget`, capped at 24576, Pro 32768; adaptive −1; disabled 0); web search as `googleSearch`; structured output | reasoning history and signatures, `parallel_tool_calls`, `user`, a tool's `strict`, document `title` | — | image or document URLs (Gemini takes them inline), a tool result whose call is not earlier in the conversation, images inside tool results other than inline ones |
//! | canonical → Responses (upstream) | system prompts as `instructions`; messages, tool calls and results as `message`, `function_call`, `function_call_output` items; signed reasoning as `reasoning` items (signature = `encrypted_content`) and `include: ["reasoning.encrypted_content"]` whenever reasoning is asked for or given back; effort as `reasoning.effort` (max → xhigh); web search as the hosted `web_search` tool; structured output as `text.format`; always `store: false` | unsigned reasoning in history (OpenAI takes back only its own encrypted reasoning), a tool result's `is_error`, Responses `custom`/`namespace` tools go as flattened functions | stop sequences (`stop`, `stop_sequences`: the API has none) | text as an image source |
//! | canonical → Converse (upstream) | Claude reasoning as `additionalModelRequestFields` (`thinking`, `output_config.effort`); a `toolConfig` synthesized from the history's calls (see below); structured output | `parallel_tool_calls`, `user`, a tool's `strict`; temperature above 1 is clamped to 1; call ids outside `[a-zA-Z0-9_-]{1,64}` are rewritten alike in calls and results | reasoning settings toward a model that is not Claude, web search, JSON mode | image or document URLs, image types other than png/jpeg/gif/webp, unsupported document types |
//! | Chat upstream → client | — | `logprobs`, `system_fingerprint`, `refusal` becomes text | — | — |
//! | Messages upstream → Chat client | — | thinking `signature` (Chat has no field for it), `redacted_thinking`, server tool blocks (`server_tool_use`, `web_search_tool_result`: their text answer passes) | — | — |
//! | Responses upstream → client | `output_text` (and `refusal`) as text, reasoning summaries as reasoning text with `encrypted_content` as its signature, `function_call` (namespaced ones as `{namespace}__{name}`) and `custom_tool_call` as tool calls; usage with `cached_tokens` and `reasoning_tokens`; `incomplete` for `max_output_tokens` / `content_filter` as those stops; `response.failed` and `error` as in-band errors | hosted tool items (`web_search_call`, …; their text answer passes), annotations, logprobs | — | — |
//! | Converse upstream → client | — | `metrics`, `trace`, `redactedContent` reasoning; the answer gets a Sluice id (`converse-…`) | — | — |
//! | Gemini upstream → client | — | `safetyRatings`, `citationMetadata`, `groundingMetadata`, `thoughtSignature`, `avgLogprobs`; function calls get Sluice ids (`call_…`) | — | — |
//! | any → Responses client | the Response object with every member the specification requires, the request's members echoed ([`responses::object`]); namespaced calls as `function_call` with `namespace`, custom calls as `custom_tool_call` | — (signatures travel as `encrypted_content`; a reasoning item without one has no such member) | — | — |
//! | any → Messages client | `display: omitted` honoured: thinking blocks keep their signature, no thinking text | — | — | — |
//!
//! ## Structured output
//!
//! Chat `response_format`, Responses `text.format` and Anthropic's `output_config.format`
//! (and the beta's top-level `output_format`, same shape;
//! <https://platform.claude.com/docs/en/build-with-claude/structured-outputs>) decode to
//! [`ResponseFormat`]; Anthropic's formats are JSON Schemas without a name, so theirs is
//! `output`. "Dropped with a record" means left out and named in [`dropped_toward`] (the
//! `x-sluice-dropped` header, or a 400 for a model configured `unsupported: refuse`). The
//! answer is the JSON as text in every direction.
//!
//! | canonical → target | JSON Schema | JSON mode (any object) |
//! |---|---|---|
//! | Chat | mapped: `response_format: {type: json_schema, json_schema: {name, schema, strict, description}}` | mapped: `{type: json_object}` |
//! | Messages | mapped: `output_config.format: {type: json_schema, schema}` beside `output_config.effort`; name and `strict` need no counterpart (Anthropic's output always follows the schema); a `description` is dropped with a record | dropped with a record (Anthropic's objects must close with `additionalProperties: false`, so no schema says "any object") |
//! | Gemini | mapped: `generationConfig.responseMimeType: application/json` + `responseJsonSchema` | mapped: `responseMimeType: application/json` |
//! | Converse | mapped: `outputConfig.textFormat: {type: json_schema, structure: {jsonSchema: {schema (a JSON string), name, description}}}` | dropped with a record (Converse has no JSON mode) |
//!
//! A Messages format of another type than `json_schema`, or with members other than `type`
//! and `schema`, is dropped with a record at decode; a `json_schema` format without a
//! schema object is a 400. `output_format` beside `output_config.format` is dropped with a
//! record (the latter wins).
//!
//! ## Converse tool history
//!
//! Bedrock refuses `toolUse`/`toolResult` blocks without a `toolConfig` (400 "The toolConfig
//! field must be defined when using toolUse and toolResult content blocks."). Toward
//! Converse, from every client dialect: a request with tool blocks and no tools (a
//! summarising or compaction turn) gets a synthesized `toolConfig`, one `toolSpec` per tool
//! the history calls (in order of first use) with the permissive schema `{"type":
//! "object", "properties": {}}` and no `toolChoice` (mapped). `tool_choice: none` (Converse
//! has none) leaves the tools out without tool blocks (mapped: no tools, no calls); with
//! tool blocks, only the tools the history calls go (the client's definitions where given),
//! without a `toolChoice`, and `tool_choice` is dropped with a record.
#![warn(missing_docs)]

mod bpe;
pub mod chat;
pub mod continuation;
pub mod converse;
pub mod gemini;
mod json;
pub mod messages;
pub mod responses;
mod scan;
pub mod seam;
pub mod tokens;
mod translate;
pub mod wire;

#[cfg(test)]
mod tests;

use std::borrow::Cow;

use bytes::BytesMut;

pub use translate::{StreamOptions, StreamTranslator};
pub use wire::{ClientWire, FastPath, GatewayErrorBody, InBandError};

/// A client dialect: the wire API a client speaks to Sluice. Only the pairs a client can
/// send exist: the Gemini API and Converse are no client dialects at all
/// ([`UpstreamDialect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientDialect {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
}

/// An upstream dialect: the wire API a provider speaks to Sluice. The Gemini API and
/// Converse are upstream only; Responses is spoken by a route that chooses it
/// (`routes[].api: responses` on an OpenAI or Azure OpenAI provider).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamDialect {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
    /// The Gemini API (`models/{model}:generateContent`), upstream side only.
    Gemini,
    /// AWS Bedrock's Converse API (`/model/{modelId}/converse`), upstream side only.
    Converse,
    /// OpenAI Responses (`POST /v1/responses`; Azure OpenAI's `/openai/v1/responses`).
    Responses,
}

impl ClientDialect {
    /// Short name for logs and metrics labels: `chat`, `messages`, `responses`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientDialect::ChatCompletions => "chat",
            ClientDialect::Messages => "messages",
            ClientDialect::Responses => "responses",
        }
    }

    /// The upstream dialect that is this very wire API (every client dialect is one some
    /// provider speaks).
    pub fn as_upstream(self) -> Option<UpstreamDialect> {
        match self {
            ClientDialect::ChatCompletions => Some(UpstreamDialect::ChatCompletions),
            ClientDialect::Messages => Some(UpstreamDialect::Messages),
            ClientDialect::Responses => Some(UpstreamDialect::Responses),
        }
    }

    /// Whether `upstream` is this same wire API (the pair that is not translated).
    pub fn same_as(self, upstream: UpstreamDialect) -> bool {
        self.as_upstream() == Some(upstream)
    }
}

impl UpstreamDialect {
    /// The members that carry generated text in this dialect's events and bodies, most
    /// frequent first (quoted keys; the output estimate of an answer without usage).
    pub fn text_keys(self) -> &'static [&'static [u8]] {
        match self {
            UpstreamDialect::ChatCompletions => chat::TEXT_KEYS,
            UpstreamDialect::Messages => messages::TEXT_KEYS,
            UpstreamDialect::Gemini => gemini::TEXT_KEYS,
            UpstreamDialect::Converse => converse::TEXT_KEYS,
            UpstreamDialect::Responses => responses::upstream::TEXT_KEYS,
        }
    }

    /// Short name for logs and metrics labels: `chat`, `messages`, `gemini`, `converse`,
    /// `responses` (the same label as the [`ClientDialect`] of the same API).
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamDialect::ChatCompletions => "chat",
            UpstreamDialect::Messages => "messages",
            UpstreamDialect::Gemini => "gemini",
            UpstreamDialect::Converse => "converse",
            UpstreamDialect::Responses => "responses",
        }
    }
}

// ---------------------------------------------------------------- request

/// The canonical inference request: what every client dialect decodes into
/// and every provider dialect encodes from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The model the client asked for (the standard model id; routing decides
    /// the upstream model).
    pub model: String,
    /// System prompts in order (Chat `system`/`developer` messages, Messages
    /// `system`, Responses `instructions` and system/developer items).
    pub system: Vec<String>,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// Function tools the model may call.
    pub tools: Vec<Tool>,
    /// How the model must use the tools; `None` = the provider's default.
    pub tool_choice: Option<ToolChoice>,
    /// `Some(false)` forbids parallel tool calls.
    pub parallel_tool_calls: Option<bool>,
    /// Maximum output tokens; `None` = not given (Messages needs a default).
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Stop sequences (empty = none).
    pub stop: Vec<String>,
    /// End-user id (Chat `user`, Messages `metadata.user_id`, Responses `user`).
    pub user: Option<String>,
    /// Reasoning settings.
    pub reasoning: Option<Reasoning>,
    /// Structured output format; `None` = plain text.
    pub response_format: Option<ResponseFormat>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Whether the client asked for usage in the stream (Chat
    /// `stream_options.include_usage`; always true for Messages and Responses).
    pub include_usage: bool,
    /// The dialect the request came in (names refused fields in its terms).
    pub source: Option<ClientDialect>,
    /// What the decoder could not carry into the canonical request: the client's JSON
    /// paths (`thinking.display`, `tools[2]`, …), each with why, in the order met. A
    /// translated request reports them ([`Dropped`]); the same dialect in and out is
    /// forwarded whole and drops nothing.
    pub dropped: Vec<Dropped>,
    /// Web search run by the provider itself (a hosted or server tool), when the client
    /// offered it.
    pub web_search: Option<WebSearch>,
    /// What a Responses client's Response object echoes of this request (set by the
    /// Responses decoder; `None` for the other dialects).
    pub responses_echo: Option<std::sync::Arc<responses::ResponsesEcho>>,
}

/// Web search that the provider runs itself (a hosted / server tool), with the settings the
/// dialects share. Decoded from OpenAI Responses `{"type":"web_search"}` (and
/// `web_search_preview`; <https://platform.openai.com/docs/guides/tools-web-search>), Chat
/// Completions `web_search_options`, Anthropic `{"type":"web_search_20250305"}`
/// (<https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/web-search-tool>); encoded
/// as Anthropic's server tool and Gemini's `{"googleSearch":{}}` tool
/// (<https://ai.google.dev/gemini-api/docs/google-search>). Chat Completions upstreams
/// (search only on OpenAI's search models) and Converse have none: dropped with a record.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WebSearch {
    /// Where the client asked for it (`tools[3]`, `web_search_options`): the path a drop
    /// record names.
    pub field: String,
    /// At most this many searches per request (Anthropic `max_uses`).
    pub max_uses: Option<u64>,
    /// Only these domains (Anthropic `allowed_domains`, Responses `filters.allowed_domains`).
    pub allowed_domains: Vec<String>,
    /// Never these domains (Anthropic `blocked_domains`).
    pub blocked_domains: Vec<String>,
    /// The user's approximate location: `city`, `region`, `country` (ISO 3166-1 alpha-2),
    /// `timezone` (IANA), as strings.
    pub user_location: Option<serde_json::Map<String, serde_json::Value>>,
}

impl WebSearch {
    /// The approximate location members of a dialect's `user_location` object (`{"type":
    /// "approximate", "city", …}`, or Chat's `{"approximate": {…}}`); `None` without any.
    pub fn location_from(
        v: Option<&serde_json::Value>,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        let v = v?;
        let o = v.get("approximate").unwrap_or(v).as_object()?;
        let m: serde_json::Map<String, serde_json::Value> = o
            .iter()
            .filter(|(k, val)| {
                matches!(k.as_str(), "city" | "region" | "country" | "timezone") && val.is_string()
            })
            .map(|(k, val)| (k.clone(), val.clone()))
            .collect();
        (!m.is_empty()).then_some(m)
    }

    /// A list of strings (`allowed_domains`); anything else is empty.
    pub fn strings(v: Option<&serde_json::Value>) -> Vec<String> {
        v.and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A member or value of a client's request that a translation leaves out: unknown to
/// Sluice, or without a counterpart on the target. The client sees it (response header
/// `x-sluice-dropped`), and so do the metrics and the log; a model configured with
/// `unsupported: refuse` answers 400 naming it instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// JSON path in the client's dialect (`tools[1]`, `output_config.format`, …).
    pub field: String,
    /// Why, in a few words (`hosted tool \`web_search\``, `unknown member`, …).
    pub reason: String,
}

/// The tools of a request that were not plain functions in the client's request, by
/// their canonical (flattened) name: what a client encoder needs to give their calls back in
/// the client's form. `None` (the common case, no allocation) when every tool is a function.
pub type ToolOrigins = Option<std::sync::Arc<[(String, ToolOrigin)]>>;

/// The origin of the tool named `name` in `origins` ([`ToolOrigin::Function`] when not
/// listed).
pub fn origin_of<'a>(origins: &'a ToolOrigins, name: &str) -> &'a ToolOrigin {
    static FUNCTION: ToolOrigin = ToolOrigin::Function;
    origins
        .as_deref()
        .and_then(|o| o.iter().find(|(n, _)| n == name))
        .map_or(&FUNCTION, |(_, o)| o)
}

/// What of a client's request its translated answer reflects: the form of its tools and
/// whether it wants reasoning text. Default (nothing to reflect) for a request that is not
/// translated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientEcho {
    /// The client's tool forms (Responses custom and namespaced tools).
    pub tool_origins: ToolOrigins,
    /// The client asked for no reasoning text (Anthropic `thinking.display: omitted`):
    /// reasoning reaches it as signatures only.
    pub omit_reasoning_text: bool,
    /// The Responses request members its Response object echoes (Responses clients only).
    pub responses: Option<std::sync::Arc<responses::ResponsesEcho>>,
}

impl Request {
    /// What the answer to this request reflects of it.
    pub fn echo(&self) -> ClientEcho {
        ClientEcho {
            tool_origins: self.tool_origins(),
            omit_reasoning_text: self.reasoning.is_some_and(|r| r.omit_text),
            responses: self.responses_echo.clone(),
        }
    }

    /// The request's [`ToolOrigins`].
    pub fn tool_origins(&self) -> ToolOrigins {
        let v: Vec<(String, ToolOrigin)> = self
            .tools
            .iter()
            .filter(|t| t.origin != ToolOrigin::Function)
            .map(|t| (t.name.clone(), t.origin.clone()))
            .collect();
        (!v.is_empty()).then(|| v.into())
    }

    /// Records that `field` was left out, and why.
    pub fn drop_field(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.dropped.push(Dropped {
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// An OpenAI `tool_choice` mode string (`auto`, `required`, `none`; Chat and Responses
    /// share them); another value is dropped with a record (`None`: the provider's default).
    pub(crate) fn openai_tool_mode(&mut self, mode: &str) -> Option<ToolChoice> {
        match mode {
            "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            "none" => Some(ToolChoice::None),
            other => {
                self.drop_field("tool_choice", format!("unknown value `{other}`"));
                None
            }
        }
    }

    /// Records an OpenAI `tool_choice` object of a type Sluice does not translate
    /// (`allowed_tools`, a hosted tool's, …).
    pub(crate) fn unknown_tool_choice(&mut self, v: &serde_json::Value) {
        let ty = v
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("?");
        self.drop_field(
            "tool_choice",
            format!("tool choice `{ty}` is not translated"),
        );
    }

    /// Sets the reasoning effort from an OpenAI effort value given at `field`
    /// (`reasoning_effort`, `reasoning.effort`); an unknown value is dropped with a record.
    pub(crate) fn openai_effort(&mut self, field: &str, effort: &str) {
        match Effort::parse(effort) {
            Some(e) => {
                self.reasoning = Some(Reasoning {
                    effort: Some(e),
                    ..Reasoning::default()
                });
            }
            None => self.drop_field(field, format!("unknown effort `{effort}`")),
        }
    }
}

/// Who speaks a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The user (also carries tool results).
    User,
    /// The model (text, reasoning, tool calls).
    Assistant,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Content, in order.
    pub parts: Vec<Part>,
}

/// Where an image or document comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An http(s) URL the provider fetches.
    Url(String),
    /// Inline base64 data.
    Base64 {
        /// MIME type, e.g. `image/png`, `application/pdf`.
        media_type: String,
        /// Base64 payload (no `data:` prefix).
        data: String,
    },
    /// Plain text (Anthropic `document` with a `text` source).
    Text(String),
}

/// One content part of a [`Message`].
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image.
    Image(Source),
    /// A document (PDF or text), where both sides have them.
    Document {
        /// The document.
        source: Source,
        /// File name or title, if any.
        title: Option<String>,
    },
    /// A tool call made by the assistant.
    ToolCall(ToolCall),
    /// The result of a tool call, sent by the user side.
    ToolResult {
        /// Id of the [`ToolCall`] this answers.
        call_id: String,
        /// Result content: text and image parts.
        content: Vec<Part>,
        /// Whether the tool failed (Anthropic `is_error`).
        is_error: bool,
    },
    /// Model reasoning (Anthropic thinking, Chat `reasoning_content`,
    /// Responses reasoning item). Never merged into the answer text.
    Reasoning {
        /// The reasoning text (may be empty for encrypted-only reasoning).
        text: String,
        /// Anthropic thinking `signature` / Responses `encrypted_content`.
        signature: Option<String>,
    },
}

/// A tool call: id, function name and its JSON arguments as text.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Call id (`call_…`, `toolu_…`); tool results refer to it.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments: a JSON object as text (`{}` when empty).
    pub arguments: String,
}

/// What form a canonical function tool had in the client's request, when not a plain
/// function: answers give its calls back in that form (Responses `custom_tool_call`, a
/// namespaced `function_call`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolOrigin {
    /// A function tool.
    #[default]
    Function,
    /// A Responses `custom` tool (free-form text input): a function with one string
    /// parameter, `input`.
    Custom,
    /// A function of a Responses `namespace` tool, flattened to `{namespace}__{name}`.
    Namespaced {
        /// The namespace's name.
        namespace: String,
        /// The function's own name.
        name: String,
    },
}

/// A function tool.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tool {
    /// Function name.
    pub name: String,
    /// Description for the model.
    pub description: Option<String>,
    /// JSON Schema of the arguments (an object).
    pub parameters: serde_json::Value,
    /// OpenAI `strict` (structured outputs for arguments).
    pub strict: Option<bool>,
    /// The tool's form in the client's request.
    pub origin: ToolOrigin,
}

/// How the model must use tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (Chat/Responses `auto`, Messages `auto`).
    Auto,
    /// The model must call some tool (`required` / Messages `any`).
    Required,
    /// No tool calls (`none`).
    None,
    /// The model must call this function.
    Function(String),
}

/// Reasoning effort levels: OpenAI's `reasoning_effort` / `reasoning.effort` (`none`,
/// `minimal`, `low`, `medium`, `high`, `xhigh`;
/// <https://platform.openai.com/docs/api-reference/chat/create#chat-create-reasoning_effort>)
/// and Anthropic's `output_config.effort` (`low`, `medium`, `high`, `xhigh`, `max`;
/// <https://platform.claude.com/docs/en/build-with-claude/effort>), in ascending order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effort {
    /// `none` (OpenAI): no reasoning.
    None,
    /// `minimal` (OpenAI).
    Minimal,
    /// `low`.
    Low,
    /// `medium`.
    Medium,
    /// `high`.
    High,
    /// `xhigh` (OpenAI's GPT-5.1-Codex-Max and later; Anthropic's Opus 4.7 and later).
    XHigh,
    /// `max` (Anthropic).
    Max,
}

impl Effort {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::None => "none",
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::XHigh => "xhigh",
            Effort::Max => "max",
        }
    }

    /// Parses a wire name of either vendor; `None` for a value Sluice does not know (the
    /// decoders record it as dropped, never refuse it).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Effort::None,
            "minimal" => Effort::Minimal,
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            "high" => Effort::High,
            "xhigh" => Effort::XHigh,
            "max" => Effort::Max,
            _ => return None,
        })
    }

    /// The value for OpenAI's `reasoning_effort` / `reasoning.effort`: `max` (Anthropic's
    /// alone) becomes `xhigh`, OpenAI's highest.
    pub fn openai(self) -> &'static str {
        match self {
            Effort::Max => Effort::XHigh.as_str(),
            e => e.as_str(),
        }
    }

    /// The value for Anthropic's `output_config.effort`, `None` for `none` (thinking is
    /// turned off instead): `minimal` becomes `low`, Anthropic's lowest.
    pub fn anthropic(self) -> Option<&'static str> {
        match self {
            Effort::None => None,
            Effort::Minimal => Some("low"),
            e => Some(e.as_str()),
        }
    }

    /// Anthropic thinking budget for this effort, in tokens (Anthropic's minimum budget is
    /// 1024; `none` is 0, thinking off).
    pub fn budget_tokens(self) -> u64 {
        match self {
            Effort::None => 0,
            Effort::Minimal | Effort::Low => 1024,
            Effort::Medium => 8192,
            Effort::High => 24576,
            Effort::XHigh => 32768,
            Effort::Max => 63999,
        }
    }

    /// The effort closest to an Anthropic thinking budget in tokens.
    pub fn from_budget(budget_tokens: u64) -> Self {
        match budget_tokens {
            0 => Effort::None,
            1..=2048 => Effort::Low,
            2049..=12288 => Effort::Medium,
            12289..=28672 => Effort::High,
            _ => Effort::XHigh,
        }
    }
}

/// Reasoning settings: an effort (OpenAI's, or Anthropic's `output_config.effort`), an
/// Anthropic budget, Anthropic's adaptive thinking, or reasoning explicitly disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reasoning {
    /// The effort, if the client gave one.
    pub effort: Option<Effort>,
    /// Anthropic `thinking.budget_tokens`, if the client gave one.
    pub budget_tokens: Option<u64>,
    /// Anthropic `thinking.type: disabled`.
    pub disabled: bool,
    /// Anthropic `thinking.type: adaptive`: the model decides when and how much to think
    /// (<https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking>).
    pub adaptive: bool,
    /// Anthropic `thinking.display: omitted`: the client wants no reasoning text (thinking
    /// blocks keep their signature, their text is empty).
    pub omit_text: bool,
}

impl Reasoning {
    /// The effort to send to an OpenAI-style provider: the client's, else the one closest
    /// to its budget; none when reasoning is disabled or adaptive without an effort (the
    /// provider's default).
    pub fn effort(&self) -> Option<Effort> {
        if self.disabled {
            return None;
        }
        self.effort.or(self.budget_tokens.map(Effort::from_budget))
    }

    /// The thinking budget to send to a provider that takes one (Anthropic's `enabled`
    /// form, Gemini's `thinkingBudget`): the client's, else its effort's; none when
    /// disabled, for effort `none`, or adaptive without an effort.
    pub fn budget(&self) -> Option<u64> {
        if self.disabled || self.effort == Some(Effort::None) {
            return None;
        }
        self.budget_tokens
            .or(self.effort.map(Effort::budget_tokens))
    }

    /// Whether the client turned reasoning off (`thinking.type: disabled`, effort `none`).
    pub fn off(&self) -> bool {
        self.disabled || self.effort == Some(Effort::None)
    }
}

/// Structured output format (Chat `response_format`, Responses `text.format`, Anthropic
/// `output_config.format`); what each target makes of it: the module docs' *Structured
/// output*.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema.
    JsonSchema {
        /// Schema name (`output` for an Anthropic client's, whose formats have none).
        name: String,
        /// The JSON Schema.
        schema: serde_json::Value,
        /// OpenAI `strict`.
        strict: Option<bool>,
        /// Description.
        description: Option<String>,
    },
}

// ---------------------------------------------------------------- response

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopReason {
    /// Natural end (`end_turn` / `stop` / Responses `completed`).
    #[default]
    EndTurn,
    /// Output limit hit (`max_tokens` / `length` / `incomplete: max_output_tokens`).
    MaxTokens,
    /// A stop sequence matched (`stop_sequence` / `stop`).
    StopSequence,
    /// The model called tools (`tool_use` / `tool_calls`).
    ToolUse,
    /// Content filtered or refused (`refusal` / `content_filter`).
    ContentFilter,
    /// Anthropic `pause_turn` (long-running server tool turn paused).
    PauseTurn,
}

/// Token counts of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Total prompt tokens, cached ones included (OpenAI's `prompt_tokens`).
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (part of `input_tokens`).
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache (Anthropic; part of `input_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`), when the provider says.
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input tokens that were neither read from nor written to the cache
    /// (Anthropic's `input_tokens`).
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cache_read_tokens)
            .saturating_sub(self.cache_write_tokens)
    }
}

/// One output item of a [`Response`].
#[derive(Debug, Clone, PartialEq)]
pub enum OutputItem {
    /// Answer text.
    Text(String),
    /// A tool call.
    ToolCall(ToolCall),
    /// Reasoning with its optional signature.
    Reasoning {
        /// Reasoning text.
        text: String,
        /// Signature / encrypted content.
        signature: Option<String>,
    },
}

/// The canonical non-streaming response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Response {
    /// Provider response id (without a dialect prefix added by Sluice).
    pub id: String,
    /// Creation time, Unix seconds.
    pub created: u64,
    /// Model id (the caller replaces it with the standard model).
    pub model: String,
    /// Output items in order.
    pub output: Vec<OutputItem>,
    /// Why generation stopped.
    pub stop_reason: StopReason,
    /// The stop sequence that matched, if the provider says.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

// ---------------------------------------------------------------- stream events

/// One canonical stream event, borrowing its strings from the upstream event
/// (no copy when the JSON string had no escapes).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent<'a> {
    /// The message begins: provider id, model, and the usage known so far
    /// (Anthropic sends input tokens here).
    Start {
        /// Provider response id.
        id: Cow<'a, str>,
        /// Provider model id (encoders write the standard model instead).
        model: Cow<'a, str>,
        /// Usage known at start.
        usage: Usage,
    },
    /// Answer text.
    TextDelta(Cow<'a, str>),
    /// Reasoning text.
    ReasoningDelta(Cow<'a, str>),
    /// The signature of the current reasoning block (Anthropic
    /// `signature_delta`).
    ReasoningSignature(Cow<'a, str>),
    /// A tool call begins. `index` counts tool calls from 0 in this response.
    ToolCallStart {
        /// Tool-call index (0, 1, … in order of appearance).
        index: u32,
        /// Call id.
        id: Cow<'a, str>,
        /// Function name.
        name: Cow<'a, str>,
    },
    /// A fragment of a tool call's JSON arguments.
    ToolArgumentsDelta {
        /// Tool-call index, as in [`StreamEvent::ToolCallStart`].
        index: u32,
        /// JSON text fragment.
        fragment: Cow<'a, str>,
    },
    /// Generation stopped.
    Stop {
        /// Why.
        reason: StopReason,
        /// The matched stop sequence, if known.
        stop_sequence: Option<Cow<'a, str>>,
    },
    /// Usage so far (cumulative, replaces earlier figures).
    Usage(Usage),
    /// The upstream stream ended normally (`[DONE]`, `message_stop`).
    End,
}

impl StreamEvent<'_> {
    /// Whether the event carries generated output (text, reasoning, a tool
    /// call or its arguments): what time-to-first-token waits for.
    pub fn is_content(&self) -> bool {
        matches!(
            self,
            StreamEvent::TextDelta(_)
                | StreamEvent::ReasoningDelta(_)
                | StreamEvent::ToolCallStart { .. }
                | StreamEvent::ToolArgumentsDelta { .. }
        )
    }
}

// ---------------------------------------------------------------- errors

/// Canonical error kinds, mapped to each dialect's error types and statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: malformed or unsupported request.
    InvalidRequest,
    /// 401.
    Authentication,
    /// 403 (and a provider's 402 billing error).
    Permission,
    /// 402: Sluice's own budget refusal (OpenAI `insufficient_quota`, Anthropic
    /// `billing_error`), e.g. a stream ended because its running charge would pass the
    /// tenant's budget.
    Billing,
    /// 404.
    NotFound,
    /// 413.
    RequestTooLarge,
    /// 429.
    RateLimit,
    /// 500 and other 5xx.
    Api,
    /// 529 / 503: provider overloaded.
    Overloaded,
    /// 504: the provider timed out.
    Timeout,
}

impl ErrorKind {
    /// The kind for an HTTP status.
    pub fn from_status(status: u16) -> Self {
        match status {
            401 => ErrorKind::Authentication,
            402 | 403 => ErrorKind::Permission,
            404 => ErrorKind::NotFound,
            413 => ErrorKind::RequestTooLarge,
            429 => ErrorKind::RateLimit,
            503 | 529 => ErrorKind::Overloaded,
            504 => ErrorKind::Timeout,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Api,
        }
    }

    /// Anthropic's error `type` for the kind (`overloaded_error`, ...).
    pub fn anthropic_type(self) -> &'static str {
        json::anthropic_type(self)
    }

    /// OpenAI's error `type` for the kind (`rate_limit_error`, `api_error`, ...).
    pub fn openai_type(self) -> &'static str {
        json::openai_type(self)
    }

    /// The canonical HTTP status of the kind (Anthropic's table).
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::Permission => 403,
            ErrorKind::Billing => 402,
            ErrorKind::NotFound => 404,
            ErrorKind::RequestTooLarge => 413,
            ErrorKind::RateLimit => 429,
            ErrorKind::Api => 500,
            ErrorKind::Overloaded => 529,
            ErrorKind::Timeout => 504,
        }
    }
}

/// A conversion failure: the client's fault (a 400 naming the field) or the
/// upstream's (malformed answer, or an error it reported).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The client's request is malformed; `field` is a JSON path such as
    /// `messages[2].content[0].image_url`.
    #[error("invalid `{field}`: {reason}")]
    InvalidRequest {
        /// JSON path of the offending field, in the client's dialect.
        field: String,
        /// Explanation.
        reason: String,
    },
    /// The request is valid but asks for something the target cannot do
    /// (e.g. `n` > 1 to Messages, `previous_response_id`).
    #[error("unsupported `{field}`: {reason}")]
    Unsupported {
        /// JSON path of the offending field, in the client's dialect.
        field: String,
        /// Explanation.
        reason: String,
    },
    /// The upstream's answer could not be parsed (a 502 for the client).
    #[error("malformed upstream response: {0}")]
    InvalidUpstream(String),
    /// The upstream reported an error (error body or in-stream error event).
    #[error("upstream error ({kind:?}): {message}")]
    Upstream {
        /// Canonical kind.
        kind: ErrorKind,
        /// The provider's message.
        message: String,
    },
}

impl ProtocolError {
    /// Whether the client caused it (answer 400 with [`field`](Self::field)).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            ProtocolError::InvalidRequest { .. } | ProtocolError::Unsupported { .. }
        )
    }

    /// The offending request field for client errors.
    pub fn field(&self) -> Option<&str> {
        match self {
            ProtocolError::InvalidRequest { field, .. }
            | ProtocolError::Unsupported { field, .. } => Some(field),
            _ => None,
        }
    }

    /// HTTP status for the client: 400 for client errors, 502 for a
    /// malformed upstream answer, the kind's status for upstream errors.
    pub fn status(&self) -> u16 {
        match self {
            ProtocolError::InvalidRequest { .. } | ProtocolError::Unsupported { .. } => 400,
            ProtocolError::InvalidUpstream(_) => 502,
            ProtocolError::Upstream { kind, .. } => kind.status(),
        }
    }

    /// The message for the client: the provider's own words for an
    /// upstream error, the full description otherwise.
    pub fn message(&self) -> String {
        match self {
            ProtocolError::Upstream { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The canonical error kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProtocolError::InvalidRequest { .. } | ProtocolError::Unsupported { .. } => {
                ErrorKind::InvalidRequest
            }
            ProtocolError::InvalidUpstream(_) => ErrorKind::Api,
            ProtocolError::Upstream { kind, .. } => *kind,
        }
    }
}

/// Whether `data` (an upstream event's data, say) is exactly one well-formed JSON value:
/// a validating, allocation-free pass ([`scan`]), strict as serde_json.
pub fn is_json(data: &[u8]) -> bool {
    scan::Scan::is_one_value(data)
}

/// Whether `data` has the structure of one JSON object or array: it opens with `{` or `[`
/// and closes with the matching bracket (whitespace around allowed), every string is
/// closed, and the brackets outside strings balance with nothing after the outer one.
/// Literals, numbers, commas and colons are not checked, so it is cheaper than
/// [`is_json`] (strings are skipped with `memchr`) and catches what a provider's
/// malformed event usually is: one cut short, or two run together. The stream pipe uses
/// it on events after the answer is committed, where a malformed event only passes
/// through and is counted.
pub fn is_balanced_json(data: &[u8]) -> bool {
    scan::is_balanced(data)
}

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

pub(crate) fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> ProtocolError {
    ProtocolError::Unsupported {
        field: field.into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------- entry points

/// What an upstream request needs besides the canonical request.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamOptions<'a> {
    /// The provider's model id (`upstream_model`).
    pub model: &'a str,
    /// Output limit sent when the client gave none and the dialect requires
    /// one (Messages `max_tokens`); configurable per model.
    pub default_max_tokens: u64,
    /// Ask a Chat Completions provider for the final usage of a stream
    /// (`stream_options.include_usage: true`); `providers.<id>.stream_usage`.
    pub stream_usage: bool,
    /// Where a Messages body names the model (ignored by the other dialects).
    pub placement: ModelPlacement,
    /// The form of Claude thinking settings (Messages, and Claude on Converse); `None`: by
    /// the model id ([`ThinkingForm::for_model`]).
    pub thinking: Option<ThinkingForm>,
}

/// The form a Claude model takes its thinking settings in
/// (<https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking>).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingForm {
    /// `thinking: {type: adaptive}` with `output_config.effort`: Claude 4.6 and later
    /// (required from Opus 4.7, where `type: enabled` is a 400).
    Adaptive,
    /// `thinking: {type: enabled, budget_tokens}`: Claude 4.5 and earlier.
    Budget,
}

impl ThinkingForm {
    /// The form a Claude model id takes: `budget` for the Claude 3 family and Claude 4
    /// up to 4.5 (`claude-3-7-sonnet-…`, `claude-sonnet-4-5-…`, `claude-opus-4-20250514`,
    /// their Bedrock `anthropic.` and Vertex `@` forms), `adaptive` for every later or
    /// unknown id (current models).
    pub fn for_model(model: &str) -> Self {
        let id = model.rsplit('/').next().unwrap_or(model);
        let Some(at) = id.find("claude-") else {
            return ThinkingForm::Adaptive;
        };
        let rest = &id[at + "claude-".len()..];
        if rest.starts_with("3") || rest.starts_with("instant") || rest.starts_with("2") {
            return ThinkingForm::Budget;
        }
        // `claude-{family}-{major}[-{minor}]…`: the minor is one or two digits (a date is
        // eight).
        let mut parts = rest.split(['-', '@', ':', '.']).skip(1);
        let major = parts.next().and_then(|p| p.parse::<u32>().ok());
        let minor = parts
            .next()
            .filter(|p| p.len() <= 2)
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0);
        match major {
            Some(m) if m < 4 || (m == 4 && minor < 6) => ThinkingForm::Budget,
            _ => ThinkingForm::Adaptive,
        }
    }
}

/// Where an upstream's Anthropic Messages body names the model, and so its top-level
/// shape: the one body-shaping mechanism, taken by the protocol encoder (the translated
/// path) and by [`crate::providers::passthrough_body_placed`] (a client's own body).
/// Anthropic's API takes `model` in the body; Claude on a cloud platform (Vertex AI's
/// `rawPredict`, Bedrock's `InvokeModel`) is named by the URL and wants the platform's
/// `anthropic_version` in the body instead, and on Bedrock no `stream` either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelPlacement {
    /// `model` in the body (Anthropic's API).
    #[default]
    Body,
    /// No `model` member; `anthropic_version` set to this value (e.g. `vertex-2023-10-16`).
    Path {
        /// The body's `anthropic_version`.
        anthropic_version: &'static str,
        /// Further top-level members the platform refuses, left out (Bedrock: `stream`,
        /// `metadata`, `service_tier`; none on Vertex AI).
        dropped: &'static [&'static str],
    },
}

/// Decodes a client request body of `dialect` into the canonical request.
/// Used only when the request is translated (the same dialect in and out is
/// forwarded as is).
///
/// # Errors
/// [`ProtocolError::InvalidRequest`]/[`ProtocolError::Unsupported`] naming the field;
pub fn decode_request(dialect: ClientDialect, body: &[u8]) -> Result<Request, ProtocolError> {
    match dialect {
        ClientDialect::ChatCompletions => chat::decode_request(body),
        ClientDialect::Messages => messages::decode_request(body),
        ClientDialect::Responses => responses::decode_request(body),
    }
}

/// What a translation of `req` to `upstream` leaves out: what the client's decoder could
/// not carry ([`Request::dropped`]) and what the target has no counterpart for (reasoning
/// settings toward a Converse model that is not Claude: they are model specific there;
/// stop sequences toward Responses; JSON mode toward Anthropic and Converse, and a schema's description toward Anthropic;
/// `tool_choice: none` toward Converse when the history has tool blocks). Empty when
/// nothing is left out.
pub fn dropped_toward(
    upstream: UpstreamDialect,
    req: &Request,
    opts: &UpstreamOptions<'_>,
) -> Vec<Dropped> {
    let mut out = req.dropped.clone();
    if let Some(ws) = &req.web_search {
        if matches!(
            upstream,
            UpstreamDialect::ChatCompletions | UpstreamDialect::Converse
        ) {
            out.push(Dropped {
                field: ws.field.clone(),
                reason: "the provider runs no hosted web search".into(),
            });
        }
    }
    if upstream == UpstreamDialect::Converse
        && req.reasoning.is_some()
        && !converse::takes_claude_thinking(opts.model)
    {
        let field = match req.source {
            Some(ClientDialect::Messages) => "thinking",
            Some(ClientDialect::Responses) => "reasoning",
            _ => "reasoning_effort",
        };
        out.push(Dropped {
            field: field.into(),
            reason: "reasoning settings are model specific on Converse".into(),
        });
    }
    if matches!(
        upstream,
        UpstreamDialect::Messages | UpstreamDialect::Converse
    ) {
        out.extend(messages::format_dropped(req, upstream));
    }
    if upstream == UpstreamDialect::Responses && !req.stop.is_empty() {
        let field = match req.source {
            Some(ClientDialect::Messages) => "stop_sequences",
            _ => "stop",
        };
        out.push(Dropped {
            field: field.into(),
            reason: "the Responses API has no stop sequences".into(),
        });
    }
    if upstream == UpstreamDialect::Converse && converse::tool_choice_dropped(req) {
        out.push(Dropped {
            field: "tool_choice".into(),
            reason: "Converse has no `none`; the tool history needs a toolConfig".into(),
        });
    }
    out
}

/// The `x-sluice-dropped` header value of `dropped`: the fields, comma-separated, at most
/// about 1 KiB (then `…`).
pub fn dropped_header(dropped: &[Dropped]) -> String {
    let mut s = String::new();
    for d in dropped {
        if s.len() > 1024 {
            s.push_str(", …");
            break;
        }
        if !s.is_empty() {
            s.push_str(", ");
        }
        // Header values are visible ASCII: a member name outside it is escaped.
        s.extend(d.field.chars().flat_map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                vec![c]
            } else {
                c.escape_unicode().collect()
            }
        }));
    }
    s
}

/// Encodes the canonical request as an upstream request body of `dialect`.
///
/// # Errors
/// [`ProtocolError::Unsupported`] for a field the target cannot carry.
pub fn encode_request(
    dialect: UpstreamDialect,
    req: &Request,
    opts: &UpstreamOptions<'_>,
) -> Result<Vec<u8>, ProtocolError> {
    match dialect {
        UpstreamDialect::ChatCompletions => chat::encode_request(req, opts),
        UpstreamDialect::Messages => messages::encode_request(req, opts),
        UpstreamDialect::Gemini => gemini::encode_request(req, opts),
        UpstreamDialect::Converse => converse::encode_request(req, opts),
        UpstreamDialect::Responses => responses::upstream::encode_request(req, opts),
    }
}

/// Decodes a non-streaming upstream response of `dialect`. `now_unix_s`
/// fills `created` when the dialect has no timestamp (Messages).
///
/// # Errors
/// [`ProtocolError::InvalidUpstream`] when unparseable,
/// [`ProtocolError::Upstream`] for an error body.
pub fn decode_response(
    dialect: UpstreamDialect,
    body: &[u8],
    now_unix_s: u64,
) -> Result<Response, ProtocolError> {
    match dialect {
        UpstreamDialect::ChatCompletions => chat::decode_response(body, now_unix_s),
        UpstreamDialect::Messages => messages::decode_response(body, now_unix_s),
        UpstreamDialect::Gemini => gemini::decode_response(body, now_unix_s),
        UpstreamDialect::Converse => converse::decode_response(body, now_unix_s),
        UpstreamDialect::Responses => responses::upstream::decode_response(body, now_unix_s),
    }
}

/// Merges one upstream `usage` object of `dialect` (its JSON bytes) into `into`, with all
/// token classes in the canonical convention (input includes cache reads and writes).
/// Chat Completions usage is final and replaces `into`; Anthropic Messages usage is
/// partial and cumulative (`message_start`, then `message_delta`) and replaces only the
/// fields it carries. Returns false (and leaves `into`) when the bytes are not a usage
/// object of that dialect. Gemini's `usageMetadata` (cumulative, final in the last chunk)
/// replaces `into`, and so does Converse's `usage` (final, in the answer or the stream's
/// `metadata` event) and Responses' `usage` (final, in the answer or the stream's
/// `response.completed` / `response.incomplete` snapshot).
pub fn merge_usage(dialect: UpstreamDialect, usage_json: &[u8], into: &mut Usage) -> bool {
    match dialect {
        UpstreamDialect::ChatCompletions => {
            match serde_json::from_slice::<chat::UsageIn>(usage_json) {
                Ok(u) => {
                    *into = u.canonical();
                    true
                }
                Err(_) => false,
            }
        }
        UpstreamDialect::Messages => {
            match serde_json::from_slice::<messages::UsageIn>(usage_json) {
                Ok(u) => {
                    u.merge_into(into);
                    true
                }
                Err(_) => false,
            }
        }
        UpstreamDialect::Gemini => match serde_json::from_slice::<gemini::UsageIn>(usage_json) {
            Ok(u) => {
                *into = u.canonical();
                true
            }
            Err(_) => false,
        },
        UpstreamDialect::Converse => {
            match serde_json::from_slice::<converse::UsageIn>(usage_json) {
                Ok(u) => {
                    *into = u.canonical();
                    true
                }
                Err(_) => false,
            }
        }
        UpstreamDialect::Responses => {
            match serde_json::from_slice::<responses::upstream::UsageIn>(usage_json) {
                Ok(u) => {
                    *into = u.canonical();
                    true
                }
                Err(_) => false,
            }
        }
    }
}

/// Encodes the canonical response as a client body of `dialect` (JSON).
/// The caller sets `resp.model` to the standard model first.
pub fn encode_response(dialect: ClientDialect, resp: &Response) -> Vec<u8> {
    encode_response_for(dialect, resp, &ClientEcho::default())
}

/// [`encode_response`] with what the answer reflects of its request ([`ClientEcho`]): tool
/// calls go back in the form the client's request gave the tool (Responses custom and
/// namespaced tools), and a Responses client's Response object echoes its request.
pub fn encode_response_for(dialect: ClientDialect, resp: &Response, echo: &ClientEcho) -> Vec<u8> {
    match dialect {
        ClientDialect::ChatCompletions => chat::encode_response(resp),
        ClientDialect::Messages => messages::encode_response(resp),
        ClientDialect::Responses => responses::encode_response_for(resp, echo),
    }
}

/// Reads an upstream error body (any status >= 400) of `dialect`: the
/// canonical kind (the body's type when known, else the status) and message.
pub fn decode_error_body(
    dialect: UpstreamDialect,
    status: u16,
    body: &[u8],
) -> (ErrorKind, String) {
    json::decode_error_body(dialect, status, body)
}

/// The JSON error body a client of `dialect` gets for `status`: Messages
/// `{"type":"error","error":{"type","message"}}`, Chat/Responses
/// `{"error":{"message","type","param","code"}}` (`code`: OpenAI's error code, e.g.
/// `invalid_api_key`, <https://platform.openai.com/docs/guides/error-codes>; Messages has none).
pub fn error_body(
    dialect: ClientDialect,
    status: u16,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Vec<u8> {
    json::error_body(dialect, status, message, param, code)
}

/// Appends the in-stream error event of `dialect` (sent after the response
/// was committed) to `out`. Messages: `event: error`; Chat: OpenAI's
/// `event: error` frame; Responses: see [`responses::StreamEncoder::error`].
/// Prefer [`StreamTranslator::error`] inside a translated stream (it keeps
/// Responses sequence numbers).
pub fn error_event(dialect: ClientDialect, kind: ErrorKind, message: &str, out: &mut BytesMut) {
    json::error_event(dialect, kind, message, 0, out)
}

/// [`error_event`] as the event numbered `sequence_number` of its stream (Responses events
/// are numbered; the other dialects ignore it): the gateway's error in a forwarded
/// Responses stream continues the provider's numbering.
pub fn error_event_at(
    dialect: ClientDialect,
    kind: ErrorKind,
    message: &str,
    sequence_number: u64,
    out: &mut BytesMut,
) {
    json::error_event(dialect, kind, message, sequence_number, out)
}

/// The idle heartbeat frame for a client of `dialect`: Messages clients get
/// `event: ping` (what Anthropic sends), the others an SSE comment.
pub fn heartbeat(dialect: ClientDialect) -> &'static [u8] {
    dialect.wire().heartbeat
}

/// Merges the usage of one upstream JSON text of `dialect` (an SSE event's data or a whole
/// non-stream body) into `into` ([`merge_usage`] on its `usage` object, found with one byte
/// scan, see [`crate::sse::usage_object`]). Returns whether a usage object was merged.
pub fn merge_chunk_usage(dialect: UpstreamDialect, data: &[u8], into: &mut Usage) -> bool {
    crate::sse::usage_object(data, |usage| merge_usage(dialect, usage, into))
}
