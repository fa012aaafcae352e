//! Criterion benchmark of the `o200k_base` token count (issue 31, tokenizer memory): Sluice's
//! compact table (`sluice::protocol::tokens::text_tokens`) against `tiktoken-rs`'s `CoreBPE`
//! (what Sluice used before) on a 32 KiB prompt of prose, code, JSON and CJK text, in MB/s.
//! It prints each table's load time once, and checks (also under `cargo test --benches`,
//! where criterion runs each benchmark once) that both count the prompt alike.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// About 32 KiB of mixed prompt text.
fn prompt() -> String {
    let parts = [
        "The gateway streams tokens from the provider to the client, with fallback before the first byte. ",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{v:?}\");\n}\n",
        "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}\n",
        "日本語のテキストと中文文本测试。한국어 텍스트입니다. Überprüfung naïve café 😀 ",
        "In 2026, 1,234,567 requests were served at 99.95 % availability; latency p99 was 42 ms.\n\n",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < 32 * 1024 {
        i = (i * 7 + 3) % parts.len();
        s.push_str(parts[i]);
    }
    s
}

fn tokenizer(c: &mut Criterion) {
    let text = prompt();
    let t0 = Instant::now();
    let table = sluice::protocol::tokens::load();
    println!(
        "sluice compact table: loaded in {} ms, {} KiB",
        t0.elapsed().as_millis(),
        table / 1024
    );
    let t0 = Instant::now();
    let core = tiktoken_rs::o200k_base().expect("o200k_base");
    println!(
        "tiktoken-rs CoreBPE: loaded in {} ms",
        t0.elapsed().as_millis()
    );
    let ours = sluice::protocol::tokens::text_tokens(&text);
    assert_eq!(ours, core.encode_ordinary(&text).len() as u64);
    println!("prompt: {} bytes, {ours} tokens", text.len());

    let mut g = c.benchmark_group("o200k_32KiB");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("sluice_compact", |b| {
        b.iter(|| sluice::protocol::tokens::text_tokens(black_box(&text)));
    });
    g.bench_function("tiktoken_rs", |b| {
        b.iter(|| core.encode_ordinary(black_box(&text)).len());
    });
    g.finish();
}

criterion_group!(benches, tokenizer);
criterion_main!(benches);
