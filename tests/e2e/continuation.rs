//! Mid-stream continuation (issue 12, `models.<id>.continue_on_break`): a stream that breaks
//! after text reached the client is continued on the next route and spliced into the same
//! client stream: the client gets the whole text exactly once, one stream (one role chunk /
//! `message_start`, one id, one terminator), the `: sluice-continued` comment at the seam,
//! and the sum of both attempts' usage. What cannot be continued (continuation off, a tool
//! call, a route that rejects the continuation) ends with the honest in-stream error event.
//!
//! Each test asserts the hits per mock and, where a continuation was sent, that the second
//! mock received the text so far in its request.

use std::time::Duration;

use serde_json::Value;

use crate::fallback::{chat_hits, Metrics};
use crate::harness::client::{sse_events, sse_text, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

const READ: Duration = Duration::from_secs(10);
const MODEL: &str = "acme/chat";

/// A provider: id, kind (`openai` / `anthropic`), mock, extra route lines (8 spaces).
struct P<'a>(&'a str, &'a str, &'a Mock, &'a str);

/// A config serving `acme/chat` from `providers` in order, with `model` lines under the
/// model (4 spaces) and `server` lines under `server` (2 spaces). No same-route retries,
/// no probes.
fn config(server: &str, providers: &[P<'_>], model: &str) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\n{server}tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for P(id, kind, mock, _) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: {kind}\n    base_url: {}\n    api_key: sk-provider-secret-{id}\n    health_check: {{enabled: false}}\n",
            mock.base_url()
        ));
    }
    y.push_str(&format!("models:\n  {MODEL}:\n{model}    routes:\n"));
    for (i, P(id, _, _, extra)) in providers.iter().enumerate() {
        y.push_str(&format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n        priority: {}\n{extra}",
            i + 1
        ));
    }
    y
}

const ON: &str = "    continue_on_break: true\n";

/// Streams a Chat Completions request (usage asked for) and returns the whole body.
fn chat_stream(sluice: &Sluice) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{MODEL}","stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"Tell me about the fox"}}]}}"#
    );
    let mut s = sluice.chat_stream(&body);
    assert_eq!(s.status, 200);
    let out = s.read_to_end(READ);
    assert!(s.is_done(), "{}", String::from_utf8_lossy(&out));
    out
}

/// Streams an Anthropic Messages request and returns the whole body.
fn messages_stream(sluice: &Sluice) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{MODEL}","max_tokens":200,"stream":true,"messages":[{{"role":"user","content":"Tell me about the fox"}}]}}"#
    );
    let mut s = StreamReader::open(
        sluice.addr,
        "/v1/messages",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        &body,
    );
    assert_eq!(s.status, 200);
    let out = s.read_to_end(READ);
    assert!(s.is_done(), "{}", String::from_utf8_lossy(&out));
    out
}

/// The JSON `data:` payloads of an SSE body (comments and `[DONE]` left out).
fn datas(body: &[u8]) -> Vec<Value> {
    sse_events(body)
        .iter()
        .flat_map(|ev| {
            ev.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The text of a Messages stream: every `text_delta`.
fn messages_text(body: &[u8]) -> String {
    datas(body)
        .iter()
        .filter(|v| v["delta"]["type"] == "text_delta")
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_string))
        .collect()
}

/// Events of `body` that are exactly `: sluice-continued ...` comments.
fn markers(body: &[u8]) -> Vec<String> {
    sse_events(body)
        .into_iter()
        .filter(|e| e.starts_with(": sluice-continued"))
        .collect()
}

fn count(body: &[u8], needle: &str) -> usize {
    String::from_utf8_lossy(body).matches(needle).count()
}

/// The recorded requests of `mock` to `path_end`.
fn requests(mock: &Mock, path_end: &str) -> Vec<Value> {
    mock.log()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with(path_end)))
        .collect()
}

/// The JSON body of the only request `mock` got at `path_end`.
fn only_request(mock: &Mock, path_end: &str) -> Value {
    let reqs = requests(mock, path_end);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let body = reqs[0]["body"].as_str().expect("a recorded body");
    serde_json::from_str(body).expect("a JSON request body")
}

/// The text of a message `content`: a string, or the `text` of its parts.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        other => panic!("content {other}"),
    }
}

