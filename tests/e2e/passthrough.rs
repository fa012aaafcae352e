//! Passthrough routes on Pingora's native proxy path, against plain HTTP upstreams written
//! here (std::net, one thread per connection, keep-alive): round robin over two upstreams,
//! consistent hashing by a header that sticks, by the client IP only through trusted
//! proxies, the health check taking a failing and a dead upstream out of the rotation and
//! back, an SSE stream arriving event by event (the first
//! event before the upstream finished), the forwarding headers and the client's own
//! `Authorization` reaching the upstream, unmatched paths staying 404, the prefix redirect,
//! the body limit, a reload swapping the table, and no route taking the LLM API's paths.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{basic_config, eventually, get, post_json, Sluice, StreamReader};

/// What an upstream saw of one (non-health-check) request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    /// `/healthz` answers 503 while set.
    failing: AtomicBool,
    /// The second SSE event is sent once this is set.
    release: AtomicBool,
    /// Stop serving: close every connection, stop accepting.
    dead: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

/// A plain HTTP/1.1 upstream named `name`: `/healthz` (200, or 503 while failing), any path
/// containing `sse` (an SSE stream of two events, the second held until released), anything
/// else `200 name=<name> path=<path>`; every answer carries `x-upstream: <name>`.
struct Upstream {
    name: &'static str,
    addr: SocketAddr,
    state: Arc<State>,
}

