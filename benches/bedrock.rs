//! Criterion benchmarks of the Bedrock provider's own per-request and per-byte costs:
//!
//! - `bedrock_sigv4`: one SigV4 signature of an `InvokeModel` request
//!   (`providers::bedrock::sigv4::Signer::sign`, the `aws-sigv4` crate) over a typical
//!   1.5 KiB Messages body and a 16 KiB one (the payload's SHA-256 grows with the body).
//!   Target: < 20 µs per request.
//! - `bedrock_stream`: an `InvokeModelWithResponseStream` body (binary event-stream
//!   messages, base64 event JSON, built with `aws-smithy-eventstream`'s encoder, as Bedrock
//!   frames them) through what the stream pipe runs for it: the event-stream decoder
//!   (`providers::bedrock::eventstream`), the SSE normalizer, then the model echo (a
//!   Messages client) or the Messages→Chat translator (a Chat client); MB/s of upstream
//!   event-stream bytes, in 150–300 B and 4 KiB chunks. Target: ≥ 200 MB/s on one core.
//!
//! Plus allocations per signature and per event-stream message (a counting global
//! allocator, this bench binary only), printed before each case: the whole pipeline per
//! stream (a fresh decoder, normalizer and translator each stream, as the proxy builds them),
//! and the decoder alone, warm (one decoder and output buffer reused).
//!
//! Throughput is printed by criterion, never asserted; under `cargo test --benches` each
//! case runs once and checks its output. `BEDROCK_BENCH_CASE=<case>` (`sigv4/1536`,
//! `to_chat/4KiB`, `decode_only/4KiB`, ...) runs one case only, setup included, for a
//! per-case instruction count: under `--test` a stream case runs its pipeline exactly 22
//! times (one check, 20 counted for allocations, one test run), a signature case 102:
//! `BEDROCK_BENCH_CASE=to_chat/4KiB valgrind --tool=callgrind <bench binary> --test`
//! (under valgrind SHA-256 runs in software: valgrind hides SHA-NI).
#![allow(unsafe_code)] // the counting global allocator must implement `GlobalAlloc`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sluice::protocol::{ClientDialect, StreamOptions, StreamTranslator, UpstreamDialect};
use sluice::providers::bedrock::credentials::AwsCredentials;
use sluice::providers::bedrock::eventstream::EventStreamDecoder;
use sluice::providers::bedrock::sigv4::Signer;
use sluice::secret::Secret;
use sluice::sse::{EchoMemo, ModelPath, ModelRewriter, SseNormalizer};

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

/// Whether the case `name` runs (all unless `BEDROCK_BENCH_CASE` names one).
fn selected(name: &str) -> bool {
    std::env::var("BEDROCK_BENCH_CASE").map_or(true, |only| only == name)
}

/// Allocations `f` makes per call, averaged over `n` calls.
fn allocs_per_call(n: usize, mut f: impl FnMut()) -> f64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..n {
        f();
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

const WORDS: &[&str] = &[
    "The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ",", " and",
    " then", " it", " naps", " in", " the", " sün", ".",
];

fn bench_sigv4(c: &mut Criterion) {
    let signer = Signer::new(
        "us-east-2",
        &AwsCredentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into()),
            session_token: Some(Secret::new("IQoJb3JpZ2luX2VjEXAMPLE//token==".into())),
        },
    );
    let path = "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream";
    let headers = [
        ("host", "bedrock-runtime.us-east-2.amazonaws.com"),
        ("content-type", "application/json"),
    ];
    let mut group = c.benchmark_group("bedrock_sigv4");
    for size in [1536usize, 16 * 1024] {
        if !selected(&format!("sigv4/{size}")) {
            continue;
        }
        let mut body = String::from(
            r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":1024,"messages":[{"role":"user","content":""#,
        );
        while body.len() < size - 4 {
            body.push_str("lorem ipsum ");
        }
        body.push_str("\"}]}");
        let now = SystemTime::now();
        let signed = signer
            .sign("POST", path, &headers, body.as_bytes(), now)
            .expect("signs");
        assert!(signed.iter().any(|(n, _)| *n == "authorization"));
        let allocs = allocs_per_call(100, || {
            black_box(
                signer
                    .sign("POST", path, &headers, body.as_bytes(), now)
                    .ok(),
            );
        });
        println!("bedrock_sigv4/{size}: {allocs:.1} allocations per signature");
        group.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| {
                black_box(
                    signer
                        .sign("POST", path, &headers, black_box(body.as_bytes()), now)
                        .expect("signs"),
                )
            })
        });
    }
    group.finish();
}

/// One `chunk` message of an Anthropic event's data JSON, as Bedrock frames it.
fn chunk(json: &str, n: usize) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(json);
    let pad = &"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123"[..(n * 7) % 56];
    let payload = format!(r#"{{"bytes":"{b64}","p":"{pad}"}}"#);
    let headers = [
        (":event-type", "chunk"),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ]
    .iter()
    .map(|(k, v)| {
        Header::new(
            (*k).to_string(),
            HeaderValue::String((*v).to_string().into()),
        )
    })
    .collect();
    let mut out = Vec::new();
    write_message_to(&Message::new_from_parts(headers, payload), &mut out).expect("encodes");
    out
}

