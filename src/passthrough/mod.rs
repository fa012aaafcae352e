//! Owns the passthrough routes at run time: the table of routes (each with its
//! `pingora-load-balancing` [`LoadBalancer`](pingora::lb::LoadBalancer) and health state)
//! that hot reload swaps ([`Router`], an `ArcSwap`), request matching, and the pieces of
//! Pingora's native proxy path that serve a matched request ([`serve`]): upstream selection
//! in `upstream_peer`, the forwarding headers, the body limits, the access line and metrics.
//!
//! The routes themselves are validated by [`crate::config::passthrough`]; the LLM API never
//! goes through here (its paths are never passthrough, see
//! [`crate::config::passthrough::is_api_path`]).
//!
//! A reload keeps the [`Route`] (so its balancer and the health of its upstreams) of every
//! route whose settings did not change; a changed or new route starts with every upstream
//! healthy. A request pins the route it matched for its whole life.

mod balancer;
pub mod forward;
pub mod health;
pub mod log;
pub mod serve;

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::http::RequestHeader;

use crate::config::passthrough::{is_api_path, PassthroughRoute};
use crate::config::Config;
pub use balancer::Balancer;
pub use serve::PassCtx;

/// One route in service: its settings and its balancer.
pub struct Route {
    /// The validated settings.
    pub spec: PassthroughRoute,
    /// Upstream selection and health.
    pub balancer: Balancer,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl Route {
    fn new(spec: PassthroughRoute) -> Self {
        let balancer = Balancer::new(&spec);
        let route = Self { spec, balancer };
        route.publish_health();
        route
    }

    /// Sets `sluice_passthrough_upstream_healthy{route,upstream}` from the balancer's view.
    pub fn publish_health(&self) {
        let g = &log::metrics().upstream_healthy;
        for addr in &self.spec.upstreams {
            let up = addr.to_string();
            g.with_label_values(&[self.spec.name.as_str(), up.as_str()])
                .set(i64::from(self.balancer.is_healthy(*addr)));
        }
    }
}

/// The routes of one config, in match order (a route with a host first, then the longest
/// prefix; the first match wins).
#[derive(Debug, Default)]
pub struct Table {
    routes: Vec<Arc<Route>>,
}

/// What a request path asks of the passthrough table.
#[derive(Debug)]
pub enum Match {
    /// Proxy it through this route.
    Route(Arc<Route>),
    /// Redirect (301) to `prefix`: the path is the route's prefix without its trailing `/`
    /// (Nginx's behaviour for `location /ui/`).
    Redirect {
        /// The route whose prefix it is.
        route: Arc<Route>,
        /// The route's prefix, the redirect's target.
        prefix: String,
    },
}

impl Table {
    /// The table of `routes`, reusing the [`Route`] of `old` wherever the settings are equal.
    fn build(routes: &[PassthroughRoute], old: Option<&Table>) -> Self {
        let mut out: Vec<Arc<Route>> = routes
            .iter()
            .map(|spec| {
                old.and_then(|t| t.routes.iter().find(|r| r.spec == *spec))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Route::new(spec.clone())))
            })
            .collect();
        // Stable: equal precedence cannot happen (validation refuses same host and prefix).
        out.sort_by_key(|r| std::cmp::Reverse(r.spec.precedence()));
        Self { routes: out }
    }

    /// The routes, in match order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// The route for `host` (lowercase, no port) and `path`, or the redirect to a route's
    /// prefix; `None` when no route serves the request (the LLM API's paths included).
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<Match> {
        if is_api_path(path) {
            return None;
        }
        if let Some(r) = self.routes.iter().find(|r| r.spec.matches(host, path)) {
            return Some(Match::Route(r.clone()));
        }
        self.routes.iter().find_map(|r| {
            let prefix = r.spec.path_prefix.as_deref()?;
            let bare = prefix.strip_suffix('/')?;
            let host_ok = r.spec.host.as_deref().is_none_or(|h| Some(h) == host);
            (host_ok && !bare.is_empty() && path == bare).then(|| Match::Redirect {
                route: r.clone(),
                prefix: prefix.into(),
            })
        })
    }
}

/// The live passthrough table, swapped by hot reload.
#[derive(Debug)]
pub struct Router {
    table: ArcSwap<Table>,
    /// Woken by every swap (the health-check service starts the checks of new routes).
    changed: tokio::sync::Notify,
}

