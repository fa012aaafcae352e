//! The dialect matrix of issue 28's mappings: every client dialect × every translated
//! upstream dialect (Chat Completions, Messages in both Claude thinking forms, Gemini 2.5
//! and 3, Converse toward Claude, Responses), for every effort level, a system message in the middle
//! of the history, Responses namespace tools and hosted web search. The expected upstream
//! values are written out by hand per cell; same-dialect pairs are passthrough and skipped.

use serde_json::{json, Value};

use crate::protocol::{
    decode_request, dropped_toward, encode_request, ClientDialect, ModelPlacement, UpstreamDialect,
    UpstreamOptions,
};

const CLIENTS: [ClientDialect; 3] = [
    ClientDialect::ChatCompletions,
    ClientDialect::Messages,
    ClientDialect::Responses,
];

/// An upstream of the matrix: its dialect and the upstream model (which picks the form).
#[derive(Clone, Copy, Debug)]
struct Target {
    dialect: UpstreamDialect,
    model: &'static str,
}

const TARGETS: [Target; 7] = [
    Target {
        dialect: UpstreamDialect::ChatCompletions,
        model: "gpt-5",
    },
    Target {
        dialect: UpstreamDialect::Messages,
        model: "claude-opus-4-7",
    },
    Target {
        dialect: UpstreamDialect::Messages,
        model: "claude-sonnet-4-5",
    },
    Target {
        dialect: UpstreamDialect::Gemini,
        model: "gemini-2.5-flash",
    },
    Target {
        dialect: UpstreamDialect::Gemini,
        model: "gemini-3-pro-preview",
    },
    Target {
        dialect: UpstreamDialect::Converse,
        model: "anthropic.claude-opus-4-7",
    },
    Target {
        dialect: UpstreamDialect::Responses,
        model: "gpt-5",
    },
];

/// The encoding options toward `t` (its model picks the forms).
fn opts(t: Target) -> UpstreamOptions<'static> {
    UpstreamOptions {
        model: t.model,
        default_max_tokens: 4096,
        stream_usage: true,
        placement: ModelPlacement::Body,
        thinking: None,
    }
}

