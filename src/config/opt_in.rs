//! Owns the YAML shapes and validated forms of two per-model opt-ins of the resilience
//! issue: hedged requests (`models.<id>.hedge_after_ms`) and prompt-cache affinity
//! (`models.<id>.affinity`). Both are off unless set. What they do at request time lives in
//! [`crate::engine::hedge`] and [`crate::routing::affinity`].

use std::time::Duration;

use serde::Deserialize;

/// `models.<id>.hedge_after_ms` as written: a number of milliseconds, or `auto`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(untagged)]
pub enum HedgeAfterSection {
    /// A fixed delay, ms (at least 1).
    Ms(u64),
    /// The word `auto`.
    Word(HedgeWord),
}

/// The only word `hedge_after_ms` takes.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HedgeWord {
    /// The route's observed TTFT p95.
    Auto,
}

/// When a request's next candidate is started beside the first one (a hedge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeAfter {
    /// After this long without the first event.
    Fixed(Duration),
    /// After the first route's observed time-to-first-event p95
    /// ([`crate::routing::ttft::TtftSamples::p95`]); no hedge while the route has fewer
    /// than [`crate::routing::ttft::TTFT_P95_MIN_SAMPLES`] samples.
    Auto,
}

impl HedgeAfter {
    /// The validated form of `s`.
    ///
    /// # Errors
    /// A message for `0` ms (a hedge at once is two requests for every one: set the model's
    /// routes instead).
    pub fn from_section(s: HedgeAfterSection) -> Result<Self, String> {
        match s {
            HedgeAfterSection::Ms(0) => {
                Err("must be at least 1 (ms), or `auto`; leave it out to turn hedging off".into())
            }
            HedgeAfterSection::Ms(ms) => Ok(Self::Fixed(Duration::from_millis(ms))),
            HedgeAfterSection::Word(HedgeWord::Auto) => Ok(Self::Auto),
        }
    }
}

/// `models.<id>.affinity`: how requests are kept on the route that served them before.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    /// No affinity (default): every request is ordered by the model's strategy alone.
    #[default]
    Off,
    /// Requests of one conversation stick to the route that last served it while that
    /// route is healthy and not resting (see [`crate::routing::affinity`]).
    Conversation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hedge_after_takes_a_positive_number_or_auto() {
        let p = |s: &str| serde_yaml::from_str::<HedgeAfterSection>(s);
        assert_eq!(
            HedgeAfter::from_section(p("250").unwrap()),
            Ok(HedgeAfter::Fixed(Duration::from_millis(250)))
        );
        assert_eq!(
            HedgeAfter::from_section(p("auto").unwrap()),
            Ok(HedgeAfter::Auto)
        );
        assert!(HedgeAfter::from_section(p("0").unwrap()).is_err());
        assert!(p("soon").is_err());
        assert!(p("-5").is_err());
        assert_eq!(
            serde_yaml::from_str::<Affinity>("conversation").unwrap(),
            Affinity::Conversation
        );
        assert!(serde_yaml::from_str::<Affinity>("sticky").is_err());
    }
}
