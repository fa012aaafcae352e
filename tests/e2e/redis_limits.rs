//! Distributed tenant limits against a real `redis-server` that each test starts on its own
//! free loopback port (`--save '' --appendonly no`, killed on drop): the sliding-window log
//! script, two Sluice processes sharing one limit, fail-open to local shares when Redis is
//! killed or slow, recovery without a restart, and token settlement through Redis.
//!
//! The binary is `$SLUICE_REDIS_SERVER`, else `redis-server` on `PATH` (CI installs it with
//! `scripts/install-deps.sh`). A missing binary fails these tests: it is never a skip.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{free_port, post_json, Mock, Response, Sluice, TempDir, KEY};

/// The second virtual key of [`limits_config`]: tenant `warm` (no limits that bite), used to
/// warm Redis connections without touching tenant `t`'s windows.
pub(crate) const WARM_KEY: &str = "sk-sluice-warm-0001";

/// A config with tenant `t` (key [`KEY`], limits `tenant` as a YAML flow map), tenant `warm`
/// (key [`WARM_KEY`]), provider `p1` at `base_url`, models `acme/chat` and `acme/other`.
/// `server_extra` lines go under `server:` (indented two spaces); `tail` is appended (e.g. a
/// `redis:` section).
pub(crate) fn limits_config(
    base_url: &str,
    server_extra: &str,
    tenant: &str,
    tail: &str,
) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{server_extra}\ntenants:\n  t: {tenant}\n  warm: {{requests_per_minute: 1000000}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\n  - key: {WARM_KEY}\n    tenant: warm\nproviders:\n  p1:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-p1\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n  acme/other:\n    routes:\n      - provider: p1\n        upstream_model: mock-other-v1\n{tail}"
    )
}

/// A small non-streaming chat body for `model` (7 estimated input tokens: 3 reply priming,
/// 3 message framing, 1 for "hi").
pub(crate) fn small_body(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
}

/// `POST /v1/chat/completions` with `key`.
pub(crate) fn chat_as(addr: SocketAddr, key: &str, body: &str) -> Response {
    post_json(
        addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key}"))],
        body,
    )
}

pub(crate) use crate::harness::eventually;

/// The `redis-server` binary: `$SLUICE_REDIS_SERVER`, else `redis-server` on `PATH`.
/// Panics (fails the test) with what to install when there is none.
pub(crate) fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_REDIS_SERVER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "SLUICE_REDIS_SERVER={} is not a file",
            p.display()
        );
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server not found on PATH: the distributed rate-limit tests need a real \
                 Redis. Install it (`sudo apt-get install redis-server`, as \
                 scripts/install-deps.sh does) or set SLUICE_REDIS_SERVER=/path/to/redis-server"
            )
        })
}

/// A `redis-server` child on a loopback port, killed on drop.
pub(crate) struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
}

impl RedisServer {
    /// Starts one on a free port (retrying if the port was taken meanwhile).
    pub(crate) fn start() -> RedisServer {
        let mut r = RedisServer {
            child: None,
            port: 0,
            dir: TempDir::new("redis"),
        };
        for _ in 0..5 {
            r.port = free_port();
            if r.spawn() {
                return r;
            }
        }
        panic!("redis-server did not come up on 5 free ports");
    }

    /// `redis://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> bool {
        let log = std::fs::File::create(self.dir.path().join(format!("redis-{}.log", self.port)))
            .expect("redis log file");
        let child = Command::new(redis_server_binary())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Whether it answers `PING` within 200 ms.
    pub(crate) fn ping(&self) -> bool {
        self.command(&["PING"]).is_some_and(|r| r == "+PONG")
    }

