//! Every client in its own API: {Chat Completions, Messages, Responses} clients ×
//! {openai, anthropic} providers × {stream, non-stream}, over loopback with the real mock
//! (which answers OpenAI or Anthropic byte for byte, with a dated model id that differs
//! from `upstream_model`). Each cell checks the reassembled text, the standard model id
//! wherever the dialect names the model, the stop reason, usage, and, for failures, the
//! client's own error shape and status.

use std::time::Duration;

use serde_json::Value;

use crate::harness::client::{post_json, sse_events, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

/// What the mock answers as its model (neither the standard nor the upstream model).
const ANSWERED: &str = "upstream-dated-2026-01-01";
const TEXT: &str = "héllo wörld, ünïcode ✓";

fn config(base_url: &str, extra_server: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{extra_server}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-oa\n    health_check: {{enabled: false}}\n  claude:\n    kind: anthropic\n    base_url: {base_url}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/gpt:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n  acme/claude:\n    default_max_tokens: 777\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n"
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

    fn body(self, model: &str, stream: bool) -> String {
        match self {
            Client::Chat => format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"stream":{stream}{}}}"#,
                if stream {
                    r#","stream_options":{"include_usage":true}"#
                } else {
                    ""
                }
            ),
            Client::Messages => format!(
                r#"{{"model":"{model}","max_tokens":64,"system":"be brief","messages":[{{"role":"user","content":"hi"}}],"stream":{stream}}}"#
            ),
            Client::Responses => format!(
                r#"{{"model":"{model}","instructions":"be brief","input":"hi","stream":{stream}}}"#
            ),
        }
    }

    /// Messages clients authenticate the Anthropic way, the others with Bearer.
    fn auth(self) -> (&'static str, String) {
        match self {
            Client::Messages => ("x-api-key", KEY.to_string()),
            Client::Chat | Client::Responses => ("authorization", format!("Bearer {KEY}")),
        }
    }
}

fn post(sluice: &Sluice, client: Client, body: &str, extra: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let (k, v) = client.auth();
    let mut headers: Vec<(&str, &str)> = vec![(k, v.as_str()), ("anthropic-version", "2023-06-01")];
    headers.extend_from_slice(extra);
    let stream = body.contains(r#""stream":true"#);
    if stream {
        let mut s = StreamReader::open(sluice.addr, client.path(), &headers, body);
        let status = s.status;
        if status == 200 {
            assert_eq!(
                s.header("content-type"),
                Some("text/event-stream; charset=utf-8")
            );
        }
        (status, s.read_to_end(Duration::from_secs(10)))
    } else {
        let r = post_json(sluice.addr, client.path(), &headers, body);
        (r.status, r.body)
    }
}

/// (event name, data JSON) of every event of an SSE body; `[DONE]` is `None` data.
fn events(body: &[u8]) -> Vec<(Option<String>, Option<Value>)> {
    sse_events(body)
        .iter()
        .filter(|e| !e.starts_with(':'))
        .map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            (name, data)
        })
        .collect()
}

/// What a client reassembles: text, the model ids it was told, stop reason, output tokens.
#[derive(Debug, Default)]
struct Seen {
    text: String,
    models: Vec<String>,
    stop: String,
    output_tokens: u64,
}

