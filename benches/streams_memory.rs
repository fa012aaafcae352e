//! Memory and scale benchmark (not a timed test): N concurrent slow streams (a token every
//! 5 s) held open through a release-built Sluice, and through nginx (when installed) in the
//! same run, on loopback; reports each proxy's RSS per open stream and its file
//! descriptors, with a short prompt and with a realistic 32 KiB one. Target (the performance
//! issue): Sluice's RSS per held stream at most nginx's, at 10,000 streams.
//!
//! ```text
//! cargo bench --bench streams_memory                      # N = 1000 and 10000
//! SLUICE_BENCH_STREAMS=100,2000 cargo bench --bench streams_memory
//! SLUICE_BENCH_PROMPT_BYTES=0,32768 SLUICE_BENCH_PROXIES=sluice,nginx cargo bench --bench streams_memory
//! ```
//!
//! `SLUICE_BENCH_PROMPT_BYTES` (default `0,32768`): the user message of each held stream's
//! request, bytes (0: the two-byte `hi`). `SLUICE_BENCH_PROXIES` (default `sluice,nginx`;
//! nginx is skipped with a note when `nginx` is not on the `PATH` or in `/usr/sbin`).
//! Two more proxies measure resumable streams (issue 32), with the same Sluice:
//! `sluice-resumable` opts every held stream in (`x-sluice-resumable: true`: event ids, a
//! registry entry and a replay buffer per stream), and `sluice-detached` opts in too, then
//! drops each client after its first event, so Sluice holds N generations in their grace
//! window (`server.resume_grace_ms: 600000` for the run) with no client attached; both
//! report the `sluice_resumable_streams` gauge (attached + detached), so that what is
//! measured is what is held. `SLUICE_BENCH_STREAMS=2000 SLUICE_BENCH_PROXIES=sluice,sluice-resumable,sluice-detached`
//! compares the three at one N. nginx
//! runs as the load bench runs it: `worker_processes auto`, `proxy_buffering off`,
//! `proxy_http_version 1.1`, upstream `keepalive 64`, access log off, its default
//! `client_body_buffer_size` (a 32 KiB body goes to a temp file, as nginx does by default),
//! `worker_connections` and `worker_rlimit_nofile` sized for N. Its RSS is the sum over the
//! master and its workers.
//!
//! Each N gets a fresh `sluice` and `sluice-mock-upstream` (built with the bench profile,
//! i.e. release optimizations). The bench raises its own and its children's
//! `RLIMIT_NOFILE`: the hard limit to 65,536 where it is lower and the bench may (root or
//! `CAP_SYS_RESOURCE`), then the soft limit to the hard one, by re-executing itself under
//! `sh -c 'ulimit -H -n 65536; ulimit -n …'`. Sluice runs on its **default** config: no
//! `max_concurrent_upstream_requests`, so its cap is the one it derives from that limit,
//! `(limit − 256) / 2` (32,640 at 65,536). Sluice needs two sockets per stream (downstream +
//! upstream), so N is capped at `(hard limit − 256) / 2`; the cap is reported when it
//! applies. Every
//! phase has a deadline; everything runs on 127.0.0.1.
//!
//! RSS per stream = (Sluice RSS with N streams held − RSS after a warm-up) / N, sampled for
//! 6 s while each stream waits for its next token. Investigation knobs:
//! `SLUICE_BENCH_SMAPS=1` prints Sluice's largest mappings;
//! `SLUICE_BENCH_WRAPPER="heaptrack -o /tmp/sluice"` runs Sluice under a heap profiler
//! (the RSS figures are then the wrapper's).
//!
//! Figures, and what changed them round by round, are in `benches/README.md` (latest: 39.0
//! KiB per held stream with a short prompt, 55.5-56.3 KiB with a 32 KiB one, nginx 17.7 /
//! 25.7, at 2,000 streams; the same at 9,800). Per heaptrack, most of a held stream is
//! Pingora's and tokio's per-connection state (the request future, the task, header maps,
//! the upstream body buffer) plus Sluice's stream future; a long prompt's body is released
//! at the commit, and what it still adds is glibc's heap keeping the freed buffers.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

