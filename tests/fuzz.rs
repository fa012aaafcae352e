//! Fuzz targets for the parsers that face the network, on the stable toolchain: `proptest`
//! over arbitrary bytes, near-valid structured inputs (valid SSE / JSON / HTTP / YAML, then
//! mutated so the deep code is reached) and arbitrary splits of the same bytes.
//!
//! Targets (one `#[test]` each):
//! - `sse_normalizer`: [`SseNormalizer`] (upstream SSE bytes in, events out).
//! - `chat_request_body`: [`parse_chat`], the pure parser of the downstream request body
//!   (reading the body from the Pingora session is Pingora's and is not fuzzed here).
//! - `chunked_request_reader`: the mock upstream's HTTP/1.1 request reader
//!   ([`decode_request`]): the only chunked-body decoder Sluice owns (Sluice's downstream
//!   and upstream chunked decoding is Pingora's).
//! - `config_loader`: [`Config::parse`] on YAML text without a file.
//!
//! Each asserts no panic, bounded output and the target's invariants (split-invariance,
//! agreement with a small reference model, error shape).
//!
//! Budget: with `SLUICE_FUZZ_SECS=N` each target runs rounds of cases (fresh random seed
//! each round) for about N seconds (CI uses 60); without it, one quick round of
//! `PROPTEST_CASES` cases (default 256). A failure prints the shrunk input: add it to the
//! `regression_*` tests at the end.
//!
//! Adding a target: write `fn check_x(input) -> Result<(), TestCaseError>` and a strategy,
//! then a `#[test]` calling [`fuzz`].

use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestCaseError, TestError, TestRunner};

use sluice::config::Config;
use sluice::ingress::request::parse_chat;
use sluice::sse::SseNormalizer;
use sluice_mock_upstream::{decode_request, DecodedRequest};

// ---------------------------------------------------------------- the harness

/// Runs `check` on values of `strategy`: rounds of cases until the `SLUICE_FUZZ_SECS`
/// budget is spent, or one round without a budget. Panics with the shrunk failing input.
fn fuzz<S, F>(name: &str, strategy: S, check: F)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
    F: Fn(S::Value) -> Result<(), TestCaseError>,
{
    let budget = std::env::var("SLUICE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(256);
    let start = Instant::now();
    let mut total = 0u64;
    loop {
        let mut runner = TestRunner::new(PtConfig {
            cases,
            failure_persistence: None,
            ..PtConfig::default()
        });
        match runner.run(&strategy, &check) {
            Ok(()) => {}
            Err(TestError::Fail(why, input)) => {
                panic!("fuzz target {name} failed: {why}\nminimal input: {input:#?}")
            }
            Err(TestError::Abort(why)) => panic!("fuzz target {name} aborted: {why}"),
        }
        total += u64::from(cases);
        match budget {
            Some(b) if start.elapsed() < b => continue,
            _ => break,
        }
    }
    eprintln!(
        "fuzz target {name}: {total} cases in {:.1?}",
        start.elapsed()
    );
}

/// Cuts `input` at `cuts` (any values: taken modulo the length, sorted, deduplicated).
fn split<'a>(input: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut c: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    c.sort_unstable();
    c.dedup();
    let mut out = Vec::with_capacity(c.len() + 1);
    let mut last = 0;
    for p in c {
        out.push(&input[last..p]);
        last = p;
    }
    out.push(&input[last..]);
    out
}