impl Router {
    /// The table of `cfg`.
    pub fn new(cfg: &Config) -> Self {
        Self {
            table: ArcSwap::from_pointee(Table::build(&cfg.passthrough, None)),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Swaps in the table of `cfg` (routes with unchanged settings keep their balancer and
    /// health); new requests match against it, requests in flight keep their route.
    pub fn apply(&self, cfg: &Config) {
        let old = self.table.load_full();
        let new = Table::build(&cfg.passthrough, Some(&old));
        // Routes that left: their health series go too (bounded cardinality).
        for r in old.routes() {
            if !new.routes.iter().any(|n| Arc::ptr_eq(n, r)) {
                for addr in &r.spec.upstreams {
                    let up = addr.to_string();
                    let _ = log::metrics()
                        .upstream_healthy
                        .remove_label_values(&[r.spec.name.as_str(), up.as_str()]);
                }
            }
        }
        for r in new.routes() {
            r.publish_health();
        }
        self.table.store(Arc::new(new));
        self.changed.notify_one();
    }

    /// The current table.
    pub fn table(&self) -> Arc<Table> {
        self.table.load_full()
    }

    /// What the table says about `req` (its host and path).
    pub fn find(&self, req: &RequestHeader) -> Option<Match> {
        let table = self.table.load();
        // The LLM API's requests leave at once (no host parsed, nothing allocated).
        if table.routes.is_empty() || is_api_path(req.uri.path()) {
            return None;
        }
        let host = request_host(req);
        table.find(host.as_deref(), req.uri.path())
    }
}

/// The request's host as routes match it: the URI's authority (HTTP/2 `:authority`, an
/// absolute-form target) or else the `Host` header, lowercase, without port or trailing dot.
pub fn request_host(req: &RequestHeader) -> Option<String> {
    let raw = match req.uri.host() {
        Some(h) => h.to_string(),
        None => {
            let v = req.headers.get(http::header::HOST)?.to_str().ok()?;
            strip_port(v).to_string()
        }
    };
    let h = raw
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    (!h.is_empty()).then_some(h)
}

/// `host[:port]` or `[v6][:port]` without the port.
fn strip_port(v: &str) -> &str {
    if let Some(rest) = v.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match v.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(host: Option<&str>, path: &str) -> RequestHeader {
        let mut r = RequestHeader::build("GET", path.as_bytes(), None).expect("req");
        if let Some(h) = host {
            r.insert_header("host", h).expect("host");
        }
        r
    }

    #[test]
    fn the_host_loses_its_port_case_and_trailing_dot() {
        assert_eq!(
            request_host(&req(Some("UI.Example.com:8443"), "/")).as_deref(),
            Some("ui.example.com")
        );
        assert_eq!(
            request_host(&req(Some("ui.example.com."), "/")).as_deref(),
            Some("ui.example.com")
        );
        assert_eq!(
            request_host(&req(Some("[::1]:8080"), "/")).as_deref(),
            Some("::1")
        );
        assert_eq!(request_host(&req(None, "/")), None);
        // An absolute-form target (or HTTP/2 `:authority`) wins over `Host`.
        let mut abs = req(Some("ignored.example"), "/");
        abs.set_uri(http::Uri::from_static("http://Abs.example:81/x"));
        assert_eq!(request_host(&abs).as_deref(), Some("abs.example"));
    }

    fn table(yaml: &str) -> Table {
        let sections = serde_yaml::from_str(yaml).expect("yaml");
        let routes = crate::config::passthrough::build(
            sections,
            std::time::Duration::from_secs(1),
            1024,
            &|k: &str, m: String| {
                crate::config::ConfigError::at(std::path::Path::new("t"), None, k, m)
            },
        )
        .expect("valid");
        Table::build(&routes, None)
    }

    fn name(m: Option<Match>) -> String {
        match m {
            Some(Match::Route(r)) => r.spec.name.clone(),
            Some(Match::Redirect { prefix, .. }) => format!("301 {prefix}"),
            None => "404".into(),
        }
    }

    #[test]
    fn the_api_stays_on_every_host_and_prefixes_redirect_without_their_slash() {
        let t = table(
            "- name: ui\n  path_prefix: /ui/\n  upstreams: [127.0.0.1:1]\n- name: whole\n  host: ui.example.com\n  upstreams: [127.0.0.1:2]\n",
        );
        assert_eq!(name(t.find(None, "/ui/x")), "ui");
        assert_eq!(name(t.find(None, "/ui")), "301 /ui/");
        assert_eq!(name(t.find(None, "/other")), "404");
        assert_eq!(name(t.find(Some("ui.example.com"), "/ui/x")), "whole");
        assert_eq!(name(t.find(Some("ui.example.com"), "/anything")), "whole");
        assert_eq!(
            name(t.find(Some("ui.example.com"), "/v1/chat/completions")),
            "404"
        );
        assert_eq!(name(t.find(Some("ui.example.com"), "/models")), "404");
    }

    #[test]
    fn a_rebuild_keeps_unchanged_routes_and_replaces_changed_ones() {
        let yaml = "- name: a\n  path_prefix: /a/\n  upstreams: [127.0.0.1:1]\n- name: b\n  path_prefix: /b/\n  upstreams: [127.0.0.1:2]\n";
        let first = table(yaml);
        let sections =
            serde_yaml::from_str(&yaml.replace("127.0.0.1:2", "127.0.0.1:3")).expect("yaml");
        let routes = crate::config::passthrough::build(
            sections,
            std::time::Duration::from_secs(1),
            1024,
            &|k: &str, m: String| {
                crate::config::ConfigError::at(std::path::Path::new("t"), None, k, m)
            },
        )
        .expect("valid");
        let second = Table::build(&routes, Some(&first));
        let by = |t: &Table, n: &str| {
            t.routes()
                .iter()
                .find(|r| r.spec.name == n)
                .cloned()
                .expect("route")
        };
        assert!(Arc::ptr_eq(&by(&first, "a"), &by(&second, "a")));
        assert!(!Arc::ptr_eq(&by(&first, "b"), &by(&second, "b")));
    }
}