#[path = "common/mod.rs"]
#[expect(
    dead_code,
    reason = "this bench starts nginx too: it starts its own processes"
)]
mod common;

use common::{free_port, rss_kib, TempDir, KEY};

/// Streams being opened at once during the ramp.
const RAMP_CONCURRENCY: usize = 200;
/// Deadline for opening all streams of one N.
const RAMP_DEADLINE: Duration = Duration::from_secs(240);
/// Fds Sluice needs besides its stream sockets (listeners, epoll, eventfds, log, ...).
const FD_RESERVE: u64 = 256;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this binary without it:
    // then a sanity pass with 20 streams (about 8 s), not the 10k-stream benchmark.
    let bench = std::env::args().any(|a| a == "--bench");
    if bench && std::env::var_os("SLUICE_BENCH_CHILD").is_none() {
        reexec_with_raised_nofile();
        return;
    }
    let default_n = if bench { "1000,10000" } else { "20" };
    let wanted: Vec<usize> = std::env::var("SLUICE_BENCH_STREAMS")
        .unwrap_or_else(|_| default_n.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let (soft, hard) = nofile_limits();
    println!("streams_memory: RLIMIT_NOFILE soft {soft} hard {hard}");
    let cap = usize::try_from(soft.saturating_sub(FD_RESERVE) / 2).unwrap_or(usize::MAX);
    let prompts: Vec<usize> = std::env::var("SLUICE_BENCH_PROMPT_BYTES")
        .unwrap_or_else(|_| "0,32768".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let nginx = nginx_exe();
    // The sanity pass runs the resumable variants too, so a change that breaks them fails
    // `cargo test --benches`.
    let default_proxies = if bench {
        "sluice,nginx"
    } else {
        "sluice,sluice-resumable,sluice-detached,nginx"
    };
    let proxies: Vec<Proxy> = std::env::var("SLUICE_BENCH_PROXIES")
        .unwrap_or_else(|_| default_proxies.into())
        .split(',')
        .filter_map(|p| match p.trim() {
            "sluice" => Some(Proxy::Sluice),
            "sluice-resumable" => Some(Proxy::SluiceResumable),
            "sluice-detached" => Some(Proxy::SluiceDetached),
            "nginx" if nginx.is_some() => Some(Proxy::Nginx),
            "nginx" => {
                println!(
                    "streams_memory: no nginx on the PATH or in /usr/sbin: its rows are skipped"
                );
                None
            }
            _ => None,
        })
        .collect();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for n in wanted {
        let target = n.min(cap);
        if target < n {
            println!(
                "N={n}: capped at {target} streams: a proxy needs 2 fds per stream and the hard \
                 RLIMIT_NOFILE is {hard} (raising it needs CAP_SYS_RESOURCE)"
            );
        }
        for &prompt in &prompts {
            for &proxy in &proxies {
                let what = format!("{} N={n} prompt={prompt} B", proxy.name());
                match run_one(proxy, nginx.as_deref(), target, prompt, soft) {
                    Ok(row) if row.open == target => rows.push((n, proxy, prompt, row)),
                    Ok(row) => {
                        failures.push(format!(
                            "{what}: only {} of {target} streams opened",
                            row.open
                        ));
                    }
                    Err(e) => failures.push(format!("{what}: failed: {e}")),
                }
            }
        }
    }
    println!();
    println!("| proxy | prompt | requested N | open streams | baseline RSS | RSS with streams | RSS per stream | fds | fds per stream |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, proxy, prompt, r) in &rows {
        println!(
            "| {} | {prompt} B | {n} | {} | {} KiB | {} KiB | {:.1} KiB | {} | {:.2} |",
            proxy.name(),
            r.open,
            r.base_rss_kib,
            r.rss_kib,
            r.per_stream_kib(),
            r.fds,
            (r.fds.saturating_sub(r.base_fds)) as f64 / r.open.max(1) as f64
        );
    }
    println!();
    print_comparisons(&rows);
    if !failures.is_empty() {
        eprintln!("streams_memory FAILED:\n{}", failures.join("\n"));
        std::process::exit(1);
    }
}

/// The ratios of the table: each resumable variant's RSS per held stream against the plain
/// stream's, and Sluice's against nginx's, per N and prompt.
fn print_comparisons(rows: &[(usize, Proxy, usize, Row)]) {
    for (n, proxy, prompt, r) in rows {
        if !matches!(proxy, Proxy::SluiceResumable | Proxy::SluiceDetached) {
            continue;
        }
        let plain = rows
            .iter()
            .find(|(m, p, b, _)| m == n && *p == Proxy::Sluice && b == prompt);
        if let Some((_, _, _, s)) = plain {
            let (a, b) = (r.per_stream_kib(), s.per_stream_kib());
            println!(
                "N={n}, prompt {prompt} B: RSS per held {} stream / plain = {a:.1} / {b:.1} KiB ({:+.1} KiB per stream); held {}",
                proxy.name(),
                a - b,
                r.held
                    .map_or_else(|| "-".to_string(), |(a, d)| format!("{a} attached, {d} detached"))
            );
        }
    }
    for (n, proxy, prompt, r) in rows {
        if *proxy != Proxy::Sluice {
            continue;
        }
        let ng = rows
            .iter()
            .find(|(m, p, b, _)| m == n && *p == Proxy::Nginx && b == prompt);
        if let Some((_, _, _, g)) = ng {
            let (a, b) = (r.per_stream_kib(), g.per_stream_kib());
            println!(
                "N={n}, prompt {prompt} B: RSS per held stream sluice / nginx = {a:.1} / {b:.1} KiB = {:.2} (target <= 1.00): {}",
                a / b.max(0.1),
                if a <= b { "MET" } else { "MISSED" }
            );
        }
    }
}

/// Re-runs this binary under `sh` with the hard fd limit raised to 65,536 where it is lower
/// and the process may (root, or `CAP_SYS_RESOURCE`), then the soft limit to the hard one.
fn reexec_with_raised_nofile() {
    let exe = std::env::current_exe().expect("current exe");
    let status = Command::new("sh")
        .arg("-c")
        .arg(
            "h=$(ulimit -H -n); \
             if [ \"$h\" != unlimited ] && [ \"$h\" -lt 65536 ]; then ulimit -H -n 65536 2>/dev/null; fi; \
             ulimit -n \"$(ulimit -H -n)\" 2>/dev/null; exec \"$0\" \"$@\"",
        )
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env("SLUICE_BENCH_CHILD", "1")
        .status()
        .expect("re-exec under sh");
    std::process::exit(status.code().unwrap_or(1));
}

fn nofile_limits() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(3)?.parse().ok()?, f.get(4)?.parse().ok()?))
        })
        .unwrap_or((1024, 1024))
}