/// Mutations applied to a structured input: a few byte flips, inserts, deletions,
/// duplicated or dropped spans. Keeps most of the structure so parsers get deep.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Flip(p, b)),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 1..8),
                prop::sample::select(vec![
                    b"\r".to_vec(),
                    b"\n".to_vec(),
                    b"\r\n".to_vec(),
                    b":".to_vec(),
                    b"\"".to_vec(),
                    b"{".to_vec(),
                    b"]".to_vec(),
                    b"\xc3".to_vec(),
                    b"\xf0\x9f".to_vec(),
                    b"0\r\n\r\n".to_vec(),
                    b"ffffffffffffffff\r\n".to_vec(),
                    b"&a ".to_vec(),
                    b"*a".to_vec(),
                ]),
            ]
        )
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
        (any::<usize>(), 1..16usize).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), 1..64usize).prop_map(|(p, n)| Mutation::Duplicate(p, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut v: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let len = v.len();
        let at = |p: usize| if len == 0 { 0 } else { p % (len + 1) };
        match m {
            Mutation::Flip(p, b) if len > 0 => v[p % len] ^= b | 1,
            Mutation::Flip(..) => {}
            Mutation::Insert(p, b) => {
                let p = at(*p);
                v.splice(p..p, b.iter().copied());
            }
            Mutation::Delete(p, n) => {
                let p = at(*p);
                let e = (p + n).min(len);
                v.drain(p..e);
            }
            Mutation::Duplicate(p, n) => {
                let p = at(*p);
                let e = (p + n).min(len);
                let span = v[p..e].to_vec();
                v.splice(e..e, span);
            }
            Mutation::Truncate(p) => v.truncate(at(*p)),
        }
    }
    v
}

/// Structured input, optionally mutated: `(bytes, mutated?)`.
fn near_valid(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = (Vec<u8>, bool)> {
    (valid, proptest::collection::vec(mutation(), 0..4))
        .prop_map(|(v, m)| (mutate(v, &m), !m.is_empty()))
}

// ---------------------------------------------------------------- SSE normalizer

/// One structured SSE line (without its terminator).
fn sse_line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ,.éü世🎉\"{}:\\[\\]]{0,40}".prop_map(|s| format!("data: {s}")),
        "[a-zA-Z0-9 \"{}:]{0,40}".prop_map(|s| format!("data:{s}")),
        "[a-zA-Z0-9 ]{0,10}".prop_map(|s| format!("data:  {s}")),
        Just("data".to_string()),
        Just("data:".to_string()),
        Just("data: [DONE]".to_string()),
        "[a-z_]{0,16}".prop_map(|s| format!("event: {s}")),
        "[a-z_]{0,16}".prop_map(|s| format!("event:{s}")),
        "[ -~]{0,20}".prop_map(|s| format!(":{s}")),
        "[0-9]{1,4}".prop_map(|s| format!("id: {s}")),
        "[0-9]{1,4}".prop_map(|s| format!("retry: {s}")),
        "[ -~]{0,30}",
        Just(String::new()),
        Just(String::new()),
    ]
}

/// A structured SSE body: lines with any of the three line ends, maybe no final end.
fn sse_body() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(
            (
                sse_line(),
                prop::sample::select(vec!["\n", "\r\n", "\r", "\n\n", "\r\n\r\n"]),
            ),
            0..24,
        ),
        any::<bool>(),
    )
        .prop_map(|(lines, cut_last)| {
            let mut s = String::new();
            let n = lines.len();
            for (i, (l, end)) in lines.into_iter().enumerate() {
                s.push_str(&l);
                if !(cut_last && i + 1 == n) {
                    s.push_str(end);
                }
            }
            s.into_bytes()
        })
}

/// What the reference model says about an input (see [`sse_model`]).
#[derive(Debug, Default, PartialEq)]
struct SseModel {
    /// Events ended by a blank line, normalized, each ending in `\n\n`.
    complete: Vec<Vec<u8>>,
    /// The trailing unterminated event, normalized as `finish` may flush it (its last line
    /// ended, then the blank line); `None` when the input ends between events.
    partial: Option<Vec<u8>>,
    /// Bytes the trailing event holds before `finish`: its ended lines (normalized) plus
    /// the raw unended line. The push-time limit applies to this.
    pending_len: usize,
}

