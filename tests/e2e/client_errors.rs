//! What a newcomer's client gets back (issue 30, README findings): Responses errors carry
//! OpenAI's `code` (`invalid_api_key`, `invalid_request`); the Messages 401 names `x-api-key`;
//! `GET /v1/models` answers the anthropic SDK in Anthropic's shape and the openai SDK in
//! OpenAI's (both real SDKs); a passthrough route answers an HTTP/1.1 client in HTTP/1.1 when
//! its upstream speaks HTTP/1.0 (a raw socket reads the status line).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::harness::{basic_config, post_json, Mock, Sluice, KEY};
use crate::sdk::run_python;

#[test]
fn responses_errors_carry_openais_codes_and_the_messages_401_names_x_api_key() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[],
        r#"{"model":"x","input":"hi"}"#,
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key", "{}", r.text());
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        "{bad",
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_request", "{}", r.text());
    let r = post_json(
        sluice.addr,
        "/v1/messages",
        &[("anthropic-version", "2023-06-01")],
        r#"{"model":"x","max_tokens":5,"messages":[]}"#,
    );
    assert_eq!(r.status, 401);
    let v = r.json();
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("x-api-key") && !msg.contains("Bearer"),
        "{msg}"
    );
    // Broken JSON on /v1/messages says so, in Anthropic's shape, never ``invalid `?` ``.
    let r = post_json(
        sluice.addr,
        "/v1/messages",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        r#"{"model":"acme/chat","max_tokens":5,"messages":[{"role":"user","content":"hi"},]}"#,
    );
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("not valid JSON") && !msg.contains('?'),
        "{msg}"
    );
}

const SDK_SCRIPT: &str = r#"
import json, sys
import anthropic, openai
base, key = sys.argv[1], sys.argv[2]
a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
page = a.models.list()
print("anthropic", json.dumps([[m.type, m.id, m.display_name, str(m.created_at)] for m in page.data]), page.has_more, page.first_id, page.last_id)
one = a.models.retrieve("acme/chat")
print("anthropic-one", one.type, one.id)
o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
print("openai", json.dumps([[m.object, m.id, m.owned_by] for m in o.models.list()]))
try:
    openai.OpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0).responses.create(model="acme/chat", input="hi")
except openai.AuthenticationError as e:
    print("openai-401", e.code)
try:
    o.responses.create(model="acme/chat", input=[{"role": "user", "content": 5}])
except openai.BadRequestError as e:
    print("openai-400", e.code)
"#;

#[test]
fn the_models_list_answers_each_sdk_in_its_own_shape() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let base = format!("http://{}", sluice.addr);
    let (ok, out) = run_python(&["-c", SDK_SCRIPT, &base, KEY], Duration::from_secs(60));
    assert!(ok, "{out}");
    assert!(
        out.contains(
            r#"anthropic [["model", "acme/chat", "acme/chat", "1970-01-01 00:00:00+00:00"]] False acme/chat acme/chat"#
        ),
        "{out}"
    );
    assert!(out.contains("anthropic-one model acme/chat"), "{out}");
    assert!(
        out.contains(r#"openai [["model", "acme/chat", "acme"]]"#),
        "{out}"
    );
    assert!(out.contains("openai-401 invalid_api_key"), "{out}");
    assert!(out.contains("openai-400 invalid_request"), "{out}");
}

#[test]
fn a_passthrough_route_answers_http_1_1_to_an_http_1_1_client_of_an_http_1_0_upstream() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let up = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello",
            );
        }
    });
    let yaml = format!(
        "{}passthrough:\n  - name: old\n    path_prefix: /old\n    upstreams: [{up}]\n",
        basic_config("http://127.0.0.1:9/v1", "")
    );
    let sluice = Sluice::start(&yaml);
    let mut s = TcpStream::connect_timeout(&sluice.addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(b"GET /old/x HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("hello"), "{text}");
}
