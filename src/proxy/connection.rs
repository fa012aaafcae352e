//! Owns the downstream HTTP/1 connection around Pingora's proxy ([`DownstreamApp`]): the
//! keep-alive loop, the deadline on the whole request head (`server.header_read_timeout_ms`)
//! and HTTP/1.1 pipelining.
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
//! ## Per-IP connection cap
//!
//! With `server.per_ip`, a socket peer holding `max_connections` open connections has its
//! next one closed at once, before a byte is read ([`ConnectionCap`], counted in
//! `sluice_rejected_total{reason="per_ip_connections"}`); trusted proxies are not capped.
//!
//! Only cleartext HTTP/1 is served (Sluice configures no TLS or h2c listener).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
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

use super::edge::ConnectionCap;
use super::Gateway;
use crate::config::ConfigHandle;
use crate::metrics::metrics;

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
        }
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
}

#[async_trait]
impl ServerApp for DownstreamApp {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer_addr = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied());
        let peer = peer_addr.map(|a| a.to_string()).unwrap_or_default();
        // The per-IP connection cap, before a byte is read; held until the connection ends.
        let _slot = match peer_addr {
            Some(a) => match self.cap.admit(a.ip(), &self.config.snapshot().server.edge) {
                Some(slot) => Some(slot),
                None => {
                    log::debug!(
                        target: "sluice::proxy::connection",
                        "connection refused: over server.per_ip.max_connections peer={peer}"
                    );
                    return None;
                }
            },
            None => None,
        };
        let clock = Arc::new(HeadClock::new());
        let stream: Stream = Box::new(HeadClockStream {
            inner: stream,
            clock: clock.clone(),
        });
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
            let timeout = self.config.snapshot().server.header_read_timeout;
            clock.arm(first);
            let served = HEAD_CLOCK.scope(
                clock.clone(),
                self.proxy.process_new_http(session, shutdown),
            );
            let reused = tokio::select! {
                r = served => r,
                cut = clock.cut(timeout) => {
                    record_cut(cut, timeout, &peer);
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
fn record_cut(cut: Cut, timeout: Duration, peer: &str) {
    let reason = match cut {
        Cut::TimedOut => "timeout",
        Cut::Closed { mid_head: true } => "closed",
        // Closed before a byte of a new request: an ordinary end of a connection.
        Cut::Closed { mid_head: false } => return,
    };
    metrics()
        .request_read_aborts_total
        .with_label_values(&["head", reason])
        .inc();
    log::debug!(
        target: "sluice::proxy::connection",
        "request head not received, connection closed: reason={reason} header_read_timeout_ms={} peer={peer}",
        timeout.as_millis()
    );
}

/// Head phase states.
const READING_HEAD: u8 = 0;
const HEAD_DONE: u8 = 1;
const CLOSED: u8 = 2;

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
        }
    }

    fn now_mark(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Starts the next head: its deadline counts from now (`from_now`, a connection's first
    /// request) or from its first byte.
    pub fn arm(&self, from_now: bool) {
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

/// An accepted downstream stream that reports head progress to its [`HeadClock`]; every
/// other call goes straight to the inner stream.
#[derive(Debug)]
pub struct HeadClockStream {
    inner: Stream,
    clock: Arc<HeadClock>,
}

impl AsyncRead for HeadClockStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.clock.state.load(Ordering::Acquire) == CLOSED {
            // The race in `DownstreamApp` is ending the connection.
            return Poll::Pending;
        }
        if buf.remaining() == 0 {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.clock.on_bytes();
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
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for HeadClockStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl UniqueID for HeadClockStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeadClockStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeadClockStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeadClockStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for HeadClockStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for HeadClockStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn first_head_deadline_counts_from_arm_and_stops_when_complete() {
        let c = HeadClock::new();
        c.arm(true);
        let t0 = Instant::now();
        assert_eq!(c.cut(Duration::from_secs(30)).await, Cut::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
        c.arm(true);
        c.complete();
        let r =
            tokio::time::timeout(Duration::from_secs(3600), c.cut(Duration::from_secs(1))).await;
        assert!(r.is_err(), "a complete head is never cut");
    }

    #[tokio::test(start_paused = true)]
    async fn reused_head_deadline_starts_at_its_first_byte() {
        let c = Arc::new(HeadClock::new());
        c.arm(false);
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
        c.arm(false);
        assert!(c.on_end(), "swallowed");
        assert_eq!(
            c.cut(Duration::from_secs(5)).await,
            Cut::Closed { mid_head: false }
        );
        c.arm(false);
        c.on_bytes();
        assert!(c.on_end());
        assert_eq!(
            c.cut(Duration::from_secs(5)).await,
            Cut::Closed { mid_head: true }
        );
        // After the head, an end is Pingora's to handle.
        c.arm(false);
        c.complete();
        assert!(!c.on_end());
    }
}