/// Reference model of the normalization (whole input at once), for valid UTF-8 input:
/// lines end at `\r\n`, `\n` or `\r`; blank lines end events (empty events dropped);
/// `data:x` becomes `data: x`.
///
/// What `finish` does with a trailing unterminated event is left open (flushed as an event
/// today; a truncated stream may be refused instead): the checks accept either.
fn sse_model(input: &[u8]) -> SseModel {
    let mut m = SseModel::default();
    let mut cur: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let norm = |line: &[u8], cur: &mut Vec<u8>| {
        if let Some(after) = line.strip_prefix(b"data:") {
            cur.extend_from_slice(b"data:");
            if !after.is_empty() && after[0] != b' ' {
                cur.push(b' ');
            }
            cur.extend_from_slice(after);
        } else {
            cur.extend_from_slice(line);
        }
        cur.push(b'\n');
    };
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'\r' | b'\n' => {
                if line.is_empty() {
                    if !cur.is_empty() {
                        cur.push(b'\n');
                        m.complete.push(std::mem::take(&mut cur));
                    }
                } else {
                    norm(&line, &mut cur);
                    line.clear();
                }
                if input[i] == b'\r' && input.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
            }
            x => line.push(x),
        }
        i += 1;
    }
    m.pending_len = cur.len() + line.len();
    if !line.is_empty() {
        norm(&line, &mut cur);
    }
    if !cur.is_empty() {
        cur.push(b'\n');
        m.partial = Some(cur);
    }
    m
}

/// One run of the normalizer over `pieces`, draining after each push.
#[derive(Debug, PartialEq)]
struct SseRun {
    /// Events drained after the pushes.
    pushed: Vec<Vec<u8>>,
    /// A push failed (the limit); nothing more was fed.
    push_failed: bool,
    /// Events drained after `finish` (when no push failed).
    finished: Vec<Vec<u8>>,
    /// `finish` failed.
    finish_failed: bool,
}

/// Feeds `pieces` draining after each push, then finishes. Asserts the buffer bound after
/// every drain and the event bound on every event.
fn sse_run(pieces: &[&[u8]], max: usize) -> Result<SseRun, TestCaseError> {
    let mut n = SseNormalizer::new(max);
    let mut run = SseRun {
        pushed: Vec::new(),
        push_failed: false,
        finished: Vec::new(),
        finish_failed: false,
    };
    for p in pieces {
        let r = n.push(p);
        while let Some(ev) = n.next_event() {
            prop_assert!(ev.raw().len() <= max, "event over the limit");
            run.pushed.push(ev.raw().to_vec());
        }
        prop_assert!(
            n.buffered_bytes() <= max,
            "{} bytes buffered with a limit of {max}",
            n.buffered_bytes()
        );
        if r.is_err() {
            run.push_failed = true;
            return Ok(run);
        }
    }
    run.finish_failed = n.finish().is_err();
    while let Some(ev) = n.next_event() {
        prop_assert!(ev.raw().len() <= max, "event over the limit");
        run.finished.push(ev.raw().to_vec());
    }
    Ok(run)
}

fn check_sse(input: &[u8], cuts: &[usize], max: usize) -> Result<(), TestCaseError> {
    let whole = sse_run(&[input], max)?;
    let chunked = sse_run(&split(input, cuts), max)?;
    let bytewise: Vec<&[u8]> = input.chunks(1).collect();
    let single = sse_run(&bytewise, max)?;
    for ev in [&whole, &chunked, &single]
        .iter()
        .flat_map(|r| r.pushed.iter().chain(&r.finished))
    {
        prop_assert!(ev.ends_with(b"\n\n"), "{ev:?}");
        prop_assert!(!ev.starts_with(b"\n"), "{ev:?}");
        prop_assert!(
            !ev[..ev.len() - 1].windows(2).any(|w| w == b"\n\n"),
            "{ev:?}"
        );
        prop_assert!(!ev.contains(&b'\r'), "{ev:?}");
    }
    // Split-invariance: the limit applies to each event, so all runs fail or none does;
    // what came out before a failure is a prefix of the whole-input events.
    prop_assert_eq!(whole.push_failed, chunked.push_failed);
    prop_assert_eq!(whole.push_failed, single.push_failed);
    if whole.push_failed {
        for run in [&chunked, &single] {
            let k = run.pushed.len().min(whole.pushed.len());
            prop_assert_eq!(&run.pushed[..k], &whole.pushed[..k]);
        }
    } else {
        prop_assert_eq!(&chunked, &whole);
        prop_assert_eq!(&single, &whole);
    }
    if std::str::from_utf8(input).is_ok() {
        let model = sse_model(input);
        let over = model.complete.iter().any(|e| e.len() > max) || model.pending_len > max;
        prop_assert_eq!(whole.push_failed, over, "limit {} model {:?}", max, model);
        if over {
            prop_assert!(whole.pushed.len() <= model.complete.len());
            prop_assert_eq!(&whole.pushed[..], &model.complete[..whole.pushed.len()]);
        } else {
            prop_assert_eq!(&whole.pushed, &model.complete);
            match &model.partial {
                // Nothing pending: finish adds nothing and succeeds.
                None => {
                    prop_assert!(whole.finished.is_empty() && !whole.finish_failed);
                }
                // A trailing unterminated event: flushed whole, or refused; never changed.
                Some(p) => {
                    let flushed = whole.finished.len() == 1 && &whole.finished[0] == p;
                    let refused = whole.finished.is_empty();
                    prop_assert!(
                        flushed || refused,
                        "finish gave {:?} for the partial {:?}",
                        whole.finished,
                        p
                    );
                    if whole.finish_failed {
                        prop_assert!(refused);
                    }
                }
            }
        }
        for ev in whole.pushed.iter().chain(&whole.finished) {
            prop_assert!(std::str::from_utf8(ev).is_ok());
        }
    }
    Ok(())
}

