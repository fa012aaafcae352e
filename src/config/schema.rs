//! The YAML file format, 1:1: serde structs with `deny_unknown_fields`, unit-suffixed fields
//! (`_ms`, `_bytes`, `_usd_per_mtok`) and named default functions.
//!
//! These structs are what `serde_yaml` fills; [`super::validate`] turns them into the
//! immutable [`super::Config`] snapshot the gateway serves from. The key names here are a
//! contract with tooling outside the repository: extend, never rename.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The whole file (`sluice.yaml`), after `include:` files are merged in.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Further files (paths or glob patterns, relative to this file's folder) whose
    /// `providers`, `models`, `tenants` and `virtual_keys` are merged into this one.
    /// A folder path includes every `*.yaml`/`*.yml` in it.
    #[serde(default)]
    pub include: Vec<String>,
    /// Listener, thread and per-hop timeout settings.
    #[serde(default)]
    pub server: ServerSection,
    /// Tenants by id: who owns limits and the bill.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantSection>,
    /// Gateway-issued client credentials.
    #[serde(default)]
    pub virtual_keys: Vec<VirtualKeySection>,
    /// Providers by id.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSection>,
    /// Standard models by public id (e.g. `openai/gpt-4o-mini`).
    #[serde(default)]
    pub models: BTreeMap<String, ModelSection>,
    /// Optional distributed rate limiting through Redis; absent means local limits only.
    #[serde(default)]
    pub redis: Option<RedisSection>,
    /// The durable usage ledger; absent means SQLite at `sluice-usage.db` in the working
    /// directory.
    #[serde(default)]
    pub ledger: Option<LedgerSection>,
    /// The Responses API's conversation state (`store`, `previous_response_id`,
    /// `item_reference`, `GET`/`DELETE /v1/responses/{id}`), kept on the ledger's database;
    /// absent means on (when the ledger is), with the default retention
    /// ([`ResponseStoreSection`]).
    #[serde(default)]
    pub response_store: Option<ResponseStoreSection>,
    /// Routes to plain upstreams on Pingora's native proxy path (a contract; see
    /// [`super::passthrough::PassthroughSection`] for every key); absent: none, and every
    /// path but the LLM API's is a 404. Main file only (not in `include:`d files).
    #[serde(default)]
    pub passthrough: Vec<super::passthrough::PassthroughSection>,
}

/// What `sluice usage` reads of a config file: the `ledger:` section alone (other sections
/// are not checked, so the tool needs none of the provider keys' environment variables).
#[derive(Debug, Deserialize, Default)]
pub struct LedgerOnly {
    /// The `ledger:` section.
    #[serde(default)]
    pub ledger: Option<LedgerSection>,
}

/// `ledger:`: where usage records are written. Needs a restart to change (a reload says so).
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct LedgerSection {
    /// `false` turns the ledger off: no database is opened or written, no usage record is
    /// kept (the access log and the metrics still carry every request's usage), and
    /// `sluice usage` / `GET /admin/usage` say that the ledger is disabled. Default `true`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// SQLite file (created with its schema if missing; relative paths resolve against the
    /// working directory at startup). Default, when neither `path` nor `url` is set:
    /// `sluice-usage.db`.
    #[serde(default)]
    pub path: Option<String>,
    /// PostgreSQL instead of SQLite, `postgres://user[:password]@host[:port]/db`: one ledger
    /// for several replicas. Not with `path`.
    #[serde(default)]
    pub url: Option<String>,
    /// How often queued records are written, ms (default 200): at most this much traffic is
    /// lost when the process is killed (`kill -9`); SIGTERM writes everything.
    #[serde(default)]
    pub flush_interval_ms: Option<u64>,
    /// Records queued for writing before new ones are dropped and counted in
    /// `sluice_ledger_dropped_total` (default 10000).
    #[serde(default)]
    pub queue_capacity: Option<usize>,
}

/// `response_store:`: stored Responses API responses ([`crate::conversation`]), in the
/// ledger's database (`ledger.path` or `ledger.url`).
/// Needs a restart to change (a reload says so).
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct ResponseStoreSection {
    /// `false`: nothing is stored; `store: true`, `previous_response_id` and
    /// `item_reference` inputs are refused with 400 and `/v1/responses/{id}` is a 404.
    /// Default: `ledger.enabled` (`true` unless the ledger is off; `true` here with the
    /// ledger off opens the ledger's database for the store alone).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// A stored response is kept this long, seconds (default 2592000, 30 days, as OpenAI
    /// keeps them); older ones are neither returned nor continued and are deleted by the
    /// sweep.
    #[serde(default)]
    pub max_age_secs: Option<u64>,
    /// Most bytes of stored responses one tenant keeps (each response counts its Response
    /// object and its input items); over it, the tenant's oldest are deleted at once.
    /// Default 1073741824 (1 GiB).
    #[serde(default)]
    pub max_bytes_per_tenant: Option<u64>,
    /// How often the background sweep deletes expired responses, seconds (default 60).
    #[serde(default)]
    pub sweep_interval_secs: Option<u64>,
    /// Responses queued for writing before new ones are not stored and counted in
    /// `sluice_response_store_dropped_total` (default 10000).
    #[serde(default)]
    pub queue_capacity: Option<usize>,
}

/// A file named by `include:`: the same sections minus `server`, `include` and `redis`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct IncludedFile {
    /// Tenants by id.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantSection>,
    /// Virtual keys.
    #[serde(default)]
    pub virtual_keys: Vec<VirtualKeySection>,
    /// Providers by id.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSection>,
    /// Standard models by id (their routes are appended to any routes the model already has).
    #[serde(default)]
    pub models: BTreeMap<String, ModelSection>,
}

