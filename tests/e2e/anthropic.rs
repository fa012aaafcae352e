//! A `kind: anthropic` provider behind the OpenAI-compatible API: the request is translated to
//! Anthropic Messages (`x-api-key`, `anthropic-version`, `max_tokens`, `system`), and the answer
//! (JSON or SSE) comes back in OpenAI's Chat Completions format with the standard model id.

use std::time::Duration;

use crate::harness::client::sse_text;
use crate::harness::{Mock, Sluice, KEY};

fn config(base_url: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  claude:\n    kind: anthropic\n    base_url: {base_url}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/claude:\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n"
    )
}

const BODY: &str = r#"{"model":"acme/claude","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]"#;

#[test]
fn a_stream_is_translated_to_openai_chunks() {
    let mock = Mock::start(r#"{"text":"héllo from claude","token_delay_ms":5}"#);
    let sluice = Sluice::start(&config(&mock.base_url()));
    let mut s = sluice.chat_stream(&format!(
        r#"{BODY},"stream":true,"stream_options":{{"include_usage":true}}}}"#
    ));
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-sluice-provider"), Some("claude"));
    let body = s.read_to_end(Duration::from_secs(10));
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), "héllo from claude", "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("claude-mock-1"), "{text}");
    let chunks: Vec<serde_json::Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    assert!(chunks.iter().all(|c| c["model"] == "acme/claude"));
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "stop"),
        "{text}"
    );
    let usage = chunks.last().expect("usage chunk");
    assert!(
        usage["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{usage}"
    );

    let log = mock.log();
    assert_eq!(log.len(), 1);
    let rec = &log[0];
    assert!(
        rec["path"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/v1/messages"),
        "{rec}"
    );
    assert_eq!(rec["model"], "claude-mock-1");
    assert_eq!(rec["headers"]["x-api-key"], "sk-ant-provider-secret");
    assert_eq!(rec["headers"]["anthropic-version"], "2023-06-01");
    assert!(rec["headers"].get("authorization").is_none(), "{rec}");
    let sent: serde_json::Value =
        serde_json::from_str(rec["body"].as_str().expect("body copy")).expect("JSON body");
    assert_eq!(sent["system"], "be brief");
    assert_eq!(sent["max_tokens"], 4096);
    assert_eq!(sent["messages"][0]["role"], "user");
}

#[test]
fn a_non_stream_answer_is_an_openai_chat_completion() {
    let mock = Mock::start(r#"{"text":"short answer"}"#);
    let sluice = Sluice::start(&config(&mock.base_url()));
    let r = sluice.chat(&format!("{BODY}}}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "acme/claude");
    assert_eq!(v["choices"][0]["message"]["content"], "short answer");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["prompt_tokens"].as_u64().is_some(), "{v}");
}

#[test]
fn an_anthropic_overload_is_an_openai_error_and_the_key_stays_secret() {
    let mock = Mock::start(
        r#"{"status":529,"error_body":"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded for sk-ant-provider-secret\"}}"}"#,
    );
    let sluice = Sluice::start(&config(&mock.base_url()));
    let r = sluice.chat(&format!("{BODY}}}"));
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    assert!(!r.text().contains("sk-ant-provider-secret"), "{}", r.text());
}
