//! Owns the downstream connection around Pingora's proxy ([`DownstreamApp`]): the choice of
//! HTTP/1 or HTTP/2 (ALPN, or the h2c preface), the HTTP/1 keep-alive loop, the deadline on
//! the whole request head (`server.header_read_timeout_ms`) and HTTP/1.1 pipelining.
//!
//! ## The head deadline: why a connection app and a stream wrapper
//!
//! Pingora 0.9.1 reads the request head in `HttpProxy::handle_new_request`
//! (`pingora-proxy/src/lib.rs`), before any `ProxyHttp` hook runs, with a limit **per read**
//! only (`read_request_buf` in `pingora-core/src/protocols/http/v1/server.rs`: the keep-alive
//! timeout, else `read_timeout`). A head trickled one line a second is never cut, and every
//! client that drops mid-head is logged there at ERROR (`Fail to proxy: ...`), with no hook
//! to suppress it (`suppress_error_log` is for errors after the head). No option of
//! `ServerConf`, `HttpServerOptions` or the session bounds the whole head.
//!
//! So Sluice runs its own [`ServerApp`] in place of Pingora's blanket one for an
//! `HttpServerApp` (`pingora-core/src/apps/mod.rs`, the HTTP/1 branch, whose keep-alive loop
//! it repeats), and wraps each accepted stream in a [`HeadClockStream`]:
//!
//! - each request's `process_new_http` future is raced against [`HeadClock::cut`]: once the
//!   deadline passes before the head is complete, the future is dropped, which closes the
//!   connection without an answer (as nginx's `client_header_timeout` does) and without
//!   Pingora ever seeing an error (so no ERROR line);
//! - the deadline of a connection's first request counts from the accept; on a reused
//!   keep-alive connection it counts from the first byte of the next head (the idle time
//!   before it is the keep-alive timeout's);
//! - the stream wrapper notes the first byte of a head, and turns an EOF or a read error
//!   during the head into "pending" plus a signal, so the race ends the connection quietly
//!   instead of Pingora logging it;
//! - the head is complete when `new_ctx` runs (the first hook after it): it marks the clock
//!   through a task-local ([`head_complete`]). From then on the wrapper only passes bytes
//!   through and the deadline is off.
//!
//! Cut heads are counted in `sluice_request_read_aborts_total{phase="head"}` (`timeout`, or
//! `closed` when the client left after sending part of a head) and logged at debug. A client
//! closing an idle keep-alive connection is normal and counted nowhere.
//!
//! ## Pipelining
//!
//! Pingora 0.9.1 can answer pipelined HTTP/1.1 requests in order
//! (`HttpSession::set_pipelining_enabled`, RFC 9112 §9.3.2): bytes read past a request's body
//! become the start of the next request on the connection. It is off by default, and then a
//! pipelined request is silently dropped after the first answer, which said `keep-alive`.
//! Sluice turns it on for every connection. Requests are served one after the other: the
//! next is read once the previous answer is complete. While a request is served, the
//! disconnect watch (`read_body_or_idle`) keeps a byte of a pipelined request for the next
//! one instead of calling it a misbehaving client; after such a byte it stops watching, so a
//! pipelining client that leaves mid-answer is noticed by the next failed write (a stream's
//! heartbeat at the latest) rather than at once.
//!
//! ## HTTP/2: ALPN `h2` on the TLS listener, h2c with prior knowledge on the plain one
//!
//! A connection is HTTP/2 when its TLS handshake chose ALPN `h2`, or, on the plain listener,
//! when its first 24 bytes are the HTTP/2 connection preface (RFC 9113 §3.4: h2c "with prior
//! knowledge"; the `Upgrade: h2c` dance of RFC 7540 §3.2 is not offered, as in Pingora).
//! The preface is read here, byte by byte as it arrives, within the first head's deadline
//! (so a client that connects and stays silent, or trickles a preface, is cut like one that
//! trickles a head), and stops at the first byte that differs: an HTTP/1 request line never
//! waits for 24 bytes (Pingora's own h2c peek does `read_exact`, which would stall a short
//! HTTP/1.0 request). The bytes read are replayed to whichever protocol follows.
//!
//! An HTTP/2 connection is then handed to Pingora's own HTTP/2 accept loop (the blanket
//! `ServerApp` of an `HttpServerApp`, with `h2c` on in the proxy's server options): one task
//! per stream, streams answered in parallel, bounded by Pingora's defaults (100 concurrent
//! streams, 64 KiB of decoded headers), idle connections closed after
//! [`crate::proxy::DOWNSTREAM_KEEPALIVE_S`]. Each stream runs the same [`Gateway`] phases as an
//! HTTP/1 request; the HTTP/2 session strips the HTTP/1 framing headers (`Transfer-Encoding`,
//! `Connection`, `Keep-Alive`) Sluice's answer heads carry, sends each body write as its own
//! DATA frame (waiting for flow-control credit: the backpressure point, as a socket write is
//! for HTTP/1), and reports a client's `RST_STREAM` through `read_body_or_idle`, which the
//! attempt loop and the pump already race against the upstream: a reset stream cancels the
//! upstream request at once. The head deadline has no HTTP/2 counterpart per stream (a
//! stream's headers arrive whole, in frames the h2 codec bounds).
//!
//! ## Head size
//!
//! The wrapper also feeds each head's bytes to a [`HeadScan`] (limits set by
//! [`HeadClock::arm`] from `server.max_request_header_bytes`, `max_request_headers`,
//! `max_uri_bytes`). When a head passes one, the wrapper stops passing bytes to Pingora,
//! parks the inner stream in the clock and ends the race with [`Cut::Refused`]; the loop then
//! writes the 414/431 on the raw stream ([`head_guard::write_refusal`]) and closes it.
//!
//! ## Per-IP connection cap
//!
//! With `server.per_ip`, a socket peer holding `max_connections` open connections has its
//! next one closed at once, before a byte is read ([`ConnectionCap`], counted in
//! `sluice_rejected_total{reason="per_ip_connections"}`); trusted proxies are not capped.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::edge::head_guard::{self, HeadLimits, HeadScan};
use crate::edge::screen::ConnectionCap;
use crate::error::GatewayError;
use crate::live::ConfigHandle;
use crate::metrics::metrics;
use crate::protocol::ClientDialect;
use crate::proxy::gateway::Gateway;

