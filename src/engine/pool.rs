//! The upstream connector of the LLM endpoints: Pingora's [`pingora::connectors::http::Connector`]
//! (connect, TLS, HTTP/2 sessions and their pool), with Sluice's own idle pool for
//! HTTP/1.1-only peers (plain-HTTP providers: vLLM, Ollama, a local mock).
//!
//! Why not Pingora's pool for those: it parks every released connection in a task of its own
//! (`idle_poll`, spawned per release) and hands it back to the next request through a oneshot
//! and a lock, so each reuse wakes that task and waits for it to let go: two task hand-offs,
//! often across threads (an `eventfd` write and a wake-up of the other worker), per request.
//! On a runtime without work stealing the task runs on a random thread, and a reuse that
//! comes before it let go fails (`failed to acquire reusable stream`) and opens a new
//! connection. Here an idle connection is a plain value in a list: taken under a short lock,
//! checked for a close or unexpected bytes with one non-blocking read (as Pingora checks it),
//! and given back the same way. A sweeper task (one per connector, every
//! [`SWEEP_EVERY`]) closes connections the peer closed or that stayed idle past their
//! timeout, so closed sockets do not linger while the gateway is quiet.
//!
//! Shapes: at most [`MAX_IDLE`] idle connections in all (Pingora's default pool size), newest
//! reused first (warm ones; the oldest age out); a connection is pooled only when its response
//! was read to the end and the peer kept it alive (Pingora's `reuse`).

use pingora::protocols::http::client::HttpSession;
use pingora::protocols::http::v1::client::HttpSession as Http1Session;
use pingora::protocols::Stream;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::{HttpPeer, Peer};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Idle HTTP/1.1 connections kept in all, over every peer (Pingora's default pool size).
pub const MAX_IDLE: usize = 128;

/// How often the sweeper checks idle connections for a close or an expired idle timeout.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// The most bytes one read of an HTTP/1.x response body takes, and so the size of the
/// buffer each upstream response is read into (the `set_body_read_size` of the patched
/// pingora-core in `vendor/`; as released, 64 KiB). A held stream keeps this buffer while it
/// waits for the next event, so it is most of what an idle stream costs; 16 KiB still takes
/// a burst of 100 events in one read. nginx reads a proxied response into
/// `proxy_buffer_size` (4 or 8 KiB, one memory page) when `proxy_buffering` is off.
pub const UPSTREAM_BODY_READ_SIZE: usize = 16 * 1024;

/// An HTTP/1.x client session on `stream` that reads response bodies
/// [`UPSTREAM_BODY_READ_SIZE`] bytes at a time.
fn h1_session(stream: Stream, peer: &HttpPeer) -> Http1Session {
    let mut h1 = Http1Session::new_with_options(stream, peer);
    h1.set_body_read_size(Some(UPSTREAM_BODY_READ_SIZE));
    h1
}

/// One idle connection and when it stops being reusable.
struct Idle {
    stream: Stream,
    expires: Option<Instant>,
}

/// The idle lists by peer (Pingora's `reuse_hash`: address, TLS, SNI, client cert, options).
#[derive(Default)]
struct IdlePool {
    by_peer: HashMap<u64, VecDeque<Idle>>,
    count: usize,
    sweeper: bool,
}

/// The upstream connector: [`Self::get_http_session`] and [`Self::release_http_session`] as
/// Pingora's `Connector` has them, with HTTP/1.1-only peers pooled here (module docs).
pub struct Connector {
    pingora: pingora::connectors::http::Connector,
    transport: pingora::connectors::TransportConnector,
    idle: Arc<Mutex<IdlePool>>,
}

impl Default for Connector {
    fn default() -> Self {
        Self::new()
    }
}

impl Connector {
    /// A connector with Pingora's default options (system trust store, 128 pooled
    /// connections); per-peer options (CA, timeouts, ALPN) come with each [`HttpPeer`].
    pub fn new() -> Self {
        Self {
            pingora: pingora::connectors::http::Connector::new(None),
            transport: pingora::connectors::TransportConnector::new(None),
            idle: Arc::default(),
        }
    }

    /// A session to `peer`: a pooled HTTP/1.1 connection when one is idle and still open,
    /// else a new connection (Pingora's connect: TCP, TLS, custom L4). The `bool` says
    /// whether the connection was reused (a reused one may turn out stale; the attempt loop
    /// resends once on a fresh one).
    ///
    /// # Errors
    /// Pingora's connect errors (refused, timed out, TLS).
    pub async fn get_http_session(&self, peer: &HttpPeer) -> pingora::Result<(HttpSession, bool)> {
        if !h1_only(peer) {
            let (mut session, reused) = self.pingora.get_http_session(peer).await?;
            if let HttpSession::H1(h1) = &mut session {
                h1.set_body_read_size(Some(UPSTREAM_BODY_READ_SIZE));
            }
            return Ok((session, reused));
        }
        if let Some(stream) = self.take_idle(peer.reuse_hash()) {
            return Ok((HttpSession::H1(h1_session(stream, peer)), true));
        }
        let stream = self.transport.new_stream(peer).await?;
        Ok((HttpSession::H1(h1_session(stream, peer)), false))
    }

    /// Gives `session` back for reuse (kept idle at most `idle_timeout`), or closes it when
    /// it cannot be reused (the response not read to its end, `Connection: close`, bytes
    /// after the response).
    pub async fn release_http_session(
        &self,
        session: HttpSession,
        peer: &HttpPeer,
        idle_timeout: Option<Duration>,
    ) {
        let mut h1 = match session {
            HttpSession::H1(h1) if h1_only(peer) => h1,
            other => {
                return self
                    .pingora
                    .release_http_session(other, peer, idle_timeout)
                    .await
            }
        };
        h1.respect_keepalive();
        let Some(mut stream) = h1.reuse().await else {
            return;
        };
        if !still_open(&mut stream) {
            return;
        }
        let expires = idle_timeout.map(|t| Instant::now() + t);
        let start_sweeper = {
            let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if pool.count >= MAX_IDLE && !pool.evict_oldest() {
                return;
            }
            pool.by_peer
                .entry(peer.reuse_hash())
                .or_default()
                .push_back(Idle { stream, expires });
            pool.count += 1;
            !std::mem::replace(&mut pool.sweeper, true)
        };
        if start_sweeper {
            spawn_sweeper(Arc::downgrade(&self.idle));
        }
    }

    /// The newest idle connection for `key` that is still open and not expired; closed and
    /// expired ones met on the way are dropped (closed).
    fn take_idle(&self, key: u64) -> Option<Stream> {
        let now = Instant::now();
        loop {
            let idle = {
                let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                let list = pool.by_peer.get_mut(&key)?;
                let idle = list.pop_back()?;
                pool.count -= 1;
                idle
            };
            let mut stream = idle.stream;
            if idle.expires.is_none_or(|t| t > now) && still_open(&mut stream) {
                return Some(stream);
            }
        }
    }
}

impl IdlePool {
    /// Closes the oldest idle connection of the longest list; false when none is idle.
    fn evict_oldest(&mut self) -> bool {
        let Some(list) = self.by_peer.values_mut().max_by_key(|l| l.len()) else {
            return false;
        };
        if list.pop_front().is_none() {
            return false;
        }
        self.count -= 1;
        true
    }

    /// Drops every idle connection that expired or that the peer closed (or sent bytes on).
    fn sweep(&mut self, now: Instant) {
        let mut count = 0;
        self.by_peer.retain(|_, list| {
            list.retain_mut(|i| i.expires.is_none_or(|t| t > now) && still_open(&mut i.stream));
            count += list.len();
            !list.is_empty()
        });
        self.count = count;
    }
}

/// Runs [`IdlePool::sweep`] every [`SWEEP_EVERY`] on the current runtime while the
/// connector lives.
fn spawn_sweeper(pool: Weak<Mutex<IdlePool>>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(pool) = pool.upgrade() else { return };
            let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.sweep(Instant::now());
            if pool.count == 0 {
                // Started again by the next release.
                pool.sweeper = false;
                return;
            }
        }
    });
}

