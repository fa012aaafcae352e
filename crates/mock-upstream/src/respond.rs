//! Turning one parsed request into a response plan (effective behaviour, recorded entry)
//! and writing that response according to the behaviour knobs.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value;

use super::bedrock;
use super::behavior::{Behavior, Split};
use super::cloud;
use super::converse;
use super::google::{self, Publisher};
use super::h1::{Framing, Out, Request, Wr};
use super::record::{lock, RecordHandle, RequestRecord, BODY_COPY_LIMIT, SELECTED_HEADERS};
use super::wire::{self, BodyEncoder, Provider, ReplyMeta, SseStyle};
use super::MockState;

/// The data of the `malformed_event_after_tokens` event: JSON cut short (not one value).
const MALFORMED_EVENT_DATA: &str =
    r#"{"id":"mock-malformed","choices":[{"delta":{"content":"lost"}"#;

/// The model an Azure deployment answers with (its `model` member).
const AZURE_MODEL: &str = "gpt-4o-2024-08-06";
/// Size of one bulk content token in `total_bytes` mode, bytes.
const BULK_TOKEN_BYTES: usize = 1024;
/// Size of one write for large non-stream bodies, bytes.
const BODY_PIECE_BYTES: usize = 16 * 1024;

/// What endpoint a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat(Provider),
    /// Anthropic's `POST /v1/messages/count_tokens`.
    CountTokens,
    Models,
    NotFound,
}

/// Where the generated tokens come from.
#[derive(Debug, Clone)]
pub(crate) enum Tokens {
    List(Vec<String>),
    /// ~1 KiB tokens until `total` body bytes were written.
    Bulk {
        total: u64,
        chunk: String,
    },
}

/// Everything needed to write the response.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub kind: Kind,
    pub behavior: Behavior,
    pub stream: bool,
    pub meta: ReplyMeta,
    pub tokens: Tokens,
    /// Error response to send instead: (status, body).
    pub error: Option<(u16, String)>,
    /// Bedrock: the `x-amzn-ErrorType` of the error response.
    pub aws_error_type: Option<String>,
}

/// What the connection does after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// Response complete; connection reusable (if the request allows keep-alive).
    Keep,
    /// Close the connection gracefully.
    Close,
    /// Close abruptly (RST when `reset`).
    Abort { reset: bool },
    /// The peer is gone (write failed).
    PeerGone,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn classify(req: &Request) -> Kind {
    let path = req.path().trim_end_matches('/');
    let claude_on_vertex =
        google::vertex_call(req).is_some_and(|c| c.publisher == Publisher::Anthropic);
    if req.method == "POST" && claude_on_vertex {
        Kind::Chat(Provider::Anthropic)
    } else if req.method == "POST" && cloud::gemini_method(req).is_some() {
        Kind::Chat(Provider::Gemini)
    } else if req.method == "POST" && bedrock::invoke_method(req).is_some() {
        Kind::Chat(Provider::Anthropic)
    } else if req.method == "POST" && path.ends_with("/messages/count_tokens") {
        Kind::CountTokens
    } else if req.method == "POST" && path.ends_with("/chat/completions") {
        Kind::Chat(Provider::OpenAi)
    } else if req.method == "POST" && path.ends_with("/messages") {
        Kind::Chat(Provider::Anthropic)
    } else if req.method == "GET" && path.ends_with("/models") {
        Kind::Models
    } else {
        Kind::NotFound
    }
}

/// The log record of `req` (its parsed JSON `body`, if any).
pub(crate) fn make_record(req: &Request, body: &Option<Value>) -> RequestRecord {
    let mut headers = std::collections::BTreeMap::new();
    for (k, v) in &req.headers {
        if SELECTED_HEADERS.contains(&k.as_str()) {
            headers
                .entry(k.clone())
                .and_modify(|e: &mut String| {
                    e.push_str(", ");
                    e.push_str(v);
                })
                .or_insert_with(|| v.clone());
        }
    }
    let copy = &req.body[..req.body.len().min(BODY_COPY_LIMIT)];
    RequestRecord {
        method: req.method.clone(),
        path: req.target.clone(),
        headers,
        header_names: req.headers.iter().map(|(k, _)| k.clone()).collect(),
        all_headers: req.headers.clone(),
        model: body
            .as_ref()
            .and_then(|b| b.get("model"))
            .and_then(Value::as_str)
            .map(str::to_string),
        stream: body
            .as_ref()
            .and_then(|b| b.get("stream"))
            .and_then(Value::as_bool),
        body_bytes: req.body.len() as u64,
        body: String::from_utf8_lossy(copy).into_owned(),
        body_truncated: req.body.len() > BODY_COPY_LIMIT,
        ..RequestRecord::default()
    }
}

fn bulk_chunk() -> String {
    let words = ["lorem ", "ipsum ", "dolor ", "sit ", "amet "];
    let mut s = String::with_capacity(BULK_TOKEN_BYTES + 8);
    let mut i = 0;
    while s.len() < BULK_TOKEN_BYTES {
        s.push_str(words[i % words.len()]);
        i += 1;
    }
    s.truncate(BULK_TOKEN_BYTES);
    s
}

