//! Owns one resumable stream's shared state ([`Entry`]): who may resume it, its replay
//! buffer, which client holds it (the original request's or a resume's, by generation),
//! the grace deadline while none does, and how it ended. The generation task (the original
//! request's, [`super::writer`]) appends events and waits on [`Entry::wake`]; readers
//! (`GET /v1/streams/<id>`, [`crate::ingress::streams`]) take the stream over, read after
//! their cursor and wait on [`Entry::subscribe`].

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::buffer::{Overflow, ReplayBuffer, TooOld};
use super::stamp::Block;
use crate::backpressure::BufferReservation;
use crate::metrics::metrics;
use crate::protocol::ClientDialect;

/// Who may resume a stream: the SHA-256 of the virtual key that started it, and its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// SHA-256 of the virtual key ([`crate::auth::hash_key`]).
    pub(crate) key: [u8; 32],
    /// The key's tenant.
    pub(crate) tenant: Box<str>,
}

/// The bounds of one resumable stream (from `server.*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// `resume_grace_ms`: how long the stream waits for a client, and how long a completed
    /// stream's tail stays replayable.
    pub(crate) grace: Duration,
    /// `resume_buffer_bytes`: the replay buffer's bound.
    pub(crate) buffer_bytes: usize,
    /// `resume_linger_bytes`: the tail of a completed stream kept replayable (0: none).
    pub(crate) linger_bytes: usize,
    /// `max_buffered_request_bytes`: the global bound the buffer is charged to.
    pub(crate) global_bound: usize,
}

/// Why a stream can no longer be resumed (the 410's `code` and message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The final event reached a client.
    Completed,
    /// No client came back within `server.resume_grace_ms`.
    Expired,
    /// Events no client was sent passed `server.resume_buffer_bytes`.
    Overflowed,
    /// `DELETE /v1/streams/<id>`.
    Cancelled,
    /// The gateway shut down.
    Shutdown,
}

impl Ended {
    /// The error code of the 410 a resume of such a stream gets.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::Completed => "stream_completed",
            Self::Expired | Self::Shutdown => "stream_expired",
            Self::Overflowed => "stream_overflowed",
            Self::Cancelled => "stream_cancelled",
        }
    }

    /// What the 410 says.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::Completed => "the stream completed and its final event was delivered; no event after the one named is kept to resume",
            Self::Expired => "the stream's resume window expired: no client reconnected within server.resume_grace_ms and its generation was cancelled",
            Self::Shutdown => "the stream ended when the gateway shut down; it can no longer be resumed",
            Self::Overflowed => "the stream's replay buffer overflowed (server.resume_buffer_bytes) while no client read it; its generation was cancelled",
            Self::Cancelled => "the stream was cancelled (DELETE /v1/streams/<id>)",
        }
    }
}

/// Why a resume was refused by a live entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The stream ended (see [`Ended`]).
    Ended(Ended),
    /// The event named is older than the oldest kept.
    TooOld(TooOld),
    /// The event named was never sent (past the last one).
    Unknown,
}

/// What a reader does next ([`Entry::next`]).
#[derive(Debug)]
pub(crate) enum Next {
    /// Write these events (numbered up to the second field).
    Events(Vec<Bytes>, u64),
    /// Nothing new: wait for a change.
    Wait,
    /// Every event was written and the stream is over: end the response.
    End,
    /// Another resume took the stream over, or it ended without its final event
    /// (expired, cancelled, overflowed): close.
    Lost,
}

/// What the generation task waits for while no client holds the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// A client holds it (or the final event reached one): nothing is due.
    Held,
    /// No client does until this instant.
    Until(Instant),
    /// The grace window passed.
    Expired,
    /// `DELETE` asked for the end.
    Cancelled,
}

