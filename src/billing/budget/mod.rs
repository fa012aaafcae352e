//! Owns tenant budgets (`tenants.<id>.budget: {total_usd, monthly_usd, daily_usd}`): what a
//! tenant may still be charged, reserved at admission and settled when the request ends.
//!
//! | part | owns |
//! |---|---|
//! | this file | [`Budgets`] (process-wide state per tenant), [`Reservation`], the 402, the `sluice_budget_remaining_usd` gauge |
//! | [`window`] | the UTC calendar windows and the clock |
//! | [`shared`] | the Redis scripts that share reservations and spend across replicas |
//!
//! **Reserve, then settle.** At admission Sluice reserves the request's worst charge × 1.2
//! ([`reservation_usd`]: the input estimate at the higher of the input and cache-write sell
//! prices plus the output bound at the output price). The request is refused with **402**
//! (`insufficient_quota` / `budget_exceeded`; Anthropic's `billing_error` on `/v1/messages`)
//! when, in any configured window, what was charged plus what is reserved by requests in
//! flight plus this reservation exceeds the budget. When the request ends (Pingora's `logging`
//! phase, after metering) the real charge is added to the window and the reservation released;
//! an aborted stream settles what was streamed (the metered estimate). Checks and updates of
//! one tenant are done under one lock (or in one Redis script), so concurrent requests racing
//! for the last dollar never reserve more than the budget holds: as long as each request's real
//! charge stays within its reservation (the output is bounded by `max_tokens`, the input
//! estimate has a 20% margin), the sum of charges never exceeds the budget.
//!
//! **When the reservation was too small.** A provider may report more input than the estimate
//! (an image or a document costs more than counted, or a provider miscounts). The input estimate
//! is an upper bound where the input is knowable (images at the providers' per-image maximum, a
//! base64 PDF by its page count, see [`crate::protocol::tokens`]). A stream's running charge
//! (the input as reported, e.g. Anthropic's `message_start`, plus the output streamed so far) is
//! checked against its reservation after every batch of events; past it, the reservation grows
//! ([`Reservation::grow`], the same atomic check as at admission, locally or in Redis) or, when
//! the budget has no room for it, the stream ends with the budget error event in the client's
//! dialect (`crate::stream::pump`). A non-stream answer is charged what the provider reported.
//!
//! **`hard: true`** (a contract): the tenant is never charged past its budget. At settlement
//! a charge above the reservation first grows it by as much as the budget has left (room no
//! other request holds, [`Budgets::reserve_up_to`]); what still does not fit is not charged:
//! the request's charge is capped at what it held, while the ledger's `cost_usd` keeps what
//! the provider billed (the operator sees the difference). Since every hold is admitted
//! under one lock (or one Redis script) and no charge exceeds its hold, the sum of charges
//! never exceeds the budget, across replicas too.
//!
//! **Amounts** are integer nano-dollars (1e-9 USD), exact under any number of additions
//! (Redis keeps them with `INCRBY`; Lua's doubles are exact to 2^53 nano-dollars, about 9
//! million USD per window).
//!
//! **Where spend comes from.** The usage ledger is the record of what was charged. The first
//! time a process sees a tenant with a budget, it reads the tenant's charges from the ledger
//! (everything, since the start of the UTC month, since the start of the UTC day) and adds
//! every charge it settles after that. A restart therefore keeps the spend (but for records lost
//! to `kill -9`, at most one ledger flush interval). Without Redis each replica knows only its own
//! charges after it started (plus the ledger's at start): several replicas need Redis for a
//! budget they share exactly.
//!
//! **With `redis:`** reservations and spend live in Redis, one atomic script per reservation
//! ([`shared::RESERVE_LUA`]) and one per settlement, keyed by tenant and period
//! (`sluice:budget:{tenant}:d2026-12-02:spent`, …; day keys expire 3 days after their day, month
//! keys 62 days after their month, `total` never). A spend key Redis does not have (first use, a
//! flushed Redis) is seeded with the replica's own figure. A reservation Redis holds expires
//! after [`RESERVATION_TTL`] (a replica that died keeps no money reserved for ever). Fail-open is
//! the rate limits' rule: when Redis is slow or down, the replica decides alone, allowing itself
//! `1 / redis.replicas` of what was left when Redis last answered. A reservation that timed
//! out may still run in Redis later: the replica releases it there at once (the settlement
//! script with charge 0, queued behind it on the same connection), so a slow Redis leaves no
//! money held for the reservation TTL.

