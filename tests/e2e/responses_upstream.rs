//! A route that speaks OpenAI Responses (`routes[].api: responses`, issue 29 item 3), over
//! loopback: a failure before the first byte falls back to a route of another kind for
//! every client dialect; a stream that breaks after its commit ends with the client's own
//! error event; usage with cached and reasoning tokens is metered (access log and cost) on
//! the forwarded and on the translated path; a request-mode health probe of the route speaks
//! Responses; `POST /v1/responses/input_tokens` and `POST /v1/responses/compact` are the
//! route's own.

use serde_json::{json, Value};

use crate::harness::client::{post_json, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

const MODEL: &str = "acme/r";

/// Sluice with [`MODEL`] served first by an OpenAI Responses route on `responses` and then
/// by an Anthropic route on `fallback` (priced: 2 USD/Mtok input, 0.5 cached, 8 output).
fn config(responses: &Mock, fallback: &Mock) -> String {
    let health = "    health: {degraded_after_failures: 100000, unhealthy_after_failures: 100000}\n    health_check: {enabled: false}\n";
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {}\n    api_key: sk-oa\n{health}  claude:\n    kind: anthropic\n    base_url: {}\n    api_key: sk-ant\n{health}models:\n  {MODEL}:\n    default_max_tokens: 1024\n    routes:\n      - {{provider: oa, upstream_model: gpt-r1, api: responses, priority: 1, input_usd_per_mtok: 2.0, cached_input_usd_per_mtok: 0.5, output_usd_per_mtok: 8.0}}\n      - {{provider: claude, upstream_model: claude-r1, priority: 2}}\n",
        responses.base_url(),
        fallback.base_url()
    )
}

/// One client dialect's request: its path, its headers, its body.
type ClientRequest = (&'static str, Vec<(&'static str, String)>, Value);

