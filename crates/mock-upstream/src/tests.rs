//! Loopback tests of the mock upstream (real sockets on 127.0.0.1, ephemeral ports).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wire::split_words;
use super::*;

const T: Duration = Duration::from_secs(10);

async fn server(b: Behavior) -> MockServer {
    MockServer::start("127.0.0.1:0", Arc::new(MockState::new(b)))
        .await
        .expect("bind")
}

/// A parsed HTTP response as seen by a client.
#[derive(Debug, Default)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    /// De-chunked body.
    body: Vec<u8>,
    /// Each HTTP chunk's payload (chunked responses only).
    chunks: Vec<Vec<u8>>,
    /// The body ended properly (terminator / full Content-Length).
    complete: bool,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("utf8 body")
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

/// Buffered reader over a client stream.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Client {
            s,
            buf: Vec::new(),
            eof: false,
        }
    }

    async fn fill(&mut self) -> bool {
        let mut tmp = vec![0u8; 65536];
        match tokio::time::timeout(T, self.s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                self.eof = true;
                false
            }
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(_) => panic!("client read timed out"),
        }
    }

    async fn send(&mut self, data: &[u8]) {
        self.s.write_all(data).await.expect("write");
    }

    async fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Some(l);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    async fn read_response(&mut self) -> Resp {
        let mut r = Resp::default();
        let status_line = self.line().await.expect("status line");
        let sl = String::from_utf8(status_line).expect("status utf8");
        r.status = sl.split(' ').nth(1).expect("status").parse().expect("num");
        loop {
            let l = self.line().await.expect("header line");
            if l.is_empty() {
                break;
            }
            let l = String::from_utf8(l).expect("header utf8");
            let (k, v) = l.split_once(':').expect("colon");
            r.headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        if r.status == 100 {
            return Box::pin(self.read_response()).await;
        }
        if r.header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            loop {
                let Some(l) = self.line().await else { return r };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&l).expect("size"), 16).expect("hex");
                if size == 0 {
                    let _ = self.line().await;
                    r.complete = true;
                    return r;
                }
                while self.buf.len() < size + 2 {
                    if !self.fill().await {
                        return r;
                    }
                }
                let c = self.buf[..size].to_vec();
                assert_eq!(&self.buf[size..size + 2], b"\r\n");
                self.buf.drain(..size + 2);
                r.body.extend_from_slice(&c);
                r.chunks.push(c);
            }
        } else {
            let n: usize = r
                .header("content-length")
                .expect("content-length")
                .parse()
                .expect("cl");
            while self.buf.len() < n {
                if !self.fill().await {
                    r.body = std::mem::take(&mut self.buf);
                    return r;
                }
            }
            r.body = self.buf.drain(..n).collect();
            r.complete = true;
            r
        }
    }

    /// True when the server closed the connection (EOF/RST) within `within`.
    async fn closed_within(&mut self, within: Duration) -> bool {
        let mut tmp = [0u8; 1024];
        match tokio::time::timeout(within, self.s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) => false,
            Err(_) => false,
        }
    }
}

fn post(path: &str, body: &Value, extra: &str) -> Vec<u8> {
    let b = serde_json::to_vec(body).expect("ser");
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-test\r\nContent-Length: {}\r\n{extra}\r\n",
        b.len()
    )
    .into_bytes();
    r.extend_from_slice(&b);
    r
}

async fn call(srv: &MockServer, path: &str, body: &Value) -> Resp {
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(path, body, "")).await;
    c.read_response().await
}

async fn control(srv: &MockServer, method: &str, path: &str, body: &str) -> Resp {
    let mut c = Client::connect(srv.addr()).await;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.send(req.as_bytes()).await;
    c.read_response().await
}

