//! Owns the configuration: loading YAML (with `include:`), validating it into the immutable
//! [`Config`] snapshot every request pins (with the provider registry built from it, see
//! `crate::live`). The snapshot is data only: nothing here depends on the modules above it.
//!
//! Errors come back as [`ConfigError`] naming file, line, column and key path.

pub mod aws;
pub mod edge;
pub mod error;
pub mod keys;
pub mod kinds;
pub mod ledger;
mod model_fallback;
pub mod opt_in;
pub mod passthrough;
pub mod response_store;
pub mod retry;
pub mod schema;
pub mod tls;
mod validate;
pub mod vertex;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use error::ConfigError;
pub use retry::RetryPolicy;
pub use schema::{Capability, LogFormat, ProviderKind, RouteApi, Strategy};
pub(crate) use validate::expand_include;

use crate::secret::Secret;
use keys::KeyTable;

/// How many times a request body byte counts against `server.max_buffered_request_bytes`: the
/// raw bytes and the parsed request (while parsing), or the parsed request and the serialized
/// upstream body (per attempt). Validation requires room for one body of the allowed size;
/// the request buffers (`backpressure::buffers`) count with it.
pub const COPIES_PER_BODY_BYTE: usize = 2;

/// A validated, immutable configuration snapshot. One is pinned per request.
#[derive(Debug)]
pub struct Config {
    /// The file this snapshot was loaded from.
    pub source_path: PathBuf,
    /// Listener, timeout and admission settings.
    pub server: ServerSettings,
    /// Tenants by id.
    pub tenants: BTreeMap<String, Arc<Tenant>>,
    /// Virtual key lookup table (hashed keys).
    pub keys: KeyTable,
    /// Providers by id.
    pub providers: BTreeMap<String, Arc<Provider>>,
    /// Standard models by public id.
    pub models: BTreeMap<String, Arc<Model>>,
    /// Distributed limit settings, if any.
    pub redis: Option<schema::RedisSection>,
    /// The usage ledger (`ledger:`; restart to change).
    pub ledger: ledger::LedgerSettings,
    /// The Responses API's response store (`response_store:`; restart to change).
    pub response_store: response_store::ResponseStoreSettings,
    /// Passthrough routes in file order (`passthrough:`; [`crate::passthrough`] serves them).
    pub passthrough: Vec<passthrough::PassthroughRoute>,
}

