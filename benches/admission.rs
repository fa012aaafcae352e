//! Criterion benchmark of admission (`sluice::backpressure`), and a measurement of the
//! distributed check's round trip against a real `redis-server` on loopback.
//!
//! - `admission/*`: one request's whole local admission as the proxy does it without
//!   `redis:` — tenant scopes, exact concurrency slot, request and token sliding windows
//!   (pingora-limits `Rate`), the header status, a global slot — then its release and token
//!   settlement. Target: under 1 µs per request. Also with two threads admitting at once.
//! - `redis_check/*`: one `RedisLimiter::check` (one `EVALSHA` of the sliding-window-log
//!   script); after criterion's mean, p50/p90/p99 of 5000 sequential checks and the
//!   throughput with 64 checks in flight on the one multiplexed connection (pipelined) are
//!   printed. Target: p50 under 0.3 ms. Skipped, with a note, when there is no
//!   `redis-server` (`$SLUICE_REDIS_SERVER` or on `PATH`).
//!
//! Run: `cargo bench --bench admission`. Requests/s through the whole proxy with Redis limits
//! on versus off: `LOAD_TARGETS=sluice,redis cargo bench --bench load`.

use std::hint::black_box;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::backpressure::redis::RedisLimiter;
use sluice::backpressure::Admission;
use sluice::backpressure::Used;
use sluice::config::Config;

/// A config whose tenant `t` has every limit (high enough never to refuse during the bench),
/// with a tenant × model scope on `acme/chat`; tenant `free` has none.
fn config(redis: Option<&str>) -> Config {
    let redis = redis.map_or(String::new(), |url| {
        format!("redis:\n  url: {url}\n  timeout_ms: 1000\n")
    });
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\n  max_concurrent_upstream_requests: 1024\ntenants:\n  t:\n    max_concurrent_streams: 1000000\n    requests_per_minute: 4000000000\n    tokens_per_minute: 1000000000000000\n    model_limits:\n      acme/chat: {{max_concurrent_streams: 1000000, requests_per_minute: 4000000000, tokens_per_minute: 1000000000000000}}\n  free: {{}}\nvirtual_keys:\n  - key: sk-bench-0001\n    tenant: t\nproviders:\n  p:\n    kind: demo\nmodels:\n  acme/chat:\n    routes:\n      - provider: p\n        upstream_model: a\n  acme/other:\n    routes:\n      - provider: p\n        upstream_model: b\n{redis}"
    );
    let dir = std::env::temp_dir().join(format!("sluice-bench-admission-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("sluice.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let c = Config::load(&path).expect("bench config loads");
    let _ = std::fs::remove_dir_all(&dir);
    c
}

fn outcome() -> Used {
    Used {
        answered: true,
        input_tokens: 20,
        output_tokens: 50,
    }
}

/// One request's local admission, release and settlement.
fn admit_once(adm: &Admission, cfg: &Config, tenant: &str, model: &str, done: Used) {
    let mut status = None;
    let tenant = adm
        .admit_tenant_local(cfg, Some(tenant), Some(model), 100, 1, &mut status)
        .expect("never refused");
    let global = adm.try_admit_global().expect("a free slot");
    black_box(&status);
    drop(global);
    tenant.settle(done);
}

fn bench_local(c: &mut Criterion) {
    let cfg = config(None);
    let adm = Admission::new(&cfg);
    let done = outcome();
    let mut g = c.benchmark_group("admission");
    g.bench_function("tenant_and_model_limits", |b| {
        b.iter(|| admit_once(&adm, &cfg, "t", "acme/chat", done));
    });
    g.bench_function("tenant_limits", |b| {
        b.iter(|| admit_once(&adm, &cfg, "t", "acme/other", done));
    });
    g.bench_function("no_limits", |b| {
        b.iter(|| admit_once(&adm, &cfg, "free", "acme/chat", done));
    });
    // Two threads admitting the same tenant at once (shared counters and windows).
    let adm = Arc::new(adm);
    let cfg = Arc::new(cfg);
    // Reported: the time one request takes while another thread admits for the same tenant
    // at the same moment (each thread times its own `iters` requests after a common start;
    // the slower thread's time over `iters`), i.e. latency under contention, not wall time
    // over both threads' requests (which would halve it on two cores).
    g.bench_function("tenant_and_model_limits_2_threads", |b| {
        b.iter_custom(|iters| {
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let (adm, cfg, barrier) = (adm.clone(), cfg.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let done = outcome();
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..iters {
                            admit_once(&adm, &cfg, "t", "acme/chat", done);
                        }
                        start.elapsed()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("worker"))
                .max()
                .unwrap_or_default()
        });
    });
    g.finish();
}

/// A `redis-server` on a free loopback port, killed on drop.
struct RedisChild(Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_REDIS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

fn start_redis() -> Option<(RedisChild, String)> {
    let exe = redis_server_binary()?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let child = Command::new(exe)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let child = RedisChild(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Some((child, format!("redis://{addr}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn bench_redis(c: &mut Criterion) {
    let Some((_redis, url)) = start_redis() else {
        eprintln!("redis_check: skipped (no redis-server; set SLUICE_REDIS_SERVER or install it)");
        return;
    };
    let cfg = config(Some(&url));
    let settings = cfg.redis.clone().expect("redis section");
    let adm = Admission::new(&cfg);
    let plan = adm.local().plan(&cfg, "t", Some("acme/chat"));
    let window = cfg.server.rate_limit_window;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let backend = Arc::new(RedisLimiter::new(Some(&settings)));
    // Connect and load the script.
    rt.block_on(backend.check(&settings, window, &plan, &backend.next_member(), 100))
        .expect("first check");

    let mut g = c.benchmark_group("redis_check");
    g.bench_function("one_check_two_scopes", |b| {
        b.iter(|| {
            rt.block_on(backend.check(&settings, window, &plan, &backend.next_member(), 100))
                .expect("check")
        });
    });
    g.finish();

    // Percentiles of sequential checks (measured inside the runtime).
    let mut lat: Vec<Duration> = rt.block_on(async {
        let mut lat = Vec::with_capacity(5000);
        for _ in 0..5000 {
            let t = tokio::time::Instant::now();
            backend
                .check(&settings, window, &plan, &backend.next_member(), 100)
                .await
                .expect("check");
            lat.push(t.elapsed());
        }
        lat
    });
    lat.sort();
    eprintln!(
        "redis_check sequential (5000): p50 {:?} p90 {:?} p99 {:?} max {:?}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );

    // 64 checks in flight on the one multiplexed connection, for 2 s.
    let (n, mut lat) = rt.block_on(async {
        let end = tokio::time::Instant::now() + Duration::from_secs(2);
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (backend, settings, plan) = (backend.clone(), settings.clone(), plan.clone());
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    while tokio::time::Instant::now() < end {
                        let t = tokio::time::Instant::now();
                        backend
                            .check(&settings, window, &plan, &backend.next_member(), 100)
                            .await
                            .expect("check");
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        (all.len(), all)
    });
    lat.sort();
    eprintln!(
        "redis_check 64 in flight: {:.0} checks/s, p50 {:?} p99 {:?}",
        n as f64 / 2.0,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_local, bench_redis
}
criterion_main!(benches);