/// Whether `peer` speaks HTTP/1.1 only (no HTTP/2, no custom ALPN): the peers pooled here.
fn h1_only(peer: &HttpPeer) -> bool {
    peer.options.alpn == ALPN::H1
}

/// Whether an idle connection is still usable: a non-blocking read finds nothing to read
/// (an end of stream means the peer closed it; bytes on an idle connection make it unusable;
/// Pingora's `test_reusable_stream` does the same).
fn still_open(stream: &mut Stream) -> bool {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut byte = [0u8; 1];
    // Polled once, never awaited. `unconstrained`: tokio's co-operative budget must not make
    // a ready read look pending.
    let mut read = std::pin::pin!(tokio::task::unconstrained(stream.read(&mut byte)));
    match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Pending => true,
        Poll::Ready(Ok(0)) => false,
        Poll::Ready(Ok(_)) => {
            log::warn!(target: "sluice::proxy::pool", "upstream sent bytes on an idle connection; closing it");
            false
        }
        Poll::Ready(Err(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::RequestHeader;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;

    /// A keep-alive HTTP/1.1 server on loopback that answers every request with a 2-byte
    /// body, counting the connections it accepted; a connection is closed by the server
    /// `linger` after its `close_after`th answer.
    async fn server(
        close_after: usize,
        linger: Duration,
    ) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                n.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    for _ in 0..close_after {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            let Ok(k) = s.read(&mut chunk).await else {
                                return;
                            };
                            if k == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..k]);
                        }
                        buf.clear();
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                    if !linger.is_zero() {
                        tokio::time::sleep(linger).await;
                    }
                    // Else closed in the poll that wrote the last answer (a current-thread
                    // test runtime): the close is there before the client reads the answer.
                });
            }
        });
        (addr, accepted)
    }

    /// One GET through `c`, its answer read to the end; the session is not released.
    async fn get(c: &Connector, peer: &HttpPeer) -> (HttpSession, bool) {
        let (mut up, reused) = c.get_http_session(peer).await.unwrap();
        let mut head = RequestHeader::build("GET", b"/", None).unwrap();
        head.insert_header("host", "127.0.0.1").unwrap();
        up.write_request_header(Box::new(head)).await.unwrap();
        up.finish_request_body().await.unwrap();
        up.read_response_header().await.unwrap();
        let mut body = Vec::new();
        while let Some(b) = up.read_response_body().await.unwrap() {
            body.extend_from_slice(&b);
        }
        assert_eq!(body, b"ok");
        assert!(up.response_done());
        (up, reused)
    }

    /// One GET through `c`, then released; returns whether it reused a connection.
    async fn exchange(c: &Connector, peer: &HttpPeer) -> bool {
        let (up, reused) = get(c, peer).await;
        c.release_http_session(up, peer, Some(Duration::from_secs(60)))
            .await;
        reused
    }

    fn peer(addr: std::net::SocketAddr) -> HttpPeer {
        let mut p = HttpPeer::new(addr, false, String::new());
        p.options.alpn = ALPN::H1;
        p
    }

    #[tokio::test]
    async fn a_released_connection_is_reused_and_a_closed_one_is_replaced() {
        let (addr, accepted) = server(3, Duration::ZERO).await;
        let c = Connector::new();
        let p = peer(addr);
        assert!(!exchange(&c, &p).await, "the first request connects");
        assert!(exchange(&c, &p).await);
        assert!(exchange(&c, &p).await);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for three requests"
        );
        // The server closed it after its third answer: the close is seen when the next
        // request looks for an idle connection, and a new one is opened.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !exchange(&c, &p).await,
            "a closed idle connection is not handed out"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_expired_connection_is_never_handed_out() {
        let (addr, accepted) = server(usize::MAX, Duration::ZERO).await;
        let c = Connector::new();
        let p = peer(addr);
        let (up, _) = get(&c, &p).await;
        c.release_http_session(up, &p, Some(Duration::ZERO)).await;
        assert_eq!(
            c.idle.lock().unwrap().count,
            1,
            "pooled: the server keeps it open"
        );
        assert!(c.take_idle(p.reuse_hash()).is_none(), "but expired");
        assert_eq!(c.idle.lock().unwrap().count, 0);
        assert!(!exchange(&c, &p).await, "a new connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connections_the_server_closed_are_not_pooled_and_are_swept() {
        // Closed at once after the answer: seen at release, never pooled.
        let (addr, accepted) = server(1, Duration::ZERO).await;
        let c = Connector::new();
        let p = peer(addr);
        for _ in 0..3 {
            assert!(!exchange(&c, &p).await);
            assert_eq!(c.idle.lock().unwrap().count, 0);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);

        // Closed 100 ms after the answer: pooled, then found closed by a sweep.
        let (addr, _) = server(1, Duration::from_millis(100)).await;
        let p = peer(addr);
        assert!(!exchange(&c, &p).await);
        assert_eq!(c.idle.lock().unwrap().count, 1);
        c.idle.lock().unwrap().sweep(Instant::now());
        assert_eq!(c.idle.lock().unwrap().count, 1, "still open: kept");
        tokio::time::sleep(Duration::from_millis(400)).await;
        c.idle.lock().unwrap().sweep(Instant::now());
        assert_eq!(
            c.idle.lock().unwrap().count,
            0,
            "closed by the server: swept"
        );
        assert!(c.idle.lock().unwrap().by_peer.is_empty());
    }

    #[tokio::test]
    async fn the_pool_keeps_at_most_max_idle_connections() {
        let (addr, accepted) = server(usize::MAX, Duration::ZERO).await;
        let c = Connector::new();
        let p = peer(addr);
        let mut held = Vec::new();
        for _ in 0..MAX_IDLE + 3 {
            let (up, reused) = get(&c, &p).await;
            assert!(!reused, "nothing is idle while every session is held");
            held.push(up);
        }
        for up in held {
            c.release_http_session(up, &p, Some(Duration::from_secs(60)))
                .await;
        }
        assert_eq!(c.idle.lock().unwrap().count, MAX_IDLE);
        assert_eq!(
            c.idle.lock().unwrap().by_peer[&p.reuse_hash()].len(),
            MAX_IDLE
        );
        assert_eq!(accepted.load(Ordering::SeqCst), MAX_IDLE + 3);
        assert!(exchange(&c, &p).await, "the kept ones are reused");
    }
}
