//! The Responses API's WebSocket mode on `GET /v1/responses` (issue 32, part 2): the
//! official `openai` SDK's `client.responses.connect()` driving several responses on one
//! socket with incremental input and `previous_response_id`, `store: false`, on every
//! provider kind, the events equal to the HTTP stream's; one ledger row per response;
//! limits as `error` events on a socket that stays open; cancellation by `response.cancel`
//! and by closing the socket (the mock sees its connection closed); heartbeats both ways;
//! 426 with the mode off, 401 for a bad key, 1009 for an oversized message; 503 past the
//! session cap; `wss://` on the TLS listener.
//!
//! The edge cases use tungstenite's client over a plain loopback socket; the SDK case runs
//! `tests/sdk/responses_websocket_client.py` with the interpreter `crate::sdk::python` finds.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

use crate::harness::client::post_json;
use crate::harness::{basic_config, eventually, Mock, Sluice, KEY};
use crate::provider_battery::{self as battery, Rig, MODEL};

/// The mock's answer in these tests.
const ANSWER: &str = "websocket answer from the mock";

type Socket = WebSocket<TcpStream>;

/// Opens a Responses WebSocket with `key`; the refused handshake's status and body.
fn open(sluice: &Sluice, key: Option<&str>) -> Result<Socket, (u16, String)> {
    let stream = TcpStream::connect(sluice.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("websocket test step");
    let mut req = format!("ws://{}/v1/responses", sluice.addr)
        .into_client_request()
        .expect("websocket test step");
    if let Some(k) = key {
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {k}").parse().expect("websocket test step"),
        );
    }
    match tungstenite::client::client(req, stream) {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => Err((
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("handshake: {e}"),
    }
}

fn send<S: Read + Write>(ws: &mut WebSocket<S>, v: &Value) {
    ws.send(Message::text(v.to_string())).expect("send");
}

/// The next event (text frames only; control frames are handled by tungstenite).
fn event<S: Read + Write>(ws: &mut WebSocket<S>) -> Value {
    loop {
        match ws.read().expect("read an event") {
            Message::Text(t) => return serde_json::from_str(&t).expect("JSON event"),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
}

/// Events up to and including the response's final one (or an `error`).
fn response<S: Read + Write>(ws: &mut WebSocket<S>) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let ev = event(ws);
        let end = matches!(
            ev["type"].as_str(),
            Some("response.completed" | "response.incomplete" | "response.failed" | "error")
        );
        out.push(ev);
        if end {
            return out;
        }
    }
}

fn create(input: &str) -> Value {
    json!({"type":"response.create","model":"acme/chat","store":false,
           "input":[{"role":"user","content":input}]})
}

/// The config of most cases: [`basic_config`] with `server` lines and `tenants.t` limits.
fn config(mock: &Mock, server: &str, tenant: &str) -> String {
    basic_config(&mock.base_url(), server).replace("  t: {}", &format!("  t: {{{tenant}}}"))
}

/// The SDK's run on one rig: three responses on a socket, then the first over HTTP.
fn sdk_run(rig: &Rig) -> Result<String, String> {
    let mut behavior = rig.base.clone();
    behavior["text"] = json!(ANSWER);
    rig.mock.set_behavior(&behavior.to_string());
    rig.mock.reset();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sdk/responses_websocket_client.py"
    );
    let base = format!("http://{}/v1", rig.sluice.addr);
    let (ok, out) = crate::sdk::run_python(&[script, &base, KEY, MODEL], Duration::from_secs(60));
    if !ok {
        return Err(format!("the client failed:\n{out}"));
    }
    let line = out.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {out}"))?;
    let turns = v["turns"].as_array().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    if turns.len() != 3 {
        problems.push(format!("{} turns", turns.len()));
    }
    for (i, t) in turns.iter().enumerate() {
        if t["text"] != ANSWER || t["status"] != "completed" {
            problems.push(format!("turn {i}: {t}"));
        }
        // The same events as the HTTP stream's, in the same order, with the same text.
        if t["types"] != v["http"]["types"] || t["deltas"] != v["http"]["deltas"] {
            problems.push(format!("turn {i} differs from HTTP: {t} vs {}", v["http"]));
        }
    }
    let calls = rig.model_calls();
    if calls.len() != 4 {
        problems.push(format!(
            "{} model calls (3 on the socket, 1 over HTTP)",
            calls.len()
        ));
    } else {
        // The third response's request carries the whole conversation, held by the socket
        // (`store: false`: nobody else has it).
        let third = calls[2]["body"].as_str().unwrap_or_default();
        for want in [
            "first-turn question",
            "second-turn question",
            "third-turn question",
        ] {
            if !third.contains(want) {
                problems.push(format!("the third call lacks `{want}`: {third}"));
            }
        }
        if third.matches(ANSWER).count() < 2 {
            problems.push(format!("the third call lacks the two answers: {third}"));
        }
        let first = calls[0]["body"].as_str().unwrap_or_default();
        if first.contains("second-turn") {
            problems.push(format!("the first call has later input: {first}"));
        }
    }
    if problems.is_empty() {
        Ok(format!("{} turns", turns.len()))
    } else {
        Err(problems.join("\n"))
    }
}

/// The official SDK's WebSocket mode on every provider kind.
#[test]
fn the_openai_sdk_runs_several_responses_on_one_socket_on_every_provider_kind() {
    type MakeRig = fn() -> Rig;
    let kinds: [(&str, MakeRig); 10] = [
        ("openai", battery::openai_rig),
        ("openai-responses", battery::openai_responses_rig),
        ("anthropic", battery::anthropic_rig),
        ("azure-openai", battery::azure_openai_rig),
        ("azure-responses", battery::azure_responses_rig),
        ("gemini", battery::gemini_rig),
        ("bedrock-claude", battery::bedrock_claude_rig),
        ("bedrock-converse", battery::bedrock_converse_rig),
        ("vertex-claude", battery::vertex_claude_rig),
        ("vertex-gemini", battery::vertex_gemini_rig),
    ];
    let mut failures = Vec::new();
    for (kind, make) in kinds {
        let rig = make();
        if let Err(e) = sdk_run(&rig) {
            failures.push(format!("=== {kind}:\n{e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Each response is one request of the HTTP path: one ledger row each (ids
/// `<socket id>.<n>`), and a refusal by the tenant's rate limit is an `error` event with
/// the HTTP status and `Retry-After`, after which the socket still serves.
#[test]
fn each_response_is_one_ledger_row_and_a_refusal_is_an_error_event() {
    let mock = Mock::start(&json!({"text": ANSWER}).to_string());
    let sluice = Sluice::start(&config(&mock, "", "requests_per_minute: 2"));
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    send(&mut ws, &create("one"));
    let first = response(&mut ws);
    assert_eq!(
        first.last().expect("websocket test step")["type"],
        "response.completed",
        "{first:?}"
    );
    // Sent at once after the answer: it waits for the previous subrequest if need be.
    send(&mut ws, &create("two"));
    let second = response(&mut ws);
    assert_eq!(
        second.last().expect("websocket test step")["type"],
        "response.completed",
        "{second:?}"
    );
    send(&mut ws, &create("three"));
    let refused = response(&mut ws);
    let e = &refused[0];
    assert_eq!(
        (e["type"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(429)),
        "{e}"
    );
    assert!(e["error"]["headers"]["retry-after"].is_string(), "{e}");
    // The socket stays open: an unknown message is answered, naming its type.
    send(&mut ws, &json!({"type": "session.update"}));
    let e = event(&mut ws);
    assert_eq!(e["error"]["code"], "unknown_message_type", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .expect("websocket test step")
        .contains("session.update"));
    ws.close(None).expect("websocket test step");
    let recs = ledger_rows(&sluice, 3);
    let mut statuses: Vec<(String, u64)> = recs
        .iter()
        .map(|r| {
            (
                r["request_id"].as_str().unwrap_or_default().to_string(),
                r["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    statuses.sort();
    assert_eq!(statuses.len(), 3, "{recs:#?}");
    let socket = statuses[0]
        .0
        .rsplit_once('.')
        .expect("websocket test step")
        .0
        .to_string();
    assert_eq!(
        statuses,
        [
            (format!("{socket}.1"), 200),
            (format!("{socket}.2"), 200),
            (format!("{socket}.3"), 429)
        ]
    );
    assert_eq!(mock.hits(), 2, "the refused response never went upstream");
}

/// The ledger's rows once it holds `n` (20 s at most: the ledger flushes every 200 ms, and
/// each look runs `sluice usage`, slow on a loaded machine).
fn ledger_rows(sluice: &Sluice, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let recs = crate::ledger::wait_records(sluice.dir.path(), &sluice.config_path, n);
        if recs.len() >= n || Instant::now() > end {
            return recs;
        }
    }
}

/// A refusal as the HTTP path answers it: `POST /v1/responses` with the body of a socket's
/// `response.create` (`create` without its `type`, as a stream), shaped as the `error` event
/// it is on a socket: the status, the JSON body's `error`, its `Retry-After` as
/// `error.headers`.
fn http_refusal(sluice: &Sluice, create: &Value) -> Value {
    let mut body = create.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("type");
        o.insert("stream".into(), true.into());
    }
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        &body.to_string(),
    );
    assert!(r.status >= 400, "not refused over HTTP: {}", r.text());
    let mut error = r.json()["error"].clone();
    if let Some(after) = r.header("retry-after") {
        error["headers"] = json!({ "retry-after": after });
    }
    json!({"type": "error", "status": r.status, "error": error})
}

/// Sends `create` on `ws`: its answer, asserted to be one `error` event with `status` and
/// to equal the HTTP path's answer to the same request ([`http_refusal`]).
fn refused_as_over_http(sluice: &Sluice, ws: &mut Socket, create: &Value, status: u64) -> Value {
    send(ws, create);
    let mut refused = response(ws);
    assert_eq!(refused.len(), 1, "only the error event: {refused:?}");
    let e = refused.remove(0);
    assert_eq!(
        (e["type"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(status)),
        "{e}"
    );
    assert_eq!(e, http_refusal(sluice, create), "the socket's vs HTTP's");
    e
}

/// Sends `create` on `ws` and reads its events up to its `response.completed`.
fn completes(ws: &mut Socket, create: &Value) {
    send(ws, create);
    let evs = response(ws);
    assert_eq!(
        evs.last().expect("events")["type"],
        "response.completed",
        "{evs:?}"
    );
}

/// The ledger rows with `status` once there are `n` rows in all, split into the socket's
/// (ids `<socket id>.<n>`) and the HTTP path's, each without what differs between two
/// requests by nature (id, time, durations).
fn refusal_rows(sluice: &Sluice, n: usize, status: u16) -> (Vec<Value>, Vec<Value>) {
    let recs = ledger_rows(sluice, n);
    assert_eq!(recs.len(), n, "{recs:#?}");
    let (mut socket, mut http) = (Vec::new(), Vec::new());
    for r in recs.iter().filter(|r| r["status"] == status) {
        let id = r["request_id"].as_str().unwrap_or_default();
        let on_socket = id
            .rsplit_once('.')
            .is_some_and(|(_, n)| n.parse::<u32>().is_ok());
        let mut row = r.clone();
        for k in ["request_id", "time", "ttft_ms", "duration_ms"] {
            row.as_object_mut().map(|o| o.remove(k));
        }
        if on_socket { &mut socket } else { &mut http }.push(row);
    }
    (socket, http)
}

/// A tenant whose budget is spent gets, for a `response.create`, the `error` event of the
/// HTTP path's 402 (`insufficient_quota` / `budget_exceeded`, the same message), recorded in
/// the ledger as the HTTP refusal is (`rejected`, 402, no charge, no provider); the socket
/// stays open and serves a create that fits what is left.
#[test]
fn a_spent_budget_is_the_http_paths_402_as_an_error_event() {
    // Input free, an output token 0.01 USD, the mock answers 5 tokens: a response with
    // `max_output_tokens: 5` reserves 0.06 USD and is charged 0.05.
    let mock = Mock::start(r#"{"tokens": 5}"#);
    let yaml = config(&mock, "", "budget: {daily_usd: 0.1}").replace(
        "  acme/chat:\n",
        "  acme/chat:\n    input_usd_per_mtok: 0\n    output_usd_per_mtok: 10000\n",
    );
    let sluice = Sluice::start(&yaml);
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    let mut five = create("spend");
    five["max_output_tokens"] = json!(5);
    completes(&mut ws, &five);
    // Settled: 0.05 spent + 0.06 reserved > 0.1.
    assert!(eventually(Duration::from_secs(5), || {
        sluice
            .metric_opt("sluice_budget_remaining_usd{tenant=\"t\",window=\"daily\"}")
            .is_some_and(|left| (left - 0.05).abs() < 1e-6)
    }));
    // Refused, over HTTP the same way.
    let e = refused_as_over_http(&sluice, &mut ws, &five, 402);
    assert_eq!(e["error"]["type"], "insufficient_quota", "{e}");
    assert_eq!(e["error"]["code"], "budget_exceeded", "{e}");
    assert_eq!(mock.hits(), 1, "no refusal went upstream");
    // The socket still serves: one token reserves 0.012 of the 0.05 left.
    mock.set_behavior(r#"{"tokens": 1}"#);
    let mut one = create("fits");
    one["max_output_tokens"] = json!(1);
    completes(&mut ws, &one);
    ws.close(None).expect("close");
    assert_eq!(mock.hits(), 2);
    assert_eq!(
        sluice.metric("sluice_rejected_total{reason=\"budget_exceeded\"}"),
        2.0
    );
    // Both refusals in the ledger alike: `rejected`, 402, nothing charged, no provider.
    let (socket, http) = refusal_rows(&sluice, 4, 402);
    assert_eq!((socket.len(), http.len()), (1, 1), "{socket:?} {http:?}");
    assert_eq!(socket[0], http[0], "the socket's row vs the HTTP path's");
    let row = &socket[0];
    assert_eq!(
        (row["outcome"].as_str(), row["charge_usd"].as_f64()),
        (Some("rejected"), Some(0.0)),
        "{row}"
    );
    assert!(row["provider"].is_null(), "{row}");
}

/// A tenant at its `max_concurrent_streams` gets, for a `response.create` on a second
/// socket, the `error` event of the HTTP path's 429 (`tenant_concurrency`, `Retry-After`),
/// recorded as the HTTP refusal is: the tenant-wide slot is taken before the body is read,
/// so neither names a model and both are in the access log only (as the ledger's module
/// doc says of requests that name no model), with the same fields; the first socket's
/// response goes on, and the second socket serves once it has ended.
#[test]
fn a_tenant_at_its_concurrency_limit_is_refused_on_another_socket_as_over_http() {
    let slow =
        json!({"text": "one two three four five six seven eight nine ten", "token_delay_ms": 300});
    let mock = Mock::start(&slow.to_string());
    let sluice = Sluice::start(&config(&mock, "", "max_concurrent_streams: 1"));
    let mut holder = open(&sluice, Some(KEY)).expect("upgrade");
    send(&mut holder, &create("holds the slot"));
    while event(&mut holder)["type"] != "response.output_text.delta" {}
    let mut other = open(&sluice, Some(KEY)).expect("a second socket");
    // Refused, over HTTP the same way while the slot is still held.
    let e = refused_as_over_http(&sluice, &mut other, &create("second"), 429);
    assert_eq!(e["error"]["code"], "tenant_concurrency", "{e}");
    assert_eq!(e["error"]["headers"]["retry-after"], "1", "{e}");
    let rest = response(&mut holder);
    assert_eq!(
        rest.last().expect("events")["type"],
        "response.completed",
        "the held response went on: {rest:?}"
    );
    mock.set_behavior(&json!({"text": ANSWER}).to_string());
    // The slot is released as the held response's subrequest ends, which writes its ledger
    // row.
    assert_eq!(ledger_rows(&sluice, 1).len(), 1);
    completes(&mut other, &create("after the first ended"));
    holder.close(None).expect("close");
    other.close(None).expect("close");
    assert_eq!(
        sluice.metric("sluice_rejected_total{reason=\"tenant_concurrency\"}"),
        2.0
    );
    let recs = ledger_rows(&sluice, 2);
    assert_eq!(recs.len(), 2, "{recs:#?}");
    assert!(recs.iter().all(|r| r["status"] == 200), "{recs:#?}");
    // The two refusals' access lines: the same but for the request id (the socket's is
    // `<socket id>.<n>`) and the duration.
    let log = sluice.log();
    let refusals: Vec<String> = log
        .lines()
        .filter(|l| l.contains("sluice::access") && l.contains(" outcome=tenant_concurrency "))
        .map(|l| {
            l.split_once(" request_id=")
                .map_or("", |(_, rest)| rest)
                .split(' ')
                .skip(1)
                .filter(|f| !f.starts_with("client=") && !f.starts_with("duration_ms="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(refusals.len(), 2, "{log}");
    assert_eq!(refusals[0], refusals[1], "socket vs HTTP");
    assert!(refusals[0].contains(" status=429 "), "{}", refusals[0]);
}

/// The mock's log record of the `n`th model call (0-based), once it has one.
fn call(mock: &Mock, n: usize) -> Value {
    let mut rec = Value::Null;
    assert!(
        eventually(Duration::from_secs(5), || {
            let calls: Vec<Value> = mock
                .log()
                .into_iter()
                .filter(|r| {
                    r["path"]
                        .as_str()
                        .is_some_and(|p| p.contains("/chat/completions"))
                })
                .collect();
            rec = calls.get(n).cloned().unwrap_or(Value::Null);
            !rec.is_null()
        }),
        "no call {n}"
    );
    rec
}

/// Whether the mock saw the `n`th model call's connection closed before it finished.
fn closed_early(mock: &Mock, n: usize) -> bool {
    eventually(Duration::from_secs(5), || {
        call(mock, n)["peer_closed_at_ms"].is_u64()
    })
}

/// `response.cancel` (Sluice's extension) cancels the response in flight at once, answers
/// `response_cancelled`, and the socket serves the next response; a second create while one
/// is in flight is refused without disturbing it; closing the socket mid-response cancels
/// the upstream request too.
#[test]
fn cancel_and_close_cancel_the_upstream_at_once() {
    let slow =
        json!({"text": "one two three four five six seven eight nine ten", "token_delay_ms": 400});
    let mock = Mock::start(&slow.to_string());
    let sluice = Sluice::start(&config(&mock, "", ""));
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    send(&mut ws, &create("slow one"));
    while event(&mut ws)["type"] != "response.output_text.delta" {}
    // A second response while one streams: refused, the first goes on.
    send(&mut ws, &create("too soon"));
    let mut refused = false;
    let mut cancelled = false;
    let clock = crate::cancellation::MockClock::read(&mock);
    let cancel_sent = Instant::now();
    send(&mut ws, &json!({"type": "response.cancel"}));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(refused && cancelled) && Instant::now() < deadline {
        let e = event(&mut ws);
        match e["error"]["code"].as_str() {
            Some("conversation_already_has_active_response") => refused = true,
            Some("response_cancelled") => cancelled = true,
            _ => assert_ne!(e["type"], "response.completed", "not cancelled: {e}"),
        }
    }
    assert!(refused && cancelled);
    assert!(
        closed_early(&mock, 0),
        "the upstream of the cancelled response was closed"
    );
    // At once: within the bound the HTTP path's cancellation is held to.
    let closed_at = call(&mock, 0)["peer_closed_at_ms"].as_u64().unwrap_or(0);
    let delay = clock.delay_upper_ms(cancel_sent, closed_at);
    eprintln!("response.cancel -> upstream closed: at most {delay} ms");
    assert!(delay <= crate::cancellation::CLOSE_BOUND_MS, "{delay} ms");
    // The socket still serves.
    mock.set_behavior(&json!({"text": ANSWER}).to_string());
    send(&mut ws, &create("after the cancel"));
    let evs = response(&mut ws);
    assert_eq!(
        evs.last().expect("websocket test step")["type"],
        "response.completed",
        "{evs:?}"
    );
    // Closing the socket mid-response cancels it.
    mock.set_behavior(&slow.to_string());
    send(&mut ws, &create("slow two"));
    while event(&mut ws)["type"] != "response.output_text.delta" {}
    let clock = crate::cancellation::MockClock::read(&mock);
    let dropped = Instant::now();
    drop(ws);
    assert!(
        closed_early(&mock, 2),
        "the upstream of the abandoned response was closed"
    );
    let closed_at = call(&mock, 2)["peer_closed_at_ms"].as_u64().unwrap_or(0);
    let delay = clock.delay_upper_ms(dropped, closed_at);
    eprintln!("socket closed -> upstream closed: at most {delay} ms");
    assert!(delay <= crate::cancellation::CLOSE_BOUND_MS, "{delay} ms");
    assert_eq!(
        crate::cancellation::chat_records(&mock.log()).len(),
        3,
        "nothing was sent upstream again"
    );
    // One ledger row per response: the two cancelled ones are client aborts.
    let recs = ledger_rows(&sluice, 3);
    let mut outcomes: Vec<(String, String)> = recs
        .iter()
        .map(|r| {
            let id = r["request_id"].as_str().unwrap_or_default();
            let n = id.rsplit_once('.').map_or("", |(_, n)| n).to_string();
            (n, r["outcome"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    outcomes.sort();
    let want = [("1", "client_abort"), ("2", "ok"), ("3", "client_abort")]
        .map(|(n, o)| (n.to_string(), o.to_string()));
    assert_eq!(outcomes, want, "{recs:#?}");
    assert!(eventually(Duration::from_secs(5), || {
        sluice.metric("sluice_websocket_sessions") == 0.0
    }));
}

/// Heartbeats: a client ping gets its pong; the server pings every
/// `server.heartbeat_interval_ms`; a peer that answers nothing is closed (1011).
#[test]
fn pings_go_both_ways_and_a_silent_peer_is_closed() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock, "  heartbeat_interval_ms: 300\n", ""));
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    ws.send(Message::Ping("are you there".into()))
        .expect("websocket test step");
    let (mut pong, mut ping) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(pong && ping) && Instant::now() < deadline {
        match ws.read().expect("read") {
            Message::Pong(p) => pong = p.as_ref() == b"are you there",
            // tungstenite answers it (on its next read or write).
            Message::Ping(_) => ping = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(pong && ping, "pong {pong}, ping {ping}");
    // Answered pings keep the socket open past several intervals.
    let until = Instant::now() + Duration::from_millis(1200);
    ws.get_mut()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("websocket test step");
    while Instant::now() < until {
        match ws.read() {
            Ok(Message::Ping(_)) | Err(tungstenite::Error::Io(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
        let _ = ws.flush();
    }
    // A peer that reads and answers nothing: a raw handshake, then silence.
    let mut raw = TcpStream::connect(sluice.addr).expect("websocket test step");
    write!(
        raw,
        "GET /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .expect("websocket test step");
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("websocket test step");
    let t = Instant::now();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "closed within a few intervals"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    // The last frame is a close with 1011 (0x03F3).
    let close = got
        .windows(4)
        .rposition(|w| w[0] == 0x88 && w[2] == 0x03 && w[3] == 0xF3);
    assert!(close.is_some(), "{got:?}");
}

/// Refusals before the upgrade: 401 in OpenAI's shape for a bad or missing key, 426 with the
/// mode off (the SDKs then use HTTP); after it, an oversized message closes with 1009.
#[test]
fn bad_keys_a_disabled_mode_and_oversized_messages() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock, "  max_request_body_bytes: 65536\n", ""));
    for key in [Some("sk-not-a-key-0000"), None] {
        let (status, body) = open(&sluice, key).map(|_| ()).expect_err("refused");
        assert_eq!(status, 401, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON error");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    }
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    let big = create(&"x".repeat(70_000));
    ws.send(Message::text(big.to_string()))
        .expect("websocket test step");
    let close = loop {
        match ws.read() {
            Ok(Message::Close(c)) => break c,
            Ok(_) => {}
            Err(e) => panic!("no close frame: {e}"),
        }
    };
    assert_eq!(close.map(|c| c.code), Some(CloseCode::Size));
    assert_eq!(mock.hits(), 0);

    let off = Sluice::start(&config(&mock, "  responses_websocket: false\n", ""));
    let (status, body) = open(&off, Some(KEY)).map(|_| ()).expect_err("refused");
    assert_eq!(status, 426, "{body}");
    assert!(body.contains("POST /v1/responses"), "{body}");
}

/// On SIGTERM an idle socket is closed with 1001 (going away) at its next heartbeat, and
/// Sluice exits without waiting out the shutdown grace period for it.
#[test]
fn shutdown_closes_idle_sockets_with_1001() {
    let mock = Mock::start(&json!({"text": ANSWER}).to_string());
    let mut sluice = Sluice::start(&config(
        &mock,
        "  heartbeat_interval_ms: 300\n  shutdown_grace_ms: 20000\n",
        "",
    ));
    let mut ws = open(&sluice, Some(KEY)).expect("upgrade");
    send(&mut ws, &create("before the shutdown"));
    let evs = response(&mut ws);
    assert_eq!(evs.last().expect("events")["type"], "response.completed");
    let term = Instant::now();
    sluice.signal("TERM");
    let close = loop {
        match ws.read() {
            Ok(Message::Close(c)) => break c,
            Ok(_) => {}
            Err(e) => panic!("no close frame: {e}"),
        }
    };
    assert_eq!(close.map(|c| c.code), Some(CloseCode::Away));
    assert!(
        term.elapsed() < Duration::from_secs(3),
        "{:?}",
        term.elapsed()
    );
    drop(ws);
    let status = sluice
        .wait_exit(Duration::from_secs(10))
        .expect("sluice exits once the socket is closed");
    assert!(status.success(), "{status}");
    assert!(
        term.elapsed() < Duration::from_secs(10),
        "{:?}",
        term.elapsed()
    );
}

/// Past `server.responses_websocket_max_sessions` an upgrade gets 503 with `Retry-After`
/// (before the `101`, in OpenAI's shape); a closed session frees its place.
#[test]
fn sessions_past_the_cap_get_503_with_retry_after() {
    let mock = Mock::start(&json!({"text": ANSWER}).to_string());
    let sluice = Sluice::start(&config(
        &mock,
        "  responses_websocket_max_sessions: 2\n",
        "",
    ));
    let mut first = open(&sluice, Some(KEY)).expect("upgrade");
    let second = open(&sluice, Some(KEY)).expect("upgrade");
    let auth = format!("Bearer {KEY}");
    let upgrade = [
        ("authorization", auth.as_str()),
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let refused =
        crate::harness::client::request(sluice.addr, "GET", "/v1/responses", &upgrade, b"");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        refused.header("retry-after"),
        Some("1"),
        "{:?}",
        refused.headers
    );
    let v = refused.json();
    assert_eq!(v["error"]["code"], "websocket_sessions", "{v}");
    assert!(
        sluice.metric("sluice_rejected_total{reason=\"websocket_sessions\"}") >= 1.0,
        "{}",
        sluice.metrics()
    );
    // The open ones still serve.
    send(&mut first, &create("hello"));
    let events = response(&mut first);
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(json!("response.completed")),
        "{events:#?}"
    );
    drop(second);
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .gauge("sluice_websocket_sessions")
            == 1.0),
        "{}",
        sluice.metrics()
    );
    open(&sluice, Some(KEY)).expect("a freed place is taken");
}

/// `wss://` on the TLS listener: a client whose TLS handshake chose `http/1.1` gets the same
/// mode as over `ws://`.
#[test]
fn wss_on_the_tls_listener_serves_the_same_mode() {
    let mock = Mock::start(&json!({"text": ANSWER}).to_string());
    let pki = crate::harness::tls::Pki::new();
    pki.issue("a", &["a.test"]);
    let server = format!(
        "  tls_listen: {{tls_listen}}\n  tls:\n    certificates:\n      - {{cert_path: {}, key_path: {}, server_names: [a.test]}}\n",
        pki.path("a", "pem").display(),
        pki.path("a", "key").display(),
    );
    let sluice = Sluice::start(&config(&mock, &server, ""));
    let tls = pki.client(&[b"http/1.1"], &[&tokio_rustls::rustls::version::TLS13]);
    let name = "a.test".try_into().expect("server name");
    let conn = tokio_rustls::rustls::ClientConnection::new(tls, name).expect("tls client");
    let tcp = TcpStream::connect(sluice.tls_addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("websocket test step");
    let stream = tokio_rustls::rustls::StreamOwned::new(conn, tcp);
    let mut req = "wss://a.test/v1/responses"
        .into_client_request()
        .expect("websocket test step");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {KEY}")
            .parse()
            .expect("websocket test step"),
    );
    let (mut ws, head) = tungstenite::client::client(req, stream).expect("upgrade over TLS");
    assert_eq!(head.status(), 101);
    for input in ["first over TLS", "second over TLS"] {
        send(&mut ws, &create(input));
        let events = response(&mut ws);
        let last = events.last().expect("events");
        assert_eq!(last["type"], "response.completed", "{events:#?}");
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(text, ANSWER, "{events:#?}");
    }
    ws.close(None).expect("close");
}