pub mod shared;
pub mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use window::{Clock, ManualClock, Period, SystemClock, Window};

use crate::billing::metering::Prices;
use crate::config::schema::BudgetSection;
use crate::config::{Config, Model};
use crate::error::GatewayError;
use crate::metrics::metrics;
use crate::redis::SharedRedis;

/// The margin on a reservation: the estimated worst charge × this.
pub const RESERVATION_MARGIN: f64 = 1.2;

/// How long Redis holds a reservation that was never settled (its replica died).
pub const RESERVATION_TTL: Duration = Duration::from_secs(3600);

/// Longest wait for the ledger's figures when a tenant's budget is first used.
const SEED_TIMEOUT: Duration = Duration::from_secs(5);

/// USD → nano-dollars (rounded; saturating).
pub fn to_nano(usd: f64) -> i64 {
    let n = (usd * 1e9).round();
    if n.is_nan() {
        0
    } else {
        n.clamp(i64::MIN as f64, i64::MAX as f64) as i64
    }
}

/// Nano-dollars → USD.
pub fn to_usd(nano: i64) -> f64 {
    nano as f64 / 1e9
}

/// The reservation of a request, USD: `(input × max(input, cache write) + max_output ×
/// output) × 1.2` at `model`'s sell prices. `max_output_tokens` is the client's `max_tokens`
/// (or equivalent), else the model's `default_max_tokens`.
pub fn reservation_usd(model: &Model, input_tokens: u64, max_output_tokens: Option<u64>) -> f64 {
    let p = Prices::sell(model);
    let input_price = p.input.max(p.cache_write.unwrap_or(p.input));
    let output = max_output_tokens.unwrap_or(model.default_max_tokens) as f64;
    (input_tokens as f64 * input_price + output * p.output) / 1e6 * RESERVATION_MARGIN
}

/// One window's figures in this process, nano-USD.
#[derive(Debug, Clone, Copy, Default)]
struct WindowState {
    /// The period these figures belong to ([`Period::id`]).
    period: i64,
    /// The ledger's charges when the tenant was first seen (0 for a period that started
    /// later).
    base: i64,
    /// Charged in the period: `base` plus this process's settlements since.
    spent: i64,
    /// Reserved by this process's requests in flight.
    reserved: i64,
    /// Charged plus reserved (all replicas, this request's reservation included) as Redis
    /// reported it at the last reservation it admitted or refused.
    synced: Option<i64>,
    /// This process's changes since `synced`: reservations made alone plus, per settlement,
    /// charge minus reservation.
    since_sync: i64,
}

impl WindowState {
    /// Starts a new period when `period` differs (a new day or month starts empty).
    fn roll(&mut self, period: i64) {
        if self.period != period {
            *self = WindowState {
                period,
                ..WindowState::default()
            };
        }
    }

    /// Charged plus reserved, as far as this process knows.
    fn used(&self) -> i64 {
        match self.synced {
            Some(synced) => synced + self.since_sync,
            None => self.spent + self.reserved,
        }
    }

    /// How much more fits under `limit`, nano-USD (may be negative), by the rule of
    /// [`WindowState::admits`].
    fn room(&self, limit: i64, share: u32) -> i64 {
        if share <= 1 {
            return limit - self.used();
        }
        let (base, mine) = match self.synced {
            Some(synced) => (synced, self.since_sync),
            None => (self.base, self.spent - self.base + self.reserved),
        };
        (limit - base).max(0) / i64::from(share) - mine
    }

    /// Whether `amount` more fits under `limit`. `share` > 1 is failing open with
    /// `redis.replicas` replicas: this process may use `1 / share` of what was left when Redis
    /// last answered (or of what the ledger left, before Redis ever answered). `Err` carries the
    /// figure to report as used.
    fn admits(&self, limit: i64, amount: i64, share: u32) -> Result<(), i64> {
        if share <= 1 {
            let used = self.used();
            return if used.saturating_add(amount) <= limit {
                Ok(())
            } else {
                Err(used)
            };
        }
        let (base, mine) = match self.synced {
            Some(synced) => (synced, self.since_sync),
            None => (self.base, self.spent - self.base + self.reserved),
        };
        let allowance = (limit - base).max(0) / i64::from(share);
        if mine.saturating_add(amount) <= allowance {
            Ok(())
        } else {
            Err(base + mine)
        }
    }
}

