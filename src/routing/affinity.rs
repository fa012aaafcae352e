//! Owns prompt-cache affinity (`models.<id>.affinity: conversation`, opt-in): requests of
//! one conversation go first to the route that last served it, while that route is healthy
//! and not resting, so that the provider's prompt cache (keyed per deployment or account)
//! keeps hitting. The effect shows in the ledger's `cached_input_tokens`.
//!
//! The conversation key, first found wins:
//! 1. `prompt_cache_key` in the body (OpenAI's explicit cache key; Codex sends its
//!    conversation id there);
//! 2. a session header of a known coding agent: `x-claude-code-session-id` (Claude Code,
//!    on every request), `session_id` (Codex CLI's conversation id,
//!    `codex-rs/codex-api/src/requests/headers.rs`), `conversation_id` (earlier Codex
//!    releases);
//! 3. the end user: Anthropic's `metadata.user_id` (Claude Code puts its session id in it),
//!    OpenAI's `user`;
//! 4. else a hash of the system prompt and the first conversation message.
//!
//! Every key is hashed with the tenant and the standard model, so two tenants (or two
//! models) never share an entry. Nothing of the request is stored: the table maps a
//! 64-bit key hash to a 64-bit hash of the route's health key.
//!
//! Bounded memory: [`CAPACITY`] entries at most (about 2 MiB), kept as two generations per
//! shard (an approximate LRU: a hit in the old generation moves to the new one; when the
//! new one is full the old one is dropped), and an entry unused for [`IDLE_TTL`] is a miss
//! (providers keep a prompt cache for minutes, an hour at most).
//!
//! The table is process-wide and outlives config reloads; an entry whose route a reload
//! removed simply finds no candidate (`unavailable`) and is overwritten by the next answer.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};

use super::health::Health;
use super::Candidate;
use crate::metrics::metrics;
use crate::protocol;

/// Most conversations remembered (all shards, both generations).
pub const CAPACITY: usize = 65_536;
/// An entry unused this long is forgotten.
pub const IDLE_TTL: Duration = Duration::from_secs(3600);
/// Shards of the table (a lock each).
const SHARDS: usize = 16;
/// Entries one generation of one shard holds.
const GENERATION: usize = CAPACITY / SHARDS / 2;

/// Session headers of coding agents, checked in this order (lower-case names).
pub const SESSION_HEADERS: [&str; 3] =
    ["x-claude-code-session-id", "session_id", "conversation_id"];

/// Where a request's conversation key came from (hashed either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `prompt_cache_key` in the body.
    PromptCacheKey,
    /// A coding agent's session header.
    SessionHeader,
    /// `metadata.user_id` or `user`.
    User,
    /// The system prompt and the first message.
    Prefix,
}

/// A request's conversation key: a hash of tenant, standard model and the key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationKey {
    /// The hash the table is keyed by.
    pub hash: u64,
    /// What it was made from.
    pub source: KeySource,
}

/// A [`Hasher`] that `serde_json` and `fmt` can write into (no string is built).
struct HashWriter(std::hash::DefaultHasher);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Write for HashWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

fn hash_value(w: &mut HashWriter, v: &Value) {
    let _ = serde_json::to_writer(&mut *w, v);
}

/// The conversation key of a request of `model` by `tenant`: from the raw body object
/// `body` (empty for dialects whose object is not kept), the request headers, and the
/// canonical request when the body is not kept. `None` only when nothing identifies it
/// (no messages at all).
pub fn conversation_key(
    tenant: &str,
    model: &str,
    headers: &http::HeaderMap,
    body: &Map<String, Value>,
    canonical: Option<&protocol::Request>,
) -> Option<ConversationKey> {
    let mut w = HashWriter(std::hash::DefaultHasher::new());
    tenant.hash(&mut w.0);
    model.hash(&mut w.0);
    fn text(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str).filter(|s| !s.is_empty())
    }
    let source = if let Some(k) = text(body.get("prompt_cache_key")) {
        ("p", k).hash(&mut w.0);
        KeySource::PromptCacheKey
    } else if let Some(v) = SESSION_HEADERS
        .iter()
        .find_map(|h| headers.get(*h).filter(|v| !v.is_empty()))
    {
        ("s", v.as_bytes()).hash(&mut w.0);
        KeySource::SessionHeader
    } else if let Some(u) = text(body.get("metadata").and_then(|m| m.get("user_id")))
        .or_else(|| text(body.get("user")))
        .or_else(|| {
            canonical
                .and_then(|c| c.user.as_deref())
                .filter(|u| !u.is_empty())
        })
    {
        ("u", u).hash(&mut w.0);
        KeySource::User
    } else {
        "m".hash(&mut w.0);
        if !hash_prefix(&mut w, body, canonical) {
            return None;
        }
        KeySource::Prefix
    };
    Some(ConversationKey {
        hash: w.0.finish(),
        source,
    })
}