/// `server:` after validation: durations converted once.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Downstream listener address (`host:port`): HTTP/1 and h2c with prior knowledge.
    pub listen: String,
    /// Downstream TLS listener address (`host:port`), if any.
    pub tls_listen: Option<String>,
    /// Its certificates, loaded and checked (present iff `tls_listen` is).
    pub tls: Option<Arc<crate::tls::certs::CertSet>>,
    /// Admin listener address (`host:port`).
    pub admin_listen: String,
    /// Pingora worker threads.
    pub threads: usize,
    /// Whether the worker threads steal each other's tasks (`server.work_stealing`).
    pub work_stealing: bool,
    /// Log format.
    pub log_format: LogFormat,
    /// Request body limit, bytes.
    pub max_request_body_bytes: usize,
    /// Non-streaming upstream body limit, bytes.
    pub max_response_body_bytes: usize,
    /// Defaults for per-provider hop timeouts.
    pub default_timeouts: HopTimeouts,
    /// Downstream write timeout.
    pub downstream_write_timeout: Duration,
    /// Per-stream buffer bound (backpressure: how far ahead of the client Sluice reads), bytes.
    pub max_buffered_bytes_per_stream: usize,
    /// Largest single upstream SSE event, bytes.
    pub max_event_bytes: usize,
    /// Shutdown grace period.
    pub shutdown_grace: Duration,
    /// Optional cap on one stream's total duration.
    pub max_stream_duration: Option<Duration>,
    /// Global concurrent upstream request cap.
    pub max_concurrent_upstream_requests: usize,
    /// Admission queue bound (requests).
    pub queue_size: usize,
    /// Admission queue wait limit.
    pub queue_timeout: Duration,
    /// The sliding window of `requests_per_minute` / `tokens_per_minute` (a minute unless
    /// `server.rate_limit_window_ms` shortens it).
    pub rate_limit_window: Duration,
    /// The admin token (from the variable `server.admin_token_env` names); `None`: the admin
    /// listener serves no usage data.
    pub admin_token: Option<Secret>,
    /// Whether to add `x-sluice-provider` / `x-sluice-fallback-depth`.
    pub emit_route_headers: bool,
    /// Whether file changes reload the config (`SIGHUP` always does).
    pub watch_config: bool,
    /// Pingora pid file.
    pub pid_file: String,
    /// Pingora upgrade socket.
    pub upgrade_sock: String,
    /// Daemon log file.
    pub error_log: Option<String>,
    /// Global bound on held request body bytes (`server.max_buffered_request_bytes`).
    pub max_buffered_request_bytes: usize,
    /// Most label sets per tenant-labelled metric family
    /// (`server.metrics_max_series_per_family`, see [`crate::metrics::series`]).
    pub metrics_max_series_per_family: usize,
    /// Deadline for a whole request head (`server.header_read_timeout_ms`).
    pub header_read_timeout: Duration,
    /// Deadline for a whole request body (`server.body_read_timeout_ms`).
    pub body_read_timeout: Duration,
    /// `server.retry`.
    pub retry: RetryPolicy,
    /// Head limits, per-IP limits, trusted proxies.
    pub edge: edge::EdgeSettings,
    /// `server.resume_grace_ms`: how long a resumable stream's generation runs on while
    /// no client is attached.
    pub resume_grace: Duration,
    /// `server.resume_buffer_bytes`: the replay buffer bound of one resumable stream, bytes.
    pub resume_buffer_bytes: usize,
    /// `server.resume_linger_bytes`: the tail of a completed resumable stream kept
    /// replayable for `resume_grace`, bytes (0: none).
    pub resume_linger_bytes: usize,
    /// `server.replica_id`, else a random 8-hex tag drawn when the config is loaded first
    /// (the same for the whole process, reloads included).
    pub replica_id: String,
    /// Whether the Responses API's WebSocket mode is served (`server.responses_websocket`).
    pub responses_websocket: bool,
    /// `server.responses_websocket_max_sessions`: most WebSocket sessions open at once.
    pub responses_websocket_max_sessions: usize,
}

/// Per-hop timeouts of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopTimeouts {
    /// TCP + TLS connect.
    pub connect: Duration,
    /// Request sent → upstream response head, of a streaming request.
    pub first_byte: Duration,
    /// Request sent → upstream response head, of a non-streaming request (its head comes
    /// when the whole answer is generated).
    pub first_byte_non_stream: Duration,
    /// Upstream response head → first SSE data event (TTFT budget).
    pub first_event: Duration,
    /// Longest silence of a flowing stream.
    pub idle: Duration,
    /// Heartbeat interval while a committed stream is silent.
    pub heartbeat: Duration,
}

impl HopTimeouts {
    /// The head timeout of a request: [`Self::first_byte`] for a stream, else
    /// [`Self::first_byte_non_stream`].
    pub fn head(&self, stream: bool) -> Duration {
        if stream {
            self.first_byte
        } else {
            self.first_byte_non_stream
        }
    }

    /// Every hop with the same limit `d`.
    pub fn uniform(d: Duration) -> Self {
        Self {
            connect: d,
            first_byte: d,
            first_byte_non_stream: d,
            first_event: d,
            idle: d,
            heartbeat: d,
        }
    }
}

/// A tenant: who owns limits and the bill.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Tenant id.
    pub id: String,
    /// Limits and policy as written.
    pub limits: schema::TenantSection,
}

/// Where a provider lives on the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https` (true) or `http`.
    pub tls: bool,
    /// Host name or IP literal (also the TLS SNI and `Host` header).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path prefix from `base_url` without a trailing slash, e.g. `/v1`.
    pub base_path: String,
    /// The host as an IP literal, when it is one (no DNS needed).
    pub ip: Option<IpAddr>,
}