/// Pingora's keep-alive for the first request of a connection, seconds (as in its own
/// HTTP/1 loop): also the per-read limit while that request's head arrives.
const FIRST_REQUEST_KEEPALIVE_S: u64 = 60;

tokio::task_local! {
    /// The head clock of the connection whose request the current task serves.
    static HEAD_CLOCK: Arc<HeadClock>;
}

/// Marks the current request's head as complete (call it from the first hook after the head,
/// `new_ctx`). Outside a [`DownstreamApp`] connection (unit tests) it does nothing.
pub fn head_complete() {
    let _ = HEAD_CLOCK.try_with(|c| c.complete());
}

/// The downstream application: Pingora's HTTP proxy (the [`Gateway`]) behind the keep-alive
/// loop that bounds each request head in time.
pub struct DownstreamApp {
    proxy: Arc<HttpProxy<Gateway>>,
    config: Arc<ConfigHandle>,
    /// Open connections per client IP (`server.per_ip.max_connections`).
    cap: ConnectionCap,
    /// The TLS listener, whose connections get their handshake here (see [`crate::tls`]).
    tls: Option<crate::tls::TlsListener>,
}

impl std::fmt::Debug for DownstreamApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownstreamApp").finish_non_exhaustive()
    }
}

impl DownstreamApp {
    /// Serves `proxy`'s requests; head deadlines come from `config`'s live snapshot.
    pub fn new(proxy: HttpProxy<Gateway>, config: Arc<ConfigHandle>) -> Self {
        Self {
            proxy: Arc::new(proxy),
            config,
            cap: ConnectionCap::new(),
            tls: None,
        }
    }