/// The state of one resumable stream, shared by its generation task and its readers.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The stream id (`s{c|m|r}_<replica>_<32 hex>`).
    pub(crate) id: Box<str>,
    /// The client dialect: resumes and their errors speak it.
    pub(crate) dialect: ClientDialect,
    /// Who may resume it.
    pub(crate) owner: Owner,
    /// Its bounds.
    limits: Limits,
    inner: Mutex<Inner>,
    /// Bumped on every change readers care about (events, the end, a takeover).
    changed: watch::Sender<u64>,
    /// Wakes the generation task: a detach, a resume, a cancel, the final event delivered.
    pub(crate) wake: Notify,
}

/// The mutable part of an [`Entry`].
#[derive(Debug)]
struct Inner {
    buf: ReplayBuffer,
    /// Its charge to the global request-buffer bound.
    reservation: BufferReservation,
    /// Highest event number written to some client.
    sent: u64,
    /// The generation of the client holding the stream: 0 the original request, then one
    /// per resume.
    reader: u64,
    /// Whether that client is attached (else `deadline` runs).
    attached: bool,
    /// While detached: when the generation is cancelled.
    deadline: Option<Instant>,
    /// The last event is in the buffer.
    finished: bool,
    /// The final event (and the end of the response) reached a client.
    final_sent: bool,
    /// `DELETE` asked for the end.
    cancelled: bool,
    /// Completed, its tail kept replayable for a client that lost the final events
    /// (`Inner::linger`).
    lingering: bool,
    /// Set once nothing more can be resumed.
    ended: Option<Ended>,
    /// Resumes that took the stream.
    resumptions: u32,
    /// The `sluice_resumable_streams` state this entry is counted in.
    counted: Option<&'static str>,
    /// The bytes this entry counts in `sluice_resumable_buffer_bytes`.
    gauged: usize,
}

impl Inner {
    fn count_as(&mut self, state: Option<&'static str>) {
        if self.counted == state {
            return;
        }
        let g = &metrics().resumable_streams;
        if let Some(s) = self.counted {
            g.with_label_values(&[s]).dec();
        }
        if let Some(s) = state {
            g.with_label_values(&[s]).inc();
        }
        self.counted = state;
    }

    /// Brings `sluice_resumable_buffer_bytes` to the buffer's bytes.
    fn gauge_bytes(&mut self) {
        let now = self.buf.bytes();
        let delta =
            i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(self.gauged).unwrap_or(i64::MAX);
        if delta != 0 {
            metrics().resumable_buffer_bytes.add(delta);
        }
        self.gauged = now;
    }

    /// The final event reached a client: the newest events within `linger_bytes`
    /// (`server.resume_linger_bytes`; always the final one) stay replayable, for a client
    /// whose connection died before it read them, until [`Entry::end`] (the generation ends
    /// it after the grace window). Nothing is kept with a tail of 0.
    fn linger(&mut self, linger_bytes: usize) {
        if linger_bytes == 0 || self.ended.is_some() {
            return;
        }
        self.buf.keep_tail(linger_bytes);
        let want = self.buf.bytes();
        self.reservation.shrink_to(want);
        self.gauge_bytes();
        self.lingering = true;
        self.count_as(Some("completed"));
    }

    /// Charges the buffer to the global bound; past it, the events some client was sent go
    /// first.
    fn charge(&mut self, global_bound: usize) -> Result<(), Overflow> {
        let want = self.buf.bytes();
        let res = if want <= self.reservation.bytes() {
            self.reservation.shrink_to(want);
            Ok(())
        } else if self.reservation.ensure(want, global_bound).is_ok() {
            Ok(())
        } else {
            self.buf.drop_sent(self.sent);
            let want = self.buf.bytes();
            self.reservation.shrink_to(want);
            self.reservation
                .ensure(want, global_bound)
                .map_err(|_| Overflow)
        };
        self.gauge_bytes();
        res
    }
}

