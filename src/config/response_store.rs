//! The `response_store:` settings after validation (the store itself lives in
//! [`crate::conversation`]): kept in config so that config depends on nothing above it.

use std::time::Duration;

/// Default `response_store.max_age_secs`: 30 days.
pub const DEFAULT_MAX_AGE_SECS: u64 = 30 * 24 * 3600;

/// Default `response_store.max_bytes_per_tenant`: 1 GiB.
pub const DEFAULT_MAX_BYTES_PER_TENANT: u64 = 1 << 30;

/// Default `response_store.sweep_interval_secs`.
pub const DEFAULT_SWEEP_INTERVAL_SECS: u64 = 60;

/// Default `response_store.queue_capacity`, responses.
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;

/// `response_store:` after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseStoreSettings {
    /// Whether responses are stored and served (`response_store.enabled`; default
    /// `ledger.enabled`).
    pub enabled: bool,
    /// How long a stored response is kept (`response_store.max_age_secs`).
    pub max_age: Duration,
    /// Most bytes one tenant keeps (`response_store.max_bytes_per_tenant`).
    pub max_bytes_per_tenant: u64,
    /// How often expired responses are deleted (`response_store.sweep_interval_secs`).
    pub sweep_interval: Duration,
    /// Responses queued for writing before new ones are dropped.
    pub queue_capacity: usize,
}

impl Default for ResponseStoreSettings {
    /// Enabled, 30 days, 1 GiB per tenant, swept every minute, 10 000 queued.
    fn default() -> Self {
        Self {
            enabled: true,
            max_age: Duration::from_secs(DEFAULT_MAX_AGE_SECS),
            max_bytes_per_tenant: DEFAULT_MAX_BYTES_PER_TENANT,
            sweep_interval: Duration::from_secs(DEFAULT_SWEEP_INTERVAL_SECS),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
        }
    }
}
