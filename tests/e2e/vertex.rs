//! The `vertex` provider kind (Google Vertex AI, issue 13) over loopback with the mock
//! speaking Vertex AI and Google's OAuth2 token endpoint: a service-account key made for the
//! test (RSA with the `openssl` command line) signs the RS256 assertion, the mock verifies
//! it on its own and issues expiring tokens; Claude models go to `rawPredict` /
//! `streamRawPredict` (Messages, `anthropic_version: vertex-2023-10-16`, no `model`), Gemini
//! models to `generateContent` / `streamGenerateContent?alt=sse`, both with `Authorization:
//! Bearer`. Covered: both model families × Chat/Messages clients × stream or not, the model
//! echo and metered usage, tools, image input, Google's errors (fallback to the next kind
//! before the first byte, client errors final, credentials 502), a mid-stream error, a client
//! abort, token refresh under traffic with short-lived tokens, a failing token endpoint, and
//! the config errors of `sluice -t`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cloud_providers::{answer_text, data, echoed_models, num, send, Client};
use crate::harness::client::StreamReader;
use crate::harness::{Mock, Sluice, TempDir, KEY};

const TEXT: &str = "héllo from vërtex";
const CREDENTIALS_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// The key of the first-party Anthropic and OpenAI providers the fallback chains end on.
const DIRECT_KEY: &str = "direct-key-3b1c";

/// A service-account key generated for one test, and its JSON key file.
pub(crate) struct TestKey {
    _dir: TempDir,
    /// The key file (`type`, `client_email`, `private_key`, `private_key_id`, `token_uri`).
    pub file: PathBuf,
    /// The public key, PEM `PUBLIC KEY` (the mock's `token_public_key`).
    pub public_pem: String,
    /// The private key PEM (to check it never reaches a log).
    pub private_pem: String,
}

impl TestKey {
    /// A fresh 2048-bit RSA key whose key file names `token_uri`.
    pub(crate) fn new(token_uri: &str) -> TestKey {
        let dir = TempDir::new("vertex-key");
        let key = dir.path().join("key.pem");
        let public = dir.path().join("public.pem");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("the openssl command line (package `openssl`) makes the test key");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let key_s = key.to_str().expect("utf-8 path");
        let public_s = public.to_str().expect("utf-8 path");
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            key_s,
        ]);
        run(&["pkey", "-in", key_s, "-pubout", "-out", public_s]);
        let private_pem = std::fs::read_to_string(&key).expect("key");
        let public_pem = std::fs::read_to_string(&public).expect("public key");
        let file = dir.path().join("service-account.json");
        let json = json!({
            "type": "service_account",
            "project_id": "test-project",
            "private_key_id": "0123456789abcdef0123456789abcdef01234567",
            "private_key": private_pem,
            "client_email": "sluice-test@test-project.iam.gserviceaccount.com",
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "universe_domain": "googleapis.com",
        });
        std::fs::write(&file, serde_json::to_vec_pretty(&json).expect("json")).expect("write key");
        TestKey {
            _dir: dir,
            file,
            public_pem,
            private_pem,
        }
    }

    fn env(&self) -> [(&'static str, &str); 1] {
        [(CREDENTIALS_ENV, self.file.to_str().expect("utf-8 path"))]
    }
}

/// A behaviour object with the key registered at the mock's token endpoint.
fn with_key(key: &TestKey, mut behavior: Value) -> String {
    behavior["token_public_key"] = Value::String(key.public_pem.clone());
    behavior.to_string()
}

/// `good` serves `vx` (Vertex, token endpoint from the key file) and the first-party
/// `an`/`oa` kinds; `bad` serves `vx-bad` (its own token endpoint, failing model calls);
/// `broken`'s token endpoint serves `vx-broken`.
fn config(good: &Mock, bad: &Mock, broken: &Mock) -> String {
    let g = format!("http://{}", good.addr);
    let b = format!("http://{}", bad.addr);
    let k = format!("http://{}", broken.addr);
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
  vx:
    kind: vertex
    project: test-project
    region: us-central1
    credentials_file_env: {CREDENTIALS_ENV}
    base_url: {g}/v1
  vx-bad:
    kind: vertex
    project: test-project
    region: us-central1
    credentials_file_env: {CREDENTIALS_ENV}
    base_url: {b}/v1
    token_url: {b}/token
    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}
  vx-broken:
    kind: vertex
    project: test-project
    region: us-central1
    credentials_file_env: {CREDENTIALS_ENV}
    base_url: {k}/v1
    token_url: {k}/token
    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}
  an:
    kind: anthropic
    base_url: {g}/v1
    api_key: {DIRECT_KEY}
    health_check: {{enabled: false}}
  oa:
    kind: openai
    base_url: {g}/v1
    api_key: {DIRECT_KEY}
    health_check: {{enabled: false}}