struct Row {
    open: usize,
    base_rss_kib: u64,
    rss_kib: u64,
    base_fds: usize,
    fds: usize,
    /// Resumable streams Sluice held after sampling (`sluice_resumable_streams`: attached,
    /// detached), for the resumable variants.
    held: Option<(u64, u64)>,
}

impl Row {
    fn per_stream_kib(&self) -> f64 {
        self.rss_kib.saturating_sub(self.base_rss_kib) as f64 / self.open.max(1) as f64
    }
}

/// The proxy that holds the streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    Sluice,
    /// Sluice, every stream opted in to resumption (issue 32).
    SluiceResumable,
    /// Sluice, every stream opted in and its client gone after the first event: the
    /// generation held in its grace window.
    SluiceDetached,
    Nginx,
}

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Sluice => "sluice",
            Proxy::SluiceResumable => "sluice-resumable",
            Proxy::SluiceDetached => "sluice-detached",
            Proxy::Nginx => "nginx",
        }
    }

    /// The streams opt in to resumption.
    fn resumable(self) -> bool {
        matches!(self, Proxy::SluiceResumable | Proxy::SluiceDetached)
    }
}

/// nginx's binary, if there is one.
fn nginx_exe() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

struct Procs {
    /// The proxy (Sluice, or nginx's master; for RSS and fds, its workers are added).
    sluice: Child,
    mock: Child,
    /// Sluice's admin listener (`None` for nginx).
    admin: Option<std::net::SocketAddr>,
    _dir: TempDir,
}

