//! The official `anthropic` (`messages.create`, `messages.stream`, error classes) and
//! `openai` (`responses.create`, `responses.stream`, a refused field) Python packages against
//! a real Sluice, on an OpenAI-compatible and on an Anthropic provider
//! (`tests/sdk/dialects_client.py`; interpreter as in [`crate::sdk`]).

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
    let behavior = serde_json::json!({
        "text": text,
        "split": "mid_utf8",
        "answer_model": "upstream-dated-2026-01-01",
    })
    .to_string();
    let mock = Mock::start(&behavior);
    let sluice = Sluice::start(&config(&mock.base_url()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    for model in ["acme/claude", "acme/gpt"] {
        let (ok, out) = run_python(
            &[
                script.to_str().expect("utf-8 path"),
                "--base-url",
                &base_url,
                "--key",
                KEY,
                "--model",
                model,
                "--expect-text",
                text,
            ],
            Duration::from_secs(120),
        );
        assert!(ok, "the SDK script failed for {model}:\n{out}");
        assert!(out.contains("sdk ok"), "{out}");
    }
    // Two calls per SDK reach the provider per model; the error cases do not.
    assert_eq!(mock.log().len(), 8);
}