/// Build the plan for a provider request and append its record to the log.
#[expect(
    clippy::too_many_lines,
    reason = "every behaviour knob of the mock is decided here, in the order a request meets them"
)]
pub(crate) fn prepare(
    state: &MockState,
    req: &Request,
    conn_id: u64,
    conn_seq: u64,
) -> (RecordHandle, Plan) {
    let kind = classify(req);
    let azure = cloud::is_azure(req);
    // Vertex AI: publisher, model and method in the path, a bearer token it issued.
    let vertex = match kind {
        Kind::Chat(_) => google::vertex_call(req),
        _ => None,
    };
    // Gemini names the model and the stream choice in the path: (model, stream, alt=sse).
    let gemini = match kind {
        Kind::Chat(Provider::Gemini) => cloud::gemini_method(req),
        _ => None,
    };
    // Bedrock names the model and the stream choice in the path: (model, stream).
    let aws = match kind {
        Kind::Chat(Provider::Anthropic) => bedrock::invoke_method(req),
        _ => None,
    };
    let parsed: Result<Option<Value>, String> = if req.body.is_empty() {
        Ok(None)
    } else {
        serde_json::from_slice::<Value>(&req.body)
            .map(Some)
            .map_err(|e| format!("request body is not valid JSON: {e}"))
    };
    let body = parsed.as_ref().ok().cloned().flatten();
    // Demo mode copies nothing of the request into its (short-lived) record.
    let mut record = if state.demo {
        RequestRecord::default()
    } else {
        make_record(req, &body)
    };
    if let Some((model, stream, _)) = &gemini {
        if !state.demo {
            record.model = Some(model.clone());
            record.stream = Some(*stream);
        }
    }
    if let Some((model, stream)) = &aws {
        if !state.demo {
            record.model = Some(model.clone());
            record.stream = Some(*stream);
        }
    }
    if let Some(call) = vertex
        .as_ref()
        .filter(|c| c.publisher == Publisher::Anthropic)
    {
        record.model = Some(call.model.clone());
    }
    record.conn_id = conn_id;
    record.conn_seq = conn_seq;
    record.received_at_ms = state.now_ms();

    let provider = match kind {
        Kind::Chat(p) => p,
        Kind::CountTokens => Provider::Anthropic,
        _ => Provider::OpenAi,
    };
    let mut bad_request: Option<String> = None;
    if let (Kind::Chat(_) | Kind::CountTokens, Err(e)) = (kind, &parsed) {
        bad_request = Some(e.clone());
    }
    if kind == Kind::CountTokens && bad_request.is_none() {
        bad_request = wire::count_tokens_refusal(body.as_ref());
    }
    if let Some(call) = vertex
        .as_ref()
        .filter(|c| c.publisher == Publisher::Anthropic)
    {
        if bad_request.is_none() {
            bad_request = google::claude_body_refusal(call, body.as_ref());
        }
    }

    // Behaviour levels: body "mock" > x-mock-behavior header > process default. Demo mode
    // has the process default only: no client steers it.
    let mut per_request = Behavior::default();
    if !state.demo {
        if let Some(h) = req.header("x-mock-behavior") {
            match Behavior::from_json(h) {
                Ok(b) => per_request = b,
                Err(e) => bad_request = Some(format!("invalid x-mock-behavior header: {e}")),
            }
        }
        if let Some(m) = body.as_ref().and_then(|b| b.get("mock")) {
            match Behavior::deserialize(m) {
                Ok(b) => per_request = b.merged_over(&per_request),
                Err(e) => bad_request = Some(format!("invalid \"mock\" behavior: {e}")),
            }
        }
    }
    let behavior = per_request.merged_over(&state.default_behavior());

    // Failure decision.
    let mut error_status: Option<u16> = None;
    if let Some(n) = behavior.fail_first {
        let key = behavior
            .fail_key
            .clone()
            .unwrap_or_else(|| serde_json::to_string(&behavior).unwrap_or_default());
        let mut counters = lock(&state.fail_counters);
        let c = counters.entry(key).or_insert(0);
        if *c < n {
            *c += 1;
            error_status = Some(behavior.status.unwrap_or(503));
        }
    } else if let Some(s) = behavior.status {
        if !(200..300).contains(&s) {
            error_status = Some(s);
        }
    }

    // The cloud APIs' gates come first: their front ends answer before reading the body.
    let mut aws_error_type = None;
    let gate = if vertex.is_some() {
        google::vertex_gate(&lock(&state.google), req)
    } else if azure {
        cloud::azure_gate(req, behavior.api_key.as_deref())
    } else if gemini.is_some() {
        cloud::gemini_gate(req, behavior.api_key.as_deref())
    } else if aws.is_some() {
        bedrock::gate(req, body.as_ref(), std::time::SystemTime::now()).map(|(s, t, b)| {
            aws_error_type = Some(t);
            (s, b)
        })
    } else {
        None
    };
    if aws.is_some() && parsed.is_err() {
        // Bedrock checks the body itself (the gate): invalid JSON is its ValidationException.
        bad_request = None;
    }
    if let (Some((_, true, false)), None) = (&gemini, &bad_request) {
        bad_request =
            Some("mock upstream: streamGenerateContent is simulated with alt=sse only".into());
    }
    let error = if let Some(gate) = gate {
        Some(gate)
    } else if let Some(msg) = bad_request {
        Some((400, wire::error_body(provider, 400, &msg)))
    } else if kind == Kind::NotFound {
        Some((
            404,
            wire::error_body(
                provider,
                404,
                &format!("mock upstream: no route for {} {}", req.method, req.path()),
            ),
        ))
    } else if azure && Behavior::flag(behavior.content_filter) {
        Some((400, cloud::azure_content_filter_error()))
    } else {
        error_status.map(|s| {
            if aws.is_some() {
                aws_error_type = Some(
                    behavior
                        .error_type
                        .clone()
                        .unwrap_or_else(|| bedrock::error_type_for(s).to_string()),
                );
            }
            let body = match &behavior.error_body {
                Some(Value::String(raw)) => raw.clone(),
                Some(v) => v.to_string(),
                None if aws.is_some() => bedrock::error_body(
                    &behavior
                        .error_message
                        .clone()
                        .unwrap_or_else(|| bedrock::default_message(s)),
                ),
                None => {
                    let msg = behavior
                        .error_message
                        .clone()
                        .unwrap_or_else(|| wire::default_error_message(provider, s));
                    // Vertex AI's front end answers quota, credential and unknown-model
                    // errors in Google's error model, whatever the model's dialect.
                    vertex
                        .as_ref()
                        .and_then(|_| google::platform_error(s, &msg))
                        .unwrap_or_else(|| {
                            wire::error_body_typed(
                                provider,
                                s,
                                &msg,
                                behavior.error_type.as_deref(),
                            )
                        })
                }
            };
            (s, body)
        })
    };

    let model = behavior.answer_model.clone().unwrap_or_else(|| {
        if let Some((m, _, _)) = &gemini {
            return m.clone();
        }
        if let Some((m, _)) = &aws {
            // Bedrock's Claude answers name the Anthropic model, not the Bedrock id.
            return m
                .rsplit_once("anthropic.")
                .map_or(m.as_str(), |(_, rest)| rest)
                .to_string();
        }
        if let Some(call) = &vertex {
            return call.model.clone();
        }
        if azure {
            // Azure echoes the deployment's model, not the deployment name.
            return AZURE_MODEL.to_string();
        }
        body.as_ref()
            .and_then(|b| b.get("model"))
            .and_then(Value::as_str)
            .unwrap_or("mock-model")
            .to_string()
    });
    let stream = match (&gemini, &aws) {
        (Some((_, stream, _)), _) | (None, Some((_, stream))) => *stream,
        (None, None) => body
            .as_ref()
            .and_then(|b| b.get("stream"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    let include_usage = body
        .as_ref()
        .and_then(|b| b.pointer("/stream_options/include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let serial = state.next_id();
    let id = behavior.id.clone().unwrap_or_else(|| match provider {
        Provider::OpenAi => format!("chatcmpl-mock{serial:012}"),
        Provider::Anthropic => format!("msg_mock{serial:012}"),
        Provider::Gemini => format!("gmock{serial:012}"),
    });
    let tool_calls: Vec<wire::ToolCallOut> = behavior
        .tool_calls
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| wire::ToolCallOut {
            id: t.id.clone().unwrap_or_else(|| match provider {
                Provider::OpenAi => format!("call_mock{serial}_{i}"),
                Provider::Anthropic => format!("toolu_mock{serial}_{i}"),
                // Gemini's function calls carry no id.
                Provider::Gemini => String::new(),
            }),
            name: t.name.clone(),
            arguments: t.arguments_text(),
        })
        .collect();
    let extras = wire::Extras {
        reasoning: behavior
            .reasoning
            .as_deref()
            .map(wire::split_words)
            .unwrap_or_default(),
        signature: behavior
            .signature
            .clone()
            .unwrap_or_else(|| format!("mock-signature-{id}")),
        tool_calls,
    };
    let finish_reason = behavior.finish_reason.clone().unwrap_or_else(|| {
        match (provider, extras.tool_calls.is_empty()) {
            (Provider::OpenAi, true) => "stop",
            (Provider::OpenAi, false) => "tool_calls",
            (Provider::Anthropic, true) => "end_turn",
            (Provider::Anthropic, false) => "tool_use",
            (Provider::Gemini, _) => "STOP",
        }
        .to_string()
    });
    let prompt_tokens = behavior
        .prompt_tokens
        .unwrap_or_else(|| body.as_ref().map(wire::estimate_prompt_tokens).unwrap_or(1));
    // `prompt_cache`: a prefix seen before is read from the "cache".
    let cached_tokens = behavior.cached_tokens.or_else(|| {
        let body = body
            .as_ref()
            .filter(|_| Behavior::flag(behavior.prompt_cache))?;
        let (prefix, last_words) = wire::prompt_prefix(body)?;
        state
            .prompt_cache_hit(prefix)
            .then(|| prompt_tokens.saturating_sub(last_words))
    });
    let meta = ReplyMeta {
        provider,
        id,
        created: behavior.created.unwrap_or_else(now_unix),
        model,
        prompt_tokens,
        cached_tokens: cached_tokens.map(|n| n.min(prompt_tokens)),
        cache_write_tokens: behavior.cache_write_tokens.map_or(0, |n| {
            n.min(prompt_tokens - cached_tokens.unwrap_or(0).min(prompt_tokens))
        }),
        finish_reason,
        include_usage,
        // `usage: false` omits it even when asked (providers that never send usage);
        // Gemini always sends `usageMetadata`.
        usage_chunk: behavior
            .usage
            .unwrap_or(include_usage || provider == Provider::Gemini),
        extras,
        azure,
        bedrock: aws.is_some(),
        converse: aws.is_some() && bedrock::is_converse(req),
    };

    let tokens = if let Some(total) = behavior.total_bytes {
        Tokens::Bulk {
            total,
            chunk: bulk_chunk(),
        }
    } else if let Some(text) = &behavior.text {
        Tokens::List(wire::split_words(text))
    } else if behavior.tokens.is_none() && !meta.extras.tool_calls.is_empty() {
        // A tool-call answer without text.
        Tokens::List(Vec::new())
    } else if Behavior::flag(behavior.demo) {
        let said: String = body
            .as_ref()
            .map(wire::last_user_message)
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect();
        Tokens::List(wire::split_words(&format!(
            "Hello from Sluice's built-in demo provider. You said: {said}"
        )))
    } else {
        let n = behavior.tokens.unwrap_or(5);
        let utf8 = behavior.split_mode() == Split::MidUtf8;
        let invalid = Behavior::flag(behavior.invalid_utf8);
        Tokens::List(
            (0..n)
                .map(|i| {
                    if invalid {
                        format!("tok{i}{} ", wire::INVALID_UTF8_MARKER)
                    } else if utf8 {
                        format!("tök{i} ")
                    } else {
                        format!("tok{i} ")
                    }
                })
                .collect(),
        )
    };
    let tokens = match (tokens, behavior.big_token_bytes) {
        (Tokens::List(mut t), Some(n)) => {
            let big = "x".repeat(usize::try_from(n).unwrap_or(0));
            match t.first_mut() {
                Some(first) => *first = big,
                None => t.push(big),
            }
            Tokens::List(t)
        }
        (t, _) => t,
    };

    record.behavior = behavior.clone();
    let handle = state.push_record(record);
    (
        handle,
        Plan {
            kind,
            behavior,
            stream,
            meta,
            tokens,
            error,
            aws_error_type,
        },
    )
}

fn base_headers(plan: &Plan, content_type: &str) -> Vec<(String, String)> {
    let content_type = match (plan.meta.provider, content_type) {
        // Google's JSON answers name their charset.
        (Provider::Gemini, "application/json") => "application/json; charset=UTF-8",
        // Bedrock's streams are AWS event streams, not SSE.
        (_, "text/event-stream") if plan.meta.bedrock => "application/vnd.amazon.eventstream",
        (_, c) => c,
    };
    let mut h = vec![
        ("Content-Type".to_string(), content_type.to_string()),
        ("Server".to_string(), "sluice-mock-upstream".to_string()),
    ];
    match plan.meta.provider {
        Provider::OpenAi if plan.meta.azure => {
            h.push(("apim-request-id".into(), format!("req_{}", plan.meta.id)));
        }
        Provider::OpenAi => h.push(("x-request-id".into(), format!("req_{}", plan.meta.id))),
        Provider::Anthropic if plan.meta.bedrock => {
            h.push(("x-amzn-RequestId".into(), format!("req_{}", plan.meta.id)));
            if let Some(t) = &plan.aws_error_type {
                h.push(("x-amzn-ErrorType".into(), t.clone()));
            }
        }
        Provider::Anthropic => h.push(("request-id".into(), format!("req_{}", plan.meta.id))),
        Provider::Gemini => h.push(("Vary".into(), "Origin, X-Origin, Referer".into())),
    }
    if content_type.starts_with("text/event-stream") {
        h.push(("Cache-Control".into(), "no-cache".into()));
    }
    if let Some(extra) = &plan.behavior.headers {
        for (k, v) in extra {
            h.push((k.clone(), v.clone()));
        }
    }
    h
}

fn sleep_ms(ms: u64) -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(ms))
}

fn mark_mock_closed(rec: &RecordHandle) {
    lock(rec).mock_closed = true;
}

/// Write the response for `plan`. Peer-close watching is done by the caller.
pub(crate) async fn respond(
    state: &Arc<MockState>,
    plan: &Plan,
    rec: &RecordHandle,
    wr: &mut Wr,
    close: bool,
) -> After {
    let b = &plan.behavior;
    let stall_max = b.stall_max();
    let mut out = Out::new(
        wr,
        rec,
        state.start,
        Duration::from_millis(stall_max.max(1)),
    );
    match respond_inner(plan, &mut out, close).await {
        Ok(a) => {
            if matches!(a, After::Abort { .. }) || (a == After::Close && !lock(rec).completed) {
                mark_mock_closed(rec);
            }
            a
        }
        Err(e) => {
            log::debug!("mock upstream: write failed: {e}");
            super::record::mark_peer_closed(rec, state.now_ms());
            After::PeerGone
        }
    }
}

async fn respond_inner(plan: &Plan, out: &mut Out<'_>, close: bool) -> io::Result<After> {
    let b = &plan.behavior;
    let abort = After::Abort {
        reset: Behavior::flag(b.reset),
    };
    if let Some(ms) = b.first_byte_delay_ms {
        sleep_ms(ms).await;
    }
    if Behavior::flag(b.stall) {
        sleep_ms(b.stall_max()).await;
        return Ok(After::Close);
    }
    if let Some((status, body)) = &plan.error {
        let mut h = base_headers(plan, "application/json");
        if let Some(s) = b.retry_after_s {
            h.push(("Retry-After".into(), s.to_string()));
        }
        let mut body = body.as_bytes().to_vec();
        if let Some(name) = &b.content_encoding {
            let (enc, header) = BodyEncoder::for_name(name);
            if let Some(mut enc) = enc {
                let mut coded = enc.encode(&body)?;
                coded.extend_from_slice(&enc.finish()?);
                body = coded;
            }
            h.push(("Content-Encoding".into(), header));
        }
        out.head(*status, &h, Framing::Length(body.len()), close)
            .await?;
        write_body(out, &body, b.split_mode()).await?;
        out.finish().await?;
        return Ok(After::Keep);
    }
    match plan.kind {
        Kind::Models => {
            let models = b
                .models
                .clone()
                .unwrap_or_else(|| vec!["mock-model".to_string()]);
            let body = wire::model_list(&models);
            let h = base_headers(plan, "application/json");
            out.head(200, &h, Framing::Length(body.len()), close)
                .await?;
            write_body(out, body.as_bytes(), b.split_mode()).await?;
            out.finish().await?;
            Ok(After::Keep)
        }
        Kind::Chat(_) if plan.stream || Behavior::flag(plan.behavior.stream_always) => {
            stream(plan, out, close).await
        }
        Kind::CountTokens => {
            let body = wire::anthropic_token_count(plan.meta.prompt_tokens);
            write_answer(plan, out, close, abort, body.into_bytes()).await
        }
        _ => non_stream(plan, out, close, abort).await,
    }
}

async fn write_body(out: &mut Out<'_>, body: &[u8], split: Split) -> io::Result<()> {
    if split == Split::None {
        for piece in body.chunks(BODY_PIECE_BYTES) {
            out.piece(piece).await?;
        }
    } else {
        for piece in wire::split_pieces(body, split) {
            out.piece(piece).await?;
        }
    }
    Ok(())
}

async fn non_stream(
    plan: &Plan,
    out: &mut Out<'_>,
    close: bool,
    abort: After,
) -> io::Result<After> {
    let b = &plan.behavior;
    let (text, n) = match &plan.tokens {
        Tokens::List(t) => (t.concat(), t.len() as u64 + plan.meta.extras.tokens()),
        Tokens::Bulk { total, chunk } => {
            let n = (*total as usize).div_ceil(BULK_TOKEN_BYTES).max(1);
            (chunk.repeat(n), n as u64)
        }
    };
    let delay = b.token_delay().saturating_mul(n);
    if delay > 0 {
        sleep_ms(delay).await;
    }
    let body = match plan.meta.provider {
        Provider::OpenAi => wire::openai_completion(&plan.meta, &text, n),
        Provider::Anthropic if plan.meta.converse => {
            converse::answer(&plan.meta, &wire::anthropic_message(&plan.meta, &text, n))
        }
        Provider::Anthropic => wire::anthropic_message(&plan.meta, &text, n),
        Provider::Gemini => cloud::gemini_response(&plan.meta, &text, n),
    };
    write_answer(plan, out, close, abort, body.into_bytes()).await
}

/// Writes a non-stream JSON answer with the body knobs applied: invalid UTF-8, content
/// coding, write splitting, `first_event_delay_ms` (before the body),
/// `close_before_first_event`, and `drop_after_tokens` / `stall_after_tokens` (cut after
/// half of the body).
async fn write_answer(
    plan: &Plan,
    out: &mut Out<'_>,
    close: bool,
    abort: After,
    mut body: Vec<u8>,
) -> io::Result<After> {
    let b = &plan.behavior;
    if Behavior::flag(b.invalid_utf8) {
        body = wire::inject_invalid_utf8(&body);
    }
    let mut h = base_headers(plan, "application/json");
    if let Some(name) = &b.content_encoding {
        let (enc, header) = BodyEncoder::for_name(name);
        if let Some(mut enc) = enc {
            let mut coded = enc.encode(&body)?;
            coded.extend_from_slice(&enc.finish()?);
            body = coded;
        }
        h.push(("Content-Encoding".into(), header));
    }
    out.head(200, &h, Framing::Length(body.len()), close)
        .await?;
    if let Some(ms) = b.first_event_delay_ms {
        sleep_ms(ms).await;
    }
    if Behavior::flag(b.close_before_first_event) {
        return Ok(abort);
    }
    let half = &body[..body.len() / 2];
    if b.drop_after_tokens.is_some() {
        write_body(out, half, b.split_mode()).await?;
        return Ok(abort);
    }
    if b.stall_after_tokens.is_some() {
        write_body(out, half, b.split_mode()).await?;
        sleep_ms(b.stall_max()).await;
        return Ok(After::Close);
    }
    write_body(out, &body, b.split_mode()).await?;
    out.finish().await?;
    Ok(After::Keep)
}

/// One logical SSE event.
struct Ev {
    name: Option<&'static str>,
    data: String,
    /// A content token event.
    token: bool,
    /// Part of the prelude (before any content); stall/drop/error checks skip these.
    prelude: bool,
    /// The first finish event: stall/drop/error checks run before it too.
    first_finish: bool,
    /// The stream's terminator (`[DONE]`, `message_stop`), left out by `no_done`.
    terminator: bool,
}

impl Ev {
    fn new(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            name,
            data,
            token: false,
            prelude: false,
            first_finish: false,
            terminator: false,
        }
    }

    fn prelude(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            prelude: true,
            ..Ev::new(name, data)
        }
    }

    fn token(name: Option<&'static str>, data: String) -> Ev {
        Ev {
            token: true,
            ..Ev::new(name, data)
        }
    }
}

