//! The mock's Azure OpenAI and Gemini wire formats over a real socket: their gates (Azure's
//! `api-version` 404 and `api-key` 401, Google's 403 and `API_KEY_INVALID` 400), bodies,
//! SSE framing and failure knobs.

use serde_json::{json, Value};

use super::{post, server, Client, Resp};
use crate::Behavior;

async fn send(srv: &super::MockServer, path: &str, body: &Value, headers: &str) -> Resp {
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(path, body, headers)).await;
    c.read_response().await
}

fn behavior(v: Value) -> Behavior {
    serde_json::from_value(v).expect("behavior")
}

/// The `data:` payloads of a CRLF-framed SSE body (Google's framing).
fn crlf_events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("utf-8");
    assert!(text.ends_with("\r\n\r\n"), "{text:?}");
    text.split("\r\n\r\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let d = e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}"));
            serde_json::from_str(d).unwrap_or_else(|err| panic!("{err}: {d}"))
        })
        .collect()
}

const AZ: &str = "/openai/deployments/gpt4o-prod/chat/completions";

#[tokio::test]
async fn azure_gates_its_paths_like_azure() {
    let srv = server(behavior(json!({"api_key": "az-1", "text": "hi there"}))).await;
    let body = json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]});
    let r = send(&srv, AZ, &body, "api-key: az-1\r\n").await;
    assert_eq!(r.status, 404, "no api-version");
    assert_eq!(r.json()["error"]["message"], "Resource not found");
    let path = format!("{AZ}?api-version=2024-10-21");
    let r = send(&srv, &path, &body, "").await;
    assert_eq!(
        r.status, 401,
        "no api-key (the Bearer token is not Azure's)"
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("invalid subscription key"));
    let r = send(&srv, &path, &body, "api-key: az-2\r\n").await;
    assert_eq!(r.status, 401, "another key");
    let r = send(&srv, &path, &body, "api-key: az-1\r\n").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model"], "gpt-4o-2024-08-06", "the deployment's model");
    assert_eq!(v["choices"][0]["message"]["content"], "hi there");
    assert_eq!(
        v["choices"][0]["content_filter_results"]["violence"]["filtered"],
        false
    );
    assert_eq!(v["prompt_filter_results"][0]["prompt_index"], 0);
    assert!(r.header("apim-request-id").is_some());

    let r = send(
        &srv,
        &path,
        &json!({"stream": true, "messages": [], "mock": {"content_filter": true}}),
        "api-key: az-1\r\n",
    )
    .await;
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["error"]["code"], "content_filter");
    assert_eq!(v["error"]["param"], "prompt");
    assert_eq!(
        v["error"]["innererror"]["code"],
        "ResponsibleAIPolicyViolation"
    );
}

#[tokio::test]
async fn azure_streams_open_with_the_prompt_filter_chunk() {
    let srv = server(behavior(json!({"tokens": 2}))).await;
    let path = format!("{AZ}?api-version=2024-10-21");
    let r = send(
        &srv,
        &path,
        &json!({"stream": true, "messages": []}),
        "api-key: any\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    let text = r.text();
    let data: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    let first: Value = serde_json::from_str(data[0]).expect("JSON");
    assert_eq!(first["choices"], json!([]));
    assert_eq!(first["model"], "");
    assert!(first["prompt_filter_results"].is_array());
    let token: Value = serde_json::from_str(data[2]).expect("JSON");
    assert_eq!(token["choices"][0]["delta"]["content"], "tok0 ");
    assert!(token["choices"][0]["content_filter_results"].is_object());
    assert_eq!(*data.last().expect("events"), "[DONE]");
}

const GM: &str = "/v1beta/models/gemini-2.5-flash";

#[tokio::test]
async fn gemini_gates_keys_like_google() {
    let srv = server(behavior(json!({"api_key": "gm-1"}))).await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi there you"}]}]});
    let path = format!("{GM}:generateContent");
    let r = send(&srv, &path, &body, "").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["error"]["status"], "PERMISSION_DENIED");
    let r = send(&srv, &path, &body, "x-goog-api-key: nope\r\n").await;
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(v["error"]["details"][0]["reason"], "API_KEY_INVALID");
    let r = send(&srv, &format!("{path}?key=gm-1"), &body, "").await;
    assert_eq!(r.status, 200, "the key as a query parameter");
    let r = send(&srv, &path, &body, "x-goog-api-key: gm-1\r\n").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=UTF-8")
    );
    // Google indents whole bodies.
    assert!(
        r.text().starts_with("{\n  \"candidates\": ["),
        "{}",
        r.text()
    );
    let v = r.json();
    assert_eq!(v["modelVersion"], "gemini-2.5-flash");
    assert_eq!(v["candidates"][0]["content"]["role"], "model");
    assert_eq!(v["candidates"][0]["finishReason"], "STOP");
    assert_eq!(v["usageMetadata"]["promptTokenCount"], 3);
    assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 5);
}

#[tokio::test]
async fn gemini_streams_are_crlf_framed_chunks_ending_with_the_finish() {
    let srv = server(behavior(
        json!({"tokens": 3, "reasoning": "hmm ok", "cached_tokens": 1}),
    ))
    .await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "a b c d"}]}]});
    let r = send(
        &srv,
        &format!("{GM}:streamGenerateContent?alt=sse"),
        &body,
        "x-goog-api-key: k\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let raw = r.text();
    assert!(raw.starts_with("data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"hmm \",\"thought\": true}]"), "{raw}");
    let evs = crlf_events(&r.body);
    assert_eq!(evs.len(), 2 + 3 + 1, "{raw}");
    assert_eq!(
        evs[0]["candidates"][0]["content"]["parts"][0]["thought"],
        true
    );
    assert_eq!(
        evs[2]["candidates"][0]["content"]["parts"][0]["text"],
        "tok0 "
    );
    let last = evs.last().expect("events");
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(
        last["usageMetadata"],
        json!({"promptTokenCount": 4, "candidatesTokenCount": 3, "totalTokenCount": 9,
               "cachedContentTokenCount": 1, "thoughtsTokenCount": 2,
               "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 4}]})
    );
    assert!(!raw.contains("[DONE]"));

    // Without alt=sse the mock refuses (it simulates the SSE form only).
    let r = send(
        &srv,
        &format!("{GM}:streamGenerateContent"),
        &body,
        "x-goog-api-key: k\r\n",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["status"], "INVALID_ARGUMENT");
}

#[tokio::test]
async fn gemini_failure_knobs_speak_googles_errors() {
    let srv = server(behavior(json!({"status": 429}))).await;
    let body = json!({"contents": []});
    let r = send(
        &srv,
        &format!("{GM}:generateContent"),
        &body,
        "x-goog-api-key: k\r\n",
    )
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                         "status": "RESOURCE_EXHAUSTED"}})
    );
    let srv = server(behavior(json!({"tokens": 4, "error_after_tokens": 1}))).await;
    let r = send(
        &srv,
        &format!("{GM}:streamGenerateContent?alt=sse"),
        &body,
        "x-goog-api-key: k\r\n",
    )
    .await;
    let evs = crlf_events(&r.body);
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[1]["error"]["status"], "INTERNAL");
    assert_eq!(evs[1]["error"]["code"], 500);
    let srv = server(behavior(json!({"tokens": 4, "drop_after_tokens": 2}))).await;
    let r = send(
        &srv,
        &format!("{GM}:streamGenerateContent?alt=sse"),
        &body,
        "x-goog-api-key: k\r\n",
    )
    .await;
    assert!(!r.complete, "the body was cut");
}
