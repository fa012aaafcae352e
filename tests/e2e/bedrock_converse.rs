//! Bedrock's Converse API (issue 13): `kind: bedrock` routes to models that are not
//! Anthropic's (`amazon.nova-pro-v1:0`, `meta.llama3-3-70b-instruct-v1:0`) go through
//! SigV4-signed `Converse` / `ConverseStream` requests against the mock speaking them byte
//! for byte (event-stream framing cut at arbitrary byte boundaries). Chat Completions,
//! Messages and Responses clients (the official SDKs: [`crate::sdk_cloud`]): text, tools,
//! image input, usage with cached tokens, the model echo, an error before the first byte
//! that falls back to the next route, a mid-stream exception, a client abort the mock sees.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_mock_upstream::sigv4::MOCK_AWS_ACCESS_KEY_ID;

use crate::bedrock::{answer_text, data, header, send, Client};
use crate::harness::client::StreamReader;
use crate::harness::{Mock, Sluice, TempDir, KEY};

/// The Converse model of the routes; its `:` travels as `%3A`.
pub(crate) const NOVA: &str = "amazon.nova-pro-v1:0";
const LLAMA: &str = "meta.llama3-3-70b-instruct-v1:0";
const TEXT: &str = "héllo from Növa, über the Converse stream";

fn config(good: &Mock, bad: &Mock) -> String {
    let g = format!("http://{}", good.addr);
    let b = format!("http://{}", bad.addr);
    let no_demotion = "health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}";
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
  br:
    kind: bedrock
    region: us-east-2
    base_url: {g}
  br-bad:
    kind: bedrock
    region: us-east-2
    base_url: {b}
    aws_profile: mock
    {no_demotion}
  an-bad:
    kind: anthropic
    base_url: {b}/v1
    api_key: an-key
    health_check: {{enabled: false}}
    {no_demotion}
models:
  acme/nova:
    routes:
      - {{provider: br, upstream_model: "{NOVA}"}}
  acme/bad-then-llama:
    routes:
      - {{provider: br-bad, upstream_model: "{NOVA}", priority: 10}}
      - {{provider: br, upstream_model: "{LLAMA}", priority: 20}}
  acme/anthropic-then-nova:
    routes:
      - {{provider: an-bad, upstream_model: claude-sonnet-4-6, priority: 10}}
      - {{provider: br, upstream_model: "{NOVA}", priority: 20}}
"#
    )
}

struct Setup {
    good: Mock,
    bad: Mock,
    sluice: Sluice,
    _dir: TempDir,
}

fn start(good_behavior: &Value, bad_behavior: &Value) -> Setup {
    let dir = TempDir::new("converse");
    let file = crate::bedrock::credentials_file(&dir);
    let good = Mock::start(&good_behavior.to_string());
    let bad = Mock::start(&bad_behavior.to_string());
    let env = crate::bedrock::env(&file);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with_env(&config(&good, &bad), &env);
    Setup {
        good,
        bad,
        sluice,
        _dir: dir,
    }
}

fn num(rec: &Value, key: &str) -> String {
    rec[key].to_string().trim_matches('"').to_string()
}

fn sent_body(rec: &Value) -> Value {
    serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON")
}