/// The content events of an answer with reasoning or tool calls, appended to `queue` in
/// the provider's order: reasoning, text, tool calls. Returns the index of the last
/// Anthropic content block, whose `content_block_stop` is left to [`finish_events`].
fn structured_events(
    m: &ReplyMeta,
    text: &[String],
    oa_name: Option<&'static str>,
    tool_first: bool,
    queue: &mut VecDeque<Ev>,
) -> usize {
    let x = &m.extras;
    if m.provider == Provider::Gemini {
        for w in &x.reasoning {
            queue.push_back(Ev::token(None, cloud::gemini_text_chunk(m, w, true)));
        }
        for t in text {
            queue.push_back(Ev::token(None, cloud::gemini_text_chunk(m, t, false)));
        }
        for (i, call) in x.tool_calls.iter().enumerate() {
            queue.push_back(Ev::token(None, cloud::gemini_call_chunk(m, i, call)));
        }
        return 0;
    }
    if m.provider == Provider::OpenAi {
        for w in &x.reasoning {
            queue.push_back(Ev::token(oa_name, wire::openai_reasoning_chunk(m, w)));
        }
        for t in text {
            queue.push_back(Ev::token(oa_name, wire::openai_token_chunk(m, t)));
        }
        for (i, call) in x.tool_calls.iter().enumerate() {
            let start = wire::openai_tool_start_chunk(m, i, call, tool_first && i == 0);
            queue.push_back(Ev::token(oa_name, start));
            for f in call.fragments() {
                let data = wire::openai_tool_arguments_chunk(m, i, f);
                queue.push_back(Ev::token(oa_name, data));
            }
        }
        return 0;
    }
    let delta = Some("content_block_delta");
    let mut blocks = Blocks::default();
    if !x.reasoning.is_empty() {
        let i = blocks.open(queue, false, wire::anthropic_thinking_start);
        for w in &x.reasoning {
            queue.push_back(Ev::token(delta, wire::anthropic_thinking_delta(i, w)));
        }
        queue.push_back(Ev::new(
            delta,
            wire::anthropic_signature_delta(i, &x.signature),
        ));
    }
    if !text.is_empty() {
        let i = blocks.open(queue, false, wire::anthropic_text_start);
        for t in text {
            queue.push_back(Ev::token(delta, wire::anthropic_text_delta(i, t)));
        }
    }
    for call in &x.tool_calls {
        let i = blocks.open(queue, true, |i| wire::anthropic_tool_start(i, call));
        // Anthropic starts a tool_use block's input with an empty fragment.
        queue.push_back(Ev::new(delta, wire::anthropic_json_delta(i, "")));
        for f in call.fragments() {
            queue.push_back(Ev::token(delta, wire::anthropic_json_delta(i, f)));
        }
    }
    blocks.open.unwrap_or(0)
}

