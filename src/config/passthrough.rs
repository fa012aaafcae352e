//! Owns `passthrough:`, the routes Sluice proxies to plain upstreams on Pingora's native
//! path (what else Nginx proxied on the host: a UI, its API): the YAML shape
//! ([`PassthroughSection`], a contract: `name`, `path_prefix`, `host`, `upstreams`,
//! `strategy`, `health_check: {path, interval_ms}`), its validation into
//! [`PassthroughRoute`]s, and the paths the LLM API keeps for itself ([`is_api_path`]).
//!
//! A request belongs to a route when its host equals the route's `host` (if set) and its
//! path starts with the route's `path_prefix` (if set; byte prefix, as Nginx's `location`);
//! a route with a `host` beats one without, then the longest `path_prefix` wins. The LLM
//! API's paths are never passthrough, on any host: a route whose `path_prefix` would take
//! one is refused at load, and a host-only route serves every path of its host except
//! them. The runtime table lives in [`crate::passthrough`].

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;

/// `passthrough[]`: one route to plain upstreams.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PassthroughSection {
    /// Route name: 1-64 characters of `[A-Za-z0-9_.-]`, unique; the `route` label of
    /// `sluice_passthrough_requests_total` and the access log's `route` field.
    pub name: String,
    /// Host name the route serves (the request's `Host`, or the HTTP/2 `:authority`, port
    /// and letter case ignored). Absent: every host.
    #[serde(default)]
    pub host: Option<String>,
    /// Path prefix the route serves, starting with `/` (byte prefix; the longest matching
    /// route wins). A request for the prefix without its trailing `/` is redirected to it
    /// (301, as Nginx does). Absent: every path of `host`. At least one of `host` and
    /// `path_prefix` is required; a prefix that would take a path of the LLM API (`/v1/...`,
    /// `/chat/completions`, `/messages`, `/responses`, `/models`) is refused.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// Upstream addresses, `IP:port` (IP literals: host names are not resolved), at least one.
    pub upstreams: Vec<String>,
    /// How a request picks its upstream (default `round_robin`).
    #[serde(default)]
    pub strategy: PassthroughStrategy,
    /// With `strategy: consistent_hash`: the request header whose value is hashed (e.g. a
    /// session cookie header or `x-user-id`). Absent, or missing from a request: the client
    /// IP is hashed.
    #[serde(default)]
    pub hash_header: Option<String>,
    /// Active HTTP health check of every upstream (absent: none, every upstream is used).
    #[serde(default)]
    pub health_check: Option<PassthroughHealthSection>,
    /// Remove `path_prefix` from the path sent upstream (`/ui/app.js` → `/app.js`; default
    /// false: the path is sent unchanged).
    #[serde(default)]
    pub strip_prefix: bool,
    /// Connect to the upstreams over TLS (default false: plain HTTP).
    #[serde(default)]
    pub tls: bool,
    /// With `tls`: the TLS server name sent and verified (default: `host`; required when the
    /// route has no `host`).
    #[serde(default)]
    pub sni: Option<String>,
    /// With `tls`: verify the upstream's certificate chain and name against the system roots
    /// (default true).
    #[serde(default = "default_true")]
    pub tls_verify: bool,
    /// TCP (+ TLS) connect timeout to an upstream, ms (default `server.connect_timeout_ms`).
    /// A failed connect tries the next upstream.
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for each read from the upstream, ms (the response head, then every piece
    /// of the body: also the idle limit of a stream; default 60000, Nginx's
    /// `proxy_read_timeout`).
    #[serde(default)]
    pub read_timeout_ms: Option<u64>,
    /// Longest wait for each write to the upstream, ms (default 60000, Nginx's
    /// `proxy_send_timeout`).
    #[serde(default)]
    pub write_timeout_ms: Option<u64>,
    /// Largest request body, bytes (default `server.max_request_body_bytes`); larger gets 413.
    #[serde(default)]
    pub max_request_body_bytes: Option<usize>,
}

/// `passthrough[].strategy`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PassthroughStrategy {
    /// Each request to the next healthy upstream in turn.
    #[default]
    RoundRobin,
    /// Ketama consistent hashing of the client IP (or of `hash_header`): the same client
    /// keeps its upstream while it is healthy, and a removed upstream moves only its share.
    ConsistentHash,
}