fn sse_input() -> impl Strategy<Value = (Vec<u8>, Vec<usize>, usize)> {
    (
        prop_oneof![
            3 => near_valid(sse_body()).prop_map(|(b, _)| b),
            1 => proptest::collection::vec(
                prop_oneof![
                    Just(b'\r'), Just(b'\n'), Just(b':'), Just(b' '), Just(b'd'),
                    Just(b'a'), Just(b't'), any::<u8>()
                ],
                0..300
            ),
        ],
        proptest::collection::vec(any::<usize>(), 0..24),
        prop_oneof![16..400usize, Just(1 << 20)],
    )
}

#[test]
fn sse_normalizer() {
    fuzz("sse_normalizer", sse_input(), |(input, cuts, max)| {
        check_sse(&input, &cuts, max)
    });
}

// ---------------------------------------------------------------- chat request body

const CHAT_CONFIG: &str = "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\ntenants:\n  t: {}\nvirtual_keys:\n  - key: sk-sluice-fuzz-0001\n    tenant: t\nproviders:\n  p1:\n    kind: openai\n    base_url: http://127.0.0.1:3/v1\n    api_key: sk-p1\n    health_check: {enabled: false}\n  p2:\n    kind: openai\n    base_url: http://127.0.0.1:4/v1\n    api_key: sk-p2\n    health_check: {enabled: false}\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: m1\n      - provider: p2\n        upstream_model: m2\n";

fn json_leaf() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[ -~éü世🎉]{0,12}".prop_map(Value::String),
        prop::sample::select(vec!["acme/chat", "", " ", "p1", "p2", "nope", "user"])
            .prop_map(|s| Value::String(s.to_string())),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    json_leaf().prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop::sample::select(vec![
                    "only",
                    "ignore",
                    "order",
                    "allow_fallbacks",
                    "role",
                    "content",
                    "include_usage",
                    "type",
                    "x",
                ])
                .prop_map(str::to_string),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A near-valid chat request: the known top-level keys with plausible or arbitrary values.
fn chat_json() -> impl Strategy<Value = Vec<u8>> {
    use serde_json::{json, Value};
    let field = prop_oneof![
        json_value().prop_map(|v| ("model".to_string(), v)),
        Just(("model".to_string(), json!("acme/chat"))),
        json_value().prop_map(|v| ("stream".to_string(), v)),
        any::<bool>().prop_map(|b| ("stream".to_string(), json!(b))),
        json_value().prop_map(|v| ("messages".to_string(), v)),
        Just((
            "messages".to_string(),
            json!([{"role": "user", "content": "hi"}])
        )),
        json_value().prop_map(|v| ("provider".to_string(), v)),
        prop::sample::select(vec![
            json!({"only": ["p1"]}),
            json!({"order": ["p2", "p1"], "allow_fallbacks": false}),
            json!({"ignore": ["nope"]}),
        ])
        .prop_map(|v| ("provider".to_string(), v)),
        json_value().prop_map(|v| ("stream_options".to_string(), v)),
        json_value().prop_map(|v| ("max_tokens".to_string(), v)),
        json_value().prop_map(|v| ("max_completion_tokens".to_string(), v)),
        json_value().prop_map(|v| ("tools".to_string(), v)),
        json_value().prop_map(|v| ("response_format".to_string(), v)),
        ("[a-z_]{1,10}", json_value()),
    ];
    proptest::collection::vec(field, 0..8).prop_map(|fields| {
        let m: serde_json::Map<String, Value> = fields.into_iter().collect();
        serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
    })
}