/// Log line format.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// `timestamp level target key=value ...`
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `server:`: listeners, threads, body limits, per-hop timeouts and admission settings.
/// Listener, thread and daemon fields need a restart (or graceful upgrade) to change;
/// everything else reloads in place.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Downstream HTTP listener, `host:port` (default `127.0.0.1:8080`).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Optional downstream TLS listener, `host:port` (ALPN `h2` and `http/1.1`); needs
    /// `tls.certificates`.
    #[serde(default)]
    pub tls_listen: Option<String>,
    /// Certificates of `tls_listen`, chosen by SNI (see [`super::tls`]).
    #[serde(default)]
    pub tls: Option<super::tls::TlsSection>,
    /// Admin listener serving `/metrics`, `/healthz`, `/readyz` (default `127.0.0.1:9090`).
    #[serde(default = "default_admin_listen")]
    pub admin_listen: String,
    /// Pingora worker threads (default: the number of CPUs).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Whether idle worker threads steal tasks from busy ones (Pingora's `work_stealing`:
    /// one multi-threaded tokio runtime; default `true`) or each thread runs the
    /// connections it was given start to end (`false`: a current-thread runtime per
    /// thread, as Nginx's workers do). In `benches/load.rs` on 2 cores, `false` once
    /// measured ~10 % more non-streaming requests/s and 13-15 % less CPU per request; on a
    /// noisier machine, with LLM routes on Sluice's own pool, the two were within noise of
    /// each other (`benches/README.md`, fifth round), so the default stays Pingora's. With
    /// `false`, passthrough routes (on Pingora's pool) used to open a new upstream
    /// connection and log `failed to acquire reusable stream` for 0.3 % of requests; the
    /// patched pingora-core (`vendor/README.md`) waits for the idle watch instead.
    #[serde(default = "default_true")]
    pub work_stealing: bool,
    /// Log line format (`text` or `json`).
    #[serde(default)]
    pub log_format: LogFormat,
    /// Largest accepted request body in bytes (default 10 MiB); larger gets 413.
    #[serde(default = "default_max_request_body_bytes")]
    pub max_request_body_bytes: usize,
    /// Largest non-streaming upstream response body Sluice buffers to rewrite, in bytes, after
    /// content decoding (default 32 MiB); a larger one fails with 502 and the error code
    /// `upstream_response_too_large`, its message naming this limit.
    #[serde(default = "default_max_response_body_bytes")]
    pub max_response_body_bytes: usize,
    /// Default TCP + TLS connect timeout to a provider, ms (default 10000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Default time from request sent to upstream response head of a *streaming* request, ms
    /// (default 60000: a provider opens its stream before it generates). When set, it is also
    /// the non-stream head timeout unless `non_stream_first_byte_timeout_ms` is set too (as
    /// before that key existed).
    #[serde(default)]
    pub first_byte_timeout_ms: Option<u64>,
    /// Default time from request sent to upstream response head of a *non-streaming* request,
    /// ms (default 600000, what the official OpenAI and Anthropic SDKs wait: a non-stream
    /// head comes only when the whole answer is generated; else `first_byte_timeout_ms` when
    /// that is set).
    #[serde(default)]
    pub non_stream_first_byte_timeout_ms: Option<u64>,
    /// Default time from upstream response head to the first SSE data event, ms (default 60000).
    #[serde(default = "default_first_event_timeout_ms")]
    pub first_event_timeout_ms: u64,
    /// Default stream idle limit: no upstream bytes for this long ends the stream, ms (default 300000).
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Default interval of heartbeats while a committed stream is silent, ms (default 10000,
    /// a sixth of the 60 s idle timeouts of AWS ALB and nginx `proxy_read_timeout`): an SSE
    /// comment `: keepalive` (Messages clients: `event: ping`). Upstream keepalives (Anthropic
    /// `ping`, SSE comments) are relayed in the client's dialect as they come, at most one a
    /// second, on translated streams too.
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// A client that accepts no bytes for this long is disconnected, ms (default 60000).
    #[serde(default = "default_downstream_write_timeout_ms")]
    pub downstream_write_timeout_ms: u64,
    /// Most bytes Sluice holds for one stream before it stops reading upstream (default 65536):
    /// the backpressure bound, how far ahead of a slow reader Sluice reads. Not a limit on the
    /// size of one event (see `max_event_bytes`).
    #[serde(default = "default_max_buffered_bytes_per_stream")]
    pub max_buffered_bytes_per_stream: usize,
    /// Largest single upstream SSE event, bytes (default 8388608, 8 MiB; at least 1024): a
    /// large tool call or reasoning block is one event. A bigger event ends the stream with an
    /// error event. Also bounds what one compressed stream chunk may decode to (together with
    /// `max_buffered_bytes_per_stream`).
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: usize,
    /// On SIGTERM/SIGQUIT, how long open streams may run before they are cancelled, ms (default 30000).
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// Optional cap on one stream's total duration, ms (default: none).
    #[serde(default)]
    pub max_stream_duration_ms: Option<u64>,
    /// Global cap on concurrent upstream requests. Default: derived from the process's
    /// open-file limit, `(RLIMIT_NOFILE soft - 256) / 2` and at least 64 (each stream holds
    /// a downstream and an upstream socket; 256 descriptors are kept for listeners, logs,
    /// the ledger, Redis and pooled connections). Sluice raises its soft limit to the hard
    /// limit at start, so under the shipped systemd unit (`LimitNOFILE=1048576`) the cap
    /// is about 524,000 and memory, not descriptors, is the bound. See [`crate::fd_limit`].
    #[serde(default = "default_max_concurrent_upstream_requests")]
    pub max_concurrent_upstream_requests: usize,
    /// Requests that may wait for a slot once the cap is reached (default 256).
    #[serde(default = "default_queue_size")]
    pub queue_size: usize,
    /// Longest wait in the admission queue, ms (default 2000).
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// The sliding window that `requests_per_minute` and `tokens_per_minute` count over, ms
    /// (default 60000, a minute; tests shorten it, the limits then apply per this window).
    #[serde(default = "default_rate_limit_window_ms")]
    pub rate_limit_window_ms: u64,
    /// Name of the environment variable holding the admin token (at least 16 characters):
    /// `GET /admin/usage` on the admin listener then answers requests with `Authorization:
    /// Bearer <token>`. Absent: the admin listener serves no usage data (403).
    #[serde(default)]
    pub admin_token_env: Option<String>,
    /// Add `x-sluice-provider`, `x-sluice-fallback-depth` and `x-sluice-overhead-ms` (the
    /// time Sluice itself added before the first byte, milliseconds with 3 decimals; see
    /// `sluice_gateway_overhead_seconds`) to responses (default true).
    #[serde(default = "default_true")]
    pub emit_route_headers: bool,
    /// Reload when the config file or one of its includes changes on disk (default true).
    /// Either way `SIGHUP` reloads; `false` leaves reloads to `SIGHUP` alone.
    #[serde(default = "default_true")]
    pub watch_config: bool,
    /// Pingora pid file, used with `-d` (default `/tmp/sluice.pid`).
    #[serde(default = "default_pid_file")]
    pub pid_file: String,
    /// Pingora graceful-upgrade socket, used with `-u` (default `/tmp/sluice_upgrade.sock`).
    #[serde(default = "default_upgrade_sock")]
    pub upgrade_sock: String,
    /// Where a daemonized (`-d`) Sluice writes its log (default: stderr).
    #[serde(default)]
    pub error_log: Option<String>,
    // Hostile clients: what one downstream connection may hold and for how long.
    /// Global bound on the memory request bodies hold at once, bytes (default 256 MiB):
    /// bodies being read (their buffer so far, which grows with the bytes that arrived) and
    /// bodies held for the upstream attempts, each body byte counted twice (the
    /// body is parsed, then re-serialized for each attempt). A request that would pass it gets
    /// 503 `request_buffers_full` with `Retry-After`. At least 2 × `max_request_body_bytes`.
    #[serde(default = "default_max_buffered_request_bytes")]
    pub max_buffered_request_bytes: usize,
    /// Most label sets a tenant-labelled metric family holds (default 10000): a tenant ×
    /// model pair counts once in `sluice_tokens_total` (its five kinds together),
    /// `sluice_cost_usd_total` and `sluice_charge_usd_total`, a tenant once in
    /// `sluice_active_streams`. Series are created on first use; a new label set past this is
    /// recorded under `tenant="__overflow__"` (and `model="__overflow__"`), counted in
    /// `sluice_metric_overflow_total{family}` and logged once, so totals stay right and
    /// `/metrics` stays bounded. A reload that lowers it keeps the series already created.
    #[serde(default = "default_metrics_max_series_per_family")]
    pub metrics_max_series_per_family: usize,
    /// The whole request head (request line and headers) must arrive within this, ms
    /// (default 30000), counted from the connection's accept for its first request and from
    /// the first byte of the head for the next ones on a keep-alive connection. Past it the
    /// connection is closed without an answer.
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// The whole request body must arrive within this, ms from the end of the head (default
    /// 60000); past it the request gets 408 `request_timeout` and the connection is closed.
    #[serde(default = "default_body_read_timeout_ms")]
    pub body_read_timeout_ms: u64,
    /// Same-route retries before falling back (a contract; see [`RetrySection`]).
    #[serde(default)]
    pub retry: RetrySection,
    // The edge: request head limits, per-client-IP limits, trusted proxies (`super::edge`).
    /// Largest request head, request line and header fields, bytes (default 32768, Nginx's
    /// `large_client_header_buffers 4 8k`; 1024 to 1048575): past it 431.
    #[serde(default = "default_max_request_header_bytes")]
    pub max_request_header_bytes: usize,
    /// Most header fields in a request (default 100; 1 to 256): past it 431.
    #[serde(default = "default_max_request_headers")]
    pub max_request_headers: usize,
    /// Longest request target (path and query as sent), bytes (default 8192, one Nginx
    /// header buffer): past it 414.
    #[serde(default = "default_max_uri_bytes")]
    pub max_uri_bytes: usize,
    /// Per-client-IP limits before authentication (absent: none).
    #[serde(default)]
    pub per_ip: Option<super::edge::PerIpSection>,
    /// Networks (`10.0.0.0/8`, `127.0.0.1/32`, `::1`) whose `X-Forwarded-For` is believed
    /// (default: none).
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    // Resumable streams (`models.<id>.resumable`, `x-sluice-resumable`; see `crate::stream::resume`).
    /// How long the generation of a resumable stream whose client dropped keeps running
    /// while no client is attached, ms (default 30000; 1 to 3600000). Past it the upstream
    /// is cancelled as for a client abort and a resume gets 410.
    #[serde(default = "default_resume_grace_ms")]
    pub resume_grace_ms: u64,
    /// The replay buffer of one resumable stream, bytes of SSE events (default 1048576, 1
    /// MiB; at least 1024), also charged to `max_buffered_request_bytes`. Past it, events a
    /// detached client has not been sent end the stream (410 `overflowed` on resume).
    #[serde(default = "default_resume_buffer_bytes")]
    pub resume_buffer_bytes: usize,
    /// After a resumable stream's final event was written, its last events up to this many
    /// bytes (always the final event) stay replayable for `resume_grace_ms`, for a client
    /// whose connection died before it read them (default 65536; 0 ends the stream at the
    /// final write; at most `resume_buffer_bytes`, which also caps the default). Charged to
    /// `max_buffered_request_bytes`.
    #[serde(default)]
    pub resume_linger_bytes: Option<usize>,
    /// This replica's tag inside every stream id, 1 to 32 characters of `[A-Za-z0-9-]`
    /// (default: random per process start). A resume naming another replica's id gets 421.
    #[serde(default)]
    pub replica_id: Option<String>,
    /// Serve the Responses API's WebSocket mode on `GET /v1/responses` with `Upgrade:
    /// websocket` (default `true`); `false` answers the upgrade with 426, which sends
    /// OpenAI's clients to plain HTTP (see [`crate::ingress::websocket`]).
    #[serde(default = "default_true")]
    pub responses_websocket: bool,
    /// Most Responses WebSocket sessions open at once, process-wide (default 10000; at
    /// least 1). An upgrade past it gets 503 `websocket_sessions` with `Retry-After`, before
    /// the `101`; sessions open already are kept.
    #[serde(default = "default_responses_websocket_max_sessions")]
    pub responses_websocket_max_sessions: usize,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            tls_listen: None,
            tls: None,
            admin_listen: default_admin_listen(),
            threads: None,
            work_stealing: true,
            log_format: LogFormat::Text,
            max_request_body_bytes: default_max_request_body_bytes(),
            max_response_body_bytes: default_max_response_body_bytes(),
            connect_timeout_ms: default_connect_timeout_ms(),
            first_byte_timeout_ms: None,
            non_stream_first_byte_timeout_ms: None,
            first_event_timeout_ms: default_first_event_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            heartbeat_interval_ms: default_heartbeat_interval_ms(),
            downstream_write_timeout_ms: default_downstream_write_timeout_ms(),
            max_buffered_bytes_per_stream: default_max_buffered_bytes_per_stream(),
            max_event_bytes: default_max_event_bytes(),
            shutdown_grace_ms: default_shutdown_grace_ms(),
            max_stream_duration_ms: None,
            max_concurrent_upstream_requests: default_max_concurrent_upstream_requests(),
            queue_size: default_queue_size(),
            queue_timeout_ms: default_queue_timeout_ms(),
            rate_limit_window_ms: default_rate_limit_window_ms(),
            admin_token_env: None,
            emit_route_headers: true,
            watch_config: true,
            pid_file: default_pid_file(),
            upgrade_sock: default_upgrade_sock(),
            error_log: None,
            max_buffered_request_bytes: default_max_buffered_request_bytes(),
            metrics_max_series_per_family: default_metrics_max_series_per_family(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            body_read_timeout_ms: default_body_read_timeout_ms(),
            retry: RetrySection::default(),
            max_request_header_bytes: default_max_request_header_bytes(),
            max_request_headers: default_max_request_headers(),
            max_uri_bytes: default_max_uri_bytes(),
            per_ip: None,
            trusted_proxies: Vec::new(),
            resume_grace_ms: default_resume_grace_ms(),
            resume_buffer_bytes: default_resume_buffer_bytes(),
            resume_linger_bytes: None,
            replica_id: None,
            responses_websocket: true,
            responses_websocket_max_sessions: default_responses_websocket_max_sessions(),
        }
    }
}

