//! Owns the head limits *before* Pingora parses the head: [`HeadScan`] watches the bytes of a
//! request head as the connection's stream wrapper ([`crate::edge::connection`]) reads them, and
//! stops the read as soon as the head passes `server.max_uri_bytes` (414),
//! `server.max_request_headers` or `server.max_request_header_bytes` (431);
//! [`write_refusal`] then answers on the raw stream and closes it.
//!
//! Why before: Pingora 0.9.1 buffers up to 1 MiB of head per connection and answers a head
//! over its own ceilings (256 fields, 1 MiB) with a bare 400. Stopping at the configured
//! limit keeps a head's memory at that limit (32 KiB by default, not 1 MiB) and gives the
//! right status in the client's dialect for every oversized head. The exact checks on the
//! parsed head ([`crate::edge::screen::check_head`]) still run for every request. This scan counts
//! raw bytes and lines (with 32 bytes of slack for the request line's method and version),
//! so at the margin it can differ from the exact check (a head padded with extra whitespace,
//! a method longer than 20 bytes).
//!
//! On a reused keep-alive connection the head's first bytes may have been read with the
//! previous request (pipelining), so the scan may pick a head up mid-way and count less than
//! all of it (the exact check covers that); its first line is taken for the request line
//! only when it starts like one (`METHOD SP /`, `*` or `h`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use pingora::protocols::Stream;

use crate::error::GatewayError;
use crate::metrics::metrics;
use crate::protocol::ClientDialect;

/// Room in the request line beyond the target: method, two spaces, `HTTP/1.1`, CRLF.
const REQUEST_LINE_SLACK: usize = 32;

/// How long the refusal may take to write, and how long the client's remaining bytes are
/// read and discarded after it (so that closing does not reset the connection before the
/// client has read the answer).
const LINGER: Duration = Duration::from_secs(2);

/// Most bytes read and discarded after a refusal.
const LINGER_BYTES: usize = 1 << 20;

/// The head limits in force for one head (from `server.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// `server.max_request_header_bytes`.
    pub max_bytes: usize,
    /// `server.max_request_headers`.
    pub max_fields: usize,
    /// `server.max_uri_bytes`.
    pub max_uri: usize,
}

/// Which limit a head passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The request line (its target) is too long: 414.
    Uri,
    /// Too many header fields: 431.
    Fields,
    /// Too many bytes: 431.
    Bytes,
}

/// The scan of one request head.
#[derive(Debug, Default)]
pub struct HeadScan {
    /// Bytes of the head seen.
    bytes: usize,
    /// Complete lines seen (the request line included when `from_start`).
    lines: usize,
    /// Length of the current line so far (CR not counted).
    line_len: usize,
    /// The end of the head was seen: nothing more to check.
    done: bool,
    /// Whether the first line seen is the request line: known from the start for a
    /// connection's first request, else decided by its first bytes (`None` until then).
    request_line: Option<bool>,
    /// The first bytes of the request line (to tell the dialect by the path).
    start: [u8; 24],
    /// How many of `start` are filled.
    start_len: usize,
}

impl HeadScan {
    /// A scan of a new head; `from_start` when its first byte will be seen (a connection's
    /// first request; a reused connection's head may have begun in an earlier read).
    pub fn new(from_start: bool) -> Self {
        Self {
            request_line: from_start.then_some(true),
            ..Self::default()
        }
    }

    /// Decides from the first line's bytes so far whether it is a request line:
    /// `[A-Z]+ SP` then `/`, `*` or `h`.
    fn classify(&mut self) {
        let line = &self.start[..self.start_len];
        let Some(sp) = line.iter().position(|b| !b.is_ascii_uppercase()) else {
            return;
        };
        if line[sp] != b' ' || sp == 0 {
            self.request_line = Some(false);
        } else if let Some(next) = line.get(sp + 1) {
            self.request_line = Some(matches!(next, b'/' | b'*' | b'h'));
        }
    }

    /// Feeds bytes read for the head; `Some` once a limit is passed (the head must not be
    /// passed on).
    pub fn feed(&mut self, data: &[u8], limits: HeadLimits) -> Option<Overflow> {
        let mut i = 0;
        while let Some(&b) = data.get(i) {
            if self.done {
                return None;
            }
            if !matches!(b, b'\r' | b'\n') && (self.lines > 0 || self.start_len >= self.start.len())
            {
                // A run of a line's bytes past the request line's first ones, counted at
                // once: [`step`](Self::step) would only add them up (the field count cannot
                // change within a line, and the byte and line limits are passed in the run
                // if they are passed at its end).
                let run = memchr::memchr2(b'\r', b'\n', &data[i..]).unwrap_or(data.len() - i);
                self.bytes += run;
                self.line_len += run;
                i += run;
                let in_request_line = self.request_line == Some(true) && self.lines == 0;
                if in_request_line
                    && (self.line_len > limits.max_uri + REQUEST_LINE_SLACK
                        || self.bytes > limits.max_bytes)
                {
                    return Some(Overflow::Uri);
                }
                if self.bytes > limits.max_bytes {
                    return Some(Overflow::Bytes);
                }
                continue;
            }
            if let Some(o) = self.step(b, limits) {
                return Some(o);
            }
            i += 1;
        }
        None
    }

