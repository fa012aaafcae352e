//! Incremental SSE re-framing: raw upstream chunks in, complete normalized
//! events out.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;

/// Errors from [`SseNormalizer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    /// The event being assembled (including any partial line, measured as
    /// normalized bytes with its terminating `\n`s) grew beyond the
    /// configured `max_event_bytes`. The offending partial event has been
    /// discarded; the stream should be treated as broken by the caller.
    LineTooLong {
        /// The configured limit, in bytes.
        limit_bytes: usize,
    },
    /// The upstream body ended in the middle of an event (a line without its line end, or
    /// data lines without the blank line that dispatches them). The partial event has been
    /// discarded: forwarding it would hand the client truncated JSON.
    Truncated {
        /// Normalized bytes of the discarded partial event.
        partial_bytes: usize,
    },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::LineTooLong { limit_bytes } => write!(
                f,
                "upstream SSE event exceeds the limit of {limit_bytes} bytes"
            ),
            SseError::Truncated { partial_bytes } => write!(
                f,
                "upstream SSE stream ended in the middle of an event ({partial_bytes} bytes discarded)"
            ),
        }
    }
}

impl std::error::Error for SseError {}

/// Metadata of the event currently being assembled. Offsets are relative to
/// the event's start in the normalizer buffer.
#[derive(Debug, Clone, Copy, Default)]
struct EventState {
    /// Number of `data` field lines seen.
    data_lines: u32,
    /// Value span of the first `data` line.
    data: (usize, usize),
    /// Value span of the last `event` line, if any.
    name: Option<(usize, usize)>,
}

/// A completed event waiting in the normalizer buffer (absolute offsets).
#[derive(Debug, Clone, Copy)]
struct ReadyEvent {
    start: usize,
    end: usize,
    state: EventState,
}

/// Incremental SSE normalizer.
///
/// Feed raw upstream body chunks with [`push`](Self::push) (any boundaries:
/// mid-line, mid-UTF-8 character, one byte at a time), then pull complete
/// events with [`next_event`](Self::next_event) until it returns `None`. At
/// upstream end-of-stream call [`finish`](Self::finish) and drain again.
///
/// Normalization (stream interpretation per the WHATWG SSE spec):
///
/// * `\r\n`, `\n` and a lone `\r` all end a line; output lines end in `\n`.
///   A `\r` ending one chunk followed by `\n` starting the next is one line
///   end.
/// * Every emitted event ends with exactly one blank line (`\n\n`); extra
///   blank lines between events are dropped, so no empty event is emitted.
/// * `data:x` becomes `data: x` (the spec strips exactly one leading space,
///   so they are equivalent); `data:  x` keeps its second space; a bare
///   `data:` or `data` line is kept as is (empty value).
/// * Everything else — comment lines (`:` …), `event:`, `id:`, `retry:`,
///   unknown fields, `data: [DONE]`, multi-line data — passes through
///   unchanged, line by line.
///
/// Only whole lines are ever emitted, so UTF-8 characters are never split.
/// Each completed line is validated as UTF-8 (`std::str::from_utf8`, the only
/// work on the fast path); invalid sequences are replaced with U+FFFD as the
/// spec's UTF-8 decode does (maximal subparts, like
/// `String::from_utf8_lossy`) and counted
/// ([`take_invalid_utf8`](Self::take_invalid_utf8)). Line ends are ASCII and
/// never part of a multi-byte sequence, so decoding line by line gives the
/// same text as decoding the whole stream, however it was chunked.
///
/// At the end of the body a trailing partial event is discarded, as the spec
/// says; [`finish`](Self::finish) reports it ([`SseError::Truncated`]) so the
/// caller can tell the client the stream broke. One leading UTF-8 BOM
/// (`EF BB BF`) is stripped, as the spec's decode does, also when it arrives
/// split across chunks (the bytes of a possible BOM are held until it is
/// decided); a BOM anywhere else is content.
///
/// Memory: one internal `Vec<u8>` holding unconsumed events plus the partial
/// event, and a small queue of event offsets; both are reused, so the steady
/// state performs no allocation. The partial event is bounded by
/// `max_event_bytes`; completed events are bounded by the caller draining
/// them (always drain after each `push`).
#[derive(Debug)]
pub struct SseNormalizer {
    /// Normalized bytes: `[read_pos, event_start)` completed events,
    /// `[event_start, line_start)` complete lines of the current event,
    /// `[line_start, len)` the current partial line (raw, no terminator).
    buf: Vec<u8>,
    read_pos: usize,
    event_start: usize,
    line_start: usize,
    /// The previous chunk ended in `\r`; a leading `\n` must be skipped.
    pending_cr: bool,
    max_event_bytes: usize,
    cur: EventState,
    ready: VecDeque<ReadyEvent>,
    /// Invalid UTF-8 sequences replaced since the last `take_invalid_utf8`.
    invalid_utf8: u64,
    /// Bytes of a leading [`BOM`] matched so far at the stream start, or
    /// [`BOM_DECIDED`] once the start is past (stripped or not there).
    bom_matched: u8,
}