/// `server.retry` and `models.<id>.retry`: same-route retries before falling back (a
/// contract). Every key is optional; under `server` an absent key takes the default named on
/// it, under a model it keeps the `server.retry` value. See [`crate::routing::retry`].
#[derive(Debug, Deserialize, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    /// Attempts on one route before falling back; 1 = no retry (default 2).
    #[serde(default)]
    pub max_attempts_per_route: Option<u32>,
    /// What is retried: upstream statuses and `connect_error`, `connection_reset` (default
    /// `[429, 500, 502, 503, 504, connect_error, connection_reset]`). Timeouts never are.
    #[serde(default)]
    pub on: Option<Vec<RetryCondition>>,
    /// First backoff, ms, jittered ±50% and doubled for each further retry (default 100).
    #[serde(default)]
    pub backoff_ms: Option<u64>,
    /// A `Retry-After` up to this is waited out on the same route; a longer one rests the
    /// route and the request falls back at once, ms (default 2000).
    #[serde(default)]
    pub max_retry_after_wait_ms: Option<u64>,
    /// Retries of a route are at most this share of its requests over a minute, rounded up
    /// (default 0.2): no retry storms.
    #[serde(default)]
    pub budget_ratio: Option<f64>,
}

/// One entry of `retry.on`: an HTTP status (e.g. `503`) or `connect_error` /
/// `connection_reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCondition {
    /// This upstream status.
    Status(u16),
    /// The connection could not be made (refused, unreachable, TLS, connect timeout).
    ConnectError,
    /// The connection closed or was reset before the answer's first event.
    ConnectionReset,
}