/// Hashes the system prompt and the first non-system message: Messages' `system` and
/// `messages[0]`; Chat's leading `system`/`developer` messages and the first other one;
/// else (Responses) the canonical request's. `false` when there is no message.
fn hash_prefix(
    w: &mut HashWriter,
    body: &Map<String, Value>,
    canonical: Option<&protocol::Request>,
) -> bool {
    if let Some(Value::Array(messages)) = body.get("messages") {
        if let Some(system) = body.get("system") {
            hash_value(w, system);
        }
        let is_system = |m: &Value| {
            matches!(
                m.get("role").and_then(Value::as_str),
                Some("system" | "developer")
            )
        };
        for m in messages.iter().take_while(|m| is_system(m)) {
            hash_value(w, m);
        }
        return match messages.iter().find(|m| !is_system(m)) {
            Some(first) => {
                hash_value(w, first);
                true
            }
            None => false,
        };
    }
    let Some(c) = canonical else {
        return false;
    };
    let Some(first) = c.messages.first() else {
        return false;
    };
    for s in &c.system {
        s.hash(&mut w.0);
    }
    let _ = std::fmt::Write::write_fmt(w, format_args!("{first:?}"));
    true
}

/// One remembered conversation.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Hash of the serving route's health key.
    route: u64,
    /// Last use, ms since the table's epoch.
    at_ms: u64,
}

/// Two generations of one shard.
#[derive(Debug, Default)]
struct Shard {
    current: HashMap<u64, Entry>,
    previous: HashMap<u64, Entry>,
}

impl Shard {
    fn get(&mut self, key: u64, now: u64) -> Option<u64> {
        let e = match self.current.get_mut(&key) {
            Some(e) => e,
            None => {
                let e = self.previous.remove(&key)?;
                self.insert(key, e);
                self.current.get_mut(&key)?
            }
        };
        if now.saturating_sub(e.at_ms) > ttl_ms() {
            self.current.remove(&key);
            return None;
        }
        e.at_ms = now;
        Some(e.route)
    }

    fn insert(&mut self, key: u64, e: Entry) {
        if self.current.len() >= GENERATION && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, e);
    }

    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

fn ttl_ms() -> u64 {
    u64::try_from(IDLE_TTL.as_millis()).unwrap_or(u64::MAX)
}

/// The process-wide conversation → route table.
#[derive(Debug)]
pub struct AffinityTable {
    shards: [Mutex<Shard>; SHARDS],
    epoch: std::time::Instant,
}

impl Default for AffinityTable {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            epoch: std::time::Instant::now(),
        }
    }
}

fn route_hash(health_key: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    health_key.hash(&mut h);
    h.finish()
}