#[expect(
    clippy::too_many_lines,
    reason = "one check per field of the transcript, in wire order"
)]
fn seen(client: Client, stream: bool, body: &[u8]) -> Seen {
    let mut s = Seen::default();
    let raw = String::from_utf8_lossy(body).to_string();
    match (client, stream) {
        (Client::Chat, false) => {
            let v: Value = serde_json::from_slice(body).expect("JSON");
            s.text = v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .into();
            s.models
                .push(v["model"].as_str().unwrap_or_default().into());
            s.stop = v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap_or_default()
                .into();
            s.output_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
        (Client::Chat, true) => {
            assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
            for (_, d) in events(body) {
                let Some(d) = d else { continue };
                s.models
                    .push(d["model"].as_str().unwrap_or_default().into());
                if let Some(t) = d["choices"][0]["delta"]["content"].as_str() {
                    s.text.push_str(t);
                }
                if let Some(r) = d["choices"][0]["finish_reason"].as_str() {
                    s.stop = r.into();
                }
                if let Some(n) = d["usage"]["completion_tokens"].as_u64() {
                    s.output_tokens = n;
                }
            }
        }
        (Client::Messages, false) => {
            let v: Value = serde_json::from_slice(body).expect("JSON");
            assert_eq!(v["type"], "message", "{v}");
            for b in v["content"].as_array().expect("content") {
                if b["type"] == "text" {
                    s.text.push_str(b["text"].as_str().unwrap_or_default());
                }
            }
            s.models
                .push(v["model"].as_str().unwrap_or_default().into());
            s.stop = v["stop_reason"].as_str().unwrap_or_default().into();
            s.output_tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
        }
        (Client::Messages, true) => {
            let evs = events(body);
            assert_eq!(
                evs.last().and_then(|e| e.0.as_deref()),
                Some("message_stop"),
                "{raw}"
            );
            for (name, d) in evs {
                let Some(d) = d else { continue };
                assert_eq!(name.as_deref(), d["type"].as_str(), "{raw}");
                match d["type"].as_str() {
                    Some("message_start") => {
                        s.models
                            .push(d["message"]["model"].as_str().unwrap_or_default().into());
                    }
                    Some("content_block_delta") => {
                        if let Some(t) = d["delta"]["text"].as_str() {
                            s.text.push_str(t);
                        }
                    }
                    Some("message_delta") => {
                        s.stop = d["delta"]["stop_reason"]
                            .as_str()
                            .unwrap_or_default()
                            .into();
                        s.output_tokens = d["usage"]["output_tokens"].as_u64().unwrap_or(0);
                    }
                    _ => {}
                }
            }
        }
        (Client::Responses, false) => {
            let v: Value = serde_json::from_slice(body).expect("JSON");
            assert_eq!(v["object"], "response", "{v}");
            for item in v["output"].as_array().expect("output") {
                if item["type"] == "message" {
                    for c in item["content"].as_array().expect("content") {
                        if c["type"] == "output_text" {
                            s.text.push_str(c["text"].as_str().unwrap_or_default());
                        }
                    }
                }
            }
            s.models
                .push(v["model"].as_str().unwrap_or_default().into());
            s.stop = v["status"].as_str().unwrap_or_default().into();
            s.output_tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
        }
        (Client::Responses, true) => {
            let mut seq = Vec::new();
            for (name, d) in events(body) {
                let Some(d) = d else { continue };
                assert_eq!(name.as_deref(), d["type"].as_str(), "{raw}");
                seq.push(d["sequence_number"].as_u64().expect("sequence_number"));
                if let Some(m) = d["response"]["model"].as_str() {
                    s.models.push(m.into());
                }
                match d["type"].as_str() {
                    Some("response.output_text.delta") => {
                        s.text.push_str(d["delta"].as_str().unwrap_or_default());
                    }
                    Some("response.completed") => {
                        s.stop = d["response"]["status"].as_str().unwrap_or_default().into();
                        s.output_tokens = d["response"]["usage"]["output_tokens"]
                            .as_u64()
                            .unwrap_or(0);
                    }
                    _ => {}
                }
            }
            let expected: Vec<u64> = (0..seq.len() as u64).collect();
            assert_eq!(seq, expected, "sequence numbers count from 0: {raw}");
        }
    }
    s
}

fn expected_stop(client: Client) -> &'static str {
    match client {
        Client::Chat => "stop",
        Client::Messages => "end_turn",
        Client::Responses => "completed",
    }
}

