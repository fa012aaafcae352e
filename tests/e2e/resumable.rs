//! Resumable streams (issue 32) through real sockets: a client opts in (header
//! `x-sluice-resumable: true`, or its model's `resumable: true`), reads a paced stream up to
//! a random event, drops its TCP connection and resumes with `GET /v1/streams/<id>` and
//! `Last-Event-ID`. For every client dialect on a same-dialect and a translated route, the
//! stream put together from the cut connection and the resumption reassembles to exactly
//! the uninterrupted stream's text and usage; every event carries `id: <stream id>:<seq>`
//! (1, 2, … without a gap across the cut); the ledger has one row for the generation, with
//! `resumptions = 1`; the provider saw one request. Then what surrounds it: an expired grace
//! window (410 in the dialect, the upstream cancelled, ledger `client_abort`), a wrong key
//! and another tenant (404, the same body), an overflowed replay buffer (the stream ended,
//! 410), `DELETE` (204, the upstream cancelled at once), a stream read to its end (nothing
//! held), another replica (421 naming the owner), and a stream that did not opt in (no
//! `id:` line, no `x-sluice-stream-id`).
//!
//! The cut is random: the seed is printed, and `SLUICE_RESUME_SEED=<n>` replays a run.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cancellation::{
    assert_upstream_closed_promptly, chat_records, wait_chat, MockClock, CLOSE_BOUND_MS,
};
use crate::dialect_matrix::{reassemble, Client, Seen};
use crate::harness::client::{request, Response, StreamReader};
use crate::harness::{eventually, parse_metric, Mock, Sluice, KEY};

/// A second key of tenant `t`: the same tenant, another virtual key.
const KEY_SAME_TENANT: &str = "sk-sluice-test-0002";
/// A key of tenant `u`.
const KEY_OTHER_TENANT: &str = "sk-sluice-test-0003";
/// The gauge of resumable streams Sluice holds, by state (`attached`, `detached`: in its
/// grace window).
const HELD: &str = "sluice_resumable_streams";
/// The answer the mock streams, one event per word (multi-byte characters included, so a
/// cut never lands on a character boundary by luck).
const TEXT: &str = "Résumé of the plan: streams survive the network — ünïcode ✓ 🚀, \
    then every word of the answer arrives in order, one by one, until the very last word \
    of this fairly long sentence.";
/// The input tokens the mock reports.
const PROMPT_TOKENS: u64 = 17;
/// The last word of [`TEXT`]: the first event that carries it is the answer's last delta,
/// which the provider sends together with the events that end the stream.
const LAST_WORD: &str = "sentence.";
/// The mock's delay before each word of the paced answer, ms.
const PACE_MS: u64 = 25;
/// Per-read bound while reading a stream.
const READ: Duration = Duration::from_secs(10);

/// The config: ledger flushed every 50 ms, tenants `t` (two keys) and `u`, an OpenAI
/// provider (Chat and Responses APIs) and an Anthropic one, and `acme/claude-resumable`, the
/// model that opts in by itself. `server` is inserted under `server:`.
fn config(mock: &Mock, server: &str) -> String {
    let base = mock.base_url();
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{server}\
         ledger:\n  flush_interval_ms: 50\n\
         tenants:\n  t: {{}}\n  u: {{}}\n\
         virtual_keys:\n  - key: {KEY}\n    tenant: t\n  - key: {KEY_SAME_TENANT}\n    tenant: t\n  - key: {KEY_OTHER_TENANT}\n    tenant: u\n\
         providers:\n  oa:\n    kind: openai\n    base_url: {base}\n    api_key: sk-provider-secret-oa\n    health_check: {{enabled: false}}\n\
         \x20 claude:\n    kind: anthropic\n    base_url: {base}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\n\
         models:\n\
         \x20 acme/gpt:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n\
         \x20 acme/gpt-resp:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n        api: responses\n\
         \x20 acme/claude:\n    default_max_tokens: 4096\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n\
         \x20 acme/claude-resumable:\n    resumable: true\n    default_max_tokens: 4096\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n"
    )
}

/// A paced answer: `TEXT`, one word every `delay_ms`.
fn paced(delay_ms: u64) -> String {
    json!({"text": TEXT, "token_delay_ms": delay_ms, "prompt_tokens": PROMPT_TOKENS}).to_string()
}

/// A long paced answer: `tokens` words, one every `delay_ms`.
fn long(tokens: u64, delay_ms: u64) -> String {
    json!({"tokens": tokens, "token_delay_ms": delay_ms, "prompt_tokens": PROMPT_TOKENS})
        .to_string()
}

/// A streaming request body of `client` for `model`.
fn body(client: Client, model: &str) -> String {
    match client {
        Client::Chat => json!({"model": model, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "tell me the plan"}]}),
        Client::Messages => json!({"model": model, "max_tokens": 2048, "stream": true,
            "messages": [{"role": "user", "content": "tell me the plan"}]}),
        Client::Responses => json!({"model": model, "stream": true,
            "input": "tell me the plan"}),
    }
    .to_string()
}

/// The client's key headers (its own SDK's way) with `key` instead of the test key.
fn key_headers(client: Client, key: &str) -> Vec<(&'static str, String)> {
    client
        .headers()
        .into_iter()
        .map(|(k, v)| (k, v.replace(KEY, key)))
        .collect()
}