    /// The same, with `tls` the listener whose connections are TLS (the TLS handshake is
    /// done here, after the per-IP cap, within `server.header_read_timeout_ms`).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<crate::tls::TlsListener>) -> Self {
        self.tls = tls;
        self
    }
}

/// Why a connection was ended while its head was being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The deadline passed (whether or not any byte of the head arrived).
    TimedOut,
    /// The client closed or reset; `mid_head` when part of a head had arrived.
    Closed {
        /// Bytes of the head had been read.
        mid_head: bool,
    },
    /// The head passed a size limit ([`head_guard`]): the stream is parked in the clock
    /// for the refusal ([`HeadClock::take_refused`]).
    Refused,
}

#[async_trait]
impl ServerApp for DownstreamApp {
    #[expect(
        clippy::too_many_lines,
        reason = "the keep-alive loop's states (head deadline, pipelining, shutdown) read best in one place"
    )]
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let digest = stream.get_socket_digest();
        let peer_addr = digest
            .as_ref()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied());
        let local_addr = digest.and_then(|d| d.local_addr().and_then(|a| a.as_inet()).copied());
        let peer = peer_addr.map(|a| a.to_string()).unwrap_or_default();
        // The per-IP connection cap, before a byte is read; held until the connection ends.
        let _slot = match peer_addr {
            Some(a) => match self.cap.admit(a.ip(), &self.config.snapshot().server.edge) {
                Some(slot) => Some(slot),
                None => {
                    log::debug!(target: "sluice::proxy::connection",
                        "connection refused: over server.per_ip.max_connections peer={peer}"
                    );
                    return None;
                }
            },
            None => None,
        };
        let stream = match (&self.tls, local_addr) {
            (Some(tls), Some(local)) if tls.serves(local) => {
                let timeout = self.config.snapshot().server.header_read_timeout;
                // Boxed, as is the refusal below: this future lives as long as the
                // connection, and the handshake's ~7 KiB of state is needed only once.
                Box::pin(tls.accept(stream, timeout, &peer)).await?
            }
            _ => stream,
        };
        let alpn = stream.selected_alpn_proto();
        let tls = stream.get_ssl_digest().is_some();
        let clock = Arc::new(HeadClock::new());
        let mut stream = HeadClockStream {
            inner: Some(stream),
            clock: clock.clone(),
            replay: Vec::new(),
            scan: HeadScan::new(true),
            scan_generation: 0,
        };
        // The first head's deadline counts from now: the accept, or the end of the TLS
        // handshake (which had the same deadline of its own). It covers the h2 preface.
        clock.arm(true, head_limits(&self.config.snapshot().server.edge));
        let h2_alpn = matches!(alpn, Some(ALPN::H2));
        if h2_alpn || !tls {
            let timeout = self.config.snapshot().server.header_read_timeout;
            let sniffed = tokio::select! {
                r = stream.sniff_h2_preface() => r,
                cut = clock.cut(timeout) => {
                    record_cut(cut, timeout, &peer);
                    return None;
                }
            };
            match sniffed {
                Ok(true) => {
                    clock.complete();
                    // Pingora's HTTP/2 accept loop (see the module doc).
                    return ServerApp::process_new(&self.proxy, Box::new(stream), shutdown).await;
                }
                // ALPN said h2 but the client speaks something else: a protocol error.
                Ok(false) if h2_alpn => {
                    log::debug!(target: "sluice::proxy::connection",
                        "ALPN h2 without the HTTP/2 preface, connection closed: peer={peer}"
                    );
                    return None;
                }
                Ok(false) => {}
                // Gone before a request: an ordinary end of a connection.
                Err(_) => return None,
            }
        }
        let stream: Stream = Box::new(stream);
        let mut session = ServerSession::new_http1(stream);
        if *shutdown.borrow() {
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(FIRST_REQUEST_KEEPALIVE_S));
        }
        session.set_keepalive_reuses_remaining(
            self.proxy
                .server_options()
                .and_then(|o| o.keepalive_request_limit),
        );
        session.set_pipelining_enabled(true);
        let mut first = true;
        loop {
            let cfg = self.config.snapshot();
            let timeout = cfg.server.header_read_timeout;
            if !first {
                clock.arm(false, head_limits(&cfg.server.edge));
            }
            drop(cfg);
            let served = HEAD_CLOCK.scope(
                clock.clone(),
                self.proxy.process_new_http(session, shutdown),
            );
            let reused = tokio::select! {
                r = served => r,
                cut = clock.cut(timeout) => {
                    if cut == Cut::Refused {
                        if let Some((stream, err, dialect)) = clock.take_refused() {
                            log::debug!(target: "sluice::proxy::connection",
                                "request head refused: {err} peer={peer}"
                            );
                            Box::pin(head_guard::write_refusal(stream, &err, dialect)).await;
                        }
                    } else {
                        record_cut(cut, timeout, &peer);
                    }
                    return None;
                }
            };
            let (stream, settings) = reused?.consume();
            session = ServerSession::new_http1(stream);
            if let Some(settings) = settings {
                // Keep-alive, reuse count, the pipelining opt-in and any pipelined bytes.
                settings.apply_to_session(&mut session);
            }
            first = false;
        }
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