#[test]
fn every_client_dialect_gets_converse_answers_signed_streamed_or_not() {
    let s = start(
        &json!({"text": TEXT, "prompt_tokens": 21, "cached_tokens": 6, "split": "arbitrary"}),
        &json!({}),
    );
    let mut n = 0;
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for stream in [false, true] {
            n += 1;
            let id = format!("cv-{n}");
            let cell = format!("{client:?} stream={stream}");
            s.good.reset();
            let r = send(&s.sluice, client, &client.body("acme/nova", stream), &id);
            let shown = r.shown();
            assert_eq!(r.status, 200, "{cell}: {shown}");
            assert_eq!(r.provider.as_deref(), Some("br"), "{cell}");
            assert_eq!(
                answer_text(client, stream, &r.bytes),
                TEXT,
                "{cell}: {shown}"
            );
            assert!(shown.contains("acme/nova"), "{cell}: {shown}");
            assert!(!shown.contains("nova-pro"), "{cell}: {shown}");
            assert!(!shown.contains("latencyMs"), "{cell}: {shown}");
            match (client, stream) {
                (Client::Chat, true) => {
                    assert!(shown.ends_with("data: [DONE]\n\n"), "{cell}: {shown}");
                }
                (Client::Messages, true) => {
                    assert!(shown.contains("event: message_stop"), "{cell}: {shown}");
                }
                (Client::Responses, true) => {
                    assert!(shown.contains("response.completed"), "{cell}: {shown}");
                }
                _ => {}
            }

            // What went upstream: the Converse path, a SigV4 signature, the Converse body.
            let log = s.good.log();
            assert_eq!(log.len(), 1, "{cell}: {log:?}");
            let rec = &log[0];
            let want = if stream {
                "/model/amazon.nova-pro-v1%3A0/converse-stream"
            } else {
                "/model/amazon.nova-pro-v1%3A0/converse"
            };
            assert_eq!(rec["path"], want, "{cell}");
            assert_eq!(rec["status"], 200, "{cell}: {rec}");
            let auth = header(rec, "authorization").expect("authorization");
            assert!(
                auth.starts_with(&format!(
                    "AWS4-HMAC-SHA256 Credential={MOCK_AWS_ACCESS_KEY_ID}/"
                )) && auth.contains("/us-east-2/bedrock/aws4_request"),
                "{cell}: {auth}"
            );
            let sent = sent_body(rec);
            for absent in ["model", "stream", "anthropic_version", "max_tokens"] {
                assert!(sent.get(absent).is_none(), "{cell}: {sent}");
            }
            assert_eq!(
                sent["system"],
                json!([{"text": "be brief"}]),
                "{cell}: {sent}"
            );
            assert_eq!(
                sent["messages"],
                json!([{"role": "user", "content": [{"text": "say hello"}]}]),
                "{cell}: {sent}"
            );
            if client == Client::Messages {
                assert_eq!(sent["inferenceConfig"]["maxTokens"], 256, "{cell}: {sent}");
            }

            // Metered from Bedrock's usage: 21 prompt tokens (6 read from the cache).
            let a = s.sluice.access_record(&id);
            assert_eq!(a["provider"], "br", "{cell}: {a}");
            assert_eq!(num(&a, "input_tokens"), "21", "{cell}: {a}");
            assert_eq!(num(&a, "cached_input_tokens"), "6", "{cell}: {a}");
            let words = TEXT.split_whitespace().count().to_string();
            assert_eq!(num(&a, "output_tokens"), words, "{cell}: {a}");
        }
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn tools_and_images_go_through_converse_in_every_direction() {
    let s = start(
        &json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                "split": "bytewise"}),
        &json!({}),
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let image = "data:image/png;base64,iVBORw0KGgo=";
    for stream in [false, true] {
        s.good.reset();
        let body = json!({"model": "acme/nova", "stream": stream, "tools": tools,
            "tool_choice": "required",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "weather where this photo was taken?"},
                {"type": "image_url", "image_url": {"url": image}}]}]});
        let r = send(&s.sluice, Client::Chat, &body, "tools");
        let shown = r.shown();
        assert_eq!(r.status, 200, "{shown}");
        let (call_id, name, args, finish) = if stream {
            let chunks = data(&r.bytes);
            let calls: Vec<&Value> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
                .collect();
            (
                calls
                    .iter()
                    .find_map(|c| c["id"].as_str())
                    .unwrap_or_default()
                    .to_string(),
                calls
                    .iter()
                    .find_map(|c| c["function"]["name"].as_str())
                    .unwrap_or_default()
                    .to_string(),
                calls
                    .iter()
                    .filter_map(|c| c["function"]["arguments"].as_str())
                    .collect::<String>(),
                chunks
                    .iter()
                    .find_map(|c| c["choices"][0]["finish_reason"].as_str())
                    .unwrap_or_default()
                    .to_string(),
            )
        } else {
            let v: Value = serde_json::from_slice(&r.bytes).expect("JSON");
            let c = &v["choices"][0];
            let call = &c["message"]["tool_calls"][0];
            (
                call["id"].as_str().unwrap_or_default().to_string(),
                call["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                call["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["finish_reason"].as_str().unwrap_or_default().to_string(),
            )
        };
        assert!(call_id.starts_with("tooluse_"), "stream={stream}: {shown}");
        assert_eq!(name, "get_weather", "stream={stream}: {shown}");
        let parsed: Value = serde_json::from_str(&args).expect("arguments JSON");
        assert_eq!(parsed, json!({"city": "Paris"}));
        assert_eq!(finish, "tool_calls", "stream={stream}: {shown}");
        // The tools and the image went to Bedrock in Converse's shape.
        let sent = sent_body(&s.good.log()[0]);
        assert_eq!(
            sent["toolConfig"]["tools"][0]["toolSpec"]["name"], "get_weather",
            "{sent}"
        );
        assert!(
            sent["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"].is_object(),
            "{sent}"
        );
        assert_eq!(
            sent["toolConfig"]["toolChoice"],
            json!({"any": {}}),
            "{sent}"
        );
        assert_eq!(
            sent["messages"][0]["content"][1],
            json!({"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}),
            "{sent}"
        );

        // The next turn sends the call and its result back: toolUse and toolResult blocks.
        s.good.reset();
        s.good.set_behavior(&json!({"text": "Sunny."}).to_string());
        let follow = json!({"model": "acme/nova", "stream": stream, "tools": tools,
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": call_id,
                    "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "18°C, sunny"}]});
        let r = send(&s.sluice, Client::Chat, &follow, "tools-2");
        assert_eq!(r.status, 200, "{}", r.shown());
        assert_eq!(answer_text(Client::Chat, stream, &r.bytes), "Sunny.");
        let sent = sent_body(&s.good.log()[0]);
        assert_eq!(
            sent["messages"][1]["content"][0]["toolUse"],
            json!({"toolUseId": call_id, "name": "get_weather", "input": {"city": "Paris"}}),
            "{sent}"
        );
        assert_eq!(
            sent["messages"][2]["content"][0]["toolResult"],
            json!({"toolUseId": call_id, "content": [{"text": "18°C, sunny"}], "status": "success"}),
            "{sent}"
        );
        s.good.set_behavior(
            &json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                    "split": "bytewise"})
            .to_string(),
        );
    }

    // A Messages client streams `tool_use` blocks; Responses gets a function call.
    let body = json!({"model": "acme/nova", "max_tokens": 100, "stream": true,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "weather?"}]});
    let r = send(&s.sluice, Client::Messages, &body, "tools-msg");
    assert_eq!(r.status, 200);
    let evs = data(&r.bytes);
    assert!(
        evs.iter().any(|e| e["content_block"]["type"] == "tool_use"
            && e["content_block"]["name"] == "get_weather"),
        "{}",
        r.shown()
    );
    assert!(
        evs.iter().any(|e| e["delta"]["stop_reason"] == "tool_use"),
        "{}",
        r.shown()
    );
    let body = json!({"model": "acme/nova", "input": "weather?",
        "tools": [{"type": "function", "name": "get_weather",
                   "parameters": {"type": "object"}}]});
    let r = send(&s.sluice, Client::Responses, &body, "tools-resp");
    assert_eq!(r.status, 200, "{}", r.shown());
    let v: Value = serde_json::from_slice(&r.bytes).expect("JSON");
    assert!(
        v["output"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| o["type"] == "function_call" && o["name"] == "get_weather"),
        "{v}"
    );
}

