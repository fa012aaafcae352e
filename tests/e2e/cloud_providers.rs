//! The cloud provider kinds `azure_openai` and `gemini` (issue 13) over loopback with the
//! mock speaking their wire formats: Azure's deployments URL, `api-version` and `api-key`,
//! its content-filter annotations and `content_filter` 400; Gemini's
//! `:generateContent` / `:streamGenerateContent?alt=sse`, `x-goog-api-key`, `contents` /
//! `parts` bodies and Google's errors. Each kind answers Chat Completions and Messages
//! clients, streamed and not, with the standard model echoed, tools, metered usage, fallback
//! before the first byte (to the other kind), and a mid-stream error.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{post_json, sse_events, sse_text, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

/// The provider key both cloud kinds are configured with (and the mock accepts).
const CLOUD_KEY: &str = "cloud-key-7f3a";
const TEXT: &str = "héllo from the clöud";
/// The model the mock's Gemini answers with (differs from the upstream and standard ids).
const GEMINI_ANSWERED: &str = "gemini-2.5-flash-preview-05-20";

/// Providers `az` and `gm` on `good`, `az-bad` and `gm-bad` on `bad`, `gm-wrong-key` on
/// `good` with a key it rejects; models `acme/az`, `acme/gem`, and the fallback chains
/// `acme/gem-then-az`, `acme/az-then-gem`, `acme/wrong-key-then-az`, `acme/az-filter`.
fn config(good: &Mock, bad: &Mock) -> String {
    let g = format!("http://{}", good.addr);
    let b = format!("http://{}", bad.addr);
    format!(
        r#"server:
  listen: {{listen}}
  admin_listen: {{admin}}
  threads: 2
  log_format: json
  retry: {{max_attempts_per_route: 1}}
tenants:
  t: {{}}
virtual_keys:
  - key: {KEY}
    tenant: t
providers:
  az:
    kind: azure_openai
    base_url: {g}
    api_version: "2024-10-21"
    api_key: {CLOUD_KEY}
    health_check: {{enabled: false}}
  gm:
    kind: gemini
    base_url: {g}/v1beta
    api_key: {CLOUD_KEY}
    health_check: {{enabled: false}}
  az-bad:
    kind: azure_openai
    base_url: {b}
    api_version: "2024-10-21"
    api_key: {CLOUD_KEY}
    health_check: {{enabled: false}}
    # Every cell tries it first: no passive demotion.
    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}
  gm-bad:
    kind: gemini
    base_url: {b}/v1beta
    api_key: {CLOUD_KEY}
    health_check: {{enabled: false}}
    # Every cell tries it first: no passive demotion.
    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}
  gm-wrong-key:
    kind: gemini
    base_url: {g}/v1beta
    api_key: not-the-key
    health_check: {{enabled: false}}
    # Every cell tries it first: no passive demotion.
    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}
models:
  acme/az:
    routes:
      - {{provider: az, upstream_model: gpt4o-prod}}
  acme/gem:
    routes:
      - {{provider: gm, upstream_model: gemini-2.5-flash}}
  acme/gem-then-az:
    routes:
      - {{provider: gm-bad, upstream_model: gemini-2.5-flash, priority: 10}}
      - {{provider: az, upstream_model: gpt4o-prod, priority: 20}}
  acme/az-then-gem:
    routes:
      - {{provider: az-bad, upstream_model: gpt4o-prod, priority: 10}}
      - {{provider: gm, upstream_model: gemini-2.5-flash, priority: 20}}
  acme/wrong-key-then-az:
    routes:
      - {{provider: gm-wrong-key, upstream_model: gemini-2.5-flash, priority: 10}}
      - {{provider: az, upstream_model: gpt4o-prod, priority: 20}}
  acme/az-filter:
    routes:
      - {{provider: az-bad, upstream_model: gpt4o-prod, priority: 10}}
      - {{provider: gm, upstream_model: gemini-2.5-flash, priority: 20}}
"#
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Client {
    Chat,
    Messages,
}

