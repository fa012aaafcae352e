//! The closed-loop load generator of the replicas bench: keep-alive HTTP/1.1 connections over
//! loopback TCP, one request at a time per client, every status and latency recorded.
//! (A plain-TCP, whole-body subset of the load bench's client in `benches/load.rs`.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upper bound of one request (a stuck replica fails the request, not the bench).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body a reply keeps (the bench's answers are well under 2 KiB).
const MAX_BODY: usize = 1 << 20;

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// One response: its status and whole body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    keep_alive: bool,
}

/// A keep-alive HTTP/1.1 connection with its read buffer.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    async fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
        })
    }

    /// Reads more bytes; EOF is an error (mid-response).
    async fn fill(&mut self) -> std::io::Result<()> {
        if self.buf.capacity() - self.buf.len() < 4 * 1024 {
            self.buf.reserve(16 * 1024);
        }
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        Ok(())
    }

    /// Sends `req` and reads the whole response (Content-Length or chunked).
    async fn exchange(&mut self, req: &[u8]) -> std::io::Result<Reply> {
        if !self.buf.is_empty() {
            return Err(bad("unexpected bytes before the response"));
        }
        self.stream.write_all(req).await?;
        let (status, length, chunked, keep_alive) = loop {
            self.fill().await?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let mut length = None;
                    let mut chunked = false;
                    let mut keep_alive = resp.version == Some(1);
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            length = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = h.value.eq_ignore_ascii_case(b"chunked");
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            keep_alive = !h.value.eq_ignore_ascii_case(b"close");
                        }
                    }
                    let status = resp.code.unwrap_or(0);
                    self.buf.advance(n);
                    break (status, length, chunked, keep_alive);
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(bad(format!("bad response head: {e}"))),
            }
        };
        let body = if chunked {
            self.chunked_body().await?
        } else if let Some(len) = length {
            if len > MAX_BODY {
                return Err(bad(format!("response body of {len} bytes")));
            }
            while self.buf.len() < len {
                self.fill().await?;
            }
            self.buf.split_to(len).to_vec()
        } else {
            return Err(bad("response without Content-Length or chunked framing"));
        };
        Ok(Reply {
            status,
            body,
            keep_alive,
        })
    }

    /// Decodes a chunked body (trailers skipped).
    async fn chunked_body(&mut self) -> std::io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let Some(i) = memchr::memmem::find(&self.buf, b"\r\n") else {
                self.fill().await?;
                continue;
            };
            let line = std::str::from_utf8(&self.buf[..i]).map_err(|_| bad("chunk size"))?;
            let hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
            if body.len() + size > MAX_BODY {
                return Err(bad("chunked body too long"));
            }
            if size == 0 {
                self.buf.advance(i + 2);
                // Trailer lines up to the empty one.
                loop {
                    match memchr::memmem::find(&self.buf, b"\r\n") {
                        Some(0) => {
                            self.buf.advance(2);
                            return Ok(body);
                        }
                        Some(j) => self.buf.advance(j + 2),
                        None => self.fill().await?,
                    }
                }
            }
            while self.buf.len() < i + 2 + size + 2 {
                self.fill().await?;
            }
            body.extend_from_slice(&self.buf[i + 2..i + 2 + size]);
            if &self.buf[i + 2 + size..i + 4 + size] != b"\r\n" {
                return Err(bad("missing CRLF after chunk data"));
            }
            self.buf.advance(i + 4 + size);
        }
    }
}

/// A non-streaming chat request for `model` with virtual key `key`: ten words of input
/// (Sluice's estimate is a little more: message framing) and `max_tokens: 10`.
pub(crate) fn chat_request(key: &str, model: &str) -> Vec<u8> {
    let body = format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"one two three four five six seven eight nine ten\"}}],\"max_tokens\":10}}"
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One answered request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// When it was sent, µs after the phase started.
    pub(crate) sent_us: u64,
    /// Sent → whole response read, µs.
    pub(crate) latency_us: u32,
    /// The HTTP status.
    pub(crate) status: u16,
    /// Which request kind (index into the phase's request list).
    pub(crate) kind: u8,
}

