//! Owns opening one upstream request: connect (through the caller's pool), send the head and
//! body, read the final response head, and send once more on a fresh connection when a
//! pooled one proves stale. Every caller that sends a provider a request goes through
//! [`open`]: an attempt of the attempt loop (`crate::engine::open`), a mid-stream
//! continuation (`crate::engine::continuation`), a token count
//! (`crate::ingress::count_tokens`) and an active health probe (`crate::routing::probe`);
//! each maps [`OpenError`] into its own failure record.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::protocols::http::client::HttpSession;

/// When a failed send may go out again, once, on a fresh connection (only ever after a
/// failure on a connection taken from the pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Only when the failure proves the provider cannot have processed the request
    /// ([`SendError::unprocessed`]): anything that generates (an attempt, a continuation).
    Unprocessed,
    /// After any failure: a request that generates nothing (a token count).
    Any,
    /// Never (a health probe).
    Never,
}

impl Resend {
    fn allows(self, e: &SendError) -> bool {
        match self {
            Resend::Unprocessed => e.unprocessed,
            Resend::Any => true,
            Resend::Never => false,
        }
    }
}

/// The deadlines of [`open`]'s two steps (`None`: the caller bounds the whole exchange).
#[derive(Debug, Clone, Copy, Default)]
pub struct Deadlines {
    /// TCP + TLS connect.
    pub connect: Option<Duration>,
    /// Request written → final response head read.
    pub first_byte: Option<Duration>,
}

/// Where [`open`] is, told to its caller as it goes (for phase labels and metrics).
#[derive(Debug)]
pub enum Step<'a> {
    /// Connecting (each try starts here).
    Connecting,
    /// Connected: sending the request and waiting for the response head.
    Sending,
    /// The pooled connection was stale: the request goes out again on a fresh one.
    Resending(&'a SendError),
}

/// Why [`open`] failed. After a send failure or a first-byte timeout the connection was
/// shut down.
#[derive(Debug)]
pub enum OpenError<E> {
    /// Building the request head for a resend failed (the caller's own error).
    Head(E),
    /// Pingora's connect (or TLS) error.
    Connect(pingora::BError),
    /// The connect deadline passed.
    ConnectTimeout,
    /// Sending the request or reading the response head failed.
    Send(SendError),
    /// The first-byte deadline passed.
    FirstByteTimeout,
}