impl Upstream {
    fn start(name: &'static str) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let up = Upstream {
            name,
            addr,
            state: Arc::new(State::default()),
        };
        up.serve(listener);
        up
    }

    fn serve(&self, listener: TcpListener) {
        let (name, state) = (self.name, self.state.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if state.dead.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                if let Ok(c) = conn.try_clone() {
                    state.conns.lock().expect("conns").push(c);
                }
                let state = state.clone();
                std::thread::spawn(move || connection(name, conn, &state));
            }
        });
    }

    /// Stops listening and closes every open connection (the port then refuses).
    fn kill(&self) {
        self.state.dead.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag and drops the listener.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for c in self.state.conns.lock().expect("conns").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        assert!(
            eventually(Duration::from_secs(5), || TcpStream::connect_timeout(
                &self.addr,
                Duration::from_millis(200)
            )
            .is_err()),
            "the killed upstream still accepts"
        );
    }

    /// Listens on the same port again.
    fn revive(&self) {
        let listener = (0..50)
            .find_map(|_| {
                TcpListener::bind(self.addr).ok().or_else(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                })
            })
            .expect("rebind the upstream's port");
        self.state.dead.store(false, Ordering::SeqCst);
        self.serve(listener);
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("seen").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.state.release.store(true, Ordering::SeqCst);
        if !self.state.dead.load(Ordering::SeqCst) {
            self.state.dead.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            for c in self.state.conns.lock().expect("conns").drain(..) {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Serves requests on one connection until it closes.
fn connection(name: &str, conn: TcpStream, state: &State) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut w = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || state.dead.load(Ordering::SeqCst) {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let upgrade = headers
            .iter()
            .any(|(k, v)| k == "upgrade" && v.eq_ignore_ascii_case("websocket"));
        if upgrade {
            state.seen.lock().expect("seen").push(Seen {
                path: path.clone(),
                headers,
            });
            echo(name, r, w);
            return;
        }
        let ok = if path == "/healthz" {
            let (status, text) = if state.failing.load(Ordering::SeqCst) {
                ("503 Service Unavailable", "failing")
            } else {
                ("200 OK", "ok")
            };
            write!(
                w,
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nx-upstream: {name}\r\n\r\n{text}",
                text.len()
            )
            .is_ok()
        } else {
            state.seen.lock().expect("seen").push(Seen {
                path: path.clone(),
                headers,
            });
            if path.contains("sse") {
                sse(name, &mut w, state)
            } else {
                let text = format!("name={name} path={path}");
                write!(
                    w,
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nx-upstream: {name}\r\n\r\n{text}",
                    text.len()
                )
                .is_ok()
            }
        };
        if !ok {
            return;
        }
    }
}

/// A WebSocket upgrade: `101`, then every byte that arrives is sent back (no framing: the
/// proxy only relays bytes).
fn echo(name: &str, mut r: BufReader<TcpStream>, mut w: TcpStream) {
    if write!(
        w,
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nx-upstream: {name}\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if w.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// A chunked SSE answer: `data: one`, then (once released) `data: two`, then the end.
fn sse(name: &str, w: &mut TcpStream, state: &State) -> bool {
    let chunk = |w: &mut TcpStream, data: &str| {
        write!(w, "{:x}\r\n{data}\r\n", data.len()).and_then(|()| w.flush())
    };
    let head = write!(
        w,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nx-upstream: {name}\r\n\r\n"
    );
    if head.is_err() || chunk(w, "data: one\n\n").is_err() {
        return false;
    }
    if !eventually(Duration::from_secs(10), || {
        state.release.load(Ordering::SeqCst)
    }) {
        return false;
    }
    chunk(w, "data: two\n\n").is_ok() && write!(w, "0\r\n\r\n").is_ok() && w.flush().is_ok()
}

/// The test config (no provider is reached: the LLM API needs none for these requests)
/// with `passthrough` appended as the top-level section.
fn config(passthrough: &str) -> String {
    format!(
        "{}passthrough:\n{passthrough}",
        basic_config("http://127.0.0.1:9/v1", "  watch_config: false\n")
    )
}

fn route(name: &str, prefix: &str, ups: &[&Upstream], extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|u| u.addr.to_string()).collect();
    format!(
        "  - name: {name}\n    path_prefix: {prefix}\n    upstreams: [{}]\n{extra}",
        list.join(", ")
    )
}

/// `GET` with a raw `Host` (the harness client always sends `host: 127.0.0.1`).
fn get_host(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn upstream_of(sluice: &Sluice, path: &str, headers: &[(&str, &str)]) -> String {
    let r = get(sluice.addr, path, headers);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.header("x-upstream").unwrap_or("-").to_string()
}

fn healthy_gauge(sluice: &Sluice, route: &str, up: &Upstream) -> Option<f64> {
    sluice.metric_opt(&format!(
        "sluice_passthrough_upstream_healthy{{route=\"{route}\",upstream=\"{}\"}}",
        up.addr
    ))
}

#[test]
fn round_robin_alternates_and_unmatched_paths_stay_404() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let sluice = Sluice::start(&config(&route(
        "ui",
        "/ui/",
        &[&a, &b],
        "    strategy: round_robin\n",
    )));
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..10 {
        *count
            .entry(upstream_of(&sluice, &format!("/ui/page{i}"), &[]))
            .or_default() += 1;
    }
    assert_eq!(count.get("a"), Some(&5), "{count:?}");
    assert_eq!(count.get("b"), Some(&5), "{count:?}");
    // The upstream got the path unchanged (no strip_prefix).
    assert!(a.seen().iter().all(|s| s.path.starts_with("/ui/page")));

    // Not a route, not the API: 404 (nothing proxied); the prefix without its slash: 301.
    for path in ["/", "/other/x", "/uix", "/ui.html"] {
        let r = get(sluice.addr, path, &[]);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }
    let r = get(sluice.addr, "/ui?x=1", &[]);
    assert_eq!(r.status, 301, "{}", r.text());
    assert_eq!(r.header("location"), Some("/ui/?x=1"));
    assert_eq!(a.seen().len() + b.seen().len(), 10);

    // Counted per route and status, access-logged with the route and upstream.
    assert_eq!(
        sluice.metric("sluice_passthrough_requests_total{route=\"ui\",status=\"200\"}"),
        10.0
    );
    assert!(
        eventually(Duration::from_secs(5), || sluice.log().contains(&format!(
            "route=ui upstream={} method=GET path=/ui/page",
            a.addr
        ))),
        "{}",
        sluice.log()
    );
}

#[test]
fn consistent_hashing_by_a_header_sticks() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let sluice = Sluice::start(&config(&route(
        "app",
        "/app/",
        &[&a, &b],
        "    strategy: consistent_hash\n    hash_header: x-user\n",
    )));
    let mut used = HashMap::new();
    for user in 0..16 {
        let id = format!("user-{user}");
        let first = upstream_of(&sluice, "/app/x", &[("x-user", &id)]);
        for _ in 0..3 {
            assert_eq!(
                upstream_of(&sluice, "/app/y", &[("x-user", &id)]),
                first,
                "{id} moved"
            );
        }
        *used.entry(first).or_insert(0) += 1;
    }
    assert_eq!(
        used.len(),
        2,
        "16 users all hashed to one upstream: {used:?}"
    );
}

#[test]
fn consistent_hashing_by_client_ip_believes_only_trusted_proxies() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let routes = route("app", "/app/", &[&a, &b], "    strategy: consistent_hash\n");
    // The test client (127.0.0.1) is a trusted proxy: the client is its X-Forwarded-For.
    let trusted = Sluice::start(&format!(
        "{}passthrough:\n{routes}",
        basic_config(
            "http://127.0.0.1:9/v1",
            "  watch_config: false\n  trusted_proxies: [127.0.0.1/32]\n"
        )
    ));
    let mut used = HashMap::new();
    for client in 1..=16 {
        let xff = format!("203.0.113.{client}");
        let first = upstream_of(&trusted, "/app/x", &[("x-forwarded-for", &xff)]);
        for _ in 0..3 {
            assert_eq!(
                upstream_of(&trusted, "/app/y", &[("x-forwarded-for", &xff)]),
                first,
                "{xff} moved"
            );
        }
        *used.entry(first).or_insert(0) += 1;
    }
    assert_eq!(
        used.len(),
        2,
        "16 clients behind the proxy all hashed to one upstream: {used:?}"
    );
    // The chain keeps the proxy's hop: the client it named, then the peer Sluice saw.
    let seen = a
        .seen()
        .into_iter()
        .chain(b.seen())
        .find(|s| {
            s.header("x-forwarded-for")
                .is_some_and(|v| v.starts_with("203.0.113.16,"))
        })
        .expect("an upstream saw client 16");
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("203.0.113.16, 127.0.0.1")
    );
    assert_eq!(
        seen.header("forwarded"),
        Some("for=127.0.0.1;host=127.0.0.1;proto=http")
    );

    // Not trusted (the default): the same claims are ignored, every request is the peer's
    // and lands on one upstream.
    let untrusted = Sluice::start(&config(&routes));
    let served: std::collections::HashSet<String> = (1..=16)
        .map(|c| {
            upstream_of(
                &untrusted,
                "/app/z",
                &[("x-forwarded-for", &format!("203.0.113.{c}"))],
            )
        })
        .collect();
    assert_eq!(
        served.len(),
        1,
        "a forged X-Forwarded-For moved the hash: {served:?}"
    );
}