/// `passthrough[].health_check`: an HTTP `GET` to each upstream every `interval_ms` (with
/// the route's `host` as `Host`, else `localhost`; over TLS with the route's `sni` when it
/// uses `tls`); an upstream that fails leaves the rotation until it passes again. Every
/// upstream starts in the rotation (before its first check, and after a reload that
/// changed the route).
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PassthroughHealthSection {
    /// Path requested, starting with `/` (e.g. `/healthz`); a 2xx answer passes.
    pub path: String,
    /// Interval between checks, ms (default 5000, at least 100).
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Longest a check may take (connect, then the answer's head), ms (default 1000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Consecutive failed checks that take a healthy upstream out (default 1).
    #[serde(default = "default_one")]
    pub unhealthy_after_failures: usize,
    /// Consecutive passed checks that bring an unhealthy upstream back (default 1).
    #[serde(default = "default_one")]
    pub healthy_after_successes: usize,
}

fn default_true() -> bool {
    true
}
fn default_interval_ms() -> u64 {
    5000
}
fn default_timeout_ms() -> u64 {
    1000
}
fn default_one() -> usize {
    1
}

/// Default of `read_timeout_ms` and `write_timeout_ms` (Nginx's `proxy_read_timeout` and
/// `proxy_send_timeout`).
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);

/// How a validated route picks its upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// `round_robin`.
    RoundRobin,
    /// `consistent_hash`, of `header` (lowercase) when the request has it, else the client IP.
    ConsistentHash {
        /// The hashed header, lowercase.
        header: Option<String>,
    },
}

/// A validated `passthrough[].health_check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughHealth {
    /// Path requested.
    pub path: String,
    /// Interval between checks.
    pub interval: Duration,
    /// Connect and answer-head timeout of one check.
    pub timeout: Duration,
    /// Consecutive failures that take an upstream out.
    pub unhealthy_after_failures: usize,
    /// Consecutive passes that bring it back.
    pub healthy_after_successes: usize,
}

/// TLS toward a route's upstreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// Server name sent (SNI) and verified.
    pub sni: String,
    /// Whether the certificate is verified.
    pub verify: bool,
}

/// A validated passthrough route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughRoute {
    /// The route's name (metrics label, access log).
    pub name: String,
    /// The host served, lowercase, without a trailing dot; `None`: every host.
    pub host: Option<String>,
    /// The path prefix served; `None`: every path (of `host`).
    pub path_prefix: Option<String>,
    /// Upstream addresses, in file order.
    pub upstreams: Vec<SocketAddr>,
    /// Selection.
    pub balance: Balance,
    /// Active health check, if any.
    pub health_check: Option<PassthroughHealth>,
    /// Whether `path_prefix` is removed from the upstream path.
    pub strip_prefix: bool,
    /// TLS toward the upstreams; `None`: plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Per-read timeout.
    pub read_timeout: Duration,
    /// Per-write timeout.
    pub write_timeout: Duration,
    /// Largest request body, bytes.
    pub max_request_body_bytes: usize,
}

impl PassthroughRoute {
    /// Whether the route serves `host` (lowercase, port removed) and `path`.
    pub fn matches(&self, host: Option<&str>, path: &str) -> bool {
        let host_ok = match (&self.host, host) {
            (None, _) => true,
            (Some(want), Some(h)) => want == h,
            (Some(_), None) => false,
        };
        host_ok
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
    }

    /// Precedence among matching routes: a route with a host first, then the longer prefix.
    pub fn precedence(&self) -> (bool, usize) {
        (
            self.host.is_some(),
            self.path_prefix.as_ref().map_or(0, String::len),
        )
    }
}

/// Paths the LLM API answers itself (after its optional `/v1`).
const API_EXACT: [&str; 5] = [
    "/chat/completions",
    "/messages",
    "/messages/count_tokens",
    "/responses",
    "/models",
];

/// Whether `path` belongs to the LLM API, on every host: the whole `/v1` namespace and the
/// API's endpoints without their `/v1` (which SDK base URLs may omit), `/models/{id}`
/// included. Such a request is never passthrough.
pub fn is_api_path(path: &str) -> bool {
    path == "/v1"
        || path.starts_with("/v1/")
        || path.starts_with("/models/")
        || API_EXACT.contains(&path)
}

/// The LLM API path a route with `prefix` would take, if any.
fn captured_api_path(prefix: &str) -> Option<&'static str> {
    if prefix.starts_with("/v1/") || "/v1/".starts_with(prefix) {
        return Some("/v1/");
    }
    if prefix.starts_with("/models/") || "/models/".starts_with(prefix) {
        return Some("/models/");
    }
    API_EXACT.into_iter().find(|a| a.starts_with(prefix))
}