/// Wait until the latest log record satisfies `f`.
async fn wait_log<F: Fn(&RequestRecord) -> bool>(st: &MockState, f: F) -> RequestRecord {
    let deadline = Instant::now() + T;
    loop {
        if let Some(r) = st.log().last() {
            if f(r) {
                return r.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "log condition not met: {:?}",
            st.log()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn chat(model: &str, stream: bool, mock: Value) -> Value {
    json!({"model": model, "stream": stream,
           "messages": [{"role": "user", "content": "hi there"}], "mock": mock})
}

#[test]
fn words_keep_spaces_and_utf8() {
    assert_eq!(split_words("héllo 世界 🚀"), vec!["héllo ", "世界 ", "🚀"]);
    assert_eq!(split_words("  a  b\n"), vec!["  a  ", "b\n"]);
    assert!(split_words("").is_empty());
}

#[tokio::test]
async fn openai_non_stream_format() {
    let srv = server(Behavior::default()).await;
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat(
            "gpt-x",
            false,
            json!({"tokens": 3, "id": "chatcmpl-1", "created": 42}),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(
        r.text(),
        concat!(
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":42,"model":"gpt-x","#,
            r#""choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 ","#,
            r#""refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"#,
            r#""usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5},"#,
            r#""system_fingerprint":"fp_mock"}"#
        )
    );
    let rec = wait_log(srv.state(), |r| r.completed).await;
    assert_eq!(rec.model.as_deref(), Some("gpt-x"));
    assert_eq!(rec.stream, Some(false));
    assert_eq!(rec.status, Some(200));
    assert_eq!(
        rec.headers.get("authorization").map(String::as_str),
        Some("Bearer sk-test")
    );
    assert_eq!(rec.bytes_written, r.body.len() as u64);
}

#[tokio::test]
async fn openai_stream_exact_bytes() {
    let srv = server(Behavior::default()).await;
    let mut body = chat(
        "gpt-x",
        true,
        json!({"tokens": 2, "id": "chatcmpl-1", "created": 7}),
    );
    body["stream_options"] = json!({"include_usage": true});
    let r = call(&srv, "/openai/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.complete);
    let pre = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"gpt-x","system_fingerprint":"fp_mock","choices":"#;
    let expected = format!(
        "data: {pre}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {pre}[{{\"index\":0,\"delta\":{{\"content\":\"tok0 \"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {pre}[{{\"index\":0,\"delta\":{{\"content\":\"tok1 \"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {pre}[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n\
         data: {pre}[],\"usage\":{{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}}}\n\n\
         data: [DONE]\n\n"
    );
    assert_eq!(r.text(), expected);
    // One HTTP chunk per event by default.
    assert_eq!(r.chunks.len(), 6);
    let rec = wait_log(srv.state(), |r| r.completed).await;
    assert_eq!(rec.bytes_written, r.body.len() as u64);
    assert_eq!(rec.stream, Some(true));
}

#[tokio::test]
async fn openai_stream_without_usage_matches_brief_shape() {
    let srv = server(Behavior::default()).await;
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 1, "id": "c", "created": 1})),
    )
    .await;
    let events: Vec<&str> = std::str::from_utf8(&r.body)
        .expect("utf8")
        .split_terminator("\n\n")
        .collect();
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[0],
        r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp_mock","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#
    );
    assert_eq!(events[3], "data: [DONE]");
    // Forced usage chunk.
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 1, "usage": true})),
    )
    .await;
    assert!(r
        .text()
        .contains(r#""choices":[],"usage":{"prompt_tokens""#));
}

#[tokio::test]
async fn anthropic_formats() {
    let srv = server(Behavior::default()).await;
    let r = call(
        &srv,
        "/v1/messages",
        &chat(
            "claude-x",
            false,
            json!({"text": "héllo 世界 🚀", "id": "msg_1"}),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"héllo 世界 🚀"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":3}}"#
    );
    let r = call(
        &srv,
        "/anthropic/v1/messages",
        &chat("claude-x", true, json!({"text": "Hi yo", "id": "msg_1"})),
    )
    .await;
    assert!(r.complete);
    let expected = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":1}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi "}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"yo"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
        "\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    assert_eq!(r.text(), expected);
    // Anthropic-shaped error.
    let r = call(
        &srv,
        "/v1/messages",
        &chat("claude-x", true, json!({"status": 529})),
    )
    .await;
    assert_eq!(r.status, 529);
    assert_eq!(
        r.json(),
        json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})
    );
}

#[tokio::test]
async fn models_and_control_not_logged() {
    let srv = server(Behavior::default()).await;
    let mut c = Client::connect(srv.addr()).await;
    c.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let r = c.read_response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], "mock-model");
    assert_eq!(control(&srv, "GET", "/_mock/healthz", "").await.status, 200);
    let log = control(&srv, "GET", "/_mock/log", "").await.json();
    let reqs = log["requests"].as_array().expect("array");
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["path"], "/v1/models");
    assert_eq!(reqs[0]["seq"], 1);
    assert_eq!(control(&srv, "POST", "/_mock/reset", "").await.status, 200);
    assert!(srv.state().log().is_empty());
    // Unknown route → 404 (logged), bad behaviour → 400.
    let r = call(&srv, "/v1/nothing", &json!({})).await;
    assert_eq!(r.status, 404);
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", false, json!({"nope": 1})),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("nope"));
    assert_eq!(srv.state().log().len(), 2);
}

