//! Metering: every ingress (Chat, Messages, Responses) × provider (OpenAI-compatible,
//! Anthropic) × stream or not records the mock provider's own usage exactly (all classes:
//! input with cache reads, output with reasoning), priced at the configured sell and cost
//! prices, the same streamed or not with prompt caching on; `include_usage` is asked for
//! upstream and its extra chunk removed for a client that did not ask; a stream that ends
//! without usage (client abort, upstream break) is estimated with the tokenizer; the
//! `sluice_tokens_total{tenant,model,kind}`, `sluice_cost_usd_total` and
//! `sluice_charge_usd_total` metrics add up.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{post_json, sse_events, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

/// Prompt tokens the mock reports, of which `CACHED` were read from its prompt cache and
/// (Anthropic only) `WRITTEN` written to it.
const PROMPT: u64 = 40;
const CACHED: u64 = 15;
const WRITTEN: u64 = 5;
/// Text tokens and reasoning words the mock answers with (one output token each).
const TOKENS: u64 = 6;
const REASONING: &str = "let me think";

/// Sell (model) and cost (route) prices, USD per million tokens:
/// (input, output, cached input, cache write).
type P = (f64, f64, f64, f64);
const GPT_SELL: P = (2.0, 8.0, 0.5, 2.0);
const GPT_COST: P = (1.0, 4.0, 0.25, 1.0);
const CLAUDE_SELL: P = (3.0, 15.0, 0.3, 3.75);
const CLAUDE_COST: P = (1.5, 7.5, 0.15, 1.875);

fn config(base_url: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  log_format: json\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-oa\n    health_check: {{enabled: false}}\n  claude:\n    kind: anthropic\n    base_url: {base_url}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/gpt:\n    input_usd_per_mtok: {}\n    output_usd_per_mtok: {}\n    cached_input_usd_per_mtok: {}\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n        input_usd_per_mtok: {}\n        output_usd_per_mtok: {}\n        cached_input_usd_per_mtok: {}\n  acme/claude:\n    input_usd_per_mtok: {}\n    output_usd_per_mtok: {}\n    cached_input_usd_per_mtok: {}\n    cache_write_usd_per_mtok: {}\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n        input_usd_per_mtok: {}\n        output_usd_per_mtok: {}\n        cached_input_usd_per_mtok: {}\n        cache_write_usd_per_mtok: {}\n",
        GPT_SELL.0,
        GPT_SELL.1,
        GPT_SELL.2,
        GPT_COST.0,
        GPT_COST.1,
        GPT_COST.2,
        CLAUDE_SELL.0,
        CLAUDE_SELL.1,
        CLAUDE_SELL.2,
        CLAUDE_SELL.3,
        CLAUDE_COST.0,
        CLAUDE_COST.1,
        CLAUDE_COST.2,
        CLAUDE_COST.3,
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Chat,
    Messages,
    Responses,
}