#[test]
fn the_health_check_takes_failing_and_dead_upstreams_out_and_back() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let sluice = Sluice::start(&config(&route(
        "ui",
        "/ui/",
        &[&a, &b],
        "    health_check: {path: /healthz, interval_ms: 200, timeout_ms: 500}\n",
    )));
    let wait_gauge = |up: &Upstream, want: f64| {
        assert!(
            eventually(Duration::from_secs(10), || healthy_gauge(&sluice, "ui", up)
                == Some(want)),
            "{} never reported {want}: {}",
            up.name,
            sluice.metrics()
        );
    };
    wait_gauge(&a, 1.0);
    wait_gauge(&b, 1.0);

    // b's health check fails (it still answers requests): it leaves the rotation.
    b.state.failing.store(true, Ordering::SeqCst);
    wait_gauge(&b, 0.0);
    let before = b.seen().len();
    for i in 0..6 {
        assert_eq!(upstream_of(&sluice, &format!("/ui/{i}"), &[]), "a");
    }
    assert_eq!(b.seen().len(), before, "an unhealthy upstream got traffic");

    // It passes again: back in the rotation.
    b.state.failing.store(false, Ordering::SeqCst);
    wait_gauge(&b, 1.0);
    let served: Vec<String> = (0..6)
        .map(|i| upstream_of(&sluice, &format!("/ui/back{i}"), &[]))
        .collect();
    assert!(served.iter().any(|u| u == "b"), "{served:?}");

    // a dies (the port refuses): out of the rotation, and no request fails meanwhile.
    a.kill();
    for i in 0..6 {
        assert_eq!(upstream_of(&sluice, &format!("/ui/dead{i}"), &[]), "b");
    }
    wait_gauge(&a, 0.0);
    // It comes back on the same port: healthy again, and served.
    a.revive();
    wait_gauge(&a, 1.0);
    let served: Vec<String> = (0..6)
        .map(|i| upstream_of(&sluice, &format!("/ui/revived{i}"), &[]))
        .collect();
    assert!(served.iter().any(|u| u == "a"), "{served:?}");

    // Both failing: 503, nothing proxied.
    a.state.failing.store(true, Ordering::SeqCst);
    b.state.failing.store(true, Ordering::SeqCst);
    wait_gauge(&a, 0.0);
    wait_gauge(&b, 0.0);
    let r = get(sluice.addr, "/ui/none", &[]);
    assert_eq!(r.status, 503, "{}", r.text());
}