impl Drop for Procs {
    fn drop(&mut self) {
        // The proxy runs in its own process group (with a wrapper, Sluice is the wrapper's
        // child; nginx's workers are its master's): SIGINT the group (Pingora's and
        // nginx's fast shutdown), then make sure.
        let _ = Command::new("kill")
            .args(["-INT", "--", &format!("-{}", self.sluice.id())])
            .status();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end && matches!(self.sluice.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.sluice.kill();
        let _ = self.sluice.wait();
        let _ = self.mock.kill();
        let _ = self.mock.wait();
    }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// `pid` and its children (nginx's master and workers; Sluice has none).
fn tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: the fields after the last `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(pid) {
                pids.push(child);
            }
        }
    }
    pids
}

/// RSS of `pid` and its children, KiB.
fn tree_rss_kib(pid: u32) -> u64 {
    let pids = tree(pid);
    rss_kib(pid) + pids[1..].iter().map(|&p| child_rss_kib(p)).sum::<u64>()
}

/// A child's RSS, 0 once it is gone (a worker that exited between the scan and the read).
fn child_rss_kib(pid: u32) -> u64 {
    common::vm_rss_kib(pid).unwrap_or(0)
}

/// Open fds of `pid` and its children.
fn tree_fds(pid: u32) -> usize {
    tree(pid).into_iter().map(fd_count).sum()
}

/// nginx's config: as the load bench's, access log off, sized for `n` streams.
fn nginx_conf(dir: &std::path::Path, port: u16, mock: &str, n: usize, nofile: u64) -> String {
    let d = dir.display();
    // As root the workers would switch to `nobody`; keep them as the invoking user.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let user = if root { "user root;\n" } else { "" };
    // Each stream is two connections (client, upstream), all of them in one worker at worst.
    let conns = (2 * n + 512).max(1024);
    format!(
        "{user}worker_processes auto;
worker_rlimit_nofile {nofile};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections {conns};
}}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream mock {{
        server {mock};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"
    )
}

fn start(
    proxy: Proxy,
    nginx: Option<&std::path::Path>,
    n: usize,
    nofile: u64,
) -> Result<(Procs, std::net::SocketAddr), String> {
    let (mock, mock_addr) = common::start_mock("{}")?;
    let dir = TempDir::new("memory")?;
    let port = free_port();
    let admin = free_port();
    // Detached generations stay held for the whole run.
    let grace = if proxy == Proxy::SluiceDetached {
        "  resume_grace_ms: 600000\n"
    } else {
        ""
    };
    let cfg = common::sluice_config(port, admin, &mock_addr, grace);
    if proxy == Proxy::Nginx {
        let exe = nginx.ok_or("no nginx")?;
        let conf = dir.0.join("nginx.conf");
        std::fs::write(&conf, nginx_conf(&dir.0, port, &mock_addr, n, nofile))
            .map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .process_group(0)
            .arg("-p")
            .arg(&dir.0)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.0.join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn nginx: {e}"))?;
        return wait_listening(
            Procs {
                sluice: child,
                mock,
                admin: None,
                _dir: dir,
            },
            port,
        );
    }
    let path = dir.0.join("sluice.yaml");
    std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
    // `SLUICE_BENCH_WRAPPER="heaptrack -o /tmp/sluice"` runs Sluice under a profiler (the
    // RSS figures are then the wrapper's, not Sluice's).
    let wrapper = std::env::var("SLUICE_BENCH_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut cmd = match words.next() {
        Some(w) => {
            let mut c = Command::new(w);
            c.args(words).arg(common::SLUICE);
            c
        }
        None => Command::new(common::SLUICE),
    };
    cmd.process_group(0);
    let sluice = common::spawn_sluice(cmd, &dir.0, &path)?;
    wait_listening(
        Procs {
            sluice,
            mock,
            admin: Some(format!("127.0.0.1:{admin}").parse().expect("addr")),
            _dir: dir,
        },
        port,
    )
}

/// Waits (20 s at most) until the proxy of `procs` accepts on `port`.
fn wait_listening(procs: Procs, port: u16) -> Result<(Procs, std::net::SocketAddr), String> {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    common::wait_listening(addr, Duration::from_secs(20))
        .map_err(|_| "the proxy did not start listening".to_string())?;
    Ok((procs, addr))
}

/// One sample of a Prometheus text metric from Sluice's admin listener (`GET /metrics`);
/// `None` when it cannot be read or the series is absent.
fn metric(admin: std::net::SocketAddr, sample: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(sample)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// `sluice_resumable_streams` from Sluice's admin listener: (attached, detached), an absent
/// series read as 0.
fn held_by_state(admin: std::net::SocketAddr) -> (u64, u64) {
    let get = |state: &str| {
        metric(
            admin,
            &format!("sluice_resumable_streams{{state=\"{state}\"}}"),
        )
        .unwrap_or(0.0) as u64
    };
    (get("attached"), get("detached"))
}

/// Opens one stream, reports it open once its head and first event arrived, then reads
/// (and discards) until told to stop; with `detach`, hangs up there instead (a resumable
/// stream's generation is then held without its client).
async fn hold_stream(
    addr: std::net::SocketAddr,
    request: Arc<Vec<u8>>,
    ramp: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
    detach: bool,
) {
    let permit = ramp.acquire_owned().await;
    let opened = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(&request).await.ok()?;
        let mut buf = vec![0u8; 1024];
        let mut seen = Vec::new();
        loop {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            seen.extend_from_slice(&buf[..n]);
            if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                if !seen.starts_with(b"HTTP/1.1 200") {
                    return None;
                }
                if seen.len() > i + 4 {
                    return Some((s, buf));
                }
            }
        }
    };
    let Some((mut s, mut buf)) = opened.await else {
        failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    buf.truncate(256);
    buf.shrink_to_fit();
    open.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    if detach {
        return;
    }
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = stop.changed() => return,
        }
    }
}

/// Holds `n` streams through `proxy`, each request with a `prompt`-byte user message.
#[expect(
    clippy::too_many_lines,
    reason = "one measured run in order: start, hold the streams, sample memory, stop"
)]
fn run_one(
    proxy: Proxy,
    nginx: Option<&std::path::Path>,
    n: usize,
    prompt: usize,
    nofile: u64,
) -> Result<Row, String> {
    let (mut procs, addr) = start(proxy, nginx, n, nofile)?;
    let pid = procs.sluice.id();
    let name = proxy.name();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let content = if prompt == 0 {
        "hi".to_string()
    } else {
        "lorem ipsum dolor sit amet "
            .repeat(prompt / 27 + 1)
            .chars()
            .take(prompt)
            .collect()
    };
    let body = format!(
        r#"{{"model":"acme/chat","stream":true,"messages":[{{"role":"user","content":"{content}"}}],"mock":{{"tokens":100,"token_delay_ms":5000}}}}"#
    );
    let opt_in = if proxy.resumable() {
        "x-sluice-resumable: true\r\n"
    } else {
        ""
    };
    let request = Arc::new(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\n{opt_in}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    );
    // Warm up: a few complete streams (pools, lazy statics, allocator arenas).
    rt.block_on(async {
        for _ in 0..20 {
            let warm = r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tokens":3}}"#;
            let req = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{warm}",
                warm.len()
            );
            if let Ok(mut s) = TcpStream::connect(addr).await {
                let _ = s.write_all(req.as_bytes()).await;
                let mut sink = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let base_rss_kib = tree_rss_kib(pid);
    let base_fds = tree_fds(pid);

    let open = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let ramp = Arc::new(Semaphore::new(RAMP_CONCURRENCY));
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            rt.spawn(hold_stream(
                addr,
                request.clone(),
                ramp.clone(),
                open.clone(),
                failed.clone(),
                stop_rx.clone(),
                proxy == Proxy::SluiceDetached,
            ))
        })
        .collect();
    let mut last_report = Instant::now();
    while open.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < n {
        if started.elapsed() > RAMP_DEADLINE {
            println!("{name} N={n}: ramp deadline reached");
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            println!(
                "{name} N={n}: {} open, {} failed after {:?}",
                open.load(Ordering::Relaxed),
                failed.load(Ordering::Relaxed),
                started.elapsed()
            );
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ramp_took = started.elapsed();
    if proxy == Proxy::SluiceDetached {
        // Measured once Sluice saw every client go (its detached gauge), 30 s at most.
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end
            && procs
                .admin
                .map(held_by_state)
                .is_some_and(|(_, d)| d < open.load(Ordering::Relaxed) as u64)
        {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Let the streams settle (each gets a token every 5 s), then sample for 6 s.
    let mut rss = 0;
    let mut fds = 0;
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        rss = rss.max(tree_rss_kib(pid));
        fds = fds.max(tree_fds(pid));
    }
    if let Ok(Some(status)) = procs.sluice.try_wait() {
        return Err(format!("{name} died ({status}) while holding the streams"));
    }
    let held = if proxy.resumable() {
        procs.admin.map(held_by_state)
    } else {
        None
    };
    let row = Row {
        open: open.load(Ordering::Relaxed),
        base_rss_kib,
        rss_kib: rss,
        base_fds,
        fds,
        held,
    };
    println!(
        "{name} N={n} prompt={prompt} B: {} streams open ({} failed) in {ramp_took:?}; RSS {} -> {} KiB = {:.1} KiB/stream; fds {} -> {}; mock RSS {} KiB",
        row.open,
        failed.load(Ordering::Relaxed),
        row.base_rss_kib,
        row.rss_kib,
        row.per_stream_kib(),
        row.base_fds,
        row.fds,
        rss_kib(procs.mock.id()),
    );
    if let Some((a, d)) = row.held {
        println!(
            "{name} N={n}: Sluice holds {a} attached and {d} detached resumable streams (sluice_resumable_streams)"
        );
        if proxy == Proxy::SluiceDetached && d < row.open as u64 {
            return Err(format!(
                "only {d} of {} generations detached and held",
                row.open
            ));
        }
    }
    if std::env::var_os("SLUICE_BENCH_SMAPS").is_some() {
        print_largest_mappings(pid);
    }
    let _ = stop_tx.send(true);
    rt.block_on(async {
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(procs);
    Ok(row)
}

/// Prints Sluice's largest memory mappings by RSS (`SLUICE_BENCH_SMAPS=1`), to see where
/// per-stream memory lives (heap arenas, thread stacks, ...).
fn print_largest_mappings(pid: u32) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut maps: Vec<(u64, String)> = Vec::new();
    let mut current = String::new();
    for line in smaps.lines() {
        if let Some(v) = line.strip_prefix("Rss:") {
            let kib = v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0);
            maps.push((kib, current.clone()));
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('-'))
        {
            current = line.to_string();
        }
    }
    maps.sort_by_key(|m| std::cmp::Reverse(m.0));
    for (kib, m) in maps.iter().take(12) {
        println!("  {kib:>8} KiB  {m}");
    }
}