#[tokio::test]
async fn restart_answer_repeats_the_text_so_far_of_a_continuation_request() {
    let srv = server(Behavior::default()).await;
    let content = |r: &Resp| r.json()["choices"][0]["message"]["content"].clone();
    let knob = json!({"text": " Then more.", "restart_answer": true});
    let mut body = chat("m", false, knob.clone());
    body["messages"] = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Cut here."},
        {"role": "user", "content": "Continue."}
    ]);
    let r = call(&srv, "/v1/chat/completions", &body).await;
    assert_eq!(content(&r), "Cut here. Then more.");
    // An ordinary request has no text so far: the text alone.
    let r = call(&srv, "/v1/chat/completions", &chat("m", false, knob)).await;
    assert_eq!(content(&r), " Then more.");
}

#[tokio::test]
async fn precedence_request_over_process_over_startup() {
    let srv = server(Behavior {
        tokens: Some(1),
        token_delay_ms: Some(0),
        ..Behavior::default()
    })
    .await;
    let content = |r: &Resp| r.json()["choices"][0]["message"]["content"].clone();
    let r = call(&srv, "/v1/chat/completions", &chat("m", false, json!({}))).await;
    assert_eq!(content(&r), "tok0 ");
    let r = control(&srv, "POST", "/_mock/behavior", r#"{"tokens":2}"#).await;
    assert_eq!(r.status, 200);
    let r = call(&srv, "/v1/chat/completions", &chat("m", false, json!({}))).await;
    assert_eq!(content(&r), "tok0 tok1 ");
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", false, json!({"tokens": 3})),
    )
    .await;
    assert_eq!(content(&r), "tok0 tok1 tok2 ");
    let r = control(&srv, "POST", "/_mock/behavior", r#"{"bogus":2}"#).await;
    assert_eq!(r.status, 400);
    let r = control(&srv, "GET", "/_mock/behavior", "").await;
    assert_eq!(r.json(), json!({"tokens": 2}));
}

#[tokio::test]
async fn fail_first_counts_per_process() {
    let srv = server(Behavior::default()).await;
    let body = chat("m", false, json!({"fail_first": 2}));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(call(&srv, "/v1/chat/completions", &body).await.status);
    }
    assert_eq!(statuses, vec![503, 503, 200]);
    // Reset clears the counters.
    control(&srv, "POST", "/_mock/reset", "").await;
    assert_eq!(call(&srv, "/v1/chat/completions", &body).await.status, 503);
    // fail_first with explicit status.
    let body = chat("m", false, json!({"fail_first": 1, "status": 500}));
    assert_eq!(call(&srv, "/v1/chat/completions", &body).await.status, 500);
    assert_eq!(call(&srv, "/v1/chat/completions", &body).await.status, 200);
}

#[tokio::test]
async fn status_and_retry_after() {
    let srv = server(Behavior::default()).await;
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat(
            "m",
            true,
            json!({"status": 429, "retry_after_s": 7, "headers": {"x-extra": "1"}}),
        ),
    )
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("x-extra"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let j = r.json();
    assert_eq!(j["error"]["code"], "rate_limit_exceeded");
    assert_eq!(j["error"]["param"], Value::Null);
    assert!(j["error"]["message"].is_string());
    assert!(j["error"]["type"].is_string());
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", false, json!({"status": 500, "error_body": "not json"})),
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.text(), "not json");
    assert_eq!(r.header("retry-after"), None);
}

#[tokio::test]
async fn stall_detects_peer_close_quickly() {
    let srv = server(Behavior::default()).await;
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("m", true, json!({"stall": true})),
        "",
    ))
    .await;
    wait_log(srv.state(), |_| true).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let closed_at = srv.state().now_ms();
    drop(c);
    let rec = wait_log(srv.state(), |r| r.peer_closed_at_ms.is_some()).await;
    let seen = rec.peer_closed_at_ms.unwrap_or(0);
    assert!(
        seen >= closed_at && seen - closed_at <= 50,
        "{seen} vs {closed_at}"
    );
    assert_eq!(rec.phase, Some(Phase::BeforeHead));
    assert!(!rec.completed);
    assert_eq!(rec.status, None);
}