/// The ledger's charges of one tenant, by window, nano-USD, as of `at_ms`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seed {
    /// When they were read, unix ms.
    pub at_ms: i64,
    /// Per window ([`Window::index`]).
    pub spent: [i64; 3],
}

/// A tenant's budget state in this process.
#[derive(Debug)]
struct TenantBudget {
    /// Filled once from the ledger.
    seeded: tokio::sync::OnceCell<()>,
    windows: Mutex<[WindowState; 3]>,
    /// `sluice_budget_remaining_usd{tenant,window}` children, looked up once per window
    /// (a label lookup hashes and locks the vector; reserve and settle run per request).
    gauges: [std::sync::OnceLock<prometheus::Gauge>; 3],
}

/// Why a reservation was refused: which window, its budget, and what is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exceeded {
    /// The window.
    pub window: Window,
    /// Its budget, USD.
    pub budget_usd: f64,
    /// Charged plus reserved in the window, USD.
    pub used_usd: f64,
    /// This request's reservation, USD.
    pub requested_usd: f64,
    /// When the window starts over (`None`: `total` never does), unix ms.
    pub resets_at_ms: Option<i64>,
}

impl Exceeded {
    /// The 402 the client gets (counted in `sluice_rejected_total{reason="budget_exceeded"}`).
    pub fn error(&self, tenant: &str) -> GatewayError {
        metrics()
            .rejected_total
            .with_label_values(&["budget_exceeded"])
            .inc();
        let left = (self.budget_usd - self.used_usd).max(0.0);
        let when = match self.resets_at_ms {
            Some(ms) => format!(
                "; it starts over at {}",
                crate::billing::ledger::rfc3339_ms::format(ms)
            ),
            None => String::new(),
        };
        GatewayError::BudgetExceeded {
            message: format!(
                "Budget exceeded for tenant `{tenant}`: its {} budget is {:.6} USD, {:.6} USD \
                 is left (charged or reserved by requests in flight), and this request needs \
                 up to {:.6} USD{when}. Lower max_tokens or raise the budget.",
                self.window.label(),
                self.budget_usd,
                left,
                self.requested_usd,
            ),
        }
    }
}

/// The process-wide budget state (one per process; reloads change the budgets it enforces,
/// read per request from the request's config snapshot, never the spend).
#[derive(Debug)]
pub struct Budgets {
    clock: Arc<dyn Clock>,
    tenants: Mutex<HashMap<Box<str>, Arc<TenantBudget>>>,
    redis: Arc<SharedRedis>,
    /// Tenants whose figures [`Budgets::warm`] should read from the ledger.
    to_warm: Mutex<Vec<(Box<str>, BudgetSection)>>,
}

/// Money reserved by one request; [`Reservation::settle`] it with the real charge. Dropped
/// unsettled (the request never reached a provider), it releases the money.
#[derive(Debug)]
pub struct Reservation {
    /// The budgets it was taken from ([`Reservation::grow`] reserves more there).
    budgets: Arc<Budgets>,
    tenant: Box<str>,
    state: Arc<TenantBudget>,
    budget: BudgetSection,
    /// Nano-USD reserved in every configured window.
    amount: i64,
    /// The period of each window when reserved.
    periods: [Period; 3],
    /// With `redis:` configured: the backend and the reservation's member name (which Redis
    /// holds only when it admitted the reservation).
    remote: Option<(Arc<SharedRedis>, String)>,
    /// What [`Reservation::grow`] added: holds of their own, released at settlement (the
    /// charge goes to this one).
    grown: Vec<Reservation>,
    done: bool,
}

impl Budgets {
    /// Budgets on the system clock, sharing `redis` (the rate limits' backend) for `redis:`.
    pub fn new(redis: Arc<SharedRedis>) -> Self {
        Self::with_clock(Arc::new(SystemClock), redis)
    }

    /// Budgets on `clock` (tests inject a [`ManualClock`]).
    pub fn with_clock(clock: Arc<dyn Clock>, redis: Arc<SharedRedis>) -> Self {
        Self {
            clock,
            tenants: Mutex::new(HashMap::new()),
            redis,
            to_warm: Mutex::new(Vec::new()),
        }
    }