impl Client {
    fn path(self) -> &'static str {
        match self {
            Client::Chat => "/v1/chat/completions",
            Client::Messages => "/v1/messages",
            Client::Responses => "/v1/responses",
        }
    }

    fn headers(self, request_id: &str) -> Vec<(&'static str, String)> {
        let mut h = match self {
            Client::Messages => vec![
                ("x-api-key", KEY.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            Client::Chat | Client::Responses => vec![("authorization", format!("Bearer {KEY}"))],
        };
        h.push(("x-request-id", request_id.to_string()));
        h
    }

    /// A request in the client's dialect; Chat streams ask for usage only with `usage`.
    fn body(self, model: &str, stream: bool, text: &str, usage: bool) -> Value {
        match self {
            Client::Chat => {
                let mut b = json!({"model": model, "stream": stream,
                    "messages": [{"role": "user", "content": text}]});
                if stream && usage {
                    b["stream_options"] = json!({"include_usage": true});
                }
                b
            }
            Client::Messages => json!({"model": model, "stream": stream, "max_tokens": 1024,
                "messages": [{"role": "user", "content": text}]}),
            Client::Responses => json!({"model": model, "stream": stream, "input": text}),
        }
    }
}

/// Sends one request and returns (status, body bytes).
fn send(sluice: &Sluice, client: Client, body: &Value, stream: bool, id: &str) -> (u16, Vec<u8>) {
    let owned = client.headers(id);
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if stream {
        let mut r = StreamReader::open(sluice.addr, client.path(), &headers, &body.to_string());
        let status = r.status;
        (status, r.read_to_end(Duration::from_secs(10)))
    } else {
        let r = post_json(sluice.addr, client.path(), &headers, &body.to_string());
        (r.status, r.body)
    }
}

fn num(rec: &Value, key: &str) -> u64 {
    rec[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {rec}"))
}

fn usd(rec: &Value, key: &str) -> f64 {
    rec[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {rec}"))
}

/// Independent price arithmetic: (uncached input, cache reads, cache writes, output) at
/// (input, output, cached, cache write) USD per million tokens.
fn price(uncached: u64, cached: u64, written: u64, output: u64, p: P) -> f64 {
    (uncached as f64 * p.0 + cached as f64 * p.2 + written as f64 * p.3 + output as f64 * p.1) / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn every_ingress_and_provider_records_the_providers_usage_exactly_streamed_or_not() {
    let mock = Mock::start("{}");
    mock.set_behavior(
        &json!({"tokens": TOKENS, "prompt_tokens": PROMPT, "cached_tokens": CACHED,
                "cache_write_tokens": WRITTEN, "reasoning": REASONING})
        .to_string(),
    );
    let sluice = Sluice::start(&config(&mock.base_url()));
    let reasoning = REASONING.split_whitespace().count() as u64;
    let output = TOKENS + reasoning;
    let mut totals = [(0u64, 0u64, 0u64, 0u64, 0u64, 0.0f64, 0.0f64); 2];
    let mut n = 0;
    for (mi, model) in ["acme/gpt", "acme/claude"].into_iter().enumerate() {
        let anthropic = model == "acme/claude";
        for client in [Client::Chat, Client::Messages, Client::Responses] {
            let mut per_stream = Vec::new();
            for stream in [false, true] {
                n += 1;
                let id = format!("meter-{n}");
                let cell = format!("{client:?} → {model} stream={stream}");
                let body = client.body(model, stream, "hello there", true);
                let (status, bytes) = send(&sluice, client, &body, stream, &id);
                assert_eq!(status, 200, "{cell}: {}", String::from_utf8_lossy(&bytes));
                let rec = sluice.access_record(&id);
                assert_eq!(rec["outcome"], "ok", "{cell}: {rec}");
                assert_eq!(num(&rec, "input_tokens"), PROMPT, "{cell}: {rec}");
                assert_eq!(num(&rec, "cached_input_tokens"), CACHED, "{cell}: {rec}");
                // Cache writes are Anthropic's (OpenAI's usage has no such field).
                let written = if anthropic { WRITTEN } else { 0 };
                assert_eq!(num(&rec, "cache_write_tokens"), written, "{cell}: {rec}");
                assert_eq!(num(&rec, "output_tokens"), output, "{cell}: {rec}");
                // OpenAI-compatible providers report reasoning tokens; Anthropic does not.
                let want_reasoning = if anthropic { 0 } else { reasoning };
                assert_eq!(
                    num(&rec, "reasoning_tokens"),
                    want_reasoning,
                    "{cell}: {rec}"
                );
                assert_eq!(rec["estimated"], "false", "{cell}: {rec}");
                let (sell, cost) = if anthropic {
                    (CLAUDE_SELL, CLAUDE_COST)
                } else {
                    (GPT_SELL, GPT_COST)
                };
                let charge = usd(&rec, "charge_usd");
                let cost_usd = usd(&rec, "cost_usd");
                let uncached = PROMPT - CACHED - written;
                assert!(
                    close(charge, price(uncached, CACHED, written, output, sell)),
                    "{cell}: charge {charge}: {rec}"
                );
                assert!(
                    close(cost_usd, price(uncached, CACHED, written, output, cost)),
                    "{cell}: cost {cost_usd}: {rec}"
                );
                per_stream.push((charge, cost_usd));
                let t = &mut totals[mi];
                t.0 += PROMPT;
                t.1 += output;
                t.2 += CACHED;
                t.3 += want_reasoning;
                t.4 += written;
                t.5 += cost_usd;
                t.6 += charge;
            }
            // The same provider usage costs the same streamed or not (prompt caching on).
            assert_eq!(per_stream[0], per_stream[1], "{client:?} → {model}");
        }
    }
    // The metrics add up to the access log.
    let m = sluice.metrics();
    for (mi, model) in ["acme/gpt", "acme/claude"].into_iter().enumerate() {
        let t = totals[mi];
        let series = |kind: &str| {
            crate::harness::parse_metric(
                &m,
                &format!(r#"sluice_tokens_total{{kind="{kind}",model="{model}",tenant="t"}}"#),
            )
            .unwrap_or_else(|| panic!("{kind} {model}:\n{m}"))
        };
        assert_eq!(series("input"), t.0 as f64, "{model}");
        assert_eq!(series("output"), t.1 as f64, "{model}");
        assert_eq!(series("cached_input"), t.2 as f64, "{model}");
        assert_eq!(series("reasoning"), t.3 as f64, "{model}");
        assert_eq!(series("cache_write"), t.4 as f64, "{model}");
        let cost = crate::harness::parse_metric(
            &m,
            &format!(r#"sluice_cost_usd_total{{model="{model}",tenant="t"}}"#),
        )
        .expect("cost series");
        let charge = crate::harness::parse_metric(
            &m,
            &format!(r#"sluice_charge_usd_total{{model="{model}",tenant="t"}}"#),
        )
        .expect("charge series");
        assert!((cost - t.5).abs() < 1e-8, "{model}: {cost} vs {}", t.5);
        assert!((charge - t.6).abs() < 1e-8, "{model}: {charge} vs {}", t.6);
        assert!(charge > cost, "{model}: sell above cost");
    }
}

/// Data payloads of an SSE body (`[DONE]` included).
fn data_lines(bytes: &[u8]) -> Vec<String> {
    sse_events(bytes)
        .iter()
        .flat_map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn include_usage_is_asked_for_upstream_and_its_chunk_reaches_only_clients_that_asked() {
    let mock = Mock::start("{}");
    mock.set_behavior(
        &json!({"tokens": TOKENS, "prompt_tokens": PROMPT, "cached_tokens": CACHED}).to_string(),
    );
    let sluice = Sluice::start(&config(&mock.base_url()));

    // A client that did not ask: the upstream is asked, the client sees no usage chunk,
    // and the usage is still recorded exactly.
    let body = Client::Chat.body("acme/gpt", true, "hello there", false);
    let (status, bytes) = send(&sluice, Client::Chat, &body, true, "strip-1");
    assert_eq!(status, 200);
    let log = mock.log();
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("json");
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    let data = data_lines(&bytes);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    for d in data.iter().filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).expect("chunk JSON");
        // Neither the usage chunk nor the `"usage":null` of the other chunks (which the
        // upstream adds once asked): the client gets what it would have got unasked.
        assert!(
            v.get("usage").is_none(),
            "usage reached a client that did not ask: {d}"
        );
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(1), "{d}");
    }
    let rec = sluice.access_record("strip-1");
    assert_eq!(num(&rec, "input_tokens"), PROMPT, "{rec}");
    assert_eq!(num(&rec, "cached_input_tokens"), CACHED, "{rec}");
    assert_eq!(num(&rec, "output_tokens"), TOKENS, "{rec}");
    assert_eq!(rec["estimated"], "false", "{rec}");

    // A client that asked gets the usage chunk as the provider sent it.
    mock.reset();
    let body = Client::Chat.body("acme/gpt", true, "hello there", true);
    let (status, bytes) = send(&sluice, Client::Chat, &body, true, "strip-2");
    assert_eq!(status, 200);
    let usage_chunks: Vec<Value> = data_lines(&bytes)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk JSON"))
        .filter(|v| v["usage"].is_object())
        .collect();
    assert_eq!(usage_chunks.len(), 1, "{}", String::from_utf8_lossy(&bytes));
    let u = &usage_chunks[0];
    assert_eq!(u["choices"], json!([]), "{u}");
    assert_eq!(u["usage"]["prompt_tokens"], PROMPT, "{u}");
    assert_eq!(u["usage"]["completion_tokens"], TOKENS, "{u}");
    assert_eq!(
        u["usage"]["prompt_tokens_details"]["cached_tokens"], CACHED,
        "{u}"
    );
    let rec = sluice.access_record("strip-2");
    assert_eq!(num(&rec, "input_tokens"), PROMPT, "{rec}");
    assert_eq!(num(&rec, "output_tokens"), TOKENS, "{rec}");
}

#[test]
fn a_provider_with_stream_usage_off_is_never_sent_stream_options_and_is_estimated() {
    let mock = Mock::start("{}");
    let text = long_text();
    let words = text.split_whitespace().count() as u64;
    mock.set_behavior(&json!({"text": text, "prompt_tokens": PROMPT}).to_string());
    let yaml = config(&mock.base_url()).replace(
        "    api_key: sk-provider-secret-oa\n",
        "    api_key: sk-provider-secret-oa\n    stream_usage: false\n",
    );
    let sluice = Sluice::start(&yaml);
    // The same dialect (passthrough) and a translated one (Messages → Chat).
    for (client, id) in [(Client::Chat, "off-chat"), (Client::Messages, "off-msg")] {
        mock.reset();
        let body = client.body("acme/gpt", true, "hello there", false);
        let (status, bytes) = send(&sluice, client, &body, true, id);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let log = mock.log();
        let sent: Value =
            serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("json");
        assert!(sent.get("stream_options").is_none(), "{client:?}: {sent}");
        assert_eq!(sent["stream"], true, "{sent}");
        let rec = sluice.access_record(id);
        assert_eq!(rec["estimated"], "true", "{client:?}: {rec}");
        // Common words, one token each for o200k_base too.
        let out = num(&rec, "output_tokens");
        assert!(
            out.abs_diff(words) <= 2,
            "{client:?}: {out} vs {words}: {rec}"
        );
        assert!(usd(&rec, "charge_usd") > 0.0, "{rec}");
    }
}

/// 120 distinct common words, one mock token each.
fn long_text() -> String {
    let words = [
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "runs",
        "far", "away",
    ];
    (0..120)
        .map(|i| format!("{} ", words[i % words.len()]))
        .collect()
}

#[test]
fn a_stream_without_usage_is_estimated_on_client_abort_and_on_upstream_break() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let text = long_text();
    let total_words = text.split_whitespace().count() as u64;
    // The admission estimate of the request below, with o200k_base: 3 reply-priming tokens,
    // 3 framing tokens for the message, 2 for "hello world".
    let admission_estimate = 3 + 3 + 2;

    for (model, client) in [
        ("acme/gpt", Client::Chat),
        ("acme/claude", Client::Messages),
    ] {
        // Client abort after some words.
        mock.set_behavior(
            &json!({"text": text, "token_delay_ms": 15, "prompt_tokens": PROMPT}).to_string(),
        );
        let id = format!("abort-{client:?}");
        let owned = client.headers(&id);
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = client.body(model, true, "hello world", false);
        let mut r = StreamReader::open(sluice.addr, client.path(), &headers, &body.to_string());
        assert_eq!(r.status, 200);
        // Read until about 20 content events arrived, then leave.
        let needle: &[u8] = if client == Client::Messages {
            b"text_delta"
        } else {
            b"\"content\":\""
        };
        let mut got = Vec::new();
        while got.windows(needle.len()).filter(|w| *w == needle).count() < 20 {
            match r.next_piece(Duration::from_secs(5)) {
                Some(p) => got.extend_from_slice(&p),
                None => break,
            }
        }
        r.close();
        let rec = sluice.access_record(&id);
        assert_eq!(rec["outcome"], "client_abort", "{rec}");
        assert_eq!(rec["estimated"], "true", "{rec}");
        let out = num(&rec, "output_tokens");
        assert!(
            (15..total_words).contains(&out),
            "{model}: {out} tokens estimated for ~20 streamed words of {total_words}: {rec}"
        );
        // Anthropic reported the input at message_start; the OpenAI stream reports nothing
        // before its end, so the admission estimate stands in.
        let want_input = if client == Client::Messages {
            PROMPT
        } else {
            admission_estimate
        };
        assert_eq!(num(&rec, "input_tokens"), want_input, "{model}: {rec}");
        assert!(usd(&rec, "charge_usd") > 0.0, "{rec}");

        // Upstream break after 30 words.
        mock.set_behavior(
            &json!({"text": text, "drop_after_tokens": 30, "prompt_tokens": PROMPT}).to_string(),
        );
        let id = format!("break-{client:?}");
        let (status, bytes) = send(
            &sluice,
            client,
            &client.body(model, true, "hello world", false),
            true,
            &id,
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let rec = sluice.access_record(&id);
        assert_eq!(rec["outcome"], "stream_error", "{rec}");
        assert_eq!(rec["estimated"], "true", "{rec}");
        let out = num(&rec, "output_tokens");
        assert!(
            (28..=34).contains(&out),
            "{model}: 30 words streamed, {out} estimated: {rec}"
        );
        assert_eq!(num(&rec, "input_tokens"), want_input, "{model}: {rec}");
    }
}
