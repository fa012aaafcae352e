//! Owns the live half of the configured providers: for each provider of a config snapshot,
//! its kind's [`Adapter`] and its live [`Credential`] (a SigV4 signer, a token cache),
//! resolved once when the snapshot is loaded or reloaded. The config holds data only; the
//! registry is built from it and swapped together with it ([`crate::live`]), so a request
//! pins both.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{adapter, Adapter, Credential};
use crate::config::{Config, Provider};

/// One provider resolved: its adapter and its live credential.
#[derive(Debug)]
pub struct Upstream {
    /// What the provider's kind does at run time.
    pub adapter: &'static dyn Adapter,
    /// The provider's live credential ([`Credential::None`]: a static key or none).
    pub credential: Credential,
}

impl Upstream {
    /// Resolves `provider`: its kind's adapter and the credential that adapter builds.
    pub fn resolve(provider: &Provider) -> Self {
        let adapter = adapter(provider.kind);
        Self {
            adapter,
            credential: adapter.credential(provider),
        }
    }
}

/// Every provider of one config snapshot, resolved.
#[derive(Debug, Default)]
pub struct Registry {
    upstreams: BTreeMap<String, Arc<Upstream>>,
}

impl Registry {
    /// Resolves every provider of `config` (no I/O: credentials were read at load; a token
    /// cache starts fetching on first use, and one of an unchanged account is the live one).
    pub fn build(config: &Config) -> Self {
        Self {
            upstreams: config
                .providers
                .iter()
                .map(|(id, p)| (id.clone(), Arc::new(Upstream::resolve(p))))
                .collect(),
        }
    }

    /// The resolved `provider`. A provider of another snapshot (never, when the pair is
    /// pinned together) is resolved on the spot.
    pub fn upstream(&self, provider: &Provider) -> Arc<Upstream> {
        match self.upstreams.get(&provider.id) {
            Some(u) => u.clone(),
            None => Arc::new(Upstream::resolve(provider)),
        }
    }
}