models:
  acme/claude:
    routes:
      - {{provider: vx, upstream_model: claude-sonnet-4-6}}
  acme/gem:
    routes:
      - {{provider: vx, upstream_model: gemini-2.5-flash}}
  acme/claude-then-anthropic:
    routes:
      - {{provider: vx-bad, upstream_model: claude-sonnet-4-6, priority: 10}}
      - {{provider: an, upstream_model: claude-sonnet-4-6, priority: 20}}
  acme/gem-then-openai:
    routes:
      - {{provider: vx-bad, upstream_model: gemini-2.5-flash, priority: 10}}
      - {{provider: oa, upstream_model: gpt-4o, priority: 20}}
  acme/no-token-then-anthropic:
    routes:
      - {{provider: vx-broken, upstream_model: claude-sonnet-4-6, priority: 10}}
      - {{provider: an, upstream_model: claude-sonnet-4-6, priority: 20}}
"#
    )
}

/// Mocks `good`, `bad`, `broken`, the key (token endpoint: `good`'s) and Sluice.
struct Rig {
    good: Mock,
    bad: Mock,
    broken: Mock,
    key: TestKey,
    sluice: Sluice,
}

fn rig(good: Value, bad: Value) -> Rig {
    // The key's token URL names the mock's port: start the mock first, register the key after.
    let good_mock = Mock::start("{}");
    let key = TestKey::new(&format!("http://{}/token", good_mock.addr));
    good_mock.set_behavior(&with_key(&key, good));
    let bad = Mock::start(&with_key(&key, bad));
    let broken = Mock::start(&with_key(&key, json!({"token_status": 503})));
    let sluice = Sluice::start_with_env(&config(&good_mock, &bad, &broken), &key.env());
    Rig {
        good: good_mock,
        bad,
        broken,
        key,
        sluice,
    }
}

/// The model calls (not token requests) in a mock log.
fn calls(log: &[Value]) -> Vec<&Value> {
    log.iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains("/projects/")))
        .collect()
}

fn token_requests(log: &[Value]) -> usize {
    log.iter()
        .filter(|r| r["path"].as_str() == Some("/token"))
        .count()
}

