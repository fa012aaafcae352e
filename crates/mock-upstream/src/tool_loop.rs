//! The `tool_loop` knob: the mock plays a model that uses one tool once, the way a coding
//! agent's model does, so that real agents (Claude Code, Codex) can run a whole tool loop
//! against it through the gateway.
//!
//! A request is read in whichever provider dialect it is written (OpenAI Chat Completions,
//! OpenAI Responses, Anthropic Messages, Bedrock Converse, Gemini; the shapes do not
//! overlap):
//! - it carries a tool result (a `role: "tool"` message, a Responses `function_call_output`
//!   item, a `tool_result` block, a Converse `toolResult`, a Gemini `functionResponse`): the answer is text, [`DONE_MARKER`] followed
//!   by the last tool result's text (whitespace collapsed, at most [`QUOTE_CHARS`]
//!   characters);
//! - else it offers tools: the answer is one call of one of them, chosen by name from
//!   [`PREFERRED`] (each with arguments the agents' own tools accept: a shell command that
//!   prints [`TOOL_MARKER`]), else the first offered tool with the least arguments its
//!   schema requires;
//! - else the knob changes nothing.
//!
//! The answer's wire format (stream or not) is the endpoint's, exactly as for the
//! `tool_calls` and `text` knobs, which this knob sets (knobs set explicitly win).

use serde_json::{json, Map, Value};

use super::behavior::{Behavior, MockToolCall};

/// What the preferred tools print: the agent's tool result carries it back.
pub const TOOL_MARKER: &str = "sluice-tool-ok";
/// How the answer to a tool result starts.
pub const DONE_MARKER: &str = "Tool loop done. The tool said:";
/// Most characters of the tool result quoted in the answer.
pub(crate) const QUOTE_CHARS: usize = 300;

/// Tools the mock prefers, by name, with the arguments it calls them with: harmless
/// commands that only print [`TOOL_MARKER`].
fn preferred(name: &str) -> Option<Value> {
    let cmd = format!("echo {TOOL_MARKER}");
    Some(match name {
        // Codex's unified exec tool and its older shell tools.
        "exec_command" => json!({"cmd": cmd}),
        "shell_command" => json!({"command": cmd}),
        "shell" | "container.exec" => json!({"command": ["echo", TOOL_MARKER]}),
        // Claude Code's shell tool.
        "Bash" => json!({"command": cmd, "description": "Print the tool-loop marker"}),
        _ => return None,
    })
}

/// The names [`preferred`] knows, best first.
pub(crate) const PREFERRED: [&str; 5] = [
    "exec_command",
    "shell_command",
    "shell",
    "container.exec",
    "Bash",
];

/// One tool a request offers: its name and its JSON schema (`Null` when it has none).
struct Offered {
    name: String,
    schema: Value,
}

/// Applies the knob to `behavior` for the request `body` (see the module docs). Returns the
/// quoted tool result when the request carries one (the request log records it).
pub(crate) fn apply(behavior: &mut Behavior, body: &Value) -> Option<String> {
    if let Some(result) = last_tool_result(body) {
        let quoted = quote(&result);
        if behavior.text.is_none() && behavior.tool_calls.is_none() {
            behavior.text = Some(format!("{DONE_MARKER} {quoted}"));
        }
        return Some(quoted);
    }
    let offered = offered_tools(body);
    if offered.is_empty() || behavior.tool_calls.is_some() {
        return None;
    }
    let chosen = PREFERRED
        .iter()
        .find_map(|want| {
            offered
                .iter()
                .find(|t| t.name == *want || base_name(&t.name) == *want)
                .and_then(|t| Some((t, preferred(want)?)))
        })
        .or_else(|| {
            offered
                .iter()
                .min_by_key(|t| required_count(&t.schema))
                .map(|t| (t, minimal_value(&t.schema)))
        });
    if let Some((tool, arguments)) = chosen {
        if behavior.text.is_none() {
            behavior.text.clone_from(&behavior.tool_loop_text);
        }
        behavior.tool_calls = Some(vec![MockToolCall {
            name: tool.name.clone(),
            arguments,
            id: None,
        }]);
    }
    None
}

/// A tool name without a namespace prefix (`ns__name`, `ns.name`, `ns/name` → `name`).
fn base_name(name: &str) -> &str {
    let after = name.rsplit(['.', '/']).next().unwrap_or(name);
    after.rsplit("__").next().unwrap_or(after)
}