#[tokio::test]
async fn stall_after_tokens_and_first_byte_delay_phases() {
    let srv = server(Behavior::default()).await;
    // Mid-stream stall.
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("m", true, json!({"stall_after_tokens": 2})),
        "",
    ))
    .await;
    let rec = wait_log(srv.state(), |r| r.bytes_written > 0).await;
    assert_eq!(rec.status, Some(200));
    // Wait until both tokens went out, then close.
    let deadline = Instant::now() + T;
    while !String::from_utf8_lossy(&c.buf).contains("tok1 ") {
        assert!(Instant::now() < deadline);
        c.fill().await;
    }
    assert!(!String::from_utf8_lossy(&c.buf).contains("tok2"));
    let closed_at = srv.state().now_ms();
    drop(c);
    let rec = wait_log(srv.state(), |r| r.peer_closed_at_ms.is_some()).await;
    assert!(rec.peer_closed_at_ms.unwrap_or(0) - closed_at <= 50);
    assert_eq!(rec.phase, Some(Phase::MidStream));

    // After the head, before the first event.
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/messages",
        &chat("m", true, json!({"first_event_delay_ms": 5000})),
        "",
    ))
    .await;
    let _ = wait_log(srv.state(), |r| r.seq == 2 && r.head_at_ms.is_some()).await;
    drop(c);
    let rec = wait_log(srv.state(), |r| r.seq == 2 && r.peer_closed_at_ms.is_some()).await;
    assert_eq!(rec.phase, Some(Phase::AfterHead));
    assert_eq!(rec.bytes_written, 0);
}

#[tokio::test]
async fn drop_after_tokens_and_close_before_first_event() {
    let srv = server(Behavior::default()).await;
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("m", true, json!({"drop_after_tokens": 2, "tokens": 5})),
        "",
    ))
    .await;
    let r = c.read_response().await;
    assert_eq!(r.status, 200);
    assert!(!r.complete, "no chunked terminator");
    let t = r.text();
    assert!(t.contains("tok1 ") && !t.contains("tok2"));
    assert!(c.eof);
    let rec = wait_log(srv.state(), |r| r.mock_closed).await;
    assert!(!rec.completed);
    assert_eq!(rec.peer_closed_at_ms, None);

    // Non-stream: partial body then close.
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("m", false, json!({"drop_after_tokens": 0, "reset": true})),
        "",
    ))
    .await;
    let r = c.read_response().await;
    assert!(!r.complete);
    assert!(!r.body.is_empty());

    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/messages",
        &chat("m", true, json!({"close_before_first_event": true})),
        "",
    ))
    .await;
    let r = c.read_response().await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty() && !r.complete);
}

#[tokio::test]
async fn split_modes_produce_separate_chunks() {
    let srv = server(Behavior::default()).await;
    // none: one chunk per event.
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 2})),
    )
    .await;
    let events = r.text().matches("\n\n").count();
    assert_eq!(r.chunks.len(), events);

    // mid_line: 2-3 chunks per event, no chunk ends at a line end except the last piece.
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 2, "split": "mid_line"})),
    )
    .await;
    assert!(r.complete);
    assert!(r.chunks.len() >= 2 * events && r.chunks.len() <= 3 * events);
    assert!(r.chunks.iter().any(|c| c == b"dat"));
    let cut_mid = r.chunks.iter().filter(|c| !c.ends_with(b"\n")).count();
    assert!(cut_mid >= events);

    // bytewise: one byte per chunk.
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 1, "split": "bytewise"})),
    )
    .await;
    assert!(r.complete);
    assert!(r.chunks.iter().all(|c| c.len() == 1));
    assert_eq!(r.chunks.len(), r.body.len());

    // mid_utf8: some chunks are not valid UTF-8 on their own, the whole is.
    let r = call(
        &srv,
        "/v1/messages",
        &chat(
            "m",
            true,
            json!({"text": "héllo 世界 🚀", "split": "mid_utf8"}),
        ),
    )
    .await;
    assert!(r.complete);
    assert!(r.chunks.iter().any(|c| std::str::from_utf8(c).is_err()));
    assert!(r.text().contains("\"text\":\"🚀\""));
    // Default text becomes non-ASCII in mid_utf8 mode.
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 1, "split": "mid_utf8"})),
    )
    .await;
    assert!(r.text().contains("tök0 "));
    assert!(r.chunks.iter().any(|c| std::str::from_utf8(c).is_err()));
}