    /// Notes the tenants of `config` that have a budget, for [`Self::warm`].
    pub fn warm_later(&self, config: &Config) {
        let list: Vec<_> = config
            .tenants
            .keys()
            .filter_map(|t| Self::budget_of(config, t).map(|b| (t.as_str().into(), b)))
            .collect();
        *self
            .to_warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = list;
    }

    /// Reads the ledger's figures of the tenants noted by [`Self::warm_later`] in the
    /// background and sets their `sluice_budget_remaining_usd` series, so that the status
    /// page and the metrics show budgets before the first request (a request arriving first
    /// waits for the same read). Needs a Tokio runtime (does nothing without one).
    pub fn warm(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let list = std::mem::take(
            &mut *self
                .to_warm
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (tenant, budget) in list {
            let me = self.clone();
            rt.spawn(async move {
                let state = me.tenant(&tenant);
                me.seed(&tenant, &state).await;
                let now = me.clock.now_ms();
                {
                    let mut ws = lock(&state);
                    for w in Window::ALL {
                        ws[w.index()].roll(w.period(now).id);
                    }
                }
                set_gauges(&tenant, &budget, &state);
            });
        }
    }

    /// Fills `state` from the ledger once (later calls wait for the first).
    async fn seed(&self, tenant: &str, state: &TenantBudget) {
        state
            .seeded
            .get_or_init(|| async {
                let seed = load_seed(tenant, self.clock.now_ms()).await;
                apply_seed(state, &seed);
            })
            .await;
    }

    fn tenant(&self, tenant: &str) -> Arc<TenantBudget> {
        let mut g = self
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Known tenants (every request after the first) cost no key allocation.
        if let Some(state) = g.get(tenant) {
            return state.clone();
        }
        g.entry(tenant.into())
            .or_insert_with(|| {
                Arc::new(TenantBudget {
                    seeded: tokio::sync::OnceCell::new(),
                    windows: Mutex::new([WindowState::default(); 3]),
                    gauges: Default::default(),
                })
            })
            .clone()
    }

    /// The budget of `tenant` in `config`, if it limits anything.
    pub fn budget_of(config: &Config, tenant: &str) -> Option<BudgetSection> {
        let b = config.tenants.get(tenant)?.limits.budget?;
        Window::ALL
            .iter()
            .any(|w| w.limit(&b).is_some())
            .then_some(b)
    }

    /// Reserves `amount_usd` for a request of `tenant` in every window its budget configures.
    /// `Ok(None)`: the tenant has no budget. The first call for a tenant reads its charges from
    /// the usage ledger (bounded; an unreadable ledger starts the tenant at 0 and logs it).
    ///
    /// # Errors
    /// [`Exceeded`] naming the first window without room.
    pub async fn reserve(
        self: &Arc<Self>,
        config: &Config,
        tenant: &str,
        amount_usd: f64,
    ) -> Result<Option<Reservation>, Exceeded> {
        self.reserve_inner(config, tenant, amount_usd, false).await
    }

    /// [`Budgets::reserve`] of as much of `amount_usd` as every window has room for (a hard
    /// budget's settlement takes what is left, [`Reservation::settle_hard`]).
    ///
    /// # Errors
    /// [`Exceeded`] naming the first window without any room.
    pub async fn reserve_up_to(
        self: &Arc<Self>,
        config: &Config,
        tenant: &str,
        amount_usd: f64,
    ) -> Result<Option<Reservation>, Exceeded> {
        self.reserve_inner(config, tenant, amount_usd, true).await
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the Redis and the local decision of one reservation, in order"
    )]
    async fn reserve_inner(
        self: &Arc<Self>,
        config: &Config,
        tenant: &str,
        amount_usd: f64,
        partial: bool,
    ) -> Result<Option<Reservation>, Exceeded> {
        let Some(budget) = Self::budget_of(config, tenant) else {
            return Ok(None);
        };
        let state = self.tenant(tenant);
        self.seed(tenant, &state).await;
        let mut amount = to_nano(amount_usd.max(0.0));
        let now = self.clock.now_ms();
        let periods = Window::ALL.map(|w| w.period(now));
        let roll = |ws: &mut [WindowState; 3]| {
            for w in Window::ALL {
                ws[w.index()].roll(periods[w.index()].id);
            }
        };
        let mut remote = None;
        let mut share = 1;
        if let Some(rs) = config.redis.as_ref() {
            share = rs.replicas.max(1);
            if self.redis.is_up() {
                let member = self.redis.next_member();
                let seeds = {
                    let mut ws = lock(&state);
                    roll(&mut ws);
                    ws.map(|s| s.spent)
                };
                let call = shared::Call {
                    tenant,
                    budget: &budget,
                    periods: &periods,
                    seeds: &seeds,
                    member: &member,
                    amount,
                    partial,
                };
                match shared::reserve(&self.redis, rs, &call).await {
                    Ok(answer) => {
                        let mut ws = lock(&state);
                        roll(&mut ws);
                        for w in configured(&budget) {
                            let s = &mut ws[w.index()];
                            s.synced = Some(answer.used[w.index()]);
                            s.since_sync = 0;
                        }
                        if let Some(w) = answer.refused {
                            drop(ws);
                            set_gauges(tenant, &budget, &state);
                            let used = answer.used[w.index()];
                            return Err(exceeded(w, &budget, used, amount, &periods));
                        }
                        amount = answer.granted;
                        for w in configured(&budget) {
                            ws[w.index()].reserved += amount;
                        }
                        remote = Some((self.redis.clone(), member));
                    }
                    Err(e) => {
                        self.redis.mark_down(&e);
                        if matches!(e, crate::redis::BackendError::Timeout(_)) && !partial {
                            // The script may still run late and hold `amount` as `member`
                            // for RESERVATION_TTL, refusing the tenant money it has: release
                            // it (sent after the reservation on the same connection, so Redis
                            // runs it second; a hold that was never made releases nothing).
                            // A partial reservation's hold is of an amount only Redis knew.
                            shared::settle(
                                self.redis.clone(),
                                tenant,
                                &budget,
                                &periods,
                                vec![(member.clone(), amount)],
                                0,
                            );
                        }
                    }
                }
            }
        }
        if remote.is_none() {
            let mut ws = lock(&state);
            roll(&mut ws);
            if partial {
                // As much as every window has room for (none: refused below).
                let room = configured(&budget)
                    .map(|w| ws[w.index()].room(to_nano(w.limit(&budget).unwrap_or(0.0)), share))
                    .min()
                    .unwrap_or(0);
                amount = amount.min(room.max(0));
            }
            for w in configured(&budget) {
                let limit = to_nano(w.limit(&budget).unwrap_or(0.0));
                let admitted = ws[w.index()].admits(limit, amount, share);
                let empty = partial && amount == 0 && ws[w.index()].room(limit, share) <= 0;
                if let Some(used) = admitted.err().or(empty.then(|| ws[w.index()].used())) {
                    drop(ws);
                    set_gauges(tenant, &budget, &state);
                    return Err(exceeded(w, &budget, used, amount, &periods));
                }
            }
            for w in configured(&budget) {
                let s = &mut ws[w.index()];
                s.reserved += amount;
                s.since_sync += amount;
            }
            if config.redis.is_some() {
                // Decided alone while Redis is away: the charge still goes to Redis at
                // settlement (a member Redis does not hold releases nothing there).
                remote = Some((self.redis.clone(), self.redis.next_member()));
            }
        }
        set_gauges(tenant, &budget, &state);
        Ok(Some(Reservation {
            budgets: self.clone(),
            tenant: tenant.into(),
            state,
            budget,
            amount,
            periods,
            remote,
            grown: Vec::new(),
            done: false,
        }))
    }