/// A Claude answer on Bedrock: `message_start`, a text block of 200 deltas, a tool call in
/// 20 fragments, `message_delta`, `message_stop` with Bedrock's invocation metrics.
fn bedrock_stream() -> (Vec<u8>, usize) {
    let mut events: Vec<String> = vec![
        r#"{"type":"message_start","message":{"id":"msg_bdrk_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"output_tokens":2}}}"#.into(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into(),
    ];
    for i in 0..200 {
        let w = WORDS[i % WORDS.len()];
        events.push(format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{w}"}}}}"#
        ));
    }
    events.push(r#"{"type":"content_block_stop","index":0}"#.into());
    events.push(r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_bdrk_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#.into());
    for i in 0..20 {
        let frag = if i == 0 {
            r#"{\"location\": \"San"#
        } else {
            r#" Fra"#
        };
        events.push(format!(
            r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":"{frag}"}}}}"#
        ));
    }
    events.push(r#"{"type":"content_block_stop","index":1}"#.into());
    events.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":221}}"#.into());
    events.push(r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":2520,"outputTokenCount":221,"invocationLatency":3120,"firstByteLatency":402}}"#.into());
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        out.extend(chunk(e, i));
    }
    (out, events.len())
}

fn chunked(stream: &[u8], big: bool) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = stream;
    let mut k = 0;
    while !rest.is_empty() {
        let want = if big { 4096 } else { 150 + (k * 37) % 150 };
        let size = want.min(rest.len());
        out.push(&rest[..size]);
        rest = &rest[size..];
        k += 1;
    }
    out
}

/// Decoder + normalizer + (translator to `client`, or the Messages model echo).
struct Pipeline {
    client: ClientDialect,
    out: BytesMut,
}

impl Pipeline {
    /// One stream: (client bytes, upstream events).
    fn run(&mut self, chunks: &[&[u8]]) -> (usize, usize) {
        let mut decoder = EventStreamDecoder::new(1 << 20);
        let mut norm = SseNormalizer::new(1 << 20);
        let mut sse = BytesMut::with_capacity(4096);
        let opts = StreamOptions {
            model: "house-model".into(),
            created: 1_700_000_000,
            include_usage: true,
            echo: sluice::protocol::ClientEcho::default(),
            clock: || 1_700_000_001,
        };
        let mut translator = StreamTranslator::new(UpstreamDialect::Messages, self.client, &opts);
        let rewriter = ModelRewriter::at(ModelPath::new(&["message", "model"]), "house-model");
        let mut memo = EchoMemo::default();
        let (mut sent, mut events) = (0, 0);
        for c in chunks {
            sse.clear();
            decoder.push(c, &mut sse).expect("decodes");
            norm.push(&sse).expect("frames");
            while let Some(ev) = norm.next_event() {
                events += 1;
                match translator.as_mut() {
                    Some(t) => {
                        if let Some(data) = ev.data() {
                            t.on_event(ev.event_name(), &data, &mut self.out)
                                .expect("translates");
                        }
                    }
                    None => rewriter.rewrite_event(&ev, &mut memo, &mut self.out),
                }
            }
            sent += self.out.split().len();
        }
        decoder.finish().expect("complete");
        if let Some(t) = &translator {
            assert!(t.is_finished());
        }
        (sent, events)
    }
}

fn bench_stream(c: &mut Criterion) {
    let (stream, n_events) = bedrock_stream();
    let mut group = c.benchmark_group("bedrock_stream");
    for (name, client) in [
        ("to_messages", ClientDialect::Messages),
        ("to_chat", ClientDialect::ChatCompletions),
    ] {
        for big in [false, true] {
            let label = format!("{name}/{}", if big { "4KiB" } else { "150-300B" });
            if !selected(&label) {
                continue;
            }
            let chunks = chunked(&stream, big);
            let mut p = Pipeline {
                client,
                out: BytesMut::with_capacity(64 * 1024),
            };
            let (sent, events) = p.run(&chunks);
            assert_eq!(events, n_events, "{name}");
            assert!(sent > 0);
            let per_stream = allocs_per_call(20, || {
                p.run(&chunks);
            });
            println!(
                "{label}: {} B of event stream, {events} events, {sent} B to the client; \
                 {:.2} allocations per message (whole pipeline, fresh per stream)",
                stream.len(),
                per_stream / events as f64,
            );
            group.throughput(Throughput::Bytes(stream.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(label), &chunks, |b, chunks| {
                b.iter(|| black_box(p.run(black_box(chunks))))
            });
        }
    }
    // The decoder alone (event stream → SSE bytes).
    if selected("decode_only/4KiB") {
        let chunks = chunked(&stream, true);
        {
            let mut d = EventStreamDecoder::new(1 << 20);
            let mut out = BytesMut::with_capacity(64 * 1024);
            let mut one_stream = || {
                out.clear();
                for c in &chunks {
                    d.push(c, &mut out).expect("decodes");
                }
                d.finish().expect("complete");
            };
            one_stream();
            let per_stream = allocs_per_call(20, one_stream);
            println!(
                "decode_only/4KiB: {:.2} allocations per message (one decoder, warm)",
                per_stream / n_events as f64
            );
        }
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_function("decode_only/4KiB", |b| {
            b.iter(|| {
                let mut d = EventStreamDecoder::new(1 << 20);
                let mut out = BytesMut::with_capacity(64 * 1024);
                for c in &chunks {
                    d.push(c, &mut out).expect("decodes");
                }
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = bench_sigv4, bench_stream
}
criterion_main!(benches);