/// Anthropic content block numbering while the content events are built.
#[derive(Default)]
struct Blocks {
    next: usize,
    open: Option<usize>,
}

impl Blocks {
    /// Stops the open block, starts the next one (`start` makes its `content_block_start`
    /// data from its index) and returns its index; a `ping` follows the first start, as
    /// Anthropic sends it.
    /// A `tool_use` start counts as a content token (`token`), as OpenAI's tool-call start.
    fn open(
        &mut self,
        queue: &mut VecDeque<Ev>,
        token: bool,
        start: impl FnOnce(usize) -> String,
    ) -> usize {
        if let Some(i) = self.open {
            queue.push_back(Ev::new(
                Some("content_block_stop"),
                wire::anthropic_block_stop(i),
            ));
        }
        let i = self.next;
        self.next += 1;
        queue.push_back(Ev {
            token,
            ..Ev::new(Some("content_block_start"), start(i))
        });
        if i == 0 {
            queue.push_back(Ev::prelude(Some("ping"), wire::ANTHROPIC_PING.to_string()));
        }
        self.open = Some(i);
        i
    }
}

/// The events that end a stream after `sent` content tokens: OpenAI the finish chunk,
/// the usage chunk (when asked for) and `[DONE]`; Anthropic the `content_block_stop` of
/// block `last_block`, `message_delta` and `message_stop`.
fn finish_events(
    m: &ReplyMeta,
    openai: bool,
    oa_name: Option<&'static str>,
    sent: u64,
    last_block: usize,
) -> VecDeque<Ev> {
    let mut evs = VecDeque::new();
    if m.provider == Provider::Gemini {
        // The last chunk carries the finish reason and the final usage; no terminator.
        evs.push_back(Ev {
            first_finish: true,
            ..Ev::new(None, cloud::gemini_finish_chunk(m, sent))
        });
        return evs;
    }
    if openai {
        evs.push_back(Ev::new(oa_name, wire::openai_finish_chunk(m)));
        if m.usage_chunk {
            evs.push_back(Ev::new(oa_name, wire::openai_usage_chunk(m, sent)));
        }
        evs.push_back(Ev::new(oa_name, "[DONE]".to_string()));
    } else {
        evs.push_back(Ev::new(
            Some("content_block_stop"),
            wire::anthropic_block_stop(last_block),
        ));
        evs.push_back(Ev::new(
            Some("message_delta"),
            wire::anthropic_message_delta(m, sent),
        ));
        evs.push_back(Ev::new(
            Some("message_stop"),
            wire::ANTHROPIC_MESSAGE_STOP.to_string(),
        ));
    }
    if let Some(first) = evs.front_mut() {
        first.first_finish = true;
    }
    if let Some(last) = evs.back_mut() {
        last.terminator = true;
    }
    evs
}