fn encode(client: ClientDialect, t: Target, body: &Value) -> Value {
    let req = decode_request(client, body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{client:?} decode: {e}: {body}"));
    let out = encode_request(t.dialect, &req, &opts(t))
        .unwrap_or_else(|e| panic!("{client:?} → {t:?}: {e}"));
    serde_json::from_slice(&out).expect("JSON")
}

/// A request of `client` asking for `effort` (Messages: adaptive thinking with it).
fn effort_request(client: ClientDialect, effort: &str) -> Value {
    let messages = json!([{"role": "user", "content": "1+1?"}]);
    match client {
        ClientDialect::ChatCompletions => json!({"model": "m", "messages": messages,
            "reasoning_effort": effort, "max_completion_tokens": 64000}),
        ClientDialect::Messages => json!({"model": "m", "messages": messages, "max_tokens": 64000,
            "thinking": {"type": "adaptive"}, "output_config": {"effort": effort}}),
        ClientDialect::Responses => json!({"model": "m", "input": "1+1?",
            "reasoning": {"effort": effort}, "max_output_tokens": 64000}),
    }
}

/// What each target must carry for each effort (hand-written; see each provider's docs:
/// OpenAI `reasoning_effort` none..xhigh, Anthropic adaptive `output_config.effort`
/// low..max or a `budget_tokens`, Gemini 2.5 `thinkingBudget` ≤ 24576 on Flash, Gemini 3
/// `thinkingLevel`).
fn expected_effort(t: Target, effort: &str) -> Value {
    let budget = match effort {
        "minimal" | "low" => 1024,
        "medium" => 8192,
        "high" => 24576,
        "xhigh" => 32768,
        _ => 63999,
    };
    match (t.dialect, t.model) {
        (UpstreamDialect::ChatCompletions, _) => {
            json!(if effort == "max" { "xhigh" } else { effort })
        }
        (UpstreamDialect::Responses, _) => {
            json!({"effort": if effort == "max" { "xhigh" } else { effort }})
        }
        (UpstreamDialect::Messages, "claude-sonnet-4-5") => {
            json!({"thinking": {"type": "enabled", "budget_tokens": budget}})
        }
        (UpstreamDialect::Messages | UpstreamDialect::Converse, _) => json!({
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": if effort == "minimal" { "low" } else { effort }}
        }),
        (UpstreamDialect::Gemini, "gemini-2.5-flash") => {
            json!({"thinkingBudget": budget.min(24576)})
        }
        (UpstreamDialect::Gemini, _) => json!({"thinkingLevel": match effort {
            "xhigh" | "max" => "high",
            e => e,
        }}),
    }
}

/// The reasoning settings of an encoded upstream request, in the shape of [`expected_effort`].
fn effort_of(t: Target, got: &Value) -> Value {
    match t.dialect {
        UpstreamDialect::ChatCompletions => got["reasoning_effort"].clone(),
        UpstreamDialect::Messages => {
            let mut o = serde_json::Map::new();
            for k in ["thinking", "output_config"] {
                if !got[k].is_null() {
                    o.insert(k.into(), got[k].clone());
                }
            }
            Value::Object(o)
        }
        UpstreamDialect::Gemini => got["generationConfig"]["thinkingConfig"].clone(),
        UpstreamDialect::Converse => got["additionalModelRequestFields"].clone(),
        UpstreamDialect::Responses => got["reasoning"].clone(),
    }
}

#[test]
fn every_effort_level_reaches_every_target_in_its_own_terms() {
    for client in CLIENTS {
        for t in TARGETS {
            if client.same_as(t.dialect) {
                continue;
            }
            for effort in ["minimal", "low", "medium", "high", "xhigh", "max"] {
                let got = encode(client, t, &effort_request(client, effort));
                assert_eq!(
                    effort_of(t, &got),
                    expected_effort(t, effort),
                    "{client:?} {effort} → {t:?}: {got}"
                );
            }
        }
    }
}

/// A history with a system message between two user turns, in `client`'s words.
fn system_mid_history(client: ClientDialect) -> Value {
    match client {
        ClientDialect::ChatCompletions => json!({"model": "m", "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "system", "content": "The shell is bash."},
            {"role": "user", "content": "Go on."}]}),
        ClientDialect::Messages => json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "system", "content": "The shell is bash."},
            {"role": "user", "content": "Go on."}]}),
        ClientDialect::Responses => json!({"model": "m", "input": [
            {"role": "user", "content": "List the files."},
            {"type": "message", "role": "developer", "content": "The shell is bash."},
            {"role": "user", "content": "Go on."}]}),
    }
}