    /// Sends one command over a fresh connection and returns the reply's first line (RESP,
    /// e.g. `:5`, `+OK`, `$-1`; for a bulk string, then `\n` and its value); `None` when it
    /// cannot connect within 200 ms or does not answer within 2 s.
    pub(crate) fn command(&self, args: &[&str]) -> Option<String> {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().ok()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let line = line.trim_end().to_string();
        if let Some(n) = line.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
            let mut buf = vec![0u8; n + 2];
            r.read_exact(&mut buf).ok()?;
            return Some(format!("{line}\n{}", String::from_utf8_lossy(&buf[..n])));
        }
        Some(line)
    }

    /// An integer reply (`ZCARD`, ...), or a bulk string parsed as one; 0 for nil.
    pub(crate) fn int(&self, args: &[&str]) -> i64 {
        let r = self.command(args).expect("redis answers");
        if let Some(v) = r.strip_prefix(':') {
            return v.parse().expect("integer reply");
        }
        if r == "$-1" {
            return 0;
        }
        r.split_once('\n')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("not an integer reply: {r:?}"))
    }

    /// Successful executions of `cmd` (lowercase, e.g. `evalsha`) since start, from
    /// `INFO commandstats` (`calls` minus `failed_calls` and `rejected_calls`).
    pub(crate) fn successful_calls(&self, cmd: &str) -> u64 {
        let info = self
            .command(&["INFO", "commandstats"])
            .expect("redis answers INFO");
        let Some(line) = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:")))
        else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        field("calls") - field("failed_calls") - field("rejected_calls")
    }

    /// Kills the process (the port then refuses connections).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing is persisted).
    pub(crate) fn restart(&mut self) {
        self.kill();
        assert!(
            eventually(Duration::from_secs(10), || self.spawn()),
            "redis-server did not restart on port {}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Redis window log of tenant `t`.
const LOG_KEY: &str = "sluice:rl:{t}";
const SUM_KEY: &str = "sluice:rl:{t}:tokens";

/// Number of log lines containing `needle`.
fn log_count(s: &Sluice, needle: &str) -> usize {
    s.log().lines().filter(|l| l.contains(needle)).count()
}

/// Sends `n` requests as tenant `t`; returns (200s, 429s). Any other status fails.
fn burst(s: &Sluice, n: usize) -> (usize, usize) {
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..n {
        let r = chat_as(s.addr, KEY, &small_body("acme/chat"));
        match r.status {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}: {}", r.text()),
        }
    }
    (ok, limited)
}

fn warm(s: &Sluice) {
    let r = chat_as(s.addr, WARM_KEY, &small_body("acme/chat"));
    assert_eq!(r.status, 200, "warm-up: {}", r.text());
}

fn redis_tail(redis: &RedisServer, timeout_ms: u64) -> String {
    format!(
        "redis:\n  url: {}\n  timeout_ms: {timeout_ms}\n  replicas: 2\n",
        redis.url()
    )
}

#[test]
fn two_replicas_share_one_sliding_window_limit() {
    const WINDOW_MS: u64 = 3000;
    let redis = RedisServer::start();
    let mock = Mock::start("{}");
    let cfg = limits_config(
        &mock.base_url(),
        &format!("  rate_limit_window_ms: {WINDOW_MS}\n"),
        "{requests_per_minute: 60}",
        &redis_tail(&redis, 250),
    );
    let a = Sluice::start(&cfg);
    let b = Sluice::start(&cfg);
    warm(&a);
    warm(&b);
    mock.reset();
    let checks_before = redis.successful_calls("evalsha");

    // Four clients alternate between the replicas for 1.5 windows: the first 60 are admitted
    // at once, the next 60 exactly as the first ones leave the window, no third batch.
    let results: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
    let start = Instant::now();
    let end = start + Duration::from_millis(WINDOW_MS * 3 / 2);
    let addrs = [a.addr, b.addr];
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let results = results.clone();
            std::thread::spawn(move || {
                let mut n = i;
                while Instant::now() < end {
                    let sent = Instant::now();
                    let r = chat_as(addrs[n % 2], KEY, &small_body("acme/chat"));
                    assert!(
                        r.status == 200 || r.status == 429,
                        "unexpected {}: {}",
                        r.status,
                        r.text()
                    );
                    results.lock().unwrap().push((sent, r.status));
                    n += 1;
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let results = results.lock().unwrap().clone();
    let mut ok: Vec<Instant> = results
        .iter()
        .filter(|(_, s)| *s == 200)
        .map(|(t, _)| *t)
        .collect();
    ok.sort();
    let limited = results.iter().filter(|(_, s)| *s == 429).count();
    eprintln!(
        "two replicas: {} requests, {} admitted, {} limited",
        results.len(),
        ok.len(),
        limited
    );
    assert!(
        (118..=122).contains(&ok.len()),
        "expected 120 ± 2 admitted over 1.5 windows, got {}",
        ok.len()
    );
    // Window occupancy is judged on the provider's arrival times (taken just after the
    // admission check). An arrival lags its admission by a scheduling delay that varies by a
    // few ms on a loaded 2-core machine, and admissions cluster exactly at window edges (every
    // freed slot is taken at once), so the measuring window is 50 ms shorter than the
    // limiter's: that measures the limiter, not the scheduler. The exact total above is the
    // strict check.
    let mut arrivals: Vec<u64> = mock
        .log()
        .iter()
        .filter_map(|r| r["received_at_ms"].as_u64())
        .collect();
    arrivals.sort_unstable();
    let busiest = arrivals
        .iter()
        .map(|t0| {
            arrivals
                .iter()
                .filter(|t| **t >= *t0 && **t < *t0 + WINDOW_MS - 50)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        (58..=62).contains(&busiest),
        "busiest window held {busiest} admitted requests (limit 60 ± 2)"
    );
    // Every admitted request reached the provider exactly once; every request got one answer.
    assert_eq!(mock.hits(), ok.len(), "admitted vs provider hits");
    // Redis really decided: one check script per request (admitted or limited), and the
    // shared log holds the last window's admissions (60 ± 2, as above), not 0.
    assert_eq!(
        redis.successful_calls("evalsha") - checks_before,
        results.len() as u64,
        "one EVALSHA per request"
    );
    let zcard = redis.int(&["ZCARD", LOG_KEY]);
    assert!((58..=62).contains(&zcard), "ZCARD {zcard}");
    assert_eq!(
        a.metric("sluice_rejected_total{reason=\"tenant_rpm\"}") as usize
            + b.metric("sluice_rejected_total{reason=\"tenant_rpm\"}") as usize,
        limited
    );
}

#[test]
fn killed_redis_fails_open_to_local_shares_and_recovers_without_restart() {
    let mut redis = RedisServer::start();
    let mock = Mock::start("{}");
    // A long window, so the local view of phase 1 is still warm in phase 2.
    let cfg = limits_config(
        &mock.base_url(),
        "  rate_limit_window_ms: 20000\n",
        "{requests_per_minute: 60}",
        &redis_tail(&redis, 250),
    );
    let a = Sluice::start(&cfg);
    let b = Sluice::start(&cfg);
    warm(&a);
    warm(&b);
    mock.reset();
    let mut admitted = 0;

    // Phase 1, shared: A alone gets the whole limit, and then B gets nothing.
    let (ok, limited) = burst(&a, 70);
    assert_eq!((ok, limited), (60, 10), "replica A with Redis");
    let (ok, _) = burst(&b, 5);
    assert_eq!(ok, 0, "replica B sees A's requests through Redis");
    admitted += 60;
    assert_eq!(redis.int(&["ZCARD", LOG_KEY]), 60);

    // Phase 2, Redis killed: each replica fails open to limit / replicas = 30 of its own.
    redis.kill();
    let (ok, _) = burst(&a, 5);
    assert_eq!(ok, 0, "A already used more than its local share of 30");
    let (ok_b, limited_b) = burst(&b, 40);
    assert!(
        (29..=32).contains(&ok_b),
        "B's local share is 30 (got {ok_b} admitted, {limited_b} limited)"
    );
    admitted += ok_b;
    for s in [&a, &b] {
        assert_eq!(
            log_count(s, "failing open"),
            1,
            "one outage, one log line:\n{}",
            s.log()
        );
        let errors = s.metric("sluice_ratelimit_backend_errors_total{kind=\"error\"}")
            + s.metric("sluice_ratelimit_backend_errors_total{kind=\"timeout\"}");
        assert_eq!(errors, 1.0, "the first failed check marks the backend down");
        assert!(s.metric("sluice_ratelimit_backend_errors_total{kind=\"unavailable\"}") >= 4.0);
    }

    // Phase 3, Redis back on the same port (empty): shared limits again, no restart.
    redis.restart();
    for s in [&a, &b] {
        assert!(
            eventually(Duration::from_secs(10), || log_count(
                s,
                "backend recovered"
            ) == 1),
            "recovery logged once:\n{}",
            s.log()
        );
    }
    let (ok, limited) = burst(&a, 70);
    assert_eq!(
        (ok, limited),
        (60, 10),
        "A gets the whole shared limit again (30 would mean still local)"
    );
    let (ok, _) = burst(&b, 5);
    assert_eq!(ok, 0, "B shares A's window again");
    admitted += 60;
    assert_eq!(
        redis.int(&["ZCARD", LOG_KEY]),
        60,
        "no request counted twice"
    );
    assert_eq!(mock.hits(), admitted, "no request lost or sent twice");
}

#[test]
fn slow_redis_fails_open_within_the_timeout_and_the_late_write_is_taken_back() {
    let redis = RedisServer::start();
    let mock = Mock::start("{}");
    let cfg = limits_config(
        &mock.base_url(),
        "",
        "{requests_per_minute: 1000}",
        &redis_tail(&redis, 100),
    );
    let a = Sluice::start(&cfg);
    warm(&a);
    assert_eq!(burst(&a, 5), (5, 0));
    assert_eq!(redis.int(&["ZCARD", LOG_KEY]), 5);

    // Redis stops answering for 3 s: every request still gets its answer quickly.
    assert_eq!(
        redis
            .command(&["CLIENT", "PAUSE", "3000", "ALL"])
            .as_deref(),
        Some("+OK")
    );
    let paused_at = Instant::now();
    for i in 0..10 {
        let t = Instant::now();
        let r = chat_as(a.addr, KEY, &small_body("acme/chat"));
        let took = t.elapsed();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        eprintln!("request {i} with Redis paused: {took:?}");
        if i == 0 {
            // Waited for the 100 ms timeout, then failed open at once.
            assert!(
                took >= Duration::from_millis(100) && took < Duration::from_millis(300),
                "request 0 took {took:?} (timeout_ms 100)"
            );
        } else {
            // The backend is marked down: no wait on Redis at all.
            assert!(
                took < Duration::from_millis(100),
                "request {i} took {took:?} (backend marked down)"
            );
        }
    }
    assert!(
        paused_at.elapsed() < Duration::from_millis(3000),
        "the test itself was too slow"
    );
    assert_eq!(
        a.metric("sluice_ratelimit_backend_errors_total{kind=\"timeout\"}"),
        1.0
    );
    assert_eq!(
        a.metric("sluice_ratelimit_backend_errors_total{kind=\"unavailable\"}"),
        9.0
    );
    assert!(
        eventually(Duration::from_secs(10), || log_count(
            &a,
            "backend recovered"
        ) == 1),
        "{}",
        a.log()
    );
    assert_eq!(log_count(&a, "failing open"), 1);
    // The timed-out check ran late inside Redis; its entry was removed again.
    assert!(
        eventually(Duration::from_secs(3), || redis.int(&["ZCARD", LOG_KEY])
            == 5),
        "ZCARD {}",
        redis.int(&["ZCARD", LOG_KEY])
    );
    assert_eq!(burst(&a, 1), (1, 0));
    assert_eq!(redis.int(&["ZCARD", LOG_KEY]), 6);
}

#[test]
fn token_usage_is_settled_in_redis_and_limits_the_next_request() {
    let redis = RedisServer::start();
    // 90 completion tokens and 1 prompt token per answer (the mock's `usage`).
    let mock = Mock::start(r#"{"tokens":95,"prompt_tokens":1}"#);
    let cfg = limits_config(
        &mock.base_url(),
        "",
        "{tokens_per_minute: 100, requests_per_minute: 100}",
        &redis_tail(&redis, 250),
    );
    let a = Sluice::start(&cfg);
    let b = Sluice::start(&cfg);
    // Estimated at 7 input tokens (o200k_base tokenizer).
    let body = small_body("acme/chat");
    let r = chat_as(a.addr, KEY, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("100"));
    assert_eq!(
        r.header("x-ratelimit-remaining-tokens"),
        Some("93"),
        "the estimate is charged at admission"
    );
    // The real usage (1 + 95) replaces the estimate, in Redis, shortly after the response.
    assert!(
        eventually(Duration::from_secs(3), || redis.int(&["GET", SUM_KEY])
            == 96),
        "token sum {}",
        redis.int(&["GET", SUM_KEY])
    );
    // 96 + this request's estimate > 100, seen by the other replica too.
    let r = chat_as(b.addr, KEY, &body);
    assert_eq!(r.status, 429, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "tenant_tpm");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.header("x-ratelimit-remaining-tokens"), Some("4"));
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("99"));
    assert_eq!(mock.hits(), 1);
}

/// The script itself, through the library: exact sliding window, retry-after from the oldest
/// entry, refunds, and settlement in place.
#[test]
fn sliding_window_log_script_is_exact() {
    use sluice::backpressure::redis::{RedisLimiter, Settle};
    use sluice::backpressure::tenant::LocalLimiter;

    let redis = RedisServer::start();
    let dir = TempDir::new("script");
    let path = dir.path().join("sluice.yaml");
    std::fs::write(
        &path,
        limits_config(
            "http://127.0.0.1:9/v1",
            "  rate_limit_window_ms: 1000\n",
            "{requests_per_minute: 5, tokens_per_minute: 1000}",
            &redis_tail(&redis, 500),
        )
        .replace("{listen}", "127.0.0.1:1")
        .replace("{admin}", "127.0.0.1:2"),
    )
    .unwrap();
    let config = sluice::config::Config::load(&path).expect("config");
    let settings = config.redis.clone().expect("redis section");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let local = LocalLimiter::new(config.server.rate_limit_window);
        let plan = local.plan(&config, "t", Some("acme/chat"));
        let backend = RedisLimiter::new(Some(&settings));
        let window = config.server.rate_limit_window;
        let mut members = Vec::new();
        for i in 0..5u64 {
            let m = backend.next_member();
            let v = backend
                .check(&settings, window, &plan, &m, 100)
                .await
                .unwrap();
            assert!(v.refused.is_none(), "request {i}: {v:?}");
            let s = v.status;
            assert_eq!(s.requests.unwrap().remaining, 4 - i);
            assert_eq!(s.tokens.unwrap().remaining, 1000 - 100 * (i + 1));
            members.push(m);
        }
        let first = Instant::now();
        let v = backend
            .check(&settings, window, &plan, &backend.next_member(), 100)
            .await
            .unwrap();
        let r = v.refused.expect("sixth request refused");
        assert_eq!((r.limit, r.used), (5, 5));
        assert!(r.retry_after <= Duration::from_millis(1000), "{r:?}");
        // Refund one admitted request: one place frees at once.
        assert_eq!(redis.int(&["GET", SUM_KEY]), 500);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let backend = Arc::new(backend);
        let task = {
            let b = backend.clone();
            tokio::spawn(async move { b.run(rx).await })
        };
        let item = plan.tenant.clone().unwrap();
        backend.enqueue(Settle {
            scopes: vec![(item.clone(), 100)],
            member: members[0].clone(),
            actual: None,
        });
        // Settle another from 100 estimated to 250 real tokens, in place.
        backend.enqueue(Settle {
            scopes: vec![(item, 100)],
            member: members[1].clone(),
            actual: Some(250),
        });
        let deadline = Instant::now() + Duration::from_secs(3);
        while redis.int(&["GET", SUM_KEY]) != 550 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            redis.int(&["GET", SUM_KEY]),
            550,
            "400 - 100 refunded + 150 settled"
        );
        assert_eq!(redis.int(&["ZCARD", LOG_KEY]), 4);
        let v = backend
            .check(&settings, window, &plan, &backend.next_member(), 100)
            .await
            .unwrap();
        assert!(v.refused.is_none(), "the refunded place is free: {v:?}");
        // Everything leaves the window one window after it entered.
        tokio::time::sleep(Duration::from_millis(1000).saturating_sub(first.elapsed())).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let v = backend
            .check(&settings, window, &plan, &backend.next_member(), 100)
            .await
            .unwrap();
        assert!(v.refused.is_none(), "{v:?}");
        assert!(redis.int(&["PTTL", LOG_KEY]) <= 2000, "keys expire");
        let _ = tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    });
}
