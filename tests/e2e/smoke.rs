//! Smoke test: the default-shaped config streams through a mock provider.

use crate::harness::client::sse_text;
use crate::harness::{basic_config, Mock, Sluice};
use std::time::Duration;

#[test]
fn streams_through_a_mock_provider() {
    let mock = Mock::start(r#"{"tokens":3,"text":"hello brave world"}"#);
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    assert_eq!(
        s.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    let body = s.read_to_end(Duration::from_secs(10));
    assert_eq!(sse_text(&body), "hello brave world");
    assert!(!String::from_utf8_lossy(&body).contains("mock-small-v1"));
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    let log = mock.log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["model"], "mock-small-v1");
}
