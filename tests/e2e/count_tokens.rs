//! `POST /v1/messages/count_tokens` over loopback: the Anthropic provider's own count (the
//! mock answers Anthropic's count endpoint byte for byte and refuses what Anthropic
//! refuses there), the local `o200k_base` estimate for OpenAI-compatible routes and for
//! failed provider counts, fallback to the next route, the ingress errors in Anthropic's
//! shape, the limits a count does not spend, and the official `anthropic` SDK's
//! `messages.count_tokens` (`tests/sdk/count_tokens_client.py`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{post_json, request, Response};
use crate::harness::{dead_url, eventually, Mock, Sluice, KEY};
use crate::sdk::run_python;

const PATH: &str = "/v1/messages/count_tokens";
/// A key of tenant `r`, which may use `acme/gpt` only.
const RESTRICTED_KEY: &str = "sk-test-count-restricted-0001";

/// Providers `oa` (OpenAI-compatible), `claude` (Anthropic) at the mock, `claude-down`
/// (Anthropic, nothing listening); models `acme/claude` → `claude-mock-1`, `acme/gpt` →
/// `gpt-mock-1`, `acme/claude-fallback` → `claude-down` then `claude`. Tenant `t` has a
/// rate of 2 requests per minute and one concurrent stream.
fn config(base_url: &str) -> String {
    let dead = dead_url();
    format!(
        r#"server:
  listen: {{listen}}
  admin_listen: {{admin}}
  threads: 2
tenants:
  t: {{requests_per_minute: 2, max_concurrent_streams: 1}}
  r: {{allowed_models: [acme/gpt]}}
virtual_keys:
  - key: {KEY}
    tenant: t
  - key: {RESTRICTED_KEY}
    tenant: r
providers:
  oa:
    kind: openai
    base_url: {base_url}
    api_key: sk-provider-secret-oa
    health_check: {{enabled: false}}
  claude:
    kind: anthropic
    base_url: {base_url}
    api_key: sk-ant-provider-secret
    first_byte_timeout_ms: 1000
    health_check: {{enabled: false}}
  claude-down:
    kind: anthropic
    base_url: {dead}
    api_key: sk-ant-provider-secret-2
    health_check: {{enabled: false}}
models:
  acme/claude:
    routes:
      - provider: claude
        upstream_model: claude-mock-1
  acme/gpt:
    routes:
      - provider: oa
        upstream_model: gpt-mock-1
  acme/claude-fallback:
    routes:
      - provider: claude-down
        upstream_model: claude-down-1
        priority: 1
      - provider: claude
        upstream_model: claude-mock-2
        priority: 2
"#
    )
}

fn count(sluice: &Sluice, key: &str, body: &str, extra: &[(&str, &str)]) -> Response {
    let mut headers = vec![("x-api-key", key), ("anthropic-version", "2023-06-01")];
    headers.extend_from_slice(extra);
    post_json(sluice.addr, PATH, &headers, body)
}

/// A Claude Code-like count body: system, a multi-turn history with a tool call and its
/// result, a tool definition; plus the generation-only members a client may leave in.
fn body(model: &str, question: &str) -> String {
    json!({
        "model": model,
        "max_tokens": 1024,
        "stream": true,
        "system": [{"type": "text", "text": "You are a careful coding assistant."}],
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "src/main.rs"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() { println!(\"hi\"); }"}
            ]}
        ],
        "tools": [{
            "name": "read_file",
            "description": "Read a file of the repository",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
        }]
    })
    .to_string()
}

fn input_tokens(r: &Response) -> u64 {
    let v = r.json();
    assert_eq!(
        v.as_object().map(|o| o.len()),
        Some(1),
        "exactly {{\"input_tokens\": N}}: {v}"
    );
    v["input_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no input_tokens: {v}"))
}

/// Asserts an Anthropic error body `{"type":"error","error":{"type":..,"message":..}}`.
fn anthropic_error(r: &Response, status: u16, kind: &str) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(r.header("x-request-id").is_some());
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn count_requests(mock: &Mock) -> Vec<Value> {
    mock.log()
        .into_iter()
        .filter(|r| r["path"] == PATH)
        .collect()
}