    /// One byte of the head: line ends, the request line's first bytes, the limits.
    fn step(&mut self, b: u8, limits: HeadLimits) -> Option<Overflow> {
        self.bytes += 1;
        let leading_empty = self.lines == 0 && self.line_len == 0 && matches!(b, b'\r' | b'\n');
        if self.lines == 0 && !leading_empty && self.start_len < self.start.len() {
            self.start[self.start_len] = b;
            self.start_len += 1;
            if self.request_line.is_none() {
                self.classify();
            }
        }
        match b {
            b'\n' if self.line_len == 0 => {
                // An empty line: the end of the head (or, before the request line, an
                // empty line RFC 9112 §2.2 lets a server ignore).
                if self.lines > 0 || self.request_line != Some(true) {
                    self.done = true;
                }
            }
            b'\n' => {
                self.lines += 1;
                self.line_len = 0;
            }
            b'\r' => {}
            _ => self.line_len += 1,
        }
        let in_request_line = self.request_line == Some(true) && self.lines == 0;
        if in_request_line && self.line_len > limits.max_uri + REQUEST_LINE_SLACK {
            return Some(Overflow::Uri);
        }
        // The first line counts as a field only when it is known not to be the request
        // line (lenient while undecided).
        let fields = if self.request_line == Some(false) {
            self.lines
        } else {
            self.lines.saturating_sub(1)
        };
        if fields > limits.max_fields {
            return Some(Overflow::Fields);
        }
        if self.bytes > limits.max_bytes {
            return Some(if in_request_line {
                Overflow::Uri
            } else {
                Overflow::Bytes
            });
        }
        None
    }

    /// The dialect the request line's path implies (Anthropic's for `/v1/messages…`).
    pub fn dialect(&self) -> ClientDialect {
        let line = &self.start[..self.start_len];
        let target = line
            .iter()
            .position(|b| *b == b' ')
            .map_or(&[][..], |i| &line[i + 1..]);
        let path = target.strip_prefix(b"/v1").unwrap_or(target);
        if path.starts_with(b"/messages") {
            ClientDialect::Messages
        } else {
            ClientDialect::ChatCompletions
        }
    }
}

/// The client-facing error of an overflow.
pub fn overflow_error(o: Overflow, limits: HeadLimits) -> GatewayError {
    match o {
        Overflow::Uri => GatewayError::UriTooLong {
            limit_bytes: limits.max_uri,
        },
        Overflow::Fields => GatewayError::HeaderTooLarge {
            message: format!(
                "the request has more than {} header fields",
                limits.max_fields
            ),
            reason: "too_many_headers",
        },
        Overflow::Bytes => GatewayError::HeaderTooLarge {
            message: format!(
                "the request head is larger than the limit of {} bytes",
                limits.max_bytes
            ),
            reason: "header_too_large",
        },
    }
}

