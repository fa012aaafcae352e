//! Owns the event ids of a resumable stream: the pipe's output is split at SSE event
//! boundaries and every event that is not a comment gets `id: <stream_id>:<seq>` as its
//! first line (seq = 1, 2, … per event). Comment-only blocks (`: keepalive`, the
//! continuation marker) get none and are not numbered. Anthropic's keepalive event
//! (`event: ping`, relayed as the provider sends it on a same-dialect Messages stream) is no
//! event of the answer: it repeats the last id (none before the first event) and is not
//! kept for replay, as Sluice's own heartbeats ([`Stamper::heartbeat`]).
//!
//! Line endings: the pipe's output is normalized SSE (`\n`, see [`crate::sse`]), and the
//! events Sluice writes itself end in `\n\n`; a `\r\n` line end is accepted too (the blank
//! line is then `\r\n`), so a block split anywhere, even between the `\r` and the `\n`,
//! stamps the same. An `id` field the upstream sent is dropped: the stream's own id
//! replaces it (SSE keeps the last `id` of an event, and a client resuming must name ours).

use bytes::{BufMut, Bytes, BytesMut};

/// One output block of [`Stamper::stamp`]: a byte range of the stamped output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    /// The event's number, `None` for a comment-only block (not kept for replay).
    pub(crate) seq: Option<u64>,
    /// Start of the block in the output, bytes.
    pub(crate) start: usize,
    /// End of the block in the output (exclusive), bytes.
    pub(crate) end: usize,
}

/// The per-stream state of id stamping: the numbering and an event cut by a chunk
/// boundary.
#[derive(Debug)]
pub(crate) struct Stamper {
    /// `id: <stream_id>:` — the prefix of every id line.
    prefix: Box<[u8]>,
    /// Number of the last event stamped (0: none yet).
    seq: u64,
    /// The start of an event whose blank line has not arrived yet.
    carry: BytesMut,
}

impl Stamper {
    /// A stamper for the stream `stream_id`.
    pub(crate) fn new(stream_id: &str) -> Self {
        let mut prefix = Vec::with_capacity(stream_id.len() + 5);
        prefix.extend_from_slice(b"id: ");
        prefix.extend_from_slice(stream_id.as_bytes());
        prefix.push(b':');
        Self {
            prefix: prefix.into_boxed_slice(),
            seq: 0,
            carry: BytesMut::new(),
        }
    }

    /// Number of the last event stamped (0: none yet).
    pub(crate) fn last_seq(&self) -> u64 {
        self.seq
    }

