//! Upstream wire fixtures, written as the providers send them (OpenAI
//! chunks with `usage: null` until the usage chunk; Anthropic events with
//! `event:` lines, `ping`, cache usage in `message_start`).
//!
//! Both upstreams report the same exchange: 30 prompt tokens of which 10
//! cached (Anthropic: `input_tokens` 20 + `cache_read_input_tokens` 10),
//! 12 output tokens.

/// The cells of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    Text,
    Tool,
    Image,
    Reasoning,
    Error,
}

pub(crate) const ALL: [Scenario; 5] = [
    Scenario::Text,
    Scenario::Tool,
    Scenario::Image,
    Scenario::Reasoning,
    Scenario::Error,
];

/// The answer text of the text/image scenarios (multi-byte characters so
/// byte splits cut inside them).
pub(crate) const TEXT: &str = "Hello, wörld 🦀!";
const TEXT_PIECES: [&str; 4] = ["Hel", "lo, wö", "rld 🦀", "!"];

const CHAT_HEAD: &str = r#"{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1721234567,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_1","choices":[{"index":0,"delta":"#;

fn chat_chunk(delta: &str, finish: &str) -> String {
    format!("data: {CHAT_HEAD}{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n")
}

fn chat_text(t: &str) -> String {
    chat_chunk(
        &format!("{{\"content\":{}}}", serde_json::Value::from(t)),
        "null",
    )
}

const CHAT_USAGE: &str = "data: {\"id\":\"chatcmpl-up1\",\"object\":\"chat.completion.chunk\",\"created\":1721234567,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":12,\"total_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":10},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n";

