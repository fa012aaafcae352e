//! The `bedrock` provider kind (issue 13) over loopback against the mock speaking Bedrock's
//! runtime API byte for byte: SigV4-signed `InvokeModel` / `InvokeModelWithResponseStream`
//! requests (the mock verifies every signature with its own implementation), the Claude
//! body Bedrock takes, binary event-stream answers cut at arbitrary byte boundaries,
//! Bedrock's errors and in-stream exceptions. Chat Completions, Messages and Responses
//! clients, streamed and not: text, tools, usage, the model echo, fallback before the first
//! byte in both directions between Anthropic and Bedrock, a validation error that is final,
//! a mid-stream exception, a client abort, temporary credentials (session token) and a
//! wrong secret (403 → fallback, or 502 when nothing is left).

use std::time::Duration;

use serde_json::{json, Value};
use sluice_mock_upstream::sigv4::{
    MOCK_AWS_ACCESS_KEY_ID, MOCK_AWS_SECRET_ACCESS_KEY, MOCK_AWS_SESSION_TOKEN,
    MOCK_AWS_TEMP_ACCESS_KEY_ID, MOCK_AWS_TEMP_SECRET_ACCESS_KEY,
};

use crate::harness::client::{post_json, sse_events, sse_text, StreamReader};
use crate::harness::{Mock, Sluice, TempDir, KEY};

/// The Bedrock model id every route uses; its `:` travels as `%3A`.
pub(crate) const BEDROCK_MODEL: &str = "us.anthropic.claude-sonnet-4-6-v1:0";
const TEXT: &str = "héllo from Bedröck, über the event stream";

/// A shared credentials file with the mock's identities: `mock` (long-term), `temp`
/// (temporary, with a session token) and `wrong` (the right key id, a wrong secret).
pub(crate) fn credentials_file(dir: &TempDir) -> String {
    let path = dir.path().join("credentials");
    std::fs::write(
        &path,
        format!(
            "[mock]\naws_access_key_id = {MOCK_AWS_ACCESS_KEY_ID}\naws_secret_access_key = {MOCK_AWS_SECRET_ACCESS_KEY}\n\n[temp]\naws_access_key_id = {MOCK_AWS_TEMP_ACCESS_KEY_ID}\naws_secret_access_key = {MOCK_AWS_TEMP_SECRET_ACCESS_KEY}\naws_session_token = {MOCK_AWS_SESSION_TOKEN}\n\n[wrong]\naws_access_key_id = {MOCK_AWS_ACCESS_KEY_ID}\naws_secret_access_key = not-the-secret\n"
        ),
    )
    .expect("write credentials");
    path.to_string_lossy().into_owned()
}

/// The environment Sluice runs with: the env chain holds the long-term identity, the
/// shared file the profiles.
pub(crate) fn env(file: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", MOCK_AWS_ACCESS_KEY_ID.to_string()),
        (
            "AWS_SECRET_ACCESS_KEY",
            MOCK_AWS_SECRET_ACCESS_KEY.to_string(),
        ),
        ("AWS_SHARED_CREDENTIALS_FILE", file.to_string()),
    ]
}

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
  br-temp:
    kind: bedrock
    region: us-east-2
    base_url: {g}
    aws_profile: temp
  br-wrong:
    kind: bedrock
    region: us-east-2
    base_url: {g}
    aws_profile: wrong
    {no_demotion}
  br-bad:
    kind: bedrock
    region: us-east-2
    base_url: {b}
    aws_profile: mock
    {no_demotion}
  an:
    kind: anthropic
    base_url: {g}/v1
    api_key: an-key
    health_check: {{enabled: false}}
  an-bad:
    kind: anthropic
    base_url: {b}/v1
    api_key: an-key
    health_check: {{enabled: false}}
    {no_demotion}
models:
  acme/claude:
    routes:
      - {{provider: br, upstream_model: "{BEDROCK_MODEL}"}}
  acme/claude-temp:
    routes:
      - {{provider: br-temp, upstream_model: "{BEDROCK_MODEL}"}}
  acme/claude-wrong:
    routes:
      - {{provider: br-wrong, upstream_model: "{BEDROCK_MODEL}"}}
  acme/wrong-then-anthropic:
    routes:
      - {{provider: br-wrong, upstream_model: "{BEDROCK_MODEL}", priority: 10}}
      - {{provider: an, upstream_model: claude-sonnet-4-6, priority: 20}}
  acme/anthropic-then-bedrock:
    routes:
      - {{provider: an-bad, upstream_model: claude-sonnet-4-6, priority: 10}}
      - {{provider: br, upstream_model: "{BEDROCK_MODEL}", priority: 20}}
  acme/bedrock-then-anthropic:
    routes:
      - {{provider: br-bad, upstream_model: "{BEDROCK_MODEL}", priority: 10}}
      - {{provider: an, upstream_model: claude-sonnet-4-6, priority: 20}}
