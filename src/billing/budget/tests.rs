use super::*;
use crate::config::Config;

fn config(budget: &str) -> Config {
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:2\ntenants:\n  t:\n    budget: {budget}\n  free: {{}}\nvirtual_keys:\n  - key: sk-test-0001\n    tenant: t\nproviders:\n  p:\n    kind: demo\nmodels:\n  m/a:\n    input_usd_per_mtok: 1.0\n    output_usd_per_mtok: 4.0\n    cache_write_usd_per_mtok: 1.25\n    default_max_tokens: 1000\n    routes:\n      - provider: p\n        upstream_model: a\n"
    );
    Config::parse(std::path::Path::new("sluice.yaml"), &yaml).unwrap()
}

fn budgets(clock: Arc<ManualClock>) -> Arc<Budgets> {
    Arc::new(Budgets::with_clock(
        clock,
        Arc::new(crate::redis::SharedRedis::new(None)),
    ))
}

fn ms(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

#[test]
fn the_reservation_is_the_worst_charge_with_a_margin() {
    let c = config("{daily_usd: 1}");
    let m = &c.models["m/a"];
    // 1000 input at max(1.0, 1.25) + 500 output at 4.0 = 1250 + 2000 µUSD, × 1.2.
    let r = reservation_usd(m, 1000, Some(500));
    assert!((r - 0.0039).abs() < 1e-12, "{r}");
    // No max_tokens: the model's default_max_tokens (1000).
    let r = reservation_usd(m, 0, None);
    assert!((r - 0.0048).abs() < 1e-12, "{r}");
}

#[tokio::test]
async fn reserve_settle_release_and_refuse_with_the_window_named() {
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T10:00:00Z")));
    let b = budgets(clock.clone());
    let c = config("{total_usd: 10, daily_usd: 1}");
    // A tenant without a budget reserves nothing.
    assert!(b.reserve(&c, "free", 5.0).await.unwrap().is_none());
    let r1 = b.reserve(&c, "t", 0.6).await.unwrap().unwrap();
    // 0.6 is reserved: 0.5 more does not fit the daily budget.
    let e = b.reserve(&c, "t", 0.5).await.unwrap_err();
    assert_eq!(e.window, Window::Daily);
    assert_eq!(e.budget_usd, 1.0);
    assert!((e.used_usd - 0.6).abs() < 1e-9);
    assert_eq!(e.resets_at_ms, Some(ms("2026-12-03T00:00:00Z")));
    let err = e.error("t");
    assert_eq!(err.status(), 402);
    assert_eq!(err.openai_type(), "insufficient_quota");
    assert_eq!(err.code(), Some("budget_exceeded"));
    assert!(err.to_string().contains("daily budget"), "{err}");
    // The request cost 0.2: the rest is released.
    r1.settle(0.2);
    let left = b.remaining(&c, "t");
    assert_eq!(left.len(), 2);
    assert!((left[0].1 - 9.8).abs() < 1e-9, "{left:?}");
    assert!((left[1].1 - 0.8).abs() < 1e-9, "{left:?}");
    let r2 = b.reserve(&c, "t", 0.5).await.unwrap().unwrap();
    // Dropped unsettled (never reached a provider): released, nothing charged.
    drop(r2);
    assert!((b.remaining(&c, "t")[1].1 - 0.8).abs() < 1e-9);
    // A reservation of exactly what is left fits; a nano-dollar more does not.
    let r3 = b.reserve(&c, "t", 0.8).await.unwrap().unwrap();
    r3.settle(0.8);
    assert_eq!(b.remaining(&c, "t")[1].1, 0.0);
    assert!(b.reserve(&c, "t", 1e-9).await.is_err());
    // A free request (nothing to reserve) still passes.
    b.reserve(&c, "t", 0.0).await.unwrap().unwrap().settle(0.0);
}

#[tokio::test]
async fn windows_roll_over_at_utc_midnight_and_month_start() {
    let clock = Arc::new(ManualClock::at(ms("2026-12-31T23:59:00Z")));
    let b = budgets(clock.clone());
    let c = config("{total_usd: 4, monthly_usd: 2, daily_usd: 1}");
    b.reserve(&c, "t", 1.0).await.unwrap().unwrap().settle(1.0);
    let e = b.reserve(&c, "t", 0.1).await.unwrap_err();
    assert_eq!(e.window, Window::Daily);
    // A new day and a new month: both start empty; the total remembers.
    clock.set(ms("2027-01-01T00:00:00Z"));
    b.reserve(&c, "t", 1.0).await.unwrap().unwrap().settle(1.0);
    assert_eq!(
        b.reserve(&c, "t", 0.1).await.unwrap_err().window,
        Window::Daily
    );
    clock.set(ms("2027-01-02T08:00:00Z"));
    b.reserve(&c, "t", 0.5).await.unwrap().unwrap().settle(0.5);
    // Monthly: 1.5 of 2 spent; the daily 1 would fit, the monthly 0.5 does not hold 0.6.
    assert_eq!(
        b.reserve(&c, "t", 0.6).await.unwrap_err().window,
        Window::Monthly
    );
    b.reserve(&c, "t", 0.5).await.unwrap().unwrap().settle(0.5);
    // Next month: the total (3 spent of 4) refuses what does not fit it.
    clock.set(ms("2027-02-01T00:00:01Z"));
    assert_eq!(
        b.reserve(&c, "t", 1.01).await.unwrap_err().window,
        Window::Total
    );
    let left = b.remaining(&c, "t");
    assert_eq!(
        left.iter()
            .map(|(w, v)| (w.label(), *v))
            .collect::<Vec<_>>(),
        [("total", 1.0), ("monthly", 2.0), ("daily", 1.0)]
    );
}

#[tokio::test]
async fn a_request_that_outlives_its_day_is_charged_to_that_day() {
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T23:59:59Z")));
    let b = budgets(clock.clone());
    let c = config("{total_usd: 10, daily_usd: 1}");
    let r = b.reserve(&c, "t", 0.9).await.unwrap().unwrap();
    clock.set(ms("2026-12-03T00:00:05Z"));
    r.settle(0.7);
    let left = b.remaining(&c, "t");
    assert!((left[0].1 - 9.3).abs() < 1e-9, "{left:?}");
    assert_eq!(left[1].1, 1.0, "the new day is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_racers_never_overspend() {
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T12:00:00Z")));
    let b = budgets(clock);
    let c = Arc::new(config("{daily_usd: 1}"));
    // 400 racers each reserving 0.01 and spending between 0.005 and 0.01: the budget of 1
    // holds 100 reservations at once; the total charged never exceeds it.
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let (b, c) = (b.clone(), c.clone());
        tasks.push(tokio::spawn(async move {
            let r = b.reserve(&c, "t", 0.01).await.ok()??;
            tokio::task::yield_now().await;
            let charge = 0.005 + f64::from(i % 6) * 0.001;
            r.settle(charge);
            Some(charge)
        }));
    }
    let mut charged = 0.0;
    let mut admitted = 0;
    for t in tasks {
        if let Some(ch) = t.await.unwrap() {
            charged += ch;
            admitted += 1;
        }
    }
    assert!(charged <= 1.0 + 1e-9, "charged {charged}");
    assert!(admitted >= 100, "admitted {admitted}");
    let left = b.remaining(&c, "t")[0].1;
    assert!((left - (1.0 - charged)).abs() < 1e-6, "{left} vs {charged}");
}

#[test]
fn failing_open_allows_a_replica_its_share_of_what_was_left() {
    // Redis last said 0.6 of 1.0 used; 2 replicas: this one may add 0.2.
    let s = WindowState {
        period: 0,
        synced: Some(to_nano(0.6)),
        ..Default::default()
    };
    let limit = to_nano(1.0);
    assert!(s.admits(limit, to_nano(0.2), 2).is_ok());
    assert!(s.admits(limit, to_nano(0.2) + 1, 2).is_err());
    // Alone (1 replica) the whole rest.
    assert!(s.admits(limit, to_nano(0.4), 1).is_ok());
    // Before Redis ever answered: a share of what the ledger left.
    let s = WindowState {
        base: to_nano(0.5),
        spent: to_nano(0.5),
        ..Default::default()
    };
    assert!(s.admits(limit, to_nano(0.25), 2).is_ok());
    assert!(s.admits(limit, to_nano(0.26), 2).is_err());
}

#[tokio::test]
async fn a_hold_grows_while_the_budget_has_room_and_a_hard_budget_caps_the_charge_at_it() {
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T12:00:00Z")));
    let b = budgets(clock);
    let soft = config("{daily_usd: 1}");
    let mut r = b.reserve(&soft, "t", 0.1).await.unwrap().unwrap();
    // A running charge of 0.3: the hold grows (a step of a quarter of the hold at least).
    r.grow(&soft, 0.3).await.unwrap();
    assert!(r.amount_usd() >= 0.3 - 1e-9, "{}", r.amount_usd());
    // Another request takes what is left but 0.1.
    let left = b.remaining(&soft, "t")[0].1;
    let other = b.reserve(&soft, "t", left - 0.1).await.unwrap().unwrap();
    // The first may grow by the 0.1 left (the larger step is refused, the shortfall fits)...
    let held = r.amount_usd();
    r.grow(&soft, held + 0.1).await.unwrap();
    // ...and no further: the window is full.
    let e = r.grow(&soft, held + 0.2).await.unwrap_err();
    assert_eq!(e.window, Window::Daily);
    // Soft: charged what the provider reported, past the budget.
    assert!((r.settle(5.0) - 5.0).abs() < 1e-9);
    drop(other);
    assert_eq!(b.remaining(&soft, "t")[0].1, 0.0);

    // Hard: two requests reserve 0.1 each; a provider reporting 100 USD for each is charged
    // what the budget held, and the sum never passes it.
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T12:00:00Z")));
    let b = budgets(clock);
    let hard = config("{daily_usd: 0.5, hard: true}");
    let r1 = b.reserve(&hard, "t", 0.1).await.unwrap().unwrap();
    let r2 = b.reserve(&hard, "t", 0.1).await.unwrap().unwrap();
    assert!(r1.is_hard());
    // The first finds 0.3 of room to grow into and takes it (0.4 in all); the second has
    // only its own 0.1.
    let c1 = r1.settle_hard(&hard, 100.0).await;
    let c2 = r2.settle_hard(&hard, 100.0).await;
    assert!((c1 - 0.4).abs() < 1e-9, "{c1}");
    assert!((c2 - 0.1).abs() < 1e-9, "{c2}");
    assert!(c1 + c2 <= 0.5 + 1e-9);
    assert_eq!(b.remaining(&hard, "t")[0].1, 0.0);
    // A charge within the hold is charged as is.
    let clock = Arc::new(ManualClock::at(ms("2026-12-02T12:00:00Z")));
    let b = budgets(clock);
    let r = b.reserve(&hard, "t", 0.2).await.unwrap().unwrap();
    assert!((r.settle_hard(&hard, 0.15).await - 0.15).abs() < 1e-9);
}