/// The system prompt text of an encoded upstream request.
fn system_of(t: UpstreamDialect, got: &Value) -> String {
    let texts = |v: &Value, key: &str| -> String {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p[key].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    match t {
        UpstreamDialect::ChatCompletions => got["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter(|m| m["role"] == "system" || m["role"] == "developer")
                    .map(|m| {
                        m["content"]
                            .as_str()
                            .map_or_else(|| texts(&m["content"], "text"), str::to_string)
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
        UpstreamDialect::Messages => got["system"]
            .as_str()
            .map_or_else(|| texts(&got["system"], "text"), str::to_string),
        UpstreamDialect::Gemini => texts(&got["systemInstruction"]["parts"], "text"),
        UpstreamDialect::Converse => texts(&got["system"], "text"),
        UpstreamDialect::Responses => got["instructions"].as_str().unwrap_or_default().into(),
    }
}

#[test]
fn a_system_message_anywhere_in_the_history_reaches_every_targets_system_prompt() {
    for client in CLIENTS {
        for t in TARGETS {
            if client.same_as(t.dialect) {
                continue;
            }
            let got = encode(client, t, &system_mid_history(client));
            assert_eq!(
                system_of(t.dialect, &got),
                "The shell is bash.",
                "{client:?} → {t:?}: {got}"
            );
            // The two user turns stay the conversation.
            let text = got.to_string();
            assert!(
                text.contains("List the files.") && text.contains("Go on."),
                "{text}"
            );
        }
    }
}

/// The function names an encoded upstream request offers.
fn tool_names(t: UpstreamDialect, got: &Value) -> Vec<String> {
    let names = |a: &Value, f: &dyn Fn(&Value) -> &Value| -> Vec<String> {
        a.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| f(x).as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    match t {
        UpstreamDialect::ChatCompletions => names(&got["tools"], &|x| &x["function"]["name"]),
        UpstreamDialect::Messages | UpstreamDialect::Responses => {
            names(&got["tools"], &|x| &x["name"])
        }
        UpstreamDialect::Gemini => names(&got["tools"][0]["functionDeclarations"], &|x| &x["name"]),
        UpstreamDialect::Converse => {
            names(&got["toolConfig"]["tools"], &|x| &x["toolSpec"]["name"])
        }
    }
}

#[test]
fn namespace_and_custom_tools_reach_every_target_as_functions() {
    // Codex's tools: functions, a namespace of functions, a custom (free-form) tool.
    let body = json!({"model": "m", "input": "hi", "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "multi_agent_v1", "tools": [
            {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
    ]});
    for t in TARGETS {
        let got = encode(ClientDialect::Responses, t, &body);
        let names = tool_names(t.dialect, &got);
        let non_web: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != "web_search")
            .collect();
        assert_eq!(
            non_web,
            ["exec_command", "multi_agent_v1__spawn", "apply_patch"],
            "{t:?}: {got}"
        );
    }
}

/// Web search as each client dialect offers it.
fn web_search_request(client: ClientDialect) -> (Value, &'static str) {
    match client {
        ClientDialect::ChatCompletions => (
            json!({"model": "m", "messages": [{"role": "user", "content": "news?"}],
                   "web_search_options": {}}),
            "web_search_options",
        ),
        ClientDialect::Messages => (
            json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "news?"}],
                   "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]}),
            "tools[0]",
        ),
        ClientDialect::Responses => (
            json!({"model": "m", "input": "news?", "tools": [{"type": "web_search"}]}),
            "tools[0]",
        ),
    }
}

#[test]
fn hosted_web_search_is_the_targets_own_search_or_a_visible_drop() {
    for client in CLIENTS {
        for t in TARGETS {
            if client.same_as(t.dialect) {
                continue;
            }
            let (body, field) = web_search_request(client);
            let got = encode(client, t, &body);
            let req = decode_request(client, body.to_string().as_bytes()).expect("decodes");
            let dropped: Vec<String> = dropped_toward(t.dialect, &req, &opts(t))
                .into_iter()
                .map(|d| d.field)
                .collect();
            match t.dialect {
                UpstreamDialect::Messages => {
                    assert_eq!(
                        got["tools"][0]["type"], "web_search_20250305",
                        "{client:?} → {t:?}: {got}"
                    );
                    assert!(dropped.is_empty(), "{dropped:?}");
                }
                UpstreamDialect::Gemini => {
                    assert_eq!(got["tools"], json!([{"googleSearch": {}}]), "{got}");
                    assert!(dropped.is_empty(), "{dropped:?}");
                }
                UpstreamDialect::Responses => {
                    assert_eq!(got["tools"], json!([{"type": "web_search"}]), "{got}");
                    assert!(dropped.is_empty(), "{dropped:?}");
                }
                UpstreamDialect::ChatCompletions | UpstreamDialect::Converse => {
                    assert!(
                        !got.to_string().contains("web_search"),
                        "{client:?} → {t:?}: {got}"
                    );
                    assert_eq!(dropped, [field], "{client:?} → {t:?}");
                }
            }
        }
    }
}