/// The UTF-8 byte order mark, stripped once at the stream start.
const BOM: &[u8; 3] = b"\xEF\xBB\xBF";
/// [`SseNormalizer::bom_matched`] once the stream start is decided.
const BOM_DECIDED: u8 = u8::MAX;

impl SseNormalizer {
    /// Creates a normalizer whose events (normalized, including the
    /// terminating blank line) may be at most `max_event_bytes` bytes long;
    /// this also bounds any single line. Typical value: 1–4 MiB.
    pub fn new(max_event_bytes: usize) -> Self {
        SseNormalizer {
            // Starts small (a gateway holds one per open stream) and grows with the events.
            buf: Vec::with_capacity(max_event_bytes.clamp(256, 1024)),
            read_pos: 0,
            event_start: 0,
            line_start: 0,
            pending_cr: false,
            max_event_bytes,
            cur: EventState::default(),
            ready: VecDeque::with_capacity(4),
            invalid_utf8: 0,
            bom_matched: 0,
        }
    }

    /// Feeds one raw upstream body chunk.
    ///
    /// Events that become complete are queued for
    /// [`next_event`](Self::next_event). Events returned by earlier
    /// `next_event` calls are released here (their buffer space is reused).
    ///
    /// # Errors
    ///
    /// [`SseError::LineTooLong`] if the event being assembled exceeds
    /// `max_event_bytes`; the partial event and the rest of `chunk` are
    /// dropped (events completed earlier in `chunk` remain queued).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), SseError> {
        self.compact();
        let mut rest = chunk;
        if self.bom_matched != BOM_DECIDED {
            rest = self.strip_bom(rest)?;
        }
        if self.pending_cr {
            self.pending_cr = false;
            if let Some((&b'\n', tail)) = rest.split_first() {
                rest = tail;
            }
        }
        while let Some(i) = memchr::memchr2(b'\n', b'\r', rest) {
            let (line, tail) = rest.split_at(i);
            self.append(line)?;
            rest = match tail {
                [b'\r', b'\n', after @ ..] => after,
                [b'\r'] => {
                    self.pending_cr = true;
                    &[]
                }
                [_, after @ ..] => after,
                [] => &[],
            };
            self.end_line()?;
        }
        self.append(rest)
    }

    /// Ends the stream at the upstream's end of body. A trailing partial event
    /// is discarded and reported, except two harmless cases: an event of only
    /// complete comment or field lines without data (nothing is lost), and a
    /// complete `data: [DONE]` line missing only its blank line (queued as the
    /// `[DONE]` event). Drain with [`next_event`](Self::next_event) afterwards.
    /// The normalizer can then be reused for a new stream.
    ///
    /// # Errors
    ///
    /// [`SseError::Truncated`] if the body ended in the middle of an event;
    /// [`SseError::LineTooLong`] if completing the `[DONE]` event pushes it
    /// over the limit.
    pub fn finish(&mut self) -> Result<(), SseError> {
        let r = self.finish_stream();
        self.bom_matched = 0; // a reused normalizer strips the next stream's BOM
        r
    }

    /// Skips one leading [`BOM`] of the stream, which may arrive a byte at a
    /// time: returns the part of `chunk` that is stream content (empty while
    /// the chunk is only a BOM prefix). Held bytes that turn out to be no BOM
    /// are appended as content.
    fn strip_bom<'c>(&mut self, chunk: &'c [u8]) -> Result<&'c [u8], SseError> {
        let matched = usize::from(self.bom_matched);
        let need = &BOM[matched..];
        let n = need.len().min(chunk.len());
        if chunk[..n] == need[..n] {
            if n == need.len() {
                self.bom_matched = BOM_DECIDED;
            } else {
                // n == chunk.len(): the whole chunk is (still) a BOM prefix.
                self.bom_matched += n as u8;
            }
            return Ok(&chunk[n..]);
        }
        self.bom_matched = BOM_DECIDED;
        self.append(&BOM[..matched])?;
        Ok(chunk)
    }

    /// [`finish`](Self::finish) without the reset of the BOM state.
    fn finish_stream(&mut self) -> Result<(), SseError> {
        if self.bom_matched != BOM_DECIDED {
            // The body ended inside what could have been a BOM: those bytes were content.
            let matched = usize::from(self.bom_matched);
            self.bom_matched = BOM_DECIDED;
            self.append(&BOM[..matched])?;
        }
        self.pending_cr = false;
        let partial_line = self.buf.len() > self.line_start;
        let partial_event = self.line_start > self.event_start;
        if !partial_line && !partial_event {
            return Ok(());
        }
        let (da, db) = self.cur.data;
        let lone_done = !partial_line
            && self.cur.data_lines == 1
            && self.buf.get(self.event_start + da..self.event_start + db) == Some(b"[DONE]");
        if lone_done {
            return self.end_line();
        }
        let partial_bytes = self.buf.len() - self.event_start;
        let no_data = !partial_line && self.cur.data_lines == 0;
        self.buf.truncate(self.event_start);
        self.line_start = self.event_start;
        self.cur = EventState::default();
        if no_data {
            return Ok(());
        }
        Err(SseError::Truncated { partial_bytes })
    }

    /// Number of invalid UTF-8 sequences replaced with U+FFFD since the last
    /// call (the counter restarts at zero).
    pub fn take_invalid_utf8(&mut self) -> u64 {
        std::mem::take(&mut self.invalid_utf8)
    }

    /// Pops the next complete, normalized event, or `None` if no complete
    /// event is buffered. The event borrows the internal buffer (zero copy);
    /// its space is reclaimed on the next [`push`](Self::push).
    pub fn next_event(&mut self) -> Option<SseEvent<'_>> {
        let ev = self.ready.pop_front()?;
        self.read_pos = ev.end;
        let raw = self.buf.get(ev.start..ev.end)?;
        Some(SseEvent {
            raw,
            state: ev.state,
        })
    }

    /// Bytes currently held: unconsumed complete events plus the partial
    /// event (normalized). Useful for backpressure metrics.
    pub fn buffered_bytes(&self) -> usize {
        self.buf.len() - self.read_pos
    }

    /// Number of complete events waiting for [`next_event`](Self::next_event).
    pub fn pending_events(&self) -> usize {
        self.ready.len()
    }

    /// Drops already-consumed events from the front of the buffer.
    fn compact(&mut self) {
        let rp = self.read_pos;
        if rp == 0 {
            return;
        }
        let len = self.buf.len();
        if rp >= len {
            self.buf.clear();
        } else {
            self.buf.copy_within(rp.., 0);
            self.buf.truncate(len - rp);
        }
        self.read_pos = 0;
        self.event_start -= rp;
        self.line_start -= rp;
        for ev in &mut self.ready {
            ev.start -= rp;
            ev.end -= rp;
        }
    }

    /// Appends raw bytes to the current partial line, enforcing the limit.
    #[inline]
    fn append(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.buf.len() - self.event_start + bytes.len() > self.max_event_bytes {
            return Err(self.overflow());
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// Discards the partial event and reports the overflow.
    #[cold]
    fn overflow(&mut self) -> SseError {
        self.buf.truncate(self.event_start);
        self.line_start = self.event_start;
        self.cur = EventState::default();
        self.pending_cr = false;
        SseError::LineTooLong {
            limit_bytes: self.max_event_bytes,
        }
    }

    /// Terminates the current line (its bytes are `buf[line_start..]`).
    fn end_line(&mut self) -> Result<(), SseError> {
        let ls = self.line_start;
        let es = self.event_start;
        if self.buf.len() == ls {
            // Blank line: dispatch the event, or drop the blank line.
            if ls > es {
                self.buf.push(b'\n');
                if self.buf.len() - es > self.max_event_bytes {
                    return Err(self.overflow());
                }
                let end = self.buf.len();
                self.ready.push_back(ReadyEvent {
                    start: es,
                    end,
                    state: self.cur,
                });
                self.cur = EventState::default();
                self.event_start = end;
                self.line_start = end;
            }
            return Ok(());
        }
        if std::str::from_utf8(self.buf.get(ls..).unwrap_or_default()).is_err() {
            self.repair_utf8(ls);
        }
        let line_len = self.buf.len() - ls;
        let line = self.buf.get(ls..).unwrap_or_default();
        if let Some(after) = line.strip_prefix(b"data") {
            let value = match after {
                [] => Some((4, 4)),
                [b':'] => Some((5, 5)),
                [b':', b' ', ..] => Some((6, line_len)),
                [b':', ..] => {
                    self.buf.insert(ls + 5, b' ');
                    Some((6, line_len + 1))
                }
                _ => None,
            };
            if let Some((a, b)) = value {
                if self.cur.data_lines == 0 {
                    self.cur.data = (ls - es + a, ls - es + b);
                }
                self.cur.data_lines = self.cur.data_lines.saturating_add(1);
            }
        } else if let Some(after) = line.strip_prefix(b"event") {
            let value = match after {
                [] => Some((5, 5)),
                [b':', b' ', ..] => Some((7, line_len)),
                [b':', ..] => Some((6, line_len)),
                _ => None,
            };
            if let Some((a, b)) = value {
                self.cur.name = Some((ls - es + a, ls - es + b));
            }
        }
        self.buf.push(b'\n');
        self.line_start = self.buf.len();
        if self.line_start - es > self.max_event_bytes {
            return Err(self.overflow());
        }
        Ok(())
    }
}

impl SseNormalizer {
    /// Replaces the invalid UTF-8 sequences of the line `buf[ls..]` with U+FFFD (each
    /// maximal invalid subpart becomes one replacement character) and counts them.
    #[cold]
    #[inline(never)]
    fn repair_utf8(&mut self, ls: usize) {
        let line = self.buf.split_off(ls);
        for chunk in line.utf8_chunks() {
            self.buf.extend_from_slice(chunk.valid().as_bytes());
            if !chunk.invalid().is_empty() {
                self.buf.extend_from_slice("\u{FFFD}".as_bytes());
                self.invalid_utf8 += 1;
            }
        }
    }
}

/// One complete, normalized SSE event borrowed from an [`SseNormalizer`].
///
/// Its metadata was recorded while the event was assembled, so the
/// accessors do not re-scan the bytes (except [`data`](Self::data) for
/// multi-line data).
#[derive(Debug, Clone, Copy)]
pub struct SseEvent<'a> {
    raw: &'a [u8],
    state: EventState,
}

