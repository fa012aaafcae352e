//! The edge rows of the load bench (issue 11: Sluice where nginx stood), each Sluice against
//! nginx in the same run, on the same mock:
//!
//! - **TLS** (`LOAD_TARGETS=tls`): the LLM API over TLS, HTTP/1.1 keep-alive (ALPN
//!   `http/1.1`). Both servers get the same certificate (a CA and an ECDSA P-256 leaf for
//!   `bench.test`, made with rcgen at start), and the client offers one protocol version, one
//!   cipher suite and one key-exchange group (TLS 1.3, `TLS13_AES_128_GCM_SHA256`, X25519), so
//!   both negotiate the same (checked once per target and printed).
//! - **HTTP/2** (`h2`): the same, ALPN `h2`; each client has its own connection and one
//!   stream at a time (the same closed loop as HTTP/1.1).
//! - **passthrough** (`passthrough`): plain HTTP/1.1 to Sluice's passthrough route
//!   `{name: bench, path_prefix: /p/, upstreams: [MOCK]}` (Pingora's native proxy path) and
//!   to nginx's `location /p/ {proxy_pass http://up; ...}` with `upstream up {server MOCK;
//!   keepalive 64;}`. The mock answers any path ending in `/chat/completions`: a ~2 KiB JSON
//!   body for the non-stream scenario ([`PASS_TOKENS`] tokens) and the usual SSE stream.
//!   `direct-pass` is the mock itself with the same requests (the baseline of "added").
//!
//! The TLS and HTTP/2 rows' baseline is `direct` (the mock over plain HTTP): their "added"
//! includes the TLS work. One Sluice (`sluice-edge`: TLS listener, passthrough route) and one
//! nginx (`nginx-edge`: a TLS server for h1 and h2, a plain server for `/p/`) serve all three.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::crypto::ring as ring_provider;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::{
    bad, find_program, loopback, nginx_pids, sluice_yaml, start_nginx_with, start_sluice,
    wait_listening, Dial, Opts, Proc, Reply, Request, Results, Scenario, Target, KEY, TAIL,
};

/// The server name of the bench certificate (SNI and `:authority`).
const SNI: &str = "bench.test";
/// The passthrough route's request path.
const PASS_PATH: &str = "/p/v1/chat/completions";
/// Tokens of the passthrough non-stream answer: the mock's body is ~930 B at 100 tokens and
/// grows 7 B per token, so ~2 KiB (2,054 B with the bench's request).
const PASS_TOKENS: u64 = 260;
/// Every target this module adds.
const NAMES: [&str; 7] = [
    "direct-pass",
    "sluice-pass",
    "nginx-pass",
    "sluice-tls",
    "nginx-tls",
    "sluice-h2",
    "nginx-h2",
];

/// Whether `name` is one of this module's targets (they have their own table).
pub(super) fn is_edge(name: &str) -> bool {
    NAMES.contains(&name)
}

// ---------------------------------------------------------------------------------------
// Transport: TCP or TLS, and HTTP/2
// ---------------------------------------------------------------------------------------

