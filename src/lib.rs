//! Sluice: an LLM inference gateway on Cloudflare Pingora.
//!
//! One entry point in front of many model providers, in the client's own API (OpenAI Chat
//! Completions, OpenAI Responses, Anthropic Messages): it streams SSE event by event
//! (normalized, the answer's model id rewritten to the public id), routes a standard model id
//! to ordered upstream models on several providers and falls back before the first byte,
//! cancels upstream work when the client leaves, and applies backpressure.
//!
//! Architecture map (one module per concern):
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the command line contract (`-c`, `-t`, `-d`, `-u`; `key new`) |
//! | [`config`] | YAML schema, validation with file:line:key errors, the virtual key table of a snapshot |
//! | [`live`] | the live pair a request pins: the config snapshot and the provider registry built from it, swapped together |
//! | [`reload`] | hot reload: watch, load, validate, swap; resize admission and metric series |
//! | [`server`] | Pingora server assembly: proxy, admin, background services |
//! | [`pid_file`] | the foreground pid file and `sluice reload` (SIGHUP to the pid it names) |
//! | [`listeners`] | the listening sockets: bound at start (an address in use stops the start), handed to Pingora, held or not (`/readyz`) |
//! | [`tls`] | downstream TLS: certificate loading, the SNI resolver swapped on reload, listener settings |
//! | [`proxy`] | the one `ProxyHttp` impl (a thin shell), the per-request context, the access log |
//! | [`edge`] | the downstream connection loop, the head guard, the screening of each request (head limits, per-IP limits) |
//! | [`client_ip`] | the client's address behind trusted proxies (the edge, the access logs and passthrough forwarding read it) |
//! | [`ingress`] | endpoints, virtual key, body reading and dialect decode, count_tokens, every answer Sluice writes in the client's dialect |
//! | [`engine`] | the attempt loop, one attempt's upstream request and commit, hedging, model-level fallback, mid-stream continuation, upstream pools |
//! | [`stream`] | the stream pump and its per-stream pipe, the unary exchange |
//! | [`outcome`] | the record of how a request ended, read by billing, routing, admission and the access log |
//! | [`passthrough`] | routes to plain upstreams on Pingora's native path: the table hot reload swaps, load balancing and health checks, forwarding headers |
//! | [`routing`] | candidate lists (capabilities, policy, preference, strategy) and health |
//! | [`protocol`] | the wire APIs (Chat Completions, Messages, Responses) and the one canonical model every request, answer and stream event is translated through |
//! | [`providers`] | one [`providers::Adapter`] per provider kind, the registry of resolved providers (adapter and live credential), peers, upstream request heads and signers (bearer tokens refreshed in the background for Vertex AI), content decoding, the demo provider: the mock provider of tests and benches (the workspace crate `sluice_mock_upstream`, `crates/mock-upstream`) run in demo mode, in process |
//! | [`sse`] | the SSE hot path: normalizer (UTF-8 repair, truncation), model echo, usage |
//! | [`backpressure`] | admission: global cap + bounded queue, tenant limits, Redis-shared limits |
//! | [`auth`] | the virtual key a client presents, checked against the snapshot's table |
//! | [`billing`] | the billing wing: [`billing::metering`] (per-request token usage by class, estimates, prices: cost and charge), [`billing::budget`] (tenant budgets: reserve at admission, settle with the metered charge, shared through Redis), [`billing::ledger`] (the durable usage ledger: one record per request, SQLite or PostgreSQL, `sluice usage`, `/admin/usage`) |
//! | [`conversation`] | the Responses API's conversation state: stored responses on the ledger's database, `previous_response_id` / `item_reference` resolution, capture of what the client received |
//! | [`redis`] | the process's one Redis connection and its health, shared by distributed limits and budgets |
//! | [`error`] | client-facing errors and attempt records |
//! | [`metrics`], [`proxy::access_log`], [`logging`] | observability |
//! | [`admin`] | `/healthz`, `/readyz`, `/metrics`, `/admin/usage`; the status page (`/`) of [`status`]; the admin token and methods |
//! | [`status`] | the admin status page and `/status.json`: figures from the metrics registry, a fixed ring of samples |
//!
//! Phase → module: `new_ctx` → [`proxy::ctx`]; `request_filter` → [`edge::screen`], [`ingress::endpoints`] →
//! [`auth`], [`ingress::request`] (which calls [`protocol`]), [`backpressure`], [`routing`],
//! [`engine::attempt`] (which calls [`providers`], [`protocol`], [`stream`] and [`sse`]); `logging` →
//! [`billing::metering`], [`proxy::access_log`] → [`billing::ledger`]. Module dependencies point down this path: no import circle
//! goes through more than two files, and the bottom (config, the protocol layer, routing,
//! passthrough, billing, [`outcome`]) never imports the shell or the steps of the request path
//! above it; `tests/architecture.rs` reads the `use` paths of `src/` and holds both lines.

pub mod admin;
pub mod auth;
pub mod backpressure;
pub mod billing;
pub mod cli;
pub mod client_ip;
pub mod config;
pub mod conversation;
pub mod edge;
pub mod engine;
pub mod error;
pub mod fd_limit;
pub mod ingress;
pub mod listeners;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod outcome;
pub mod passthrough;
pub mod pid_file;
pub mod protocol;
pub mod providers;
pub mod proxy;
pub mod redis;
pub mod reload;
pub mod routing;
pub mod secret;
pub mod server;
pub mod shutdown;
pub mod sse;
pub mod status;
pub mod stream;
pub mod tls;