impl<'de> Deserialize<'de> for RetryCondition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RetryCondition;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an HTTP status (400-599), `connect_error` or `connection_reset`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RetryCondition, E> {
                match u16::try_from(v) {
                    Ok(s) if (400..=599).contains(&s) => Ok(RetryCondition::Status(s)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RetryCondition, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RetryCondition, E> {
                match v {
                    "connect_error" => Ok(RetryCondition::ConnectError),
                    "connection_reset" => Ok(RetryCondition::ConnectionReset),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `tenants.<id>`: limits for one tenant (all optional; absent means unlimited).
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// Concurrent streams (in-flight requests) across the tenant's keys.
    #[serde(default)]
    pub max_concurrent_streams: Option<u32>,
    /// Requests per minute.
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens (input + output) per minute.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Standard models the tenant may use (absent: all).
    #[serde(default)]
    pub allowed_models: Option<Vec<String>>,
    /// Providers the tenant's requests may go to (absent: all).
    #[serde(default)]
    pub allowed_providers: Option<Vec<String>>,
    /// Further limits per standard model id (tenant × model), applied on top of the tenant's.
    #[serde(default)]
    pub model_limits: BTreeMap<String, LimitsSection>,
    /// Spending limits in USD (a contract key; see [`BudgetSection`]).
    #[serde(default)]
    pub budget: Option<BudgetSection>,
}

/// `tenants.<id>.budget`: what the tenant may be charged, USD at the standard models' sell
/// prices, per UTC calendar window (any subset; absent: unlimited). A contract:
/// `{total_usd, monthly_usd, daily_usd, hard}`. See [`crate::billing::budget`].
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Over the tenant's whole history (every record in the ledger), USD.
    #[serde(default)]
    pub total_usd: Option<f64>,
    /// Per UTC calendar month, USD.
    #[serde(default)]
    pub monthly_usd: Option<f64>,
    /// Per UTC calendar day, USD.
    #[serde(default)]
    pub daily_usd: Option<f64>,
    /// The tenant is never charged past its budget: a request's charge is capped at what the
    /// budget held for it (its reservation, grown while it ran where the budget had room); the
    /// ledger's `cost_usd` keeps what the provider billed. Default `false`: the tenant is
    /// charged what the provider reported, even past the budget.
    #[serde(default)]
    pub hard: bool,
}

/// `tenants.<id>.model_limits.<standard model>`: limits of one tenant on one standard model
/// (all optional; absent means only the tenant-wide limits apply).
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Concurrent streams (in-flight requests) of the tenant on this model.
    #[serde(default)]
    pub max_concurrent_streams: Option<u32>,
    /// Requests per minute (per `server.rate_limit_window_ms`).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens (input + output) per minute (per `server.rate_limit_window_ms`).
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

/// One `virtual_keys[]` entry: what a client presents instead of a provider key.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct VirtualKeySection {
    /// The key itself (for tests and quick starts); prefer `key_sha256`.
    #[serde(default)]
    pub key: Option<String>,
    /// Hex SHA-256 of the key, so the secret need not sit in the file.
    #[serde(default)]
    pub key_sha256: Option<String>,
    /// Tenant id this key belongs to.
    pub tenant: String,
    /// A human name for logs (default: a fingerprint of the key hash).
    #[serde(default)]
    pub name: Option<String>,
    /// Standard models this key may use (absent: the tenant's set).
    #[serde(default)]
    pub allowed_models: Option<Vec<String>>,
    /// Providers this key's requests may go to (absent: the tenant's set).
    #[serde(default)]
    pub allowed_providers: Option<Vec<String>>,
    /// Routing strategy override for this key.
    #[serde(default)]
    pub strategy: Option<Strategy>,
}

/// The wire format a provider speaks.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (and every OpenAI-compatible API: DeepSeek, vLLM, Ollama...).
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// The built-in demo provider (no key, no network).
    Demo,
    /// Azure OpenAI: Chat Completions at the deployments URL with the `api-key` header
    /// (needs `api_version`).
    AzureOpenai,
    /// The Gemini API (Google AI Studio): `generateContent` / `streamGenerateContent` with
    /// the `x-goog-api-key` header.
    Gemini,
    /// AWS Bedrock: Claude models through `InvokeModel` / `InvokeModelWithResponseStream`,
    /// every other model through `Converse` / `ConverseStream`, every request SigV4-signed (needs `region`; credentials from the AWS chain or
    /// `aws_profile`).
    Bedrock,
    /// Google Vertex AI: Claude models through `rawPredict` / `streamRawPredict` (Messages),
    /// Gemini models through `generateContent` / `streamGenerateContent`, with an OAuth2
    /// access token from a service-account key (needs `project`, `region`,
    /// `credentials_file_env`).
    Vertex,
}

/// `providers.<id>`: one provider endpoint and account.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Wire format.
    pub kind: ProviderKind,
    /// Base URL including the API version, SDK style (`https://api.openai.com/v1`);
    /// not used for `demo`. `azure_openai`: the resource endpoint without a path
    /// (`https://my-resource.openai.azure.com`); `gemini`: default
    /// `https://generativelanguage.googleapis.com/v1beta`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Environment variable holding the provider key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A literal provider key (tests only; prefer `api_key_env`).
    #[serde(default)]
    pub api_key: Option<String>,
    /// TCP + TLS connect timeout, ms (default `server.connect_timeout_ms`).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Upstream response head timeout of a streaming request, ms (default
    /// `server.first_byte_timeout_ms`); when set, also of a non-streaming one unless
    /// `non_stream_first_byte_timeout_ms` is set.
    #[serde(default)]
    pub first_byte_timeout_ms: Option<u64>,
    /// Upstream response head timeout of a non-streaming request, ms (default
    /// `first_byte_timeout_ms` of this provider when set, else
    /// `server.non_stream_first_byte_timeout_ms`).
    #[serde(default)]
    pub non_stream_first_byte_timeout_ms: Option<u64>,
    /// First SSE data event timeout, ms (default `server.first_event_timeout_ms`).
    #[serde(default)]
    pub first_event_timeout_ms: Option<u64>,
    /// Stream idle limit, ms (default `server.idle_timeout_ms`).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Heartbeat interval, ms (default `server.heartbeat_interval_ms`).
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Active health probe settings (default: probe `GET {base_url}/models`).
    #[serde(default)]
    pub health_check: Option<HealthCheckSection>,
    /// Passive health thresholds.
    #[serde(default)]
    pub health: Option<PassiveHealthSection>,
    /// Ask this provider for the final usage of a Chat Completions stream with
    /// `stream_options.include_usage: true` (OpenAI's API; default true). Set `false` for an
    /// OpenAI-compatible server that rejects `stream_options`: its streams are then metered
    /// from the text streamed (records marked `estimated`) unless the client asked for usage
    /// itself. Ignored by other provider kinds, whose streams always carry usage.
    #[serde(default = "default_true")]
    pub stream_usage: bool,
    /// Most requests in flight to this provider at once, over all its routes and across
    /// reloads (default: no cap of its own). A route whose provider is full is skipped as
    /// if it failed before the first byte (`provider_capacity`); when every candidate is
    /// full the client gets 503 with `Retry-After`.
    #[serde(default)]
    pub max_concurrent_requests: Option<usize>,
    /// PEM file of the CA certificates this provider's TLS certificate is verified against,
    /// instead of the system store (a private provider); relative to this file's folder.
    /// Only for an `https` `base_url`.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// `azure_openai` only (required there): the REST API version sent as the `api-version`
    /// query parameter, e.g. `"2024-10-21"`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// `bedrock` and `vertex` only (required there): the region. Bedrock: the AWS region,
    /// e.g. `us-east-2`; it names the default endpoint
    /// `https://bedrock-runtime.{region}.amazonaws.com` and the SigV4 scope. Vertex AI: e.g.
    /// `us-central1` (or `global`); it picks the default `base_url`,
    /// `https://{region}-aiplatform.googleapis.com/v1`.
    #[serde(default)]
    pub region: Option<String>,
    /// `bedrock` only: the profile of the shared credentials file
    /// (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) to sign with; without it
    /// the environment's `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`.
    #[serde(default)]
    pub aws_profile: Option<String>,
    /// `vertex` only (required there): the Google Cloud project id, e.g. `my-project`.
    #[serde(default)]
    pub project: Option<String>,
    /// `vertex` only (required there): the environment variable naming the service-account
    /// JSON key file, usually `GOOGLE_APPLICATION_CREDENTIALS`. The file is read when the
    /// config is loaded (and on reload); its contents are never logged.
    #[serde(default)]
    pub credentials_file_env: Option<String>,
    /// `vertex` only: where the key's signed assertions are exchanged for access tokens
    /// (default: the key file's `token_uri`, `https://oauth2.googleapis.com/token`).
    #[serde(default)]
    pub token_url: Option<String>,
}