#[test]
fn every_client_dialect_reaches_every_provider_stream_and_not() {
    let mock = Mock::start(&format!(
        r#"{{"text":"{TEXT}","answer_model":"{ANSWERED}"}}"#
    ));
    let sluice = Sluice::start(&config(&mock.base_url(), ""));
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for model in ["acme/gpt", "acme/claude"] {
            for stream in [false, true] {
                let cell = format!("{client:?} client, {model}, stream={stream}");
                mock.reset();
                let (status, body) = post(&sluice, client, &client.body(model, stream), &[]);
                let raw = String::from_utf8_lossy(&body).to_string();
                assert_eq!(status, 200, "{cell}: {raw}");
                let s = seen(client, stream, &body);
                assert_eq!(s.text, TEXT, "{cell}: {raw}");
                assert!(!s.models.is_empty(), "{cell}: no model named: {raw}");
                assert!(
                    s.models.iter().all(|m| m == model),
                    "{cell}: {:?}: {raw}",
                    s.models
                );
                assert!(!raw.contains(ANSWERED), "{cell}: {raw}");
                assert!(!raw.contains("-mock-1"), "{cell}: {raw}");
                assert_eq!(s.stop, expected_stop(client), "{cell}: {raw}");
                assert!(s.output_tokens > 0, "{cell}: no usage: {raw}");

                // The provider got its own API with the upstream model.
                let log = mock.log();
                assert_eq!(log.len(), 1, "{cell}");
                let rec = &log[0];
                let path = rec["path"].as_str().unwrap_or_default();
                let sent: Value =
                    serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON");
                if model == "acme/claude" {
                    assert!(path.ends_with("/v1/messages"), "{cell}: {rec}");
                    assert_eq!(sent["model"], "claude-mock-1", "{cell}");
                    if client != Client::Chat {
                        assert_eq!(sent["system"], "be brief", "{cell}: {sent}");
                    }
                    assert_eq!(
                        rec["headers"]["x-api-key"], "sk-ant-provider-secret",
                        "{cell}"
                    );
                } else {
                    assert!(path.ends_with("/v1/chat/completions"), "{cell}: {rec}");
                    assert_eq!(sent["model"], "gpt-mock-1", "{cell}");
                }
                assert_eq!(sent["stream"].as_bool().unwrap_or(false), stream, "{cell}");
            }
        }
    }
}