/// What one client saw.
#[derive(Debug, Default)]
pub(crate) struct ClientLog {
    pub(crate) samples: Vec<Sample>,
    /// Requests that got no response (connect, I/O or timeout errors).
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// The first body of each status other than 200 (for the report).
    pub(crate) first_bodies: Vec<(u16, String)>,
}

/// One client: sends `req` (of kind `kind`) to `addr` back to back from `start` until `end`
/// or until the shared `budget` of requests runs out, reconnecting after a closed
/// connection or an error.
pub(crate) async fn client(
    addr: SocketAddr,
    req: Arc<Vec<u8>>,
    kind: u8,
    budget: Arc<AtomicU64>,
    start: Instant,
    end: Instant,
) -> ClientLog {
    let mut log = ClientLog::default();
    let mut conn: Option<Conn> = None;
    while Instant::now() < end
        && budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match tokio::time::timeout(REQUEST_TIMEOUT, Conn::open(addr)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    log.error(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(_) => {
                    log.error("connect timed out".into());
                    continue;
                }
            },
        };
        let sent = Instant::now();
        match tokio::time::timeout(REQUEST_TIMEOUT, c.exchange(&req)).await {
            Ok(Ok(reply)) => {
                let latency = sent.elapsed();
                log.samples.push(Sample {
                    sent_us: u64::try_from(sent.duration_since(start).as_micros())
                        .unwrap_or(u64::MAX),
                    latency_us: u32::try_from(latency.as_micros()).unwrap_or(u32::MAX),
                    status: reply.status,
                    kind,
                });
                if reply.status != 200 && !log.first_bodies.iter().any(|(s, _)| *s == reply.status)
                {
                    log.first_bodies.push((
                        reply.status,
                        String::from_utf8_lossy(&reply.body).into_owned(),
                    ));
                }
                if reply.keep_alive {
                    conn = Some(c);
                }
            }
            Ok(Err(e)) => log.error(format!("exchange: {e}")),
            Err(_) => log.error("request timed out".into()),
        }
    }
    log
}

impl ClientLog {
    fn error(&mut self, msg: String) {
        self.errors += 1;
        self.first_error.get_or_insert(msg);
    }
}

/// The merged logs of a phase's clients.
#[derive(Debug, Default)]
pub(crate) struct PhaseLog {
    /// Every sample, sorted by send time.
    pub(crate) samples: Vec<Sample>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) first_bodies: Vec<(u16, String)>,
    /// The phase's length as run.
    pub(crate) elapsed: Duration,
}

/// Runs `clients` closed-loop clients for `duration` (bounded by `max_requests` too):
/// client `i` sends `requests[i % requests.len()]` to `targets[i % targets.len()]`.
pub(crate) async fn phase(
    targets: &[SocketAddr],
    requests: &[Arc<Vec<u8>>],
    clients: usize,
    duration: Duration,
    max_requests: u64,
) -> PhaseLog {
    let budget = Arc::new(AtomicU64::new(max_requests));
    let start = Instant::now();
    let end = start + duration;
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let kind = i % requests.len();
            tokio::spawn(client(
                targets[i % targets.len()],
                requests[kind].clone(),
                u8::try_from(kind).unwrap_or(u8::MAX),
                budget.clone(),
                start,
                end,
            ))
        })
        .collect();
    let mut out = PhaseLog::default();
    for h in handles {
        let log = h.await.expect("client task");
        out.samples.extend(log.samples);
        out.errors += log.errors;
        if out.first_error.is_none() {
            out.first_error = log.first_error;
        }
        for (s, b) in log.first_bodies {
            if !out.first_bodies.iter().any(|(x, _)| *x == s) {
                out.first_bodies.push((s, b));
            }
        }
    }
    out.elapsed = start.elapsed();
    out.samples.sort_by_key(|s| s.sent_us);
    out
}

/// The nearest-rank quantile `q` of `v` (sorted, µs), in ms.
pub(crate) fn quantile_ms(v: &[u32], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "nearest-rank index of a vector that fits in memory"
    )]
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(f64::from(v[rank - 1]) / 1000.0)
}
