//! Owns the per-process registry of resumable streams: the live ones by stream id, and
//! bounded tombstones of those that ended (completed, expired, overflowed, cancelled), so a
//! late resume gets 410 saying why rather than 404. A tombstone keeps the owner: another
//! key or tenant still gets the 404 of an unknown id.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::entry::{Ended, Entry, Owner};

/// Most tombstones kept (the oldest goes first); ~150 bytes each.
const MAX_TOMBSTONES: usize = 16_384;
/// How long a tombstone answers 410; after it, the id is unknown (404).
const TOMBSTONE_TTL: Duration = Duration::from_secs(3600);

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Found {
    /// A live stream of this owner.
    Live(Arc<Entry>),
    /// A stream of this owner that ended, and why.
    Ended(Ended),
    /// Nothing this owner may see.
    Unknown,
}

/// A stream that ended.
#[derive(Debug)]
struct Tomb {
    owner: Owner,
    why: Ended,
    at: Instant,
}

/// Live streams and tombstones.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    inner: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    live: HashMap<Box<str>, Arc<Entry>>,
    tombs: HashMap<Box<str>, Tomb>,
    /// Tombstone ids, oldest first.
    order: VecDeque<Box<str>>,
}

/// The process's registry.
pub(crate) fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a live stream.
    pub(crate) fn insert(&self, entry: Arc<Entry>) {
        self.lock().live.insert(entry.id.clone(), entry);
    }

    /// The stream `id` as `owner` may see it.
    pub(crate) fn find(&self, id: &str, owner: &Owner) -> Found {
        let g = self.lock();
        if let Some(e) = g.live.get(id) {
            return if e.owner == *owner {
                Found::Live(e.clone())
            } else {
                Found::Unknown
            };
        }
        match g.tombs.get(id) {
            Some(t) if t.owner == *owner && t.at.elapsed() < TOMBSTONE_TTL => Found::Ended(t.why),
            _ => Found::Unknown,
        }
    }

    /// Removes a stream that never started (its request failed before the commit): no
    /// tombstone.
    pub(crate) fn forget(&self, id: &str) {
        self.lock().live.remove(id);
    }

    /// Ends the live stream `entry` for `why` (see [`Entry::end`]) and leaves a tombstone.
    pub(crate) fn retire(&self, entry: &Entry, why: Ended) {
        entry.end(why);
        let why = entry.ended().unwrap_or(why);
        let mut g = self.lock();
        g.live.remove(&*entry.id);
        if g.tombs.len() >= MAX_TOMBSTONES {
            if let Some(old) = g.order.pop_front() {
                g.tombs.remove(&old);
            }
        }
        let tomb = Tomb {
            owner: entry.owner.clone(),
            why,
            at: Instant::now(),
        };
        if g.tombs.insert(entry.id.clone(), tomb).is_none() {
            g.order.push_back(entry.id.clone());
        }
    }

    /// Live streams now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.lock().live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backpressure::RequestBuffers;
    use crate::protocol::ClientDialect;

    fn owner(tenant: &str) -> Owner {
        Owner {
            key: [1; 32],
            tenant: tenant.into(),
        }
    }

    fn entry(b: &RequestBuffers, id: &str) -> Arc<Entry> {
        Arc::new(Entry::new(
            id.into(),
            ClientDialect::Messages,
            owner("t"),
            super::super::entry::Limits {
                grace: Duration::from_secs(1),
                buffer_bytes: 1024,
                linger_bytes: 0,
                global_bound: 1 << 20,
            },
            b.reserve(0, 1 << 20).unwrap(),
        ))
    }

    #[test]
    fn only_the_owner_finds_a_stream_alive_or_ended() {
        let b = RequestBuffers::new();
        let r = Registry::default();
        let e = entry(&b, "a");
        r.insert(e.clone());
        assert!(matches!(r.find("a", &owner("t")), Found::Live(_)));
        assert!(matches!(r.find("a", &owner("other")), Found::Unknown));
        let other_key = Owner {
            key: [2; 32],
            tenant: "t".into(),
        };
        assert!(matches!(r.find("a", &other_key), Found::Unknown));
        assert!(matches!(r.find("b", &owner("t")), Found::Unknown));
        r.retire(&e, Ended::Expired);
        assert_eq!(r.live(), 0);
        assert!(matches!(
            r.find("a", &owner("t")),
            Found::Ended(Ended::Expired)
        ));
        assert!(matches!(r.find("a", &other_key), Found::Unknown));
    }

    #[test]
    fn a_stream_that_never_started_leaves_no_tombstone() {
        let b = RequestBuffers::new();
        let r = Registry::default();
        r.insert(entry(&b, "a"));
        r.forget("a");
        assert!(matches!(r.find("a", &owner("t")), Found::Unknown));
    }

    #[test]
    fn tombstones_are_bounded_oldest_first() {
        let b = RequestBuffers::new();
        let r = Registry::default();
        for i in 0..=MAX_TOMBSTONES {
            let e = entry(&b, &format!("s{i}"));
            r.insert(e.clone());
            r.retire(&e, Ended::Overflowed);
        }
        assert_eq!(r.lock().tombs.len(), MAX_TOMBSTONES);
        assert!(matches!(r.find("s0", &owner("t")), Found::Unknown));
        assert!(matches!(
            r.find(&format!("s{MAX_TOMBSTONES}"), &owner("t")),
            Found::Ended(Ended::Overflowed)
        ));
    }
}
