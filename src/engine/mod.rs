//! Owns the attempt loop: candidate routes in order ([`attempt`]), one attempt's upstream
//! request and commit ([`open`]), hedging, model-level fallback, mid-stream continuation,
//! the upstream connection pools ([`pool`]) and how an attempt ends (`upstream`).

pub mod attempt;
pub(crate) mod continuation;
pub mod fallback;
pub mod hedge;
pub mod open;
pub mod pool;
pub(crate) mod state;
pub(crate) mod upstream;
