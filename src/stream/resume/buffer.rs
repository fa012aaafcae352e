//! Owns the replay buffer of one resumable stream: its numbered events, oldest first,
//! bounded in bytes. Events some client was sent may be dropped, oldest first, to make
//! room; events no client was sent never are: past the bound with those, the buffer
//! overflows (the stream ends, as a detached client's would without the feature).

use std::collections::VecDeque;

use bytes::Bytes;

/// The buffer passed its bound with events no client was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow;

/// A resume named an event older than the oldest kept (its successors were dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooOld {
    /// The oldest event number still kept (its predecessor is the oldest a resume may name).
    pub(crate) oldest: u64,
}

/// Numbered events (their `id:` line included), contiguous, oldest first.
#[derive(Debug)]
pub(crate) struct ReplayBuffer {
    events: VecDeque<(u64, Bytes)>,
    /// Bytes of the events held.
    bytes: usize,
    /// Most bytes held.
    bound: usize,
    /// Number of the last event pushed (0: none yet).
    last: u64,
}

impl ReplayBuffer {
    /// An empty buffer of at most `bound` bytes.
    pub(crate) fn new(bound: usize) -> Self {
        Self {
            events: VecDeque::new(),
            bytes: 0,
            bound,
            last: 0,
        }
    }

    /// Bytes of the events held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of the last event pushed (0: none yet).
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// Appends event `seq` (the next number), then drops the oldest events numbered at most
    /// `sent` (some client was sent them) while the buffer is past its bound.
    ///
    /// # Errors
    /// [`Overflow`] when the events past `sent` alone are over the bound (the event is kept:
    /// the caller ends the stream).
    pub(crate) fn push(&mut self, seq: u64, event: Bytes, sent: u64) -> Result<(), Overflow> {
        debug_assert_eq!(seq, self.last + 1, "events are numbered in order");
        self.last = seq;
        self.bytes += event.len();
        self.events.push_back((seq, event));
        self.trim(sent)
    }

    /// Drops the oldest events numbered at most `sent` while the buffer is past its bound.
    ///
    /// # Errors
    /// [`Overflow`] when it is still past it.
    pub(crate) fn trim(&mut self, sent: u64) -> Result<(), Overflow> {
        while self.bytes > self.bound {
            match self.events.front() {
                Some((s, _)) if *s <= sent => {
                    if let Some((_, e)) = self.events.pop_front() {
                        self.bytes -= e.len();
                    }
                }
                _ => return Err(Overflow),
            }
        }
        Ok(())
    }

    /// Drops every event numbered at most `sent` (room under a tighter bound, the global
    /// one).
    pub(crate) fn drop_sent(&mut self, sent: u64) {
        while let Some((s, _)) = self.events.front() {
            if *s > sent {
                break;
            }
            if let Some((_, e)) = self.events.pop_front() {
                self.bytes -= e.len();
            }
        }
    }

    /// The events after event `after` (0: all from the first), in order.
    ///
    /// # Errors
    /// [`TooOld`] when event `after + 1` was dropped already.
    pub(crate) fn after(&self, after: u64) -> Result<impl Iterator<Item = &(u64, Bytes)>, TooOld> {
        let oldest = self.events.front().map_or(self.last + 1, |(s, _)| *s);
        if after + 1 < oldest {
            return Err(TooOld { oldest });
        }
        let skip = usize::try_from(after + 1 - oldest).unwrap_or(usize::MAX);
        Ok(self.events.iter().skip(skip))
    }

    /// Keeps the newest events within `bytes` (always the last one), dropping the oldest:
    /// the tail of a completed stream that stays replayable.
    pub(crate) fn keep_tail(&mut self, bytes: usize) {
        while self.bytes > bytes && self.events.len() > 1 {
            if let Some((_, e)) = self.events.pop_front() {
                self.bytes -= e.len();
            }
        }
    }

    /// Drops every event (the stream is over); returns the bytes freed.
    pub(crate) fn clear(&mut self) -> usize {
        let b = self.bytes;
        self.events = VecDeque::new();
        self.bytes = 0;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    fn seqs(b: &ReplayBuffer, after: u64) -> Vec<u64> {
        b.after(after).unwrap().map(|(s, _)| *s).collect()
    }

    #[test]
    fn replays_exactly_the_events_after_the_one_named() {
        let mut b = ReplayBuffer::new(1000);
        for s in 1..=5 {
            b.push(s, ev(10), 0).unwrap();
        }
        assert_eq!(seqs(&b, 0), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(&b, 3), [4, 5]);
        assert!(seqs(&b, 5).is_empty());
        assert_eq!((b.bytes(), b.last()), (50, 5));
    }

    #[test]
    fn a_kept_tail_holds_the_newest_events_and_always_the_last() {
        let mut b = ReplayBuffer::new(1000);
        for s in 1..=5 {
            b.push(s, ev(10), s).unwrap();
        }
        b.keep_tail(25);
        assert_eq!(seqs(&b, 3), [4, 5]);
        assert_eq!(b.after(2).err(), Some(TooOld { oldest: 4 }));
        b.keep_tail(0);
        assert_eq!(seqs(&b, 4), [5]);
        assert_eq!(b.bytes(), 10);
    }

    #[test]
    fn sent_events_are_dropped_oldest_first_past_the_bound() {
        let mut b = ReplayBuffer::new(30);
        for s in 1..=5 {
            // Every event was sent as it came (an attached client).
            b.push(s, ev(10), s).unwrap();
        }
        assert_eq!(seqs(&b, 2), [3, 4, 5]);
        assert_eq!(b.bytes(), 30);
        assert_eq!(b.after(1).err(), Some(TooOld { oldest: 3 }));
        assert!(b.after(0).is_err());
    }

    #[test]
    fn unsent_events_past_the_bound_overflow() {
        let mut b = ReplayBuffer::new(30);
        b.push(1, ev(10), 1).unwrap();
        b.push(2, ev(10), 1).unwrap();
        b.push(3, ev(10), 1).unwrap();
        // Event 1 (sent) makes room; events 2..4 (unsent) are 30 bytes: still within.
        b.push(4, ev(10), 1).unwrap();
        assert_eq!(seqs(&b, 1), [2, 3, 4]);
        assert_eq!(b.push(5, ev(10), 1), Err(Overflow));
        // Sent later: trimming makes room again.
        assert_eq!(b.trim(3), Ok(()));
        assert_eq!(seqs(&b, 3), [4, 5]);
    }

    #[test]
    fn drop_sent_keeps_what_no_client_was_sent() {
        let mut b = ReplayBuffer::new(100);
        for s in 1..=3 {
            b.push(s, ev(10), 0).unwrap();
        }
        b.drop_sent(2);
        assert_eq!(seqs(&b, 2), [3]);
        assert_eq!(b.bytes(), 10);
    }

    #[test]
    fn clear_frees_everything() {
        let mut b = ReplayBuffer::new(100);
        b.push(1, ev(7), 0).unwrap();
        assert_eq!(b.clear(), 7);
        assert_eq!(b.bytes(), 0);
        assert_eq!(b.last(), 1);
    }
}