/// The text of the last tool result in the request, if it carries one.
fn last_tool_result(body: &Value) -> Option<String> {
    let mut last = None;
    // OpenAI Chat Completions and Anthropic Messages (and Converse) keep `messages`.
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if m.get("role").and_then(Value::as_str) == Some("tool") {
            last = Some(text_of(m.get("content").unwrap_or(&Value::Null)));
            continue;
        }
        for block in m
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                last = Some(text_of(block.get("content").unwrap_or(&Value::Null)));
            } else if let Some(r) = block.get("toolResult") {
                last = Some(text_of(r.get("content").unwrap_or(&Value::Null)));
            }
        }
    }
    // OpenAI Responses: `input[]` items `function_call_output` / `custom_tool_call_output`.
    for item in body
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if matches!(
            item.get("type").and_then(Value::as_str),
            Some("function_call_output" | "custom_tool_call_output")
        ) {
            last = Some(text_of(item.get("output").unwrap_or(&Value::Null)));
        }
    }
    // Gemini: `contents[].parts[].functionResponse.response`.
    for c in body
        .get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for p in c
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = p.pointer("/functionResponse/response") {
                last = Some(text_of(r));
            }
        }
    }
    last
}

/// The text in a tool result's content, in any dialect: a string, text parts or blocks
/// (`text`, Converse `{text}` / `{json}`), or a JSON value (its string members, else its
/// JSON text).
fn text_of(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("text") {
                Some(Value::String(s)) => s.clone(),
                _ => p.get("json").map_or_else(|| text_of(p), text_of),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(o) => {
            let strings: Vec<&str> = o.values().filter_map(Value::as_str).collect();
            if strings.is_empty() {
                v.to_string()
            } else {
                strings.join("\n")
            }
        }
        other => other.to_string(),
    }
}

/// `text` with runs of whitespace collapsed to one space, at most [`QUOTE_CHARS`] characters.
fn quote(text: &str) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    collapsed.chars().take(QUOTE_CHARS).collect()
}

/// The function tools a request offers, in order, in any dialect.
fn offered_tools(body: &Value) -> Vec<Offered> {
    let mut out = Vec::new();
    let tools = body
        .get("tools")
        .or_else(|| body.pointer("/toolConfig/tools"))
        .and_then(Value::as_array);
    for t in tools.into_iter().flatten() {
        if let Some(f) = t.get("function") {
            // OpenAI: {type: function, function: {name, parameters}}.
            push(&mut out, f.get("name"), f.get("parameters"));
        } else if let Some(spec) = t.get("toolSpec") {
            // Converse: {toolSpec: {name, inputSchema: {json}}}.
            push(
                &mut out,
                spec.get("name"),
                spec.pointer("/inputSchema/json"),
            );
        } else if let Some(decls) = t.get("functionDeclarations").and_then(Value::as_array) {
            // Gemini: {functionDeclarations: [{name, parameters | parametersJsonSchema}]}.
            for d in decls {
                let schema = d
                    .get("parameters")
                    .or_else(|| d.get("parametersJsonSchema"));
                push(&mut out, d.get("name"), schema);
            }
        } else if t.get("type").and_then(Value::as_str) == Some("function") {
            // OpenAI Responses: {type: function, name, parameters}.
            push(&mut out, t.get("name"), t.get("parameters"));
        } else if t.get("input_schema").is_some() {
            // Anthropic client tools (server tools such as web search have a `type` and no
            // schema).
            push(&mut out, t.get("name"), t.get("input_schema"));
        }
    }
    out
}

fn push(out: &mut Vec<Offered>, name: Option<&Value>, schema: Option<&Value>) {
    if let Some(name) = name.and_then(Value::as_str) {
        out.push(Offered {
            name: name.to_string(),
            schema: schema.cloned().unwrap_or(Value::Null),
        });
    }
}

/// How many properties a schema requires.
fn required_count(schema: &Value) -> usize {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// The smallest value a schema accepts that the mock can make up: objects with only their
/// required properties, strings [`TOOL_MARKER`] (or the first `enum` value), numbers 1.
fn minimal_value(schema: &Value) -> Value {
    minimal(schema, 0)
}

fn minimal(schema: &Value, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "object",
    };
    match ty {
        "string" => Value::String(TOOL_MARKER.to_string()),
        "integer" | "number" => json!(1),
        "boolean" => json!(false),
        "array" => json!([]),
        "null" => Value::Null,
        _ => {
            let mut obj = Map::new();
            let props = schema.get("properties");
            for name in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let sub = props.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
                obj.insert(name.to_string(), minimal(sub, depth + 1));
            }
            Value::Object(obj)
        }
    }
}