    /// Stamps the complete events of `input` (after what an earlier call held back) into
    /// one buffer; returns it with its blocks in order. An event cut at the end of `input`
    /// is held for the next call; `flush` ends the stream: what is held goes out as it is.
    pub(crate) fn stamp(&mut self, input: &[u8], flush: bool) -> (Bytes, Vec<Block>) {
        let mut out = BytesMut::with_capacity(input.len() + 48);
        let mut blocks = Vec::new();
        let held = std::mem::take(&mut self.carry);
        let data: std::borrow::Cow<'_, [u8]> = if held.is_empty() {
            std::borrow::Cow::Borrowed(input)
        } else {
            // Rare: the pipe writes whole events; only a cut one takes this copy.
            let mut v = held.to_vec();
            v.extend_from_slice(input);
            std::borrow::Cow::Owned(v)
        };
        let mut pos = 0;
        while pos < data.len() {
            let Some(end) = event_end(&data[pos..]) else {
                break;
            };
            self.emit(&data[pos..pos + end], &mut out, &mut blocks);
            pos += end;
        }
        let rest = &data[pos..];
        if flush {
            if !rest.is_empty() {
                let start = out.len();
                out.extend_from_slice(rest);
                blocks.push(Block {
                    seq: None,
                    start,
                    end: out.len(),
                });
            }
        } else {
            self.carry.extend_from_slice(rest);
        }
        (out.freeze(), blocks)
    }

    /// Stamps the heartbeat `beat`: a comment goes out as it is, an event (Anthropic's
    /// `event: ping`) repeats the last id (none before the first event).
    pub(crate) fn heartbeat(&self, beat: &'static [u8]) -> Bytes {
        if beat.first() == Some(&b':') || self.seq == 0 {
            return Bytes::from_static(beat);
        }
        let mut out = BytesMut::with_capacity(beat.len() + self.prefix.len() + 24);
        self.id_line(self.seq, &mut out);
        out.extend_from_slice(beat);
        out.freeze()
    }

    /// Writes one complete event block (its blank line included) to `out`.
    fn emit(&mut self, event: &[u8], out: &mut BytesMut, blocks: &mut Vec<Block>) {
        let start = out.len();
        let comment_only = lines(event).all(|l| l.is_empty() || l[0] == b':');
        if !comment_only && is_ping(event) {
            // A keepalive: the last id again, not numbered, not kept.
            if self.seq > 0 {
                self.id_line(self.seq, out);
            }
            out.extend_from_slice(event);
            blocks.push(Block {
                seq: None,
                start,
                end: out.len(),
            });
            return;
        }
        if comment_only {
            out.extend_from_slice(event);
            blocks.push(Block {
                seq: None,
                start,
                end: out.len(),
            });
            return;
        }
        self.seq += 1;
        self.id_line(self.seq, out);
        if has_id_field(event) {
            let mut rest = event;
            while !rest.is_empty() {
                let n = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
                let (line, tail) = rest.split_at(n);
                if !is_id_field(line) {
                    out.extend_from_slice(line);
                }
                rest = tail;
            }
        } else {
            out.extend_from_slice(event);
        }
        blocks.push(Block {
            seq: Some(self.seq),
            start,
            end: out.len(),
        });
    }

    /// `id: <stream_id>:<seq>\n`.
    fn id_line(&self, seq: u64, out: &mut BytesMut) {
        out.extend_from_slice(&self.prefix);
        let mut n = itoa::Buffer::new();
        out.extend_from_slice(n.format(seq).as_bytes());
        out.put_u8(b'\n');
    }
}

/// The lines of `event` without their line ends.
fn lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

/// Length of the first complete event of `data` (through its blank line), if one is
/// complete: a line end followed by an empty line.
fn event_end(data: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    while let Some(i) = memchr::memchr(b'\n', &data[line_start..]) {
        let nl = line_start + i;
        let line = &data[line_start..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return Some(nl + 1);
        }
        line_start = nl + 1;
    }
    None
}

/// Whether `event` is Anthropic's keepalive: its `event` field is `ping` (cheap check first).
fn is_ping(event: &[u8]) -> bool {
    memchr::memmem::find(event, b"ping").is_some()
        && lines(event).any(|l| l == b"event: ping" || l == b"event:ping")
}

/// Whether `event` has a line that is an `id` field (cheap check first).
fn has_id_field(event: &[u8]) -> bool {
    (event.starts_with(b"id") || memchr::memmem::find(event, b"\nid").is_some())
        && lines(event).any(is_id_field)
}

