//! Minimal HTTP/1.1 for the mock upstream: request parsing with `httparse`
//! (Content-Length and chunked bodies, `Expect: 100-continue`) and a response writer
//! that sends each piece as its own TCP write / HTTP chunk and records progress live.

use std::io;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::record::{lock, RecordHandle};

/// Maximum size of a request head, bytes.
const MAX_HEAD: usize = 64 * 1024;
/// Maximum size of a request body, bytes.
pub(crate) const MAX_BODY: usize = 64 * 1024 * 1024;
/// Maximum idle time between keep-alive requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Maximum time for one read while a request is partially received.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The read side of a connection (a TCP socket's, or an in-process stream's for the demo).
pub(crate) type Rd = dyn AsyncRead + Unpin + Send;
/// The write side of a connection.
pub(crate) type Wr = dyn AsyncWrite + Unpin + Send;

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub keep_alive: bool,
}

impl Request {
    /// First value of a header (name lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Path without the query string.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Clean EOF (or idle timeout) before the first byte of a request.
    Closed,
    /// Malformed request; respond 400 and close.
    Bad(String),
    /// Head or body too large; respond with this status and close.
    TooLarge(u16),
    /// I/O error or timeout mid-request.
    Io(io::Error),
}

async fn fill(rd: &mut Rd, buf: &mut BytesMut, idle: bool) -> Result<usize, ReadError> {
    let limit = if idle { IDLE_TIMEOUT } else { READ_TIMEOUT };
    match tokio::time::timeout(limit, rd.read_buf(buf)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => {
            if idle {
                Err(ReadError::Closed)
            } else {
                Err(ReadError::Io(e))
            }
        }
        Err(_) => {
            if idle {
                Err(ReadError::Closed)
            } else {
                Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request read timed out",
                )))
            }
        }
    }
}

/// Read one request from `rd` (buffered in `buf`, which may hold pipelined bytes).
#[expect(
    clippy::too_many_lines,
    reason = "one HTTP/1.1 request parser, step by step as RFC 9112 reads"
)]
pub(crate) async fn read_request(
    rd: &mut Rd,
    wr: &mut Wr,
    buf: &mut BytesMut,
) -> Result<Request, ReadError> {
    // Skip stray CRLFs between requests.
    while buf.first().is_some_and(|b| *b == b'\r' || *b == b'\n') {
        buf.advance(1);
    }
    let (mut req, chunked, content_length, expect_continue) = loop {
        if !buf.is_empty() {
            let mut hdrs = [httparse::EMPTY_HEADER; 128];
            let mut parsed = httparse::Request::new(&mut hdrs);
            match parsed.parse(buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let method = parsed.method.unwrap_or("").to_string();
                    let target = parsed.path.unwrap_or("").to_string();
                    let version = parsed.version.unwrap_or(1);
                    let headers: Vec<(String, String)> = parsed
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    buf.advance(n);
                    let conn_tokens: Vec<String> = headers
                        .iter()
                        .filter(|(k, _)| k == "connection")
                        .flat_map(|(_, v)| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
                        .collect();
                    let keep_alive = if version == 0 {
                        conn_tokens.iter().any(|t| t == "keep-alive")
                    } else {
                        !conn_tokens.iter().any(|t| t == "close")
                    };
                    let chunked = headers.iter().any(|(k, v)| {
                        k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked")
                    });
                    let mut content_length = None;
                    for (k, v) in &headers {
                        if k == "content-length" {
                            match v.trim().parse::<usize>() {
                                Ok(n) => content_length = Some(n),
                                Err(_) => {
                                    return Err(ReadError::Bad("invalid content-length".into()))
                                }
                            }
                        }
                    }
                    let expect = headers
                        .iter()
                        .any(|(k, v)| k == "expect" && v.eq_ignore_ascii_case("100-continue"));
                    break (
                        Request {
                            method,
                            target,
                            headers,
                            body: Vec::new(),
                            keep_alive,
                        },
                        chunked,
                        content_length,
                        expect,
                    );
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() > MAX_HEAD {
                        return Err(ReadError::TooLarge(431));
                    }
                }
                Err(e) => return Err(ReadError::Bad(format!("malformed request head: {e}"))),
            }
        }
        let was_empty = buf.is_empty();
        let n = fill(rd, buf, was_empty).await?;
        if n == 0 {
            return Err(if was_empty {
                ReadError::Closed
            } else {
                ReadError::Bad("EOF inside request head".into())
            });
        }
    };

    let has_body = chunked || content_length.is_some_and(|n| n > 0);
    if expect_continue && has_body {
        wr.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(ReadError::Io)?;
    }
    if chunked {
        req.body = read_chunked(rd, buf).await?;
    } else if let Some(n) = content_length {
        if n > MAX_BODY {
            return Err(ReadError::TooLarge(413));
        }
        while buf.len() < n {
            if fill(rd, buf, false).await? == 0 {
                return Err(ReadError::Bad("EOF inside request body".into()));
            }
        }
        req.body = buf.split_to(n).to_vec();
    }
    Ok(req)
}