impl Client {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Client::Chat => "/v1/chat/completions",
            Client::Messages => "/v1/messages",
        }
    }

    pub(crate) fn headers(self, id: &str) -> Vec<(&'static str, String)> {
        let mut h = match self {
            Client::Messages => vec![
                ("x-api-key", KEY.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            Client::Chat => vec![("authorization", format!("Bearer {KEY}"))],
        };
        h.push(("x-request-id", id.to_string()));
        h
    }

    pub(crate) fn body(self, model: &str, stream: bool) -> Value {
        match self {
            Client::Chat => json!({"model": model, "stream": stream,
                "messages": [{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "say hello"}]}),
            Client::Messages => json!({"model": model, "stream": stream, "max_tokens": 256,
                "system": "be brief", "messages": [{"role": "user", "content": "say hello"}]}),
        }
    }
}

/// Sends one request: (status, response headers' provider, body bytes).
pub(crate) fn send(
    sluice: &Sluice,
    client: Client,
    body: &Value,
    id: &str,
) -> (u16, Option<String>, Vec<u8>) {
    let owned = client.headers(id);
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if body["stream"] == true {
        let mut r = StreamReader::open(sluice.addr, client.path(), &headers, &body.to_string());
        let provider = r.header("x-sluice-provider").map(str::to_string);
        let status = r.status;
        (status, provider, r.read_to_end(Duration::from_secs(10)))
    } else {
        let r = post_json(sluice.addr, client.path(), &headers, &body.to_string());
        let provider = r.header("x-sluice-provider").map(str::to_string);
        (r.status, provider, r.body)
    }
}

/// The data payloads of an SSE body, parsed.
pub(crate) fn data(bytes: &[u8]) -> Vec<Value> {
    sse_events(bytes)
        .iter()
        .flat_map(|e| e.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The text of a client answer (stream or not) of `client`.
pub(crate) fn answer_text(client: Client, stream: bool, bytes: &[u8]) -> String {
    match (client, stream) {
        (Client::Chat, true) => sse_text(bytes),
        (Client::Messages, true) => data(bytes)
            .iter()
            .filter_map(|d| d["delta"]["text"].as_str().map(str::to_string))
            .collect(),
        (Client::Chat, false) => {
            let v: Value = serde_json::from_slice(bytes).expect("JSON");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
        (Client::Messages, false) => {
            let v: Value = serde_json::from_slice(bytes).expect("JSON");
            v["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["text"].as_str())
                .collect()
        }
    }
}

/// Every model id the client was shown, wherever its dialect names one.
pub(crate) fn echoed_models(client: Client, stream: bool, bytes: &[u8]) -> Vec<String> {
    let values: Vec<Value> = if stream {
        data(bytes)
    } else {
        vec![serde_json::from_slice(bytes).expect("JSON")]
    };
    values
        .iter()
        .filter_map(|v| match client {
            Client::Chat => v["model"].as_str(),
            Client::Messages if stream => v["message"]["model"].as_str(),
            Client::Messages => v["model"].as_str(),
        })
        .map(str::to_string)
        .collect()
}

pub(crate) fn num(rec: &Value, key: &str) -> u64 {
    rec[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {rec}"))
}

fn start(good_behavior: &Value, bad_behavior: &Value) -> (Mock, Mock, Sluice) {
    let good = Mock::start(&good_behavior.to_string());
    let bad = Mock::start(&bad_behavior.to_string());
    let sluice = Sluice::start(&config(&good, &bad));
    (good, bad, sluice)
}

#[test]
fn both_kinds_answer_chat_and_messages_clients_streamed_or_not_with_the_model_echoed() {
    let (good, _bad, sluice) = start(
        &json!({"text": TEXT, "api_key": CLOUD_KEY, "prompt_tokens": 21, "cached_tokens": 5}),
        &json!({}),
    );
    // The Gemini answer names a dated model version, Azure its deployment's model: neither
    // may reach the client.
    let mut n = 0;
    for (model, kind) in [("acme/az", "azure"), ("acme/gem", "gemini")] {
        if kind == "gemini" {
            good.set_behavior(
                &json!({"text": TEXT, "api_key": CLOUD_KEY, "prompt_tokens": 21,
                        "cached_tokens": 5, "answer_model": GEMINI_ANSWERED})
                .to_string(),
            );
        }
        for client in [Client::Chat, Client::Messages] {
            for stream in [false, true] {
                n += 1;
                let id = format!("cloud-{n}");
                let cell = format!("{client:?} → {model} stream={stream}");
                good.reset();
                let (status, provider, bytes) =
                    send(&sluice, client, &client.body(model, stream), &id);
                let shown = String::from_utf8_lossy(&bytes).to_string();
                assert_eq!(status, 200, "{cell}: {shown}");
                assert_eq!(
                    provider.as_deref(),
                    Some(if kind == "azure" { "az" } else { "gm" })
                );
                assert_eq!(answer_text(client, stream, &bytes), TEXT, "{cell}: {shown}");
                let models = echoed_models(client, stream, &bytes);
                assert!(!models.is_empty(), "{cell}: {shown}");
                assert!(models.iter().all(|m| m == model), "{cell}: {models:?}");
                assert!(!shown.contains("gpt-4o-2024-08-06"), "{cell}: {shown}");
                assert!(!shown.contains(GEMINI_ANSWERED), "{cell}: {shown}");
                if stream && client == Client::Chat {
                    assert!(shown.ends_with("data: [DONE]\n\n"), "{cell}: {shown}");
                }
                if stream && client == Client::Messages {
                    assert!(shown.contains("event: message_stop"), "{cell}: {shown}");
                }

                // What went upstream: the kind's URL, header and body.
                let log = good.log();
                assert_eq!(log.len(), 1, "{cell}: {log:?}");
                let rec = &log[0];
                let path = rec["path"].as_str().unwrap_or_default();
                let headers = &rec["all_headers"];
                let header = |name: &str| {
                    headers
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|h| h[0] == name)
                        .and_then(|h| h[1].as_str())
                        .map(str::to_string)
                };
                assert!(header("authorization").is_none(), "{cell}: {rec}");
                let sent: Value =
                    serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON");
                if kind == "azure" {
                    assert_eq!(
                        path,
                        "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21",
                        "{cell}"
                    );
                    assert_eq!(header("api-key").as_deref(), Some(CLOUD_KEY), "{cell}");
                    assert_eq!(sent["model"], "gpt4o-prod", "{cell}: {sent}");
                } else {
                    let want = if stream {
                        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
                    } else {
                        "/v1beta/models/gemini-2.5-flash:generateContent"
                    };
                    assert_eq!(path, want, "{cell}");
                    assert_eq!(
                        header("x-goog-api-key").as_deref(),
                        Some(CLOUD_KEY),
                        "{cell}"
                    );
                    assert_eq!(
                        sent["systemInstruction"],
                        json!({"parts": [{"text": "be brief"}]}),
                        "{cell}: {sent}"
                    );
                    assert_eq!(
                        sent["contents"],
                        json!([{"role": "user", "parts": [{"text": "say hello"}]}]),
                        "{cell}: {sent}"
                    );
                    assert!(sent.get("model").is_none() && sent.get("stream").is_none());
                }

                // Metered from the provider's own usage.
                let a = sluice.access_record(&id);
                assert_eq!(a["outcome"], "ok", "{cell}: {a}");
                assert_eq!(num(&a, "input_tokens"), 21, "{cell}: {a}");
                assert_eq!(num(&a, "cached_input_tokens"), 5, "{cell}: {a}");
                let words = TEXT.split_whitespace().count() as u64;
                assert_eq!(num(&a, "output_tokens"), words, "{cell}: {a}");
                assert_eq!(a["estimated"], "false", "{cell}: {a}");
            }
        }
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn tool_calls_go_both_ways_for_both_kinds() {
    let (good, _bad, sluice) = start(
        &json!({"api_key": CLOUD_KEY, "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}),
        &json!({}),
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for model in ["acme/az", "acme/gem"] {
        for stream in [false, true] {
            let cell = format!("{model} stream={stream}");
            let body = json!({"model": model, "stream": stream, "tools": tools,
                "messages": [{"role": "user", "content": "weather in Paris?"}]});
            let (status, _, bytes) = send(&sluice, Client::Chat, &body, "tools");
            let shown = String::from_utf8_lossy(&bytes).to_string();
            assert_eq!(status, 200, "{cell}: {shown}");
            let (name, args, finish) = if stream {
                let chunks = data(&bytes);
                let calls: Vec<&Value> = chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
                    .collect();
                let name = calls
                    .iter()
                    .find_map(|c| c["function"]["name"].as_str())
                    .unwrap_or_default()
                    .to_string();
                let args: String = calls
                    .iter()
                    .filter_map(|c| c["function"]["arguments"].as_str())
                    .collect();
                let finish = chunks
                    .iter()
                    .find_map(|c| c["choices"][0]["finish_reason"].as_str())
                    .unwrap_or_default()
                    .to_string();
                (name, args, finish)
            } else {
                let v: Value = serde_json::from_slice(&bytes).expect("JSON");
                let c = &v["choices"][0];
                (
                    c["message"]["tool_calls"][0]["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    c["message"]["tool_calls"][0]["function"]["arguments"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    c["finish_reason"].as_str().unwrap_or_default().to_string(),
                )
            };
            assert_eq!(name, "get_weather", "{cell}: {shown}");
            let args: Value = serde_json::from_str(&args).expect("arguments JSON");
            assert_eq!(args, json!({"city": "Paris"}), "{cell}");
            assert_eq!(finish, "tool_calls", "{cell}: {shown}");
        }
    }

    // The conversation goes back to Gemini with the call and its result, matched by name.
    good.reset();
    let body = json!({"model": "acme/gem", "tools": tools, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}]});
    let (status, _, bytes) = send(&sluice, Client::Chat, &body, "tools-back");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let log = good.log();
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("JSON");
    assert_eq!(
        sent["tools"][0]["functionDeclarations"][0]["name"], "get_weather",
        "{sent}"
    );
    assert_eq!(
        sent["contents"][1]["parts"][0]["functionCall"],
        json!({"name": "get_weather", "args": {"city": "Paris"}}),
        "{sent}"
    );
    assert_eq!(
        sent["contents"][2]["parts"][0]["functionResponse"],
        json!({"name": "get_weather", "response": {"output": "sunny"}}),
        "{sent}"
    );

    // A thinking model's call comes back with its `thoughtSignature` (carried in the id).
    let body = json!({"model": "acme/gem", "tools": tools,
        "messages": [{"role": "user", "content": "weather in Paris?"}]});
    let (_, _, bytes) = send(&sluice, Client::Chat, &body, "sig-1");
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    let call = v["choices"][0]["message"]["tool_calls"][0].clone();
    let id = call["id"].as_str().expect("call id").to_string();
    good.reset();
    let body = json!({"model": "acme/gem", "tools": tools, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "sunny"}]});
    let (status, _, bytes) = send(&sluice, Client::Chat, &body, "sig-2");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let log = good.log();
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("JSON");
    let sig = sent["contents"][1]["parts"][0]["thoughtSignature"]
        .as_str()
        .unwrap_or_default();
    assert!(
        sig.starts_with("CiQB") && sig.ends_with("+/0w=="),
        "{id} → {sent}"
    );

    // A Messages client gets `tool_use` blocks from Gemini.
    let body = json!({"model": "acme/gem", "max_tokens": 100, "stream": true, "tools": [{"name": "get_weather",
        "input_schema": {"type": "object"}}], "messages": [{"role": "user", "content": "weather?"}]});
    let (status, _, bytes) = send(&sluice, Client::Messages, &body, "tools-msg");
    assert_eq!(status, 200);
    let evs = data(&bytes);
    assert!(
        evs.iter().any(|e| e["content_block"]["type"] == "tool_use"
            && e["content_block"]["name"] == "get_weather"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(
        evs.iter().any(|e| e["delta"]["stop_reason"] == "tool_use"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

#[test]
fn a_failure_before_the_first_byte_falls_back_to_the_other_kind() {
    let (good, bad, sluice) = start(
        &json!({"text": TEXT, "api_key": CLOUD_KEY}),
        &json!({"status": 503}),
    );
    for (model, first, then) in [
        ("acme/gem-then-az", "gm-bad", "az"),
        ("acme/az-then-gem", "az-bad", "gm"),
        // Google answers a rejected key with 400 `API_KEY_INVALID`: the gateway's
        // credential, so it falls back rather than blaming the client.
        ("acme/wrong-key-then-az", "gm-wrong-key", "az"),
    ] {
        for (client, stream) in [(Client::Chat, true), (Client::Messages, false)] {
            good.reset();
            bad.reset();
            let cell = format!("{model} {client:?} stream={stream}");
            let (status, provider, bytes) =
                send(&sluice, client, &client.body(model, stream), "fb");
            assert_eq!(status, 200, "{cell}: {}", String::from_utf8_lossy(&bytes));
            assert_eq!(provider.as_deref(), Some(then), "{cell}");
            assert_eq!(answer_text(client, stream, &bytes), TEXT, "{cell}");
            let tried_first = if first == "gm-wrong-key" {
                good.log().len() == 2
            } else {
                bad.log().len() == 1
            };
            assert!(tried_first, "{cell}: {first} was not tried");
        }
    }
    let m = sluice.metrics();
    for (from, to) in [("gm-bad", "az"), ("az-bad", "gm"), ("gm-wrong-key", "az")] {
        assert!(
            m.lines().any(|l| l.starts_with("sluice_fallback_total")
                && l.contains(&format!("from_provider=\"{from}\""))
                && l.contains(&format!("to_provider=\"{to}\""))),
            "{from} → {to}:\n{m}"
        );
    }
}

#[test]
fn a_mid_stream_error_ends_the_stream_with_the_clients_error_event() {
    let (good, _bad, sluice) = start(
        // Gemini words it as `UNAVAILABLE` (the knob names the status), Azure as OpenAI does.
        &json!({"tokens": 6, "error_after_tokens": 2, "error_type": "UNAVAILABLE",
                "error_message": "The model is overloaded. Please try again later.",
                "api_key": CLOUD_KEY}),
        &json!({}),
    );
    for model in ["acme/gem", "acme/az"] {
        for client in [Client::Chat, Client::Messages] {
            let cell = format!("{client:?} → {model}");
            let (status, _, bytes) = send(&sluice, client, &client.body(model, true), "mid");
            let shown = String::from_utf8_lossy(&bytes).to_string();
            assert_eq!(status, 200, "{cell}: {shown}");
            assert_eq!(
                answer_text(client, true, &bytes),
                "tok0 tok1 ",
                "{cell}: {shown}"
            );
            assert!(shown.contains("event: error"), "{cell}: {shown}");
            assert!(!shown.contains("[DONE]"), "{cell}: {shown}");
            if client == Client::Messages {
                assert!(!shown.contains("message_stop"), "{cell}: {shown}");
                let err = data(&bytes).into_iter().find(|d| d["type"] == "error");
                let err = err.unwrap_or_else(|| panic!("{cell}: {shown}"));
                if model == "acme/gem" {
                    // Gemini's `UNAVAILABLE` is an overload in Anthropic's words.
                    assert_eq!(err["error"]["type"], "overloaded_error", "{cell}: {err}");
                    assert_eq!(
                        err["error"]["message"], "The model is overloaded. Please try again later.",
                        "{cell}: {err}"
                    );
                }
            }
        }
    }
    assert_eq!(
        good.log().len(),
        4,
        "a committed stream is never sent again"
    );
}

#[test]
fn azure_content_filtering_is_final_and_reaches_the_client_in_its_dialect() {
    // `acme/az-filter` falls back to Gemini on a provider failure, but a filtered prompt
    // is the client's: its 400 is final.
    let (good, bad, sluice) = start(
        &json!({"text": TEXT, "api_key": CLOUD_KEY}),
        &json!({"content_filter": true}),
    );
    let (status, _, bytes) = send(
        &sluice,
        Client::Chat,
        &Client::Chat.body("acme/az-filter", false),
        "cf-chat",
    );
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "content_filter", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let (status, _, bytes) = send(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/az-filter", true),
        "cf-msg",
    );
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("content management policy"),
        "{v}"
    );
    assert_eq!(bad.log().len(), 2);
    assert!(good.log().is_empty(), "a filtered prompt fell back");

    // A completion the filter stopped mid-way: `finish_reason: content_filter`, a refusal
    // for Messages clients; Gemini's SAFETY likewise.
    good.set_behavior(
        &json!({"text": TEXT, "api_key": CLOUD_KEY, "finish_reason": "content_filter"}).to_string(),
    );
    let (_, _, bytes) = send(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/az", true),
        "cf-stop",
    );
    assert!(
        data(&bytes)
            .iter()
            .any(|d| d["delta"]["stop_reason"] == "refusal"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    good.set_behavior(
        &json!({"text": TEXT, "api_key": CLOUD_KEY, "finish_reason": "SAFETY"}).to_string(),
    );
    let (_, _, bytes) = send(
        &sluice,
        Client::Chat,
        &Client::Chat.body("acme/gem", true),
        "safety",
    );
    assert!(
        data(&bytes)
            .iter()
            .any(|d| d["choices"][0]["finish_reason"] == "content_filter"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

#[test]
fn gemini_reasoning_and_usage_classes_are_metered() {
    let (_good, _bad, sluice) = start(
        &json!({"tokens": 4, "reasoning": "think about it", "prompt_tokens": 40,
                "cached_tokens": 8, "api_key": CLOUD_KEY}),
        &json!({}),
    );
    for (i, stream) in [false, true].into_iter().enumerate() {
        let id = format!("gm-usage-{i}");
        let (status, _, bytes) = send(
            &sluice,
            Client::Chat,
            &Client::Chat.body("acme/gem", stream),
            &id,
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let a = sluice.access_record(&id);
        assert_eq!(num(&a, "input_tokens"), 40, "{a}");
        assert_eq!(num(&a, "cached_input_tokens"), 8, "{a}");
        // Output = candidates + thoughts (3 reasoning words), reasoning apart.
        assert_eq!(num(&a, "output_tokens"), 7, "{a}");
        assert_eq!(num(&a, "reasoning_tokens"), 3, "{a}");
        assert_eq!(a["estimated"], "false", "{a}");
        assert_eq!(a["provider"], "gm", "{a}");
    }
}

#[test]
fn health_probes_ask_each_kind_for_its_model_list() {
    let mock = Mock::start(&json!({"api_key": CLOUD_KEY}).to_string());
    let url = format!("http://{}", mock.addr);
    let sluice = Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  az:\n    kind: azure_openai\n    base_url: {url}\n    api_version: \"2024-10-21\"\n    api_key: {CLOUD_KEY}\n    health_check: {{interval_ms: 200}}\n  gm:\n    kind: gemini\n    base_url: {url}/v1beta\n    api_key: {CLOUD_KEY}\n    health_check: {{interval_ms: 200}}\nmodels:\n  acme/az:\n    routes:\n      - {{provider: az, upstream_model: gpt4o-prod}}\n  acme/gem:\n    routes:\n      - {{provider: gm, upstream_model: gemini-2.5-flash}}\n"
    ));
    let probed = |log: &[Value], path: &str, header: &str| {
        log.iter().any(|r| {
            r["method"] == "GET"
                && r["path"] == path
                && r["status"] == 200
                && r["all_headers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|h| h[0] == header && h[1] == CLOUD_KEY)
        })
    };
    let log = mock.wait_log(Duration::from_secs(10), |log| {
        probed(log, "/openai/models?api-version=2024-10-21", "api-key")
            && probed(log, "/v1beta/models", "x-goog-api-key")
    });
    assert!(
        probed(&log, "/openai/models?api-version=2024-10-21", "api-key"),
        "{log:?}"
    );
    assert!(probed(&log, "/v1beta/models", "x-goog-api-key"), "{log:?}");
    // Both stay healthy: traffic flows.
    let r = sluice.chat(r#"{"model":"acme/gem","messages":[{"role":"user","content":"hi"}]}"#);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn images_go_inline_to_gemini_and_url_images_are_refused_in_the_clients_dialect() {
    let (good, _bad, sluice) = start(&json!({"api_key": CLOUD_KEY}), &json!({}));
    let body = json!({"model": "acme/gem", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let (status, _, bytes) = send(&sluice, Client::Chat, &body, "img");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let log = good.log();
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("JSON");
    assert_eq!(
        sent["contents"][0]["parts"][1],
        json!({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}),
        "{sent}"
    );
    let body = json!({"model": "acme/gem", "max_tokens": 50, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}]});
    let (status, _, bytes) = send(&sluice, Client::Messages, &body, "img-url");
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(
        good.log().len(),
        1,
        "a refused request never reaches the provider"
    );
}

#[test]
fn a_client_that_goes_away_mid_stream_closes_the_cloud_stream() {
    let (good, _bad, sluice) = start(
        &json!({"tokens": 500, "token_delay_ms": 20, "api_key": CLOUD_KEY}),
        &json!({}),
    );
    for (i, model) in ["acme/gem", "acme/az"].into_iter().enumerate() {
        let owned = Client::Chat.headers("abort");
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut r = StreamReader::open(
            sluice.addr,
            Client::Chat.path(),
            &headers,
            &Client::Chat.body(model, true).to_string(),
        );
        assert_eq!(r.status, 200, "{model}");
        let first = r.read_until(b"tok2 ", Duration::from_secs(5));
        assert!(String::from_utf8_lossy(&first).contains("tok2 "), "{model}");
        r.close();
        let log = good.wait_log(Duration::from_secs(5), |log| {
            log.get(i).is_some_and(|r| r["peer_closed_at_ms"].is_u64())
        });
        let rec = &log[i];
        assert!(rec["peer_closed_at_ms"].is_u64(), "{model}: {rec}");
        assert_eq!(rec["completed"], false, "{model}: {rec}");
    }
}
