//! The response store (issue 29, item 2): what one stored response costs on disk, and the
//! latency a `previous_response_id` adds to a request, on SQLite and (with
//! `RESPONSE_STORE_BENCH_PG=postgres://…`) PostgreSQL.
//!
//! Method: a fresh database gets `N` (2,000) typical responses of one tenant, each a turn of
//! a tool loop as the Vercel AI SDK runs it (a user message in; a message and a function
//! call out; the Response object as Sluice encodes it, ~1.4 KB), then:
//! - **disk per response**: SQLite, the file's growth after a WAL checkpoint, divided by `N`;
//!   PostgreSQL, `pg_total_relation_size` of both tables (heap, indexes, TOAST) after
//!   `VACUUM`, divided by `N`;
//! - **lookup**: `L` (2,000) times, [`sluice::conversation::expand::expand`] of a request with
//!   `previous_response_id` naming the third turn of a three-turn chain, through the store's
//!   worker thread as a request does (queue, query, reply, parse, rewrite of the body); the
//!   added latency is its time minus that of the same request without the id (`store: false`:
//!   no lookup); p50 and p99 of each. The database is local (SQLite file on the same disk;
//!   PostgreSQL on loopback).
//!
//! `cargo bench --bench response_store`; `cargo test --bench response_store` runs a short pass.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::billing::ledger::Backend;
use sluice::conversation::capture::{Answer, Capture};
use sluice::conversation::{self, ResponseStoreSettings, Store};

fn typical(n: usize, prev: Option<&str>) -> conversation::StoredResponse {
    let id = format!("resp_bench{n:08}");
    let response = json!({
        "id": id, "object": "response", "created_at": 1_796_595_729, "status": "completed",
        "error": null, "incomplete_details": null, "instructions": null, "max_output_tokens": null,
        "model": "acme/m", "parallel_tool_calls": true, "previous_response_id": prev,
        "reasoning": {"effort": null, "summary": null}, "store": true, "temperature": null,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": null,
        "truncation": "disabled", "metadata": {},
        "output": [
            {"id": format!("msg_{id}_0"), "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                          "text": "I will run the command to see what it prints, then tell you."}]},
            {"id": format!("fc_call_{n}"), "type": "function_call", "status": "completed",
             "call_id": format!("call_{n}"), "name": "shell_command",
             "arguments": "{\"command\":\"echo sluice-tool-ok\"}"}
        ],
        "usage": {"input_tokens": 412, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 38, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 450}
    });
    Capture {
        tenant: "team-a".into(),
        previous_response_id: prev.map(str::to_string),
        input: vec![
            json!({"type": "message", "role": "user", "content": [{"type": "input_text",
            "text": "Run `echo sluice-tool-ok` in the shell and tell me what it printed."}]}),
        ],
        answer: Some(Answer::Unary(response.to_string().into())),
    }
    .into_stored(conversation_now())
    .expect("a completed response")
}

fn conversation_now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("response store bench")
            .as_millis(),
    )
    .expect("response store bench")
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

/// Stores `n` responses and a three-turn chain; the id of its last turn.
fn fill(store: &mut dyn Store, n: usize) -> String {
    for i in 0..n {
        store
            .put(&typical(i, None), u64::MAX)
            .expect("response store bench");
    }
    let a = typical(n, None);
    let b = typical(n + 1, Some(&a.id));
    let c = typical(n + 2, Some(&b.id));
    for r in [&a, &b, &c] {
        store.put(r, u64::MAX).expect("response store bench");
    }
    c.id
}