fn continuations(sluice: &Sluice, outcome: &str) -> f64 {
    Metrics::scrape(sluice).get(
        "sluice_stream_continuations_total",
        &[("model", MODEL), ("outcome", outcome)],
    )
}

#[test]
fn a_cut_chat_stream_is_continued_on_the_next_route_with_the_text_exactly_once() {
    let p1 = Mock::start(r#"{"text":"The quick brown fox ","drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"text":"brown fox jumps over the dog.","prompt_tokens":50}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", "openai", &p1, ""), P("p2", "openai", &p2, "")],
        ON,
    ));
    let body = chat_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(
        sse_text(&body),
        "The quick brown fox jumps over the dog.",
        "{text}"
    );
    assert_eq!(
        markers(&body),
        vec![": sluice-continued provider=p2 reason=upstream_broken".to_string()],
        "{text}"
    );
    // One stream: one role chunk, one id, one finish, one usage chunk, one [DONE], no error.
    assert_eq!(count(&body, "data: [DONE]"), 1, "{text}");
    assert_eq!(count(&body, r#""role":"assistant""#), 1, "{text}");
    assert_eq!(count(&body, "event: error"), 0, "{text}");
    let chunks = datas(&body);
    let ids: std::collections::BTreeSet<_> = chunks
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "{text}");
    assert!(chunks.iter().all(|c| c["model"] == MODEL), "{text}");
    let finishes: Vec<_> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finishes, vec!["stop"], "{text}");
    // The marker sits between the first route's text and the continuation's.
    let seam = text.find(": sluice-continued").unwrap();
    assert_eq!(sse_text(&body[..seam]), "The quick ");
    // Usage: the sum of both attempts (p2 reported 50 prompt and 6 completion tokens; the
    // first attempt's figures are estimated, at least one token each).
    let usage = chunks
        .iter()
        .rev()
        .find(|c| c["usage"].is_object())
        .unwrap()["usage"]
        .clone();
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(prompt > 50, "{usage}");
    assert!(completion > 6, "{usage}");

    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    // The continuation carried the text so far: an assistant turn, then the instruction.
    let req = only_request(&p2, "/chat/completions");
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{req}");
    assert_eq!(msgs[0]["role"], "user");
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(content_text(&msgs[1]["content"]), "The quick ", "{req}");
    assert_eq!(msgs[2]["role"], "user");
    assert!(
        content_text(&msgs[2]["content"]).contains("Continue it exactly"),
        "{req}"
    );
    assert_eq!(req["model"], "p2-model");
    assert_eq!(req["stream"], true);
    assert_eq!(continuations(&sluice, "continued"), 1.0);
    // The access log: both attempts, the provider that finished, estimated usage (the first
    // attempt never reported its own).
    assert!(
        crate::harness::eventually(Duration::from_secs(5), || {
            let log = sluice.log();
            log.contains("provider=p2 attempts=2 status=200 outcome=ok")
                && log.contains(&format!(
                    "input_tokens={prompt} output_tokens={completion} "
                ))
                && log.contains("estimated=true")
        }),
        "{}",
        sluice.log()
    );
}

#[test]
fn a_cut_messages_stream_is_continued_with_prefill_as_one_message() {
    let p1 = Mock::start(r#"{"text":"The quick brown fox ","drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"text":" brown fox jumps.","prompt_tokens":40}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("c1", "anthropic", &p1, ""),
            P("c2", "anthropic", &p2, "        supports_prefill: true\n"),
        ],
        ON,
    ));
    let body = messages_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    // The seam's doubled space is dropped: the text is whole, once.
    assert_eq!(messages_text(&body), "The quick brown fox jumps.", "{text}");
    assert_eq!(
        markers(&body),
        vec![": sluice-continued provider=c2 reason=upstream_broken".to_string()]
    );
    let events = datas(&body);
    let of = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(of("message_start"), 1, "{text}");
    assert_eq!(of("message_stop"), 1, "{text}");
    assert_eq!(of("message_delta"), 1, "{text}");
    assert_eq!(of("error"), 0, "{text}");
    // The text block goes on: one block, index 0 throughout.
    assert_eq!(of("content_block_start"), 1, "{text}");
    assert_eq!(of("content_block_stop"), 1, "{text}");
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "content_block_delta")
            .all(|e| e["index"] == 0),
        "{text}"
    );
    let start = events
        .iter()
        .find(|e| e["type"] == "message_start")
        .unwrap();
    assert!(
        start["message"]["id"].as_str().unwrap().starts_with("msg_"),
        "{start}"
    );
    assert_eq!(start["message"]["model"], MODEL);
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    // Usage: both attempts (c2 alone: 40 in, 3 out).
    assert!(
        delta["usage"]["output_tokens"].as_u64().unwrap() > 3,
        "{delta}"
    );
    assert!(
        delta["usage"]["input_tokens"].as_u64().unwrap() > 40,
        "{delta}"
    );

    assert_eq!(
        (
            requests(&p1, "/messages").len(),
            requests(&p2, "/messages").len()
        ),
        (1, 1)
    );
    // Prefill: the conversation ends with the assistant's text so far, trailing space
    // removed (Anthropic rejects it), and no added user turn.
    let req = only_request(&p2, "/messages");
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "{req}");
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(content_text(&msgs[1]["content"]), "The quick");
    assert_eq!(req["model"], "c2-model");
    assert!(req["max_tokens"].as_u64().unwrap() < 200, "{req}");
    assert_eq!(continuations(&sluice, "continued"), 1.0);
}