#[test]
fn an_sse_stream_passes_event_by_event() {
    let a = Upstream::start("a");
    let sluice = Sluice::start(&config(&route("ui", "/ui/", &[&a], "")));
    let mut s = StreamReader::open_raw(sluice.addr, "GET", "/ui/sse", &[], b"");
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("text/event-stream"));
    // The first event arrives while the upstream still holds the second one back.
    let first = s.read_until(b"data: one\n\n", Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&first).contains("data: one"));
    assert!(!String::from_utf8_lossy(&first).contains("data: two"));
    a.state.release.store(true, Ordering::SeqCst);
    let rest = s.read_to_end(Duration::from_secs(5));
    assert!(
        String::from_utf8_lossy(&rest).contains("data: two"),
        "{rest:?}"
    );
    assert!(s.is_done() && !s.is_cut());
}

#[test]
fn forwarding_headers_and_the_clients_own_auth_reach_the_upstream() {
    let a = Upstream::start("a");
    let sluice = Sluice::start(&config(&route(
        "ui",
        "/ui/",
        &[&a],
        "    strip_prefix: true\n    max_request_body_bytes: 64\n",
    )));
    let r = get(
        sluice.addr,
        "/ui/api/me?q=1",
        &[
            ("authorization", "Bearer ui-session-token"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "forged.example"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = a.seen().pop().expect("the upstream saw the request");
    assert_eq!(seen.path, "/api/me?q=1", "strip_prefix");
    assert_eq!(
        seen.header("authorization"),
        Some("Bearer ui-session-token")
    );
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(seen.header("x-forwarded-host"), Some("127.0.0.1"));
    assert_eq!(
        seen.header("forwarded"),
        Some("for=127.0.0.1;host=127.0.0.1;proto=http")
    );
    assert_eq!(seen.header("host"), Some("127.0.0.1"));

    // The route's body limit: 413 before anything is proxied.
    let before = a.seen().len();
    let r = post_json(sluice.addr, "/ui/upload", &[], &"x".repeat(200));
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(a.seen().len(), before);
    // A dot segment is refused, not proxied.
    let r = get(sluice.addr, "/ui/../v1/models", &[]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(a.seen().len(), before);
}

#[test]
fn a_reload_swaps_the_passthrough_table() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let sluice = Sluice::start(&config(&route("ui", "/ui/", &[&a], "")));
    assert_eq!(upstream_of(&sluice, "/ui/x", &[]), "a");
    assert_eq!(get(sluice.addr, "/app/x", &[]).status, 404);

    // A broken table (a route shadowing the API) is refused: the old one keeps serving.
    sluice.rewrite_config(&config(&route("ui", "/v1/", &[&a], "")));
    sluice.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .metric("sluice_config_reloads_total{result=\"error\"}")
            == 1.0),
        "{}",
        sluice.log()
    );
    assert!(sluice.log().contains("passthrough[0].path_prefix"));
    assert_eq!(upstream_of(&sluice, "/ui/x", &[]), "a");

    sluice.rewrite_config(&config(&route("app", "/app/", &[&b], "")));
    sluice.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .metric("sluice_config_reloads_total{result=\"ok\"}")
            == 1.0),
        "{}",
        sluice.log()
    );
    assert_eq!(upstream_of(&sluice, "/app/x", &[]), "b");
    assert_eq!(get(sluice.addr, "/ui/x", &[]).status, 404);
    // The removed route's health series went with it.
    assert_eq!(healthy_gauge(&sluice, "ui", &a), None);
    assert_eq!(healthy_gauge(&sluice, "app", &b), Some(1.0));
}

