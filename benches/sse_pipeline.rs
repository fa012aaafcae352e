//! Criterion benchmark of the SSE hot path (`sluice::sse`): normalizer (with
//! its per-line UTF-8 validation) + model echo (the structural scan that
//! replaces whatever model id the provider answered) over a realistic
//! recorded-style OpenAI stream, cut into
//! chunks of various sizes, plus an allocation count per event (via a
//! counting global allocator that exists only in this bench binary).
#![allow(unsafe_code)] // the counting global allocator below must implement `GlobalAlloc`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sluice::sse::{
    extract_usage, has_content, has_finish_reason, EchoMemo, ModelRewriter, SseNormalizer,
};

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

const UPSTREAM: &str = "gpt-4o-mini-2024-07-18";
const STANDARD: &str = "gpt-4o-mini";
const MAX_EVENT: usize = 1 << 20;

const WORDS: &[&str] = &[
    "Hello", " world", ",", " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog",
    ".", "\\n", " Rust", " is", " fast", " é", " 世界", " 🦀", " and", " safe", "!",
];

/// A realistic OpenAI chat-completions stream: role chunk, 200 content
/// chunks, finish chunk, usage chunk, `[DONE]` (as OpenAI sends it, `\n\n`
/// separated, `data: ` with a space).
fn openai_stream() -> (Vec<u8>, usize) {
    let head = format!(
        "{{\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1721234567,\"model\":\"{UPSTREAM}\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":"
    );
    let mut s = String::new();
    let mut events = 0;
    s.push_str(&format!(
        "data: {head}{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
    ));
    events += 1;
    for i in 0..200 {
        let w = WORDS[i % WORDS.len()];
        s.push_str(&format!(
            "data: {head}{{\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
        events += 1;
    }
    s.push_str(&format!(
        "data: {head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n"
    ));
    s.push_str(&format!(
        "data: {{\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1721234567,\"model\":\"{UPSTREAM}\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[],\"usage\":{{\"prompt_tokens\":27,\"completion_tokens\":200,\"total_tokens\":227,\"prompt_tokens_details\":{{\"cached_tokens\":0,\"audio_tokens\":0}},\"completion_tokens_details\":{{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}}}}\n\n"
    ));
    s.push_str("data: [DONE]\n\n");
    events += 3;
    (s.into_bytes(), events)
}

/// Cuts `input` into chunks: fixed size, or (size 0) a deterministic
/// pseudo-random mix of 150..=300 bytes like real network reads.
fn chunked(input: &[u8], size: usize) -> Vec<&[u8]> {
    if size > 0 {
        return input.chunks(size).collect();
    }
    let mut out = Vec::new();
    let mut rest = input;
    let mut seed: u32 = 0x9e37_79b9;
    while !rest.is_empty() {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let n = (150 + (seed % 151) as usize).min(rest.len());
        let (a, b) = rest.split_at(n);
        out.push(a);
        rest = b;
    }
    out
}

/// State reused across streams, as the gateway keeps it per connection.
struct Pipeline {
    norm: SseNormalizer,
    rewriter: ModelRewriter,
    memo: EchoMemo,
    out: BytesMut,
}

impl Pipeline {
    fn new() -> Self {
        Pipeline {
            norm: SseNormalizer::new(MAX_EVENT),
            rewriter: ModelRewriter::new(STANDARD),
            memo: EchoMemo::default(),
            out: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Normalize + rewrite one whole stream; per upstream chunk the output is
    /// split off as a frozen `Bytes` (what the gateway sends downstream) and
    /// dropped. With `inspect`, also run `has_content` / `extract_usage`.
    /// Returns (downstream bytes, events).
    fn run(&mut self, chunks: &[&[u8]], inspect: bool) -> (usize, usize) {
        let mut sent = 0;
        let mut events = 0;
        let mut content_events = 0;
        for chunk in chunks {
            if self.norm.push(chunk).is_err() {
                return (sent, events);
            }
            while let Some(ev) = self.norm.next_event() {
                events += 1;
                if inspect {
                    if let Some(data) = ev.data() {
                        if has_content(&data) {
                            content_events += 1;
                        }
                        black_box(extract_usage(&data));
                        black_box(has_finish_reason(&data));
                    }
                }
                self.rewriter
                    .rewrite_event(&ev, &mut self.memo, &mut self.out);
            }
            if !self.out.is_empty() {
                let frame = self.out.split().freeze();
                sent += frame.len();
                black_box(frame);
            }
        }
        if self.norm.finish().is_ok() {
            while let Some(ev) = self.norm.next_event() {
                events += 1;
                self.rewriter
                    .rewrite_event(&ev, &mut self.memo, &mut self.out);
            }
        }
        sent += self.out.split().freeze().len();
        black_box(content_events);
        (sent, events)
    }
}

fn report_allocations(stream: &[u8], expected_events: usize) {
    for (label, size) in [("1B", 1), ("17B", 17), ("150-300B", 0), ("4KiB", 4096)] {
        let chunks = chunked(stream, size);
        // Cold: construction + first stream.
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut p = Pipeline::new();
        let (_, ev) = p.run(&chunks, false);
        let cold = ALLOCS.load(Ordering::Relaxed) - before;
        assert_eq!(ev, expected_events);
        // Warm: 20 more streams on the same per-connection state.
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut total_events = 0;
        for _ in 0..20 {
            total_events += p.run(&chunks, true).1;
        }
        let warm = ALLOCS.load(Ordering::Relaxed) - before;
        println!(
            "allocations [{label:>8}]: cold stream {cold} allocs / {ev} events = {:.3}/event; \
             warm (incl. has_content+extract_usage) {warm} allocs / {total_events} events = {:.4}/event",
            cold as f64 / ev as f64,
            warm as f64 / total_events as f64
        );
    }
}

fn bench_pipeline(c: &mut Criterion) {
    let (stream, events) = openai_stream();
    println!(
        "stream: {} bytes, {events} events, {} B/event avg",
        stream.len(),
        stream.len() / events
    );
    // Sanity: output is the rewritten stream.
    let mut p = Pipeline::new();
    let (sent, ev) = p.run(&chunked(&stream, 0), false);
    assert_eq!(ev, events);
    let shrink = (UPSTREAM.len() - STANDARD.len()) * (events - 1);
    assert_eq!(sent, stream.len() - shrink);
    report_allocations(&stream, events);

    for (group_name, inspect) in [("sse_normalize_rewrite", false), ("sse_full_inspect", true)] {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Bytes(stream.len() as u64));
        for (label, size) in [("1B", 1), ("17B", 17), ("150-300B", 0), ("4KiB", 4096)] {
            let chunks = chunked(&stream, size);
            let mut p = Pipeline::new();
            group.bench_with_input(BenchmarkId::from_parameter(label), &chunks, |b, chunks| {
                b.iter(|| black_box(p.run(black_box(chunks), inspect)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_pipeline);
criterion_main!(benches);
