//! Owns bearer tokens that a provider's credential is exchanged for at run time (Vertex AI:
//! a service-account key → an OAuth2 access token): one [`TokenCache`] per provider account,
//! shared by all its requests, refreshed off the request path by a background task before
//! the token expires.
//!
//! - **Refresh ahead.** The task fetches the first token when the cache is first used, then
//!   again when [`refresh_margin`] of the token's lifetime remains (5 min of Google's hour,
//!   a quarter of a short token's), so requests normally find a fresh token and never wait.
//! - **Single flight.** Only the task fetches. A request that finds no usable token (none
//!   yet, or an expired one after failed refreshes) wakes the task and waits for that one
//!   fetch, bounded by the caller's deadline (the provider's connect timeout).
//! - **Failures are provider failures.** A failed fetch is kept for [`FAILURE_HOLD`]:
//!   requests in that window fail at once (the attempt loop falls back as after a connect
//!   error, and passive health counts it) instead of each triggering a fetch; the task
//!   retries with a doubling backoff (1 s to 60 s), and the next request after the hold
//!   triggers a fetch of its own.
//! - **Never printed.** The token is a [`Secret`]; the fetcher's errors carry no credential.
//! - **Across reloads.** [`TokenCache::shared`] returns the live cache of the same account
//!   (same key, same token endpoint), so a config reload keeps the token; the task ends when
//!   the last snapshot holding the cache is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::secret::Secret;

/// How long a failed fetch answers waiting requests at once (no new fetch per request).
pub const FAILURE_HOLD: Duration = Duration::from_secs(1);
/// First retry delay of the background task after a failed fetch (doubles each time).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest retry delay of the background task.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait of the background task between checks (it also ends when the cache is gone).
const MAX_SLEEP: Duration = Duration::from_secs(300);

/// A token as the token endpoint issued it.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// The bearer token (`Authorization: Bearer <value>`).
    pub value: Secret,
    /// How long it is valid from the moment it was requested (OAuth2 `expires_in`).
    pub lifetime: Duration,
}

/// The future of one fetch.
pub type FetchFuture<'a> = Pin<Box<dyn Future<Output = Result<IssuedToken, String>> + Send + 'a>>;

/// Gets a fresh token from the credential's issuer (one network exchange).
pub trait TokenFetcher: Send + Sync + std::fmt::Debug {
    /// Fetches one token.
    ///
    /// # Errors
    /// A message for the log and the attempt record: unreachable endpoint, a rejected
    /// credential, an unreadable answer. It never contains the credential or a token.
    fn fetch(&self) -> FetchFuture<'_>;
}

/// How long before expiry a token of `lifetime` is refreshed: 5 minutes, or a quarter of
/// the lifetime when that is shorter (a short-lived token is refreshed at 75 % of its life).
pub fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / 4).min(Duration::from_secs(300))
}

/// The least validity a token must have left to be sent: 10 s, or a tenth of its lifetime
/// when that is shorter (it must not expire while the request travels).
fn send_margin(lifetime: Duration) -> Duration {
    (lifetime / 10).min(Duration::from_secs(10))
}

#[derive(Debug, Clone)]
struct Held {
    value: Arc<Secret>,
    expires_at: Instant,
    lifetime: Duration,
}

impl Held {
    fn usable(&self, now: Instant) -> bool {
        now + send_margin(self.lifetime) < self.expires_at
    }

    fn refresh_at(&self) -> Instant {
        self.expires_at
            .checked_sub(refresh_margin(self.lifetime))
            .unwrap_or(self.expires_at)
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    token: Option<Held>,
    /// A fetch is under way.
    fetching: bool,
    /// The last fetch failed: when, and why.
    failure: Option<(Instant, String)>,
}

#[derive(Debug)]
struct Shared {
    /// The provider id (the metric label and the log's `provider`).
    provider: String,
    fetcher: Box<dyn TokenFetcher>,
    /// Upper bound of one fetch.
    fetch_timeout: Duration,
    state: watch::Sender<State>,
    wake: Notify,
    closed: AtomicBool,
    started: AtomicBool,
    fetches: AtomicU64,
}

/// The shared, self-refreshing token of one provider account. Cloning the `Arc` shares it;
/// dropping the last one stops its background task.
#[derive(Debug)]
pub struct TokenCache {
    shared: Arc<Shared>,
}

type Registry = Mutex<HashMap<String, Weak<TokenCache>>>;

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Mutex::new(HashMap::new()));

impl TokenCache {
    /// A new cache of provider `provider` over `fetcher`; each fetch is bounded by
    /// `fetch_timeout`. Nothing runs until the first [`TokenCache::bearer`] (so config
    /// validation starts no task).
    pub fn new(provider: &str, fetcher: Box<dyn TokenFetcher>, fetch_timeout: Duration) -> Self {
        let (state, _) = watch::channel(State::default());
        Self {
            shared: Arc::new(Shared {
                provider: provider.to_string(),
                fetcher,
                fetch_timeout,
                state,
                wake: Notify::new(),
                closed: AtomicBool::new(false),
                started: AtomicBool::new(false),
                fetches: AtomicU64::new(0),
            }),
        }
    }