#[tokio::test]
async fn sse_framing_variants() {
    let srv = server(Behavior::default()).await;
    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 2, "crlf": true})),
    )
    .await;
    let t = r.text();
    assert!(t.ends_with("data: [DONE]\r\n\r\n"));
    assert_eq!(t.matches('\n').count(), t.matches("\r\n").count());

    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("m", true, json!({"tokens": 1, "lone_cr": true})),
    )
    .await;
    let t = r.text();
    assert!(!t.contains('\n') && t.ends_with("data: [DONE]\r\r"));

    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat(
            "m",
            true,
            json!({"tokens": 1, "comments": true, "event_names": true, "no_space": true, "multi_line_data": true}),
        ),
    )
    .await;
    let t = r.text();
    assert!(t.starts_with(": OPENROUTER PROCESSING\n\nevent:chunk\ndata:{\"id\":"));
    assert!(t.contains(",\ndata:\"object\":\"chat.completion.chunk\""));
    assert!(t.ends_with("event:chunk\ndata:[DONE]\n\n"));
    // Each event's data lines joined with "\n" is valid JSON.
    for ev in t.split("\n\n") {
        let data: Vec<&str> = ev.lines().filter_map(|l| l.strip_prefix("data:")).collect();
        if data.is_empty() || data == ["[DONE]"] {
            continue;
        }
        serde_json::from_str::<Value>(&data.join("\n")).expect("joined data is JSON");
    }

    // Mid-stream error event.
    let r = call(
        &srv,
        "/v1/messages",
        &chat("m", true, json!({"tokens": 3, "error_after_tokens": 1})),
    )
    .await;
    let t = r.text();
    assert!(r.complete);
    assert!(t.contains("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\""));
    assert!(!t.contains("message_stop"));
}

#[tokio::test]
async fn keep_alive_two_requests_one_connection() {
    let srv = server(Behavior::default()).await;
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("a", true, json!({})),
        "",
    ))
    .await;
    let r1 = c.read_response().await;
    assert!(r1.complete);
    assert_eq!(r1.header("connection"), Some("keep-alive"));
    c.send(&post("/v1/messages", &chat("b", false, json!({})), ""))
        .await;
    let r2 = c.read_response().await;
    assert!(r2.complete);
    assert_eq!(r2.json()["model"], "b");
    // Connection: close is honoured.
    c.send(&post(
        "/v1/chat/completions",
        &chat("c", false, json!({})),
        "Connection: close\r\n",
    ))
    .await;
    let r3 = c.read_response().await;
    assert_eq!(r3.header("connection"), Some("close"));
    assert!(c.closed_within(Duration::from_secs(2)).await);
    let log = srv.state().log();
    assert_eq!(log.len(), 3);
    assert!(log.iter().all(|r| r.conn_id == log[0].conn_id));
    assert_eq!(
        log.iter().map(|r| r.conn_seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(log
        .iter()
        .all(|r| r.completed && r.peer_closed_at_ms.is_none()));
}

#[tokio::test]
async fn chunked_request_body() {
    let srv = server(Behavior::default()).await;
    let body = serde_json::to_vec(&chat("chunky", false, json!({"tokens": 1}))).expect("ser");
    let (a, b) = body.split_at(10);
    let mut req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n".to_vec();
    req.extend_from_slice(format!("{:x};ext=1\r\n", a.len()).as_bytes());
    req.extend_from_slice(a);
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(format!("{:X}\r\n", b.len()).as_bytes());
    req.extend_from_slice(b);
    req.extend_from_slice(b"\r\n0\r\nX-Trailer: 1\r\n\r\n");
    let mut c = Client::connect(srv.addr()).await;
    // Send in small pieces to exercise partial parsing.
    for piece in req.chunks(7) {
        c.send(piece).await;
    }
    let r = c.read_response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["model"], "chunky");
    let rec = wait_log(srv.state(), |r| r.completed).await;
    assert_eq!(rec.body_bytes, body.len() as u64);
    assert_eq!(
        rec.headers.get("transfer-encoding").map(String::as_str),
        Some("chunked")
    );
    assert_eq!(rec.model.as_deref(), Some("chunky"));
}

#[tokio::test]
async fn one_mib_request_body() {
    let srv = server(Behavior::default()).await;
    let big = "x".repeat(1024 * 1024);
    let body = json!({"model": "big", "messages": [{"role": "user", "content": big}]});
    let r = call(&srv, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    let rec = wait_log(srv.state(), |r| r.completed).await;
    let size = serde_json::to_vec(&body).expect("ser").len() as u64;
    assert!(size > 1024 * 1024);
    assert_eq!(rec.body_bytes, size);
    assert!(rec.body_truncated);
    assert_eq!(rec.body.len(), BODY_COPY_LIMIT);
    assert_eq!(rec.model.as_deref(), Some("big"));
}

#[tokio::test]
async fn demo_mode_echoes_last_user_message() {
    let srv = MockServer::start("127.0.0.1:0", Arc::new(MockState::demo()))
        .await
        .expect("bind");
    let body = json!({"model": "demo", "messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "héllo wörld"}]}
    ]});
    let r = call(&srv, "/v1/chat/completions", &body).await;
    let j = r.json();
    let text = "Hello from Sluice's built-in demo provider. You said: héllo wörld";
    assert_eq!(j["choices"][0]["message"]["content"], text);
    // Ten words: "Hello ", "from ", "Sluice's ", ..., "héllo ", "wörld".
    assert_eq!(j["usage"]["completion_tokens"], 10);
    // Default 20 ms per token in demo mode.
    let started = Instant::now();
    let mut b2 = body.clone();
    b2["stream"] = json!(true);
    let r = call(&srv, "/v1/messages", &b2).await;
    assert!(r.complete);
    assert!(started.elapsed() >= Duration::from_millis(20 * 10));
    assert!(r.text().contains("\"text\":\"wörld\""));
}

