//! Sluice's end-to-end tests: one test binary (link time matters on 2 cores) that starts the
//! real `sluice` and `sluice-mock-upstream` binaries on loopback ports and talks to them over
//! real sockets. Each module covers one concern.

mod anthropic;
mod api;
mod backpressure;
mod budget;
mod cancellation;
mod cli_key;
mod client_compat;
mod config_check;
mod count_tokens;
mod demo;
mod dialect_matrix;
mod dialects;
mod fallback;
mod grafana_dashboard;
mod harness;
mod harness_client;
mod health;
mod heartbeat;
mod hostile;
mod hostile_edge;
mod ledger;
mod metering;
mod model_fallback;
mod passthrough;
mod ping_commit;
mod readme;
mod redis_limits;
mod reload;
mod retry;
mod routing;
mod sdk;
mod sdk_dialects;
mod shutdown;
mod slow_reader;
mod smoke;
mod status_page;
mod stream_integrity;
mod streaming;
mod systemd;
mod timeouts;
mod tls;
mod upgrade;
