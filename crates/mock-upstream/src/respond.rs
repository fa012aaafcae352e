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
use super::tool_loop;
use super::wire::{self, BodyEncoder, Provider, ReplyMeta, SseStyle};
use super::MockState;

mod stream;

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
    /// OpenAI's `POST {prefix}/responses/input_tokens`.
    InputTokens,
    /// OpenAI's `POST {prefix}/responses/compact`.
    Compact,
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
    } else if req.method == "POST" && path.ends_with("/responses/input_tokens") {
        Kind::InputTokens
    } else if req.method == "POST" && path.ends_with("/responses/compact") {
        Kind::Compact
    } else if req.method == "POST" && path.ends_with("/messages/count_tokens") {
        Kind::CountTokens
    } else if req.method == "POST"
        && (path.ends_with("/chat/completions") || path.ends_with("/responses"))
    {
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
    if let (Kind::Chat(_) | Kind::CountTokens | Kind::InputTokens | Kind::Compact, Err(e)) =
        (kind, &parsed)
    {
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
    let mut behavior = per_request.merged_over(&state.default_behavior());
    if let (true, Some(body)) = (Behavior::flag(behavior.tool_loop), body.as_ref()) {
        record.tool_result = tool_loop::apply(&mut behavior, body);
    }

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
    let responses = matches!(kind, Kind::InputTokens | Kind::Compact)
        || (kind == Kind::Chat(Provider::OpenAi)
            && req.path().trim_end_matches('/').ends_with("/responses"));
    let id = behavior.id.clone().unwrap_or_else(|| match provider {
        Provider::OpenAi if responses => format!("resp_mock{serial:012}"),
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
        responses,
    };

    let tokens = if let Some(total) = behavior.total_bytes {
        Tokens::Bulk {
            total,
            chunk: bulk_chunk(),
        }
    } else if let Some(text) = &behavior.text {
        if Behavior::flag(behavior.restart_answer) {
            let so_far = body
                .as_ref()
                .map(wire::last_assistant_message)
                .unwrap_or_default();
            Tokens::List(wire::split_words(&format!("{so_far}{text}")))
        } else {
            Tokens::List(wire::split_words(text))
        }
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
    if let (Kind::Chat(_), Some(raw)) = (plan.kind, &b.answer_body) {
        // The `answer_body` knob: a success status over a body the client cannot parse.
        let ct = b.content_type.as_deref().unwrap_or("application/json");
        let h = base_headers(plan, ct);
        out.head(200, &h, Framing::Length(raw.len()), close).await?;
        write_body(out, raw.as_bytes(), b.split_mode()).await?;
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
        Kind::Chat(_)
            if (plan.stream || Behavior::flag(plan.behavior.stream_always))
                && !Behavior::flag(plan.behavior.json_always) =>
        {
            stream::stream(plan, out, close).await
        }
        Kind::CountTokens => {
            let body = wire::anthropic_token_count(plan.meta.prompt_tokens);
            write_answer(plan, out, close, abort, body.into_bytes()).await
        }
        Kind::InputTokens => {
            let body = super::responses::input_tokens(plan.meta.prompt_tokens);
            write_answer(plan, out, close, abort, body.into_bytes()).await
        }
        Kind::Compact => {
            let body = super::responses::compaction(&plan.meta);
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
        Provider::OpenAi if plan.meta.responses => super::responses::answer(&plan.meta, &text, n),
        Provider::OpenAi => wire::openai_completion(&plan.meta, &text, n),
        Provider::Anthropic if plan.meta.converse => {
            converse::answer(&plan.meta, &wire::anthropic_message(&plan.meta, &text, n))
        }
        Provider::Anthropic => wire::anthropic_message(&plan.meta, &text, n),
        Provider::Gemini => cloud::gemini_response(&plan.meta, &text, n),
    };
    let body = match &b.drift {
        Some(d) if !plan.meta.converse && plan.meta.provider != Provider::Gemini => d.apply(&body),
        _ => body,
    };
    let body = match b.choices {
        Some(n) if plan.meta.provider == Provider::OpenAi && !plan.meta.responses => {
            wire::with_choices(&body, n)
        }
        _ => body,
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