#[test]
fn a_stalled_stream_is_continued_after_the_idle_timeout_across_dialects() {
    let p1 =
        Mock::start(r#"{"text":"One two three four ","stall_after_tokens":2,"stall_max_ms":5000}"#);
    let p2 = Mock::start(r#"{"text":"three four.","prompt_tokens":30}"#);
    let sluice = Sluice::start(&config(
        "  idle_timeout_ms: 300\n",
        &[P("p1", "openai", &p1, ""), P("c2", "anthropic", &p2, "")],
        ON,
    ));
    let body = chat_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), "One two three four.", "{text}");
    assert_eq!(
        markers(&body),
        vec![": sluice-continued provider=c2 reason=idle_timeout".to_string()]
    );
    assert_eq!(count(&body, "data: [DONE]"), 1, "{text}");
    assert_eq!(count(&body, r#""role":"assistant""#), 1, "{text}");
    assert_eq!(count(&body, "event: error"), 0, "{text}");
    assert_eq!(requests(&p1, "/chat/completions").len(), 1);
    // An Anthropic route: the text so far as an assistant turn, then the instruction.
    let req = only_request(&p2, "/messages");
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{req}");
    assert_eq!(msgs[1]["role"], "assistant");
    assert!(req.to_string().contains("One two "), "{req}");
    assert_eq!(msgs[2]["role"], "user");
    assert_eq!(continuations(&sluice, "continued"), 1.0);
}

#[test]
fn without_continuation_a_cut_stream_ends_with_the_error_event_as_before() {
    let p1 = Mock::start(r#"{"text":"The quick brown fox ","drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"text":"brown fox."}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", "openai", &p1, ""), P("p2", "openai", &p2, "")],
        "",
    ));
    let body = chat_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), "The quick ", "{text}");
    assert!(markers(&body).is_empty(), "{text}");
    assert_eq!(count(&body, "event: error"), 1, "{text}");
    assert_eq!(count(&body, "data: [DONE]"), 0, "{text}");
    assert!(text.contains(r#""code":"upstream_broken""#), "{text}");
    assert!(!text.contains("not continued"), "{text}");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 0));
    assert_eq!(continuations(&sluice, "continued"), 0.0);
}

#[test]
fn a_tool_call_stream_that_breaks_is_not_continued() {
    let p1 = Mock::start(
        r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius","days":3}}],"drop_after_tokens":2}"#,
    );
    let p2 = Mock::start(r#"{"text":"never sent"}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", "openai", &p1, ""), P("p2", "openai", &p2, "")],
        ON,
    ));
    let body = chat_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("get_weather"), "{text}");
    assert!(markers(&body).is_empty(), "{text}");
    assert_eq!(count(&body, "event: error"), 1, "{text}");
    assert_eq!(count(&body, "data: [DONE]"), 0, "{text}");
    assert!(
        text.contains("not continued: a tool call had begun"),
        "{text}"
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 0));
    assert_eq!(continuations(&sluice, "tool_call"), 1.0);
    assert_eq!(continuations(&sluice, "continued"), 0.0);
}

