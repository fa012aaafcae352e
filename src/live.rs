//! Owns the live configuration: the validated [`Config`] snapshot together with the provider
//! [`Registry`] built from it, swapped as one pair by hot reload ([`ConfigHandle`]). A request
//! pins the pair ([`ConfigHandle::pinned`]), so its providers' credentials always match its
//! config. A reload that fails validation stores nothing: the old pair stays.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::providers::registry::Registry;

/// One config snapshot and the registry built from it.
#[derive(Debug)]
pub struct Live {
    /// The configuration (data only).
    pub config: Arc<Config>,
    /// Its providers, resolved.
    pub registry: Arc<Registry>,
}

impl Live {
    /// The pair for `cfg`: its registry is built here.
    pub fn new(cfg: Config) -> Self {
        let registry = Arc::new(Registry::build(&cfg));
        Self {
            config: Arc::new(cfg),
            registry,
        }
    }
}

/// The live configuration and registry, swapped atomically by hot reload.
#[derive(Debug)]
pub struct ConfigHandle {
    current: ArcSwap<Live>,
}

impl ConfigHandle {
    /// Wraps an initial snapshot (its registry built here).
    pub fn new(cfg: Config) -> Self {
        Self {
            current: ArcSwap::from_pointee(Live::new(cfg)),
        }
    }

    /// The current config snapshot (pin it for a whole request).
    pub fn snapshot(&self) -> Arc<Config> {
        self.current.load().config.clone()
    }

    /// The current config snapshot with its registry (what a request pins).
    pub fn pinned(&self) -> Arc<Live> {
        self.current.load_full()
    }

    /// Replaces the snapshot and its registry, built here from `cfg`.
    pub fn store(&self, cfg: Config) {
        self.current.store(Arc::new(Live::new(cfg)));
    }
}
