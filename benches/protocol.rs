//! Criterion benchmark of stream translation (`sluice::protocol`):
//! normalizer + `StreamTranslator` over realistic upstream streams, for
//! Messages→Chat, Chat→Messages, Chat→Responses and Messages→Responses, in
//! MB/s of upstream SSE; and, for comparison, the same-dialect fast path
//! (normalizer + the per-event inspection and model echo of
//! `proxy::pipe`, no translation) on the same streams. Plus an allocation
//! count per upstream event (counting global allocator, this bench binary
//! only).
//!
//! Under `cargo test --benches` criterion runs each benchmark once (test
//! mode), so the sanity checks below run in CI too: every translated
//! direction must stay at or below [`MAX_ALLOCS_PER_EVENT`] allocations per
//! upstream event, warm (issue 9's bound: at most one allocation per event
//! beyond the output buffer, which is reused here as the proxy reuses it).
//! Throughput is printed by criterion, never asserted.
//!
//! `PROTOCOL_BENCH_CASE=<name>` (e.g. `messages_to_chat`) runs one case
//! only, for a per-direction instruction count:
//! `PROTOCOL_BENCH_CASE=messages_to_chat valgrind --tool=callgrind <bench binary> --test`.
#![allow(unsafe_code)] // the counting global allocator must implement `GlobalAlloc`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sluice::protocol::{ClientDialect, FastPath, StreamOptions, StreamTranslator, UpstreamDialect};
use sluice::sse::{extract_usage, EchoMemo, ModelRewriter, SseNormalizer};

/// Whether the case `name` runs (all unless `PROTOCOL_BENCH_CASE` names one).
fn selected(name: &str) -> bool {
    std::env::var("PROTOCOL_BENCH_CASE").map_or(true, |only| only == name)
}

/// Allocations per upstream event a translated stream may cost, warm.
const MAX_ALLOCS_PER_EVENT: f64 = 1.0;

/// System allocator that counts allocations (alloc + realloc calls).
struct CountingAlloc;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers all work to `System`, only counting calls.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const WORDS: &[&str] = &[
    "Hello", " world", ",", " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog",
    ".", "\\n", " Rust", " is", " fast", " é", " 世界", " 🦀", " and", " safe", "!",
];

/// An Anthropic Messages stream as Claude sends it: message_start, a text
/// block of 200 deltas with a ping, a tool_use block of 20 input_json_delta
/// fragments, message_delta, message_stop.
fn messages_stream() -> (Vec<u8>, usize) {
    let mut s = String::new();
    let mut n = 0;
    let mut ev = |s: &mut String, name: &str, data: &str| {
        s.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        n += 1;
    };
    ev(
        &mut s,
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"output_tokens":2}}}"#,
    );
    ev(
        &mut s,
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    );
    ev(&mut s, "ping", r#"{"type": "ping"}"#);
    for i in 0..200 {
        let w = WORDS[i % WORDS.len()];
        ev(
            &mut s,
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{w}"}}}}"#
            ),
        );
    }
    ev(
        &mut s,
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    );
    ev(
        &mut s,
        "content_block_start",
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#,
    );
    for i in 0..20 {
        let frag = if i == 0 {
            r#"{\"location\": \"San"#
        } else {
            r#" Fra"#
        };
        ev(
            &mut s,
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":"{frag}"}}}}"#
            ),
        );
    }
    ev(
        &mut s,
        "content_block_stop",
        r#"{"type":"content_block_stop","index":1}"#,
    );
    ev(
        &mut s,
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":221}}"#,
    );
    ev(&mut s, "message_stop", r#"{"type":"message_stop"}"#);
    (s.into_bytes(), n)
}