fn check_chat(body: &[u8], header: Option<&[u8]>, config: &Config) -> Result<(), TestCaseError> {
    match parse_chat(body, header, config) {
        Ok(req) => {
            let v: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| TestCaseError::fail(format!("accepted invalid JSON: {e}")))?;
            prop_assert_eq!(v["model"].as_str(), Some(req.model.as_str()));
            prop_assert!(!req.model.trim().is_empty());
            prop_assert_eq!(v["stream"].as_bool().unwrap_or(false), req.stream);
            prop_assert!(v["messages"].as_array().is_some_and(|a| !a.is_empty()));
            prop_assert!(
                req.payload()
                    .is_some_and(|p| !p.body.contains_key("provider")),
                "provider is not forwarded"
            );
            if let Some(p) = &req.preference {
                for n in p.names() {
                    prop_assert!(n == "p1" || n == "p2", "unknown provider {n} accepted");
                }
            }
        }
        Err(e) => {
            prop_assert_eq!(e.status(), 400, "{:?}", e);
            let j: serde_json::Value = serde_json::from_slice(&e.to_json())
                .map_err(|e| TestCaseError::fail(format!("error body is not JSON: {e}")))?;
            prop_assert!(j["error"]["message"].is_string(), "{j}");
            prop_assert_eq!(j["error"]["type"].as_str(), Some("invalid_request_error"));
        }
    }
    Ok(())
}

#[test]
fn chat_request_body() {
    let config = Config::parse(Path::new("/nonexistent/fuzz.yaml"), CHAT_CONFIG).expect("config");
    let input = (
        prop_oneof![
            4 => near_valid(chat_json()).prop_map(|(b, _)| b),
            1 => proptest::collection::vec(any::<u8>(), 0..200),
        ],
        prop_oneof![
            4 => Just(None),
            1 => near_valid(
                json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default())
            ).prop_map(|(b, _)| Some(b)),
        ],
    );
    fuzz("chat_request_body", input, |(body, header)| {
        check_chat(&body, header.as_deref(), &config)
    });
}

// ---------------------------------------------------------------- chunked request reader

/// An `AsyncRead` that yields preset pieces, one per read (never pending), then EOF.
struct Pieces {
    pieces: Vec<Vec<u8>>,
    next: usize,
    offset: usize,
}

impl tokio::io::AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.next < self.pieces.len() && self.offset == self.pieces[self.next].len() {
            self.next += 1;
            self.offset = 0;
        }
        if self.next < self.pieces.len() {
            let (i, o) = (self.next, self.offset);
            let n = buf.remaining().min(self.pieces[i].len() - o);
            buf.put_slice(&self.pieces[i][o..o + n]);
            self.offset += n;
        }
        Poll::Ready(Ok(()))
    }
}

fn decode(rt: &tokio::runtime::Runtime, pieces: &[&[u8]]) -> Result<DecodedRequest, (u16, String)> {
    let mut rd = Pieces {
        pieces: pieces.iter().map(|p| p.to_vec()).collect(),
        next: 0,
        offset: 0,
    };
    rt.block_on(decode_request(&mut rd))
}

/// A chunked request: `(wire bytes, the body it carries)`.
fn chunked_request() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 1..40),
                prop::sample::select(vec!["", ";a=b", ";x", " ", "; ext=\"q\""]),
                any::<bool>(),
            ),
            0..8,
        ),
        proptest::collection::vec(("[a-z-]{1,8}", "[ -~]{0,10}"), 0..3),
        any::<bool>(),
    )
        .prop_map(|(chunks, trailers, expect)| {
            let mut w = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n".to_vec();
            if expect {
                w.extend_from_slice(b"expect: 100-continue\r\n");
            }
            w.extend_from_slice(b"\r\n");
            let mut body = Vec::new();
            for (c, ext, upper) in chunks {
                let size = if upper {
                    format!("{:X}", c.len())
                } else {
                    format!("{:x}", c.len())
                };
                w.extend_from_slice(format!("{size}{ext}\r\n").as_bytes());
                w.extend_from_slice(&c);
                w.extend_from_slice(b"\r\n");
                body.extend_from_slice(&c);
            }
            w.extend_from_slice(b"0\r\n");
            for (k, v) in trailers {
                w.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
            }
            w.extend_from_slice(b"\r\n");
            (w, body)
        })
}

