//! The first requests of Claude Code 2.1 and Codex 0.171 as captured on the wire (issue 28,
//! items 1–4), replayed through Sluice to every provider kind. Before issue 28 each got a
//! 400 from Sluice's client-side decoders on every route, the Anthropic-to-Anthropic one
//! included. The agents themselves run in `tests/e2e/agents.rs`; these replays need no npm
//! and pin the exact shapes.

use serde_json::{json, Value};

use crate::harness::{post_json, KEY};
use crate::provider_battery::{self as battery, Rig, MODEL};

/// Claude Code's `POST /v1/messages` for a model id it does not know: adaptive thinking
/// with its text omitted, `output_config.effort`, a `system` message inside `messages`
/// (after a user turn), cache-controlled system blocks, its tools and `metadata.user_id`.
fn claude_code() -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 32000,
        "stream": true,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "user_0a1b_account__session_5e6f"},
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Use the tools to answer.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is in this folder?"}]},
            {"role": "system", "content": "<system-reminder>The working directory is /tmp/w.</system-reminder>"},
            {"role": "user", "content": [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]}
        ],
        "tools": [
            {"name": "Bash", "description": "Run a shell command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
            {"name": "Read", "description": "Read a file.",
             "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
        ]
    })
}

/// Codex's `POST /v1/responses`: function tools, a `namespace` of functions, `web_search`
/// without live access, reasoning summaries, encrypted reasoning, `store: false`, its cache
/// key and client metadata, developer messages.
fn codex() -> Value {
    let f = |name: &str| {
        json!({"type": "function", "name": name, "description": name, "strict": false,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                              "additionalProperties": false}})
    };
    json!({
        "model": MODEL,
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<environment_context>/tmp/w</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "# AGENTS.md\nBe brief."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in this folder?"}]}
        ],
        "tools": [
            f("exec_command"), f("write_stdin"), f("request_user_input"), f("view_image"),
            f("get_goal"), f("create_goal"), f("update_goal"),
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [f("spawn_agent"), f("wait_agent")]},
            {"type": "web_search", "external_web_access": false}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"effort": "xhigh", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "client_metadata": {"originator": "codex_exec"}
    })
}

/// Sends `body` to `path` through the rig; the answer must be a whole stream ending in
/// `terminal`. Returns the `x-sluice-dropped` header.
fn replay(rig: &Rig, kind: &str, path: &str, body: &Value, terminal: &str) -> Option<String> {
    rig.mock.reset();
    let mut b = rig.base.clone();
    b["text"] = json!("Two files.");
    rig.mock.set_behavior(&b.to_string());
    let auth = format!("Bearer {KEY}");
    let r = post_json(
        rig.sluice.addr,
        path,
        &[
            ("authorization", &auth),
            ("anthropic-version", "2023-06-01"),
        ],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{kind} {path}: {}", r.text());
    let text = r.text();
    assert!(
        text.contains(terminal) && text.contains("Two"),
        "{kind} {path}: {text}"
    );
    let calls = rig.model_calls().len();
    assert_eq!(calls, 1, "{kind}: one model call");
    r.header("x-sluice-dropped").map(str::to_string)
}

/// Both agents' first requests through one provider kind.
fn both_agents(kind: &str, rig: &Rig, claude_route: bool) {
    let dropped = replay(rig, kind, "/v1/messages", &claude_code(), "message_stop");
    if claude_route {
        // The same dialect in and out: forwarded as sent (Bedrock names what it refuses).
        let want = (kind == "bedrock_claude").then(|| "metadata".to_string());
        assert_eq!(dropped, want, "{kind}: Claude Code");
    }
    let dropped =
        replay(rig, kind, "/v1/responses", &codex(), "response.completed").unwrap_or_default();
    // Cached-only web search has no counterpart anywhere; `client_metadata` no member.
    for field in ["tools[8]", "client_metadata"] {
        assert!(
            dropped.split(", ").any(|d| d == field),
            "{kind}: Codex dropped {field}: {dropped}"
        );
    }
}

#[test]
fn claude_code_and_codex_first_requests_pass_through_openai_and_azure() {
    both_agents("openai", &battery::openai_rig(), false);
    both_agents("azure_openai", &battery::azure_openai_rig(), false);
}

#[test]
fn claude_code_and_codex_first_requests_pass_through_anthropic_and_claude_clouds() {
    both_agents("anthropic", &battery::anthropic_rig(), true);
    both_agents("bedrock_claude", &battery::bedrock_claude_rig(), true);
    both_agents("vertex_claude", &battery::vertex_claude_rig(), true);
}

#[test]
fn claude_code_and_codex_first_requests_pass_through_gemini_and_converse() {
    both_agents("gemini", &battery::gemini_rig(), false);
    both_agents("vertex_gemini", &battery::vertex_gemini_rig(), false);
    both_agents("bedrock_converse", &battery::bedrock_converse_rig(), false);
}
