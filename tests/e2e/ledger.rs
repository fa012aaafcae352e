//! The durable usage ledger through a real Sluice: one record per request with the issue's
//! field names, read back by `sluice usage` (table/json/csv, summary) and by
//! `GET /admin/usage` (behind the admin token); SIGTERM writes every queued record;
//! `kill -9` loses at most the last flush interval; a full queue drops and counts; the
//! PostgreSQL backend against a real, throwaway PostgreSQL server shared by two replicas.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cancellation::chat_body;
use crate::harness::{eventually, free_port, get, post_json, Mock, Sluice, TempDir, KEY};
use crate::timeouts::config;

/// The admin token the tests configure (through `server.admin_token_env`).
const TOKEN: &str = "test-admin-token-0123456789";

/// Runs `sluice usage -c CONFIG ARGS` in `cwd`; stdout, or a panic with stderr.
pub(crate) fn usage(cwd: &Path, config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(cwd)
        .arg("usage")
        .arg("-c")
        .arg(config)
        .args(args)
        .output()
        .expect("run sluice usage");
    assert!(
        out.status.success(),
        "sluice usage {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `sluice usage --format json` (plus `args`) as records.
pub(crate) fn records(cwd: &Path, config: &Path, args: &[&str]) -> Vec<Value> {
    let mut a = vec!["--format", "json"];
    a.extend_from_slice(args);
    let text = usage(cwd, config, &a);
    serde_json::from_str::<Value>(&text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        .as_array()
        .cloned()
        .expect("one JSON array")
}

/// Polls the ledger until it holds `n` records (bounded: 15 s); returns them.
///
/// The deadline is checked against when a read *began*: a machine that stalls (CI) may
/// spend the whole wait inside one slow `sluice usage` run that began before the writer's
/// flush, and the last read must begin after the deadline, never only end after it.
pub(crate) fn wait_records(cwd: &Path, config: &Path, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let began = Instant::now();
        let r = records(cwd, config, &[]);
        if r.len() >= n || began > end {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn chat_with_id(sluice: &Sluice, id: &str, body: &str) -> u16 {
    post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[
            ("authorization", &format!("Bearer {KEY}")),
            ("x-request-id", id),
        ],
        body,
    )
    .status
}

fn by_id<'a>(recs: &'a [Value], id: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no record {id} in {recs:#?}"))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn every_request_leaves_one_record_read_by_sluice_usage_and_admin_usage() {
    let mock = Mock::start("{}");
    // No `ledger:` section: the default SQLite file in the working directory.
    let yaml = config(
        "  admin_token_env: SLUICE_TEST_ADMIN_TOKEN\n",
        &[("p1", &mock.base_url(), "")],
    );
    let sluice = Sluice::start_with_env(&yaml, &[("SLUICE_TEST_ADMIN_TOKEN", TOKEN)]);
    let dir = sluice.dir.path().to_path_buf();
    let cfg = sluice.config_path.clone();

    let stream_usage = chat_body(true, r#"{"tokens":3,"usage":true,"prompt_tokens":7}"#);
    assert_eq!(chat_with_id(&sluice, "req-stream", &stream_usage), 200);
    let plain = chat_body(false, r#"{"tokens":4,"prompt_tokens":9}"#);
    assert_eq!(chat_with_id(&sluice, "req-plain", &plain), 200);
    // A stream without the provider's usage (Sluice asks for it; this provider never sends
    // it): the output count is Sluice's estimate.
    let no_usage = chat_body(true, r#"{"tokens":2,"usage":false}"#);
    assert_eq!(chat_with_id(&sluice, "req-nousage", &no_usage), 200);
    let failing = chat_body(false, r#"{"status":500}"#);
    assert!(chat_with_id(&sluice, "req-fail", &failing) >= 500);
    // Not authenticated: access log only.
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-wrong-key-0000")],
        &plain,
    );
    assert_eq!(r.status, 401);

    let recs = wait_records(&dir, &cfg, 4);
    assert_eq!(recs.len(), 4, "{recs:#?}");
    assert!(
        dir.join("sluice-usage.db").exists(),
        "the default ledger file"
    );
    let fields: Vec<&str> = vec![
        "time",
        "request_id",
        "tenant",
        "virtual_key",
        "model",
        "provider",
        "upstream_model",
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "estimated",
        "cost_usd",
        "charge_usd",
        "status",
        "outcome",
        "ttft_ms",
        "duration_ms",
        "fallback_depth",
        "attempts",
        "ingress",
        "resumptions",
    ];
    for r in &recs {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = fields.clone();
        want.sort_unstable();
        assert_eq!(keys, want, "{r}");
        assert_eq!(r["tenant"], "t");
        assert_eq!(r["model"], "acme/chat");
        assert_eq!(r["ingress"], "chat");
        assert_eq!(r["resumptions"], 0, "nothing was resumed: {r}");
        assert!(
            r["virtual_key"].as_str().unwrap().starts_with("key-"),
            "{r}"
        );
        assert!(r["time"].as_str().unwrap().ends_with('Z'), "{r}");
        // Metadata only: no prompt or completion text anywhere.
        assert!(
            !r.to_string().contains("tok0") && !r.to_string().contains("\"hi\""),
            "{r}"
        );
    }
    let s = by_id(&recs, "req-stream");
    assert_eq!(
        (
            &s["provider"],
            &s["upstream_model"],
            &s["status"],
            &s["outcome"]
        ),
        (
            &Value::from("p1"),
            &Value::from("mock-small-v1"),
            &Value::from(200),
            &Value::from("ok")
        ),
        "{s}"
    );
    assert_eq!(
        (&s["input_tokens"], &s["output_tokens"]),
        (&Value::from(7), &Value::from(3))
    );
    assert_eq!(
        (&s["estimated"], &s["attempts"]),
        (&Value::from(false), &Value::from(1))
    );
    assert!(s["ttft_ms"].is_u64() && s["duration_ms"].is_u64(), "{s}");
    let p = by_id(&recs, "req-plain");
    assert_eq!(
        (&p["input_tokens"], &p["output_tokens"]),
        (&Value::from(9), &Value::from(4))
    );
    let n = by_id(&recs, "req-nousage");
    // "tok0 tok1 " is 5 o200k tokens (tok, 0, " tok", 1, " ").
    assert_eq!(
        (&n["output_tokens"], &n["estimated"]),
        (&Value::from(5), &Value::from(true)),
        "{n}"
    );
    let f = by_id(&recs, "req-fail");
    assert_eq!(f["outcome"], "upstream_error", "{f}");
    assert!(f["ttft_ms"].is_null(), "{f}");

    // Filters, summary, csv, table.
    assert!(records(&dir, &cfg, &["--tenant", "nobody"]).is_empty());
    assert!(records(&dir, &cfg, &["--since", "2999-01-01"]).is_empty());
    assert_eq!(
        records(
            &dir,
            &cfg,
            &["--since", "2020-01-01", "--model", "acme/chat"]
        )
        .len(),
        4
    );
    let sum = records(&dir, &cfg, &["--summary"]);
    assert_eq!(sum.len(), 1, "{sum:#?}");
    assert_eq!(
        (&sum[0]["tenant"], &sum[0]["model"], &sum[0]["requests"]),
        (
            &Value::from("t"),
            &Value::from("acme/chat"),
            &Value::from(4)
        )
    );
    let out_sum: u64 = recs
        .iter()
        .map(|r| r["output_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(sum[0]["output_tokens"], out_sum);
    assert_eq!(sum[0]["estimated_requests"], 1);
    let csv = usage(&dir, &cfg, &["--format", "csv"]);
    assert_eq!(csv.lines().next().unwrap(), fields.join(","));
    assert_eq!(csv.lines().count(), 5, "{csv}");
    let table = usage(&dir, &cfg, &["--summary"]);
    assert!(
        table.lines().next().unwrap().starts_with("tenant"),
        "{table}"
    );
    assert!(table.contains("acme/chat"), "{table}");

    // The admin listener: the token, then the same data.
    let r = get(sluice.admin, "/admin/usage", &[]);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = get(
        sluice.admin,
        "/admin/usage",
        &[("authorization", "Bearer wrong-token-0123456789")],
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let auth = format!("Bearer {TOKEN}");
    let r = get(sluice.admin, "/admin/usage", &[("authorization", &auth)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().as_array().unwrap().len(), 4);
    let r = get(
        sluice.admin,
        "/admin/usage?tenant=t&summary=1&since=2020-01-01",
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()[0]["requests"], 4);
    let r = get(
        sluice.admin,
        "/admin/usage?format=csv&model=none",
        &[("authorization", &auth)],
    );
    assert_eq!(
        (r.status, r.text().lines().count()),
        (200, 1),
        "{}",
        r.text()
    );
    let r = get(
        sluice.admin,
        "/admin/usage?since=yesterday",
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // Ledger settings are restart-only: a reload says so and keeps writing where it was.
    sluice.rewrite_config(&format!("{yaml}ledger:\n  path: elsewhere.db\n"));
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .log()
            .contains("ledger only take effect after a restart")),
        "{}",
        sluice.log()
    );
}

#[test]
fn without_an_admin_token_the_admin_listener_serves_no_usage_data() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    assert_eq!(sluice.chat(&chat_body(false, "{}")).status, 200);
    let r = get(
        sluice.admin,
        "/admin/usage",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("server.admin_token_env"), "{}", r.text());
}

/// A config with `ledger:` settings (`{dir}` is the Sluice's folder).
fn ledger_config(mock: &Mock, ledger: &str) -> String {
    format!(
        "{}ledger:\n{ledger}",
        config("", &[("p1", &mock.base_url(), "")])
    )
}

#[test]
fn a_request_over_a_tenant_limit_is_recorded_as_rejected() {
    let mock = Mock::start("{}");
    let yaml = config("", &[("p1", &mock.base_url(), "")])
        .replace("  t: {}\n", "  t: {requests_per_minute: 1}\n");
    let sluice = Sluice::start(&yaml);
    assert_eq!(
        chat_with_id(&sluice, "lim-ok", &chat_body(false, "{}")),
        200
    );
    assert_eq!(
        chat_with_id(&sluice, "lim-429", &chat_body(false, "{}")),
        429
    );
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 2);
    let r = by_id(&recs, "lim-429");
    assert_eq!(
        (&r["status"], &r["outcome"]),
        (&Value::from(429), &Value::from("rejected")),
        "{r}"
    );
    assert!(r["provider"].is_null() && r["attempts"] == 0, "{r}");
    assert_eq!(by_id(&recs, "lim-ok")["outcome"], "ok");
}

#[test]
fn a_disabled_ledger_creates_no_file_and_sluice_usage_says_so() {
    let mock = Mock::start("{}");
    let yaml = ledger_config(&mock, "  enabled: false\n").replace(
        "server:\n",
        "server:\n  admin_token_env: SLUICE_TEST_ADMIN_TOKEN\n",
    );
    let sluice = Sluice::start_with_env(&yaml, &[("SLUICE_TEST_ADMIN_TOKEN", TOKEN)]);
    let dir = sluice.dir.path().to_path_buf();
    let stream = chat_body(true, r#"{"tokens":3,"usage":true,"prompt_tokens":7}"#);
    assert_eq!(chat_with_id(&sluice, "off-stream", &stream), 200);
    let plain = chat_body(false, r#"{"tokens":4,"prompt_tokens":9}"#);
    assert_eq!(chat_with_id(&sluice, "off-plain", &plain), 200);
    // The usage is still metered: the access log carries it.
    assert!(
        eventually(Duration::from_secs(5), || {
            sluice
                .log()
                .lines()
                .any(|l| l.contains("request_id=off-plain") && l.contains("input_tokens=9"))
        }),
        "{}",
        sluice.log()
    );
    assert!(
        sluice.log().contains("usage ledger: disabled"),
        "{}",
        sluice.log()
    );
    let files: Vec<String> = std::fs::read_dir(&dir)
        .expect("read the Sluice's folder")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert!(
        !files.iter().any(|f| f.contains("usage")),
        "no ledger file may exist: {files:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(&dir)
        .args(["usage", "-c"])
        .arg(&sluice.config_path)
        .output()
        .expect("run sluice usage");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the usage ledger is disabled") && stderr.contains("ledger.enabled: false"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    let r = get(
        sluice.admin,
        "/admin/usage",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("ledger.enabled: false"), "{}", r.text());
    assert!(
        !dir.join("sluice-usage.db").exists(),
        "neither reading it creates the ledger"
    );
}

#[test]
fn sigterm_writes_every_queued_record() {
    let mock = Mock::start("{}");
    // The interval is far away: only the shutdown flush can write these.
    let mut sluice = Sluice::start(&ledger_config(
        &mock,
        "  path: usage.db\n  flush_interval_ms: 600000\n",
    ));
    let n = 25;
    for i in 0..n {
        assert_eq!(
            chat_with_id(&sluice, &format!("term-{i}"), &chat_body(false, "{}")),
            200
        );
    }
    // The access log (and the record) follows the response by a moment.
    assert!(
        eventually(Duration::from_secs(2), || sluice
            .gauge("sluice_ledger_queue_depth")
            == f64::from(n)),
        "{}",
        sluice.metrics()
    );
    let term = Instant::now();
    sluice.signal("TERM");
    let status = sluice
        .wait_exit(Duration::from_secs(10))
        .expect("exits after SIGTERM");
    eprintln!(
        "SIGTERM → exit with {n} queued records: {:?} ({status})",
        term.elapsed()
    );
    let recs = records(sluice.dir.path(), &sluice.config_path, &[]);
    assert_eq!(recs.len(), n as usize, "{}", sluice.log());
    for i in 0..n {
        by_id(&recs, &format!("term-{i}"));
    }
}

#[test]
fn kill_9_loses_at_most_the_last_flush_interval() {
    const INTERVAL_MS: u64 = 200;
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&ledger_config(
        &mock,
        &format!("  path: usage.db\n  flush_interval_ms: {INTERVAL_MS}\n"),
    ));
    // Requests one after the other for 0.6-0.8 s (so the kill falls at any point of the
    // flush cycle); each one's end is noted.
    let run = Duration::from_millis(600 + fastrand::u64(..INTERVAL_MS));
    let mut done: Vec<(String, Instant)> = Vec::new();
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < run && i < 3000 {
        let id = format!("k-{i}");
        assert_eq!(chat_with_id(&sluice, &id, &chat_body(false, "{}")), 200);
        done.push((id, Instant::now()));
        i += 1;
    }
    let flushes = sluice.metric("sluice_ledger_flush_seconds_count");
    let flush_s = sluice.metric("sluice_ledger_flush_seconds_sum");
    let written = sluice.metric("sluice_ledger_records_written_total");
    eprintln!(
        "ledger writer: {flushes} batches, {written} records, mean batch write {:.2} ms",
        1000.0 * flush_s / flushes.max(1.0)
    );
    let killed = Instant::now();
    sluice.kill();
    let recs = records(sluice.dir.path(), &sluice.config_path, &[]);
    let have: std::collections::HashSet<&str> = recs
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    let lost: Vec<Duration> = done
        .iter()
        .filter(|(id, _)| !have.contains(id.as_str()))
        .map(|(_, at)| killed - *at)
        .collect();
    let oldest = lost.iter().max().copied().unwrap_or_default();
    eprintln!(
        "kill -9 after {} requests: {} records kept, {} lost, the oldest lost finished {:?} before the kill (flush interval {INTERVAL_MS} ms)",
        done.len(),
        have.len(),
        lost.len(),
        oldest
    );
    assert!(
        done.len() > 20,
        "too few requests to measure: {}",
        done.len()
    );
    // The window: one interval plus the write of the batch in flight (measured here: 20-195
    // ms lost, batch writes of 2-90 ms); the slack covers a loaded CI machine.
    assert!(
        oldest <= Duration::from_millis(INTERVAL_MS + 250),
        "a record that finished {oldest:?} before the kill was lost"
    );
    assert!(have.len() + lost.len() == done.len() && have.len() > done.len() / 2);
}

#[test]
fn a_full_queue_drops_and_counts_without_blocking_requests() {
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&ledger_config(
        &mock,
        "  path: usage.db\n  flush_interval_ms: 600000\n  queue_capacity: 3\n",
    ));
    let started = Instant::now();
    for i in 0..8 {
        assert_eq!(
            chat_with_id(&sluice, &format!("q-{i}"), &chat_body(false, "{}")),
            200
        );
    }
    eprintln!(
        "8 requests with a full ledger queue: {:?}",
        started.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(2), || sluice
            .metric("sluice_ledger_dropped_total")
            == 5.0),
        "{}",
        sluice.metrics()
    );
    assert_eq!(sluice.gauge("sluice_ledger_queue_depth"), 3.0);
    assert!(
        eventually(Duration::from_secs(2), || sluice
            .log()
            .contains("usage ledger queue full")),
        "{}",
        sluice.log()
    );
    sluice.signal("TERM");
    sluice.wait_exit(Duration::from_secs(10)).expect("exits");
    let recs = records(sluice.dir.path(), &sluice.config_path, &[]);
    let ids: Vec<&str> = recs
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    // Three of the eight were queued, the rest dropped. Which three is the order of the
    // requests' logging phases, which runs after each answer is written: the client's next
    // request may be logged first (seen once in a parallel run as q-0, q-1, q-3).
    assert_eq!(ids.len(), 3, "{ids:?}");
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 3, "{ids:?}");
    assert!(
        ids.iter().all(|id| (0..8).any(|i| *id == format!("q-{i}"))),
        "{ids:?}"
    );
}

/// A throwaway PostgreSQL server: `initdb` into a temp dir, `postgres` on a free loopback
/// port, run as `nobody` when the tests run as root (PostgreSQL refuses root). Stopped on drop.
pub(crate) struct Postgres {
    child: Option<Child>,
    port: u16,
    bindir: PathBuf,
    root: bool,
    dir: TempDir,
}

/// The folder of PostgreSQL's server binaries (`initdb`, `postgres`): Debian's
/// `/usr/lib/postgresql/<version>/bin` (the newest), else the `PATH`.
fn postgres_bindir() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("postgres").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .find(|d| d.join("initdb").exists() && d.join("postgres").exists())
        })
    })
}

/// `cmd` as the unprivileged `nobody` when this process is root (via util-linux `setpriv`,
/// which execs, so the child's pid is the server's own).
fn unprivileged(bin: &Path, root: bool) -> Command {
    if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

impl Postgres {
    pub(crate) fn start() -> Postgres {
        let bindir = postgres_bindir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL server binaries (initdb, postgres) not found under /usr/lib/postgresql/*/bin or on PATH: run scripts/install-deps.sh (apt package postgresql){}",
                if std::env::var("CI").is_ok_and(|v| v == "true") { " [CI=true]" } else { "" }
            )
        });
        let root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        let dir = TempDir::new("postgres");
        let data = dir.path().join("data");
        if root {
            std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown");
        }
        let init = unprivileged(&bindir.join("initdb"), root)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "sluice",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .stdout(Stdio::null())
            .output()
            .expect("run initdb");
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let mut pg = Postgres {
            child: None,
            port: free_port(),
            bindir,
            root,
            dir,
        };
        pg.run();
        pg
    }

    /// Starts the server on the data folder and port (again, after [`Postgres::stop`]).
    fn run(&mut self) {
        let log = self
            .dir
            .path()
            .join(format!("postgres-{}.log", fastrand::u32(..)));
        let child = unprivileged(&self.bindir.join("postgres"), self.root)
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-k")
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let ready = eventually(Duration::from_secs(15), || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("ready to accept connections")
        });
        if !ready {
            self.stop();
            panic!(
                "postgres did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://sluice@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` with this server's `psql` (unaligned, tuples only); its output, or a panic
    /// with psql's errors.
    fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bindir.join("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.url(),
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGINT: PostgreSQL's fast shutdown.
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn a_postgres_ledger_from_before_resumptions_is_migrated_in_place() {
    let pg = Postgres::start();
    let mock = Mock::start("{}");
    let ledger = format!("  url: {}\n  flush_interval_ms: 50\n", pg.url());
    // A first start creates the current schema; taking `resumptions` away again and writing
    // a row the old way leaves what a Sluice before issue 32 left (schema version 1).
    let mut first = Sluice::start(&ledger_config(&mock, &ledger));
    first.kill();
    pg.psql(
        "ALTER TABLE usage_records DROP COLUMN resumptions; \
         UPDATE ledger_schema SET version = 1; \
         INSERT INTO usage_records (time_ms, request_id, tenant, virtual_key, model, provider, \
         upstream_model, input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, \
         reasoning_tokens, estimated, cost_usd, charge_usd, status, outcome, ttft_ms, \
         duration_ms, fallback_depth, attempts, ingress) VALUES (1796169000000, 'old-row', 't', \
         'key-1', 'acme/chat', 'p1', 'u', 1, 2, 0, 0, 0, false, 0, 0, 200, 'ok', 3, 4, 0, 1, 'chat')",
    );
    let mut sluice = Sluice::start(&ledger_config(&mock, &ledger));
    assert!(
        sluice.log().contains("schema migrated to version 2"),
        "{}",
        sluice.log()
    );
    assert_eq!(pg.psql("SELECT version FROM ledger_schema"), "2");
    assert_eq!(
        chat_with_id(&sluice, "new-row", &chat_body(false, r#"{"tokens":4}"#)),
        200
    );
    let dir = sluice.dir.path().to_path_buf();
    let recs = wait_records(&dir, &sluice.config_path, 2);
    assert_eq!(recs.len(), 2, "{recs:#?}\n{}", sluice.log());
    // The old row is kept, with 0 resumptions; the new one is written with the column.
    let old = by_id(&recs, "old-row");
    assert_eq!(
        (&old["resumptions"], &old["output_tokens"]),
        (&Value::from(0), &Value::from(2))
    );
    assert_eq!(by_id(&recs, "new-row")["resumptions"], 0);
    // The summary sums `resumptions` (a BIGINT sum, as every other count): a row as a
    // generation resumed twice leaves it.
    pg.psql(
        "INSERT INTO usage_records (time_ms, request_id, tenant, virtual_key, model, provider, \
         upstream_model, input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, \
         reasoning_tokens, estimated, cost_usd, charge_usd, status, outcome, ttft_ms, \
         duration_ms, fallback_depth, attempts, ingress, resumptions) VALUES (1796169001000, \
         'resumed-row', 't', 'key-1', 'acme/chat', 'p1', 'u', 1, 2, 0, 0, 0, false, 0, 0, 200, \
         'ok', 3, 4, 0, 1, 'chat', 2)",
    );
    let sum = records(&dir, &sluice.config_path, &["--summary"]);
    assert_eq!(sum.len(), 1, "{sum:#?}");
    assert_eq!(
        (&sum[0]["requests"], &sum[0]["resumptions"]),
        (&Value::from(3), &Value::from(2)),
        "{sum:#?}"
    );
    let csv = usage(&dir, &sluice.config_path, &["--summary", "--format", "csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].ends_with(",charge_usd,resumptions"), "{csv}");
    assert!(
        lines[1].starts_with("t,acme/chat,3,") && lines[1].ends_with(",2"),
        "{csv}"
    );
    let table = usage(&dir, &sluice.config_path, &["--summary"]);
    assert!(
        table.lines().next().unwrap().ends_with(" resumptions"),
        "{table}"
    );
    assert!(table.lines().nth(2).unwrap().ends_with(" 2"), "{table}");
    sluice.kill();
}

#[test]
fn two_replicas_share_one_postgres_ledger() {
    let started = Instant::now();
    let pg = Postgres::start();
    eprintln!("throwaway PostgreSQL ready in {:?}", started.elapsed());
    let mock = Mock::start("{}");
    // A password in the URL (trust auth ignores it) must never reach the log.
    let url = pg.url().replace("sluice@", "sluice:hunter2-secret@");
    let ledger = format!("  url: {url}\n  flush_interval_ms: 50\n");
    // Two replicas start against the same empty database: the schema is created once.
    let mut a = Sluice::start(&ledger_config(&mock, &ledger));
    let mut b = Sluice::start(&ledger_config(&mock, &ledger));
    for i in 0..3 {
        assert_eq!(
            chat_with_id(
                &a,
                &format!("pg-a-{i}"),
                &chat_body(true, r#"{"tokens":2,"usage":true,"prompt_tokens":5}"#)
            ),
            200
        );
        assert_eq!(
            chat_with_id(
                &b,
                &format!("pg-b-{i}"),
                &chat_body(false, r#"{"tokens":4}"#)
            ),
            200
        );
    }
    // b ends gracefully (flushes); a is read while it runs.
    b.signal("TERM");
    b.wait_exit(Duration::from_secs(10)).expect("b exits");
    let dir = a.dir.path().to_path_buf();
    let recs = wait_records(&dir, &a.config_path, 6);
    assert_eq!(recs.len(), 6, "{recs:#?}\n{}", a.log());
    let r = by_id(&recs, "pg-a-1");
    assert_eq!(
        (&r["input_tokens"], &r["output_tokens"], &r["provider"]),
        (&Value::from(5), &Value::from(2), &Value::from("p1"))
    );
    assert!(r["time"].as_str().unwrap().ends_with('Z'), "{r}");
    assert!(!by_id(&recs, "pg-b-2")["estimated"].as_bool().unwrap());
    let sum = records(&dir, &a.config_path, &["--summary"]);
    assert_eq!(sum.len(), 1, "{sum:#?}");
    assert_eq!(
        (&sum[0]["requests"], &sum[0]["output_tokens"]),
        (&Value::from(6), &Value::from(18))
    );
    assert_eq!(
        records(&dir, &a.config_path, &["--tenant", "t", "--limit", "2"]).len(),
        2
    );
    assert!(
        a.log()
            .contains("usage ledger: postgres://sluice:***@127.0.0.1"),
        "{}",
        a.log()
    );
    assert!(!a.log().contains("hunter2") && !b.log().contains("hunter2"));

    // PostgreSQL goes away: requests are still answered, the failed batch is kept, and it
    // is written once the server is back.
    let mut pg = pg;
    pg.stop();
    let errors = a.metric("sluice_ledger_write_errors_total");
    assert_eq!(chat_with_id(&a, "pg-down", &chat_body(false, "{}")), 200);
    assert!(
        eventually(Duration::from_secs(5), || a
            .metric("sluice_ledger_write_errors_total")
            > errors),
        "{}",
        a.log()
    );
    pg.run();
    let recs = wait_records(&dir, &a.config_path, 7);
    by_id(&recs, "pg-down");
    a.kill();
}