/// A Content-Length request: `(wire bytes, body)`.
fn length_request() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    proptest::collection::vec(any::<u8>(), 0..100).prop_map(|body| {
        let mut w = format!(
            "POST /v1/x HTTP/1.1\r\nhost: h\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        w.extend_from_slice(&body);
        (w, body)
    })
}

fn check_chunked(
    rt: &tokio::runtime::Runtime,
    wire: &[u8],
    body: &[u8],
    mutated: bool,
    cuts: &[usize],
) -> Result<(), TestCaseError> {
    let whole = decode(rt, &[wire]);
    let chunked = decode(rt, &split(wire, cuts));
    let bytewise: Vec<&[u8]> = wire.chunks(1).collect();
    let single = decode(rt, &bytewise);
    // The reader's result does not depend on how the bytes arrive.
    prop_assert_eq!(&chunked, &whole);
    prop_assert_eq!(&single, &whole);
    match &whole {
        Ok(r) => {
            prop_assert!(r.body.len() <= wire.len(), "body longer than the input");
            if !mutated {
                prop_assert_eq!(&r.body, &body.to_vec());
            }
        }
        Err((status, msg)) => {
            prop_assert!(
                !mutated || [0, 400, 413, 431].contains(status),
                "{status} {msg}"
            );
            prop_assert!(mutated, "valid request refused: {status} {msg}");
        }
    }
    Ok(())
}

#[test]
fn chunked_request_reader() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let input = (
        prop_oneof![
            3 => (chunked_request(), proptest::collection::vec(mutation(), 0..4))
                .prop_map(|((w, b), m)| { let mutated = !m.is_empty(); (mutate(w, &m), b, mutated) }),
            1 => (length_request(), proptest::collection::vec(mutation(), 0..3))
                .prop_map(|((w, b), m)| { let mutated = !m.is_empty(); (mutate(w, &m), b, mutated) }),
            1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(|w| (w, Vec::new(), true)),
        ],
        proptest::collection::vec(any::<usize>(), 0..16),
    );
    fuzz(
        "chunked_request_reader",
        input,
        |((wire, body, mutated), cuts)| check_chunked(&rt, &wire, &body, mutated, &cuts),
    );
}

// ---------------------------------------------------------------- config loader

/// The fuzzed config's (non-existent) path: errors must name it; includes resolve under it.
const FUZZ_CONFIG_PATH: &str = "/nonexistent/sluice-fuzz/sluice.yaml";

fn yaml_snippet() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("  threads: 2\n".to_string()),
        Just("  max_event_bytes: 1000\n".to_string()),
        Just("  shutdown_grace_ms: -1\n".to_string()),
        Just("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n".to_string()),
        Just("include: [\"missing/*.yaml\"]\n".to_string()),
        Just("      - provider: nope\n        upstream_model: x\n".to_string()),
        Just("    priority: 99999999999999999999\n".to_string()),
        Just("  listen: [1, 2]\n".to_string()),
        Just("!!binary aGVsbG8=\n".to_string()),
        Just("? [complex, key]\n: v\n".to_string()),
        "[ -~]{0,30}\n",
        "[a-z_]{1,12}: [ -~]{0,16}\n",
        "  [a-z_]{1,12}: [0-9]{1,12}\n",
    ]
}

fn config_text() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec((any::<usize>(), yaml_snippet()), 0..4),
        proptest::collection::vec(mutation(), 0..3),
    )
        .prop_map(|(inserts, muts)| {
            let mut lines: Vec<String> = CHAT_CONFIG.lines().map(|l| format!("{l}\n")).collect();
            for (at, snip) in inserts {
                let at = at % (lines.len() + 1);
                lines.insert(at, snip);
            }
            mutate(lines.concat().into_bytes(), &muts)
        })
}