impl<'a> SseEvent<'a> {
    /// The normalized event bytes: `\n`-terminated lines followed by one
    /// blank line (always ends in `\n\n`). Forward these to the client.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether the event has at least one `data` field line.
    pub fn has_data(&self) -> bool {
        self.state.data_lines > 0
    }

    /// Number of `data` field lines in the event.
    pub fn data_line_count(&self) -> usize {
        self.state.data_lines as usize
    }

    /// Whether the event's data is exactly `[DONE]` (OpenAI's end-of-stream
    /// sentinel: a single `data: [DONE]` line).
    pub fn is_done(&self) -> bool {
        self.state.data_lines == 1 && self.first_data_line() == b"[DONE]"
    }

    /// The value of the (last) `event:` field, with one leading space
    /// stripped — e.g. `Some("message_delta")` for Anthropic streams; `None`
    /// if there is no `event` field or the name is not valid UTF-8.
    pub fn event_name(&self) -> Option<&'a str> {
        let (a, b) = self.state.name?;
        std::str::from_utf8(self.raw.get(a..b)?).ok()
    }

    /// The event's data payload per the SSE spec: the values of all `data`
    /// lines (one leading space stripped) joined with `\n`. `None` if the
    /// event has no `data` line. Borrowed for the usual single-line case;
    /// allocates only when there are several `data` lines.
    pub fn data(&self) -> Option<Cow<'a, [u8]>> {
        match self.state.data_lines {
            0 => None,
            1 => Some(Cow::Borrowed(self.first_data_line())),
            _ => Some(Cow::Owned(self.join_data_lines())),
        }
    }

    /// Byte range of the first `data` line's value within [`raw`](Self::raw)
    /// (empty at 0 if there is none).
    pub(crate) fn first_data_span(&self) -> (usize, usize) {
        self.state.data
    }

    /// Value of the first `data` line (empty if there is none).
    fn first_data_line(&self) -> &'a [u8] {
        let (a, b) = self.state.data;
        self.raw.get(a..b).unwrap_or_default()
    }

    #[cold]
    fn join_data_lines(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.raw.len());
        let mut first = true;
        for line in self.raw.split(|&b| b == b'\n') {
            let Some(after) = line.strip_prefix(b"data") else {
                continue;
            };
            let value = match after {
                [] | [b':'] => &[][..],
                [b':', b' ', v @ ..] | [b':', v @ ..] => v,
                _ => continue,
            };
            if !first {
                out.push(b'\n');
            }
            first = false;
            out.extend_from_slice(value);
        }
        out
    }
}