fn header(rec: &Value, name: &str) -> Option<String> {
    rec["all_headers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
        .map(str::to_string)
}

fn sent_body(rec: &Value) -> Value {
    serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON body")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn claude_and_gemini_on_vertex_answer_chat_and_messages_clients_with_a_bearer_token() {
    let r = rig(
        json!({"text": TEXT, "prompt_tokens": 17, "cached_tokens": 4}),
        json!({}),
    );
    let mut n = 0;
    for (model, claude) in [("acme/claude", true), ("acme/gem", false)] {
        for client in [Client::Chat, Client::Messages] {
            for stream in [false, true] {
                n += 1;
                let id = format!("vx-{n}");
                let cell = format!("{client:?} → {model} stream={stream}");
                let before = r.good.log().len();
                let (status, provider, bytes) =
                    send(&r.sluice, client, &client.body(model, stream), &id);
                let shown = String::from_utf8_lossy(&bytes).to_string();
                assert_eq!(status, 200, "{cell}: {shown}");
                assert_eq!(provider.as_deref(), Some("vx"), "{cell}");
                assert_eq!(answer_text(client, stream, &bytes), TEXT, "{cell}: {shown}");
                let models = echoed_models(client, stream, &bytes);
                assert!(!models.is_empty(), "{cell}: {shown}");
                assert!(models.iter().all(|m| m == model), "{cell}: {models:?}");
                assert!(!shown.contains("claude-sonnet-4-6"), "{cell}: {shown}");
                if stream && client == Client::Chat {
                    assert!(shown.ends_with("data: [DONE]\n\n"), "{cell}: {shown}");
                }
                if stream && client == Client::Messages {
                    assert!(shown.contains("event: message_stop"), "{cell}: {shown}");
                }

                let log = r.good.log();
                let new: Vec<&Value> = calls(&log[before..]);
                assert_eq!(new.len(), 1, "{cell}: {log:?}");
                let rec = new[0];
                assert_eq!(rec["status"], 200, "{cell}: {rec}");
                let auth = header(rec, "authorization").unwrap_or_default();
                assert!(auth.starts_with("Bearer ya29.mock-"), "{cell}: {auth}");
                assert!(header(rec, "x-api-key").is_none(), "{cell}");
                assert!(header(rec, "x-goog-api-key").is_none(), "{cell}");
                let sent = sent_body(rec);
                let path = rec["path"].as_str().unwrap_or_default();
                let base = "/v1/projects/test-project/locations/us-central1/publishers";
                if claude {
                    let method = if stream {
                        "streamRawPredict"
                    } else {
                        "rawPredict"
                    };
                    assert_eq!(
                        path,
                        format!("{base}/anthropic/models/claude-sonnet-4-6:{method}"),
                        "{cell}"
                    );
                    assert_eq!(
                        sent["anthropic_version"], "vertex-2023-10-16",
                        "{cell}: {sent}"
                    );
                    assert!(sent.get("model").is_none(), "{cell}: {sent}");
                    assert_eq!(
                        sent["stream"].as_bool().unwrap_or(false),
                        stream,
                        "{cell}: {sent}"
                    );
                    assert_eq!(
                        sent["messages"][0]["content"],
                        if client == Client::Chat {
                            json!([{"type": "text", "text": "say hello"}])
                        } else {
                            json!("say hello")
                        },
                        "{cell}: {sent}"
                    );
                } else {
                    let method = if stream {
                        "streamGenerateContent?alt=sse"
                    } else {
                        "generateContent"
                    };
                    assert_eq!(
                        path,
                        format!("{base}/google/models/gemini-2.5-flash:{method}"),
                        "{cell}"
                    );
                    assert_eq!(
                        sent["contents"],
                        json!([{"role": "user", "parts": [{"text": "say hello"}]}]),
                        "{cell}: {sent}"
                    );
                    assert!(sent.get("model").is_none(), "{cell}: {sent}");
                }

                let a = r.sluice.access_record(&id);
                assert_eq!(a["outcome"], "ok", "{cell}: {a}");
                assert_eq!(a["provider"], "vx", "{cell}: {a}");
                assert_eq!(num(&a, "input_tokens"), 17, "{cell}: {a}");
                assert_eq!(num(&a, "cached_input_tokens"), 4, "{cell}: {a}");
                let words = TEXT.split_whitespace().count() as u64;
                assert_eq!(num(&a, "output_tokens"), words, "{cell}: {a}");
                assert_eq!(a["estimated"], "false", "{cell}: {a}");
            }
        }
    }
    // Eight requests, one token: the token is cached and shared.
    assert_eq!(token_requests(&r.good.log()), 1);
    // Neither the key nor a token is ever logged.
    let log = r.sluice.log();
    assert!(!log.contains("ya29.mock"), "a token reached the log");
    let key_body = r.key.private_pem.lines().nth(1).expect("a PEM body line");
    assert!(!log.contains(key_body), "the private key reached the log");
}

#[test]
fn tools_and_images_go_to_both_model_families() {
    let r = rig(
        json!({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich"}}]}),
        json!({}),
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for model in ["acme/claude", "acme/gem"] {
        for stream in [false, true] {
            let cell = format!("{model} stream={stream}");
            let body = json!({"model": model, "stream": stream, "tools": tools,
                "messages": [{"role": "user", "content": "weather in Zürich?"}]});
            let (status, _, bytes) = send(&r.sluice, Client::Chat, &body, "vx-tools");
            let shown = String::from_utf8_lossy(&bytes).to_string();
            assert_eq!(status, 200, "{cell}: {shown}");
            let (name, args) = if stream {
                let evs = data(&bytes);
                let name = evs
                    .iter()
                    .find_map(|e| {
                        e["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str()
                    })
                    .map(str::to_string);
                let args: String = evs
                    .iter()
                    .filter_map(|e| {
                        e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
                    })
                    .collect();
                (name, args)
            } else {
                let v: Value = serde_json::from_slice(&bytes).expect("JSON");
                let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
                (
                    call["name"].as_str().map(str::to_string),
                    call["arguments"].as_str().unwrap_or_default().to_string(),
                )
            };
            assert_eq!(name.as_deref(), Some("get_weather"), "{cell}: {shown}");
            let args: Value = serde_json::from_str(&args).expect("arguments JSON");
            assert_eq!(args, json!({"city": "Zürich"}), "{cell}");
            let log = r.good.log();
            let sent = sent_body(calls(&log).last().expect("a call"));
            if model == "acme/claude" {
                assert_eq!(sent["tools"][0]["name"], "get_weather", "{cell}: {sent}");
                assert!(
                    sent["tools"][0]["input_schema"].is_object(),
                    "{cell}: {sent}"
                );
            } else {
                assert_eq!(
                    sent["tools"][0]["functionDeclarations"][0]["name"], "get_weather",
                    "{cell}: {sent}"
                );
            }
        }
    }

    // An image: a content block for Claude, inline data for Gemini.
    r.good
        .set_behavior(&with_key(&r.key, json!({"text": TEXT})));
    let png = "iVBORw0KGgo=";
    for model in ["acme/claude", "acme/gem"] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}}]}]});
        let (status, _, bytes) = send(&r.sluice, Client::Chat, &body, "vx-img");
        assert_eq!(status, 200, "{model}: {}", String::from_utf8_lossy(&bytes));
        let log = r.good.log();
        let sent = sent_body(calls(&log).last().expect("a call"));
        if model == "acme/claude" {
            assert_eq!(
                sent["messages"][0]["content"][1],
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}),
                "{sent}"
            );
        } else {
            assert_eq!(
                sent["contents"][0]["parts"][1],
                json!({"inlineData": {"mimeType": "image/png", "data": png}}),
                "{sent}"
            );
        }
    }
}

