//! A small raw HTTP/1.1 client for tests: exact bytes, chunked decoding, per-read timeouts,
//! and the ability to hang up at any point.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A complete response.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

fn write_request(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    let mut has_ct = false;
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("content-type") {
            has_ct = true;
        }
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        if !has_ct {
            req.push_str("content-type: application/json\r\n");
        }
        req.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .expect("write request head");
    stream.write_all(body).expect("write request body");
}

fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header line");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    s.set_nodelay(true).ok();
    s
}

/// Sends a request and reads the whole response (content-length, chunked or close-delimited).
pub(crate) fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut s = StreamReader::open_raw(addr, method, path, headers, body);
    let body = s.read_to_end(Duration::from_secs(30));
    Response {
        status: s.status,
        headers: s.headers.clone(),
        body,
    }
}

pub(crate) fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    request(addr, "GET", path, headers, b"")
}

pub(crate) fn post_json(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    request(addr, "POST", path, headers, body.as_bytes())
}

/// An open response whose body is read piece by piece.
pub(crate) struct StreamReader {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// When the request was written.
    pub sent_at: Instant,
    /// When the response head was read.
    pub head_at: Instant,
    chunked: bool,
    remaining: Option<usize>,
    /// No more body will be read (ended cleanly or cut).
    done: bool,
    /// The body ended by EOF before its framing said it would.
    cut: bool,
}

fn eof(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what.to_string())
}

impl StreamReader {
    pub(crate) fn open(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> StreamReader {
        Self::open_raw(addr, "POST", path, headers, body.as_bytes())
    }

    pub(crate) fn open_raw(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> StreamReader {
        let mut stream = connect(addr);
        let sent_at = Instant::now();
        write_request(&mut stream, method, path, headers, body);
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader);
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        let remaining = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok());
        // A 204 or 304 has no body (RFC 9110 §15.3.5, §15.4.5), whatever its headers say.
        let done = method == "HEAD" || matches!(status, 204 | 304) || remaining == Some(0);
        StreamReader {
            reader,
            status,
            headers,
            sent_at,
            head_at: Instant::now(),
            chunked,
            remaining,
            done,
            cut: false,
        }
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next piece of body (one HTTP chunk, or whatever bytes arrived), `None` at the end.
    /// Panics if nothing arrives within `timeout`, or if the body is cut (EOF before the
    /// chunked terminator or the full Content-Length).
    pub(crate) fn next_piece(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        self.try_next_piece(timeout)
            .unwrap_or_else(|e| panic!("reading body: {e}"))
    }

    /// As [`next_piece`], returning the I/O error (timeouts are `WouldBlock`/`TimedOut`; a
    /// cut body is `UnexpectedEof`, after which [`is_cut`](Self::is_cut) holds).
    pub(crate) fn try_next_piece(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        if self.chunked {
            let r = self.next_chunk();
            if let Err(e) = &r {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    // Nothing more can come: the body was cut.
                    self.done = true;
                    self.cut = true;
                }
            }
            return r;
        }
        let want = self.remaining.unwrap_or(64 * 1024).min(64 * 1024);
        if want == 0 {
            self.done = true;
            return Ok(None);
        }
        let mut buf = vec![0u8; want];
        let n = self.reader.read(&mut buf)?;
        if n == 0 {
            self.done = true;
            if self.remaining.is_some() {
                // EOF with Content-Length bytes still owed.
                self.cut = true;
                return Err(eof("EOF before the Content-Length was read"));
            }
            return Ok(None);
        }
        buf.truncate(n);
        if let Some(r) = self.remaining.as_mut() {
            *r -= n;
            if *r == 0 {
                self.done = true;
            }
        }
        Ok(Some(buf))
    }

    /// One HTTP chunk; `None` after the `0` chunk and its (empty) trailer section. EOF
    /// anywhere before that is an `UnexpectedEof` error: a cut body, not an end.
    fn next_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 || !line.ends_with('\n') {
            return Err(eof("EOF before the chunked terminator"));
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailer fields (none expected) until the empty line.
            loop {
                let mut t = String::new();
                if self.reader.read_line(&mut t)? == 0 || !t.ends_with('\n') {
                    return Err(eof("EOF inside the chunked trailer"));
                }
                if t == "\r\n" || t == "\n" {
                    break;
                }
            }
            self.done = true;
            return Ok(None);
        }
        let mut buf = vec![0u8; size];
        self.reader.read_exact(&mut buf)?;
        let mut crlf = [0u8; 2];
        self.reader.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(std::io::Error::other(format!(
                "chunk of {size} bytes not followed by CRLF: {crlf:?}"
            )));
        }
        Ok(Some(buf))
    }

    /// Reads the rest of the body (each read bounded by `per_read`). Panics if the body is
    /// cut (EOF before the chunked terminator or the full Content-Length).
    pub(crate) fn read_to_end(&mut self, per_read: Duration) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(p) = self.next_piece(per_read) {
            out.extend_from_slice(&p);
        }
        out
    }

    /// Reads the rest of a body that may be cut: everything read, and whether it ended
    /// cleanly (`true`) or was cut by EOF (`false`). Other errors (timeouts) panic.
    pub(crate) fn read_to_end_or_cut(&mut self, per_read: Duration) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        loop {
            match self.try_next_piece(per_read) {
                Ok(Some(p)) => out.extend_from_slice(&p),
                Ok(None) => return (out, true),
                Err(e) if self.cut => {
                    let _ = e;
                    return (out, false);
                }
                Err(e) => panic!("reading body: {e}"),
            }
        }
    }

    /// Reads until the body contains `needle` or ends; returns everything read.
    pub(crate) fn read_until(&mut self, needle: &[u8], per_read: Duration) -> Vec<u8> {
        let mut out = Vec::new();
        while !out.windows(needle.len()).any(|w| w == needle) {
            match self.next_piece(per_read) {
                Some(p) => out.extend_from_slice(&p),
                None => break,
            }
        }
        out
    }

    /// Whether the body ended cleanly: the chunked terminator (`0` chunk and the empty
    /// line after it) or the full Content-Length was read, or a close-delimited body hit
    /// EOF. A body cut by EOF before its end is not done (see [`is_cut`](Self::is_cut)).
    pub(crate) fn is_done(&self) -> bool {
        self.done && !self.cut
    }

    /// Whether the body was cut: EOF before the chunked terminator or the full length.
    pub(crate) fn is_cut(&self) -> bool {
        self.cut
    }

    /// Hangs up (closes the socket).
    pub(crate) fn close(self) {
        let s = self.reader.into_inner();
        let _ = s.shutdown(std::net::Shutdown::Both);
    }

    /// The underlying socket (e.g. to stop reading and let buffers fill).
    pub(crate) fn socket(&self) -> &TcpStream {
        self.reader.get_ref()
    }
}

/// Splits an SSE body into events (each without its trailing blank line).
pub(crate) fn sse_events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// Concatenates `delta.content` of every OpenAI chunk in an SSE body.
pub(crate) fn sse_text(body: &[u8]) -> String {
    let mut out = String::new();
    for ev in sse_events(body) {
        for line in ev.lines() {
            if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    continue;
                }
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(d) {
                    if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                        out.push_str(c);
                    }
                }
            }
        }
    }
    out
}
