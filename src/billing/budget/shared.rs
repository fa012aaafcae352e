//! Owns the budget state shared by replicas through Redis: the reservation script
//! ([`RESERVE_LUA`]), the settlement script ([`SETTLE_LUA`]) and their keys.
//!
//! Per tenant and window period, three keys under the tenant's hash tag (one cluster slot):
//! `sluice:budget:{<tenant>}:<period>:spent` (nano-USD charged), `…:reserved` (nano-USD held by
//! requests in flight) and `…:holds` (a sorted set of the reservations, member
//! `<request id>:<nano-USD>`, score = when it expires, Redis server time in ms). `<period>` is
//! `total`, `m2026-12` or `d2026-12-02` ([`Period::key_suffix`]). A reservation is one `EVALSHA`
//! on the request path, bounded by `redis.timeout_ms`; a settlement is sent off the request path
//! (a spawned task, bounded by one second).

use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use super::window::{Period, Window};
use super::{configured, RESERVATION_TTL};
use crate::config::schema::{BudgetSection, RedisSection};
use crate::metrics::metrics;
use crate::redis::{BackendError, SharedRedis};

/// Bound of one settlement write.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// Spend keys outlive their period by this much (day keys), so late settlements and status
/// reads still find them.
const DAY_KEY_GRACE_S: i64 = 3 * 86_400;
/// The same for month keys.
const MONTH_KEY_GRACE_S: i64 = 62 * 86_400;

/// The reservation. `KEYS`: per window its `spent`, `reserved` and `holds` keys. `ARGV[1]`
/// member, `ARGV[2]` hold time ms, `ARGV[3]` amount (nano-USD), then per window: budget
/// (nano-USD), the replica's own spend figure (seeds a missing `spent` key), when the spend
/// key expires (unix s, 0 = never); last, `1` to reserve as much of the amount as every window
/// has room for (a hard budget's settlement), else `0`. Expired holds are released first.
/// Returns `{refused window (1-based, 0 = admitted), then per window: spent + reserved (this
/// reservation included when admitted), then the amount reserved}`.
pub const RESERVE_LUA: &str = r"
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, hold, amount = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n = #KEYS / 3
local partial = tonumber(ARGV[3 * n + 4]) == 1
local used = {}
local limits = {}
local refused = 0
for i = 1, n do
  local sk, rk, hk = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local limit, seed, expire = tonumber(ARGV[3 * i + 1]), ARGV[3 * i + 2], tonumber(ARGV[3 * i + 3])
  if redis.call('SET', sk, seed, 'NX') and expire > 0 then
    redis.call('EXPIREAT', sk, expire)
  end
  local reserved = tonumber(redis.call('GET', rk) or '0') or 0
  local old = redis.call('ZRANGEBYSCORE', hk, '-inf', now)
  if #old > 0 then
    for _, m in ipairs(old) do
      reserved = reserved - (tonumber(string.match(m, ':(%-?%d+)$')) or 0)
    end
    redis.call('ZREMRANGEBYSCORE', hk, '-inf', now)
    if reserved < 0 or redis.call('ZCARD', hk) == 0 then reserved = 0 end
    redis.call('SET', rk, reserved)
  end
  used[i] = (tonumber(redis.call('GET', sk)) or 0) + reserved
  limits[i] = limit
end
if partial then
  for i = 1, n do
    local room = limits[i] - used[i]
    if room < amount then amount = math.max(room, 0) end
  end
end
for i = 1, n do
  if refused == 0 and (used[i] + amount > limits[i] or (partial and amount <= 0)) then refused = i end
end
if refused == 0 then
  for i = 1, n do
    local rk, hk = KEYS[3 * i - 1], KEYS[3 * i]
    redis.call('ZADD', hk, now + hold, member .. ':' .. amount)
    redis.call('INCRBY', rk, amount)
    redis.call('PEXPIRE', hk, hold * 2)
    redis.call('PEXPIRE', rk, hold * 2)
    used[i] = used[i] + amount
  end
end
local out = {refused}
for i = 1, n do out[i + 1] = used[i] end
out[n + 2] = amount
return out
";

/// The settlement. `KEYS`: per window its `spent`, `reserved` and `holds` keys. `ARGV[1]` the
/// charge (nano-USD), then per hold of the request its member (`<request id>:<nano-USD>`) and
/// amount. Releases every hold Redis still has (an expired or never-held one releases nothing)
/// and adds the charge, in one script: a request's holds (its reservation and the growths of a
/// stream or a hard settlement) are never released before its charge is added, so no other
/// replica's reservation can take money between the two. Returns 1.
pub const SETTLE_LUA: &str = r"
local charge = tonumber(ARGV[1])
local holds = (#ARGV - 1) / 2
for i = 1, #KEYS / 3 do
  local sk, rk, hk = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if charge > 0 then redis.call('INCRBY', sk, charge) end
  for j = 1, holds do
    if redis.call('ZREM', hk, ARGV[2 * j]) == 1 then
      local left = redis.call('DECRBY', rk, tonumber(ARGV[2 * j + 1]))
      if left < 0 then redis.call('SET', rk, 0) end
    end
  end
end
return 1
";

static RESERVE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RESERVE_LUA));
static SETTLE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SETTLE_LUA));