/// Whether `line` (with or without its line end) is an `id` field: `id`, `id:…`.
fn is_id_field(line: &[u8]) -> bool {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    l == b"id" || l.starts_with(b"id:")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: &Bytes) -> &str {
        std::str::from_utf8(b).unwrap()
    }

    #[test]
    fn every_event_gets_the_next_id_and_comments_none() {
        let mut s = Stamper::new("sc_r1_ab");
        let (out, blocks) = s.stamp(
            b"data: {\"a\":1}\n\n: keepalive\n\nevent: x\ndata: {}\n\ndata: [DONE]\n\n",
            false,
        );
        assert_eq!(
            text(&out),
            "id: sc_r1_ab:1\ndata: {\"a\":1}\n\n: keepalive\n\nid: sc_r1_ab:2\nevent: x\ndata: {}\n\nid: sc_r1_ab:3\ndata: [DONE]\n\n"
        );
        let seqs: Vec<_> = blocks.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [Some(1), None, Some(2), Some(3)]);
        assert_eq!(&out[blocks[1].start..blocks[1].end], b": keepalive\n\n");
        assert_eq!(s.last_seq(), 3);
    }

    #[test]
    fn an_event_split_across_chunks_is_stamped_once_whole() {
        let whole = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\n";
        let mut one = Stamper::new("s");
        let (expected, _) = one.stamp(whole, false);
        // Every split point, including inside the blank line.
        for cut in 0..whole.len() {
            let mut s = Stamper::new("s");
            let (a, ab) = s.stamp(&whole[..cut], false);
            let (b, bb) = s.stamp(&whole[cut..], false);
            let mut joined = a.to_vec();
            joined.extend_from_slice(&b);
            assert_eq!(joined, expected.to_vec(), "cut at {cut}");
            assert_eq!(ab.len() + bb.len(), 2, "cut at {cut}");
        }
    }

    #[test]
    fn crlf_events_and_a_split_between_cr_and_lf() {
        let mut s = Stamper::new("s");
        let (a, blocks) = s.stamp(b"data: 1\r\n\r", false);
        assert!(a.is_empty() && blocks.is_empty());
        let (b, blocks) = s.stamp(b"\ndata: 2\r\n\r\n", false);
        assert_eq!(text(&b), "id: s:1\ndata: 1\r\n\r\nid: s:2\ndata: 2\r\n\r\n");
        assert_eq!(blocks.len(), 2);
    }

    #[test]
    fn an_upstream_id_is_replaced_by_the_streams() {
        let mut s = Stamper::new("s");
        let (out, _) = s.stamp(b"id: 77\nevent: e\nid\ndata: {}\n\n", false);
        assert_eq!(text(&out), "id: s:1\nevent: e\ndata: {}\n\n");
        // `idle:` is not an id field.
        let (out, _) = s.stamp(b"idle: 1\ndata: {}\n\n", false);
        assert_eq!(text(&out), "id: s:2\nidle: 1\ndata: {}\n\n");
    }

    #[test]
    fn flush_lets_a_cut_event_out_unnumbered() {
        let mut s = Stamper::new("s");
        let (out, _) = s.stamp(b"data: 1\n\ndata: 2", false);
        assert_eq!(text(&out), "id: s:1\ndata: 1\n\n");
        let (out, blocks) = s.stamp(b"", true);
        assert_eq!(text(&out), "data: 2");
        assert_eq!(blocks[0].seq, None);
    }

    #[test]
    fn a_relayed_ping_event_repeats_the_last_id_and_is_not_kept() {
        let mut s = Stamper::new("s");
        let ping = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
        let (out, blocks) = s.stamp(ping.as_bytes(), false);
        assert_eq!(text(&out), ping, "no id before the first event");
        assert_eq!(blocks[0].seq, None);
        let (out, blocks) = s.stamp(
            format!("event: a\ndata: {{}}\n\n{ping}event: b\ndata: {{\"ping\":1}}\n\n").as_bytes(),
            false,
        );
        assert_eq!(
            text(&out),
            format!("id: s:1\nevent: a\ndata: {{}}\n\nid: s:1\n{ping}id: s:2\nevent: b\ndata: {{\"ping\":1}}\n\n")
        );
        let seqs: Vec<_> = blocks.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [Some(1), None, Some(2)]);
    }

    #[test]
    fn heartbeats_repeat_the_last_id_only_when_they_are_events() {
        let mut s = Stamper::new("s");
        let ping: &'static [u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";
        assert_eq!(
            s.heartbeat(ping).as_ref(),
            ping,
            "no id before the first event"
        );
        s.stamp(b"data: 1\n\n", false);
        assert_eq!(
            text(&s.heartbeat(ping)),
            "id: s:1\nevent: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
        assert_eq!(s.heartbeat(b": keepalive\n\n").as_ref(), b": keepalive\n\n");
    }
}