#[test]
fn no_route_takes_the_llm_api() {
    // At load: a prefix over /v1/ is refused, naming file, line and key.
    let a = Upstream::start("a");
    let dir = crate::harness::TempDir::new("passthrough-shadow");
    let file = dir.path().join("sluice.yaml");
    let yaml = config(&route("ui", "/v1/", &[&a], ""))
        .replace("{listen}", "127.0.0.1:18080")
        .replace("{admin}", "127.0.0.1:19090");
    std::fs::write(&file, &yaml).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("-t")
        .arg("-c")
        .arg(&file)
        .output()
        .expect("run sluice -t");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    let line = yaml
        .lines()
        .position(|l| l.contains("path_prefix: /v1/"))
        .expect("line")
        + 1;
    assert!(
        stderr.contains(&format!(
            "{}:{line}:5: passthrough[0].path_prefix: `/v1/` would shadow the LLM API",
            file.display()
        )),
        "{stderr}"
    );

    // At run time: a whole-host route leaves the API's paths to Sluice (a virtual key is
    // still needed), and serves the rest of its host.
    let sluice = Sluice::start(&config(&format!(
        "  - name: whole\n    host: ui.test\n    upstreams: [{}]\n",
        a.addr
    )));
    for path in ["/v1/models", "/models", "/v1/models/acme%2Fchat"] {
        let (status, text) = get_host(sluice.addr, "ui.test", path);
        assert_eq!(status, 401, "{path}: {text}");
    }
    assert!(a.seen().is_empty(), "{:?}", a.seen());
    let (status, text) = get_host(sluice.addr, "UI.test:8080", "/index.html");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("name=a path=/index.html"), "{text}");
    // Another host: nothing matches, 404.
    let (status, _) = get_host(sluice.addr, "other.test", "/index.html");
    assert_eq!(status, 404);
}

#[test]
fn a_websocket_upgrade_is_relayed_past_the_body_limit() {
    let a = Upstream::start("a");
    let sluice = Sluice::start(&config(&route(
        "ui",
        "/ui/",
        &[&a],
        "    max_request_body_bytes: 64\n",
    )));
    let mut s = TcpStream::connect_timeout(&sluice.addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET /ui/ws HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    .expect("write");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut status = String::new();
    r.read_line(&mut status).expect("status line");
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header");
        if h.trim_end().is_empty() {
            break;
        }
    }
    let seen = a.seen().pop().expect("the upstream saw the upgrade");
    assert_eq!(seen.header("upgrade"), Some("websocket"));
    assert_eq!(
        seen.header("sec-websocket-key"),
        Some("dGhlIHNhbXBsZSBub25jZQ==")
    );
    // More than the route's body limit, both ways: the upgraded bytes are no request body.
    let payload: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
    s.write_all(&payload).expect("write payload");
    let mut back = vec![0u8; payload.len()];
    r.read_exact(&mut back).expect("echo");
    assert_eq!(back, payload);
}
