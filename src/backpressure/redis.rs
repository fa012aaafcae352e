//! Owns the distributed request and token limits shared by Sluice replicas through Redis
//! (`redis: {url, timeout_ms, replicas}`), and the backend's health.
//!
//! **Algorithm: a sliding-window log**, one atomic Lua script per admission check
//! ([`CHECK_LUA`]). Each limit scope has a sorted set of the requests admitted in the last
//! window (score = Redis server time in ms, member = `<request id>:<estimated tokens>`) and a
//! token-sum key. The script drops entries older than the window, counts what is left,
//! admits the request only if every scope's request and token limit has room, records it in
//! every scope, and returns counts, the time until the window resets and, on refusal, when the
//! oldest blocking entry leaves the window. Exact over any window (no 2× burst at a fixed
//! window's edge), using the Redis clock so replicas need no synchronised clocks. Keys expire
//! one second after the window. One check is one `EVALSHA` (one round trip; `SCRIPT LOAD`
//! once after a Redis restart).
//!
//! **Token settlement.** When a request ends, its entry is rewritten from the estimated to the
//! real token count in place (same score), and the sum corrected ([`SETTLE_LUA`]). These
//! writes are queued and sent in batches by the background service, off the request path. A
//! refund (the request was admitted here but then refused by the global queue) removes the
//! entry.
//!
//! **Failure.** A check slower than `redis.timeout_ms` or failing marks the backend down: the
//! request, and every request until a background probe (`PING` every
//! [`PROBE_INTERVAL`]) succeeds again, is decided by the local limiter with the limit divided
//! by `redis.replicas`. Down and recovered are logged once per outage; every request decided
//! locally because of it counts in `sluice_ratelimit_backend_errors_total{kind}` (`timeout`,
//! `error`, `unavailable`; failed settlement batches count as `settle`). The client is a
//! `redis::aio::ConnectionManager`, which reconnects by itself; a changed `redis.url` takes
//! effect on the next request.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use pingora::server::ShutdownWatch;
use tokio::sync::mpsc;

use super::status::{LimitState, RateLimitStatus};
use super::tenant::{LimitKind, Plan, PlanItem, Refusal};
use crate::config::schema::RedisSection;
use crate::metrics::metrics;
pub use crate::redis::{BackendError, SharedRedis};

/// How often a down backend is probed.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// Bound of one settlement batch write.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);
/// Most queued settlements; more are dropped (and counted) while Redis is slow.
const SETTLE_QUEUE: usize = 8192;
/// Most settlements sent in one script call.
const SETTLE_BATCH: usize = 256;

/// The admission check. `KEYS`: per scope its log and token-sum key. `ARGV[1]` window ms,
/// `ARGV[2]` request id, then per scope: request limit, token limit (-1 = none), tokens to
/// charge. Returns `{admitted, refused scope (1-based, 0 = none), refused kind (1 requests,
/// 2 tokens), retry ms, then per scope: requests in window, tokens in window, reset ms}`.
pub const CHECK_LUA: &str = r"
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local id = ARGV[2]
local cutoff = now - window
local n = #KEYS / 2
local function amount(m)
  return tonumber(string.match(m, ':(%-?%d+)$')) or 0
end
local counts, sums = {}, {}
local failed, kind, retry = 0, 0, 0
for i = 1, n do
  local log, sk = KEYS[2 * i - 1], KEYS[2 * i]
  local rl, tl, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local sum = tonumber(redis.call('GET', sk) or '0') or 0
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #old > 0 then
    for _, m in ipairs(old) do sum = sum - amount(m) end
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  local count = redis.call('ZCARD', log)
  if count == 0 or sum < 0 then sum = 0 end
  if #old > 0 then
    if count == 0 then redis.call('DEL', sk) else redis.call('SET', sk, sum, 'KEEPTTL') end
  end
  counts[i], sums[i] = count, sum
  if failed == 0 then
    if rl >= 0 and count + 1 > rl then
      failed, kind, retry = i, 1, window
      local e = redis.call('ZRANGE', log, count - rl, count - rl, 'WITHSCORES')
      if e[2] then retry = tonumber(e[2]) + window - now end
    elseif tl >= 0 and sum + cost > tl then
      failed, kind, retry = i, 2, window
      if cost <= tl then
        local need = sum + cost - tl
        local es = redis.call('ZRANGE', log, 0, 255, 'WITHSCORES')
        for j = 1, #es, 2 do
          need = need - amount(es[j])
          if need <= 0 then
            retry = tonumber(es[j + 1]) + window - now
            break
          end
        end
      end
    end
  end