#[test]
fn google_errors_fall_back_before_the_first_byte_or_reach_the_client() {
    let r = rig(json!({"text": TEXT}), json!({"status": 429}));
    // Quota (429 RESOURCE_EXHAUSTED in Google's shape): the next kind answers.
    for (model, then) in [
        ("acme/claude-then-anthropic", "an"),
        ("acme/gem-then-openai", "oa"),
    ] {
        for (client, stream) in [(Client::Chat, true), (Client::Messages, false)] {
            let cell = format!("{model} {client:?} stream={stream}");
            let before = calls(&r.bad.log()).len();
            let (status, provider, bytes) =
                send(&r.sluice, client, &client.body(model, stream), "vx-fb");
            assert_eq!(status, 200, "{cell}: {}", String::from_utf8_lossy(&bytes));
            assert_eq!(provider.as_deref(), Some(then), "{cell}");
            assert_eq!(answer_text(client, stream, &bytes), TEXT, "{cell}");
            let log = r.bad.log();
            let tried = calls(&log);
            assert_eq!(tried.len(), before + 1, "{cell}: vx-bad was not tried");
            let last = tried.last().expect("a call");
            assert_eq!(last["status"], 429, "{cell}: {last}");
        }
    }
    assert!(r
        .sluice
        .metrics()
        .lines()
        .any(|l| l.starts_with("sluice_fallback_total")
            && l.contains("from_provider=\"vx-bad\"")
            && l.contains("to_provider=\"an\"")));

    // A permission problem is the gateway's: it falls back too.
    r.bad
        .set_behavior(&with_key(&r.key, json!({"status": 403})));
    let (status, provider, _) = send(
        &r.sluice,
        Client::Chat,
        &Client::Chat.body("acme/gem-then-openai", false),
        "vx-403",
    );
    assert_eq!((status, provider.as_deref()), (200, Some("oa")));

    // INVALID_ARGUMENT is the client's: final, in the client's dialect, no fallback.
    r.bad.set_behavior(&with_key(
        &r.key,
        json!({"status": 400, "error_message": "Unable to submit request because it has an empty text parameter."}),
    ));
    let good_before = r.good.log().len();
    for (client, model) in [
        (Client::Chat, "acme/gem-then-openai"),
        (Client::Messages, "acme/gem-then-openai"),
    ] {
        let (status, _, bytes) = send(&r.sluice, client, &client.body(model, false), "vx-400");
        let v: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(status, 400, "{client:?}: {v}");
        let message = if client == Client::Chat {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            v["error"]["message"].clone()
        } else {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            v["error"]["message"].clone()
        };
        assert!(
            message
                .as_str()
                .unwrap_or_default()
                .contains("empty text parameter"),
            "{v}"
        );
    }
    assert_eq!(r.good.log().len(), good_before, "a client error fell back");
}