/// The three client dialects: path, headers, a one-turn body.
fn clients(stream: bool) -> Vec<ClientRequest> {
    let bearer = vec![("authorization", format!("Bearer {KEY}"))];
    vec![
        (
            "/v1/chat/completions",
            bearer.clone(),
            json!({"model": MODEL, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/messages",
            vec![
                ("x-api-key", KEY.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            json!({"model": MODEL, "stream": stream, "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/responses",
            bearer,
            json!({"model": MODEL, "stream": stream, "input": "hi"}),
        ),
    ]
}

/// Sends one request; (status, x-sluice-provider, body text).
fn send(
    sluice: &Sluice,
    path: &str,
    headers: &[(&str, String)],
    body: &Value,
) -> (u16, String, String) {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if body["stream"] == true {
        let mut r = StreamReader::open(sluice.addr, path, &h, &body.to_string());
        let provider = r
            .header("x-sluice-provider")
            .unwrap_or_default()
            .to_string();
        let status = r.status;
        let bytes = r.read_to_end(std::time::Duration::from_secs(10));
        (
            status,
            provider,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    } else {
        let r = post_json(sluice.addr, path, &h, &body.to_string());
        let provider = r
            .header("x-sluice-provider")
            .unwrap_or_default()
            .to_string();
        (r.status, provider, r.text())
    }
}

#[test]
fn a_responses_route_failing_before_the_first_byte_falls_back_to_another_kind() {
    let responses = Mock::start(r#"{"status": 503, "error_message": "responses down"}"#);
    let fallback = Mock::start(r#"{"text": "from the fallback"}"#);
    let sluice = Sluice::start(&config(&responses, &fallback));
    for stream in [false, true] {
        for (path, headers, body) in clients(stream) {
            responses.reset();
            fallback.reset();
            let (status, provider, text) = send(&sluice, path, &headers, &body);
            let cell = format!("{path} stream={stream}");
            assert_eq!(status, 200, "{cell}: {text}");
            assert_eq!(provider, "claude", "{cell}: {text}");
            assert!(text.contains("fallback"), "{cell}: {text}");
            let tried: Vec<String> = responses
                .log()
                .iter()
                .map(|r| r["path"].as_str().unwrap_or_default().to_string())
                .collect();
            assert_eq!(
                tried,
                ["/v1/responses"],
                "{cell}: the Responses route was tried"
            );
            assert_eq!(fallback.log().len(), 1, "{cell}");
        }
    }
}

#[test]
fn a_responses_stream_that_breaks_after_its_commit_ends_with_the_clients_error_event() {
    let responses = Mock::start(r#"{"tokens": 6, "drop_after_tokens": 3}"#);
    let fallback = Mock::start("{}");
    let sluice = Sluice::start(&config(&responses, &fallback));
    for (path, headers, body) in clients(true) {
        let (status, provider, text) = send(&sluice, path, &headers, &body);
        assert_eq!(status, 200, "{path}: committed: {text}");
        assert_eq!(provider, "oa", "{path}");
        assert!(
            text.contains("tok0 "),
            "{path}: the tokens before the break: {text}"
        );
        assert!(
            text.contains("event: error"),
            "{path}: an error event: {text}"
        );
        assert!(
            !text.contains("response.completed") && !text.contains("[DONE]"),
            "{path}: never a clean end: {text}"
        );
        if path == "/v1/responses" {
            // The gateway's error event goes on with the provider's sequence numbers.
            let seqs: Vec<u64> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|v| v["sequence_number"].as_u64())
                .collect();
            let want: Vec<u64> = (0..seqs.len() as u64).collect();
            assert_eq!(seqs, want, "{text}");
        }
    }
    assert_eq!(
        fallback.log().len(),
        0,
        "nothing falls back after the commit"
    );
}

/// The access-log fields of the request that answered with `x-request-id` `id`.
fn access_line(sluice: &Sluice, id: &str) -> String {
    let needle = format!("request_id={id} ");
    let mut line = String::new();
    assert!(
        crate::harness::eventually(std::time::Duration::from_secs(5), || {
            line = sluice
                .log()
                .lines()
                .find(|l| l.contains("sluice::access") && l.contains(&needle))
                .unwrap_or_default()
                .to_string();
            !line.is_empty()
        }),
        "no access line for {id}"
    );
    line
}

fn field<'l>(line: &'l str, key: &str) -> &'l str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
}

#[test]
fn cached_and_reasoning_tokens_are_metered_forwarded_and_translated() {
    let responses = Mock::start(
        r#"{"text": "four words of text", "reasoning": "two thoughts", "prompt_tokens": 1000, "cached_tokens": 600}"#,
    );
    let fallback = Mock::start("{}");
    let sluice = Sluice::start(&config(&responses, &fallback));
    // 4 text tokens + 2 reasoning tokens; 400 uncached and 600 cached input tokens.
    let want_cost = (400.0 * 2.0 + 600.0 * 0.5 + 6.0 * 8.0) / 1e6;
    for stream in [false, true] {
        for (path, headers, body) in clients(stream) {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let id = if stream {
                let mut r = StreamReader::open(sluice.addr, path, &h, &body.to_string());
                let id = r.header("x-request-id").unwrap_or_default().to_string();
                let _ = r.read_to_end(std::time::Duration::from_secs(10));
                id
            } else {
                let r = post_json(sluice.addr, path, &h, &body.to_string());
                assert_eq!(r.status, 200, "{path}: {}", r.text());
                r.header("x-request-id").unwrap_or_default().to_string()
            };
            let line = access_line(&sluice, &id);
            let cell = format!("{path} stream={stream}: {line}");
            assert_eq!(field(&line, "input_tokens"), "1000", "{cell}");
            assert_eq!(field(&line, "cached_input_tokens"), "600", "{cell}");
            assert_eq!(field(&line, "output_tokens"), "6", "{cell}");
            assert_eq!(field(&line, "reasoning_tokens"), "2", "{cell}");
            assert_eq!(field(&line, "estimated"), "false", "{cell}");
            let cost: f64 = field(&line, "cost_usd").parse().unwrap_or(-1.0);
            assert!(
                (cost - want_cost).abs() < 1e-9,
                "{cell}: cost {cost} != {want_cost}"
            );
        }
    }
}

#[test]
fn a_request_probe_of_a_responses_route_speaks_responses() {
    let mock = Mock::start(r#"{"tokens": 2}"#);
    let sluice = Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {}\n    api_key: sk-oa\n    health_check: {{mode: request, interval_ms: 100, timeout_ms: 500}}\nmodels:\n  {MODEL}:\n    routes:\n      - {{provider: oa, upstream_model: gpt-r1, api: responses}}\n",
        mock.base_url()
    ));
    let mut probe = None;
    assert!(
        crate::harness::eventually(std::time::Duration::from_secs(5), || {
            probe = mock
                .log()
                .into_iter()
                .find(|r| r["headers"]["x-request-id"] == "sluice-health-probe");
            probe.is_some()
        }),
        "no request probe: {}",
        sluice.log()
    );
    let probe = probe.expect("a probe");
    assert_eq!(probe["path"], "/v1/responses", "{probe}");
    assert_eq!(probe["status"], 200, "{probe}");
    let sent: Value =
        serde_json::from_str(probe["body"].as_str().unwrap_or_default()).expect("JSON");
    assert_eq!(sent["model"], "gpt-r1", "{sent}");
    assert_eq!(sent["input"][0]["content"][0]["text"], "ping", "{sent}");
    assert_eq!(sent["max_output_tokens"], 16, "{sent}");
    assert_eq!(sent["store"], false, "{sent}");
}

#[test]
fn input_tokens_on_a_responses_route_is_the_providers_own_count() {
    let responses = Mock::start(r#"{"prompt_tokens": 321}"#);
    let fallback = Mock::start("{}");
    let sluice = Sluice::start(&config(&responses, &fallback));
    let auth = format!("Bearer {KEY}");
    let body = json!({"model": MODEL, "input": "how many tokens is this?",
        "instructions": "count", "x_new_member": {"kept": true}});
    let r = post_json(
        sluice.addr,
        "/v1/responses/input_tokens",
        &[("authorization", &auth)],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"object": "response.input_tokens", "input_tokens": 321})
    );
    assert_eq!(r.header("x-sluice-token-count"), Some("provider"));
    assert_eq!(r.header("x-sluice-provider"), Some("oa"));
    let log = responses.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["path"], "/v1/responses/input_tokens");
    let sent: Value =
        serde_json::from_str(log[0]["body"].as_str().unwrap_or_default()).expect("JSON");
    assert_eq!(
        sent,
        json!({"model": "gpt-r1", "input": "how many tokens is this?", "instructions": "count",
            "x_new_member": {"kept": true}})
    );
    // The provider down: the Anthropic route's turn, which has no Responses count: the
    // estimate answers.
    responses.set_behavior(r#"{"status": 503}"#);
    let r = post_json(
        sluice.addr,
        "/v1/responses/input_tokens",
        &[("authorization", &auth)],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-token-count"), Some("estimate"));
    assert!(r.json()["input_tokens"]
        .as_u64()
        .is_some_and(|n| n > 0 && n != 321));
    assert_eq!(fallback.log().len(), 0, "the estimate is local");
}

#[test]
fn compact_on_a_responses_route_is_the_providers_own_compaction() {
    let responses = Mock::start("{}");
    let fallback = Mock::start("{}");
    let sluice = Sluice::start(&config(&responses, &fallback));
    let auth = format!("Bearer {KEY}");
    let body = json!({"model": MODEL, "input": [{"role": "user", "content": "a long talk"}],
        "instructions": "be brief", "previous_response_id": "resp_old"});
    let r = post_json(
        sluice.addr,
        "/v1/responses/compact",
        &[("authorization", &auth)],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "response.compaction", "{v}");
    assert_eq!(v["model"], MODEL, "the standard model: {v}");
    assert_eq!(v["output"][0]["type"], "compaction", "{v}");
    assert!(
        v["output"][0]["encrypted_content"]
            .as_str()
            .is_some_and(|e| e.starts_with("mock-compaction-")),
        "{v}"
    );
    assert_eq!(r.header("x-sluice-provider"), Some("oa"));
    let log = responses.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["path"], "/v1/responses/compact");
    let sent: Value =
        serde_json::from_str(log[0]["body"].as_str().unwrap_or_default()).expect("JSON");
    assert_eq!(
        sent,
        json!({"model": "gpt-r1", "input": [{"role": "user", "content": "a long talk"}],
            "instructions": "be brief"})
    );
    // The Responses route down: the next route cannot read its compaction: 501.
    responses.set_behavior(r#"{"status": 503}"#);
    let r = post_json(
        sluice.addr,
        "/v1/responses/compact",
        &[("authorization", &auth)],
        &body.to_string(),
    );
    assert_eq!(r.status, 501, "{}", r.text());
    assert_eq!(fallback.log().len(), 0);
}