/// A client connection's byte stream: plain TCP or TLS over it.
pub(super) enum Io {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The TLS client config of every TLS row: trusts `ca` only, offers `alpn`, TLS 1.3 with
/// `TLS13_AES_128_GCM_SHA256` and X25519 only (so that every server negotiates the same).
fn client_config(ca: &CertificateDer<'static>, alpn: &[u8]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).expect("bench CA as a root");
    let mut provider = ring_provider::default_provider();
    provider.cipher_suites = vec![ring_provider::cipher_suite::TLS13_AES_128_GCM_SHA256];
    provider.kx_groups = vec![ring_provider::kx_group::X25519];
    let mut cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3 with the ring provider")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}

/// The TLS handshake with SNI [`SNI`] over `tcp`.
pub(super) async fn tls_connect(
    tcp: TcpStream,
    cfg: &Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(SNI).map_err(|e| bad(e.to_string()))?;
    TlsConnector::from(cfg.clone()).connect(name, tcp).await
}

fn h2_error(e: h2::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// An HTTP/2 client connection over TLS (its driver is a spawned task).
pub(super) struct H2Conn {
    send: h2::client::SendRequest<Bytes>,
}

impl H2Conn {
    /// Connects, shakes hands (TLS with ALPN `h2`, then HTTP/2) and spawns the driver.
    pub(super) async fn open(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> std::io::Result<H2Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = tls_connect(tcp, cfg).await?;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(bad("the server did not choose ALPN h2"));
        }
        let (send, conn) = h2::client::handshake(tls).await.map_err(h2_error)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2Conn { send })
    }

    /// One POST of `req` on a new stream; reads the whole response (until END_STREAM).
    pub(super) async fn exchange(&mut self, req: &Request) -> std::io::Result<Reply> {
        let head = http::Request::builder()
            .method("POST")
            .uri(format!("https://{SNI}{}", req.path))
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(())
            .map_err(|e| bad(e.to_string()))?;
        let mut send = self.send.clone().ready().await.map_err(h2_error)?;
        let (resp, mut body_out) = send.send_request(head, false).map_err(h2_error)?;
        body_out
            .send_data(req.body.clone(), true)
            .map_err(h2_error)?;
        let sent = Instant::now();
        let resp = resp.await.map_err(h2_error)?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut first_byte = None;
        let mut body_bytes = 0;
        let mut tail = Vec::with_capacity(2 * TAIL);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_error)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if chunk.is_empty() {
                continue;
            }
            first_byte.get_or_insert_with(Instant::now);
            body_bytes += chunk.len();
            tail.extend_from_slice(&chunk[chunk.len().saturating_sub(TAIL)..]);
            if tail.len() > TAIL {
                tail.drain(..tail.len() - TAIL);
            }
        }
        Ok(Reply {
            status,
            ttfb: first_byte.map(|t: Instant| t.saturating_duration_since(sent)),
            keep_alive: true,
            body_bytes,
            // `data()` returned `None`: the stream ended with END_STREAM (a reset is an
            // error above), the HTTP/2 counterpart of a chunked body's last chunk.
            chunked: true,
            tail,
        })
    }
}

/// The request a phase sends to `t`: the passthrough path (and, non-stream, the ~2 KiB
/// answer asked of the mock in the body) for a passthrough target, else the chat endpoint.
pub(super) fn request_for(t: &Target, scenario: Scenario, body: &str) -> Request {
    if !t.pass {
        return Request::chat("/v1/chat/completions", body);
    }
    if scenario == Scenario::Unary {
        let open = body.strip_suffix('}').unwrap_or(body);
        let body = format!("{open},\"mock\":{{\"tokens\":{PASS_TOKENS},\"token_delay_ms\":0}}}}");
        return Request::chat(PASS_PATH, &body);
    }
    Request::chat(PASS_PATH, body)
}

// ---------------------------------------------------------------------------------------
// Certificates and the two servers
// ---------------------------------------------------------------------------------------

/// The bench certificate's files and the trust anchor of the client configs.
struct Certs {
    cert: PathBuf,
    key: PathBuf,
    ca: CertificateDer<'static>,
}