/// Opens a streaming request of `client` for `model`; `extra` headers on top of the key.
fn open(
    sluice: &Sluice,
    client: Client,
    model: &str,
    extra: &[(&'static str, &str)],
) -> StreamReader {
    let mut owned = client.headers();
    owned.extend(extra.iter().map(|(k, v)| (*k, (*v).to_string())));
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = StreamReader::open(sluice.addr, client.path(), &headers, &body(client, model));
    assert_eq!(r.status, 200, "{client:?} {model}: {:?}", r.headers);
    r
}

/// Opens a streaming request opted in by header with `request_id`; the reader and its
/// stream id.
fn open_resumable(
    sluice: &Sluice,
    client: Client,
    model: &str,
    request_id: &str,
) -> (StreamReader, String) {
    let r = open(
        sluice,
        client,
        model,
        &[("x-sluice-resumable", "true"), ("x-request-id", request_id)],
    );
    let stream_id = r
        .header("x-sluice-stream-id")
        .expect("stream id")
        .to_string();
    (r, stream_id)
}

/// The letter of the dialect in a stream id (`sc_`, `sm_`, `sr_`).
fn letter(client: Client) -> char {
    match client {
        Client::Chat => 'c',
        Client::Messages => 'm',
        Client::Responses => 'r',
    }
}

/// The events (blocks ended by a blank line) of SSE text, comments (`: …`) left out; the
/// text after the last complete block is not an event yet.
fn events_of(text: &str) -> Vec<String> {
    let complete = text.rfind("\n\n").map_or("", |i| &text[..i]);
    complete
        .split("\n\n")
        .filter(|e| !e.is_empty() && !e.lines().all(|l| l.starts_with(':')))
        .map(str::to_string)
        .collect()
}

/// The `id:` of an event, if it has one.
fn event_id(event: &str) -> Option<&str> {
    event
        .lines()
        .find_map(|l| l.strip_prefix("id:"))
        .map(str::trim_start)
}

/// Whether `event` is Anthropic's keepalive (`event: ping`), which repeats the last id.
fn is_ping(event: &str) -> bool {
    event.lines().any(|l| l == "event: ping")
}

/// The events of `events` other than keepalives (what counts for the answer).
fn counted(events: &[String]) -> usize {
    events.iter().filter(|e| !is_ping(e)).count()
}

/// The sequence number of an event id `<stream_id>:<seq>`.
fn seq_of(id: &str) -> u64 {
    id.rsplit_once(':')
        .and_then(|(_, s)| s.parse().ok())
        .unwrap_or_else(|| panic!("not an event id: {id}"))
}

/// Asserts each of `events` carries `id: <stream_id>:<seq>` with seq `first`, `first + 1`, …;
/// a keepalive (`event: ping`) repeats the id before it.
fn assert_ids(events: &[String], stream_id: &str, first: u64) {
    let mut next = first;
    for e in events {
        let want = if is_ping(e) {
            format!("{stream_id}:{}", next - 1)
        } else {
            next += 1;
            format!("{stream_id}:{}", next - 1)
        };
        assert_eq!(event_id(e), Some(want.as_str()), "event {e:?}");
    }
}

/// `events` as an SSE body without their `id:` lines (what the dialect readers take).
fn without_ids(events: &[String]) -> Vec<u8> {
    let mut out = String::new();
    for e in events {
        for l in e.lines().filter(|l| !l.starts_with("id:")) {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// Reads `r` until it holds `k` complete events; returns the first `k` (the bytes after them
/// are what a client that got `k` events had not yet got).
fn read_events(r: &mut StreamReader, k: usize) -> Vec<String> {
    let mut text = String::new();
    loop {
        let events = events_of(&text);
        if events.len() >= k {
            return events[..k].to_vec();
        }
        let piece = r
            .next_piece(READ)
            .unwrap_or_else(|| panic!("the stream ended after {} events: {text}", events.len()));
        text.push_str(&String::from_utf8_lossy(&piece));
    }
}

/// `GET /v1/streams/<id>` as `client` with `key`, naming `last` (`Last-Event-ID`) when given.
fn resume(
    sluice: &Sluice,
    client: Client,
    key: &str,
    stream_id: &str,
    last: Option<&str>,
) -> StreamReader {
    let mut owned = key_headers(client, key);
    if let Some(l) = last {
        owned.push(("last-event-id", l.to_string()));
    }
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    StreamReader::open_raw(
        sluice.addr,
        "GET",
        &format!("/v1/streams/{stream_id}"),
        &headers,
        b"",
    )
}

/// A whole answer of a refused resume (or `DELETE`).
fn whole(mut r: StreamReader) -> Response {
    let body = r.read_to_end(READ);
    Response {
        status: r.status,
        headers: r.headers.clone(),
        body,
    }
}

/// `DELETE /v1/streams/<id>` as `client` with `key`.
fn delete(sluice: &Sluice, client: Client, key: &str, stream_id: &str) -> Response {
    let owned = key_headers(client, key);
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    request(
        sluice.addr,
        "DELETE",
        &format!("/v1/streams/{stream_id}"),
        &headers,
        b"",
    )
}

/// Asserts `r` is an error in `client`'s dialect (Anthropic's shape for Messages, OpenAI's
/// for Chat and Responses, with `code` when one is given) with `status`; its message,
/// lowercase.
fn assert_dialect_error(client: Client, r: &Response, status: u16, code: Option<&str>) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    if client == Client::Messages {
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
    } else {
        assert!(v.get("type").is_none(), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        if let Some(c) = code {
            assert_eq!(v["error"]["code"], c, "{v}");
        }
    }
    v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message: {v}"))
        .to_lowercase()
}

/// The seed of this run's random cuts: `SLUICE_RESUME_SEED`, else the clock (printed).
fn seeded() -> fastrand::Rng {
    let seed = std::env::var("SLUICE_RESUME_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("resumable: random cuts with SLUICE_RESUME_SEED={seed}");
    fastrand::Rng::with_seed(seed)
}

/// The ledger's records so far (`sluice usage --format json`).
fn ledger(sluice: &Sluice) -> Vec<Value> {
    crate::ledger::records(sluice.dir.path(), &sluice.config_path, &[])
}

/// Waits until the ledger has a row with `request_id`; every row with that id.
fn ledger_rows(sluice: &Sluice, request_id: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    let found = eventually(Duration::from_secs(10), || {
        rows = ledger(sluice)
            .into_iter()
            .filter(|r| r["request_id"] == request_id)
            .collect();
        !rows.is_empty()
    });
    assert!(found, "no ledger row {request_id}: {:#?}", ledger(sluice));
    rows
}

/// The resumable streams Sluice holds, attached or detached (an absent series counts as 0:
/// nothing was ever held in that state).
fn held(sluice: &Sluice) -> f64 {
    let text = sluice.metrics();
    ["attached", "detached"]
        .iter()
        .map(|s| parse_metric(&text, &format!("{HELD}{{state=\"{s}\"}}")).unwrap_or(0.0))
        .sum()
}

/// Asserts that within 5 s Sluice holds no generation for a resume (attached or detached).
fn assert_nothing_held(sluice: &Sluice) {
    assert!(
        eventually(Duration::from_secs(5), || held(sluice) == 0.0),
        "{}",
        sluice.metrics()
    );
}

/// One cell of the matrix: a client dialect on a model.
struct Cell {
    client: Client,
    model: &'static str,
    /// The model opts in by itself (`resumable: true`): no header, and the reference opts
    /// out with `x-sluice-resumable: false`.
    by_model: bool,
    /// Resume only once the provider finished the answer (the whole rest from the buffer).
    after_the_end: bool,
}

/// The reference: the same request, not opted in, read whole. Checks that a stream that did
/// not opt in has no `id:` line and no `x-sluice-stream-id`; returns what the client
/// reassembles, its number of events (keepalives left out), and the index of its last delta
/// among all its events (the final burst starts there).
fn reference(sluice: &Sluice, cell: &Cell, request_id: &str) -> (Seen, usize, usize) {
    let mut extra = vec![("x-request-id", request_id)];
    if cell.by_model {
        extra.push(("x-sluice-resumable", "false"));
    }
    let mut r = open(sluice, cell.client, cell.model, &extra);
    assert_eq!(r.header("x-sluice-stream-id"), None, "{:?}", r.headers);
    let body = r.read_to_end(READ);
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(
        !text.lines().any(|l| l.starts_with("id:")),
        "a stream that did not opt in carries no id: {text}"
    );
    let events = events_of(&text);
    let last_delta = events
        .iter()
        .position(|e| e.contains(LAST_WORD))
        .unwrap_or_else(|| panic!("no event carries {LAST_WORD:?}: {text}"));
    (reassemble(cell.client, &body), counted(&events), last_delta)
}

/// Asserts what two streams reassembled is the same answer: text, stop reason and usage.
fn assert_same_answer(cell: &str, got: &Seen, want: &Seen) {
    assert_eq!(got.text, want.text, "{cell}: text");
    assert_eq!(got.text, TEXT, "{cell}: the mock's text");
    assert_eq!(got.stop, want.stop, "{cell}: stop reason");
    assert_eq!(
        (got.input_tokens, got.output_tokens, got.cached_tokens),
        (want.input_tokens, want.output_tokens, want.cached_tokens),
        "{cell}: usage"
    );
    assert_eq!(
        got.input_tokens, PROMPT_TOKENS,
        "{cell}: the mock's input tokens"
    );
    assert!(got.output_tokens > 0, "{cell}: output tokens");
    assert_eq!(got.error, None, "{cell}");
}

/// Runs one cell: the reference, then the opted-in stream cut at a random event and
/// resumed. Returns the request id of the resumed generation.
fn run_cell(sluice: &Sluice, mock: &Mock, cell: &Cell, rng: &mut fastrand::Rng) -> (String, bool) {
    let name = format!("{:?} on {}", cell.client, cell.model);
    let tag = format!("{:?}-{}", cell.client, cell.model.replace('/', "-")).to_lowercase();
    mock.set_behavior(&paced(PACE_MS));
    let (want, n, last_delta) = reference(sluice, cell, &format!("ref-{tag}"));
    assert!(last_delta > 2, "{name}: {n} events");

    mock.reset();
    let request_id = format!("resumed-{tag}");
    let mut extra = vec![("x-request-id", request_id.as_str())];
    if !cell.by_model {
        extra.push(("x-sluice-resumable", "true"));
    }
    let mut r = open(sluice, cell.client, cell.model, &extra);
    let stream_id = r
        .header("x-sluice-stream-id")
        .unwrap_or_else(|| panic!("{name}: no x-sluice-stream-id: {:?}", r.headers))
        .to_string();
    assert!(
        stream_id.starts_with(&format!("s{}_alpha_", letter(cell.client))),
        "{name}: {stream_id}"
    );
    // Up to a random event, then the connection drops (keepalives count as events here: a
    // cut may land right after one). Any event but the last: the cut may land inside the
    // final burst (the provider sends its last delta and the events that end the stream
    // together, so Sluice writes the final event at once with them, and the client's drop
    // comes after that write). Then the generation is over and its row written; the resume
    // replays the completed stream's kept tail (`server.resume_linger_bytes`).
    let k = rng.usize(1..n);
    eprintln!("{name}: cut after event {k} of {n} (last delta: event {last_delta})");
    let replays_before = sluice.metric("sluice_stream_resumes_total{outcome=\"replayed\"}");
    let before = read_events(&mut r, k);
    r.close();
    assert_ids(&before, &stream_id, 1);
    let last = event_id(&before[k - 1]).expect("id").to_string();
    eprintln!("{name}: resuming after {last}");
    if cell.after_the_end {
        // The provider finishes while nobody listens: the rest comes from the buffer.
        wait_chat(mock, 0, Duration::from_secs(10), |rec| {
            rec["completed"] == true
        });
    }

    let mut again = resume(sluice, cell.client, KEY, &stream_id, Some(&last));
    if again.status != 200 {
        panic!("{name}: resume answered {}", whole(again).text());
    }
    assert!(
        again
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{name}: {:?}",
        again.headers
    );
    let rest_body = again.read_to_end(READ);
    let rest = events_of(&String::from_utf8_lossy(&rest_body));
    assert_ids(&rest, &stream_id, seq_of(&last) + 1);
    assert_eq!(
        counted(&before) + counted(&rest),
        n,
        "{name}: the events before the cut and after it make the whole stream"
    );
    let mut all = before;
    all.extend(rest);
    let got = reassemble(cell.client, &without_ids(&all));
    assert_same_answer(&name, &got, &want);

    // One generation upstream, run to its end.
    let chats = chat_records(&mock.log());
    assert_eq!(chats.len(), 1, "{name}: {chats:#?}");
    assert_eq!(chats[0]["completed"], true, "{name}: {:#?}", chats[0]);
    let replayed =
        sluice.metric("sluice_stream_resumes_total{outcome=\"replayed\"}") > replays_before;
    eprintln!(
        "{name}: resumed {}",
        if replayed {
            "the completed stream's tail"
        } else {
            "the live stream"
        }
    );
    (request_id, replayed)
}

#[test]
fn every_dialect_resumes_a_dropped_stream_exactly_on_same_dialect_and_translated_routes() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let mut rng = seeded();
    let cells = [
        Cell {
            client: Client::Chat,
            model: "acme/gpt",
            by_model: false,
            after_the_end: false,
        },
        Cell {
            client: Client::Chat,
            model: "acme/claude",
            by_model: false,
            after_the_end: false,
        },
        Cell {
            client: Client::Messages,
            model: "acme/claude-resumable",
            by_model: true,
            after_the_end: true,
        },
        Cell {
            client: Client::Messages,
            model: "acme/gpt",
            by_model: false,
            after_the_end: false,
        },
        Cell {
            client: Client::Responses,
            model: "acme/gpt-resp",
            by_model: false,
            after_the_end: false,
        },
        Cell {
            client: Client::Responses,
            model: "acme/claude",
            by_model: false,
            after_the_end: false,
        },
        Cell {
            client: Client::Responses,
            model: "acme/gpt",
            by_model: false,
            after_the_end: true,
        },
    ];
    let mut resumed = Vec::new();
    for cell in &cells {
        resumed.push(run_cell(&sluice, &mock, cell, &mut rng));
    }
    // One row per generation, with its one resumption (none when the resume replayed the
    // tail of a stream completed before it: the row was written at the final write); the
    // references' rows say 0, and the resumes (GETs) leave none of their own.
    for (id, replayed) in &resumed {
        let rows = ledger_rows(&sluice, id);
        assert_eq!(rows.len(), 1, "{id}: {rows:#?}");
        let want = if *replayed { 0 } else { 1 };
        assert_eq!(rows[0]["resumptions"], want, "{id}: {:#?}", rows[0]);
        assert_eq!(rows[0]["outcome"], "ok", "{id}: {:#?}", rows[0]);
        assert_eq!(
            rows[0]["input_tokens"], PROMPT_TOKENS,
            "{id}: {:#?}",
            rows[0]
        );
    }
    let all = ledger(&sluice);
    assert_eq!(all.len(), 2 * cells.len(), "{all:#?}");
    for r in all.iter().filter(|r| {
        r["request_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("ref-"))
    }) {
        assert_eq!(r["resumptions"], 0, "{r:#?}");
    }
    // `--summary` sums them per tenant × model, as the rows say.
    let summary = crate::ledger::records(sluice.dir.path(), &sluice.config_path, &["--summary"]);
    let mut total = 0;
    for s in &summary {
        let want: u64 = all
            .iter()
            .filter(|r| r["tenant"] == s["tenant"] && r["model"] == s["model"])
            .map(|r| r["resumptions"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(s["resumptions"], want, "{s:#?}");
        total += want;
    }
    // A replay of a completed stream's tail is not in its row (written before it).
    let live = resumed.iter().filter(|(_, replayed)| !replayed).count();
    assert_eq!(total, live as u64, "{summary:#?}");
    let access = sluice.log();
    for (id, replayed) in &resumed {
        let line = access
            .lines()
            .find(|l| l.contains("sluice::access") && l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no access line for {id}:\n{access}"));
        let want = if *replayed { 0 } else { 1 };
        assert!(line.ends_with(&format!("resumptions={want}")), "{line}");
    }
    assert_nothing_held(&sluice);
}

#[test]
fn after_the_grace_window_the_upstream_is_cancelled_and_a_resume_gets_410() {
    let mock = Mock::start(&long(400, 20));
    let grace_ms = 800;
    let sluice = Sluice::start(&config(
        &mock,
        &format!("  replica_id: alpha\n  resume_grace_ms: {grace_ms}\n"),
    ));
    let client = Client::Messages;
    let (mut r, stream_id) = open_resumable(&sluice, client, "acme/claude", "expires");
    let before = read_events(&mut r, 3);
    let clock = MockClock::read(&mock);
    r.close();
    let dropped = Instant::now();
    // The generation goes on without its client (the provider keeps writing) ...
    let written = |l: &[Value]| chat_records(l)[0]["bytes_written"].as_u64().unwrap_or(0);
    let at_drop = written(&mock.log());
    let log = mock.wait_log(Duration::from_secs(5), |l| written(l) > at_drop + 200);
    assert!(written(&log) > at_drop + 200, "{log:#?}");
    // ... until the window ends: then it is cancelled, within the usual bound after it.
    let rec = wait_chat(&mock, 0, Duration::from_secs(10), |rec| {
        rec["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["completed"], false, "{rec:#?}");
    let delay = clock.delay_upper_ms(dropped, rec["peer_closed_at_ms"].as_u64().unwrap_or(0));
    eprintln!("upstream cancelled {delay} ms (upper bound) after the client dropped");
    assert!(
        delay <= i64::from(grace_ms) + 1000,
        "cancelled {delay} ms after the drop, grace {grace_ms} ms"
    );
    let last = event_id(&before[2]).expect("id").to_string();
    let gone = whole(resume(&sluice, client, KEY, &stream_id, Some(&last)));
    let message = assert_dialect_error(client, &gone, 410, Some("stream_expired"));
    assert!(message.contains("expired"), "{message}");
    let rows = ledger_rows(&sluice, "expires");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(
        (&rows[0]["outcome"], &rows[0]["resumptions"]),
        (&json!("client_abort"), &json!(0)),
        "{:#?}",
        rows[0]
    );
    assert_nothing_held(&sluice);
}

#[test]
fn a_wrong_key_or_tenant_gets_404_and_the_owner_still_resumes() {
    let mock = Mock::start(&long(60, 20));
    let sluice = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let client = Client::Chat;
    let (mut r, stream_id) = open_resumable(&sluice, client, "acme/gpt", "owned");
    let before = read_events(&mut r, 2);
    r.close();
    let last = event_id(&before[1]).expect("id").to_string();

    let same_tenant = whole(resume(
        &sluice,
        client,
        KEY_SAME_TENANT,
        &stream_id,
        Some(&last),
    ));
    let other_tenant = whole(resume(
        &sluice,
        client,
        KEY_OTHER_TENANT,
        &stream_id,
        Some(&last),
    ));
    assert_dialect_error(client, &same_tenant, 404, None);
    assert_dialect_error(client, &other_tenant, 404, None);
    assert_eq!(
        same_tenant.body, other_tenant.body,
        "the same answer for both"
    );
    let unknown = format!("sc_alpha_{}", "0".repeat(32));
    assert_dialect_error(
        client,
        &whole(resume(&sluice, client, KEY, &unknown, None)),
        404,
        None,
    );
    // Neither can cancel it either.
    assert_eq!(
        delete(&sluice, client, KEY_OTHER_TENANT, &stream_id).status,
        404
    );
    let no_key = request(
        sluice.addr,
        "GET",
        &format!("/v1/streams/{stream_id}"),
        &[],
        b"",
    );
    assert_eq!(no_key.status, 401, "{}", no_key.text());

    // The owner gets the rest, and the generation is still the one and only.
    let mut again = resume(&sluice, client, KEY, &stream_id, Some(&last));
    assert_eq!(again.status, 200);
    let rest = events_of(&String::from_utf8_lossy(&again.read_to_end(READ)));
    assert_ids(&rest, &stream_id, seq_of(&last) + 1);
    let mut all = before;
    all.extend(rest);
    let seen = reassemble(client, &without_ids(&all));
    let want: String = (0..60).map(|i| format!("tok{i} ")).collect();
    assert_eq!(seen.text, want);
    assert_eq!(chat_records(&mock.log()).len(), 1);
    let rows = ledger_rows(&sluice, "owned");
    assert_eq!(
        (rows.len(), &rows[0]["resumptions"]),
        (1, &json!(1)),
        "{rows:#?}"
    );
}

#[test]
fn an_overflowed_replay_buffer_ends_the_detached_stream_and_a_resume_gets_410() {
    // Each Chat chunk is about 200 bytes: the 8 KiB bound is passed some 40 events in.
    let mock = Mock::start(&long(5000, 2));
    let sluice = Sluice::start(&config(
        &mock,
        "  replica_id: alpha\n  resume_buffer_bytes: 8192\n  resume_grace_ms: 60000\n",
    ));
    let client = Client::Chat;
    let mut r = open(
        &sluice,
        client,
        "acme/gpt",
        &[
            ("x-sluice-resumable", "true"),
            ("x-request-id", "overflows"),
        ],
    );
    let stream_id = r
        .header("x-sluice-stream-id")
        .expect("stream id")
        .to_string();
    let before = read_events(&mut r, 1);
    r.close();
    // Long before the grace window ends, the buffer is full: the stream ends as any stream
    // whose client left, upstream cancelled.
    let rec = wait_chat(&mock, 0, Duration::from_secs(10), |rec| {
        rec["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["completed"], false, "{rec:#?}");
    let last = event_id(&before[0]).expect("id").to_string();
    let gone = whole(resume(&sluice, client, KEY, &stream_id, Some(&last)));
    let message = assert_dialect_error(client, &gone, 410, Some("stream_overflowed"));
    assert!(message.contains("buffer"), "{message}");
    let rows = ledger_rows(&sluice, "overflows");
    assert_eq!(
        (rows.len(), &rows[0]["resumptions"]),
        (1, &json!(0)),
        "{rows:#?}"
    );
    assert_nothing_held(&sluice);
}

#[test]
fn delete_cancels_the_upstream_at_once_and_a_finished_reader_leaves_nothing_behind() {
    let mock = Mock::start(&long(400, 20));
    let sluice = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let client = Client::Responses;
    let (mut r, stream_id) = open_resumable(&sluice, client, "acme/gpt", "deleted");
    read_events(&mut r, 2);
    r.close();
    // The generation is held in its grace window.
    assert!(
        eventually(Duration::from_secs(5), || held(&sluice) == 1.0),
        "{}",
        sluice.metrics()
    );
    let clock = MockClock::read(&mock);
    let sent = Instant::now();
    let d = delete(&sluice, client, KEY, &stream_id);
    assert_eq!(d.status, 204, "{}", d.text());
    assert!(d.body.is_empty());
    assert_upstream_closed_promptly(&mock, 0, &clock, sent, "mid_stream");
    eprintln!("(bound {CLOSE_BOUND_MS} ms)");
    let after = whole(resume(&sluice, client, KEY, &stream_id, None));
    assert!(matches!(after.status, 404 | 410), "{}", after.text());
    // DELETE is idempotent: again, 204.
    assert_eq!(delete(&sluice, client, KEY, &stream_id).status, 204);
    assert_nothing_held(&sluice);
    let rows = ledger_rows(&sluice, "deleted");
    assert_eq!(
        (rows.len(), &rows[0]["resumptions"]),
        (1, &json!(0)),
        "{rows:#?}"
    );

    // A client that read to the final event and closed: no generation is held for it (only
    // the completed stream's tail, for the grace window), and a resume naming the final
    // event is told the stream completed.
    mock.set_behavior(&paced(1));
    let mut r = open(
        &sluice,
        client,
        "acme/gpt",
        &[
            ("x-sluice-resumable", "true"),
            ("x-request-id", "read-to-end"),
        ],
    );
    let stream_id = r
        .header("x-sluice-stream-id")
        .expect("stream id")
        .to_string();
    let body = r.read_to_end(READ);
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(text.contains("response.completed"), "{text}");
    r.close();
    // `bytes_out` is what the client got, the event ids included.
    ledger_rows(&sluice, "read-to-end");
    let access = sluice.log();
    let line = access
        .lines()
        .find(|l| l.contains("sluice::access") && l.contains("request_id=read-to-end "))
        .unwrap_or_else(|| panic!("no access line:\n{access}"));
    assert!(
        line.contains(&format!(" bytes_out={} ", body.len())),
        "{} bytes read: {line}",
        body.len()
    );
    assert_nothing_held(&sluice);
    let events = events_of(&text);
    let final_id = event_id(events.last().expect("events")).expect("id");
    let after = whole(resume(&sluice, client, KEY, &stream_id, Some(final_id)));
    assert_dialect_error(client, &after, 410, Some("stream_completed"));
}

#[test]
fn a_resume_on_another_replica_gets_421_naming_the_owner() {
    let mock = Mock::start(&long(60, 20));
    let a = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let b = Sluice::start(&config(&mock, "  replica_id: beta\n"));
    let client = Client::Responses;
    let mut r = open(&a, client, "acme/claude", &[("x-sluice-resumable", "true")]);
    let stream_id = r
        .header("x-sluice-stream-id")
        .expect("stream id")
        .to_string();
    assert!(stream_id.starts_with("sr_alpha_"), "{stream_id}");
    let before = read_events(&mut r, 2);
    r.close();
    let last = event_id(&before[1]).expect("id").to_string();
    let elsewhere = whole(resume(&b, client, KEY, &stream_id, Some(&last)));
    let message = assert_dialect_error(client, &elsewhere, 421, None);
    assert!(message.contains("alpha"), "{message}");
    // Its owner still has it.
    let mut again = resume(&a, client, KEY, &stream_id, Some(&last));
    assert_eq!(again.status, 200);
    let rest = events_of(&String::from_utf8_lossy(&again.read_to_end(READ)));
    assert_ids(&rest, &stream_id, seq_of(&last) + 1);
    let mut all = before;
    all.extend(rest);
    let seen = reassemble(client, &without_ids(&all));
    assert_eq!(
        seen.text,
        (0..60).map(|i| format!("tok{i} ")).collect::<String>()
    );
}

#[test]
fn a_client_cut_inside_the_final_burst_replays_the_kept_tail_until_the_window_passes() {
    // The whole answer at once: Sluice writes every event, the final one included, while
    // the client has read one. The generation is over (its row written) before the client
    // notices its connection is gone.
    let mock = Mock::start(&paced(0));
    // Long enough for a loaded machine to read the ledger row and resume within it.
    let grace_ms = 5000;
    let sluice = Sluice::start(&config(
        &mock,
        &format!("  replica_id: alpha\n  resume_grace_ms: {grace_ms}\n"),
    ));
    let cells = [
        (Client::Chat, "acme/gpt"),
        (Client::Messages, "acme/claude"),
        (Client::Responses, "acme/gpt-resp"),
        (Client::Responses, "acme/claude"),
    ];
    let mut kept = Vec::new();
    for (i, (client, model)) in cells.into_iter().enumerate() {
        let name = format!("{client:?} on {model}");
        let cell = Cell {
            client,
            model,
            by_model: false,
            after_the_end: false,
        };
        let (want, n, _) = reference(&sluice, &cell, &format!("burst-ref-{i}"));
        let request_id = format!("burst-{i}");
        let mut r = open(
            &sluice,
            client,
            model,
            &[
                ("x-sluice-resumable", "true"),
                ("x-request-id", &request_id),
            ],
        );
        let stream_id = r
            .header("x-sluice-stream-id")
            .expect("stream id")
            .to_string();
        let before = read_events(&mut r, 1);
        let rows = ledger_rows(&sluice, &request_id);
        assert_eq!(
            (&rows[0]["outcome"], &rows[0]["resumptions"]),
            (&json!("ok"), &json!(0)),
            "{name}: the generation completed while its client held the connection: {:#?}",
            rows[0]
        );
        r.close();
        let first = event_id(&before[0]).expect("id").to_string();
        let mut again = resume(&sluice, client, KEY, &stream_id, Some(&first));
        if again.status != 200 {
            panic!("{name}: resume answered {}", whole(again).text());
        }
        let rest = events_of(&String::from_utf8_lossy(&again.read_to_end(READ)));
        assert_ids(&rest, &stream_id, 2);
        assert_eq!(counted(&before) + counted(&rest), n, "{name}");
        let mut all = before;
        all.extend(rest);
        assert_same_answer(&name, &reassemble(client, &without_ids(&all)), &want);
        // Naming the final event: nothing after it.
        let final_id = event_id(all.last().expect("events"))
            .expect("id")
            .to_string();
        let done = whole(resume(&sluice, client, KEY, &stream_id, Some(&final_id)));
        assert_dialect_error(client, &done, 410, Some("stream_completed"));
        // Another key of the tenant still sees nothing.
        let other = whole(resume(
            &sluice,
            client,
            KEY_SAME_TENANT,
            &stream_id,
            Some(&first),
        ));
        assert_dialect_error(client, &other, 404, None);
        kept.push((client, stream_id, first));
    }
    // `DELETE` frees a kept tail at once.
    let (client, stream_id, first) = kept.pop().expect("cells");
    let before = sluice.gauge(&format!("{HELD}{{state=\"completed\"}}"));
    assert_eq!(delete(&sluice, client, KEY, &stream_id).status, 204);
    assert_eq!(
        sluice.gauge(&format!("{HELD}{{state=\"completed\"}}")),
        before - 1.0
    );
    let gone = whole(resume(&sluice, client, KEY, &stream_id, Some(&first)));
    assert_dialect_error(client, &gone, 410, Some("stream_cancelled"));
    assert_eq!(
        sluice.metric("sluice_stream_resumes_total{outcome=\"replayed\"}"),
        cells.len() as f64
    );
    assert_eq!(held(&sluice), 0.0, "no generation is held");
    // The window passes: the tails are dropped, their memory returned, and a resume is told
    // the stream completed.
    assert!(
        eventually(Duration::from_millis(grace_ms + 3000), || {
            sluice.gauge(&format!("{HELD}{{state=\"completed\"}}")) == 0.0
                && sluice.gauge("sluice_resumable_buffer_bytes") == 0.0
        }),
        "{}",
        sluice.metrics()
    );
    for (client, stream_id, first) in &kept {
        let late = whole(resume(&sluice, *client, KEY, stream_id, Some(first)));
        assert_dialect_error(*client, &late, 410, Some("stream_completed"));
    }
}

#[test]
fn without_a_kept_tail_a_completed_stream_is_freed_at_the_final_write() {
    // With `resume_linger_bytes: 0` nothing is kept past the final write.
    let mock = Mock::start(&paced(0));
    let off = Sluice::start(&config(
        &mock,
        "  replica_id: alpha\n  resume_linger_bytes: 0\n",
    ));
    let (mut r, stream_id) = open_resumable(&off, Client::Chat, "acme/gpt", "no-tail");
    let before = read_events(&mut r, 1);
    ledger_rows(&off, "no-tail");
    r.close();
    let first = event_id(&before[0]).expect("id");
    let late = whole(resume(&off, Client::Chat, KEY, &stream_id, Some(first)));
    assert_dialect_error(Client::Chat, &late, 410, Some("stream_completed"));
    assert_eq!(off.gauge("sluice_resumable_buffer_bytes"), 0.0);
}

#[test]
fn at_shutdown_a_stream_no_client_reads_is_cancelled_at_once() {
    // A long generation whose client dropped: no resume can reach this process once it shuts
    // down, so its generation ends then, not at the end of the grace period.
    let mock = Mock::start(&long(400, 20));
    let mut sluice = Sluice::start(&config(
        &mock,
        "  replica_id: alpha\n  shutdown_grace_ms: 20000\n",
    ));
    let mut r = open(
        &sluice,
        Client::Chat,
        "acme/gpt",
        &[
            ("x-sluice-resumable", "true"),
            ("x-request-id", "at-shutdown"),
        ],
    );
    read_events(&mut r, 2);
    r.close();
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .gauge(&format!("{HELD}{{state=\"detached\"}}"))
            == 1.0),
        "{}",
        sluice.metrics()
    );
    let term = Instant::now();
    sluice.signal("TERM");
    let rec = wait_chat(&mock, 0, Duration::from_secs(10), |rec| {
        rec["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(rec["completed"], false, "{rec:#?}");
    let status = sluice
        .wait_exit(Duration::from_secs(10))
        .expect("sluice exits once the detached stream ended");
    assert!(status.success(), "{status}");
    eprintln!("exited {:?} after SIGTERM", term.elapsed());
    assert!(
        term.elapsed() < Duration::from_secs(5),
        "{:?}",
        term.elapsed()
    );
    let rows = ledger_rows(&sluice, "at-shutdown");
    assert_eq!(rows[0]["outcome"], "client_abort", "{:#?}", rows[0]);
}

#[test]
fn the_same_post_again_with_last_event_id_resumes_instead_of_generating_again() {
    // `@microsoft/fetch-event-source` and its kin reconnect a POST stream by sending the same
    // request again with `Last-Event-ID`: that is the resume, never a second generation.
    let mock = Mock::start(&long(60, 20));
    let sluice = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let client = Client::Chat;
    let (mut r, stream_id) = open_resumable(&sluice, client, "acme/gpt", "posted");
    let before = read_events(&mut r, 3);
    r.close();
    let last = event_id(&before[2]).expect("id").to_string();
    let mut again = open(
        &sluice,
        client,
        "acme/gpt",
        &[("x-sluice-resumable", "true"), ("last-event-id", &last)],
    );
    assert_eq!(again.header("x-sluice-stream-id"), Some(stream_id.as_str()));
    let rest = events_of(&String::from_utf8_lossy(&again.read_to_end(READ)));
    assert_ids(&rest, &stream_id, 4);
    assert!(
        rest.last().is_some_and(|e| e.ends_with("data: [DONE]")),
        "{rest:?}"
    );
    let mut all = before;
    all.extend(rest);
    let got = reassemble(client, &without_ids(&all));
    assert!(
        got.text.starts_with("tok0 ") && got.error.is_none(),
        "{got:?}"
    );
    let chats = chat_records(&mock.log());
    assert_eq!(chats.len(), 1, "one generation: {chats:#?}");
    let rows = ledger_rows(&sluice, "posted");
    assert_eq!(rows[0]["resumptions"], 1, "{:#?}", rows[0]);

    // The stream of another API named on this endpoint: 400, nothing generated.
    let (mut m, messages_id) = open_resumable(&sluice, Client::Messages, "acme/claude", "m");
    let first = read_events(&mut m, 1);
    m.close();
    let named = event_id(&first[0]).expect("id").to_string();
    let wrong = whole(open_raw_post(&sluice, client, &named));
    assert_dialect_error(client, &wrong, 400, None);
    assert_eq!(
        delete(&sluice, Client::Messages, KEY, &messages_id).status,
        204
    );
    // A `Last-Event-ID` that is not one of Sluice's ids is an ordinary request.
    let plain = whole(open_raw_post(&sluice, client, "42"));
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(
        chat_records(&mock.log()).len(),
        3,
        "the Messages stream and this one"
    );
}

/// The streaming request of `client` on `acme/gpt` with `Last-Event-ID: last`, whatever
/// its status.
fn open_raw_post(sluice: &Sluice, client: Client, last: &str) -> StreamReader {
    let mut owned = client.headers();
    owned.push(("last-event-id", last.to_string()));
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    StreamReader::open(
        sluice.addr,
        client.path(),
        &headers,
        &body(client, "acme/gpt"),
    )
}

#[test]
fn fetch_event_source_reconnects_through_a_cut_network_and_gets_the_whole_answer_once() {
    // The real library (tests/agents, pinned), through a relay that cuts its first
    // connection after 3 events: it reconnects by itself (the same POST with `last-event-id`).
    let mock = Mock::start(&long(60, 20));
    let sluice = Sluice::start(&config(&mock, "  replica_id: alpha\n"));
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/agents/fetch_event_source.mjs");
    let out = std::process::Command::new("node")
        .arg(&script)
        .args([&sluice.addr.to_string(), KEY, "acme/gpt", "3"])
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(run["connections"], 2, "one cut, one reconnect: {run}");
    assert_eq!(run["errors"], 1, "{run}");
    let ids: Vec<&str> = run["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let stream_id = ids[0].rsplit_once(':').expect("an event id").0;
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            *id,
            format!("{stream_id}:{}", i + 1),
            "no gap, no repeat: {ids:?}"
        );
    }
    let data: Vec<&str> = run["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{data:?}");
    let text: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let want: String = (0..60).map(|i| format!("tok{i} ")).collect();
    assert_eq!(text, want);
    // One generation, one row, one resumption.
    assert_eq!(chat_records(&mock.log()).len(), 1, "{:#?}", mock.log());
    let rows = {
        let mut rows = Vec::new();
        assert!(eventually(Duration::from_secs(5), || {
            rows = ledger(&sluice);
            !rows.is_empty()
        }));
        rows
    };
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["resumptions"], 1, "{:#?}", rows[0]);
}