/// How stream bytes go on the wire: write splitting, invalid UTF-8 injection, a coding.
struct Wire {
    split: Split,
    invalid_utf8: bool,
    encoder: Option<BodyEncoder>,
    /// [`Split::Burst`]: bytes held for the next [`Wire::flush`].
    pending: Vec<u8>,
}

impl Wire {
    /// Writes one event's (or any) bytes.
    async fn write(&mut self, out: &mut Out<'_>, bytes: &[u8]) -> io::Result<()> {
        let injected;
        let mut bytes = bytes;
        if self.invalid_utf8 {
            injected = wire::inject_invalid_utf8(bytes);
            bytes = &injected;
        }
        let coded;
        if let Some(enc) = self.encoder.as_mut() {
            coded = enc.encode(bytes)?;
            bytes = &coded;
        }
        if self.split == Split::Burst {
            self.pending.extend_from_slice(bytes);
            return Ok(());
        }
        for piece in wire::split_pieces(bytes, self.split) {
            out.piece(piece).await?;
        }
        Ok(())
    }

    /// Writes what a burst holds, in one piece (before a pause, an abort or the end).
    async fn flush(&mut self, out: &mut Out<'_>) -> io::Result<()> {
        if !self.pending.is_empty() {
            out.piece(&self.pending).await?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Waits `ms`; with `ping_every` set, writes (and flushes) `ping` every that many ms in
    /// between: keepalive chatter during a pause, none at its end.
    async fn pause(
        &mut self,
        out: &mut Out<'_>,
        ms: u64,
        ping_every: Option<u64>,
        ping: &[u8],
    ) -> io::Result<()> {
        match ping_every {
            Some(every) if ms > 0 => {
                let every = every.max(1);
                let mut left = ms;
                while left > 0 {
                    let step = left.min(every);
                    sleep_ms(step).await;
                    left -= step;
                    if left > 0 {
                        self.write(out, ping).await?;
                        self.flush(out).await?;
                    }
                }
            }
            _ if ms > 0 => sleep_ms(ms).await,
            _ => {}
        }
        Ok(())
    }

    /// Ends the coded stream (its last bytes) and the body.
    async fn finish(&mut self, out: &mut Out<'_>) -> io::Result<()> {
        self.flush(out).await?;
        if let Some(enc) = self.encoder.take() {
            let tail = enc.finish()?;
            out.piece(&tail).await?;
        }
        out.finish().await
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "each provider's stream wire format, event by event, in one place"
)]
async fn stream(plan: &Plan, out: &mut Out<'_>, close: bool) -> io::Result<After> {
    let b = &plan.behavior;
    let m = &plan.meta;
    let abort = After::Abort {
        reset: Behavior::flag(b.reset),
    };
    let gemini = m.provider == Provider::Gemini;
    let style = SseStyle {
        // Google ends its SSE lines with CRLF.
        eol: if Behavior::flag(b.crlf) || (gemini && b.lone_cr.is_none() && b.crlf.is_none()) {
            "\r\n"
        } else if Behavior::flag(b.lone_cr) {
            "\r"
        } else {
            "\n"
        },
        no_space: Behavior::flag(b.no_space),
        multi_line: Behavior::flag(b.multi_line_data),
    };
    let openai = m.provider == Provider::OpenAi;
    let oa_name = if Behavior::flag(b.event_names) {
        Some("chunk")
    } else {
        None
    };

    let mut h = base_headers(plan, "text/event-stream");
    let mut wire = Wire {
        split: b.split_mode(),
        invalid_utf8: Behavior::flag(b.invalid_utf8),
        encoder: None,
        pending: Vec::new(),
    };
    if let Some(name) = &b.content_encoding {
        let (enc, header) = BodyEncoder::for_name(name);
        wire.encoder = enc;
        h.push(("Content-Encoding".into(), header));
    }
    // A keepalive with no content: Anthropic's `ping` event, an SSE comment for OpenAI.
    let aws = m.bedrock;
    // One event on the wire: SSE, or a Bedrock event-stream `chunk` message.
    let encode = |name: Option<&str>, data: &str| -> Vec<u8> {
        if m.converse {
            converse::stream_messages(m, name, data)
        } else if aws {
            bedrock_chunk(m, name, data)
        } else {
            wire::encode_event(name, data, style)
        }
    };
    let ping = if m.converse {
        // ConverseStream has no keepalive event.
        Vec::new()
    } else if aws {
        bedrock::chunk_message(wire::ANTHROPIC_PING)
    } else if openai || gemini {
        format!(": ping{}{}", style.eol, style.eol).into_bytes()
    } else {
        wire::encode_event(Some("ping"), wire::ANTHROPIC_PING, style)
    };
    out.head(200, &h, Framing::Chunked, close).await?;
    if let Some(ms) = b.first_event_delay_ms {
        // Keepalives also while the model has not started: a ping before `message_start`.
        wire.pause(out, ms, b.ping_interval_ms, &ping).await?;
    }
    if Behavior::flag(b.close_before_first_event) {
        return Ok(abort);
    }
    if aws && b.error_after_tokens == Some(0) {
        // Bedrock reports a failure before the model starts (throttling, say) as the
        // stream's first message: no `message_start` before it.
        let status = b.status.filter(|s| *s >= 400).unwrap_or(500);
        let name = b
            .error_type
            .clone()
            .unwrap_or_else(|| bedrock::exception_type_for(status).to_string());
        let msg = b
            .error_message
            .clone()
            .unwrap_or_else(|| bedrock::default_message(status));
        wire.write(out, &bedrock::exception_message(&name, &msg))
            .await?;
        wire.finish(out).await?;
        return Ok(After::Keep);
    }
    if Behavior::flag(b.bom) && !aws {
        wire.write(out, "\u{FEFF}".as_bytes()).await?;
    }

    let structured = !m.extras.is_empty();
    let text_tokens: &[String] = match &plan.tokens {
        Tokens::List(t) => t,
        Tokens::Bulk { .. } => &[],
    };
    // The events before the text tokens (and, for answers with reasoning or tool calls,
    // all content events); the text tokens of plain answers are generated lazily.
    let mut queue: VecDeque<Ev> = VecDeque::new();
    let tool_first = structured && m.extras.reasoning.is_empty() && text_tokens.is_empty();
    if m.azure {
        queue.push_back(Ev::prelude(oa_name, cloud::azure_prompt_filter_chunk()));
    }
    if gemini {
        // No prelude: the first chunk carries content.
    } else if openai {
        // An answer that starts with a tool call names the role in the tool call's chunk.
        if !tool_first {
            queue.push_back(Ev::prelude(oa_name, wire::openai_role_chunk(m)));
        }
    } else {
        queue.push_back(Ev::prelude(
            Some("message_start"),
            wire::anthropic_message_start(m),
        ));
        if !structured {
            queue.push_back(Ev::prelude(
                Some("content_block_start"),
                wire::anthropic_text_start(0),
            ));
            queue.push_back(Ev::prelude(Some("ping"), wire::ANTHROPIC_PING.to_string()));
        }
    }
    // The index of the last Anthropic content block: its `content_block_stop` is the
    // first finish event (as for a plain answer).
    let mut last_block = 0usize;
    if structured {
        last_block = structured_events(m, text_tokens, oa_name, tool_first, &mut queue);
    }

    let mut sent: u64 = 0;
    let mut malformed_sent = false;
    let mut finish: Option<VecDeque<Ev>> = None;
    loop {
        // Next event.
        let next = match queue.pop_front() {
            Some(ev) => Some(ev),
            None if finish.is_none() && !structured => {
                let next_token: Option<String> = match &plan.tokens {
                    Tokens::List(t) => t.get(sent as usize).cloned(),
                    Tokens::Bulk { total, chunk } => {
                        if out.body_written() < *total {
                            Some(chunk.clone())
                        } else {
                            None
                        }
                    }
                };
                next_token.map(|tok| {
                    if gemini {
                        Ev::token(None, cloud::gemini_text_chunk(m, &tok, false))
                    } else if openai {
                        Ev::token(oa_name, wire::openai_token_chunk(m, &tok))
                    } else {
                        Ev::token(
                            Some("content_block_delta"),
                            wire::anthropic_text_delta(0, &tok),
                        )
                    }
                })
            }
            None => None,
        };
        let ev = match next {
            Some(ev) => ev,
            None => {
                if Behavior::flag(b.no_finish) {
                    break;
                }
                let fin = finish
                    .get_or_insert_with(|| finish_events(m, openai, oa_name, sent, last_block));
                match fin.pop_front() {
                    Some(ev) if ev.terminator && Behavior::flag(b.no_done) => break,
                    Some(ev) => ev,
                    None => break,
                }
            }
        };

        if !ev.prelude && (ev.token || ev.first_finish) {
            if b.stall_after_tokens == Some(sent) {
                wire.flush(out).await?;
                sleep_ms(b.stall_max()).await;
                return Ok(After::Close);
            }
            if b.drop_after_tokens == Some(sent) {
                wire.flush(out).await?;
                return Ok(abort);
            }
            if b.error_after_tokens == Some(sent) {
                let status = b.status.filter(|s| *s >= 400).unwrap_or(500);
                let msg = b
                    .error_message
                    .clone()
                    .unwrap_or_else(|| wire::default_error_message(m.provider, status));
                if aws {
                    // An in-stream exception message ends a Bedrock stream.
                    let name = b
                        .error_type
                        .clone()
                        .unwrap_or_else(|| bedrock::exception_type_for(status).to_string());
                    let msg = b
                        .error_message
                        .clone()
                        .unwrap_or_else(|| bedrock::default_message(status));
                    wire.write(out, &bedrock::exception_message(&name, &msg))
                        .await?;
                    wire.finish(out).await?;
                    return Ok(After::Keep);
                }
                let data = if gemini {
                    cloud::gemini_error_chunk(status, &msg, b.error_type.as_deref())
                } else {
                    wire::error_body_typed(m.provider, status, &msg, b.error_type.as_deref())
                };
                let name = if gemini {
                    None
                } else if openai {
                    oa_name
                } else {
                    Some("error")
                };
                if Behavior::flag(b.comments) {
                    wire.write(out, &wire::encode_comment(style)).await?;
                }
                wire.write(out, &wire::encode_event(name, &data, style))
                    .await?;
                wire.finish(out).await?;
                return Ok(After::Keep);
            }
            if b.malformed_event_after_tokens == Some(sent) && !malformed_sent {
                malformed_sent = true;
                let name = if openai {
                    oa_name
                } else {
                    Some("content_block_delta")
                };
                wire.write(out, &wire::encode_event(name, MALFORMED_EVENT_DATA, style))
                    .await?;
            }
            if b.truncate_after_tokens == Some(sent) {
                let bytes = encode(ev.name, &ev.data);
                wire.write(out, &bytes[..bytes.len() / 2]).await?;
                wire.finish(out).await?;
                return Ok(After::Keep);
            }
        }
        if ev.token {
            let d = b.token_delay();
            if d > 0 {
                wire.flush(out).await?;
            }
            wire.pause(out, d, b.ping_interval_ms, &ping).await?;
        }
        if Behavior::flag(b.comments) && !aws {
            wire.write(out, &wire::encode_comment(style)).await?;
        }
        wire.write(out, &encode(ev.name, &ev.data)).await?;
        if ev.token {
            sent += 1;
        }
    }
    wire.finish(out).await?;
    Ok(After::Keep)
}

/// A Bedrock `chunk` message for one Anthropic event; `message_stop` carries Bedrock's
/// `amazon-bedrock-invocationMetrics` (token counts and latencies, ms) as the real service's
/// does.
fn bedrock_chunk(m: &ReplyMeta, name: Option<&str>, data: &str) -> Vec<u8> {
    if name == Some("message_stop") {
        let with_metrics = format!(
            r#"{{"type":"message_stop","amazon-bedrock-invocationMetrics":{{"inputTokenCount":{},"outputTokenCount":{},"invocationLatency":120,"firstByteLatency":35}}}}"#,
            m.prompt_tokens,
            m.extras.tokens()
        );
        return bedrock::chunk_message(&with_metrics);
    }
    bedrock::chunk_message(data)
}