/// Counts and logs a cut head (`sluice_request_read_aborts_total{phase="head"}`).
/// The head size limits of `server` (`max_request_header_bytes`, `max_request_headers`,
/// `max_uri_bytes`).
fn head_limits(edge: &crate::config::edge::EdgeSettings) -> HeadLimits {
    HeadLimits {
        max_bytes: edge.max_request_header_bytes,
        max_fields: edge.max_request_headers,
        max_uri: edge.max_uri_bytes,
    }
}

fn record_cut(cut: Cut, timeout: Duration, peer: &str) {
    let reason = match cut {
        Cut::TimedOut => "timeout",
        Cut::Closed { mid_head: true } => "closed",
        // Closed before a byte of a new request: an ordinary end of a connection. A refused
        // head is counted as a refusal.
        Cut::Closed { mid_head: false } | Cut::Refused => return,
    };
    metrics()
        .request_read_aborts_total
        .with_label_values(&["head", reason])
        .inc();
    log::debug!(target: "sluice::proxy::connection",
        "request head not received, connection closed: reason={reason} header_read_timeout_ms={} peer={peer}",
        timeout.as_millis()
    );
}

/// Head phase states.
const READING_HEAD: u8 = 0;
const HEAD_DONE: u8 = 1;
const CLOSED: u8 = 2;
const REFUSED: u8 = 3;

/// A refused head's stream, error and dialect, parked for the connection loop.
type Parked = (Stream, GatewayError, ClientDialect);

/// The head deadline of one connection, shared by its stream wrapper (which reports bytes and
/// ends) and the race in [`DownstreamApp`] (which waits on it). Both run in the connection's
/// task; the atomics only make it `Sync` for Pingora's `Stream`.
#[derive(Debug)]
pub struct HeadClock {
    /// Reference point of `started`.
    base: Instant,
    /// When the deadline started: nanoseconds after `base`, plus one; 0 while not started.
    started: AtomicU64,
    /// [`READING_HEAD`], [`HEAD_DONE`] or [`CLOSED`].
    state: AtomicU8,
    /// Whether a byte of the current head was read.
    seen: AtomicBool,
    /// Wakes [`Self::cut`] when the deadline starts or the client leaves.
    notify: Notify,
    /// Counts [`Self::arm`] calls: the stream wrapper starts a new [`HeadScan`] on a change.
    generation: AtomicU64,
    /// Whether the current head is a connection's first (scanned from its first byte).
    first: AtomicBool,
    /// The current head's limits: bytes, fields, URI bytes.
    limits: [AtomicUsize; 3],
    /// A refused head's stream, waiting for the refusal to be written.
    refused: Mutex<Option<Parked>>,
}