/// Checks a path prefix (or health-check path): absolute, plain, without dot segments.
fn check_path(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err(format!("`{prefix}` must start with `/`"));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#' | '%' | '\\'))
    {
        return Err(format!(
            "`{prefix}` contains {c:?}: a prefix is a plain path (no query, fragment, percent-encoding or spaces)"
        ));
    }
    if prefix.split('/').any(|s| s == "." || s == "..") {
        return Err(format!("`{prefix}` contains a `.` or `..` segment"));
    }
    Ok(())
}

/// A host name as requests are matched against it: lowercase, no trailing dot.
fn check_host(host: &str) -> Result<String, String> {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(h)
    } else {
        Err(format!(
            "`{host}` is not a host name like ui.example.com (no port, no scheme)"
        ))
    }
}

/// Validates `passthrough:` of the main file. `err(key, message)` locates a problem there;
/// `defaults` are `server.connect_timeout_ms` and `server.max_request_body_bytes`.
///
/// # Errors
/// The first problem, as a [`ConfigError`] naming `passthrough[i].key`.
#[expect(
    clippy::too_many_lines,
    reason = "one passthrough route's checks after another, each naming its key path"
)]
pub fn build(
    sections: Vec<PassthroughSection>,
    default_connect: Duration,
    default_max_body: usize,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Vec<PassthroughRoute>, ConfigError> {
    let mut out: Vec<PassthroughRoute> = Vec::with_capacity(sections.len());
    for (i, s) in sections.into_iter().enumerate() {
        let key = |k: &str| format!("passthrough[{i}].{k}");
        let e = |k: &str, m: String| err(&key(k), m);
        let name_ok = !s.name.is_empty()
            && s.name.len() <= 64
            && s.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(e(
                "name",
                format!(
                    "`{}` must be 1-64 characters of letters, digits, `_`, `.` and `-`",
                    s.name
                ),
            ));
        }
        if let Some(other) = out.iter().position(|r| r.name == s.name) {
            return Err(e(
                "name",
                format!("`{}` is already the name of passthrough[{other}]", s.name),
            ));
        }
        let host = s
            .host
            .as_deref()
            .map(check_host)
            .transpose()
            .map_err(|m| e("host", m))?;
        if let Some(p) = &s.path_prefix {
            check_path(p).map_err(|m| e("path_prefix", m))?;
            if let Some(api) = captured_api_path(p) {
                return Err(e(
                    "path_prefix",
                    format!(
                        "`{p}` would shadow the LLM API's `{api}`: the API paths (/v1/..., \
                         /chat/completions, /messages, /responses, /models) stay Sluice's on \
                         every host"
                    ),
                ));
            }
        }
        if host.is_none() && s.path_prefix.is_none() {
            return Err(err(
                &format!("passthrough[{i}]"),
                "a route needs a `host`, a `path_prefix` or both (a route matching every request \
                 would make Sluice an open proxy)"
                    .into(),
            ));
        }
        if s.upstreams.is_empty() {
            return Err(e("upstreams", "at least one upstream is required".into()));
        }
        let mut upstreams = Vec::with_capacity(s.upstreams.len());
        for (n, u) in s.upstreams.iter().enumerate() {
            let addr: SocketAddr = u.trim().parse().map_err(|_| {
                err(
                    &format!("passthrough[{i}].upstreams[{n}]"),
                    format!(
                        "`{u}` is not an address like 127.0.0.1:3000 (an IP literal and a port: \
                         host names are not resolved)"
                    ),
                )
            })?;
            if addr.port() == 0 || addr.ip().is_unspecified() {
                return Err(err(
                    &format!("passthrough[{i}].upstreams[{n}]"),
                    format!("`{u}` needs a port other than 0 and a specific IP"),
                ));
            }
            if upstreams.contains(&addr) {
                return Err(err(
                    &format!("passthrough[{i}].upstreams[{n}]"),
                    format!("`{u}` is listed twice"),
                ));
            }
            upstreams.push(addr);
        }
        let balance = match (s.strategy, s.hash_header) {
            (PassthroughStrategy::RoundRobin, Some(_)) => {
                return Err(e(
                    "hash_header",
                    "only with `strategy: consistent_hash`".into(),
                ))
            }
            (PassthroughStrategy::RoundRobin, None) => Balance::RoundRobin,
            (PassthroughStrategy::ConsistentHash, header) => {
                let header = header
                    .map(|h| {
                        http::HeaderName::from_bytes(h.as_bytes())
                            .map(|n| n.as_str().to_string())
                            .map_err(|_| e("hash_header", format!("`{h}` is not a header name")))
                    })
                    .transpose()?;
                Balance::ConsistentHash { header }
            }
        };
        let health_check = match s.health_check {
            None => None,
            Some(h) => {
                let hk = |k: &str| format!("health_check.{k}");
                check_path(&h.path).map_err(|m| e(&hk("path"), m))?;
                if h.interval_ms < 100 {
                    return Err(e(&hk("interval_ms"), "must be at least 100".into()));
                }
                if h.timeout_ms == 0 {
                    return Err(e(&hk("timeout_ms"), "must be greater than 0".into()));
                }
                for (k, v) in [
                    ("unhealthy_after_failures", h.unhealthy_after_failures),
                    ("healthy_after_successes", h.healthy_after_successes),
                ] {
                    if v == 0 {
                        return Err(e(&hk(k), "must be at least 1".into()));
                    }
                }
                Some(PassthroughHealth {
                    path: h.path,
                    interval: Duration::from_millis(h.interval_ms),
                    timeout: Duration::from_millis(h.timeout_ms),
                    unhealthy_after_failures: h.unhealthy_after_failures,
                    healthy_after_successes: h.healthy_after_successes,
                })
            }
        };
        let tls = match (s.tls, s.sni) {
            (false, Some(_)) => return Err(e("sni", "only with `tls: true`".into())),
            (false, None) => None,
            (true, sni) => {
                let sni = match sni {
                    Some(n) => check_host(&n).map_err(|m| e("sni", m))?,
                    None => host.clone().ok_or_else(|| {
                        e(
                            "tls",
                            "TLS needs a server name: set `sni` (or the route's `host`)".into(),
                        )
                    })?,
                };
                Some(UpstreamTls {
                    sni,
                    verify: s.tls_verify,
                })
            }
        };
        let positive = |k: &str, v: Option<u64>, d: Duration| -> Result<Duration, ConfigError> {
            match v {
                Some(0) => Err(e(k, "must be greater than 0".into())),
                Some(ms) => Ok(Duration::from_millis(ms)),
                None => Ok(d),
            }
        };
        let connect_timeout =
            positive("connect_timeout_ms", s.connect_timeout_ms, default_connect)?;
        let read_timeout = positive("read_timeout_ms", s.read_timeout_ms, DEFAULT_IO_TIMEOUT)?;
        let write_timeout = positive("write_timeout_ms", s.write_timeout_ms, DEFAULT_IO_TIMEOUT)?;
        let max_request_body_bytes = match s.max_request_body_bytes {
            Some(0) => return Err(e("max_request_body_bytes", "must be greater than 0".into())),
            Some(n) => n,
            None => default_max_body,
        };
        let route = PassthroughRoute {
            name: s.name,
            host,
            path_prefix: s.path_prefix,
            upstreams,
            balance,
            health_check,
            strip_prefix: s.strip_prefix,
            tls,
            connect_timeout,
            read_timeout,
            write_timeout,
            max_request_body_bytes,
        };
        if let Some((j, other)) = out
            .iter()
            .enumerate()
            .find(|(_, o)| o.host == route.host && o.path_prefix == route.path_prefix)
        {
            let field = if route.path_prefix.is_some() {
                "path_prefix"
            } else {
                "host"
            };
            return Err(e(
                field,
                format!(
                    "matches the same requests as passthrough[{j}] (`{}`): two routes may not \
                     share a host and path prefix",
                    other.name
                ),
            ));
        }
        out.push(route);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(yaml: &str) -> Vec<PassthroughSection> {
        serde_yaml::from_str(yaml).expect("yaml")
    }

    fn build_yaml(yaml: &str) -> Result<Vec<PassthroughRoute>, String> {
        build(
            section(yaml),
            Duration::from_secs(10),
            1024,
            &|k: &str, m: String| ConfigError::at(std::path::Path::new("t.yaml"), None, k, m),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_contract_example_validates_with_its_defaults() {
        let r = build_yaml(
            "- name: ui\n  path_prefix: /ui/\n  upstreams: [127.0.0.1:3000, 127.0.0.1:3001]\n  strategy: round_robin\n  health_check: {path: /healthz, interval_ms: 5000}\n",
        )
        .expect("valid");
        assert_eq!(r[0].upstreams.len(), 2);
        assert_eq!(r[0].balance, Balance::RoundRobin);
        let h = r[0].health_check.as_ref().expect("health check");
        assert_eq!(h.interval, Duration::from_secs(5));
        assert_eq!(h.timeout, Duration::from_secs(1));
        assert_eq!(r[0].read_timeout, DEFAULT_IO_TIMEOUT);
        assert_eq!(r[0].connect_timeout, Duration::from_secs(10));
        assert_eq!(r[0].max_request_body_bytes, 1024);
    }

    #[test]
    fn prefixes_that_shadow_the_api_are_refused() {
        for p in [
            "/",
            "/v",
            "/v1",
            "/v1/",
            "/v1/ui/",
            "/chat/",
            "/m",
            "/models",
            "/models/x/",
            "/responses",
        ] {
            let err = build_yaml(&format!(
                "- name: ui\n  path_prefix: {p}\n  upstreams: [127.0.0.1:3000]\n"
            ))
            .expect_err(p);
            assert!(err.contains("passthrough[0].path_prefix: "), "{p}: {err}");
            assert!(err.contains("would shadow the LLM API"), "{p}: {err}");
        }
        for p in ["/ui/", "/v1x/", "/mail/", "/chat-ui/", "/responsesx"] {
            build_yaml(&format!(
                "- name: ui\n  path_prefix: {p}\n  upstreams: [127.0.0.1:3000]\n"
            ))
            .unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }

    #[test]
    fn api_paths_are_the_endpoints_with_and_without_v1() {
        for p in [
            "/v1",
            "/v1/chat/completions",
            "/v1/anything",
            "/chat/completions",
            "/messages",
            "/messages/count_tokens",
            "/responses",
            "/models",
            "/models/acme%2Fchat",
        ] {
            assert!(is_api_path(p), "{p}");
        }
        for p in ["/", "/ui/", "/v1x", "/chat", "/modelsx", "/messages/x"] {
            assert!(!is_api_path(p), "{p}");
        }
    }

    #[test]
    fn overlapping_routes_and_bad_fields_are_named() {
        let cases = [
            (
                "- name: a\n  path_prefix: /ui/\n  upstreams: [127.0.0.1:1]\n- name: b\n  path_prefix: /ui/\n  upstreams: [127.0.0.1:2]\n",
                "passthrough[1].path_prefix: matches the same requests as passthrough[0] (`a`)",
            ),
            (
                "- name: a\n  host: UI.example.com\n  upstreams: [127.0.0.1:1]\n- name: b\n  host: ui.example.com.\n  upstreams: [127.0.0.1:2]\n",
                "passthrough[1].host: matches the same requests",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n- name: a\n  path_prefix: /b/\n  upstreams: [127.0.0.1:2]\n",
                "passthrough[1].name: `a` is already the name of passthrough[0]",
            ),
            (
                "- name: a\n  upstreams: [127.0.0.1:1]\n",
                "passthrough[0]: a route needs a `host`, a `path_prefix` or both",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: [localhost:3000]\n",
                "passthrough[0].upstreams[0]: `localhost:3000` is not an address",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: []\n",
                "passthrough[0].upstreams: at least one upstream",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n  hash_header: x-user\n",
                "passthrough[0].hash_header: only with `strategy: consistent_hash`",
            ),
            (
                "- name: a\n  path_prefix: /a/../b/\n  upstreams: [127.0.0.1:1]\n",
                "passthrough[0].path_prefix: `/a/../b/` contains a `.` or `..` segment",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n  tls: true\n",
                "passthrough[0].tls: TLS needs a server name",
            ),
            (
                "- name: a\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n  health_check: {path: /h, interval_ms: 10}\n",
                "passthrough[0].health_check.interval_ms: must be at least 100",
            ),
            (
                "- name: 'a b'\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n",
                "passthrough[0].name: `a b` must be 1-64 characters",
            ),
        ];
        for (yaml, want) in cases {
            let err = build_yaml(yaml).expect_err(want);
            assert!(err.contains(want), "want {want}\n got {err}");
        }
    }

    #[test]
    fn a_host_route_beats_a_hostless_one_then_the_longest_prefix_wins() {
        let r = build_yaml(
            "- name: all-ui\n  path_prefix: /ui/\n  upstreams: [127.0.0.1:1]\n- name: admin\n  path_prefix: /ui/admin/\n  upstreams: [127.0.0.1:2]\n- name: host\n  host: ui.example.com\n  upstreams: [127.0.0.1:3]\n  strategy: consistent_hash\n  hash_header: X-User\n",
        )
        .expect("valid");
        let best = |host: Option<&str>, path: &str| {
            r.iter()
                .filter(|x| x.matches(host, path))
                .max_by_key(|x| x.precedence())
                .map(|x| x.name.as_str())
        };
        assert_eq!(best(None, "/ui/admin/x"), Some("admin"));
        assert_eq!(best(Some("other"), "/ui/x"), Some("all-ui"));
        assert_eq!(best(Some("ui.example.com"), "/ui/admin/x"), Some("host"));
        assert_eq!(best(None, "/nothing"), None);
        assert_eq!(
            r[2].balance,
            Balance::ConsistentHash {
                header: Some("x-user".into())
            }
        );
    }
}