#[tokio::test]
async fn total_bytes_blocks_on_slow_reader() {
    let srv = server(Behavior::default()).await;
    let total: u64 = 8 * 1024 * 1024;
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &chat("m", true, json!({"total_bytes": total})),
        "",
    ))
    .await;
    // Do not read: the writer must block well below the total.
    // On a loaded machine the writer may take a while to fill the socket buffers: wait
    // (bounded) until its count stops moving, then it must have stopped short of the total.
    let _ = wait_log(srv.state(), |r| r.bytes_written > 0).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let still = loop {
        let before = srv.state().log()[0].bytes_written;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = srv.state().log()[0].bytes_written;
        if before == after {
            break after;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writer never blocked: {after} of {total} bytes written after 10 s"
        );
    };
    assert!(
        still < total,
        "writer should be blocked below the total: {still}"
    );
    // Now read everything.
    let r = c.read_response().await;
    assert!(r.complete);
    assert!(r.body.len() as u64 >= total);
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    let rec = wait_log(srv.state(), |r| r.completed).await;
    assert_eq!(rec.bytes_written, r.body.len() as u64);
}

#[tokio::test]
async fn demo_mode_keeps_nothing_answers_no_control_endpoint_and_ignores_steering() {
    let srv = MockServer::start("127.0.0.1:0", Arc::new(MockState::demo()))
        .await
        .expect("bind");
    let text = "Hello from Sluice's built-in demo provider. You said: hi";
    let body = json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}],
        "mock": {"status": 500, "text": "steered", "reasoning": "steered",
                 "tool_calls": [{"name": "steered"}]}});
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        "/v1/chat/completions",
        &body,
        "x-mock-behavior: {\"status\":503}\r\n",
    ))
    .await;
    let r = c.read_response().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], text);
    assert!(!r.text().contains("steered"), "{}", r.text());
    assert!(srv.state().log().is_empty(), "demo mode keeps no record");
    for (method, path, body) in [
        ("GET", "/_mock/log", ""),
        ("GET", "/_mock/behavior", ""),
        ("POST", "/_mock/behavior", r#"{"status":500}"#),
        ("POST", "/_mock/reset", "{}"),
    ] {
        let r = control(&srv, method, path, body).await;
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
        assert!(!r.text().contains("requests"), "{}", r.text());
    }
    // The POST /_mock/behavior above changed nothing.
    let r = call(&srv, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(srv.state().default_behavior(), Behavior::demo());
}

#[tokio::test]
async fn serve_stream_speaks_http_over_an_in_process_pipe() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut near, far) = tokio::io::duplex(64 * 1024);
    let task = tokio::spawn(super::serve_stream(far, Arc::new(MockState::demo())));
    let body = json!({"model": "demo", "stream": true,
        "messages": [{"role": "user", "content": "pipe"}]});
    // `Connection: close`, so that the response ends with EOF.
    let req = post("/v1/chat/completions", &body, "connection: close\r\n");
    near.write_all(&req).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), near.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("\"content\":\"pipe\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"), "{text}");
    task.await.expect("join").expect("served");
}