    /// What is left of `tenant`'s budget per configured window, USD (this process's view:
    /// charged and reserved here, plus the ledger's charges at start), for the status page.
    pub fn remaining(&self, config: &Config, tenant: &str) -> Vec<(Window, f64)> {
        let Some(budget) = Self::budget_of(config, tenant) else {
            return Vec::new();
        };
        let state = self.tenant(tenant);
        let now = self.clock.now_ms();
        let mut ws = lock(&state);
        configured(&budget)
            .map(|w| {
                let s = &mut ws[w.index()];
                s.roll(w.period(now).id);
                (w, remaining_usd(w, &budget, s))
            })
            .collect()
    }
}

fn lock(state: &TenantBudget) -> std::sync::MutexGuard<'_, [WindowState; 3]> {
    state
        .windows
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The windows `budget` limits.
fn configured(budget: &BudgetSection) -> impl Iterator<Item = Window> + '_ {
    Window::ALL
        .into_iter()
        .filter(|w| w.limit(budget).is_some())
}

fn remaining_usd(w: Window, budget: &BudgetSection, s: &WindowState) -> f64 {
    (w.limit(budget).unwrap_or(0.0) - to_usd(s.used())).max(0.0)
}

/// Updates `sluice_budget_remaining_usd{tenant,window}` for the configured windows: budget
/// minus charged minus reserved (this process's view), never below 0.
fn set_gauges(tenant: &str, budget: &BudgetSection, state: &TenantBudget) {
    let ws = lock(state);
    for w in configured(budget) {
        state.gauges[w.index()]
            .get_or_init(|| {
                metrics()
                    .budget_remaining_usd
                    .with_label_values(&[tenant, w.label()])
            })
            .set(remaining_usd(w, budget, &ws[w.index()]));
    }
}