impl Endpoint {
    /// The `Host` header value (`host` or `host:port` for non-default ports).
    pub fn host_header(&self) -> String {
        let default_port = if self.tls { 443 } else { 80 };
        if self.port == default_port {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Passive health thresholds.
#[derive(Debug, Clone, Copy)]
pub struct PassiveHealth {
    /// Consecutive failures → degraded.
    pub degraded_after_failures: u32,
    /// Consecutive failures → unhealthy.
    pub unhealthy_after_failures: u32,
    /// Rest before a half-open trial.
    pub cooldown: Duration,
    /// Error-rate trigger for unhealthy, if enabled.
    pub error_rate: Option<ErrorRate>,
    /// `decay_after_ms`: with no failure for this long a route is one state healthier
    /// (unhealthy → degraded, degraded → healthy), counted from its last failure; `None`:
    /// no decay (`decay_after_ms: 0`).
    pub decay_after: Option<Duration>,
}

impl Default for PassiveHealth {
    /// Degraded after 1 failure, unhealthy after 3, 10 s cool-down, no error-rate trigger,
    /// decay after 60 s (the defaults of `providers.<id>.health`).
    fn default() -> Self {
        Self {
            degraded_after_failures: 1,
            unhealthy_after_failures: 3,
            cooldown: Duration::from_secs(10),
            error_rate: None,
            decay_after: Some(Duration::from_secs(60)),
        }
    }
}

/// Error-rate trigger of passive health: a route whose failures make up at least `percent`
/// of its outcomes in the sliding `window` (once there are `min_requests`) turns unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRate {
    /// Threshold, percent (1-100).
    pub percent: u32,
    /// Sliding window.
    pub window: Duration,
    /// Fewest outcomes in the window before the rate counts.
    pub min_requests: u32,
}

/// What an active probe sends (`providers.<id>.health_check.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeMode {
    /// `GET {base_url}{path}` (a listing such as `/models`), once per provider: proves the
    /// provider is reachable and takes its key, not that a route's model answers. Its
    /// success lifts only provider-level failures (see [`crate::routing::health`]).
    #[default]
    List,
    /// A minimal real request per route (one output token, in the provider's own dialect,
    /// encoded by [`crate::protocol`]): proves the route works. Never metered or charged.
    Request,
}

impl ProbeMode {
    /// The `mode` label of `sluice_health_probes_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Request => "request",
        }
    }
}

/// Active probe settings.
#[derive(Debug, Clone)]
pub struct ActiveHealthCheck {
    /// What the probe sends.
    pub mode: ProbeMode,
    /// Path appended to the base path (`mode: list` only).
    pub path: String,
    /// Probe interval.
    pub interval: Duration,
    /// Probe timeout.
    pub timeout: Duration,
}

/// `models.<id>.unsupported`: what a translated request does with a member or value that
/// its target cannot carry (an unknown member, a hosted tool, a content block without a
/// counterpart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unsupported {
    /// Left out, with a record: the `x-sluice-dropped` response header names it, the
    /// `sluice_dropped_fields_total` metric counts it, an info log line says it.
    #[default]
    Drop,
    /// Refused with a 400 in the client's dialect naming it.
    Refuse,
}