#[test]
fn a_failing_token_endpoint_is_a_provider_failure_and_the_request_falls_back() {
    let r = rig(json!({"text": TEXT}), json!({}));
    for i in 0..6 {
        let (status, provider, bytes) = send(
            &r.sluice,
            Client::Messages,
            &Client::Messages.body("acme/no-token-then-anthropic", i % 2 == 0),
            &format!("vx-notoken-{i}"),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        assert_eq!(provider.as_deref(), Some("an"));
        assert_eq!(answer_text(Client::Messages, i % 2 == 0, &bytes), TEXT);
    }
    let log = r.broken.log();
    assert!(
        calls(&log).is_empty(),
        "no model call without a token: {log:?}"
    );
    let asked = token_requests(&log);
    // Failures are held for a second and retried with a backoff: not one fetch per request.
    assert!(
        (1..=4).contains(&asked),
        "{asked} token requests for 6 requests"
    );
    let failed = r
        .sluice
        .metric("sluice_provider_token_fetches_total{provider=\"vx-broken\",result=\"error\"}");
    assert!(failed >= 1.0, "{failed}");
    assert!(log.iter().all(|rec| rec["status"] == 503), "{log:?}");
    let a = r.sluice.access_record("vx-notoken-5");
    assert_eq!(a["outcome"], "ok", "{a}");
    let text = r.sluice.log();
    assert!(
        text.contains("no access token") && text.contains("HTTP 503"),
        "the attempt log names the token failure:\n{text}"
    );
    // Still serving: a Vertex model with a working endpoint answers.
    let (status, _, _) = send(
        &r.sluice,
        Client::Chat,
        &Client::Chat.body("acme/claude", false),
        "vx-after",
    );
    assert_eq!(status, 200);
}

#[test]
fn short_lived_tokens_are_refreshed_during_traffic_without_a_failed_request() {
    // Tokens of 2 s, traffic for 7 s from three clients: several lifetimes.
    let r = rig(json!({"tokens": 3, "token_lifetime_s": 2}), json!({}));
    let end = Instant::now() + Duration::from_secs(7);
    let results: Vec<(u32, Vec<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let sluice = &r.sluice;
                s.spawn(move || {
                    let mut ok = 0u32;
                    let mut failures = Vec::new();
                    let mut i = 0u32;
                    while Instant::now() < end {
                        i += 1;
                        let model = if (i + w).is_multiple_of(2) {
                            "acme/claude"
                        } else {
                            "acme/gem"
                        };
                        let client = if i.is_multiple_of(3) {
                            Client::Messages
                        } else {
                            Client::Chat
                        };
                        let stream = i % 2 == 1;
                        let (status, _, bytes) = send(
                            sluice,
                            client,
                            &client.body(model, stream),
                            &format!("vx-refresh-{w}-{i}"),
                        );
                        if status == 200 && answer_text(client, stream, &bytes) == "tok0 tok1 tok2 "
                        {
                            ok += 1;
                        } else {
                            failures.push(format!(
                                "{client:?} {model} stream={stream}: {status} {}",
                                String::from_utf8_lossy(&bytes)
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    (ok, failures)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let ok: u32 = results.iter().map(|(n, _)| n).sum();
    let failures: Vec<&String> = results.iter().flat_map(|(_, f)| f).collect();
    assert!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
    assert!(ok >= 30, "only {ok} requests in 7 s");
    let log = r.good.log();
    let model_calls = calls(&log);
    assert_eq!(model_calls.len(), ok as usize);
    assert!(
        model_calls.iter().all(|c| c["status"] == 200),
        "a request met an expired token"
    );
    // Refreshed ahead of expiry (at 1.5 s of 2): 4-6 tokens for 7 s, not one per request.
    let tokens = token_requests(&log);
    assert!(
        (4..=8).contains(&tokens),
        "{tokens} token requests for {ok} requests"
    );
    let distinct: std::collections::HashSet<String> = model_calls
        .iter()
        .filter_map(|c| header(c, "authorization"))
        .collect();
    assert!(distinct.len() >= 3, "{} tokens used", distinct.len());
    let fetched = r
        .sluice
        .metric("sluice_provider_token_fetches_total{provider=\"vx\",result=\"ok\"}");
    // Scraped after the log: the task may have refreshed once more meanwhile.
    assert!(
        (tokens..=tokens + 1).contains(&(fetched as usize)),
        "the metric counts the fetches: {fetched} vs {tokens}"
    );
}

#[test]
fn a_mid_stream_error_and_a_client_abort_end_vertex_streams() {
    let r = rig(json!({"tokens": 6, "error_after_tokens": 2}), json!({}));
    for (model, error_type) in [
        ("acme/claude", "overloaded_error"),
        ("acme/gem", "UNAVAILABLE"),
    ] {
        r.good.set_behavior(&with_key(
            &r.key,
            json!({"tokens": 6, "error_after_tokens": 2, "error_type": error_type,
                   "error_message": "The model is overloaded."}),
        ));
        for client in [Client::Chat, Client::Messages] {
            let cell = format!("{client:?} → {model}");
            let (status, _, bytes) = send(&r.sluice, client, &client.body(model, true), "vx-mid");
            let shown = String::from_utf8_lossy(&bytes).to_string();
            assert_eq!(status, 200, "{cell}: {shown}");
            assert_eq!(
                answer_text(client, true, &bytes),
                "tok0 tok1 ",
                "{cell}: {shown}"
            );
            assert!(shown.contains("event: error"), "{cell}: {shown}");
            assert!(
                !shown.contains("[DONE]") && !shown.contains("message_stop"),
                "{cell}: {shown}"
            );
            if client == Client::Messages {
                let err = data(&bytes)
                    .into_iter()
                    .find(|d| d["type"] == "error")
                    .unwrap_or_else(|| panic!("{cell}: {shown}"));
                assert_eq!(err["error"]["type"], "overloaded_error", "{cell}: {err}");
            }
        }
    }
    assert_eq!(
        calls(&r.good.log()).len(),
        4,
        "a committed stream is never sent again"
    );

    // The client goes away: the Vertex stream is closed.
    r.good.set_behavior(&with_key(
        &r.key,
        json!({"tokens": 500, "token_delay_ms": 20}),
    ));
    r.good.reset();
    for (i, model) in ["acme/claude", "acme/gem"].into_iter().enumerate() {
        let owned = Client::Chat.headers("vx-abort");
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut s = StreamReader::open(
            r.sluice.addr,
            Client::Chat.path(),
            &headers,
            &Client::Chat.body(model, true).to_string(),
        );
        assert_eq!(s.status, 200, "{model}");
        let first = s.read_until(b"tok2 ", Duration::from_secs(5));
        assert!(String::from_utf8_lossy(&first).contains("tok2 "), "{model}");
        s.close();
        let log = r.good.wait_log(Duration::from_secs(5), |log| {
            calls(log)
                .get(i)
                .is_some_and(|c| c["peer_closed_at_ms"].is_u64())
        });
        let c = calls(&log)[i].clone();
        assert!(c["peer_closed_at_ms"].is_u64(), "{model}: {c}");
        assert_eq!(c["completed"], false, "{model}: {c}");
    }
}

#[test]
fn sluice_t_names_the_vertex_setting_that_is_wrong() {
    let key = TestKey::new("http://127.0.0.1:9/token");
    let dir = TempDir::new("vertex-config");
    let check = |provider: &str, env: Option<&str>| {
        let path = dir.path().join("sluice.yaml");
        std::fs::write(
            &path,
            format!(
                "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  vx:\n{provider}models:\n  m:\n    routes:\n      - provider: vx\n        upstream_model: claude-sonnet-4-6\n"
            ),
        )
        .expect("write config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("-t").arg("-c").arg(&path).env_remove("RUST_LOG");
        match env {
            Some(v) => cmd.env(CREDENTIALS_ENV, v),
            None => cmd.env_remove(CREDENTIALS_ENV),
        };
        let out = cmd.output().expect("run sluice -t");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let file = key.file.to_str().expect("utf-8 path");
    let good = "    kind: vertex\n    project: my-project\n    region: us-central1\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n";
    let (ok, out) = check(good, Some(file));
    assert!(ok, "{out}");
    assert!(!out.contains("BEGIN"), "{out}");

    let not_json = dir.path().join("not-a-key.json");
    std::fs::write(&not_json, "{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----\\nc2VjcmV0\\n-----END PRIVATE KEY-----\\n\", \"client_email\": \"a@b\", \"private_key_id\": \"k\"}").expect("write");
    for (section, env, want) in [
        (
            "    kind: vertex\n    region: us-central1\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n",
            Some(file),
            "sluice.yaml:10:3: providers.vx: project is required for kind vertex",
        ),
        (
            "    kind: vertex\n    project: my-project\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n",
            Some(file),
            "providers.vx: region is required for kind vertex",
        ),
        (
            "    kind: vertex\n    project: my-project\n    region: us-central1\n",
            Some(file),
            "providers.vx: credentials_file_env is required",
        ),
        (
            good,
            None,
            "sluice.yaml:14:5: providers.vx.credentials_file_env: environment variable `GOOGLE_APPLICATION_CREDENTIALS` is not set",
        ),
        (good, Some("/nonexistent/key.json"), "cannot be read"),
        (
            good,
            Some(not_json.to_str().expect("utf-8 path")),
            "no PEM RSA private key",
        ),
        (
            "    kind: vertex\n    project: My_Project\n    region: us-central1\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n",
            Some(file),
            "providers.vx.project: must be a Google Cloud project id",
        ),
        (
            "    kind: vertex\n    project: my-project\n    region: us-central1\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n    api_key: k\n",
            Some(file),
            "providers.vx.api_key: kind vertex authenticates with a service-account key",
        ),
        (
            "    kind: gemini\n    api_key: k\n    project: my-project\n",
            Some(file),
            "providers.vx.project: project is only for kind vertex",
        ),
        (
            "    kind: vertex\n    project: my-project\n    region: us-central1\n    credentials_file_env: GOOGLE_APPLICATION_CREDENTIALS\n    token_url: ftp://x/token\n",
            Some(file),
            "providers.vx.token_url: token URL",
        ),
    ] {
        let (ok, out) = check(section, env);
        assert!(!ok, "{section} should fail:\n{out}");
        assert!(out.contains(want), "want {want:?}:\n{out}");
        assert!(!out.contains("c2VjcmV0"), "the key file was quoted:\n{out}");
        assert!(!out.contains("PRIVATE KEY"), "the key file was quoted:\n{out}");
    }
}

#[test]
fn official_anthropic_and_openai_sdks_work_on_vertex_claude_and_gemini() {
    let text = "Hello from Vertex: héllo 世界 🚀, twenty tokens or so of text.";
    let answered = "upstream-dated-2026-01-01";
    let good = Mock::start("{}");
    let key = TestKey::new(&format!("http://{}/token", good.addr));
    let text_behavior = with_key(
        &key,
        json!({"text": text, "split": "mid_utf8", "answer_model": answered}),
    );
    good.set_behavior(&text_behavior);
    let tools = json!([
        {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
    ]);
    let tool_text = "Let me check both.";
    let tools_behavior = with_key(
        &key,
        json!({"text": tool_text, "tool_calls": tools, "split": "mid_utf8", "answer_model": answered}),
    );
    let thought = "Höw tö greet: wärmly, 🤝 first.";
    let reasoning_behavior = with_key(
        &key,
        json!({"text": text, "reasoning": thought, "split": "mid_utf8", "answer_model": answered}),
    );
    let url = format!("http://{}", good.addr);
    let sluice = Sluice::start_with_env(
        &format!(
            "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  vx:\n    kind: vertex\n    project: test-project\n    region: europe-west4\n    credentials_file_env: {CREDENTIALS_ENV}\n    base_url: {url}/v1\nmodels:\n  acme/claude:\n    routes:\n      - provider: vx\n        upstream_model: claude-sonnet-4-6\n  acme/gem:\n    routes:\n      - provider: vx\n        upstream_model: gemini-2.5-flash\n"
        ),
        &key.env(),
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    let tools = tools.to_string();
    let (ok, out) = crate::sdk::run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            KEY,
            "--model",
            "acme/claude",
            "--model",
            "acme/gem",
            "--mock-url",
            &url,
            "--text-behavior",
            &text_behavior,
            "--expect-text",
            text,
            "--tools-behavior",
            &tools_behavior,
            "--expect-tool-text",
            tool_text,
            "--expect-tools",
            &tools,
            "--reasoning-behavior",
            &reasoning_behavior,
            "--expect-reasoning",
            thought,
            // Gemini sends each function call whole: one argument fragment per call.
            "--whole-tool-calls",
            "acme/gem",
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "the SDK script failed:\n{out}");
    assert!(out.contains("sdk ok"), "{out}");
    assert!(
        !out.contains(answered),
        "the upstream model id leaked:\n{out}"
    );
    let log = good.log();
    let model_calls = calls(&log);
    let at = |publisher: &str| {
        model_calls
            .iter()
            .filter(|r| {
                r["path"].as_str().unwrap_or_default().starts_with(&format!(
                    "/v1/projects/test-project/locations/europe-west4/publishers/{publisher}/models/"
                )) && r["status"] == 200
                    && header(r, "authorization").is_some_and(|a| a.starts_with("Bearer ya29.mock-"))
            })
            .count()
    };
    assert_eq!((at("anthropic"), at("google")), (11, 11), "{log:?}");
    assert_eq!(token_requests(&log), 1, "one token for the whole run");
}

#[test]
fn request_probes_reach_each_vertex_model_in_its_own_api_with_the_token() {
    let mock = Mock::start("{}");
    let key = TestKey::new(&format!("http://{}/token", mock.addr));
    mock.set_behavior(&with_key(&key, json!({"text": TEXT})));
    let url = format!("http://{}", mock.addr);
    let _sluice = Sluice::start_with_env(
        &format!(
            "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  vx:\n    kind: vertex\n    project: test-project\n    region: us-central1\n    credentials_file_env: {CREDENTIALS_ENV}\n    base_url: {url}/v1\n    health_check: {{mode: request, interval_ms: 300}}\nmodels:\n  acme/claude:\n    routes:\n      - provider: vx\n        upstream_model: claude-sonnet-4-6\n  acme/gem:\n    routes:\n      - provider: vx\n        upstream_model: gemini-2.5-flash\n"
        ),
        &key.env(),
    );
    let probed = |log: &[Value], publisher: &str, method: &str| {
        calls(log).iter().any(|r| {
            r["path"].as_str().is_some_and(|p| {
                p.contains(&format!("/publishers/{publisher}/models/")) && p.ends_with(method)
            }) && r["status"] == 200
                && header(r, "x-request-id").as_deref() == Some("sluice-health-probe")
                && header(r, "authorization").is_some_and(|a| a.starts_with("Bearer ya29.mock-"))
        })
    };
    let log = mock.wait_log(Duration::from_secs(15), |log| {
        probed(log, "anthropic", ":rawPredict") && probed(log, "google", ":generateContent")
    });
    assert!(probed(&log, "anthropic", ":rawPredict"), "{log:?}");
    assert!(probed(&log, "google", ":generateContent"), "{log:?}");
    let claude_probe = calls(&log)
        .into_iter()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(":rawPredict"))
        })
        .map(sent_body)
        .expect("a Claude probe");
    assert_eq!(claude_probe["max_tokens"], 1, "{claude_probe}");
    assert_eq!(
        claude_probe["anthropic_version"], "vertex-2023-10-16",
        "{claude_probe}"
    );
    assert!(claude_probe.get("model").is_none(), "{claude_probe}");
}

#[test]
fn a_clients_anthropic_beta_header_reaches_claude_on_vertex_not_gemini() {
    let r = rig(json!({"text": TEXT}), json!({}));
    let beta = "context-1m-2025-08-07";
    for (model, claude) in [("acme/claude", true), ("acme/gem", false)] {
        let before = r.good.log().len();
        let mut owned = Client::Messages.headers("vx-beta");
        owned.push(("anthropic-beta", beta.to_string()));
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = Client::Messages.body(model, false);
        let resp = crate::harness::client::post_json(
            r.sluice.addr,
            "/v1/messages",
            &headers,
            &body.to_string(),
        );
        assert_eq!(
            resp.status,
            200,
            "{model}: {}",
            String::from_utf8_lossy(&resp.body)
        );
        let log = r.good.log();
        let new = calls(&log[before..]);
        assert_eq!(new.len(), 1, "{model}: {log:?}");
        let want = claude.then_some(beta);
        assert_eq!(header(new[0], "anthropic-beta").as_deref(), want, "{model}");
        // The header, not a body member.
        assert!(sent_body(new[0]).get("anthropic_beta").is_none(), "{model}");
    }
}