#[tokio::test]
async fn anthropic_tool_use_and_thinking_stream_exact_bytes() {
    let srv = server(Behavior::default()).await;
    let mock = json!({"id": "msg_1", "text": "Hi", "reasoning": "Let me think",
        "signature": "sig==",
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich"}, "id": "toolu_1"},
                       {"name": "get_time", "id": "toolu_2"}]});
    let r = call(&srv, "/v1/messages", &chat("claude-x", true, mock.clone())).await;
    assert!(r.complete);
    let ev = |name: &str, data: &str| format!("event: {name}\ndata: {data}\n\n");
    let d = |i: u32, delta: &str| {
        ev(
            "content_block_delta",
            &format!(r#"{{"type":"content_block_delta","index":{i},"delta":{delta}}}"#),
        )
    };
    let stop = |i: u32| {
        ev(
            "content_block_stop",
            &format!(r#"{{"type":"content_block_stop","index":{i}}}"#),
        )
    };
    let expected = [
        ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":1}}}"#),
        ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#),
        ev("ping", r#"{"type":"ping"}"#),
        d(0, r#"{"type":"thinking_delta","thinking":"Let "}"#),
        d(0, r#"{"type":"thinking_delta","thinking":"me "}"#),
        d(0, r#"{"type":"thinking_delta","thinking":"think"}"#),
        d(0, r#"{"type":"signature_delta","signature":"sig=="}"#),
        stop(0),
        ev("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#),
        d(1, r#"{"type":"text_delta","text":"Hi"}"#),
        stop(1),
        ev("content_block_start", r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#),
        d(2, r#"{"type":"input_json_delta","partial_json":""}"#),
        d(2, r#"{"type":"input_json_delta","partial_json":"{\"city\""}"#),
        d(2, r#"{"type":"input_json_delta","partial_json":":\"Züric"}"#),
        d(2, r#"{"type":"input_json_delta","partial_json":"h\"}"}"#),
        stop(2),
        ev("content_block_start", r#"{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_2","name":"get_time","input":{}}}"#),
        d(3, r#"{"type":"input_json_delta","partial_json":""}"#),
        d(3, r#"{"type":"input_json_delta","partial_json":"{}"}"#),
        stop(3),
        ev("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":10}}"#),
        ev("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .concat();
    assert_eq!(r.text(), expected);

    let r = call(&srv, "/v1/messages", &chat("claude-x", false, mock)).await;
    assert_eq!(
        r.json(),
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "Let me think", "signature": "sig=="},
                {"type": "text", "text": "Hi"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Zürich"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 2, "output_tokens": 10}})
    );
}

#[tokio::test]
async fn openai_parallel_tool_calls_and_reasoning_content() {
    let srv = server(Behavior::default()).await;
    let tools =
        json!([{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\"y\":true}"}]);
    let mut body = chat(
        "gpt-x",
        true,
        json!({"id": "c", "created": 1, "tool_calls": tools}),
    );
    body["stream_options"] = json!({"include_usage": true});
    let r = call(&srv, "/v1/chat/completions", &body).await;
    let pre = r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-x","system_fingerprint":"fp_mock","choices":[{"index":0,"delta":"#;
    let post = r#","logprobs":null,"finish_reason":null}],"usage":null}"#;
    let chunk = |delta: &str| format!("{pre}{delta}{post}\n\n");
    let expected = [
        chunk(r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_mock1_0","type":"function","function":{"name":"a","arguments":""}}],"refusal":null}"#),
        chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"x\":1}"}}]}"#),
        chunk(r#"{"tool_calls":[{"index":1,"id":"call_mock1_1","type":"function","function":{"name":"b","arguments":""}}]}"#),
        chunk(r#"{"tool_calls":[{"index":1,"function":{"arguments":"{\"y\":tr"}}]}"#),
        chunk(r#"{"tool_calls":[{"index":1,"function":{"arguments":"ue}"}}]}"#),
        format!("{pre}{{}},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}}],\"usage\":null}}\n\n"),
        r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-x","system_fingerprint":"fp_mock","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}"#.to_string() + "\n\n",
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    assert_eq!(r.text(), expected);

    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat(
            "gpt-x",
            false,
            json!({"reasoning": "hm ok", "text": "Yes", "tool_calls": tools}),
        ),
    )
    .await;
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], "Yes");
    assert_eq!(msg["reasoning_content"], "hm ok");
    assert_eq!(
        msg["tool_calls"][1]["function"]["arguments"],
        "{\"y\":true}"
    );
    assert_eq!(msg["tool_calls"][1]["type"], "function");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        2
    );

    let r = call(
        &srv,
        "/v1/chat/completions",
        &chat("gpt-x", true, json!({"reasoning": "hm", "text": "Yes"})),
    )
    .await;
    let t = r.text();
    assert!(
        t.contains(r#""delta":{"content":null,"reasoning_content":"hm"}"#),
        "{t}"
    );
    assert!(t.find("reasoning_content").unwrap() < t.find(r#""content":"Yes""#).unwrap());
    assert!(t.contains(r#""finish_reason":"stop""#), "{t}");
}

#[tokio::test]
async fn anthropic_token_count_is_deterministic_recorded_and_refuses_generation_fields() {
    let srv = server(Behavior::default()).await;
    let body = json!({"model": "claude-x", "system": "be brief please",
        "messages": [{"role": "user", "content": "hi there"},
                     {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]});
    let r = call(&srv, "/v1/messages/count_tokens", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    // The words of `system` and of every message: 3 + 2 + 1.
    assert_eq!(r.text(), r#"{"input_tokens":6}"#);
    let rec = wait_log(srv.state(), |r| r.path == "/v1/messages/count_tokens").await;
    assert_eq!(rec.method, "POST");
    assert_eq!(rec.model.as_deref(), Some("claude-x"));
    // `prompt_tokens` fixes the count; the failure knobs apply.
    let mut fixed = body.clone();
    fixed["mock"] = json!({"prompt_tokens": 4242});
    let r = call(&srv, "/v1/messages/count_tokens", &fixed).await;
    assert_eq!(r.text(), r#"{"input_tokens":4242}"#);
    fixed["mock"] = json!({"status": 529});
    let r = call(&srv, "/v1/messages/count_tokens", &fixed).await;
    assert_eq!(r.status, 529);
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    // Anthropic refuses generation-only members here.
    let mut extra = body.clone();
    extra["max_tokens"] = json!(10);
    let r = call(&srv, "/v1/messages/count_tokens", &extra).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "max_tokens: Extra inputs are not permitted"}})
    );
    let r = call(
        &srv,
        "/v1/messages/count_tokens",
        &json!({"model": "claude-x"}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "messages: Field required");
}

#[tokio::test]
async fn prompt_cache_reports_a_repeated_prefix_as_cached_until_reset() {
    let srv = server(Behavior {
        prompt_cache: Some(true),
        ..Behavior::default()
    })
    .await;
    let turn = |first: &str, more: bool| {
        let mut messages = vec![json!({"role": "user", "content": first})];
        if more {
            messages.push(json!({"role": "assistant", "content": "tok0 tok1"}));
            messages.push(json!({"role": "user", "content": "and then what"}));
        }
        json!({"model": "m", "messages": messages})
    };
    let usage = |r: &Resp| -> Value {
        serde_json::from_str::<Value>(&r.text()).expect("json")["usage"].clone()
    };
    let first = usage(&call(&srv, "/v1/chat/completions", &turn("one two three", false)).await);
    assert!(first.get("prompt_tokens_details").is_none(), "{first}");
    // The same first message again, two turns on: all but the last message's 3 words cached.
    let again = usage(&call(&srv, "/v1/chat/completions", &turn("one two three", true)).await);
    assert_eq!(again["prompt_tokens"], 8, "{again}");
    assert_eq!(
        again["prompt_tokens_details"]["cached_tokens"], 5,
        "{again}"
    );
    let other = usage(&call(&srv, "/v1/chat/completions", &turn("four five", true)).await);
    assert!(other.get("prompt_tokens_details").is_none(), "{other}");
    control(&srv, "POST", "/_mock/reset", "{}").await;
    let after = usage(&call(&srv, "/v1/chat/completions", &turn("one two three", true)).await);
    assert!(
        after.get("prompt_tokens_details").is_none(),
        "reset forgets: {after}"
    );
}
mod cloud;
mod tool_loop;

#[tokio::test]
async fn openai_responses_answers_streams_and_side_endpoints() {
    let srv = server(Behavior::default()).await;
    let body = json!({"model": "gpt-r", "input": "hi",
        "mock": {"text": "a b", "reasoning": "think", "prompt_tokens": 9, "cached_tokens": 4}});
    let v = call(&srv, "/v1/responses", &body).await.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert!(v["output"][0]["encrypted_content"]
        .as_str()
        .is_some_and(|e| e.starts_with("mock-signature-resp_mock")));
    assert_eq!(v["output"][1]["content"][0]["text"], "a b");
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 1);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = call(&srv, "/v1/responses", &streamed).await.text();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("JSON event"))
        .collect();
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().expect("numbered"))
        .collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["type"], "response.created");
    let last = events.last().expect("events");
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["usage"]["input_tokens"], 9);
    assert!(!text.contains("[DONE]"), "{text}");

    let n = call(
        &srv,
        "/v1/responses/input_tokens",
        &json!({"model": "m", "input": "hi", "mock": {"prompt_tokens": 12}}),
    )
    .await
    .json();
    assert_eq!(
        n,
        json!({"object": "response.input_tokens", "input_tokens": 12})
    );
    let c = call(
        &srv,
        "/v1/responses/compact",
        &json!({"model": "m", "input": "hi"}),
    )
    .await
    .json();
    assert_eq!(c["object"], "response.compaction");
    assert_eq!(c["output"][0]["type"], "compaction");
    assert!(c["output"][0]["encrypted_content"].is_string());
}
