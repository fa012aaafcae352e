//! The official `anthropic` (`messages.create`, `messages.stream` with and without tools
//! and with thinking, error classes) and `openai` (`responses.create`, `responses.stream`
//! with and without a function tool and with reasoning, Chat Completions streaming with
//! tools, a refused field) Python packages against a real Sluice, on an OpenAI-compatible
//! and on an Anthropic provider (`tests/sdk/dialects_client.py`; interpreter as in
//! [`crate::sdk`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::{Mock, Sluice, KEY};
use crate::sdk::run_python;

fn config(base_url: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-oa\n    health_check: {{enabled: false}}\n  claude:\n    kind: anthropic\n    base_url: {base_url}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/gpt:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n  acme/claude:\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n"
    )
}

#[test]
fn official_anthropic_and_responses_sdks_work_on_both_providers() {
    let text = "Hello from the mock: héllo 世界 🚀, twenty tokens or so of text.";
    let answered = "upstream-dated-2026-01-01";
    let text_behavior = serde_json::json!({
        "text": text,
        "split": "mid_utf8",
        "answer_model": answered,
    })
    .to_string();
    // Parallel tool calls after some text; argument fragments cut inside "ü".
    let tools = serde_json::json!([
        {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
    ]);
    let tool_text = "Let me check both.";
    let tools_behavior = serde_json::json!({
        "text": tool_text,
        "tool_calls": tools,
        "split": "mid_utf8",
        "answer_model": answered,
    })
    .to_string();
    let thought = "Höw tö greet: wärmly, 🤝 first.";
    let reasoning_behavior = serde_json::json!({
        "text": text,
        "reasoning": thought,
        "split": "mid_utf8",
        "answer_model": answered,
    })
    .to_string();
    let mock = Mock::start(&text_behavior);
    let sluice = Sluice::start(&config(&mock.base_url()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    let mock_url = format!("http://{}", mock.addr);
    let tools = tools.to_string();
    // One Python process for both models: importing the SDKs takes seconds.
    let (ok, out) = run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            KEY,
            "--model",
            "acme/claude",
            "--model",
            "acme/gpt",
            "--mock-url",
            &mock_url,
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
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "the SDK script failed:\n{out}");
    assert!(out.contains("sdk ok"), "{out}");
    // Per model, four text calls, four tool calls and three reasoning calls reach the
    // provider; the error cases do not.
    let log = mock.log();
    assert_eq!(log.len(), 22, "{out}");
    // The tool definitions reached both providers in their own API.
    let tool_bodies = log
        .iter()
        .filter(|r| {
            r["body"]
                .as_str()
                .unwrap_or_default()
                .contains("get_weather")
        })
        .count();
    assert_eq!(tool_bodies, 8, "{out}");
}