impl AffinityTable {
    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, Shard> {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "reduced modulo the shard count"
        )]
        let i = (key % SHARDS as u64) as usize;
        self.shards[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Puts the conversation's route first among `cands` when it is one of them, healthy
    /// and not resting; else leaves the order. Counts `sluice_affinity_total{model,outcome}`.
    pub fn prefer(&self, model: &str, key: ConversationKey, cands: &mut [Candidate<'_>]) {
        let known = self.shard(key.hash).get(key.hash, self.now_ms());
        let outcome = match known {
            None => "miss",
            Some(route) => match cands.iter().position(|c| {
                route_hash(&c.route.health_key) == route
                    && c.health.state() == Health::Healthy
                    && c.health.is_available()
            }) {
                Some(i) => {
                    cands[..=i].rotate_right(1);
                    "hit"
                }
                None => "unavailable",
            },
        };
        metrics()
            .affinity_total
            .with_label_values(&[model, outcome])
            .inc();
    }

    /// Remembers that the route with `health_key` served the conversation.
    pub fn remember(&self, key: ConversationKey, health_key: &str) {
        let e = Entry {
            route: route_hash(health_key),
            at_ms: self.now_ms(),
        };
        self.shard(key.hash).insert(key.hash, e);
    }

    /// Conversations remembered now (both generations), for tests.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.len()))
            .sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// For a request of `model` by `tenant` (its head's `headers`, body object and canonical
/// request): when the model has `affinity: conversation` and the client set no provider
/// `order` of its own, puts the conversation's route first among `cands` (see
/// [`AffinityTable::prefer`]) and returns the key to remember the serving route under.
pub fn for_request(
    model: &crate::config::Model,
    tenant: &str,
    headers: &http::HeaderMap,
    body: &Map<String, Value>,
    canonical: Option<&protocol::Request>,
    preference: Option<&super::Preference>,
    cands: &mut [Candidate<'_>],
) -> Option<ConversationKey> {
    if model.affinity != crate::config::opt_in::Affinity::Conversation
        || preference.is_some_and(|p| !p.order.is_empty())
    {
        return None;
    }
    let key = conversation_key(tenant, &model.id, headers, body, canonical)?;
    table().prefer(&model.id, key, cands);
    Some(key)
}

/// After the request: remembers the candidate that answered it (`outcome`'s provider and
/// upstream model, a complete answer) as the conversation's route.
pub fn served(key: ConversationKey, cands: &[Candidate<'_>], outcome: &crate::outcome::Outcome) {
    if outcome.status != 200 || outcome.upstream_broke {
        return;
    }
    let (Some(provider), Some(upstream_model)) = (&outcome.provider, &outcome.upstream_model)
    else {
        return;
    };
    if let Some(c) = cands
        .iter()
        .find(|c| c.route.provider.id == *provider && c.route.upstream_model == *upstream_model)
    {
        table().remember(key, &c.route.health_key);
    }
}

/// The process-wide table.
pub fn table() -> &'static AffinityTable {
    static TABLE: LazyLock<AffinityTable> = LazyLock::new(AffinityTable::default);
    &TABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(body: &Value, headers: &[(&'static str, &'static str)]) -> ConversationKey {
        let mut h = http::HeaderMap::new();
        for (n, v) in headers {
            h.insert(*n, http::HeaderValue::from_static(v));
        }
        conversation_key("t", "m", &h, body.as_object().unwrap(), None).unwrap()
    }

    #[test]
    fn keys_come_from_the_most_explicit_source() {
        let chat = serde_json::json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ]});
        let turn2 = serde_json::json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]});
        let a = key(&chat, &[]);
        assert_eq!(a.source, KeySource::Prefix);
        assert_eq!(a, key(&turn2, &[]), "later turns share the prefix key");
        let other = serde_json::json!({"messages": [{"role": "user", "content": "bye"}]});
        assert_ne!(a.hash, key(&other, &[]).hash);
        let s = key(&chat, &[("x-claude-code-session-id", "abc")]);
        assert_eq!(s.source, KeySource::SessionHeader);
        assert_eq!(
            key(&other, &[("x-claude-code-session-id", "abc")]).hash,
            s.hash
        );
        let mut with_key = chat.clone();
        with_key["prompt_cache_key"] = "conv-1".into();
        let p = key(&with_key, &[("session_id", "zzz")]);
        assert_eq!(p.source, KeySource::PromptCacheKey);
        let mut with_user = chat.clone();
        with_user["metadata"] = serde_json::json!({"user_id": "u_1_session_9"});
        assert_eq!(key(&with_user, &[]).source, KeySource::User);
        // The tenant is part of every key.
        let h = http::HeaderMap::new();
        let obj = chat.as_object().unwrap();
        assert_ne!(
            conversation_key("t1", "m", &h, obj, None).unwrap().hash,
            conversation_key("t2", "m", &h, obj, None).unwrap().hash
        );
        assert!(conversation_key("t", "m", &h, &Map::new(), None).is_none());
    }

    #[test]
    fn the_table_is_bounded_and_keeps_recent_entries() {
        let t = AffinityTable::default();
        let k = |hash| ConversationKey {
            hash,
            source: KeySource::Prefix,
        };
        for i in 0..(CAPACITY as u64 * 3) {
            t.remember(k(i), "route");
            if i % 1000 == 0 {
                // Kept in use: survives the generations that drop the rest.
                t.remember(k(7), "route-7");
                assert!(t.shard(7).get(7, t.now_ms()).is_some());
            }
        }
        assert!(t.len() <= CAPACITY, "{}", t.len());
        assert_eq!(t.shard(7).get(7, t.now_ms()), Some(route_hash("route-7")));
        assert_eq!(
            t.shard(0).get(0, t.now_ms()),
            None,
            "the oldest were dropped"
        );
        // Expired entries are misses.
        let mut s = Shard::default();
        s.insert(1, Entry { route: 5, at_ms: 0 });
        assert_eq!(s.get(1, ttl_ms() + 1), None);
    }
}