fn check_config(text: &str) -> Result<(), TestCaseError> {
    let path = Path::new(FUZZ_CONFIG_PATH);
    let t = Instant::now();
    let first = Config::parse(path, text);
    let took = t.elapsed();
    // Bounded: serde_yaml stops alias expansion at 100 jumps per event (an alias bomb
    // costs ~0.35 s in a debug build, alone; 10 s leaves room for a loaded CI machine).
    prop_assert!(took < Duration::from_secs(10), "parse took {took:?}");
    let second = Config::parse(path, text);
    match (&first, &second) {
        (Ok(_), Ok(_)) => {}
        (Err(a), Err(b)) => {
            let (a, b) = (a.to_string(), b.to_string());
            prop_assert_eq!(&a, &b, "nondeterministic error");
            prop_assert!(a.contains("sluice"), "error does not name the file: {a}");
            prop_assert!(
                a.len() < 4096 + text.len(),
                "error text unbounded: {} bytes",
                a.len()
            );
        }
        _ => prop_assert!(false, "nondeterministic: {first:?} vs {second:?}"),
    }
    Ok(())
}

#[test]
fn config_loader() {
    let input = prop_oneof![
        4 => config_text(),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ];
    fuzz("config_loader", input, |bytes| {
        check_config(&String::from_utf8_lossy(&bytes))
    });
}

// ---------------------------------------------------------------- regressions

/// Found by `chunked_request_reader`: a chunk size near `usize::MAX` overflowed the body
/// bound check (`body.len() + size`, then `size + 2`) and panicked; it is a 413.
#[test]
fn regression_chunk_size_overflow() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for size in ["ffffffffffffffff", "fffffffffffffffe", "7fffffffffffffff"] {
        for first in ["", "1\r\na\r\n"] {
            let wire = format!(
                "POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n{first}{size}\r\nabc\r\n0\r\n\r\n"
            );
            let r = decode(&rt, &[wire.as_bytes()]);
            assert_eq!(r.map_err(|e| e.0), Err(413), "{wire:?}");
        }
    }
}

/// Nesting deeper than serde_json's recursion limit is a 400, not a stack overflow.
#[test]
fn regression_deeply_nested_request_body() {
    let config = Config::parse(Path::new("/nonexistent/fuzz.yaml"), CHAT_CONFIG).expect("config");
    let body = format!(
        r#"{{"model":"acme/chat","messages":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let e = parse_chat(body.as_bytes(), None, &config).expect_err("too deep");
    assert_eq!(e.status(), 400);
}

/// A YAML alias bomb (9^7 nodes from a few lines) is refused without being expanded: serde_yaml
/// stops at 100 alias jumps per event (Sluice's duplicate-key pass builds a `Value`, so it
/// expands up to that limit: ~0.35 s in a debug build).
#[test]
fn regression_yaml_alias_bomb() {
    let mut text = CHAT_CONFIG.to_string();
    text.push_str("x: &a [y, y, y, y, y, y, y, y, y]\nx2: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nx3: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nx4: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\nx5: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nx6: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\nx7: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n");
    let t = Instant::now();
    let r = Config::parse(Path::new(FUZZ_CONFIG_PATH), &text);
    eprintln!("alias bomb refused in {:?}: {r:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(r.is_err(), "unknown top-level keys are refused");
}

/// The reference model and the normalizer agree on the fixtures' awkward spots: `\r`
/// split from `\n`, `data:` without a space, a trailing partial event.
#[test]
fn regression_sse_model_fixed_cases() {
    let input = b"data:a\r\r\ndata: b\r\n\r\n:c\n\ndata\nevent:x\ndata:";
    assert_eq!(
        sse_model(input),
        SseModel {
            complete: vec![
                b"data: a\n\n".to_vec(),
                b"data: b\n\n".to_vec(),
                b":c\n\n".to_vec(),
            ],
            partial: Some(b"data\nevent:x\ndata:\n\n".to_vec()),
            pending_len: 18,
        }
    );
    check_sse(input, &[6, 7], 1 << 20).expect("agrees");
    // The limit counts the trailing event's bytes before `finish`.
    check_sse(input, &[], 18).expect("18 bytes pending fit a limit of 18");
    check_sse(input, &[], 17).expect("18 bytes pending overflow a limit of 17");
}