fn lookups(backend: &Backend, last: &str, l: usize) -> (f64, f64, f64, f64) {
    let handle = conversation::standalone(&ResponseStoreSettings::default(), backend)
        .expect("response store bench");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("response store bench");
    let with = json!({"model": "acme/m", "previous_response_id": last, "store": false,
        "input": [{"type": "function_call_output", "call_id": "call_x", "output": "sluice-tool-ok"}]})
    .to_string();
    let without = json!({"model": "acme/m", "store": false,
        "input": [{"type": "function_call_output", "call_id": "call_x", "output": "sluice-tool-ok"}]})
    .to_string();
    let (mut a, mut b) = (Vec::with_capacity(l), Vec::with_capacity(l));
    rt.block_on(async {
        for i in 0..l + l / 10 {
            let t = Instant::now();
            let e = conversation::expand::expand(Some(&handle), "team-a", with.as_bytes())
                .await
                .expect("response store bench");
            let took = t.elapsed();
            assert!(
                e.body.is_some_and(|b| b.len() > 1000),
                "the chain was expanded"
            );
            let t = Instant::now();
            let e = conversation::expand::expand(Some(&handle), "team-a", without.as_bytes())
                .await
                .expect("response store bench");
            let plain = t.elapsed();
            assert!(e.body.is_none());
            if i >= l / 10 {
                // The first tenth warms the caches.
                a.push(took);
                b.push(plain);
            }
        }
    });
    (
        pct(&mut a, 0.5),
        pct(&mut a, 0.99),
        pct(&mut b, 0.5),
        pct(&mut b, 0.99),
    )
}

/// The chain query alone, on the backend (no queue, no thread hop): p50, p99 in µs.
fn direct(store: &mut dyn Store, last: &str, l: usize) -> (f64, f64) {
    let since = conversation_now() - 86_400_000;
    let mut v: Vec<Duration> = (0..l)
        .map(|_| {
            let t = Instant::now();
            let items = store
                .chain("team-a", last, since)
                .expect("response store bench")
                .expect("response store bench");
            assert_eq!(items.len(), 9);
            t.elapsed()
        })
        .collect();
    (pct(&mut v, 0.5), pct(&mut v, 0.99))
}

fn report(name: &str, per_response: f64, size_bytes: u64, q: (f64, f64), l: (f64, f64, f64, f64)) {
    println!(
        "{name}: {per_response:.0} bytes on disk per stored response (its size_bytes: {size_bytes}); \
         chain query alone p50 {:.0} µs, p99 {:.0} µs; expand with previous_response_id (3-turn \
         chain): p50 {:.0} µs, p99 {:.0} µs; without: p50 {:.1} µs, p99 {:.1} µs; added p50 {:.0} µs, p99 {:.0} µs",
        q.0, q.1, l.0, l.1, l.2, l.3, l.0 - l.2, l.1 - l.3
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (n, l) = if full { (2000, 2000) } else { (50, 20) };
    let size_bytes = typical(0, None).size_bytes;

    // SQLite.
    let dir = std::env::temp_dir().join(format!("sluice-bench-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("response store bench");
    let path = dir.join("usage.db");
    let mut s = conversation::sqlite::SqliteStore::open(&path).expect("response store bench");
    let size = |s: &conversation::sqlite::SqliteStore| {
        s.connection()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .expect("response store bench");
        std::fs::metadata(&path)
            .expect("response store bench")
            .len()
    };
    let empty = size(&s);
    let last = fill(&mut s, n);
    let grown = size(&s) - empty;
    let q = direct(&mut s, &last, l);
    drop(s);
    let backend = Backend::Sqlite { path: path.clone() };
    report(
        "sqlite",
        grown as f64 / (n + 3) as f64,
        size_bytes,
        q,
        lookups(&backend, &last, l),
    );
    let _ = std::fs::remove_dir_all(&dir);

    // PostgreSQL, when a throwaway database is named.
    if let Ok(url) = std::env::var("RESPONSE_STORE_BENCH_PG") {
        let mut p =
            conversation::postgres::PostgresStore::connect(&url).expect("response store bench");
        let last = fill(&mut p, n);
        let q = direct(&mut p, &last, l);
        drop(p);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("response store bench");
        let bytes: i64 = rt.block_on(async {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("response store bench");
            tokio::spawn(conn);
            for t in ["stored_responses", "stored_response_items"] {
                c.batch_execute(&format!("VACUUM {t}")).await.expect("response store bench");
            }
            c.query_one(
                "SELECT (pg_total_relation_size('stored_responses') + pg_total_relation_size('stored_response_items'))::BIGINT",
                &[],
            )
            .await
            .expect("response store bench")
            .get(0)
        });
        let backend = Backend::Postgres {
            url: sluice::secret::Secret::new(url),
        };
        report(
            "postgres",
            bytes as f64 / (n + 3) as f64,
            size_bytes,
            q,
            lookups(&backend, &last, l),
        );
    } else {
        println!(
            "postgres: skipped (set RESPONSE_STORE_BENCH_PG=postgres://… to a throwaway database)"
        );
    }
}