fn exceeded(
    w: Window,
    budget: &BudgetSection,
    used: i64,
    amount: i64,
    periods: &[Period; 3],
) -> Exceeded {
    Exceeded {
        window: w,
        budget_usd: w.limit(budget).unwrap_or(0.0),
        used_usd: to_usd(used),
        requested_usd: to_usd(amount),
        resets_at_ms: (w != Window::Total).then(|| periods[w.index()].end_ms),
    }
}

/// Reads `tenant`'s charges from the running ledger (nothing when no ledger runs).
async fn load_seed(tenant: &str, now_ms: i64) -> Seed {
    let Some(settings) = crate::billing::ledger::running().cloned() else {
        return Seed {
            at_ms: now_ms,
            spent: [0; 3],
        };
    };
    let t = tenant.to_string();
    let read = tokio::task::spawn_blocking(move || {
        let mut spent = [0i64; 3];
        for w in Window::ALL {
            let p = w.period(now_ms);
            let filter = crate::billing::ledger::query::Filter {
                since: (w != Window::Total).then_some(p.start_ms),
                tenant: Some(t.clone()),
                ..Default::default()
            };
            let rows = crate::billing::ledger::query::summary(&settings, &filter)?;
            spent[w.index()] = rows.iter().map(|r| to_nano(r.charge_usd)).sum();
        }
        Ok::<_, crate::billing::ledger::LedgerError>(spent)
    });
    match tokio::time::timeout(SEED_TIMEOUT, read).await {
        Ok(Ok(Ok(spent))) => Seed {
            at_ms: now_ms,
            spent,
        },
        // A ledger that holds no file yet has charged nothing.
        Ok(Ok(Err(crate::billing::ledger::LedgerError::Missing(_)))) => Seed {
            at_ms: now_ms,
            spent: [0; 3],
        },
        other => {
            let why = match other {
                Ok(Ok(Err(e))) => e.to_string(),
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {} s", SEED_TIMEOUT.as_secs()),
            };
            log::error!(target: "sluice::budget", "budget of tenant `{tenant}`: the usage ledger could not be read ({why}); its \
                 earlier charges are not counted, only those from now on"
            );
            Seed {
                at_ms: now_ms,
                spent: [0; 3],
            }
        }
    }
}

/// Adds the ledger's charges to the tenant's windows (settlements made while the ledger was
/// read are kept).
fn apply_seed(state: &TenantBudget, seed: &Seed) {
    let mut ws = lock(state);
    for w in Window::ALL {
        let s = &mut ws[w.index()];
        s.roll(w.period(seed.at_ms).id);
        s.base += seed.spent[w.index()];
        s.spent += seed.spent[w.index()];
    }
}

impl Reservation {
    /// The amount held, USD: the reservation plus what [`Reservation::grow`] added.
    pub fn amount_usd(&self) -> f64 {
        to_usd(self.held())
    }

    /// Nano-USD held: the reservation plus its growths.
    fn held(&self) -> i64 {
        self.amount + self.grown.iter().map(|g| g.amount).sum::<i64>()
    }

    /// Whether the budget is a contract (`hard: true`): charges are capped at the hold.
    pub fn is_hard(&self) -> bool {
        self.budget.hard
    }

