//! Owns the budget windows: `total` (the tenant's whole history), `monthly` and `daily` (UTC
//! calendar periods), their period ids, starts and ends, and the clock they are read from
//! ([`Clock`]; tests inject a [`ManualClock`] to roll windows over).

use std::sync::atomic::{AtomicI64, Ordering};

use jiff::tz::Offset;
use jiff::Timestamp;

use crate::config::schema::BudgetSection;

/// Milliseconds in a UTC day (UTC has no daylight saving; leap seconds are not counted by unix
/// time).
const DAY_MS: i64 = 86_400_000;

/// Where budgets read the time from: unix milliseconds, UTC.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, unix ms.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        Timestamp::now().as_millisecond()
    }
}

/// A clock set by hand (tests: windows rolling over without waiting for midnight).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock reading `ms` (unix ms).
    pub fn at(ms: i64) -> Self {
        Self(AtomicI64::new(ms))
    }

    /// Sets the time, unix ms.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::Release);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }
}

/// One budget window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// `total_usd`: everything the tenant was ever charged.
    Total,
    /// `monthly_usd`: the current UTC calendar month.
    Monthly,
    /// `daily_usd`: the current UTC calendar day.
    Daily,
}

impl Window {
    /// Every window, in the order of their state arrays.
    pub const ALL: [Window; 3] = [Window::Total, Window::Monthly, Window::Daily];

    /// Index into per-window arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `sluice_budget_remaining_usd{window}` label and the name in error messages.
    pub fn label(self) -> &'static str {
        match self {
            Window::Total => "total",
            Window::Monthly => "monthly",
            Window::Daily => "daily",
        }
    }

    /// The configured limit of this window, USD (`None`: unlimited).
    pub fn limit(self, b: &BudgetSection) -> Option<f64> {
        match self {
            Window::Total => b.total_usd,
            Window::Monthly => b.monthly_usd,
            Window::Daily => b.daily_usd,
        }
    }

    /// The period containing `now_ms`: its id (0 for `total`; `year × 12 + month` for
    /// `monthly`; days since 1970-01-01 for `daily`), start and end (unix ms; `total` spans
    /// all time).
    pub fn period(self, now_ms: i64) -> Period {
        match self {
            Window::Total => Period {
                id: 0,
                start_ms: i64::MIN,
                end_ms: i64::MAX,
            },
            Window::Daily => {
                let day = now_ms.div_euclid(DAY_MS);
                Period {
                    id: day,
                    start_ms: day * DAY_MS,
                    end_ms: (day + 1) * DAY_MS,
                }
            }
            Window::Monthly => month_of(now_ms),
        }
    }
}

/// One calendar period of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// Identifies the period within its window (see [`Window::period`]).
    pub id: i64,
    /// First instant, unix ms (inclusive).
    pub start_ms: i64,
    /// First instant of the next period, unix ms (exclusive).
    pub end_ms: i64,
}

impl Period {
    /// The period's name in Redis keys: `total`, `m2026-12`, `d2026-12-02`.
    pub fn key_suffix(&self, window: Window) -> String {
        match window {
            Window::Total => "total".into(),
            Window::Monthly => format!(
                "m{:04}-{:02}",
                self.id.div_euclid(12),
                self.id.rem_euclid(12) + 1
            ),
            Window::Daily => {
                let d = civil(self.start_ms);
                format!("d{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
            }
        }
    }
}

/// The UTC civil date of `ms`.
fn civil(ms: i64) -> jiff::civil::Date {
    Offset::UTC
        .to_datetime(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH))
        .date()
}

/// Unix ms of a UTC civil date's midnight.
fn midnight_ms(d: jiff::civil::Date) -> i64 {
    Offset::UTC
        .to_timestamp(d.to_datetime(jiff::civil::Time::midnight()))
        .map_or(i64::MAX, |t| t.as_millisecond())
}

/// The UTC calendar month containing `ms`.
fn month_of(ms: i64) -> Period {
    let d = civil(ms);
    let first = d.first_of_month();
    let next = first
        .checked_add(jiff::Span::new().months(1))
        .unwrap_or(first);
    Period {
        id: i64::from(d.year()) * 12 + i64::from(d.month()) - 1,
        start_ms: midnight_ms(first),
        end_ms: midnight_ms(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn periods_are_utc_calendar_days_and_months() {
        let now = ms("2026-12-31T23:59:59.999Z");
        let d = Window::Daily.period(now);
        assert_eq!(d.start_ms, ms("2026-12-31T00:00:00Z"));
        assert_eq!(d.end_ms, ms("2027-01-01T00:00:00Z"));
        assert_eq!(d.key_suffix(Window::Daily), "d2026-12-31");
        let m = Window::Monthly.period(now);
        assert_eq!(m.start_ms, ms("2026-12-01T00:00:00Z"));
        assert_eq!(m.end_ms, ms("2027-01-01T00:00:00Z"));
        assert_eq!(m.key_suffix(Window::Monthly), "m2026-12");
        // One millisecond later both roll over.
        let next = now + 1;
        assert_ne!(Window::Daily.period(next).id, d.id);
        assert_ne!(Window::Monthly.period(next).id, m.id);
        assert_eq!(
            Window::Monthly.period(next).key_suffix(Window::Monthly),
            "m2027-01"
        );
        // February of a leap year.
        let f = Window::Monthly.period(ms("2028-02-15T12:00:00Z"));
        assert_eq!(f.end_ms - f.start_ms, 29 * DAY_MS);
        assert_eq!(Window::Total.period(now), Window::Total.period(0));
        // Before 1970 too (div_euclid).
        assert_eq!(Window::Daily.period(-1).start_ms, -DAY_MS);
    }
}
