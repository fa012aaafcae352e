//! Owns the virtual key table of one config snapshot: SHA-256 key hashes → [`Caller`] (tenant,
//! key id, key policy), built by validation. [`crate::auth`] extracts the key a client
//! presents and looks it up here.
//!
//! Keys are stored only as hashes. Lookup hashes the presented key (SHA-256) and finds the
//! digest in a hash map, so authentication costs the same at 1 key as at 100,000 (before, it
//! compared the digest with every entry). The map's timing can depend only on the presented
//! key's digest, which says nothing usable about any stored key (finding a key from digests
//! is a SHA-256 preimage); the found entry's digest is still compared in constant time.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

use super::Strategy;

/// Who is calling: the tenant and key a request is billed and limited under.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Tenant id.
    pub tenant: String,
    /// Key id for logs: the configured name or `key-` + 8 hex chars of the hash.
    pub key_id: String,
    /// Standard models this key may use (`None`: all the tenant may use).
    pub allowed_models: Option<Arc<[String]>>,
    /// Providers this key may reach (`None`: all).
    pub allowed_providers: Option<Arc<[String]>>,
    /// Strategy override.
    pub strategy: Option<Strategy>,
}

impl Caller {
    /// Whether this caller may use the standard model `model`.
    pub fn may_use_model(&self, model: &str) -> bool {
        self.allowed_models
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x == model))
    }

    /// Whether this caller's requests may go to `provider`.
    pub fn may_use_provider(&self, provider: &str) -> bool {
        self.allowed_providers
            .as_ref()
            .is_none_or(|p| p.iter().any(|x| x == provider))
    }
}

/// The virtual key table of one config snapshot: key digest → caller.
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: HashMap<[u8; 32], Caller>,
}

/// SHA-256 of a key.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyTable {
    /// Adds a key by its hash; a second key with the same hash replaces the first.
    pub fn insert(&mut self, hash: [u8; 32], caller: Caller) {
        self.entries.insert(hash, caller);
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a key with this hash exists.
    pub fn contains_hash(&self, hash: &[u8; 32]) -> bool {
        self.entries.contains_key(hash)
    }

    /// Finds the caller for a presented key: one SHA-256 and one map lookup, whatever the
    /// table's size.
    pub fn authenticate(&self, presented: &str) -> Option<&Caller> {
        let hash = hash_key(presented);
        self.entries
            .get_key_value(&hash)
            .filter(|(stored, _)| bool::from(stored.ct_eq(&hash)))
            .map(|(_, caller)| caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(t: &str) -> Caller {
        Caller {
            tenant: t.into(),
            key_id: "k".into(),
            allowed_models: None,
            allowed_providers: None,
            strategy: None,
        }
    }

    #[test]
    fn authenticates_by_hash() {
        let mut t = KeyTable::default();
        t.insert(hash_key("sk-a"), caller("a"));
        t.insert(hash_key("sk-b"), caller("b"));
        assert_eq!(t.authenticate("sk-b").map(|c| c.tenant.as_str()), Some("b"));
        assert!(t.authenticate("sk-c").is_none());
    }

    #[test]
    fn model_and_provider_policy() {
        let mut c = caller("a");
        c.allowed_models = Some(vec!["m1".to_string()].into());
        assert!(c.may_use_model("m1"));
        assert!(!c.may_use_model("m2"));
        assert!(c.may_use_provider("anything"));
    }
}
