//! Owns the per-provider concurrency caps (`providers.<id>.max_concurrent_requests`): how many
//! requests may be in flight to one provider at once, over all its routes.
//!
//! The global cap (`server.max_concurrent_upstream_requests`) protects Sluice; this one
//! protects a provider (a self-hosted vLLM with a fixed batch size, an account with a
//! concurrency quota). A full provider is not a failing one: its routes are skipped for
//! this request without touching their health, and the request falls back to the next
//! candidate. The counters are keyed by provider id and outlive reloads, so requests in
//! flight across a reload are counted against the new cap; a lowered cap takes effect as
//! they finish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use crate::config::Provider;

/// In-flight counters by provider id.
static IN_FLIGHT: LazyLock<RwLock<HashMap<String, Arc<AtomicUsize>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// One request's place at a capped provider; released on drop.
#[derive(Debug)]
pub struct ProviderSlot(Arc<AtomicUsize>);

impl Drop for ProviderSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The outcome of [`try_take`].
#[derive(Debug)]
pub enum ProviderAdmission {
    /// The provider has no cap of its own: nothing is counted.
    Uncapped,
    /// A place at the provider, held until the attempt ends.
    Slot(ProviderSlot),
    /// The provider holds `max_concurrent_requests` requests already.
    Full,
}

fn counter(id: &str) -> Arc<AtomicUsize> {
    if let Some(c) = IN_FLIGHT
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(id)
    {
        return c.clone();
    }
    IN_FLIGHT
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(id.to_owned())
        .or_default()
        .clone()
}

/// Takes a place at `provider` if it has a cap (never waits: a full provider is skipped,
/// not queued for; the global admission queue already bounds the wait).
pub fn try_take(provider: &Provider) -> ProviderAdmission {
    let Some(cap) = provider.max_concurrent_requests else {
        return ProviderAdmission::Uncapped;
    };
    let c = counter(&provider.id);
    let taken = c
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok();
    if taken {
        ProviderAdmission::Slot(ProviderSlot(c))
    } else {
        ProviderAdmission::Full
    }
}

/// Requests in flight to the capped provider `id` (0 for an uncapped or unknown one).
pub fn in_flight(id: &str) -> usize {
    IN_FLIGHT
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(id)
        .map_or(0, |c| c.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn provider(cap: Option<usize>) -> Arc<Provider> {
        let yaml = format!(
            "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-test-0001\n    tenant: t\nproviders:\n  capped-test:\n    kind: demo\n{}models:\n  m/a:\n    routes:\n      - provider: capped-test\n        upstream_model: a\n",
            cap.map_or(String::new(), |c| format!("    max_concurrent_requests: {c}\n"))
        );
        let cfg =
            Config::parse(std::path::Path::new("provider-cap.yaml"), &yaml).expect("valid config");
        cfg.providers["capped-test"].clone()
    }

    #[test]
    fn a_capped_provider_gives_out_its_cap_and_takes_places_back_on_drop() {
        let p = provider(Some(2));
        let a = try_take(&p);
        let b = try_take(&p);
        assert!(matches!(a, ProviderAdmission::Slot(_)));
        assert!(matches!(b, ProviderAdmission::Slot(_)));
        assert!(matches!(try_take(&p), ProviderAdmission::Full));
        assert_eq!(in_flight("capped-test"), 2);
        drop(a);
        assert_eq!(in_flight("capped-test"), 1);
        assert!(matches!(try_take(&p), ProviderAdmission::Slot(_)));
        drop(b);
        assert_eq!(in_flight("capped-test"), 0);
    }

    #[test]
    fn an_uncapped_provider_counts_nothing() {
        assert!(matches!(
            try_take(&provider(None)),
            ProviderAdmission::Uncapped
        ));
    }
}