end
local out = {failed == 0 and 1 or 0, failed, kind, retry}
for i = 1, n do
  local log, sk = KEYS[2 * i - 1], KEYS[2 * i]
  if failed == 0 then
    local cost = tonumber(ARGV[3 * i + 2])
    redis.call('ZADD', log, now, id .. ':' .. cost)
    redis.call('PEXPIRE', log, window + 1000)
    sums[i] = sums[i] + cost
    counts[i] = counts[i] + 1
    redis.call('SET', sk, sums[i], 'PX', window + 1000)
  end
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  local reset = 0
  if newest[2] then reset = tonumber(newest[2]) + window - now end
  out[#out + 1] = counts[i]
  out[#out + 1] = sums[i]
  out[#out + 1] = reset
end
return out
";

/// Token settlement, sent with `EVAL`. `KEYS`: per entry a log and its token-sum key; `ARGV` per entry: the
/// member written at admission, its replacement (`''` removes it), the token delta. An entry
/// already out of the window is left alone.
pub const SETTLE_LUA: &str = r"
for i = 1, #KEYS / 2 do
  local log, sk = KEYS[2 * i - 1], KEYS[2 * i]
  local old, new, delta = ARGV[3 * i - 2], ARGV[3 * i - 1], tonumber(ARGV[3 * i])
  local score = redis.call('ZSCORE', log, old)
  if score then
    local ttl = redis.call('PTTL', log)
    redis.call('ZREM', log, old)
    if new ~= '' then
      redis.call('ZADD', log, score, new)
      if ttl > 0 then redis.call('PEXPIRE', log, ttl) end
    end
    if ttl > 0 and redis.call('EXISTS', log) == 1 then
      local v = (tonumber(redis.call('GET', sk) or '0') or 0) + delta
      if v < 0 then v = 0 end
      redis.call('SET', sk, v, 'PX', ttl)
    else
      redis.call('DEL', sk)
    end
  end
end
return 1
";

static CHECK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CHECK_LUA));

/// Redis's answer to one check.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteVerdict {
    /// `None` when admitted; else which limit refused it and when to come back.
    pub refused: Option<Refusal>,
    /// The binding status over all scopes (including this request when admitted).
    pub status: RateLimitStatus,
}

/// One queued settlement (or refund) of an admitted request.
#[derive(Debug)]
pub struct Settle {
    /// The scopes it was recorded in, with the tokens charged in each.
    pub scopes: Vec<(PlanItem, u64)>,
    /// Its request id.
    pub member: String,
    /// Real tokens; `None` removes the entry (refund).
    pub actual: Option<u64>,
}

/// The Redis rate limiter of one process: admission checks on the request path, and the
/// background service that writes settlement batches and probes a down backend. The
/// connection and its health are the process's one [`SharedRedis`], which tenant budgets
/// use too.
pub struct RedisLimiter {
    shared: Arc<SharedRedis>,
    settle_tx: mpsc::Sender<Settle>,
    settle_rx: Mutex<Option<mpsc::Receiver<Settle>>>,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// A limiter for `settings` (nothing connects until the first check or probe).
    pub fn new(settings: Option<&RedisSection>) -> Self {
        let (settle_tx, settle_rx) = mpsc::channel(SETTLE_QUEUE);
        Self {
            shared: Arc::new(SharedRedis::new(settings)),
            settle_tx,
            settle_rx: Mutex::new(Some(settle_rx)),
        }
    }

    /// The process's Redis connection and its health (shared with tenant budgets).
    pub fn shared(&self) -> &Arc<SharedRedis> {
        &self.shared
    }

    /// Applies a reloaded `redis:` section.
    pub fn reconfigure(&self, settings: Option<&RedisSection>) {
        self.shared.reconfigure(settings);
    }

    /// The configured `redis:` section, if any.
    pub fn settings(&self) -> Option<Arc<RedisSection>> {
        self.shared.settings()
    }

    /// Whether checks go to Redis (configured and not marked down).
    pub fn is_up(&self) -> bool {
        self.shared.is_up()
    }

    /// A unique request id for the window logs.
    pub fn next_member(&self) -> String {
        self.shared.next_member()
    }

    /// Marks the backend down after a failed check; logs once per outage.
    pub fn mark_down(&self, e: &BackendError) {
        self.shared.mark_down(e);
    }