    /// Makes the hold at least `needed_usd`, reserving the difference in every configured
    /// window with the same atomic check as at admission (under the tenant's lock, or in one
    /// Redis script). A step larger than the shortfall (a quarter of the hold) is tried first,
    /// so that a stream growing past its reservation does not reserve per event; then the
    /// shortfall alone.
    ///
    /// # Errors
    /// [`Exceeded`] when the budget has no room for the shortfall.
    pub async fn grow(&mut self, config: &Config, needed_usd: f64) -> Result<(), Exceeded> {
        let short = to_nano(needed_usd) - self.held();
        if short <= 0 {
            return Ok(());
        }
        let step = short.max(self.held() / 4);
        let budgets = self.budgets.clone();
        let mut tried = Vec::with_capacity(2);
        tried.push(step);
        if step > short {
            tried.push(short);
        }
        let mut refused = None;
        for amount in tried {
            match budgets.reserve(config, &self.tenant, to_usd(amount)).await {
                Ok(Some(r)) => {
                    self.grown.push(r);
                    return Ok(());
                }
                // The budget was removed by a reload: nothing limits the request any more.
                Ok(None) => return Ok(()),
                Err(e) => refused = Some(e),
            }
        }
        Err(refused.expect("at least one amount was tried"))
    }

    /// Settles the request with its real charge (`charge_usd`, the metered charge; 0 when no
    /// provider answered): adds it to each window of the period the request started in (as
    /// the ledger dates it) and releases the reservation. Returns the charge made: `charge_usd`,
    /// or with `hard: true` at most the amount held (see [`Reservation::settle_hard`] to grow
    /// the hold first).
    pub fn settle(mut self, charge_usd: f64) -> f64 {
        let mut charge = to_nano(charge_usd.max(0.0));
        if self.budget.hard {
            charge = charge.min(self.held());
        }
        self.finish(charge);
        to_usd(charge)
    }

    /// [`Reservation::settle`], after growing the hold of a `hard` budget toward `charge_usd`
    /// by as much as the budget has left: its charge is capped at what the budget had left
    /// for the request (its hold, plus the room no other request holds).
    pub async fn settle_hard(mut self, config: &Config, charge_usd: f64) -> f64 {
        let short = to_nano(charge_usd) - self.held();
        if self.budget.hard && short > 0 {
            let budgets = self.budgets.clone();
            // Refused (no room at all): the charge stays capped at the hold.
            if let Ok(Some(r)) = budgets
                .reserve_up_to(config, &self.tenant, to_usd(short))
                .await
            {
                self.grown.push(r);
            }
        }
        self.settle(charge_usd)
    }

    /// Releases the hold and its growths and adds `charge`, here and in Redis. The growths
    /// are released in the same settlement script as the charge (one per period set), so
    /// another replica never sees their money free before the charge is counted.
    fn finish(&mut self, charge: i64) {
        if self.done {
            return;
        }
        let mut holds = Vec::new();
        let mut redis = None;
        for mut g in std::mem::take(&mut self.grown) {
            let Some((r, hold)) = g.finish_local(0) else {
                continue;
            };
            if g.periods == self.periods {
                holds.push(hold);
                redis = Some(r);
            } else {
                // Grown in a later day or month: its hold lives under that period's keys.
                shared::settle(r, &g.tenant, &g.budget, &g.periods, vec![hold], 0);
            }
        }
        if let Some((r, hold)) = self.finish_local(charge) {
            holds.push(hold);
            redis = Some(r);
        }
        if let Some(redis) = redis {
            shared::settle(
                redis,
                &self.tenant,
                &self.budget,
                &self.periods,
                holds,
                charge,
            );
        }
        set_gauges(&self.tenant, &self.budget, &self.state);
    }

    /// Releases this hold (not its growths) and adds `charge` in this process's figures;
    /// returns the backend and the `(member, nano-USD)` hold to release in Redis, if any.
    fn finish_local(&mut self, charge: i64) -> Option<(Arc<SharedRedis>, (String, i64))> {
        if self.done {
            return None;
        }
        self.done = true;
        {
            let mut ws = lock(&self.state);
            for w in Window::ALL {
                let s = &mut ws[w.index()];
                // A request that outlived its day or month is charged to the period it
                // started in (as the ledger dates it), which is over. Windows the budget does
                // not limit are kept too (a reload may add one).
                if s.period == self.periods[w.index()].id {
                    s.spent += charge;
                    if w.limit(&self.budget).is_some() {
                        s.reserved -= self.amount;
                        s.since_sync += charge - self.amount;
                    } else {
                        s.since_sync += charge;
                    }
                }
            }
        }
        self.remote
            .take()
            .map(|(redis, member)| (redis, (member, self.amount)))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.finish(0);
    }
}

#[cfg(test)]
mod tests;