/// An OpenAI Chat Completions stream: role chunk, 200 content chunks, a
/// tool call in 20 argument chunks, finish chunk, usage chunk, `[DONE]`.
fn chat_stream() -> (Vec<u8>, usize) {
    let head = r#"{"id":"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012","object":"chat.completion.chunk","created":1721234567,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":"#;
    let mut s = String::new();
    let mut n = 0;
    let mut chunk = |s: &mut String, delta: &str, finish: &str| {
        s.push_str(&format!("data: {head}{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"));
        n += 1;
    };
    chunk(
        &mut s,
        r#"{"role":"assistant","content":"","refusal":null}"#,
        "null",
    );
    for i in 0..200 {
        let w = WORDS[i % WORDS.len()];
        chunk(&mut s, &format!(r#"{{"content":"{w}"}}"#), "null");
    }
    chunk(
        &mut s,
        r#"{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
        "null",
    );
    for _ in 0..20 {
        chunk(
            &mut s,
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"lo"}}]}"#,
            "null",
        );
    }
    chunk(&mut s, "{}", "\"tool_calls\"");
    s.push_str("data: {\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1721234567,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":472,\"completion_tokens\":221,\"total_tokens\":693,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n");
    s.push_str("data: [DONE]\n\n");
    n += 2;
    (s.into_bytes(), n)
}

/// Cuts the stream into ~per-event chunks (150-300 B) as a provider's
/// writes arrive.
fn chunked(stream: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = stream;
    let mut k = 0;
    while !rest.is_empty() {
        let size = (150 + (k * 37) % 150).min(rest.len());
        out.push(&rest[..size]);
        rest = &rest[size..];
        k += 1;
    }
    out
}

struct Pipeline {
    norm: SseNormalizer,
    out: BytesMut,
    upstream: UpstreamDialect,
    client: ClientDialect,
}

impl Pipeline {
    fn new(upstream: UpstreamDialect, client: ClientDialect) -> Self {
        Pipeline {
            norm: SseNormalizer::new(1 << 20),
            out: BytesMut::with_capacity(64 * 1024),
            upstream,
            client,
        }
    }

    /// One stream: returns (client bytes, upstream events).
    fn run(&mut self, chunks: &[&[u8]]) -> (usize, usize) {
        let opts = StreamOptions {
            model: "house-model".into(),
            created: 1_700_000_000,
            include_usage: true,
            echo: sluice::protocol::ClientEcho::default(),
            clock: || 1_700_000_001,
        };
        let Some(mut t) = StreamTranslator::new(self.upstream, self.client, &opts) else {
            return (0, 0);
        };
        let mut events = 0;
        let mut sent = 0;
        for c in chunks {
            if self.norm.push(c).is_err() {
                return (sent, events);
            }
            while let Some(ev) = self.norm.next_event() {
                events += 1;
                if let Some(data) = ev.data() {
                    if let Err(e) = t.on_event(ev.event_name(), &data, &mut self.out) {
                        t.error(e.kind(), &e.to_string(), &mut self.out);
                    }
                }
            }
            // The proxy hands each chunk's output downstream.
            sent += self.out.split().len();
        }
        assert!(
            t.is_finished(),
            "{:?}->{:?} finished",
            self.upstream,
            self.client
        );
        (sent, events)
    }
}

/// The same-dialect path as `stream::pipe` runs it per event, from the dialect's
/// [`FastPath`]: normalize, the content probe, the finish check, `extract_usage`, the
/// model echo.
struct SamePipeline {
    norm: SseNormalizer,
    fast: &'static FastPath,
    rewriter: ModelRewriter,
    memo: EchoMemo,
    out: BytesMut,
}

impl SamePipeline {
    fn new(dialect: ClientDialect) -> Self {
        let fast = dialect.wire().fast_path.expect("a same-dialect pair");
        SamePipeline {
            norm: SseNormalizer::new(1 << 20),
            fast,
            rewriter: fast.rewriter(true, "house-model"),
            memo: EchoMemo::default(),
            out: BytesMut::with_capacity(64 * 1024),
        }
    }