/// A fresh CA and a leaf for [`SNI`] (ECDSA P-256), written as `dir/tls/bench.{pem,key}`.
fn make_certs(dir: &Path) -> Certs {
    let tdir = dir.join("tls");
    std::fs::create_dir_all(&tdir).expect("tls dir");
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Sluice load bench CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("leaf key");
    let mut leaf = CertificateParams::new(vec![SNI.to_string()]).expect("leaf params");
    leaf.distinguished_name.push(DnType::CommonName, SNI);
    let cert = leaf.signed_by(&key, &issuer).expect("leaf cert");
    let (cert_path, key_path) = (tdir.join("bench.pem"), tdir.join("bench.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    Certs {
        cert: cert_path,
        key: key_path,
        ca: ca_cert.der().clone(),
    }
}

/// The edge Sluice: the load bench's config plus a TLS listener on `tls` with the bench
/// certificate and the passthrough route `bench`.
fn sluice_edge_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    tls: SocketAddr,
    threads: usize,
    mock: SocketAddr,
    certs: &Certs,
) -> String {
    let yaml = sluice_yaml(
        listen,
        admin,
        threads,
        mock,
        "{}",
        &format!("passthrough:\n  - name: bench\n    path_prefix: /p/\n    upstreams: [{mock}]\n"),
    );
    yaml.replacen(
        "tenants:\n",
        &format!(
            "  tls_listen: {tls}\n  tls:\n    certificates:\n      - {{cert_path: {}, key_path: {}, server_names: [{SNI}]}}\ntenants:\n",
            certs.cert.display(),
            certs.key.display()
        ),
        1,
    )
}

/// The edge nginx: the load bench's nginx settings, a TLS server on `tls` (h1 and h2, the
/// bench certificate, TLS 1.2/1.3) in front of the mock as for the LLM rows, and a plain
/// server on `pass` with the passthrough location, forwarding headers as Sluice sets them.
fn nginx_edge_conf(
    ndir: &Path,
    pass: SocketAddr,
    tls: SocketAddr,
    mock: SocketAddr,
    workers: &str,
    certs: &Certs,
) -> String {
    let d = ndir.display();
    let user = if super::is_root() { "user root;\n" } else { "" };
    let (cert, key) = (certs.cert.display(), certs.key.display());
    format!(
        "{user}worker_processes {workers};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream mock {{
        server {mock};
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}
    upstream up {{
        server {mock};
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}
    server {{
        listen {tls} ssl http2 reuseport;
        server_name {SNI};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }}
    }}
    server {{
        listen {pass} reuseport;
        location /p/ {{
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $host;
            proxy_buffering off;
        }}
    }}
}}
"
    )
}

/// The cipher suite and key-exchange group one handshake with `addr` negotiates (up to 30 s:
/// a test-build Sluice on a loaded machine may still be loading its tokenizer, ~6 s, when the
/// first handshake arrives).
fn negotiated(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let tls = tokio::time::timeout(Duration::from_secs(30), tls_connect(tcp, cfg))
            .await
            .map_err(|_| "handshake timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let conn = tls.get_ref().1;
        Ok(format!(
            "{:?} {:?}",
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            conn.negotiated_key_exchange_group().map(|g| g.name())
        ))
    })
}