/// Answers an oversized head on the raw stream (`Connection: close`, the error in
/// `dialect`), then reads and discards what the client still sends for a moment, and closes.
/// Counted in `sluice_rejected_total{reason}`.
pub async fn write_refusal(mut stream: Stream, err: &GatewayError, dialect: ClientDialect) {
    metrics()
        .rejected_total
        .with_label_values(&[err.metric_label()])
        .inc();
    let body = err.body_for(dialect, None);
    let reason = match err.status() {
        414 => "URI Too Long",
        _ => "Request Header Fields Too Large",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        err.status(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    let written = tokio::time::timeout(LINGER, async {
        stream.write_all(&out).await?;
        stream.flush().await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    // Lingering close: drain until the client closes, a limit, or the time is up.
    let _ = tokio::time::timeout(LINGER, async {
        let mut buf = [0u8; 8192];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-at-a-time scan `feed` replaced, kept as its reference.
    fn feed_bytewise(s: &mut HeadScan, data: &[u8], limits: HeadLimits) -> Option<Overflow> {
        for &b in data {
            if s.done {
                return None;
            }
            s.bytes += 1;
            let leading_empty = s.lines == 0 && s.line_len == 0 && matches!(b, b'\r' | b'\n');
            if s.lines == 0 && !leading_empty && s.start_len < s.start.len() {
                s.start[s.start_len] = b;
                s.start_len += 1;
                if s.request_line.is_none() {
                    s.classify();
                }
            }
            match b {
                b'\n' if s.line_len == 0 => {
                    // An empty line: the end of the head (or, before the request line, an
                    // empty line RFC 9112 §2.2 lets a server ignore).
                    if s.lines > 0 || s.request_line != Some(true) {
                        s.done = true;
                    }
                }
                b'\n' => {
                    s.lines += 1;
                    s.line_len = 0;
                }
                b'\r' => {}
                _ => s.line_len += 1,
            }
            let in_request_line = s.request_line == Some(true) && s.lines == 0;
            if in_request_line && s.line_len > limits.max_uri + REQUEST_LINE_SLACK {
                return Some(Overflow::Uri);
            }
            // The first line counts as a field only when it is known not to be the request
            // line (lenient while undecided).
            let fields = if s.request_line == Some(false) {
                s.lines
            } else {
                s.lines.saturating_sub(1)
            };
            if fields > limits.max_fields {
                return Some(Overflow::Fields);
            }
            if s.bytes > limits.max_bytes {
                return Some(if in_request_line {
                    Overflow::Uri
                } else {
                    Overflow::Bytes
                });
            }
        }
        None
    }

    proptest::proptest! {
        /// Counting a line's bytes in runs answers as the byte-at-a-time scan, in any
        /// chunking, for any limits.
        #[test]
        fn runs_answer_as_the_bytewise_scan(
            parts in proptest::collection::vec(0usize..8, 0..40),
            cuts in proptest::collection::vec(1usize..40, 1..8),
            from_start: bool,
            max_bytes in 1usize..300,
            max_fields in 0usize..6,
            max_uri in 0usize..80,
        ) {
            const PIECES: [&str; 8] = [
                "POST /v1/chat/completions HTTP/1.1", "\r\n", "\n", "host: a.example",
                "x-long-header-name-for-runs: vvvvvvvvvvvvvvvvvvvvvv", "GET", " /", "\r",
            ];
            let data: Vec<u8> = parts.iter().flat_map(|&p| PIECES[p].bytes()).collect();
            let limits = HeadLimits { max_bytes, max_fields, max_uri };
            let mut fast = HeadScan::new(from_start);
            let mut slow = HeadScan::new(from_start);
            let (mut rest, mut k) = (&data[..], 0);
            let (mut got, mut want) = (None, None);
            while !rest.is_empty() && got.is_none() && want.is_none() {
                let n = cuts[k % cuts.len()].min(rest.len());
                got = fast.feed(&rest[..n], limits);
                want = feed_bytewise(&mut slow, &rest[..n], limits);
                rest = &rest[n..];
                k += 1;
            }
            proptest::prop_assert_eq!(got, want);
            proptest::prop_assert_eq!(fast.done, slow.done);
            proptest::prop_assert_eq!(fast.dialect(), slow.dialect());
            if got.is_none() {
                proptest::prop_assert_eq!((fast.bytes, fast.lines, fast.line_len), (slow.bytes, slow.lines, slow.line_len));
            }
        }
    }

    const L: HeadLimits = HeadLimits {
        max_bytes: 200,
        max_fields: 3,
        max_uri: 40,
    };

    fn scan(from_start: bool, data: &[u8]) -> Option<Overflow> {
        HeadScan::new(from_start).feed(data, L)
    }

    #[test]
    fn heads_within_the_limits_pass_and_the_body_is_not_scanned() {
        let head = b"POST /v1/chat HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n";
        let mut body = head.to_vec();
        body.extend(std::iter::repeat_n(b'x', 1000));
        assert_eq!(scan(true, &body), None);
        // Bare LF line ends and leading empty lines.
        assert_eq!(scan(true, b"\r\nGET / HTTP/1.1\na: 1\n\n"), None);
    }

    #[test]
    fn each_limit_is_named() {
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(80));
        assert_eq!(scan(true, long.as_bytes()), Some(Overflow::Uri));
        let many = b"GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\n";
        assert_eq!(scan(true, many), Some(Overflow::Fields));
        let big = format!("GET / HTTP/1.1\r\na: {}\r\n", "v".repeat(200));
        assert_eq!(scan(true, big.as_bytes()), Some(Overflow::Bytes));
        // Split across reads, the same.
        let mut s = HeadScan::new(true);
        assert_eq!(s.feed(&many[..10], L), None);
        assert_eq!(s.feed(&many[10..], L), Some(Overflow::Fields));
    }

    #[test]
    fn a_head_picked_up_mid_way_has_no_request_line() {
        // 80 bytes of a field: no 414 (it is not the request line), within the byte limit.
        let tail = format!("x: {}\r\n\r\n", "v".repeat(80));
        assert_eq!(scan(false, tail.as_bytes()), None);
        // A whole head on a reused connection is recognised.
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(80));
        assert_eq!(scan(false, long.as_bytes()), Some(Overflow::Uri));
        let four = b"GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\n\r\n";
        assert_eq!(scan(false, four), None);
        // Picked up at a field: that line counts.
        assert_eq!(
            scan(false, b"a: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\n"),
            Some(Overflow::Fields)
        );
    }

    #[test]
    fn the_dialect_follows_the_path() {
        let mut s = HeadScan::new(true);
        s.feed(b"POST /v1/messages HTTP/1.1\r\n", L);
        assert_eq!(s.dialect(), ClientDialect::Messages);
        let mut s = HeadScan::new(true);
        s.feed(b"POST /v1/chat/completions HTTP/1.1\r\n", L);
        assert_eq!(s.dialect(), ClientDialect::ChatCompletions);
    }
}