    /// One stream: returns (client bytes, upstream events).
    fn run(&mut self, chunks: &[&[u8]]) -> (usize, usize) {
        self.memo = EchoMemo::default();
        let mut events = 0;
        let mut sent = 0;
        let mut content = 0;
        for c in chunks {
            if self.norm.push(c).is_err() {
                return (sent, events);
            }
            while let Some(ev) = self.norm.next_event() {
                events += 1;
                if let Some(data) = ev.data() {
                    content += usize::from((self.fast.has_content)(&data));
                    black_box(self.fast.is_finish(ev.event_name(), &data));
                    black_box(extract_usage(&data));
                }
                self.rewriter
                    .rewrite_event(&ev, &mut self.memo, &mut self.out);
            }
            sent += self.out.split().len();
        }
        black_box(content);
        (sent, events)
    }
}

fn bench_same_dialect(c: &mut Criterion) {
    let (messages, m_events) = messages_stream();
    let (chat, c_events) = chat_stream();
    let mut group = c.benchmark_group("protocol_same_dialect");
    for (name, dialect, stream, events) in [
        (
            "chat_to_chat",
            ClientDialect::ChatCompletions,
            &chat,
            c_events,
        ),
        (
            "messages_to_messages",
            ClientDialect::Messages,
            &messages,
            m_events,
        ),
    ] {
        if !selected(name) {
            continue;
        }
        let chunks = chunked(stream);
        let mut p = SamePipeline::new(dialect);
        let (sent, ev) = p.run(&chunks);
        assert_eq!(ev, events);
        assert!(sent > 0);
        let before = ALLOCS.load(Ordering::Relaxed);
        for _ in 0..20 {
            p.run(&chunks);
        }
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        println!(
            "{name}: {} B upstream, {events} events, {sent} B to client; {:.3} allocs/event",
            stream.len(),
            allocs as f64 / (20 * events) as f64
        );
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), &chunks, |b, chunks| {
            b.iter(|| black_box(p.run(black_box(chunks))))
        });
    }
    group.finish();
}

fn bench_translation(c: &mut Criterion) {
    let (messages, m_events) = messages_stream();
    let (chat, c_events) = chat_stream();
    let cases = [
        (
            "messages_to_chat",
            UpstreamDialect::Messages,
            ClientDialect::ChatCompletions,
            &messages,
            m_events,
        ),
        (
            "chat_to_messages",
            UpstreamDialect::ChatCompletions,
            ClientDialect::Messages,
            &chat,
            c_events,
        ),
        (
            "chat_to_responses",
            UpstreamDialect::ChatCompletions,
            ClientDialect::Responses,
            &chat,
            c_events,
        ),
        (
            "messages_to_responses",
            UpstreamDialect::Messages,
            ClientDialect::Responses,
            &messages,
            m_events,
        ),
    ];
    let mut group = c.benchmark_group("protocol_stream_translation");
    for (name, up, client, stream, events) in cases {
        if !selected(name) {
            continue;
        }
        let chunks = chunked(stream);
        let mut p = Pipeline::new(up, client);
        let (sent, ev) = p.run(&chunks);
        assert_eq!(ev, events);
        assert!(sent > 0);
        // Allocations per upstream event, warm (20 streams on one pipeline).
        let before = ALLOCS.load(Ordering::Relaxed);
        for _ in 0..20 {
            p.run(&chunks);
        }
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        let per_event = allocs as f64 / (20 * events) as f64;
        println!(
            "{name}: {} B upstream, {events} events, {sent} B to client; {per_event:.3} allocs/event",
            stream.len(),
        );
        assert!(
            per_event <= MAX_ALLOCS_PER_EVENT,
            "{name}: {per_event:.3} allocations per upstream event (bound {MAX_ALLOCS_PER_EVENT})"
        );
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), &chunks, |b, chunks| {
            b.iter(|| black_box(p.run(black_box(chunks))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_translation, bench_same_dialect);
criterion_main!(benches);