    /// The live cache registered under `account` (a string naming the provider, its key
    /// and its token endpoint, e.g. a digest of them), else a new one from `make`, registered.
    pub fn shared(account: &str, make: impl FnOnce() -> TokenCache) -> Arc<TokenCache> {
        let mut reg = REGISTRY
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(live) = reg.get(account).and_then(Weak::upgrade) {
            return live;
        }
        let cache = Arc::new(make());
        reg.insert(account.to_string(), Arc::downgrade(&cache));
        cache
    }

    /// How many fetches the cache has started (for tests and the log).
    pub fn fetches(&self) -> u64 {
        self.shared.fetches.load(Ordering::Relaxed)
    }

    /// A token valid for at least its send margin: the cached one, else the result of the
    /// one fetch in flight (started now if none is), waiting at most `wait`.
    ///
    /// # Errors
    /// The last fetch's failure (within [`FAILURE_HOLD`] of it, or when the fetch this
    /// request waited for failed), or a timeout message when no token came within `wait`.
    pub async fn bearer(&self, wait: Duration) -> Result<Arc<Secret>, String> {
        self.start();
        let deadline = Instant::now() + wait;
        let mut rx = self.shared.state.subscribe();
        // A failure older than this request is a reason to fetch, newer ones are its answer.
        let asked_at = Instant::now();
        let mut woke = false;
        loop {
            {
                let s = rx.borrow_and_update();
                let now = Instant::now();
                if let Some(t) = s.token.as_ref().filter(|t| t.usable(now)) {
                    return Ok(t.value.clone());
                }
                if !s.fetching {
                    match &s.failure {
                        Some((at, why)) if woke && *at >= asked_at => return Err(why.clone()),
                        Some((at, why)) if now < *at + FAILURE_HOLD => return Err(why.clone()),
                        _ if !woke => {
                            woke = true;
                            // Wakes the task only if it waits (no permit is kept: a stale
                            // one would start a second fetch right after this one).
                            self.shared.wake.notify_waiters();
                        }
                        _ => {}
                    }
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the token cache was shut down".into()),
                Err(_) => return Err(format!("no access token within {} ms", wait.as_millis())),
            }
        }
    }

    /// Forgets the cached token (the provider rejected it: revoked, or the clocks disagree);
    /// the next request waits for a new one.
    pub fn invalidate(&self) {
        self.shared.state.send_modify(|s| s.token = None);
    }

    /// Starts the background task once, on the runtime of the first caller.
    fn start(&self) {
        if self.shared.started.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(refresh_loop(self.shared.clone()));
            }
            Err(_) => self.shared.started.store(false, Ordering::Release),
        }
    }
}

impl Drop for TokenCache {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// The background task: fetch, publish, then wait until the refresh time (after a failure:
/// the backoff) or until a request finds no usable token, until the cache is dropped.
async fn refresh_loop(shared: Arc<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        shared.state.send_modify(|s| s.fetching = true);
        shared.fetches.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = match tokio::time::timeout(shared.fetch_timeout, shared.fetcher.fetch()).await
        {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the token endpoint did not answer within {} ms",
                shared.fetch_timeout.as_millis()
            )),
        };
        let label = if result.is_ok() { "ok" } else { "error" };
        crate::metrics::metrics()
            .provider_token_fetches_total
            .with_label_values(&[shared.provider.as_str(), label])
            .inc();
        let next = match result {
            Ok(t) => {
                backoff = FIRST_BACKOFF;
                let held = Held {
                    value: Arc::new(t.value),
                    expires_at: started + t.lifetime,
                    lifetime: t.lifetime,
                };
                let next = held.refresh_at();
                log::debug!(
                    target: "sluice::providers::token",
                    "access token refreshed provider={} lifetime_ms={}",
                    shared.provider,
                    t.lifetime.as_millis()
                );
                shared.state.send_modify(|s| {
                    s.token = Some(held);
                    s.fetching = false;
                    s.failure = None;
                });
                next
            }
            Err(why) => {
                log::warn!(
                    target: "sluice::providers::token",
                    "access token fetch failed provider={} retry_in_ms={} detail={why:?}",
                    shared.provider,
                    backoff.as_millis()
                );
                shared.state.send_modify(|s| {
                    s.fetching = false;
                    s.failure = Some((Instant::now(), why));
                });
                let next = Instant::now() + backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                next
            }
        };
        if !wait_for_turn(&shared, next).await {
            return;
        }
    }
}

