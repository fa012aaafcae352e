//! Owns the process's open-file limit: raising it at start and deriving the default global
//! cap on concurrent upstream requests (`server.max_concurrent_upstream_requests`) from it.
//!
//! Every held stream costs two descriptors (the client's socket and the provider's), so a
//! cap larger than half the limit would turn a burst into `EMFILE` on `accept` or `connect`
//! (errors nobody can retry cleanly) instead of Sluice's own 503 + `Retry-After`. Like Go's
//! runtime and nginx's `worker_rlimit_nofile`, Sluice raises its soft limit to the hard
//! limit before anything opens a socket.

/// Descriptors kept out of the derived cap: listeners, log and ledger files, the Redis and
/// PostgreSQL connections, pooled idle upstream connections, the upgrade socket.
pub const RESERVED_FDS: u64 = 256;

/// Descriptors one held stream uses: the downstream and the upstream socket.
pub const FDS_PER_STREAM: u64 = 2;

/// The derived cap never goes below this (a tiny `ulimit -n` still serves).
pub const MIN_DERIVED_CAP: usize = 64;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force
/// (unchanged when the raise is refused; `None` when the limit cannot be read).
pub fn raise_nofile_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => Some(n),
        Err(_) => nofile_soft_limit(),
    }
}

/// The soft `RLIMIT_NOFILE` of this process (`None` when it cannot be read).
pub fn nofile_soft_limit() -> Option<u64> {
    rlimit::getrlimit(rlimit::Resource::NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// The cap for a soft limit of `soft` descriptors: `(soft - RESERVED_FDS) / FDS_PER_STREAM`,
/// at least [`MIN_DERIVED_CAP`]; an unlimited soft limit counts as 1,048,576.
pub fn cap_for(soft: u64) -> usize {
    let soft = if soft == rlimit::INFINITY {
        1 << 20
    } else {
        soft
    };
    let cap = soft.saturating_sub(RESERVED_FDS) / FDS_PER_STREAM;
    usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .max(MIN_DERIVED_CAP)
}

/// The default `server.max_concurrent_upstream_requests`: [`cap_for`] this process's soft
/// limit (1024 when the limit cannot be read, the former fixed default).
pub fn derived_upstream_cap() -> usize {
    nofile_soft_limit().map_or(1024, cap_for)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_half_the_descriptors_left_after_the_reserve() {
        assert_eq!(cap_for(1024), 384);
        assert_eq!(cap_for(20_000), 9_872);
        assert_eq!(cap_for(65_536), 32_640);
        assert_eq!(cap_for(1_048_576), 524_160);
        assert_eq!(cap_for(100), MIN_DERIVED_CAP);
        assert_eq!(cap_for(rlimit::INFINITY), 524_160);
    }

    #[test]
    fn the_default_follows_the_limit_in_force() {
        let soft = nofile_soft_limit().expect("RLIMIT_NOFILE is readable on Linux");
        assert_eq!(derived_upstream_cap(), cap_for(soft));
    }
}