"#
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Client {
    Chat,
    Messages,
    Responses,
}

impl Client {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Client::Chat => "/v1/chat/completions",
            Client::Messages => "/v1/messages",
            Client::Responses => "/v1/responses",
        }
    }

    pub(crate) fn headers(self, id: &str) -> Vec<(&'static str, String)> {
        let mut h = match self {
            Client::Messages => vec![
                ("x-api-key", KEY.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            _ => vec![("authorization", format!("Bearer {KEY}"))],
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
            Client::Responses => json!({"model": model, "stream": stream,
                "instructions": "be brief", "input": "say hello"}),
        }
    }
}

pub(crate) struct Sent {
    pub(crate) status: u16,
    pub(crate) provider: Option<String>,
    pub(crate) bytes: Vec<u8>,
}

impl Sent {
    pub(crate) fn shown(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

pub(crate) fn send(sluice: &Sluice, client: Client, body: &Value, id: &str) -> Sent {
    let owned = client.headers(id);
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if body["stream"] == true {
        let mut r = StreamReader::open(sluice.addr, client.path(), &headers, &body.to_string());
        let provider = r.header("x-sluice-provider").map(str::to_string);
        let status = r.status;
        let bytes = r.read_to_end(Duration::from_secs(10));
        Sent {
            status,
            provider,
            bytes,
        }
    } else {
        let r = post_json(sluice.addr, client.path(), &headers, &body.to_string());
        let provider = r.header("x-sluice-provider").map(str::to_string);
        Sent {
            status: r.status,
            provider,
            bytes: r.body,
        }
    }
}

pub(crate) fn data(bytes: &[u8]) -> Vec<Value> {
    sse_events(bytes)
        .iter()
        .flat_map(|e| e.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

pub(crate) fn answer_text(client: Client, stream: bool, bytes: &[u8]) -> String {
    match (client, stream) {
        (Client::Chat, true) => sse_text(bytes),
        (Client::Messages, true) => data(bytes)
            .iter()
            .filter_map(|d| d["delta"]["text"].as_str().map(str::to_string))
            .collect(),
        (Client::Responses, true) => data(bytes)
            .iter()
            .filter(|d| d["type"] == "response.output_text.delta")
            .filter_map(|d| d["delta"].as_str().map(str::to_string))
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
        (Client::Responses, false) => {
            let v: Value = serde_json::from_slice(bytes).expect("JSON");
            v["output"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|o| o["content"].as_array().into_iter().flatten())
                .filter_map(|c| c["text"].as_str())
                .collect()
        }
    }
}

pub(crate) fn header(rec: &Value, name: &str) -> Option<String> {
    rec["all_headers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
        .map(str::to_string)
}

struct Setup {
    good: Mock,
    bad: Mock,
    sluice: Sluice,
    _dir: TempDir,
}

fn start(good_behavior: &Value, bad_behavior: &Value) -> Setup {
    let dir = TempDir::new("bedrock");
    let file = credentials_file(&dir);
    let good = Mock::start(&good_behavior.to_string());
    let bad = Mock::start(&bad_behavior.to_string());
    let env = env(&file);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with_env(&config(&good, &bad), &env);
    Setup {
        good,
        bad,
        sluice,
        _dir: dir,
    }
}

#[test]
fn every_client_dialect_gets_bedrock_answers_signed_streamed_or_not() {
    let s = start(
        &json!({"text": TEXT, "prompt_tokens": 21, "split": "arbitrary"}),
        &json!({}),
    );
    let mut n = 0;
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for stream in [false, true] {
            n += 1;
            let id = format!("br-{n}");
            let cell = format!("{client:?} stream={stream}");
            s.good.reset();
            let r = send(&s.sluice, client, &client.body("acme/claude", stream), &id);
            let shown = r.shown();
            assert_eq!(r.status, 200, "{cell}: {shown}");
            assert_eq!(r.provider.as_deref(), Some("br"), "{cell}");
            assert_eq!(
                answer_text(client, stream, &r.bytes),
                TEXT,
                "{cell}: {shown}"
            );
            // The model echo is the standard id; neither Bedrock's id nor Claude's shows.
            assert!(shown.contains("acme/claude"), "{cell}: {shown}");
            assert!(!shown.contains("claude-sonnet-4-6"), "{cell}: {shown}");
            assert!(
                !shown.contains("amazon-bedrock-invocationMetrics"),
                "{cell}: {shown}"
            );
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

            // What went upstream: the invoke path, a SigV4 signature, Bedrock's body.
            let log = s.good.log();
            assert_eq!(log.len(), 1, "{cell}: {log:?}");
            let rec = &log[0];
            let want = if stream {
                "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream"
            } else {
                "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke"
            };
            assert_eq!(rec["path"], want, "{cell}");
            let auth = header(rec, "authorization").expect("authorization");
            assert!(
                auth.starts_with(&format!(
                    "AWS4-HMAC-SHA256 Credential={MOCK_AWS_ACCESS_KEY_ID}/"
                )) && auth.contains("/us-east-2/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date, Signature="),
                "{cell}: {auth}"
            );
            assert!(header(rec, "x-amz-security-token").is_none(), "{cell}");
            assert_eq!(
                header(rec, "accept").as_deref(),
                Some(if stream {
                    "application/vnd.amazon.eventstream"
                } else {
                    "application/json"
                }),
                "{cell}"
            );
            let sent: Value =
                serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON");
            assert_eq!(
                sent["anthropic_version"], "bedrock-2023-05-31",
                "{cell}: {sent}"
            );
            assert!(sent.get("model").is_none(), "{cell}: {sent}");
            assert!(sent.get("stream").is_none(), "{cell}: {sent}");
            assert_eq!(sent["system"], "be brief", "{cell}: {sent}");
            let content = &sent["messages"][0]["content"];
            assert!(
                *content == json!("say hello")
                    || *content == json!([{"type": "text", "text": "say hello"}]),
                "{cell}: {sent}"
            );

            // Metered from the answer's usage: 21 prompt tokens, one per word.
            let a = s.sluice.access_record(&id);
            assert_eq!(a["provider"], "br", "{cell}: {a}");
            assert_eq!(
                a["input_tokens"].to_string().trim_matches('"'),
                "21",
                "{cell}: {a}"
            );
            let words = TEXT.split_whitespace().count().to_string();
            assert_eq!(
                a["output_tokens"].to_string().trim_matches('"'),
                words,
                "{cell}: {a}"
            );
        }
    }
}

#[test]
fn tool_calls_come_back_from_bedrock_in_every_client_shape() {
    let s = start(
        &json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                "split": "bytewise"}),
        &json!({}),
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for stream in [false, true] {
        let body = json!({"model": "acme/claude", "stream": stream, "tools": tools,
            "messages": [{"role": "user", "content": "weather in Paris?"}]});
        let r = send(&s.sluice, Client::Chat, &body, "tools");
        let shown = r.shown();
        assert_eq!(r.status, 200, "{shown}");
        let (name, args, finish) = if stream {
            let chunks = data(&r.bytes);
            let calls: Vec<&Value> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
                .collect();
            (
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
        assert_eq!(name, "get_weather", "stream={stream}: {shown}");
        let args: Value = serde_json::from_str(&args).expect("arguments JSON");
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(finish, "tool_calls", "stream={stream}: {shown}");
    }
    // The tools went to Bedrock in Anthropic's shape.
    let log = s.good.log();
    let sent: Value = serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("JSON");
    assert_eq!(sent["tools"][0]["name"], "get_weather", "{sent}");
    assert!(sent["tools"][0]["input_schema"].is_object(), "{sent}");

    // A Messages client streams `tool_use` blocks as Bedrock sent them.
    let body = json!({"model": "acme/claude", "max_tokens": 100, "stream": true,
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
}

#[test]
fn failures_before_the_first_byte_fall_back_between_anthropic_and_bedrock() {
    // The bad mock throttles every request: Bedrock's ThrottlingException, Anthropic's 429.
    let s = start(&json!({"text": TEXT}), &json!({"status": 429}));
    for (model, first, then) in [
        ("acme/anthropic-then-bedrock", "an-bad", "br"),
        ("acme/bedrock-then-anthropic", "br-bad", "an"),
    ] {
        for (client, stream) in [(Client::Chat, true), (Client::Messages, false)] {
            s.good.reset();
            s.bad.reset();
            let cell = format!("{model} {client:?} stream={stream}");
            let r = send(&s.sluice, client, &client.body(model, stream), "fb");
            assert_eq!(r.status, 200, "{cell}: {}", r.shown());
            assert_eq!(r.provider.as_deref(), Some(then), "{cell}");
            assert_eq!(answer_text(client, stream, &r.bytes), TEXT, "{cell}");
            let bad = s.bad.log();
            assert_eq!(bad.len(), 1, "{cell}: {first} was not tried once");
            if first == "br-bad" {
                // The throttled attempt was signed and Bedrock-shaped too.
                assert!(header(&bad[0], "authorization")
                    .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 ")));
            }
        }
    }
    let m = s.sluice.metrics();
    for (from, to) in [("an-bad", "br"), ("br-bad", "an")] {
        assert!(
            m.lines().any(|l| l.starts_with("sluice_fallback_total")
                && l.contains(&format!("from_provider=\"{from}\""))
                && l.contains(&format!("to_provider=\"{to}\""))),
            "{from} → {to}:\n{m}"
        );
    }

    // Every retryable Bedrock error falls back; a ValidationException reaches the client.
    for (status, falls_back) in [
        (503, true),
        (500, true),
        (408, true),
        (424, true),
        (400, false),
    ] {
        s.good.reset();
        s.bad.reset();
        s.bad.set_behavior(&json!({"status": status}).to_string());
        let r = send(
            &s.sluice,
            Client::Chat,
            &Client::Chat.body("acme/bedrock-then-anthropic", false),
            "br-err",
        );
        assert_eq!(s.bad.log().len(), 1, "HTTP {status}");
        if falls_back {
            assert_eq!(r.status, 200, "HTTP {status}: {}", r.shown());
            assert_eq!(s.good.log().len(), 1, "HTTP {status}");
        } else {
            assert_eq!(r.status, 400, "{}", r.shown());
            assert!(s.good.log().is_empty(), "a client error is not retried");
            let v: Value = serde_json::from_slice(&r.bytes).expect("JSON");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Malformed input request")),
                "{v}"
            );
        }
    }
}

#[test]
fn temporary_credentials_sign_with_the_session_token_and_a_wrong_secret_is_refused() {
    let s = start(&json!({"text": TEXT}), &json!({}));
    // Temporary credentials: the token is sent and signed; the mock checks both.
    let r = send(
        &s.sluice,
        Client::Chat,
        &Client::Chat.body("acme/claude-temp", true),
        "tmp",
    );
    assert_eq!(r.status, 200, "{}", r.shown());
    assert_eq!(sse_text(&r.bytes), TEXT);
    let log = s.good.log();
    assert_eq!(
        header(&log[0], "x-amz-security-token").as_deref(),
        Some(MOCK_AWS_SESSION_TOKEN)
    );
    let auth = header(&log[0], "authorization").expect("authorization");
    assert!(
        auth.contains(&format!("Credential={MOCK_AWS_TEMP_ACCESS_KEY_ID}/"))
            && auth.contains("SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token,"),
        "{auth}"
    );

    // A wrong secret: the mock's 403 InvalidSignatureException is the gateway's credential,
    // never the client's: 502 when it is the only route, a fallback when there is another.
    s.good.reset();
    for (client, stream) in [(Client::Chat, false), (Client::Messages, true)] {
        let r = send(
            &s.sluice,
            client,
            &client.body("acme/claude-wrong", stream),
            "wrong",
        );
        assert_eq!(r.status, 502, "{client:?}: {}", r.shown());
        let shown = r.shown();
        assert!(
            shown.contains("rejected the gateway's credentials"),
            "{shown}"
        );
        assert!(!shown.contains("not-the-secret"), "{shown}");
    }
    let refused = s.good.log();
    assert_eq!(refused.len(), 2);
    assert!(refused.iter().all(|r| r["status"] == 403), "{refused:?}");
    s.good.reset();
    let r = send(
        &s.sluice,
        Client::Chat,
        &Client::Chat.body("acme/wrong-then-anthropic", true),
        "wrong-fb",
    );
    assert_eq!(r.status, 200, "{}", r.shown());
    assert_eq!(r.provider.as_deref(), Some("an"));
    assert_eq!(sse_text(&r.bytes), TEXT);
    assert_eq!(s.good.log().len(), 2, "the refused attempt, then Anthropic");
    assert!(
        !s.sluice.log().contains("not-the-secret"),
        "a secret was logged"
    );
    assert!(
        !s.sluice.log().contains(MOCK_AWS_SECRET_ACCESS_KEY),
        "a secret was logged"
    );
}

#[test]
fn an_in_stream_exception_ends_the_stream_with_the_clients_error_event() {
    let s = start(
        &json!({"tokens": 6, "error_after_tokens": 2, "error_type": "modelStreamErrorException",
                "error_message": "The model stream broke off.", "split": "arbitrary"}),
        &json!({}),
    );
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        let r = send(&s.sluice, client, &client.body("acme/claude", true), "exc");
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
        match client {
            Client::Chat => assert!(shown.contains("event: error"), "{shown}"),
            Client::Messages => {
                assert!(!shown.contains("message_stop"), "{shown}");
                let err = data(&r.bytes).into_iter().find(|d| d["type"] == "error");
                let err = err.unwrap_or_else(|| panic!("{shown}"));
                assert_eq!(err["error"]["type"], "api_error", "{err}");
            }
            Client::Responses => assert!(
                shown.contains("response.failed") || shown.contains("event: error"),
                "{shown}"
            ),
        }
    }
    assert_eq!(
        s.good.log().len(),
        3,
        "a committed stream is never sent again"
    );

    // A throttling exception as the stream's first message (before `message_start`)
    // falls back like a 429 would: nothing was committed.
    s.bad.set_behavior(
        &json!({"tokens": 3, "error_after_tokens": 0, "error_type": "throttlingException"})
            .to_string(),
    );
    s.good.reset();
    let r = send(
        &s.sluice,
        Client::Chat,
        &Client::Chat.body("acme/bedrock-then-anthropic", true),
        "exc0",
    );
    assert_eq!(r.status, 200, "{}", r.shown());
    assert_eq!(r.provider.as_deref(), Some("an"));
    assert_eq!(s.bad.log().len(), 1);
}

#[test]
fn a_client_that_goes_away_closes_the_bedrock_stream() {
    let s = start(&json!({"tokens": 500, "token_delay_ms": 20}), &json!({}));
    let owned = Client::Chat.headers("abort");
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut r = StreamReader::open(
        s.sluice.addr,
        Client::Chat.path(),
        &headers,
        &Client::Chat.body("acme/claude", true).to_string(),
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
}

#[test]
fn a_clients_anthropic_beta_header_reaches_bedrock_as_the_signed_body_member() {
    // Anthropic (failing first) gets the header; Bedrock gets `anthropic_beta` in the body,
    // which the signature covers (the mock verifies it), and no such header.
    let s = start(&json!({"text": TEXT}), &json!({"status": 429}));
    let beta = "context-1m-2025-08-07, interleaved-thinking-2025-05-14";
    for stream in [false, true] {
        s.good.reset();
        s.bad.reset();
        let body = Client::Messages.body("acme/anthropic-then-bedrock", stream);
        let mut owned = Client::Messages.headers("beta");
        owned.push(("anthropic-beta", beta.to_string()));
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, shown) = if stream {
            let mut r =
                StreamReader::open(s.sluice.addr, "/v1/messages", &headers, &body.to_string());
            let status = r.status;
            (
                status,
                String::from_utf8_lossy(&r.read_to_end(Duration::from_secs(10))).into_owned(),
            )
        } else {
            let r = post_json(s.sluice.addr, "/v1/messages", &headers, &body.to_string());
            (r.status, String::from_utf8_lossy(&r.body).into_owned())
        };
        assert_eq!(status, 200, "stream={stream}: {shown}");
        let bad = s.bad.log();
        assert_eq!(bad.len(), 1, "stream={stream}: {bad:?}");
        assert_eq!(header(&bad[0], "anthropic-beta").as_deref(), Some(beta));
        let good = s.good.log();
        assert_eq!(good.len(), 1, "stream={stream}: {good:?}");
        assert_eq!(good[0]["status"], 200, "stream={stream}: {}", good[0]);
        assert!(
            header(&good[0], "anthropic-beta").is_none(),
            "stream={stream}"
        );
        let sent: Value =
            serde_json::from_str(good[0]["body"].as_str().expect("body copy")).expect("JSON");
        assert_eq!(
            sent["anthropic_beta"],
            json!(["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"]),
            "stream={stream}: {sent}"
        );
        assert_eq!(sent["anthropic_version"], "bedrock-2023-05-31", "{sent}");
    }
}