/// Waits until `next`, or until a request wakes the task while no token is good to send;
/// `false` when the cache was dropped meanwhile.
async fn wait_for_turn(shared: &Shared, next: Instant) -> bool {
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next.min(Instant::now() + MAX_SLEEP)) => {
                if shared.closed.load(Ordering::Acquire) {
                    return false;
                }
                if Instant::now() >= next {
                    return true;
                }
            }
            () = shared.wake.notified() => {
                if shared.closed.load(Ordering::Acquire) {
                    return false;
                }
                let now = Instant::now();
                let fresh = shared
                    .state
                    .borrow()
                    .token
                    .as_ref()
                    .is_some_and(|t| t.usable(now));
                if !fresh {
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Issues `tok-N` tokens of `lifetime`, failing while `fail` is set; counts calls.
    #[derive(Debug)]
    struct Fake {
        calls: Arc<AtomicU32>,
        fail: Arc<AtomicBool>,
        lifetime: Duration,
        delay: Duration,
    }

    impl TokenFetcher for Fake {
        fn fetch(&self) -> FetchFuture<'_> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(self.delay).await;
                if self.fail.load(Ordering::SeqCst) {
                    return Err("token endpoint answered HTTP 500".into());
                }
                Ok(IssuedToken {
                    value: Secret::new(format!("tok-{n}")),
                    lifetime: self.lifetime,
                })
            })
        }
    }

    fn cache(lifetime: Duration, delay: Duration) -> (TokenCache, Arc<AtomicU32>, Arc<AtomicBool>) {
        let calls = Arc::new(AtomicU32::new(0));
        let fail = Arc::new(AtomicBool::new(false));
        let c = TokenCache::new(
            "test",
            Box::new(Fake {
                calls: calls.clone(),
                fail: fail.clone(),
                lifetime,
                delay,
            }),
            Duration::from_secs(5),
        );
        (c, calls, fail)
    }

    #[test]
    fn margins() {
        assert_eq!(
            refresh_margin(Duration::from_secs(3600)),
            Duration::from_secs(300)
        );
        assert_eq!(
            refresh_margin(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            send_margin(Duration::from_secs(3600)),
            Duration::from_secs(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_first_requests_share_one_fetch() {
        let (c, calls, _) = cache(Duration::from_secs(3600), Duration::from_millis(50));
        let c = Arc::new(c);
        let waits: Vec<_> = (0..20)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.bearer(Duration::from_secs(1)).await })
            })
            .collect();
        for w in waits {
            assert_eq!(w.await.unwrap().unwrap().expose(), "tok-1");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(c.fetches(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_is_refreshed_ahead_of_expiry_without_requests_waiting() {
        let (c, calls, _) = cache(Duration::from_secs(4), Duration::from_millis(10));
        assert_eq!(
            c.bearer(Duration::from_secs(1)).await.unwrap().expose(),
            "tok-1"
        );
        // Refreshed at 3 s (a quarter of 4 s left): at 3.5 s the second token is there.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let t = tokio::time::timeout(Duration::from_millis(1), c.bearer(Duration::from_secs(1)))
            .await
            .expect("no wait: the refreshed token is cached")
            .unwrap();
        assert_eq!(t.expose(), "tok-2");
        // Over ten lifetimes: one fetch per lifetime, not more.
        tokio::time::sleep(Duration::from_secs(40)).await;
        let n = calls.load(Ordering::SeqCst);
        assert!(
            (13..=16).contains(&n),
            "{n} fetches in 43.5 s of 4 s tokens"
        );
        assert!(c.bearer(Duration::from_secs(1)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_endpoint_fails_requests_fast_and_recovers() {
        let (c, calls, fail) = cache(Duration::from_secs(3600), Duration::from_millis(10));
        fail.store(true, Ordering::SeqCst);
        let e = c.bearer(Duration::from_secs(2)).await.unwrap_err();
        assert!(e.contains("HTTP 500"), "{e}");
        // Within the hold: answered from the failure, no new fetch.
        for _ in 0..10 {
            assert!(c.bearer(Duration::from_secs(2)).await.is_err());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(FAILURE_HOLD + Duration::from_millis(1)).await;
        assert!(c.bearer(Duration::from_secs(2)).await.is_ok());
        assert!(calls.load(Ordering::SeqCst) <= 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_endpoint_is_bounded_by_the_callers_wait() {
        let (c, _, _) = cache(Duration::from_secs(3600), Duration::from_secs(3));
        let e = c.bearer(Duration::from_millis(200)).await.unwrap_err();
        assert!(e.contains("within 200 ms"), "{e}");
        // The fetch goes on and serves the next request.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(c.bearer(Duration::from_millis(200)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn invalidate_makes_the_next_request_fetch() {
        let (c, calls, _) = cache(Duration::from_secs(3600), Duration::from_millis(10));
        assert_eq!(
            c.bearer(Duration::from_secs(1)).await.unwrap().expose(),
            "tok-1"
        );
        c.invalidate();
        assert_eq!(
            c.bearer(Duration::from_secs(1)).await.unwrap().expose(),
            "tok-2"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn shared_returns_the_live_cache_of_an_account() {
        let make = || cache(Duration::from_secs(1), Duration::ZERO).0;
        let a = TokenCache::shared("test-account-a", make);
        let b = TokenCache::shared("test-account-a", make);
        assert!(Arc::ptr_eq(&a, &b));
        let other = TokenCache::shared("test-account-b", make);
        assert!(!Arc::ptr_eq(&a, &other));
        drop((a, b));
        let fresh = TokenCache::shared("test-account-a", make);
        assert!(!Arc::ptr_eq(&fresh, &other));
    }
}