#[test]
fn anthropic_needs_max_tokens_the_per_model_default_fills_it_and_beta_is_forwarded() {
    let mock = Mock::start(r#"{"text":"ok"}"#);
    let sluice = Sluice::start(&config(&mock.base_url(), ""));
    let (status, body) = post(
        &sluice,
        Client::Responses,
        &Client::Responses.body("acme/claude", false),
        &[],
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, _) = post(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/claude", false),
        &[("anthropic-beta", "tools-2024-04-04")],
    );
    assert_eq!(status, 200);
    let log = mock.log();
    assert_eq!(log.len(), 2);
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent["max_tokens"], 777,
        "models.<id>.default_max_tokens: {sent}"
    );
    let beta = |rec: &Value| {
        rec["all_headers"]
            .as_array()
            .expect("all_headers")
            .iter()
            .find(|h| h[0] == "anthropic-beta")
            .map(|h| h[1].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(beta(&log[1]).as_deref(), Some("tools-2024-04-04"));
    assert_eq!(beta(&log[0]), None);
}

#[test]
fn errors_come_in_the_clients_own_shape() {
    let mock = Mock::start(r#"{"status":429,"error_message":"slow down please"}"#);
    // One attempt per request (no same-route retry): this test is about the error's shape.
    let sluice = Sluice::start(&config(
        &mock.base_url(),
        "  retry: {max_attempts_per_route: 1}\n",
    ));
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for model in ["acme/gpt", "acme/claude"] {
            let cell = format!("{client:?} client, {model}");
            let (status, body) = post(&sluice, client, &client.body(model, false), &[]);
            assert_eq!(status, 429, "{cell}");
            let v: Value = serde_json::from_slice(&body).expect("JSON error");
            if client == Client::Messages {
                assert_eq!(v["type"], "error", "{cell}: {v}");
                assert_eq!(v["error"]["type"], "rate_limit_error", "{cell}: {v}");
                assert!(
                    v["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("slow down please"),
                    "{cell}: {v}"
                );
            } else {
                assert!(v.get("type").is_none(), "{cell}: {v}");
                assert_eq!(v["error"]["message"], "slow down please", "{cell}: {v}");
                if client == Client::Responses {
                    assert_eq!(v["error"]["type"], "rate_limit_error", "{cell}: {v}");
                }
            }
        }
    }

    // Anthropic's own overload status reaches a Messages client as is (a fresh process:
    // the 429s above made the route rest).
    mock.set_behavior(r#"{"status":529}"#);
    let fresh = Sluice::start(&config(&mock.base_url(), ""));
    let (status, body) = post(
        &fresh,
        Client::Messages,
        &Client::Messages.body("acme/claude", false),
        &[],
    );
    assert_eq!(status, 529);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");

    // Sluice's own errors too: no key, unknown model, refused fields.
    let r = post_json(
        sluice.addr,
        "/v1/messages",
        &[],
        &Client::Messages.body("acme/claude", false),
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let (status, body) = post(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/nope", false),
        &[],
    );
    assert_eq!(status, 404);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    // `previous_response_id` and `store` are served by the response store
    // (tests/e2e/conversation.rs); the Conversations API is not.
    let body = r#"{"model":"acme/gpt","input":"hi","conversation":"conv_1"}"#;
    let (status, resp) = post(&sluice, Client::Responses, body, &[]);
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["error"]["param"], "conversation", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let (status, resp) = post(
        &sluice,
        Client::Messages,
        r#"{"model":"acme/claude","max_tokens":5,"messages":"nope"}"#,
        &[],
    );
    assert_eq!(status, 400);
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
}

#[test]
fn a_mid_stream_upstream_error_ends_the_stream_in_the_clients_dialect() {
    let mock = Mock::start(r#"{"tokens":6,"error_after_tokens":2,"token_delay_ms":2}"#);
    let sluice = Sluice::start(&config(&mock.base_url(), ""));
    for model in ["acme/gpt", "acme/claude"] {
        let (status, body) = post(
            &sluice,
            Client::Messages,
            &Client::Messages.body(model, true),
            &[],
        );
        let raw = String::from_utf8_lossy(&body).to_string();
        assert_eq!(status, 200, "{model}: {raw}");
        let evs = events(&body);
        let (name, last) = evs.last().expect("events");
        assert_eq!(name.as_deref(), Some("error"), "{model}: {raw}");
        let last = last.as_ref().expect("error JSON");
        assert_eq!(last["type"], "error", "{model}: {raw}");
        assert!(last["error"]["type"].is_string(), "{model}: {raw}");
        assert!(!raw.contains("[DONE]"), "{model}: {raw}");

        let (status, body) = post(
            &sluice,
            Client::Responses,
            &Client::Responses.body(model, true),
            &[],
        );
        let raw = String::from_utf8_lossy(&body).to_string();
        assert_eq!(status, 200, "{model}: {raw}");
        let evs = events(&body);
        let last = evs.last().and_then(|e| e.1.as_ref()).expect("last event");
        assert!(
            matches!(last["type"].as_str(), Some("error" | "response.failed")),
            "{model}: {raw}"
        );
        assert!(!raw.contains("response.completed"), "{model}: {raw}");
    }
}

#[test]
fn messages_clients_get_anthropic_pings_as_heartbeats() {
    let mock = Mock::start(r#"{"tokens":3,"token_delay_ms":400}"#);
    let sluice = Sluice::start(&config(&mock.base_url(), "  heartbeat_interval_ms: 100\n"));
    // A Chat upstream sends no pings of its own: every ping is Sluice's.
    let (status, body) = post(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/gpt", true),
        &[],
    );
    let raw = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{raw}");
    assert!(
        raw.contains("event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        "{raw}"
    );
    assert!(!raw.contains(": keepalive"), "{raw}");
}

#[test]
fn a_translated_stream_that_stopped_without_its_terminator_is_completed_not_an_error() {
    // finish_reason sent, `[DONE]` not: the answer is complete.
    let mock = Mock::start(r#"{"tokens":3,"no_done":true}"#);
    let sluice = Sluice::start(&config(&mock.base_url(), ""));
    let (status, body) = post(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/gpt", true),
        &[],
    );
    let raw = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{raw}");
    let s = seen(Client::Messages, true, &body);
    assert_eq!(s.stop, "end_turn", "{raw}");
    assert!(!raw.contains("event: error"), "{raw}");
    let (status, body) = post(
        &sluice,
        Client::Responses,
        &Client::Responses.body("acme/gpt", true),
        &[],
    );
    let raw = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{raw}");
    let s = seen(Client::Responses, true, &body);
    assert_eq!(s.stop, "completed", "{raw}");

    // No finish reason either: the stream broke off, and the client is told in its dialect.
    mock.set_behavior(r#"{"tokens":2,"no_finish":true}"#);
    let (status, body) = post(
        &sluice,
        Client::Messages,
        &Client::Messages.body("acme/gpt", true),
        &[],
    );
    let raw = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{raw}");
    assert!(
        raw.ends_with("\n\n") && raw.contains("event: error\n"),
        "{raw}"
    );
    assert!(!raw.contains("message_stop"), "{raw}");
}