/// Read one CRLF-terminated line (without the CRLF) from the buffer, filling as needed.
async fn read_line(rd: &mut Rd, buf: &mut BytesMut) -> Result<Vec<u8>, ReadError> {
    loop {
        if let Some(i) = memchr::memchr(b'\n', buf) {
            let mut line = buf.split_to(i + 1).to_vec();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(line);
        }
        if buf.len() > MAX_HEAD {
            return Err(ReadError::Bad("chunk size line too long".into()));
        }
        if fill(rd, buf, false).await? == 0 {
            return Err(ReadError::Bad("EOF inside chunked body".into()));
        }
    }
}

async fn read_chunked(rd: &mut Rd, buf: &mut BytesMut) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(rd, buf).await?;
        let text = String::from_utf8_lossy(&line);
        let size_str = text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|_| ReadError::Bad(format!("invalid chunk size {size_str:?}")))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                if read_line(rd, buf).await?.is_empty() {
                    return Ok(body);
                }
            }
        }
        // `size` is peer-controlled (up to usize::MAX): compare without overflow.
        if size > MAX_BODY - body.len() {
            return Err(ReadError::TooLarge(413));
        }
        while buf.len() < size + 2 {
            if fill(rd, buf, false).await? == 0 {
                return Err(ReadError::Bad("EOF inside chunk".into()));
            }
        }
        body.extend_from_slice(&buf[..size]);
        if &buf[size..size + 2] != b"\r\n" {
            return Err(ReadError::Bad("missing CRLF after chunk".into()));
        }
        buf.advance(size + 2);
    }
}

/// Standard reason phrase.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Site Overloaded",
        _ => "Status",
    }
}

/// Body framing of a response.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Framing {
    /// `Content-Length: n`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Response writer bound to one request record.
pub(crate) struct Out<'a> {
    pub wr: &'a mut Wr,
    pub rec: &'a RecordHandle,
    pub start: Instant,
    /// Bound of each single write (a peer that does not read blocks us at most this long).
    pub write_timeout: Duration,
    chunked: bool,
}

impl<'a> Out<'a> {
    /// New writer.
    pub(crate) fn new(
        wr: &'a mut Wr,
        rec: &'a RecordHandle,
        start: Instant,
        write_timeout: Duration,
    ) -> Self {
        Out {
            wr,
            rec,
            start,
            write_timeout,
            chunked: false,
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    async fn raw(&mut self, data: &[u8]) -> io::Result<()> {
        match tokio::time::timeout(self.write_timeout, self.wr.write_all(data)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "response write timed out",
                ))
            }
        }
        self.wr.flush().await
    }

    /// Write the status line and headers.
    pub(crate) async fn head(
        &mut self,
        status: u16,
        headers: &[(String, String)],
        framing: Framing,
        close: bool,
    ) -> io::Result<()> {
        let mut h = format!("HTTP/1.1 {} {}\r\n", status, reason(status));
        for (k, v) in headers {
            h.push_str(k);
            h.push_str(": ");
            h.push_str(v);
            h.push_str("\r\n");
        }
        match framing {
            Framing::Length(n) => h.push_str(&format!("Content-Length: {n}\r\n")),
            Framing::Chunked => h.push_str("Transfer-Encoding: chunked\r\n"),
        }
        self.chunked = matches!(framing, Framing::Chunked);
        h.push_str(if close {
            "Connection: close\r\n"
        } else {
            "Connection: keep-alive\r\n"
        });
        h.push_str("\r\n");
        {
            let mut r = lock(self.rec);
            r.status = Some(status);
        }
        self.raw(h.as_bytes()).await?;
        let now = self.now_ms();
        let mut r = lock(self.rec);
        r.head_at_ms = Some(now);
        r.wire_bytes += h.len() as u64;
        Ok(())
    }

    /// Write one body piece as its own write (and its own HTTP chunk when chunked).
    pub(crate) async fn piece(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let wire = if self.chunked {
            let mut f = Vec::with_capacity(data.len() + 12);
            f.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            f.extend_from_slice(data);
            f.extend_from_slice(b"\r\n");
            self.raw(&f).await?;
            f.len()
        } else {
            self.raw(data).await?;
            data.len()
        };
        let mut r = lock(self.rec);
        r.bytes_written += data.len() as u64;
        r.wire_bytes += wire as u64;
        Ok(())
    }

    /// Body bytes written so far.
    pub(crate) fn body_written(&self) -> u64 {
        lock(self.rec).bytes_written
    }

    /// Finish the response (chunked terminator if chunked) and mark it completed.
    pub(crate) async fn finish(&mut self) -> io::Result<()> {
        if self.chunked {
            self.raw(b"0\r\n\r\n").await?;
        }
        let now = self.now_ms();
        let mut r = lock(self.rec);
        if self.chunked {
            r.wire_bytes += 5;
        }
        r.completed = true;
        r.completed_at_ms = Some(now);
        Ok(())
    }
}

/// Write a complete small response (used for control endpoints and early errors).
pub(crate) async fn simple_response(
    wr: &mut Wr,
    status: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        status,
        reason(status),
        content_type,
        body.len(),
        if close { "close" } else { "keep-alive" }
    )
    .into_bytes();
    out.extend_from_slice(body);
    match tokio::time::timeout(READ_TIMEOUT, wr.write_all(&out)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "response write timed out",
            ))
        }
    }
    wr.flush().await
}