/// One reservation to make.
#[derive(Debug)]
pub struct Call<'a> {
    /// Tenant id.
    pub tenant: &'a str,
    /// Its budget.
    pub budget: &'a BudgetSection,
    /// The period of each window now.
    pub periods: &'a [Period; 3],
    /// This replica's spend figure per window, nano-USD (seeds missing keys).
    pub seeds: &'a [i64; 3],
    /// The reservation's unique member name.
    pub member: &'a str,
    /// Nano-USD to reserve.
    pub amount: i64,
    /// Reserve as much of `amount` as every window has room for (refused only when one has
    /// none).
    pub partial: bool,
}

/// Redis's answer to a reservation.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The first window without room (`None`: reserved).
    pub refused: Option<Window>,
    /// Per window ([`Window::index`]; 0 for windows not configured): spent plus reserved,
    /// this reservation included when it was made, nano-USD.
    pub used: [i64; 3],
    /// Nano-USD reserved (the amount asked, or less with [`Call::partial`]).
    pub granted: i64,
}

/// The three keys of `tenant`'s `window` in `period`.
pub fn keys(tenant: &str, window: Window, period: &Period) -> [String; 3] {
    let base = format!("sluice:budget:{{{tenant}}}:{}", period.key_suffix(window));
    [
        format!("{base}:spent"),
        format!("{base}:reserved"),
        format!("{base}:holds"),
    ]
}

/// When the spend key of `window` in `period` expires, unix s (0: never).
fn spend_expiry_s(window: Window, period: &Period) -> i64 {
    let end_s = period.end_ms.div_euclid(1000);
    match window {
        Window::Total => 0,
        Window::Daily => end_s + DAY_KEY_GRACE_S,
        Window::Monthly => end_s + MONTH_KEY_GRACE_S,
    }
}

/// Makes one reservation in one script call, bounded by `settings.timeout_ms`.
///
/// # Errors
/// [`BackendError`] when Redis did not answer in time or failed (the caller fails open).
pub async fn reserve(
    redis: &SharedRedis,
    settings: &RedisSection,
    call: &Call<'_>,
) -> Result<Answer, BackendError> {
    let timeout = Duration::from_millis(settings.timeout_ms.max(1));
    let mut conn = redis.connection(&settings.url)?;
    let windows: Vec<Window> = configured(call.budget).collect();
    let mut inv = RESERVE.prepare_invoke();
    inv.arg(call.member)
        .arg(u64::try_from(RESERVATION_TTL.as_millis()).unwrap_or(u64::MAX))
        .arg(call.amount);
    for &w in &windows {
        let p = &call.periods[w.index()];
        for k in keys(call.tenant, w, p) {
            inv.key(k);
        }
        inv.arg(super::to_nano(w.limit(call.budget).unwrap_or(0.0)))
            .arg(call.seeds[w.index()])
            .arg(spend_expiry_s(w, p));
    }
    inv.arg(i64::from(call.partial));
    let answer: Vec<i64> = match tokio::time::timeout(timeout, inv.invoke_async(&mut conn)).await {
        Ok(r) => r?,
        Err(_) => return Err(BackendError::Timeout(timeout.as_millis())),
    };
    if answer.len() != windows.len() + 2 {
        return Err(BackendError::Malformed);
    }
    let granted = answer[windows.len() + 1];
    let mut used = [0; 3];
    for (i, &w) in windows.iter().enumerate() {
        used[w.index()] = answer[i + 1];
    }
    let refused = usize::try_from(answer[0])
        .ok()
        .and_then(|i| i.checked_sub(1))
        .map(|i| windows.get(i).copied().ok_or(BackendError::Malformed))
        .transpose()?;
    Ok(Answer {
        refused,
        used,
        granted,
    })
}

/// Sends a settlement (release every hold of `holds`, `(member, nano-USD)` pairs, in
/// `periods`, and add `charge`) in a spawned task, bounded by one second. One script does
/// both ([`SETTLE_LUA`]). A failed write is counted in
/// `sluice_ratelimit_backend_errors_total{kind="budget_settle"}` and logged (its charge is
/// then missing from Redis, still in the ledger).
pub fn settle(
    redis: Arc<SharedRedis>,
    tenant: &str,
    budget: &BudgetSection,
    periods: &[Period; 3],
    holds: Vec<(String, i64)>,
    charge: i64,
) {
    let Some(settings) = redis.settings() else {
        return;
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let keys: Vec<String> = configured(budget)
        .flat_map(|w| keys(tenant, w, &periods[w.index()]))
        .collect();
    let tenant = tenant.to_string();
    rt.spawn(async move {
        let work = async {
            let mut conn = redis.connection(&settings.url)?;
            let mut inv = SETTLE.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(charge);
            for (member, amount) in &holds {
                inv.arg(format!("{member}:{amount}")).arg(*amount);
            }
            let _: i64 = inv.invoke_async(&mut conn).await?;
            Ok::<_, BackendError>(())
        };
        let failed = match tokio::time::timeout(SETTLE_TIMEOUT, work).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", SETTLE_TIMEOUT.as_millis()),
        };
        metrics()
            .ratelimit_backend_errors_total
            .with_label_values(&["budget_settle"])
            .inc();
        log::warn!(target: "sluice::budget::shared", "budget settlement of tenant `{tenant}` not written to Redis ({failed}): {} USD \
             charged is in the ledger but not in the shared budget",
            super::to_usd(charge)
        );
    });
}