    /// Checks one request (`cost` estimated tokens) against every scope of `plan` in one
    /// script call, bounded by `settings.timeout_ms`.
    ///
    /// # Errors
    /// [`BackendError`] when Redis did not answer in time or failed (the caller fails open).
    pub async fn check(
        &self,
        settings: &RedisSection,
        window: Duration,
        plan: &Plan,
        member: &str,
        cost: u64,
    ) -> Result<RemoteVerdict, BackendError> {
        let timeout = Duration::from_millis(settings.timeout_ms.max(1));
        let mut conn = self.shared.connection(&settings.url)?;
        let items: Vec<&PlanItem> = plan.items().filter(|i| i.limits.has_rates()).collect();
        let mut inv = CHECK.prepare_invoke();
        inv.arg(u64::try_from(window.as_millis()).unwrap_or(u64::MAX))
            .arg(member);
        for item in &items {
            inv.key(&item.state.redis_log_key)
                .key(&item.state.redis_sum_key);
            let l = item.limits;
            inv.arg(
                l.requests
                    .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)),
            )
            .arg(
                l.tokens
                    .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)),
            )
            .arg(if l.tokens.is_some() { cost } else { 0 });
        }
        let answer: Vec<i64> =
            match tokio::time::timeout(timeout, inv.invoke_async(&mut conn)).await {
                Ok(r) => r?,
                Err(_) => return Err(BackendError::Timeout(timeout.as_millis())),
            };
        parse_verdict(&answer, &items, window, cost)
    }

    /// Queues a settlement for the background service (never waits; a full queue drops it
    /// and counts `kind="settle"`).
    pub fn enqueue(&self, s: Settle) {
        if self.settle_tx.try_send(s).is_err() {
            metrics()
                .ratelimit_backend_errors_total
                .with_label_values(&["settle"])
                .inc();
        }
    }

    /// Writes a batch of settlements in one script call (bounded).
    async fn flush(&self, batch: &mut Vec<Settle>) {
        let Some(s) = self.shared.settings() else {
            batch.clear();
            return;
        };
        let Ok(mut conn) = self.shared.connection(&s.url) else {
            batch.clear();
            return;
        };
        // `EVAL`, not `EVALSHA`: a batch must not depend on the script cache (a restarted
        // Redis answers NOSCRIPT, and a batch sent while Redis is stalled is never retried).
        let mut keys: Vec<&str> = Vec::new();
        let mut args: Vec<(String, String, i64)> = Vec::new();
        for st in batch.iter() {
            for (item, charged) in &st.scopes {
                let old = format!("{}:{charged}", st.member);
                let (new, delta) = match st.actual {
                    Some(a) => (format!("{}:{a}", st.member), to_i64(a) - to_i64(*charged)),
                    None => (String::new(), -to_i64(*charged)),
                };
                keys.push(&item.state.redis_log_key);
                keys.push(&item.state.redis_sum_key);
                args.push((old, new, delta));
            }
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SETTLE_LUA).arg(keys.len()).arg(&keys);
        for (old, new, delta) in &args {
            cmd.arg(old).arg(new).arg(*delta);
        }
        drop(keys);
        batch.clear();
        if args.is_empty() {
            return;
        }
        let r: Result<Result<i64, _>, _> =
            tokio::time::timeout(BACKGROUND_TIMEOUT, cmd.query_async(&mut conn)).await;
        if !matches!(r, Ok(Ok(_))) {
            metrics()
                .ratelimit_backend_errors_total
                .with_label_values(&["settle"])
                .inc();
        }
    }

    /// The background loop: probes while down, writes settlement batches. Ends on `shutdown`.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let rx = self
            .settle_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(mut rx) = rx else {
            // Already running elsewhere: just wait for shutdown.
            let _ = shutdown.changed().await;
            return;
        };
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(SETTLE_BATCH);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.shared.probe().await,
                n = rx.recv_many(&mut batch, SETTLE_BATCH) => {
                    if n == 0 {
                        return;
                    }
                    self.flush(&mut batch).await;
                }
            }
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn parse_verdict(
    a: &[i64],
    items: &[&PlanItem],
    window: Duration,
    cost: u64,
) -> Result<RemoteVerdict, BackendError> {
    if a.len() != 4 + 3 * items.len() {
        return Err(BackendError::Malformed);
    }
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    let refused_at = match (a[0], usize::try_from(a[1]).unwrap_or(0)) {
        (1, _) => None,
        (_, i) if (1..=items.len()).contains(&i) => Some(i - 1),
        _ => return Err(BackendError::Malformed),
    };
    let mut status = RateLimitStatus::default();
    let mut refused = None;
    for (i, item) in items.iter().enumerate() {
        let count = u64::try_from(a[4 + 3 * i]).unwrap_or(0);
        let tokens = u64::try_from(a[5 + 3 * i]).unwrap_or(0);
        let reset = ms(a[6 + 3 * i]).min(window);
        let state = |limit: Option<u64>, used: u64| {
            limit.map(|limit| LimitState {
                limit,
                remaining: limit.saturating_sub(used),
                reset,
            })
        };
        let one = RateLimitStatus {
            requests: state(item.limits.requests, count),
            tokens: state(item.limits.tokens, tokens),
        };
        item.state.set_remote(one);
        status.merge(one);
        if refused_at == Some(i) {
            let (kind, limit, used, requested) = if a[2] == 2 {
                (LimitKind::Tokens, item.limits.tokens, tokens, cost)
            } else {
                (LimitKind::Requests, item.limits.requests, count, 1)
            };
            refused = Some(Refusal {
                kind,
                limit: limit.unwrap_or(0),
                used,
                requested,
                retry_after: ms(a[3]).clamp(Duration::from_millis(1), window),
                model_scope: item.state.model.is_some(),
            });
        }
    }
    Ok(RemoteVerdict { refused, status })
}