/// A turn whose history has tool calls and results but offers no tools (a summarising or
/// compaction turn, as coding agents send) reaches Bedrock with the `toolConfig` it
/// requires ("The toolConfig field must be defined when using toolUse and toolResult
/// content blocks", which the mock answers as Bedrock does); `tool_choice: none` with tool
/// history is sent the same way and named in `x-sluice-dropped`.
#[test]
fn tool_history_without_tools_gets_a_tool_config() {
    let s = start(&json!({"text": "Summary: sunny in Paris."}), &json!({}));
    let chat = json!({"model": "acme/nova", "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"},
        {"role": "user", "content": "Summarise the conversation."}]});
    let messages = json!({"model": "acme/nova", "max_tokens": 200, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
            "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18°C, sunny"},
            {"type": "text", "text": "Summarise the conversation."}]}]});
    let responses = json!({"model": "acme/nova", "input": [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18°C, sunny"},
        {"role": "user", "content": "Summarise the conversation."}]});
    let synthesized = json!({"tools": [{"toolSpec": {"name": "get_weather",
        "inputSchema": {"json": {"type": "object", "properties": {}}}}}]});
    for (client, body) in [
        (Client::Chat, chat.clone()),
        (Client::Messages, messages),
        (Client::Responses, responses),
    ] {
        for stream in [false, true] {
            s.good.reset();
            let mut body = body.clone();
            body["stream"] = stream.into();
            let r = send(&s.sluice, client, &body, "history");
            assert_eq!(r.status, 200, "{client:?} stream={stream}: {}", r.shown());
            assert_eq!(
                answer_text(client, stream, &r.bytes),
                "Summary: sunny in Paris.",
                "{client:?} stream={stream}"
            );
            let sent = sent_body(&s.good.log()[0]);
            assert_eq!(sent["toolConfig"], synthesized, "{client:?}: {sent}");
        }
    }

    // `tool_choice: none` with tools and tool history: the tools the history calls go,
    // without a choice, and the client is told `none` was dropped.
    s.good.reset();
    let mut none = chat;
    none["tools"] = json!([
        {"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "send_mail", "parameters": {"type": "object"}}}]);
    none["tool_choice"] = json!("none");
    let owned = Client::Chat.headers("none");
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = crate::harness::client::post_json(
        s.sluice.addr,
        Client::Chat.path(),
        &headers,
        &none.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-sluice-dropped"),
        Some("tool_choice"),
        "{:?}",
        r.headers
    );
    let sent = sent_body(&s.good.log()[0]);
    assert_eq!(
        sent["toolConfig"],
        json!({"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json":
            {"type": "object", "properties": {"city": {"type": "string"}}}}}}]}),
        "{sent}"
    );
}