/// `providers.<id>.health_check`: the active probe.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckSection {
    /// Probe on or off (default on).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// `list` (default): `GET {base_url}{path}` per provider; `request`: a one-output-token
    /// request per route (`path` unused).
    #[serde(default)]
    pub mode: super::ProbeMode,
    /// Path appended to `base_url` (default `/models`).
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Probe interval, ms (default 10000).
    #[serde(default = "default_health_interval_ms")]
    pub interval_ms: u64,
    /// Probe timeout, ms (default 2000).
    #[serde(default = "default_health_timeout_ms")]
    pub timeout_ms: u64,
}

/// `providers.<id>.health`: passive (request-outcome) health thresholds.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PassiveHealthSection {
    /// Consecutive failures that make a route degraded (default 1).
    #[serde(default = "default_degraded_after")]
    pub degraded_after_failures: u32,
    /// Consecutive failures that make a route unhealthy (default 3).
    #[serde(default = "default_unhealthy_after")]
    pub unhealthy_after_failures: u32,
    /// How long an unhealthy route rests before one trial request, ms (default 10000).
    #[serde(default = "default_cooldown_ms")]
    pub cooldown_ms: u64,
    /// Error rate, in percent of the requests (and probes) in `error_rate_window_ms`, that
    /// makes a route unhealthy even without consecutive failures (1-100; default: off).
    #[serde(default)]
    pub error_rate_percent: Option<u32>,
    /// Sliding window of the error rate, ms (default 60000).
    #[serde(default = "default_error_rate_window_ms")]
    pub error_rate_window_ms: u64,
    /// Fewest outcomes in the window before the error rate counts (default 20).
    #[serde(default = "default_error_rate_min_requests")]
    pub error_rate_min_requests: u32,
    /// No failure for this long makes a route one state healthier, ms (default 60000 or
    /// `cooldown_ms` if longer; 0 off; else at least `cooldown_ms`).
    #[serde(default)]
    pub decay_after_ms: Option<u64>,
}