/// Adds the targets `LOAD_TARGETS` asks for (`tls`, `h2`, `passthrough`): starts the edge
/// Sluice and, when nginx is installed and `o.sanity` is off, the edge nginx. Notes what
/// was skipped and the negotiated cipher suite of each TLS server (and a mismatch).
#[expect(
    clippy::too_many_lines,
    reason = "the nginx and the Sluice configs of a row are written side by side, field for field"
)]
pub(super) fn start(
    dir: &Path,
    o: &Opts,
    mock: SocketAddr,
    procs: &mut Vec<Proc>,
    targets: &mut Vec<Target>,
    notes: &mut Vec<String>,
) {
    let (tls, h2, pass) = (
        o.targets.iter().any(|t| t == "tls"),
        o.targets.iter().any(|t| t == "h2"),
        o.targets.iter().any(|t| t == "passthrough"),
    );
    if !(tls || h2 || pass) {
        return;
    }
    let certs = make_certs(dir);
    let h1_cfg = client_config(&certs.ca, b"http/1.1");
    let h2_cfg = client_config(&certs.ca, b"h2");
    let target = |name, addr, dial, pass, pids: &[u32]| Target {
        name,
        addr,
        dial,
        pass,
        redis: None,
        pids: pids.to_vec(),
        helper_pids: Vec::new(),
    };
    // Each server's targets, in pairs: the same scenario runs them back to back.
    let mut sluice: Vec<Target> = Vec::new();
    let mut nginx: Vec<Target> = Vec::new();

    let tls_port = loopback(super::free_port());
    let threads = o.sluice_threads;
    let (mut p, listen) = start_sluice(dir, "sluice-edge", &|l, a| {
        sluice_edge_yaml(l, a, tls_port, threads, mock, &certs)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        wait_listening(&mut p, &[tls_port], Duration::from_secs(10)),
        "the edge Sluice does not listen on its TLS port {tls_port}"
    );
    let pid = [p.child.id()];
    procs.push(p);
    if pass {
        sluice.push(target("sluice-pass", listen, Dial::Plain, true, &pid));
    }
    if tls {
        sluice.push(target(
            "sluice-tls",
            tls_port,
            Dial::Tls(h1_cfg.clone()),
            false,
            &pid,
        ));
    }
    if h2 {
        sluice.push(target(
            "sluice-h2",
            tls_port,
            Dial::H2(h2_cfg.clone()),
            false,
            &pid,
        ));
    }

    match find_program("nginx") {
        None => notes.push("edge: nginx not installed; the nginx edge rows are skipped".into()),
        Some(_) if o.sanity => {}
        Some(exe) => {
            let nginx_tls = loopback(super::free_port());
            let started = start_nginx_with(dir, "nginx-edge", &exe, &|ndir, listen| {
                nginx_edge_conf(ndir, listen, nginx_tls, mock, &o.nginx_workers, &certs)
            });
            match started {
                Err(e) => notes.push(format!("edge: nginx: {e}; rows skipped")),
                Ok((p, pass_addr)) => {
                    let want = o.nginx_workers.parse::<usize>().unwrap_or_else(|_| {
                        std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
                    });
                    let pids = nginx_pids(p.child.id(), want).unwrap_or_else(|e| panic!("{e}"));
                    procs.push(p);
                    if pass {
                        nginx.push(target("nginx-pass", pass_addr, Dial::Plain, true, &pids));
                    }
                    if tls {
                        nginx.push(target(
                            "nginx-tls",
                            nginx_tls,
                            Dial::Tls(h1_cfg.clone()),
                            false,
                            &pids,
                        ));
                    }
                    if h2 {
                        nginx.push(target(
                            "nginx-h2",
                            nginx_tls,
                            Dial::H2(h2_cfg.clone()),
                            false,
                            &pids,
                        ));
                    }
                }
            }
        }
    }

    if tls || h2 {
        let mut seen = Vec::new();
        for (who, addr) in [
            ("sluice", Some(tls_port)),
            ("nginx", nginx.iter().find(|t| !t.pass).map(|t| t.addr)),
        ] {
            let Some(addr) = addr else { continue };
            match negotiated(addr, &h1_cfg) {
                Ok(s) => {
                    notes.push(format!("edge: {who} over TLS negotiates {s}"));
                    seen.push(s);
                }
                Err(e) => panic!("edge: no TLS handshake with {who} at {addr}: {e}"),
            }
        }
        if seen.windows(2).any(|w| w[0] != w[1]) {
            notes.push("edge: MISMATCH: Sluice and nginx negotiated different TLS parameters, the TLS rows are not like with like".into());
        }
    }
    if pass {
        targets.push(target("direct-pass", mock, Dial::Plain, true, &[]));
    }
    // Interleave: sluice-pass, nginx-pass, sluice-tls, nginx-tls, ...
    let mut nginx = nginx.into_iter().peekable();
    for s in sluice {
        let peer = s.name.replacen("sluice", "nginx", 1);
        targets.push(s);
        if nginx.peek().is_some_and(|n| n.name == peer) {
            targets.extend(nginx.next());
        }
    }
    targets.extend(nginx);
}

// ---------------------------------------------------------------------------------------
// The edge table
// ---------------------------------------------------------------------------------------

/// The median over rounds of `f` of `target`'s phases in `s`.
fn value(
    results: &Results,
    s: Scenario,
    target: &str,
    f: &dyn Fn(&super::PhaseResult) -> Option<f64>,
) -> Option<f64> {
    results
        .iter()
        .find(|((sc, t), _)| *sc == s && *t == target)
        .and_then(|(_, rs)| super::median(rs.iter().filter_map(f).collect()))
}

/// Prints one table per comparison that ran (TLS, HTTP/2, passthrough): Sluice, nginx and
/// Sluice / nginx for throughput; for latencies each value with its added part (over the
/// baseline) and the ratio of the added parts (`-` unless both are above 0: a proxy can come
/// out below its baseline in a noisy run, and a ratio of such parts means nothing).
pub(super) fn print(results: &Results, o: &Opts) {
    let groups = [
        (
            "TLS (HTTP/1.1 keep-alive)",
            "sluice-tls",
            "nginx-tls",
            "direct",
        ),
        ("HTTP/2 over TLS", "sluice-h2", "nginx-h2", "direct"),
        (
            "passthrough (plain HTTP/1.1)",
            "sluice-pass",
            "nginx-pass",
            "direct-pass",
        ),
    ];
    for (label, s, n, base) in groups {
        if !results.keys().any(|(_, t)| *t == s) {
            continue;
        }
        println!();
        println!("Edge: {label}; baseline `{base}`; ratio = sluice / nginx (for latencies: of the added parts)");
        println!();
        println!("| scenario | baseline | sluice | added | nginx | added | ratio |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let rps = |r: &super::PhaseResult| Some(r.rps);
        let fmt = |v: Option<f64>, p: usize| super::fmt_opt(v, p);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b.abs() > f64::EPSILON => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let unary = if s == "sluice-pass" {
            "~2 KiB non-stream req/s".to_string()
        } else {
            "non-stream req/s".to_string()
        };
        let stream = format!("{}-token SSE streams/s", o.stream_tokens);
        for (sc, what) in [(Scenario::Unary, unary), (Scenario::Stream, stream)] {
            let (b, sv, nv) = (
                value(results, sc, base, &rps),
                value(results, sc, s, &rps),
                value(results, sc, n, &rps),
            );
            if sv.is_none() {
                continue;
            }
            println!(
                "| {what} | {} | {} | | {} | | {} |",
                fmt(b, 0),
                fmt(sv, 0),
                fmt(nv, 0),
                ratio(sv, nv)
            );
        }
        let lat: [(Scenario, &str, f64, bool); 4] = [
            (Scenario::Unary, "non-stream latency p50 ms", 0.50, false),
            (Scenario::Unary, "non-stream latency p99 ms", 0.99, false),
            (Scenario::Ttfb, "TTFB (first SSE byte) p50 ms", 0.50, true),
            (Scenario::Ttfb, "TTFB (first SSE byte) p99 ms", 0.99, true),
        ];
        for (sc, what, q, ttfb) in lat {
            let f = move |r: &super::PhaseResult| if ttfb { r.pct_ms(q) } else { r.latency_ms(q) };
            let (b, sv, nv) = (
                value(results, sc, base, &f),
                value(results, sc, s, &f),
                value(results, sc, n, &f),
            );
            if sv.is_none() {
                continue;
            }
            let added = |v: Option<f64>| v.zip(b).map(|(v, b)| v - b);
            let what = if sc == Scenario::Ttfb {
                format!("{what}, {} streams", o.ttfb_clients)
            } else {
                what.to_string()
            };
            println!(
                "| {what} | {} | {} | {} | {} | {} | {} |",
                fmt(b, 3),
                fmt(sv, 3),
                super::fmt_added(sv, b, 3),
                fmt(nv, 3),
                super::fmt_added(nv, b, 3),
                ratio(
                    added(sv).filter(|a| *a > 0.0),
                    added(nv).filter(|a| *a > 0.0)
                ),
            );
        }
    }
}