/// A configured provider.
#[derive(Debug)]
pub struct Provider {
    /// Provider id (the key under `providers:`).
    pub id: String,
    /// Wire format.
    pub kind: ProviderKind,
    /// Network location; `None` for the built-in demo provider, which is found at run time.
    pub endpoint: Option<Endpoint>,
    /// The provider key, if any.
    pub api_key: Option<Secret>,
    /// Trust anchors of its TLS certificate (`ca_file`); `None`: the system store.
    pub ca: Option<crate::tls::certs::UpstreamCa>,
    /// Receive window of one HTTP/2 stream to it, bytes (`server.max_buffered_bytes_per_stream`).
    pub h2_stream_window: usize,
    /// Hop timeouts.
    pub timeouts: HopTimeouts,
    /// Active probe, if enabled.
    pub health_check: Option<ActiveHealthCheck>,
    /// Passive thresholds.
    pub passive_health: PassiveHealth,
    /// `providers.<id>.stream_usage`: ask for the final usage of a Chat Completions stream
    /// (`stream_options.include_usage`).
    pub stream_usage: bool,
    /// `providers.<id>.max_concurrent_requests`: most requests in flight to it at once
    /// (`None`: no cap of its own); see [`crate::backpressure::provider`].
    pub max_concurrent_requests: Option<usize>,
    /// `providers.<id>.api_version`: Azure OpenAI's `api-version` query parameter (set for
    /// `azure_openai`, `None` for every other kind).
    pub api_version: Option<String>,
    /// `bedrock`: the region and the AWS credentials read at load (the registry's SigV4
    /// signer is built from them); `None` for every other kind.
    pub aws: Option<aws::AwsAccount>,
    /// `providers.<id>.project` and `.region` of a Vertex AI provider (`None` for every
    /// other kind).
    pub vertex: Option<vertex::VertexAccount>,
    /// Where the provider's credential is exchanged for a bearer token at run time (Vertex
    /// AI's service-account key and token URL); the registry's token cache, shared by its
    /// requests and refreshed in the background, uses it. `None`: a static key or none.
    pub token_source: Option<vertex::TokenSource>,
}

/// A standard model: what clients ask for and see.
#[derive(Debug)]
pub struct Model {
    /// The public id.
    pub id: String,
    /// Routing strategy.
    pub strategy: Strategy,
    /// TTFT budget override.
    pub first_event_timeout: Option<Duration>,
    /// Early-commit opt-in.
    pub early_commit_after: Option<Duration>,
    /// `models.<id>.unsupported`: what a translated request does with what its target
    /// cannot carry.
    pub unsupported: Unsupported,
    /// `models.<id>.continue_on_break`: a stream that breaks after text reached the client
    /// is continued on the next candidate route (see `crate::engine::continuation`).
    pub continue_on_break: bool,
    /// `models.<id>.resumable`: this model's streams are resumable unless a request opts
    /// out (`x-sluice-resumable: false`; see `crate::stream::resume`).
    pub resumable: bool,
    /// `models.<id>.report_served_model`: the answer's `model` field names the serving
    /// route's public name ([`Model::served_name`]).
    pub report_served_model: bool,
    /// `models.<id>.default_max_tokens`: output limit sent when the client gave none and
    /// the upstream API requires one (Anthropic Messages), tokens.
    pub default_max_tokens: u64,
    /// Same-route retries (`server.retry` with `models.<id>.retry` over it).
    pub retry: RetryPolicy,
    /// `models.<id>.hedge_after_ms`: when a hedge starts (`None`: never).
    pub hedge_after: Option<opt_in::HedgeAfter>,
    /// `models.<id>.affinity`.
    pub affinity: opt_in::Affinity,
    /// `models.<id>.fallback_models`: standard model ids tried after every route of this
    /// one failed before the first byte (checked: they exist, none is this model).
    pub fallback_models: Vec<String>,
    /// `models.<id>.context_fallback_models`: standard model ids tried on a context-length
    /// rejection (checked as `fallback_models`, and free of cycles).
    pub context_fallback_models: Vec<String>,
    /// Sell price, USD per million input tokens.
    pub input_usd_per_mtok: Option<f64>,
    /// Sell price, USD per million output tokens.
    pub output_usd_per_mtok: Option<f64>,
    /// Sell price, USD per million input tokens read from the prompt cache (`None`: the
    /// input price).
    pub cached_input_usd_per_mtok: Option<f64>,
    /// Sell price, USD per million input tokens written to the prompt cache (`None`: the
    /// input price).
    pub cache_write_usd_per_mtok: Option<f64>,
    /// Routes in file order.
    pub routes: Vec<Route>,
}