/// Routing strategy for a standard model.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Lower `priority` first; ties spread by `weight`.
    #[default]
    Priority,
    /// Cheapest estimated cost for this request first.
    LowestCost,
    /// Lowest recent TTFT first.
    LowestLatency,
}

/// A capability a route may lack.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// `tools` / `tool_choice`.
    Tools,
    /// Image content parts.
    Vision,
    /// `response_format: {type: json_schema}`.
    JsonSchema,
}

/// `models.<id>`: one standard model.
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Routing strategy (default `priority`).
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// TTFT budget override, ms.
    #[serde(default)]
    pub first_event_timeout_ms: Option<u64>,
    /// Opt in to sending `200` + heartbeats when the first event is slower than this, ms.
    #[serde(default)]
    pub early_commit_after_ms: Option<u64>,
    /// Output-token limit sent upstream when the client gave none and the provider's API
    /// requires one (Anthropic Messages `max_tokens`), tokens; default 4096.
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// Same-route retries of this model's requests, over `server.retry`.
    #[serde(default)]
    pub retry: Option<RetrySection>,
    /// Opt in to mid-stream continuation: a stream that breaks after text reached the client
    /// is continued on the next candidate route and spliced into the same client stream
    /// (default false; see `crate::engine::continuation`).
    #[serde(default)]
    pub continue_on_break: Option<bool>,
    /// Opt in to resumable streams: every event of this model's streams carries an SSE
    /// `id:`, and a client whose connection drops may resume with `GET /v1/streams/<id>`
    /// within `server.resume_grace_ms` (default false; a request opts in or out with
    /// `x-sluice-resumable`; see `crate::stream::resume`).
    #[serde(default)]
    pub resumable: Option<bool>,
    /// Opt in to naming the route that served in the answer's `model` field: the route's
    /// `display_model` when it has one, else this model's id (default false: the `model`
    /// field names the standard model that answered). The `x-sluice-served-model` header
    /// names it either way.
    #[serde(default)]
    pub report_served_model: Option<bool>,
    /// Opt-in hedged requests: a number of ms, or `auto` (see [`super::opt_in`]).
    #[serde(default)]
    pub hedge_after_ms: Option<super::opt_in::HedgeAfterSection>,
    /// Opt-in prompt-cache affinity (`conversation`; default off).
    #[serde(default)]
    pub affinity: Option<super::opt_in::Affinity>,
    /// Standard models tried, in order, after every route of this model failed before the
    /// first byte (a contract key; see [`crate::engine::fallback`]). Not followed further:
    /// a fallback model's own `fallback_models` apply only to requests for it.
    #[serde(default)]
    pub fallback_models: Option<Vec<String>>,
    /// Standard models tried, in order, when a route of this model rejects the request as
    /// too long for its context window (a contract key); the model that rejected is never
    /// asked again.
    #[serde(default)]
    pub context_fallback_models: Option<Vec<String>>,
    /// The context window of this model's routes, tokens (a route may declare its own);
    /// a context-length rejection goes on to a route of the same model whose window is
    /// larger.
    #[serde(default)]
    pub context_window_tokens: Option<u64>,
    /// Sell price for input tokens, USD per million tokens.
    #[serde(default)]
    pub input_usd_per_mtok: Option<f64>,
    /// Sell price for output tokens (reasoning included), USD per million tokens.
    #[serde(default)]
    pub output_usd_per_mtok: Option<f64>,
    /// Sell price for input tokens read from the provider's prompt cache, USD per million
    /// tokens (default: `input_usd_per_mtok`).
    #[serde(default)]
    pub cached_input_usd_per_mtok: Option<f64>,
    /// Sell price for input tokens written to the provider's prompt cache (Anthropic cache
    /// creation), USD per million tokens (default: `input_usd_per_mtok`).
    #[serde(default)]
    pub cache_write_usd_per_mtok: Option<f64>,
    /// What a translated request does with a member or value its target cannot carry
    /// (`drop`: left out, with a record the client sees in `x-sluice-dropped`, a metric and
    /// an info log line; `refuse`: a 400 naming it). Default `drop`.
    #[serde(default)]
    pub unsupported: Option<crate::config::Unsupported>,
    /// Ordered upstream targets.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
}