/// Opens one upstream request: `connect()` yields a connection (and whether it was pooled),
/// `head()` the request head for each try (called once, and again for a resend), `body` is
/// written behind it; returns the session with its final response head read. `step` is told
/// each step as it starts.
///
/// # Errors
/// [`OpenError`]; dropping the future (a client that left, shutdown) drops the connection.
pub async fn open<C, F, H, E>(
    mut connect: C,
    deadlines: Deadlines,
    resend: Resend,
    mut head: H,
    body: Option<Bytes>,
    mut step: impl FnMut(Step<'_>),
) -> Result<HttpSession, OpenError<E>>
where
    C: FnMut() -> F,
    F: Future<Output = pingora::Result<(HttpSession, bool)>>,
    H: FnMut() -> Result<RequestHeader, E>,
{
    let mut resent = false;
    loop {
        step(Step::Connecting);
        let connecting = connect();
        let connected = match deadlines.connect {
            Some(t) => tokio::time::timeout(t, connecting)
                .await
                .map_err(|_| OpenError::ConnectTimeout)?,
            None => connecting.await,
        };
        let (mut up, reused) = connected.map_err(OpenError::Connect)?;
        step(Step::Sending);
        let sending = send(&mut up, head().map_err(OpenError::Head)?, body.clone());
        let sent = match deadlines.first_byte {
            Some(t) => tokio::time::timeout(t, sending).await.ok(),
            None => Some(sending.await),
        };
        match sent {
            Some(Ok(())) => return Ok(up),
            Some(Err(e)) if reused && !resent && resend.allows(&e) => {
                step(Step::Resending(&e));
                resent = true;
            }
            Some(Err(e)) => {
                up.shutdown().await;
                return Err(OpenError::Send(e));
            }
            None => {
                up.shutdown().await;
                return Err(OpenError::FirstByteTimeout);
            }
        }
    }
}

/// How long after the request was written a close or reset of a *reused* connection still
/// proves the provider had closed that connection before the request reached it (a
/// connection closed while idle is refused at once: its close is already on the way or
/// the peer's kernel resets the write). A request the provider held longer may have been
/// processed, so it is never sent again on its own: that is an attempt failure for the
/// retry policy and the fallback to decide.
pub const STALE_CLOSE_WINDOW: Duration = Duration::from_millis(20);

/// Sending a request and reading its answer's head failed.
#[derive(Debug)]
pub struct SendError {
    /// What Pingora reported.
    pub error: pingora::BError,
    /// The provider cannot have processed the request: the write failed, Pingora's HTTP/2
    /// client says the stream was refused unprocessed (`REFUSED_STREAM`, `GOAWAY`), or the
    /// connection closed or reset within [`STALE_CLOSE_WINDOW`] of the write and before any
    /// response byte. Only then may the request go out again on a fresh connection.
    pub unprocessed: bool,
}

/// Sends the request head and body (`None`: no body) and reads the final (non-1xx) response
/// head, saying on failure whether the request can have been processed
/// ([`SendError::unprocessed`]).
///
/// # Errors
/// [`SendError`]: Pingora's write or read error, and whether a resend is safe.
pub async fn send(
    up: &mut HttpSession,
    head: RequestHeader,
    body: Option<Bytes>,
) -> Result<(), SendError> {
    let written = async {
        match body {
            // One send for head and body on HTTP/1.1 (the patched pingora-core, `vendor/`).
            Some(body) => {
                up.write_request_header_and_body(Box::new(head), body)
                    .await?;
            }
            None => up.write_request_header(Box::new(head)).await?,
        }
        up.finish_request_body().await
    };
    if let Err(error) = written.await {
        return Err(SendError {
            error,
            unprocessed: true,
        });
    }
    let sent = tokio::time::Instant::now();
    loop {
        if let Err(error) = up.read_response_header().await {
            let unprocessed = closed_unprocessed(&error, sent.elapsed());
            return Err(SendError { error, unprocessed });
        }
        match up.response_header() {
            Some(h) if h.status.as_u16() < 200 => {}
            _ => return Ok(()),
        }
    }
}

/// Whether a response-head read error `after` the request was written proves the request
/// unprocessed (see [`SendError::unprocessed`]).
fn closed_unprocessed(e: &pingora::Error, after: Duration) -> bool {
    use pingora::RetryType;
    match e.retry {
        // Pingora's HTTP/2 client: refused before any processing (RFC 9113 §8.7).
        RetryType::Decided(true) => true,
        // A close or an I/O error (reset), safe only on a reused connection: safe here only
        // when it came at once and before any byte of an answer.
        RetryType::ReusedOnly => after <= STALE_CLOSE_WINDOW && !response_bytes_read(e),
        RetryType::Decided(false) => false,
    }
}

/// Whether Pingora's HTTP/1 client had read part of a response head when the connection
/// failed (its context says `bytes already read: N`; an HTTP/2 error carries none).
fn response_bytes_read(e: &pingora::Error) -> bool {
    e.context
        .as_ref()
        .and_then(|c| c.as_str().rsplit_once("bytes already read: "))
        .is_some_and(|(_, n)| n.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP/1.1 server: reads one request (head and `Content-Length` body), waits
    /// `hold`, writes `reply` and closes.
    async fn server(reply: &'static [u8], hold: Duration) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            // The test request has a 2-byte body.
            while !buf.windows(6).any(|w| w == b"\r\n\r\n{}") {
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
            tokio::time::sleep(hold).await;
            s.write_all(reply).await.unwrap();
        });
        addr
    }

    async fn send_to(addr: std::net::SocketAddr) -> Result<(), SendError> {
        let connector = pingora::connectors::http::Connector::new(None);
        let peer = pingora::upstreams::peer::HttpPeer::new(addr, false, String::new());
        let (mut up, _) = connector.get_http_session(&peer).await.unwrap();
        let mut head = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        head.insert_header("host", "127.0.0.1").unwrap();
        head.insert_header("content-length", "2").unwrap();
        send(&mut up, head, Some(Bytes::from_static(b"{}"))).await
    }

    #[tokio::test]
    async fn only_a_close_at_once_and_before_any_answer_byte_proves_the_request_unprocessed() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(send_to(server(ok, Duration::ZERO).await).await.is_ok());

        // Closed at once, nothing answered: unprocessed when seen within the window (checked
        // at fixed times here: a loaded machine may see the close late).
        let e = send_to(server(b"", Duration::ZERO).await)
            .await
            .unwrap_err();
        assert!(!response_bytes_read(&e.error), "{}", e.error);
        assert!(closed_unprocessed(&e.error, Duration::ZERO), "{}", e.error);
        assert!(!closed_unprocessed(&e.error, STALE_CLOSE_WINDOW * 2));

        // Part of an answer arrived: never unprocessed.
        let e = send_to(server(b"HTTP/1.1 200", Duration::ZERO).await)
            .await
            .unwrap_err();
        assert!(response_bytes_read(&e.error), "{}", e.error);
        assert!(!closed_unprocessed(&e.error, Duration::ZERO));
        assert!(!e.unprocessed);

        // Held, then closed (the silent upstream of the issue): never unprocessed.
        let e = send_to(server(b"", STALE_CLOSE_WINDOW * 5).await)
            .await
            .unwrap_err();
        assert!(!e.unprocessed, "{}", e.error);
    }
}