fn header<'r>(record: &'r Value, name: &str) -> Option<&'r str> {
    record["all_headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

#[test]
fn an_anthropic_route_answers_with_the_providers_own_count() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let r = count(
        &sluice,
        KEY,
        &body("acme/claude", "What does this program print?"),
        &[
            ("anthropic-beta", "token-counting-2024-11-01"),
            ("x-request-id", "count-req-1"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The mock counts the words of `system` and of every message's text blocks: 6 + 5.
    assert_eq!(input_tokens(&r), 11);
    assert_eq!(r.header("x-sluice-token-count"), Some("provider"));
    assert_eq!(r.header("x-sluice-provider"), Some("claude"));
    assert_eq!(r.header("x-request-id"), Some("count-req-1"));
    assert_eq!(r.header("content-type"), Some("application/json"));

    let log = count_requests(&mock);
    assert_eq!(log.len(), 1, "{log:?}");
    let up = &log[0];
    assert_eq!(up["method"], "POST");
    assert_eq!(up["model"], "claude-mock-1", "the upstream model id");
    assert_eq!(header(up, "x-api-key"), Some("sk-ant-provider-secret"));
    assert_eq!(header(up, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        header(up, "anthropic-beta"),
        Some("token-counting-2024-11-01")
    );
    assert_eq!(header(up, "x-request-id"), Some("count-req-1"));
    // Only the members Anthropic's count endpoint takes (the mock would refuse the rest).
    let sent: Value = serde_json::from_str(up["body"].as_str().unwrap()).unwrap();
    let mut keys: Vec<&str> = sent
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["messages", "model", "system", "tools"]);
    assert_eq!(sent["tools"][0]["name"], "read_file");

    // The access line names the provider; a count adds nothing to the generation metrics.
    // The access line is written after the answer (Pingora's logging phase).
    assert!(
        crate::harness::eventually(Duration::from_secs(3), || sluice
            .log()
            .contains("request_id=count-req-1")),
        "{}",
        sluice.log()
    );
    let line = sluice
        .log()
        .lines()
        .find(|l| l.contains("request_id=count-req-1"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        line.contains("provider=claude") && line.contains("status=200"),
        "{line}"
    );
    assert_eq!(
        sluice.metric(r#"sluice_token_counts_total{method="provider",model="acme/claude"}"#),
        1.0
    );
    assert_eq!(
        sluice.metric(r#"sluice_token_counts_total{method="estimate",model="acme/claude"}"#),
        0.0
    );
    // Counting is not generation: no request duration sample (its latency would skew the
    // generation histograms).
    assert_eq!(
        sluice.metric_opt(
            r#"sluice_request_duration_seconds_count{model="acme/claude",provider="claude",stream="false"}"#
        ),
        None
    );
}

#[test]
fn an_openai_route_answers_a_tokenizer_estimate_that_grows_with_the_prompt() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let short = count(&sluice, KEY, &body("acme/gpt", "Hi?"), &[]);
    assert_eq!(short.status, 200, "{}", short.text());
    assert_eq!(short.header("x-sluice-token-count"), Some("estimate"));
    assert_eq!(short.header("x-sluice-provider"), None);
    let n_short = input_tokens(&short);
    // System, three turns, a tool call and result, a tool definition: dozens of tokens, not
    // bytes/4 of the body (~150) nor a word count.
    assert!((50..=130).contains(&n_short), "{n_short}");

    let long_question = "Explain, line by line, what this Rust program prints and why. ".repeat(20);
    let long = count(&sluice, KEY, &body("acme/gpt", &long_question), &[]);
    assert_eq!(long.status, 200, "{}", long.text());
    let n_long = input_tokens(&long);
    // 20 × ~13 tokens more.
    assert!(
        n_long >= n_short + 200 && n_long <= n_short + 340,
        "{n_short} → {n_long}"
    );
    let image = json!({
        "model": "acme/gpt",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Hi?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        ]}]
    });
    let with_image = count(&sluice, KEY, &image.to_string(), &[]);
    assert_eq!(with_image.status, 200, "{}", with_image.text());
    // 3 priming + 3 message + 2 text + the fixed 1,600 of an image.
    let n_image = input_tokens(&with_image);
    assert!((1_600..1_620).contains(&n_image), "{n_image}");
    // Nothing went upstream.
    assert_eq!(mock.hits(), 0, "{:?}", mock.log());
    assert_eq!(
        sluice.metric(r#"sluice_token_counts_total{method="estimate",model="acme/gpt"}"#),
        3.0
    );
}

#[test]
fn a_failing_provider_count_falls_back_to_the_next_route_then_to_the_estimate() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let question = "What does this program print?";

    // The first route refuses connections: the second one counts.
    let r = count(&sluice, KEY, &body("acme/claude-fallback", question), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(input_tokens(&r), 11);
    assert_eq!(r.header("x-sluice-token-count"), Some("provider"));
    assert_eq!(r.header("x-sluice-provider"), Some("claude"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!(count_requests(&mock)[0]["model"], "claude-mock-2");

    // Every provider answers 5xx, 429, or its credentials were refused: the estimate
    // answers (Claude Code keeps working).
    let estimate = {
        let r = count(&sluice, KEY, &body("acme/gpt", question), &[]);
        input_tokens(&r)
    };
    for status in [503, 500, 529, 429, 401, 404] {
        mock.reset();
        mock.set_behavior(&json!({"status": status}).to_string());
        let r = count(&sluice, KEY, &body("acme/claude", question), &[]);
        assert_eq!(r.status, 200, "upstream {status}: {}", r.text());
        assert_eq!(
            r.header("x-sluice-token-count"),
            Some("estimate"),
            "{status}"
        );
        assert_eq!(input_tokens(&r), estimate, "{status}");
        assert_eq!(count_requests(&mock).len(), 1, "{status}: asked once");
    }

    // A provider that stalls past its first-byte timeout (1 s), or breaks off its answer:
    // the estimate.
    for behavior in [
        json!({"first_byte_delay_ms": 3000}),
        json!({"close_before_first_event": true}),
        json!({"drop_after_tokens": 1}),
    ] {
        mock.reset();
        mock.set_behavior(&behavior.to_string());
        let r = count(&sluice, KEY, &body("acme/claude", question), &[]);
        assert_eq!(r.status, 200, "{behavior}: {}", r.text());
        assert_eq!(
            r.header("x-sluice-token-count"),
            Some("estimate"),
            "{behavior}"
        );
    }
}

#[test]
fn a_provider_that_refuses_the_request_answers_the_client_in_anthropics_shape() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    mock.set_behavior(
        &json!({"status": 400, "error_message": "messages.0.content: bad block sk-ant-provider-secret"})
            .to_string(),
    );
    let r = count(&sluice, KEY, &body("acme/claude", "hi"), &[]);
    let message = anthropic_error(&r, 400, "invalid_request_error");
    assert!(
        message.contains("messages.0.content: bad block"),
        "{message}"
    );
    assert!(
        !message.contains("sk-ant-provider-secret"),
        "the key is scrubbed: {message}"
    );
    assert_eq!(count_requests(&mock).len(), 1);
}

#[test]
fn ingress_errors_are_anthropic_errors_with_anthropic_statuses() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let ok = body("acme/claude", "hi");

    // Bad bodies: 400 invalid_request_error naming the field.
    for (bad, field) in [
        ("{", "JSON"),
        (r#"{"model":"acme/claude"}"#, "messages"),
        (r#"{"model":"acme/claude","messages":[]}"#, "messages"),
        (
            r#"{"model":"acme/claude","messages":[{"role":"robot","content":"x"}]}"#,
            "role",
        ),
        (r#"{"messages":[{"role":"user","content":"x"}]}"#, "model"),
        (
            r#"{"model":"acme/claude","messages":[{"role":"user","content":7}]}"#,
            "content",
        ),
    ] {
        let r = count(&sluice, KEY, bad, &[]);
        let message = anthropic_error(&r, 400, "invalid_request_error");
        assert!(message.contains(field), "{bad}: {message}");
    }

    // Keys: missing, unknown, by Bearer.
    let r = post_json(sluice.addr, PATH, &[], &ok);
    anthropic_error(&r, 401, "authentication_error");
    let r = count(&sluice, "sk-test-not-a-key-000000", &ok, &[]);
    anthropic_error(&r, 401, "authentication_error");
    let bearer = format!("Bearer {KEY}");
    let r = post_json(sluice.addr, PATH, &[("authorization", &bearer)], &ok);
    assert_eq!(r.status, 200, "{}", r.text());

    // Models: unknown, or not allowed for the tenant.
    let r = count(&sluice, KEY, &body("acme/nope", "hi"), &[]);
    let message = anthropic_error(&r, 404, "not_found_error");
    assert!(message.contains("acme/nope"), "{message}");
    let r = count(&sluice, RESTRICTED_KEY, &body("acme/claude", "hi"), &[]);
    anthropic_error(&r, 404, "not_found_error");
    let r = count(&sluice, RESTRICTED_KEY, &body("acme/gpt", "hi"), &[]);
    assert_eq!(r.status, 200, "{}", r.text());

    // Wrong method; the path without `/v1`.
    let r = request(sluice.addr, "GET", PATH, &[("x-api-key", KEY)], b"");
    anthropic_error(&r, 405, "invalid_request_error");
    let r = post_json(
        sluice.addr,
        "/messages/count_tokens",
        &[("x-api-key", KEY)],
        &ok,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Only the valid requests reached the provider.
    assert_eq!(count_requests(&mock).len(), 2);
}

#[test]
fn counting_spends_no_generation_budget() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    // Tenant `t` may make 2 requests a minute, one at a time.
    for i in 0..6 {
        let model = if i % 2 == 0 {
            "acme/claude"
        } else {
            "acme/gpt"
        };
        let r = count(&sluice, KEY, &body(model, "hi"), &[]);
        assert_eq!(r.status, 200, "count {i}: {}", r.text());
    }
    // Counting while a stream holds the tenant's one concurrency slot.
    let mut stream = crate::harness::client::StreamReader::open(
        sluice.addr,
        "/v1/messages",
        &[("x-api-key", KEY)],
        r#"{"model":"acme/claude","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tokens":3,"token_delay_ms":400}}"#,
    );
    assert_eq!(stream.status, 200);
    let r = count(&sluice, KEY, &body("acme/claude", "hi"), &[]);
    assert_eq!(r.status, 200, "count beside a stream: {}", r.text());
    let _ = stream.read_to_end(Duration::from_secs(10));
    // The generation budget is whole: the second generation passes, the third is refused.
    let gen =
        r#"{"model":"acme/claude","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_json(sluice.addr, "/v1/messages", &[("x-api-key", KEY)], gen);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_json(sluice.addr, "/v1/messages", &[("x-api-key", KEY)], gen);
    anthropic_error(&r, 429, "rate_limit_error");
    // The generation metrics saw the one non-stream generation, none of the 4 provider
    // counts of `acme/claude`.
    assert!(eventually(Duration::from_secs(2), || {
        sluice.metric_opt(
        r#"sluice_request_duration_seconds_count{model="acme/claude",provider="claude",stream="false"}"#
    ) == Some(1.0)
    }));
    assert_eq!(
        sluice.metric(r#"sluice_token_counts_total{method="provider",model="acme/claude"}"#),
        4.0
    );
}

#[test]
fn the_official_anthropic_sdk_counts_tokens_through_sluice() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/count_tokens_client.py");
    let base_url = format!("http://{}", sluice.addr);
    for (model, expect) in [("acme/claude", "provider"), ("acme/gpt", "estimate")] {
        let (ok, out) = run_python(
            &[
                script.to_str().expect("utf-8 path"),
                "--base-url",
                &base_url,
                "--key",
                KEY,
                "--model",
                model,
                "--expect-method",
                expect,
            ],
            Duration::from_secs(120),
        );
        assert!(ok, "the SDK script failed for {model}:\n{out}");
        assert!(out.contains("sdk count ok"), "{out}");
    }
    // The provider count went upstream once per call with the upstream model; the error
    // case did not.
    let log = count_requests(&mock);
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log.iter().all(|r| r["model"] == "claude-mock-1"));
}

/// What Claude Code 2.1 sends for a gateway model id (issue 28, items 1 and 2): adaptive
/// thinking with `display: omitted`, `output_config.effort`, a `system` message in the
/// history and a server tool. Counted by Anthropic with every member as sent, and by the
/// local estimate toward a provider that has no count endpoint.
#[test]
fn claude_code_requests_with_adaptive_thinking_and_system_messages_are_counted() {
    let mock = Mock::start(r#"{"prompt_tokens": 321}"#);
    let sluice = Sluice::start(&config(&mock.base_url()));
    let sent = |model: &str| {
        json!({
            "model": model,
            "max_tokens": 32000,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "output_config": {"effort": "xhigh"},
            "messages": [
                {"role": "user", "content": "List the files."},
                {"role": "system", "content": "The user's shell is bash."},
                {"role": "user", "content": [{"type": "text", "text": "And read main.rs."}]}
            ],
            "tools": [
                {"name": "Bash", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
            ]
        })
    };
    let r = count(&sluice, KEY, &sent("acme/claude").to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(input_tokens(&r), 321);
    let calls = count_requests(&mock);
    let got: Value = serde_json::from_str(calls[0]["body"].as_str().unwrap()).unwrap();
    for k in ["thinking", "output_config", "messages", "tools"] {
        assert_eq!(
            got[k],
            sent("acme/claude")[k],
            "{k} reached Anthropic as sent"
        );
    }
    // Toward OpenAI there is no count endpoint: Sluice's own estimate, never a 400.
    let r = count(&sluice, KEY, &sent("acme/gpt").to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(input_tokens(&r) > 0);
}