impl Entry {
    /// A stream held by its original request; `reservation` is its (empty) charge to the
    /// global request-buffer bound `limits.global_bound`.
    pub(crate) fn new(
        id: String,
        dialect: ClientDialect,
        owner: Owner,
        limits: Limits,
        reservation: BufferReservation,
    ) -> Self {
        let mut inner = Inner {
            buf: ReplayBuffer::new(limits.buffer_bytes),
            reservation,
            sent: 0,
            reader: 0,
            attached: true,
            deadline: None,
            finished: false,
            final_sent: false,
            cancelled: false,
            lingering: false,
            ended: None,
            resumptions: 0,
            counted: None,
            gauged: 0,
        };
        inner.count_as(Some("attached"));
        Self {
            id: id.into_boxed_str(),
            dialect,
            owner,
            limits,
            inner: Mutex::new(inner),
            changed: watch::Sender::new(0),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver of change notices (mark it seen before reading the state).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Appends the numbered blocks of `out` (see [`super::stamp`]); `last`: no event follows.
    ///
    /// # Errors
    /// [`Overflow`] when the events no client was sent pass the buffer's bound or the
    /// global bound (the stream is to end).
    pub(crate) fn append(&self, out: &Bytes, blocks: &[Block], last: bool) -> Result<(), Overflow> {
        let mut g = self.lock();
        let sent = g.sent;
        let mut res = Ok(());
        for b in blocks {
            if let Some(seq) = b.seq {
                if g.buf.push(seq, out.slice(b.start..b.end), sent).is_err() {
                    res = Err(Overflow);
                }
            }
        }
        if res.is_ok() {
            res = g.charge(self.limits.global_bound);
        } else {
            g.gauge_bytes();
        }
        if last {
            g.finished = true;
        }
        drop(g);
        self.bump();
        res
    }

    /// Whether client generation `reader` holds the stream (attached and not taken over).
    pub(crate) fn holds(&self, reader: u64) -> bool {
        let g = self.lock();
        g.reader == reader && g.attached && g.ended.is_none()
    }

    /// Client generation `reader` was written the events through `seq`; `end`: and the end
    /// of the response (the final event reached it when the stream is finished). Events
    /// sent make room in the buffer.
    ///
    /// # Errors
    /// [`Overflow`] when the events no client was sent are still past a bound.
    pub(crate) fn sent(&self, reader: u64, seq: u64, end: bool) -> Result<(), Overflow> {
        let mut g = self.lock();
        if g.reader != reader || g.ended.is_some() {
            return Ok(());
        }
        g.sent = g.sent.max(seq);
        let sent = g.sent;
        let res = g
            .buf
            .trim(sent)
            .and_then(|()| g.charge(self.limits.global_bound));
        if end && g.finished && g.sent >= g.buf.last() {
            g.final_sent = true;
            // In the same step, so no resume sees the stream completed but not kept.
            g.linger(self.limits.linger_bytes);
            drop(g);
            self.wake.notify_one();
        }
        res
    }

    /// Whether the last event is in the buffer.
    pub(crate) fn is_finished(&self) -> bool {
        self.lock().finished
    }

    /// Client generation `reader` is gone: the grace clock starts (nothing when another
    /// took over meanwhile, or the stream is over).
    pub(crate) fn detach(&self, reader: u64) {
        let mut g = self.lock();
        if g.reader != reader || !g.attached || g.final_sent || g.ended.is_some() {
            return;
        }
        g.attached = false;
        g.deadline = Some(Instant::now() + self.limits.grace);
        if g.ended.is_none() {
            g.count_as(Some("detached"));
        }
        drop(g);
        log::info!(target: "sluice::stream::resume", "resumable stream detached stream_id={} reader={reader}", self.id);
        self.wake.notify_one();
        self.bump();
    }

    /// A resume after event `after` takes the stream: returns its reader generation.
    ///
    /// # Errors
    /// [`Refused`] when it ended or the event is not replayable.
    pub(crate) fn take_over(&self, after: u64) -> Result<u64, Refused> {
        let mut g = self.lock();
        if let Some(e) = g.ended {
            return Err(Refused::Ended(e));
        }
        if g.cancelled {
            return Err(Refused::Ended(Ended::Cancelled));
        }
        if g.final_sent && !g.lingering {
            return Err(Refused::Ended(Ended::Completed));
        }
        if after > g.buf.last() {
            return Err(Refused::Unknown);
        }
        if g.lingering && after == g.buf.last() {
            // The client has every event.
            return Err(Refused::Ended(Ended::Completed));
        }
        if let Err(t) = g.buf.after(after) {
            return Err(Refused::TooOld(t));
        }
        g.reader += 1;
        g.attached = true;
        g.deadline = None;
        g.resumptions = g.resumptions.saturating_add(1);
        if !g.lingering {
            g.count_as(Some("attached"));
        }
        let reader = g.reader;
        drop(g);
        self.wake.notify_one();
        self.bump();
        Ok(reader)
    }

    /// What reader `reader`, having written through event `cursor`, does next.
    pub(crate) fn next(&self, reader: u64, cursor: u64) -> Next {
        let g = self.lock();
        if g.reader != reader || matches!(g.ended, Some(e) if e != Ended::Completed) {
            return Next::Lost;
        }
        let events: Vec<Bytes> = match g.buf.after(cursor) {
            Ok(it) => it.map(|(_, b)| b.clone()).collect(),
            Err(_) => return Next::Lost,
        };
        if !events.is_empty() {
            return Next::Events(events, g.buf.last());
        }
        if g.finished {
            Next::End
        } else if g.cancelled {
            Next::Lost
        } else {
            Next::Wait
        }
    }

    /// `DELETE`: the generation is to stop at once.
    pub(crate) fn cancel(&self) {
        self.lock().cancelled = true;
        self.wake.notify_one();
        self.bump();
    }

    /// What the generation task waits for (see [`Hold`]).
    pub(crate) fn hold(&self) -> Hold {
        let g = self.lock();
        if g.cancelled {
            Hold::Cancelled
        } else if g.attached || g.final_sent {
            Hold::Held
        } else {
            match g.deadline {
                Some(d) if Instant::now() >= d => Hold::Expired,
                Some(d) => Hold::Until(d),
                None => Hold::Held,
            }
        }
    }

    /// Whether a resume now would replay a completed stream's kept tail (the final event
    /// was written with `server.resume_linger_bytes` above 0, and the stream not ended).
    pub(crate) fn lingering(&self) -> bool {
        self.lock().lingering
    }

    /// The grace window (`server.resume_grace_ms`).
    pub(crate) fn grace(&self) -> Duration {
        self.limits.grace
    }

    /// Whether the final event reached a client.
    pub(crate) fn final_sent(&self) -> bool {
        self.lock().final_sent
    }

    /// Resumes that took the stream so far.
    pub(crate) fn resumptions(&self) -> u32 {
        self.lock().resumptions
    }

    /// Why it ended, once it did.
    pub(crate) fn ended(&self) -> Option<Ended> {
        self.lock().ended
    }

    /// Ends the stream for good: the buffer and its charge are freed, readers close.
    pub(crate) fn end(&self, why: Ended) {
        let mut g = self.lock();
        if g.ended.is_some() {
            return;
        }
        g.ended = Some(why);
        g.buf.clear();
        g.reservation.shrink_to(0);
        g.gauge_bytes();
        g.count_as(None);
        drop(g);
        self.bump();
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut g = self.lock();
        g.buf.clear();
        g.gauge_bytes();
        g.count_as(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backpressure::RequestBuffers;
    use crate::stream::resume::stamp::Stamper;

    fn limits(grace: Duration, bound: usize, linger: usize, global: usize) -> Limits {
        Limits {
            grace,
            buffer_bytes: bound,
            linger_bytes: linger,
            global_bound: global,
        }
    }

    /// A Chat stream `id` within `limits`, charged to `buffers`.
    fn entry_with(buffers: &RequestBuffers, id: &str, limits: Limits) -> Entry {
        Entry::new(
            id.into(),
            ClientDialect::ChatCompletions,
            Owner {
                key: [0; 32],
                tenant: "t".into(),
            },
            limits,
            buffers.reserve(0, limits.global_bound).unwrap(),
        )
    }

    fn entry(buffers: &RequestBuffers, bound: usize, global: usize) -> Entry {
        let l = limits(Duration::from_secs(30), bound, 0, global);
        entry_with(buffers, "sc_r_00", l)
    }

    fn push(e: &Entry, s: &mut Stamper, data: &[u8], last: bool) -> Result<(), Overflow> {
        let (out, blocks) = s.stamp(data, last);
        e.append(&out, &blocks, last)
    }

    #[tokio::test]
    async fn a_resume_reads_after_its_cursor_then_ends_with_the_stream() {
        let buffers = RequestBuffers::new();
        let e = entry(&buffers, 1 << 20, 1 << 30);
        let mut s = Stamper::new(&e.id);
        push(&e, &mut s, b"data: 1\n\ndata: 2\n\n", false).unwrap();
        e.sent(0, 2, false).unwrap();
        e.detach(0);
        assert!(matches!(e.hold(), Hold::Until(_)));
        let r = e.take_over(1).unwrap();
        assert_eq!((r, e.resumptions()), (1, 1));
        assert_eq!(e.hold(), Hold::Held);
        let Next::Events(ev, last) = e.next(r, 1) else {
            panic!()
        };
        assert_eq!((ev.len(), last), (1, 2));
        assert_eq!(&ev[0][..], b"id: sc_r_00:2\ndata: 2\n\n");
        e.sent(r, 2, false).unwrap();
        assert!(matches!(e.next(r, 2), Next::Wait));
        push(&e, &mut s, b"data: [DONE]\n\n", true).unwrap();
        assert!(matches!(e.next(r, 2), Next::Events(_, 3)));
        assert!(matches!(e.next(r, 3), Next::End));
        assert!(!e.final_sent());
        e.sent(r, 3, true).unwrap();
        assert!(e.final_sent());
        // The original client (generation 0) lost the stream.
        assert!(matches!(e.next(0, 0), Next::Lost));
        assert!(!e.holds(0));
        assert!(buffers.held() > 0);
        e.end(Ended::Completed);
        assert_eq!(buffers.held(), 0);
        assert_eq!(e.take_over(0), Err(Refused::Ended(Ended::Completed)));
    }

    #[tokio::test]
    async fn a_completed_stream_replays_its_kept_tail_then_ends() {
        let buffers = RequestBuffers::new();
        // A tail of the last two events (23 and 28 bytes).
        let l = limits(Duration::from_secs(30), 1 << 20, 60, 1 << 30);
        let e = entry_with(&buffers, "sc_r_02", l);
        let mut s = Stamper::new(&e.id);
        push(&e, &mut s, b"data: 1\n\ndata: 2\n\ndata: 3\n\n", false).unwrap();
        push(&e, &mut s, b"data: [DONE]\n\n", true).unwrap();
        // Written to the original client, which then lost its connection unread.
        e.sent(0, 4, true).unwrap();
        assert!(e.final_sent());
        assert!(e.lingering());
        assert_eq!(buffers.held(), 51);
        assert!(matches!(e.take_over(1), Err(Refused::TooOld(_))));
        assert_eq!(e.take_over(4), Err(Refused::Ended(Ended::Completed)));
        assert_eq!(e.take_over(9), Err(Refused::Unknown));
        let r = e.take_over(2).unwrap();
        let Next::Events(ev, last) = e.next(r, 2) else {
            panic!()
        };
        assert_eq!(last, 4);
        assert_eq!(&ev[0][..], b"id: sc_r_02:3\ndata: 3\n\n");
        assert_eq!(&ev[1][..], b"id: sc_r_02:4\ndata: [DONE]\n\n");
        assert!(matches!(e.next(r, 4), Next::End));
        // A second client may replay it too, until the stream is ended.
        assert!(e.take_over(3).is_ok());
        e.end(Ended::Completed);
        assert_eq!(buffers.held(), 0);
        assert_eq!(e.take_over(3), Err(Refused::Ended(Ended::Completed)));
    }

    #[tokio::test]
    async fn without_a_tail_a_completed_stream_is_not_kept() {
        let buffers = RequestBuffers::new();
        let e = entry(&buffers, 1 << 20, 1 << 30);
        let mut s = Stamper::new(&e.id);
        push(&e, &mut s, b"data: [DONE]\n\n", true).unwrap();
        e.sent(0, 1, true).unwrap();
        assert!(e.final_sent() && !e.lingering());
        assert_eq!(e.take_over(0), Err(Refused::Ended(Ended::Completed)));
    }

    #[tokio::test]
    async fn refusals_name_the_reason() {
        let buffers = RequestBuffers::new();
        let e = entry(&buffers, 1024, 1 << 30);
        let mut s = Stamper::new(&e.id);
        push(&e, &mut s, b"data: 1\n\n", false).unwrap();
        assert_eq!(e.take_over(5), Err(Refused::Unknown));
        // Sent events are dropped past the bound: event 1 goes.
        e.sent(0, 1, false).unwrap();
        let big = format!("data: {}\n\n", "x".repeat(1000));
        push(&e, &mut s, big.as_bytes(), false).unwrap();
        assert!(matches!(e.take_over(0), Err(Refused::TooOld(_))));
        e.cancel();
        assert_eq!(e.hold(), Hold::Cancelled);
        assert_eq!(e.take_over(1), Err(Refused::Ended(Ended::Cancelled)));
    }

    #[tokio::test]
    async fn unsent_events_past_the_bound_or_the_global_bound_overflow() {
        let buffers = RequestBuffers::new();
        let e = entry(&buffers, 1024, 1 << 30);
        let mut s = Stamper::new(&e.id);
        e.detach(0);
        let big = format!("data: {}\n\n", "x".repeat(600));
        push(&e, &mut s, big.as_bytes(), false).unwrap();
        assert_eq!(push(&e, &mut s, big.as_bytes(), false), Err(Overflow));

        // The global bound: sent events make room first, then unsent ones overflow.
        let buffers = RequestBuffers::new();
        let e = entry(&buffers, 1 << 20, 1500);
        let mut s = Stamper::new(&e.id);
        push(&e, &mut s, big.as_bytes(), false).unwrap();
        e.sent(0, 1, false).unwrap();
        push(&e, &mut s, big.as_bytes(), false).unwrap();
        push(&e, &mut s, big.as_bytes(), false).unwrap();
        assert!(buffers.held() <= 1500);
        assert_eq!(push(&e, &mut s, big.as_bytes(), false), Err(Overflow));
    }

    #[tokio::test]
    async fn the_grace_clock_runs_only_while_detached() {
        let buffers = RequestBuffers::new();
        let l = limits(Duration::from_millis(1), 1024, 0, 1 << 20);
        let e = entry_with(&buffers, "sc_r_01", l);
        assert_eq!(e.hold(), Hold::Held);
        e.detach(0);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(e.hold(), Hold::Expired);
        // A takeover stops it; the new reader's drop starts it again.
        let r = e.take_over(0).unwrap();
        assert_eq!(e.hold(), Hold::Held);
        e.detach(0);
        assert_eq!(
            e.hold(),
            Hold::Held,
            "a stale reader's detach changes nothing"
        );
        e.detach(r);
        assert!(matches!(e.hold(), Hold::Until(_) | Hold::Expired));
    }
}