/// `models.<id>.routes[]`: one upstream target.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// Provider id.
    pub provider: String,
    /// The provider's model name.
    pub upstream_model: String,
    /// Lower is tried first (default 10).
    #[serde(default = "default_priority")]
    pub priority: i32,
    /// Share among routes of equal priority (default 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Cost of input tokens, USD per million tokens (default 0).
    #[serde(default)]
    pub input_usd_per_mtok: f64,
    /// Cost of output tokens, USD per million tokens (default 0).
    #[serde(default)]
    pub output_usd_per_mtok: f64,
    /// Cost of input tokens read from the provider's prompt cache, USD per million tokens
    /// (default: `input_usd_per_mtok`).
    #[serde(default)]
    pub cached_input_usd_per_mtok: Option<f64>,
    /// Cost of input tokens written to the provider's prompt cache, USD per million tokens
    /// (default: `input_usd_per_mtok`).
    #[serde(default)]
    pub cache_write_usd_per_mtok: Option<f64>,
    /// Capabilities; absent means all.
    #[serde(default)]
    pub capabilities: Option<Vec<Capability>>,
    /// The route accepts a trailing assistant message as a prefix to continue (assistant
    /// prefill); a mid-stream continuation on it rides the prefill instead of a trailing user
    /// message (default false: current Claude models reject prefill).
    #[serde(default)]
    pub supports_prefill: bool,
    /// The public name of the model this route serves, for clients that must know which
    /// underlying model answered: sent in the `x-sluice-served-model` header, and in the
    /// answer's `model` field when the model opts in (`report_served_model`). Never the
    /// upstream model id unless the operator writes it here (default: the standard model's
    /// id).
    #[serde(default)]
    pub display_model: Option<String>,
    /// This route's context window, tokens (default: the model's `context_window_tokens`).
    #[serde(default)]
    pub context_window_tokens: Option<u64>,
    /// The form of a translated request's Claude thinking settings: `adaptive`
    /// (`thinking: {type: adaptive}` with `output_config.effort`; Claude 4.6 and later,
    /// required from Opus 4.7) or `budget` (`thinking: {type: enabled, budget_tokens}`;
    /// Claude 4.5 and earlier). Default: from the upstream model id
    /// ([`crate::protocol::ThinkingForm::for_model`]).
    #[serde(default)]
    pub thinking: Option<crate::protocol::ThinkingForm>,
    /// The OpenAI API this route's requests use, for a route to an `openai` or
    /// `azure_openai` provider: `chat_completions` (default) or `responses`
    /// (`POST {base_url}/responses`; Azure OpenAI `POST {endpoint}/openai/v1/responses`).
    /// Another provider kind has one API and takes no `api` (a config error).
    #[serde(default)]
    pub api: Option<RouteApi>,
}