/// One upstream target of a standard model.
#[derive(Debug)]
pub struct Route {
    /// The provider.
    pub provider: Arc<Provider>,
    /// The provider's model name.
    pub upstream_model: String,
    /// Lower first.
    pub priority: i32,
    /// Share among equal priorities.
    pub weight: u32,
    /// Cost, USD per million input tokens.
    pub input_usd_per_mtok: f64,
    /// Cost, USD per million output tokens.
    pub output_usd_per_mtok: f64,
    /// Cost, USD per million input tokens read from the prompt cache (`None`: the input
    /// cost).
    pub cached_input_usd_per_mtok: Option<f64>,
    /// Cost, USD per million input tokens written to the prompt cache (`None`: the input
    /// cost).
    pub cache_write_usd_per_mtok: Option<f64>,
    /// Capabilities; `None` means all.
    pub capabilities: Option<Vec<Capability>>,
    /// `routes[].supports_prefill`: a continuation on this route rides assistant prefill.
    pub supports_prefill: bool,
    /// `routes[].display_model`: the public name of the model this route serves (`None`:
    /// the standard model's id).
    pub display_model: Option<String>,
    /// Stable health key, `provider/upstream_model`.
    pub health_key: String,
    /// Context window, tokens (`routes[].context_window_tokens`, else the model's); `None`:
    /// not declared.
    pub context_window_tokens: Option<u64>,
    /// `routes[].thinking`: the form of a translated request's Claude thinking settings
    /// (`None`: from the upstream model id).
    pub thinking: Option<crate::protocol::ThinkingForm>,
    /// `routes[].api`: the OpenAI API of a route to an OpenAI or Azure OpenAI provider
    /// (Chat Completions unless it chose Responses).
    pub api: RouteApi,
}

impl Model {
    /// The public name of the model `route` (one of this model's) serves: its
    /// `display_model`, else this model's id. Sent in `x-sluice-served-model`.
    pub fn served_name<'a>(&'a self, route: &'a Route) -> &'a str {
        route.display_model.as_deref().unwrap_or(&self.id)
    }

    /// The `model` an answer served by `route` names: [`Self::served_name`] when the model
    /// opts in (`report_served_model`), else this model's id.
    pub fn echoed_name<'a>(&'a self, route: &'a Route) -> &'a str {
        if self.report_served_model {
            self.served_name(route)
        } else {
            &self.id
        }
    }
}

impl Route {
    /// Whether the route supports `cap`.
    pub fn supports(&self, cap: Capability) -> bool {
        self.capabilities.as_ref().is_none_or(|c| c.contains(&cap))
    }
}

impl Config {
    /// Loads and validates `path` (and its `include:`s).
    ///
    /// # Errors
    /// A [`ConfigError`] naming file, line, column and key path of the first problem.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        validate::load(path)
    }

    /// Validates YAML `text` as if it had been read from `path` (which names the file in
    /// errors and anchors relative `include:` paths).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        validate::load_text(path, text.to_string())
    }

    /// Reads only the `ledger:` section of `path` (for `sluice usage`: the rest of the file
    /// is not validated, so no provider key needs to be in the environment).
    ///
    /// # Errors
    /// A [`ConfigError`] for an unreadable file or a bad `ledger:` section.
    pub fn load_ledger(path: &Path) -> Result<ledger::LedgerSettings, ConfigError> {
        validate::load_ledger(path)
    }

    /// Settings that are valid but risky (an `admin_listen` that is not loopback), located
    /// like errors; `sluice -t` prints them, startup and reload log them as warnings.
    pub fn warnings(&self) -> Vec<ConfigError> {
        validate::warnings(self)
    }

    /// Timeouts for `provider` when serving `model` (the model may override the TTFT budget).
    pub fn timeouts_for(&self, provider: &Provider, model: &Model) -> HopTimeouts {
        let mut t = provider.timeouts;
        if let Some(fe) = model.first_event_timeout {
            t.first_event = fe;
        }
        t
    }
}