/// An OpenAI Chat Completions stream for the scenario.
pub(crate) fn chat_stream(s: Scenario) -> String {
    let mut w = chat_chunk(
        r#"{"role":"assistant","content":"","refusal":null}"#,
        "null",
    );
    match s {
        Scenario::Text | Scenario::Image => {
            for p in TEXT_PIECES {
                w.push_str(&chat_text(p));
            }
            w.push_str(&chat_chunk("{}", "\"stop\""));
        }
        Scenario::Tool => {
            w.push_str(&chat_text("Let me check."));
            w.push_str(&chat_chunk(r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#, "null"));
            w.push_str(&chat_chunk(
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}"#,
                "null",
            ));
            w.push_str(&chat_chunk(
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"ty\": \"Paris\"}"}}]}"#,
                "null",
            ));
            w.push_str(&chat_chunk(r#"{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":"}}]}"#, "null"));
            w.push_str(&chat_chunk(
                r#"{"tool_calls":[{"index":1,"function":{"arguments":"\"CET\"}"}}]}"#,
                "null",
            ));
            w.push_str(&chat_chunk("{}", "\"tool_calls\""));
        }
        Scenario::Reasoning => {
            w.push_str(&chat_chunk(r#"{"reasoning_content":"Think "}"#, "null"));
            w.push_str(&chat_chunk(r#"{"reasoning_content":"1+1."}"#, "null"));
            w.push_str(&chat_text("2"));
            w.push_str(&chat_chunk("{}", "\"stop\""));
        }
        Scenario::Error => {
            w.push_str(&chat_text("Hel"));
            w.push_str("data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\",\"param\":null,\"code\":null}}\n\n");
            return w;
        }
    }
    w.push_str(CHAT_USAGE);
    w.push_str("data: [DONE]\n\n");
    w
}

fn ev(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn text_delta(index: u32, t: &str) -> String {
    ev(
        "content_block_delta",
        &format!(
            "{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}",
            serde_json::Value::from(t)
        ),
    )
}

fn block_start(index: u32, block: &str) -> String {
    ev(
        "content_block_start",
        &format!(
            "{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{block}}}"
        ),
    )
}

fn block_stop(index: u32) -> String {
    ev(
        "content_block_stop",
        &format!("{{\"type\":\"content_block_stop\",\"index\":{index}}}"),
    )
}

fn message_end(stop: &str) -> String {
    let mut w = ev("message_delta", &format!("{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":12}}}}"));
    w.push_str(&ev("message_stop", r#"{"type":"message_stop"}"#));
    w
}

/// An Anthropic Messages stream for the scenario.
pub(crate) fn messages_stream(s: Scenario) -> String {
    let mut w = ev(
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_up1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":1}}}"#,
    );
    match s {
        Scenario::Text | Scenario::Image => {
            w.push_str(&block_start(0, r#"{"type":"text","text":""}"#));
            w.push_str(&ev("ping", r#"{"type": "ping"}"#));
            for p in TEXT_PIECES {
                w.push_str(&text_delta(0, p));
            }
            w.push_str(&block_stop(0));
            w.push_str(&message_end("end_turn"));
        }
        Scenario::Tool => {
            w.push_str(&block_start(0, r#"{"type":"text","text":""}"#));
            w.push_str(&text_delta(0, "Let me check."));
            w.push_str(&block_stop(0));
            w.push_str(&block_start(
                1,
                r#"{"type":"tool_use","id":"call_1","name":"get_weather","input":{}}"#,
            ));
            for p in ["", "{\\\"ci", "ty\\\": \\\"Paris\\\"}"] {
                w.push_str(&ev("content_block_delta", &format!("{{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{p}\"}}}}")));
            }
            w.push_str(&block_stop(1));
            w.push_str(&block_start(
                2,
                r#"{"type":"tool_use","id":"call_2","name":"get_time","input":{}}"#,
            ));
            for p in ["{\\\"tz\\\":", "\\\"CET\\\"}"] {
                w.push_str(&ev("content_block_delta", &format!("{{\"type\":\"content_block_delta\",\"index\":2,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{p}\"}}}}")));
            }
            w.push_str(&block_stop(2));
            w.push_str(&message_end("tool_use"));
        }
        Scenario::Reasoning => {
            w.push_str(&block_start(
                0,
                r#"{"type":"thinking","thinking":"","signature":""}"#,
            ));
            for t in ["Think ", "1+1."] {
                w.push_str(&ev("content_block_delta", &format!("{{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"thinking_delta\",\"thinking\":\"{t}\"}}}}")));
            }
            w.push_str(&ev("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig-abc"}}"#));
            w.push_str(&block_stop(0));
            w.push_str(&block_start(1, r#"{"type":"text","text":""}"#));
            w.push_str(&text_delta(1, "2"));
            w.push_str(&block_stop(1));
            w.push_str(&message_end("end_turn"));
        }
        Scenario::Error => {
            w.push_str(&block_start(0, r#"{"type":"text","text":""}"#));
            w.push_str(&text_delta(0, "Hel"));
            w.push_str(&ev(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ));
        }
    }
    w
}

/// A non-stream OpenAI `chat.completion` body (or error body) for the scenario.
pub(crate) fn chat_body(s: Scenario) -> String {
    let message = match s {
        Scenario::Text | Scenario::Image => {
            format!("{{\"role\":\"assistant\",\"content\":{}}}", serde_json::Value::from(TEXT))
        }
        Scenario::Tool => r#"{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]}"#.into(),
        Scenario::Reasoning => {
            r#"{"role":"assistant","content":"2","reasoning_content":"Think 1+1."}"#.into()
        }
        Scenario::Error => {
            return r#"{"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":null}}"#.into()
        }
    };
    let finish = if s == Scenario::Tool {
        "tool_calls"
    } else {
        "stop"
    };
    format!(
        r#"{{"id":"chatcmpl-up1","object":"chat.completion","created":1721234567,"model":"gpt-4o-2024-08-06","choices":[{{"index":0,"message":{message},"logprobs":null,"finish_reason":"{finish}"}}],"usage":{{"prompt_tokens":30,"completion_tokens":12,"total_tokens":42,"prompt_tokens_details":{{"cached_tokens":10}},"completion_tokens_details":{{"reasoning_tokens":0}}}}}}"#
    )
}

/// A non-stream Anthropic `message` body (or error body) for the scenario.
pub(crate) fn messages_body(s: Scenario) -> String {
    let content = match s {
        Scenario::Text | Scenario::Image => {
            format!("[{{\"type\":\"text\",\"text\":{}}}]", serde_json::Value::from(TEXT))
        }
        Scenario::Tool => r#"[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"call_2","name":"get_time","input":{"tz":"CET"}}]"#.into(),
        Scenario::Reasoning => r#"[{"type":"thinking","thinking":"Think 1+1.","signature":"sig-abc"},{"type":"text","text":"2"}]"#.into(),
        Scenario::Error => {
            return r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into()
        }
    };
    let stop = if s == Scenario::Tool {
        "tool_use"
    } else {
        "end_turn"
    };
    format!(
        r#"{{"id":"msg_up1","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":{content},"stop_reason":"{stop}","stop_sequence":null,"usage":{{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":12}}}}"#
    )
}