#[test]
fn a_route_that_rejects_the_continuation_ends_the_stream_honestly() {
    // Messages client, Anthropic routes: the fallback answers 400 to the continuation.
    let p1 = Mock::start(r#"{"text":"The quick brown fox ","error_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"status":400,"error_message":"prefill is not supported"}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("c1", "anthropic", &p1, ""), P("c2", "anthropic", &p2, "")],
        ON,
    ));
    let body = messages_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(messages_text(&body), "The quick ", "{text}");
    assert!(markers(&body).is_empty(), "{text}");
    let events = datas(&body);
    let of = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(of("message_start"), 1, "{text}");
    assert_eq!(of("error"), 1, "{text}");
    assert_eq!(of("message_stop"), 0, "{text}");
    assert!(
        text.contains("not continued: no other route took the continuation"),
        "{text}"
    );
    assert_eq!(
        (
            requests(&p1, "/messages").len(),
            requests(&p2, "/messages").len()
        ),
        (1, 1)
    );
    // It was asked, with the text so far.
    let req = only_request(&p2, "/messages");
    assert!(req.to_string().contains("The quick "), "{req}");
    assert_eq!(continuations(&sluice, "rejected"), 1.0);
    assert_eq!(continuations(&sluice, "continued"), 0.0);
}

#[test]
fn an_in_stream_error_after_content_is_continued_for_a_responses_client() {
    let p1 = Mock::start(r#"{"text":"Alpha beta gamma delta ","error_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"text":"gamma delta.","prompt_tokens":20}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", "openai", &p1, ""), P("p2", "openai", &p2, "")],
        ON,
    ));
    let body = format!(r#"{{"model":"{MODEL}","input":"Greek letters","stream":true}}"#);
    let mut s = StreamReader::open(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        &body,
    );
    assert_eq!(s.status, 200);
    let out = s.read_to_end(READ);
    assert!(s.is_done());
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        markers(&out),
        vec![": sluice-continued provider=p2 reason=upstream_error".to_string()]
    );
    let events = datas(&out);
    let of = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(of("response.created"), 1, "{text}");
    assert_eq!(of("response.completed"), 1, "{text}");
    assert_eq!(of("error"), 0, "{text}");
    // One output text item; its deltas are the whole text once.
    assert_eq!(of("response.output_item.added"), 1, "{text}");
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, "Alpha beta gamma delta.", "{text}");
    // Sequence numbers run on across the seam, without gaps.
    let seq: Vec<u64> = events
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(seq, (seq[0]..seq[0] + seq.len() as u64).collect::<Vec<_>>());
    let done = events
        .iter()
        .find(|e| e["type"] == "response.completed")
        .expect("response.completed");
    let created = events
        .iter()
        .find(|e| e["type"] == "response.created")
        .expect("response.created");
    assert_eq!(done["response"]["id"], created["response"]["id"]);
    assert!(
        done["response"]["usage"]["input_tokens"].as_u64().unwrap() > 20,
        "{done}"
    );

    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    let req = only_request(&p2, "/chat/completions");
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(
        content_text(&msgs[msgs.len() - 2]["content"]),
        "Alpha beta "
    );
    assert_eq!(continuations(&sluice, "continued"), 1.0);
}

#[test]
fn with_continuation_on_an_unbroken_stream_is_served_once_and_unchanged() {
    let p1 = Mock::start(r#"{"text":"All of it arrives.","prompt_tokens":12}"#);
    let p2 = Mock::start(r#"{"text":"never sent"}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", "openai", &p1, ""), P("p2", "openai", &p2, "")],
        ON,
    ));
    let body = chat_stream(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), "All of it arrives.", "{text}");
    assert!(markers(&body).is_empty(), "{text}");
    assert_eq!(count(&body, "data: [DONE]"), 1, "{text}");
    assert_eq!(count(&body, r#""role":"assistant""#), 1, "{text}");
    let chunks = datas(&body);
    let usage = &chunks
        .iter()
        .rev()
        .find(|c| c["usage"].is_object())
        .expect("a usage chunk")["usage"];
    // The provider's own figures (12 prompt tokens, 4 words), nothing added.
    assert_eq!(usage["prompt_tokens"], 12, "{usage}");
    assert_eq!(usage["completion_tokens"], 4, "{usage}");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 0));
    let m = Metrics::scrape(&sluice);
    assert_eq!(m.get("sluice_stream_continuations_total", &[]), 0.0);
}