impl Default for HeadClock {
    fn default() -> Self {
        Self::new()
    }
}

impl HeadClock {
    /// A clock with no head armed.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            started: AtomicU64::new(0),
            state: AtomicU8::new(HEAD_DONE),
            seen: AtomicBool::new(false),
            notify: Notify::new(),
            generation: AtomicU64::new(0),
            first: AtomicBool::new(true),
            limits: [
                AtomicUsize::new(usize::MAX),
                AtomicUsize::new(usize::MAX),
                AtomicUsize::new(usize::MAX),
            ],
            refused: Mutex::new(None),
        }
    }

    fn now_mark(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Starts the next head: its deadline counts from now (`from_now`, a connection's first
    /// request) or from its first byte; `limits` bound its size.
    pub fn arm(&self, from_now: bool, limits: HeadLimits) {
        self.limits[0].store(limits.max_bytes, Ordering::Release);
        self.limits[1].store(limits.max_fields, Ordering::Release);
        self.limits[2].store(limits.max_uri, Ordering::Release);
        self.first.store(from_now, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.seen.store(false, Ordering::Release);
        let mark = if from_now { self.now_mark() } else { 0 };
        self.started.store(mark, Ordering::Release);
        self.state.store(READING_HEAD, Ordering::Release);
    }

    /// The head is complete: the deadline is off until the next [`Self::arm`].
    pub fn complete(&self) {
        let _ = self.state.compare_exchange(
            READING_HEAD,
            HEAD_DONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Bytes arrived.
    fn on_bytes(&self) {
        if self.state.load(Ordering::Acquire) != READING_HEAD
            || self.seen.swap(true, Ordering::AcqRel)
        {
            return;
        }
        if self
            .started
            .compare_exchange(0, self.now_mark(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.notify.notify_one();
        }
    }

    /// The read side ended (EOF or error). Returns whether it happened while a head was read
    /// (the caller then hides it from Pingora: [`Self::cut`] ends the connection).
    fn on_end(&self) -> bool {
        let ended = self
            .state
            .compare_exchange(READING_HEAD, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ended {
            self.notify.notify_one();
        }
        ended || self.state.load(Ordering::Acquire) == CLOSED
    }

    /// The current head's limits.
    fn head_limits(&self) -> HeadLimits {
        HeadLimits {
            max_bytes: self.limits[0].load(Ordering::Acquire),
            max_fields: self.limits[1].load(Ordering::Acquire),
            max_uri: self.limits[2].load(Ordering::Acquire),
        }
    }

    /// The head passed a limit: parks its stream for the refusal and wakes [`Self::cut`].
    fn refuse(&self, parked: Parked) {
        if self
            .state
            .compare_exchange(READING_HEAD, REFUSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *self
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(parked);
            self.notify.notify_one();
        }
    }

    /// The parked stream, error and dialect of a refused head (once).
    pub fn take_refused(&self) -> Option<(Stream, GatewayError, ClientDialect)> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn started_at(&self) -> Option<Instant> {
        match self.started.load(Ordering::Acquire) {
            0 => None,
            mark => Some(self.base + Duration::from_nanos(mark - 1)),
        }
    }

    /// Resolves when the current head must be given up: `timeout` after its deadline
    /// started, or when the client left mid-head. Pending for ever once the head is complete.
    pub async fn cut(&self, timeout: Duration) -> Cut {
        loop {
            let wake = self.notify.notified();
            match self.state.load(Ordering::Acquire) {
                CLOSED => {
                    return Cut::Closed {
                        mid_head: self.seen.load(Ordering::Acquire),
                    }
                }
                REFUSED => return Cut::Refused,
                HEAD_DONE => return std::future::pending().await,
                _ => {}
            }
            match self.started_at() {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at + timeout) => {
                            if self.state.load(Ordering::Acquire) == READING_HEAD {
                                return Cut::TimedOut;
                            }
                        }
                        () = wake => {}
                    }
                }
                None => wake.await,
            }
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An accepted downstream stream that reports head progress to its [`HeadClock`], first
/// replays the bytes [`Self::sniff_h2_preface`] read, and scans each head against its size
/// limits ([`HeadScan`]); every other call goes straight to the inner stream. When a head
/// passes a limit, the inner stream moves to the clock for the refusal, and the wrapper is
/// left empty: reads pend, writes fail, digests are absent.
#[derive(Debug)]
pub struct HeadClockStream {
    inner: Option<Stream>,
    clock: Arc<HeadClock>,
    /// Bytes read by the preface sniff, not yet handed to a reader (at most 24).
    replay: Vec<u8>,
    /// The scan of the current head.
    scan: HeadScan,
    /// The clock generation `scan` belongs to.
    scan_generation: u64,
}

/// The error of any call on a wrapper whose stream was taken for a refusal.
fn taken() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the stream was taken to refuse an oversized request head",
    )
}

impl HeadClockStream {
    /// Reads the start of the connection until it is the HTTP/2 preface (`true`) or differs
    /// from it (`false`), keeping what it read for the next reads (and peeks). Reads only as
    /// far as the first differing byte.
    ///
    /// # Errors
    /// The read error, or `UnexpectedEof` when the client closed first.
    pub async fn sniff_h2_preface(&mut self) -> std::io::Result<bool> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; H2_PREFACE.len()];
        let mut n = 0;
        while n < buf.len() {
            let Some(inner) = self.inner.as_mut() else {
                return Err(taken());
            };
            let got = inner.read(&mut buf[n..]).await?;
            if got == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let prefix_ok = buf[n..n + got] == H2_PREFACE[n..n + got];
            n += got;
            if !prefix_ok {
                self.replay.extend_from_slice(&buf[..n]);
                return Ok(false);
            }
        }
        self.replay.extend_from_slice(&buf);
        Ok(true)
    }

    /// Scans `data`, just read during a head; true when the head passed a limit (the stream
    /// is then parked in the clock).
    fn scan_refuses(&mut self, data: &[u8]) -> bool {
        let generation = self.clock.generation.load(Ordering::Acquire);
        if generation != self.scan_generation {
            self.scan_generation = generation;
            self.scan = HeadScan::new(self.clock.first.load(Ordering::Acquire));
        }
        let limits = self.clock.head_limits();
        let Some(overflow) = self.scan.feed(data, limits) else {
            return false;
        };
        if let Some(inner) = self.inner.take() {
            let err = head_guard::overflow_error(overflow, limits);
            self.clock.refuse((inner, err, self.scan.dialect()));
        }
        true
    }
}

impl AsyncRead for HeadClockStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if matches!(this.clock.state.load(Ordering::Acquire), CLOSED | REFUSED) {
            // The race in `DownstreamApp` is ending the connection.
            return Poll::Pending;
        }
        if !this.replay.is_empty() && buf.remaining() > 0 {
            let n = this.replay.len().min(buf.remaining());
            let before = buf.filled().len();
            buf.put_slice(&this.replay[..n]);
            this.replay.drain(..n);
            this.clock.on_bytes();
            if this.clock.state.load(Ordering::Acquire) == READING_HEAD
                && this.scan_refuses(&buf.filled()[before..])
            {
                return Poll::Pending;
            }
            return Poll::Ready(Ok(()));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Pending;
        };
        if buf.remaining() == 0 {
            return Pin::new(inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        match Pin::new(inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.clock.on_bytes();
                if this.clock.state.load(Ordering::Acquire) == READING_HEAD
                    && this.scan_refuses(&buf.filled()[before..])
                {
                    return Poll::Pending;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(r) => {
                if this.clock.on_end() {
                    Poll::Pending
                } else {
                    Poll::Ready(r)
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for HeadClockStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_write(cx, buf),
            None => Poll::Ready(Err(taken())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Err(taken())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.inner.as_mut() {
            Some(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(taken())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.is_write_vectored())
    }
}

#[async_trait]
impl Shutdown for HeadClockStream {
    async fn shutdown(&mut self) {
        if let Some(s) = self.inner.as_mut() {
            s.shutdown().await;
        }
    }
}

impl UniqueID for HeadClockStream {
    fn id(&self) -> UniqueIDType {
        self.inner.as_ref().map_or(-1, |s| s.id())
    }
}

impl Ssl for HeadClockStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.as_ref()?.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.as_ref()?.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.as_ref()?.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeadClockStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner
            .as_ref()
            .map(|s| s.get_timing_digest())
            .unwrap_or_default()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner
            .as_ref()
            .map_or(Duration::ZERO, |s| s.get_read_pending_time())
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner
            .as_ref()
            .map_or(Duration::ZERO, |s| s.get_write_pending_time())
    }
}

impl GetProxyDigest for HeadClockStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.as_ref()?.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        if let Some(s) = self.inner.as_mut() {
            s.set_proxy_digest(digest);
        }
    }
}

impl GetSocketDigest for HeadClockStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.as_ref()?.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        if let Some(s) = self.inner.as_mut() {
            s.set_socket_digest(digest);
        }
    }
}

#[async_trait]
impl Peek for HeadClockStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        // Pingora's h2c branch peeks at the preface the sniff already read.
        if self.replay.len() >= buf.len() {
            buf.copy_from_slice(&self.replay[..buf.len()]);
            return Ok(true);
        }
        if !self.replay.is_empty() {
            // Not peekable without reading past the replay: tell the caller so.
            return Ok(false);
        }
        match self.inner.as_mut() {
            Some(s) => s.try_peek(buf).await,
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_LIMITS: HeadLimits = HeadLimits {
        max_bytes: usize::MAX,
        max_fields: usize::MAX,
        max_uri: usize::MAX,
    };

    #[tokio::test(start_paused = true)]
    async fn first_head_deadline_counts_from_arm_and_stops_when_complete() {
        let c = HeadClock::new();
        c.arm(true, NO_LIMITS);
        let t0 = Instant::now();
        assert_eq!(c.cut(Duration::from_secs(30)).await, Cut::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
        c.arm(true, NO_LIMITS);
        c.complete();
        let r =
            tokio::time::timeout(Duration::from_secs(3600), c.cut(Duration::from_secs(1))).await;
        assert!(r.is_err(), "a complete head is never cut");
    }

    #[tokio::test(start_paused = true)]
    async fn reused_head_deadline_starts_at_its_first_byte() {
        let c = Arc::new(HeadClock::new());
        c.arm(false, NO_LIMITS);
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                let r = c.cut(Duration::from_secs(5)).await;
                (r, Instant::now())
            })
        };
        // Idle for 100 s: the keep-alive's business, not the head deadline's.
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!waiter.is_finished());
        let first_byte = Instant::now();
        c.on_bytes();
        let (r, at) = waiter.await.unwrap();
        assert_eq!(r, Cut::TimedOut);
        assert_eq!(at - first_byte, Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_mid_head_is_hidden_and_reported_once() {
        let c = HeadClock::new();
        c.arm(false, NO_LIMITS);
        assert!(c.on_end(), "swallowed");
        assert_eq!(
            c.cut(Duration::from_secs(5)).await,
            Cut::Closed { mid_head: false }
        );
        c.arm(false, NO_LIMITS);
        c.on_bytes();
        assert!(c.on_end());
        assert_eq!(
            c.cut(Duration::from_secs(5)).await,
            Cut::Closed { mid_head: true }
        );
        // After the head, an end is Pingora's to handle.
        c.arm(false, NO_LIMITS);
        c.complete();
        assert!(!c.on_end());
    }
}
