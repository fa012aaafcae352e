//! The official `anthropic` and `openai` Python packages (Messages, Responses and Chat
//! Completions, streamed and not, with tools and with reasoning) against a real Sluice whose
//! models are served by the cloud kinds `azure_openai` and `gemini` (issue 13), through the
//! same script as the first-party providers (`tests/sdk/dialects_client.py`; interpreter as
//! in [`crate::sdk`]), and by `kind: bedrock` (Claude through InvokeModel, other models
//! through Converse): a client cannot tell which kind answered.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::{Mock, Sluice, KEY};
use crate::sdk::run_python;

fn config(mock: &Mock) -> String {
    let url = format!("http://{}", mock.addr);
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  az:\n    kind: azure_openai\n    base_url: {url}\n    api_version: \"2024-10-21\"\n    api_key: az-provider-secret\n    health_check: {{enabled: false}}\n  gm:\n    kind: gemini\n    base_url: {url}/v1beta\n    api_key: gm-provider-secret\n    health_check: {{enabled: false}}\nmodels:\n  acme/az:\n    routes:\n      - provider: az\n        upstream_model: gpt4o-prod\n  acme/gem:\n    routes:\n      - provider: gm\n        upstream_model: gemini-2.5-flash\n"
    )
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn official_anthropic_and_openai_sdks_work_on_azure_and_gemini() {
    let text = "Hello from the cloud: héllo 世界 🚀, twenty tokens or so of text.";
    let answered = "upstream-dated-2026-01-01";
    let text_behavior = serde_json::json!({
        "text": text,
        "split": "mid_utf8",
        "answer_model": answered,
    })
    .to_string();
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
    let sluice = Sluice::start(&config(&mock));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    let mock_url = format!("http://{}", mock.addr);
    let tools = tools.to_string();
    let (ok, out) = run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            KEY,
            "--model",
            "acme/az",
            "--model",
            "acme/gem",
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
    // Per model, eleven calls reach the provider (the refused ones do not), each at its
    // kind's address with its kind's key.
    let log = mock.log();
    assert_eq!(log.len(), 22, "{out}");
    let azure = log
        .iter()
        .filter(|r| {
            r["path"].as_str().unwrap_or_default().starts_with(
                "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21",
            ) && r["all_headers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h[0] == "api-key" && h[1] == "az-provider-secret")
        })
        .count();
    let gemini = log
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/v1beta/models/gemini-2.5-flash:")
                && r["all_headers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|h| h[0] == "x-goog-api-key" && h[1] == "gm-provider-secret")
        })
        .count();
    assert_eq!((azure, gemini), (11, 11), "{log:?}");
}

/// The same script against a model served by `kind: bedrock` (SigV4-signed requests the
/// mock verifies, event-stream answers cut at arbitrary byte boundaries): every dialect's
/// official SDK, text, tools and reasoning, streamed and not.
#[test]
fn official_anthropic_and_openai_sdks_work_on_bedrock() {
    let text = "Hello from Bedrock: héllo 世界 🚀, twenty tokens or so of text.";
    let text_behavior = serde_json::json!({"text": text, "split": "arbitrary"}).to_string();
    let tools = serde_json::json!([
        {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
    ]);
    let tool_text = "Let me check both.";
    let tools_behavior = serde_json::json!({
        "text": tool_text,
        "tool_calls": tools,
        "split": "arbitrary",
    })
    .to_string();
    let thought = "Höw tö greet: wärmly, 🤝 first.";
    let reasoning_behavior = serde_json::json!({
        "text": text,
        "reasoning": thought,
        "split": "bytewise",
    })
    .to_string();
    let mock = Mock::start(&text_behavior);
    let dir = crate::harness::TempDir::new("sdk-bedrock");
    let file = crate::bedrock::credentials_file(&dir);
    let yaml = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  br:\n    kind: bedrock\n    region: us-east-2\n    base_url: http://{}\n    aws_profile: temp\nmodels:\n  acme/bedrock:\n    routes:\n      - provider: br\n        upstream_model: \"{}\"\n",
        mock.addr,
        crate::bedrock::BEDROCK_MODEL
    );
    let env = crate::bedrock::env(&file);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with_env(&yaml, &env);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    let mock_url = format!("http://{}", mock.addr);
    let tools = tools.to_string();
    let (ok, out) = run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            KEY,
            "--model",
            "acme/bedrock",
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
    assert!(
        !out.contains("claude-sonnet-4-6"),
        "the upstream model leaked:\n{out}"
    );
    // Eleven calls reach Bedrock, each signed with the temporary credentials (the mock
    // refuses a bad signature with 403, which the script would have seen as a 502).
    let log = mock.log();
    assert_eq!(log.len(), 11, "{out}");
    assert!(
        log.iter().all(|r| r["status"] == 200
            && r["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke")
            && r["all_headers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h[0] == "x-amz-security-token"
                    && h[1] == sluice_mock_upstream::sigv4::MOCK_AWS_SESSION_TOKEN)),
        "{log:?}"
    );
}

/// The official SDKs' script (as for the other kinds, `tests/sdk/dialects_client.py`)
/// against a model Bedrock serves through Converse: text, tools and reasoning, streamed and
/// not, every dialect.
#[test]
fn official_anthropic_and_openai_sdks_work_on_bedrock_converse() {
    let text = "Hello from Nova: héllo 世界 🚀, twenty tokens or so of text.";
    let text_behavior = serde_json::json!({"text": text, "split": "arbitrary"}).to_string();
    let tools = serde_json::json!([
        {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
    ]);
    let tool_text = "Let me check both.";
    let tools_behavior =
        serde_json::json!({"text": tool_text, "tool_calls": tools, "split": "arbitrary"})
            .to_string();
    let thought = "Höw tö greet: wärmly, 🤝 first.";
    let reasoning_behavior =
        serde_json::json!({"text": text, "reasoning": thought, "split": "bytewise"}).to_string();
    let mock = Mock::start(&text_behavior);
    let dir = crate::harness::TempDir::new("sdk-converse");
    let file = crate::bedrock::credentials_file(&dir);
    let yaml = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  br:\n    kind: bedrock\n    region: us-east-2\n    base_url: http://{}\n    aws_profile: temp\nmodels:\n  acme/nova:\n    routes:\n      - provider: br\n        upstream_model: \"{}\"\n",
        mock.addr,
        crate::bedrock_converse::NOVA
    );
    let env = crate::bedrock::env(&file);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with_env(&yaml, &env);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/dialects_client.py");
    let base_url = format!("http://{}", sluice.addr);
    let mock_url = format!("http://{}", mock.addr);
    let tools = tools.to_string();
    let (ok, out) = run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            KEY,
            "--model",
            "acme/nova",
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
    assert!(
        !out.contains("nova-pro"),
        "the upstream model leaked:\n{out}"
    );
    let log = mock.log();
    assert!(!log.is_empty());
    assert!(
        log.iter().all(|r| r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/model/amazon.nova-pro-v1%3A0/converse"))
            && r["status"] == 200),
        "{log:?}"
    );
}