/// `routes[].api`: the OpenAI API a route to an OpenAI or Azure OpenAI provider speaks.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouteApi {
    /// Chat Completions (<https://platform.openai.com/docs/api-reference/chat>).
    #[default]
    ChatCompletions,
    /// Responses (<https://platform.openai.com/docs/api-reference/responses>).
    Responses,
}

/// `redis:`: distributed rate limits.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// A check slower than this fails open, ms (default 50).
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
    /// Replica count; the local fail-open share is limit / replicas (default 1).
    #[serde(default = "default_replicas")]
    pub replicas: u32,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_admin_listen() -> String {
    "127.0.0.1:9090".into()
}
fn default_max_request_body_bytes() -> usize {
    10 * 1024 * 1024
}
fn default_max_response_body_bytes() -> usize {
    32 * 1024 * 1024
}
fn default_metrics_max_series_per_family() -> usize {
    crate::metrics::series::DEFAULT_MAX_SERIES_PER_FAMILY
}
fn default_max_buffered_request_bytes() -> usize {
    256 * 1024 * 1024
}
fn default_max_request_header_bytes() -> usize {
    super::edge::DEFAULT_MAX_REQUEST_HEADER_BYTES
}
fn default_max_request_headers() -> usize {
    super::edge::DEFAULT_MAX_REQUEST_HEADERS
}
fn default_max_uri_bytes() -> usize {
    super::edge::DEFAULT_MAX_URI_BYTES
}
fn default_header_read_timeout_ms() -> u64 {
    30_000
}
fn default_body_read_timeout_ms() -> u64 {
    60_000
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
/// Default head timeout of a streaming request, ms (`server.first_byte_timeout_ms`).
pub(crate) const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 60_000;
/// Default head timeout of a non-streaming request, ms
/// (`server.non_stream_first_byte_timeout_ms`): the official OpenAI and Anthropic SDKs'
/// own request timeout (600 s).
pub(crate) const DEFAULT_NON_STREAM_FIRST_BYTE_TIMEOUT_MS: u64 = 600_000;
fn default_first_event_timeout_ms() -> u64 {
    60_000
}
fn default_idle_timeout_ms() -> u64 {
    300_000
}
fn default_heartbeat_interval_ms() -> u64 {
    10_000
}
fn default_downstream_write_timeout_ms() -> u64 {
    60_000
}
fn default_max_buffered_bytes_per_stream() -> usize {
    65_536
}
fn default_max_event_bytes() -> usize {
    8 * 1024 * 1024
}
fn default_resume_grace_ms() -> u64 {
    30_000
}
fn default_responses_websocket_max_sessions() -> usize {
    10_000
}
fn default_resume_buffer_bytes() -> usize {
    1 << 20
}
fn default_shutdown_grace_ms() -> u64 {
    30_000
}
fn default_max_concurrent_upstream_requests() -> usize {
    crate::fd_limit::derived_upstream_cap()
}
fn default_queue_size() -> usize {
    256
}
fn default_queue_timeout_ms() -> u64 {
    2000
}
fn default_true() -> bool {
    true
}
fn default_pid_file() -> String {
    "/tmp/sluice.pid".into()
}
fn default_upgrade_sock() -> String {
    "/tmp/sluice_upgrade.sock".into()
}
/// Default `providers.<id>.health_check.path`; a kind with another model-list path (Azure) uses its own instead.
pub(super) fn default_health_path() -> String {
    "/models".into()
}
fn default_health_interval_ms() -> u64 {
    10_000
}
fn default_health_timeout_ms() -> u64 {
    2000
}
fn default_degraded_after() -> u32 {
    1
}
fn default_unhealthy_after() -> u32 {
    3
}
fn default_cooldown_ms() -> u64 {
    10_000
}
fn default_error_rate_window_ms() -> u64 {
    60_000
}
fn default_error_rate_min_requests() -> u32 {
    20
}
fn default_priority() -> i32 {
    10
}
fn default_weight() -> u32 {
    1
}
fn default_redis_timeout_ms() -> u64 {
    50
}
fn default_replicas() -> u32 {
    1
}
fn default_rate_limit_window_ms() -> u64 {
    60_000
}