#[test]
fn failures_before_the_first_byte_fall_back_and_exceptions_end_the_stream() {
    // Throttled before the first byte (HTTP 429, or a throttling exception as the stream's
    // first message): the next route (Llama) answers.
    let s = start(&json!({"text": TEXT}), &json!({"status": 429}));
    for (bad, stream) in [
        (json!({"status": 429}), false),
        (json!({"status": 503}), true),
        (
            json!({"tokens": 3, "error_after_tokens": 0, "error_type": "throttlingException"}),
            true,
        ),
    ] {
        s.good.reset();
        s.bad.reset();
        s.bad.set_behavior(&bad.to_string());
        let cell = format!("{bad} stream={stream}");
        let r = send(
            &s.sluice,
            Client::Chat,
            &Client::Chat.body("acme/bad-then-llama", stream),
            "fb",
        );
        assert_eq!(r.status, 200, "{cell}: {}", r.shown());
        assert_eq!(r.provider.as_deref(), Some("br"), "{cell}");
        assert_eq!(answer_text(Client::Chat, stream, &r.bytes), TEXT, "{cell}");
        let tried = s.bad.log();
        assert_eq!(tried.len(), 1, "{cell}");
        assert!(tried[0]["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/model/amazon.nova-pro-v1%3A0/converse")));
        let good = s.good.log();
        assert!(
            good[0]["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/model/meta.llama3-3-70b-instruct-v1%3A0/converse")),
            "{cell}: {good:?}"
        );
    }
    // From Anthropic's Messages API to Converse: a Messages client's body is translated
    // for the second route.
    for stream in [false, true] {
        s.good.reset();
        s.bad.reset();
        s.bad.set_behavior(&json!({"status": 429}).to_string());
        let r = send(
            &s.sluice,
            Client::Messages,
            &Client::Messages.body("acme/anthropic-then-nova", stream),
            "fb-an",
        );
        assert_eq!(r.status, 200, "stream={stream}: {}", r.shown());
        assert_eq!(answer_text(Client::Messages, stream, &r.bytes), TEXT);
        assert_eq!(s.bad.log()[0]["path"], "/v1/messages");
        let sent = sent_body(&s.good.log()[0]);
        assert_eq!(sent["system"], json!([{"text": "be brief"}]), "{sent}");
    }
    let m = s.sluice.metrics();
    for from in ["br-bad", "an-bad"] {
        assert!(
            m.lines().any(|l| l.starts_with("sluice_fallback_total")
                && l.contains(&format!("from_provider=\"{from}\""))
                && l.contains("to_provider=\"br\"")),
            "{from}: {m}"
        );
    }

    // A validation error is the client's: no fallback.
    s.good.reset();
    s.bad.set_behavior(&json!({"status": 400}).to_string());
    let r = send(
        &s.sluice,
        Client::Chat,
        &Client::Chat.body("acme/bad-then-llama", false),
        "val",
    );
    assert_eq!(r.status, 400, "{}", r.shown());
    assert!(s.good.log().is_empty());

    // An exception after two tokens ends each client's stream with its error event.
    s.good.set_behavior(
        &json!({"tokens": 6, "error_after_tokens": 2, "error_type": "modelStreamErrorException",
                "error_message": "The model stream broke off.", "split": "arbitrary"})
        .to_string(),
    );
    s.good.reset();
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        let r = send(&s.sluice, client, &client.body("acme/nova", true), "exc");
        let shown = r.shown();
        assert_eq!(r.status, 200, "{client:?}: {shown}");
        assert_eq!(
            answer_text(client, true, &r.bytes),
            "tok0 tok1 ",
            "{client:?}: {shown}"
        );
        assert!(
            shown.contains("The model stream broke off."),
            "{client:?}: {shown}"
        );
        assert!(!shown.contains("[DONE]"), "{client:?}: {shown}");
        assert!(!shown.contains("message_stop"), "{client:?}: {shown}");
    }
    assert_eq!(
        s.good.log().len(),
        3,
        "a committed stream is never sent again"
    );
}

#[test]
fn a_client_that_goes_away_closes_the_converse_stream() {
    let s = start(&json!({"tokens": 500, "token_delay_ms": 20}), &json!({}));
    let headers = [
        ("authorization", format!("Bearer {KEY}")),
        ("x-request-id", "abort".to_string()),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut r = StreamReader::open(
        s.sluice.addr,
        Client::Chat.path(),
        &headers,
        &Client::Chat.body("acme/nova", true).to_string(),
    );
    assert_eq!(r.status, 200);
    let first = r.read_until(b"tok2 ", Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&first).contains("tok2 "));
    r.close();
    let log = s.good.wait_log(Duration::from_secs(5), |log| {
        log.first().is_some_and(|r| r["peer_closed_at_ms"].is_u64())
    });
    assert!(log[0]["peer_closed_at_ms"].is_u64(), "{:?}", log[0]);
    assert_eq!(log[0]["completed"], false, "{:?}", log[0]);
    assert!(log[0]["path"]
        .as_str()
        .is_some_and(|p| p.ends_with("/converse-stream")));
}
