//! Owns what a request costs and what is kept of it: token usage priced into cost and charge
//! ([`metering`]), tenant budgets reserved at admission and settled with the charge
//! ([`budget`]), and the durable usage ledger ([`ledger`]). The wing reads the request's
//! [`Outcome`](crate::outcome::Outcome), the config and the shared Redis client; nothing in
//! it knows the proxy's per-request context, and the proxy shell is its only caller on the
//! request path.

pub mod budget;
pub mod ledger;
pub mod metering;
