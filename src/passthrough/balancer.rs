//! Owns a route's upstream selection: a `pingora-load-balancing` [`LoadBalancer`] over the
//! route's static upstreams, with `RoundRobin` or `KetamaHashing` (consistent hashing), and
//! its [`HttpHealthCheck`] on `health_check.path` (run by [`super::health`]). An upstream the
//! check failed is skipped by selection until a check passes again.

use std::net::SocketAddr;

use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::selection::consistent::KetamaHashing;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, LoadBalancer};
use pingora::{Error, ErrorType};

use crate::config::passthrough::{Balance, PassthroughHealth, PassthroughRoute};

/// Most backends one selection looks at (the upstream list is short; this only bounds the
/// Ketama ring walk).
const MAX_ITERATIONS: usize = 256;

/// `Host` of health checks of a route without a `host`.
const CHECK_HOST: &str = "localhost";

/// A route's load balancer.
pub enum Balancer {
    /// `strategy: round_robin`.
    RoundRobin(LoadBalancer<RoundRobin>),
    /// `strategy: consistent_hash`.
    Consistent(LoadBalancer<KetamaHashing>),
}

fn build<S>(spec: &PassthroughRoute) -> LoadBalancer<S>
where
    S: pingora::lb::selection::BackendSelection + 'static,
    S::Iter: pingora::lb::selection::BackendIter,
{
    // `SocketAddr`s resolve without I/O, and static discovery cannot fail.
    let mut lb = match LoadBalancer::<S>::try_from_iter(spec.upstreams.iter().copied()) {
        Ok(lb) => lb,
        Err(e) => unreachable!("socket addresses resolve without I/O: {e}"),
    };
    if let Some(h) = &spec.health_check {
        // Scheduled by `super::health` (the balancer is not run as its own service, since
        // a reload may drop it).
        lb.set_health_check(Box::new(health_check(spec, h)));
    }
    lb
}

/// The route's HTTP check: `GET {path}` with the route's `host` (or `localhost`) as `Host`,
/// over TLS when the route uses it; a 2xx answer passes.
fn health_check(spec: &PassthroughRoute, h: &PassthroughHealth) -> HttpHealthCheck {
    let host = spec.host.as_deref().unwrap_or(CHECK_HOST);
    let mut hc = HttpHealthCheck::new(host, spec.tls.is_some());
    if let Ok(mut req) = RequestHeader::build("GET", h.path.as_bytes(), None) {
        // Both values are validated (host name, plain path): the inserts cannot fail.
        let _ = req.insert_header("host", host);
        let _ = req.insert_header("user-agent", "sluice-health-check");
        hc.req = req;
    }
    if let Some(tls) = &spec.tls {
        hc.peer_template.sni.clone_from(&tls.sni);
        hc.peer_template.options.verify_cert = tls.verify;
        hc.peer_template.options.verify_hostname = tls.verify;
    }
    hc.peer_template.options.connection_timeout = Some(h.timeout);
    hc.peer_template.options.total_connection_timeout = Some(h.timeout);
    hc.peer_template.options.read_timeout = Some(h.timeout);
    hc.peer_template.options.write_timeout = Some(h.timeout);
    hc.consecutive_failure = h.unhealthy_after_failures;
    hc.consecutive_success = h.healthy_after_successes;
    hc.validator = Some(Box::new(|resp: &ResponseHeader| {
        if resp.status.is_success() {
            Ok(())
        } else {
            Error::e_explain(
                ErrorType::CustomCode("health check status", resp.status.as_u16()),
                format!("health check answered {}", resp.status.as_u16()),
            )
        }
    }));
    hc
}

fn inet(b: &Backend) -> Option<SocketAddr> {
    b.addr.as_inet().copied()
}

impl Balancer {
    /// The balancer of `spec`'s upstreams (all healthy until a check says otherwise).
    pub fn new(spec: &PassthroughRoute) -> Self {
        match spec.balance {
            Balance::RoundRobin => Self::RoundRobin(build(spec)),
            Balance::ConsistentHash { .. } => Self::Consistent(build(spec)),
        }
    }

    /// The next healthy upstream not in `tried`, for hash `key` (ignored by round robin);
    /// `None` when there is none.
    pub fn select(&self, key: &[u8], tried: &[SocketAddr]) -> Option<SocketAddr> {
        let accept =
            |b: &Backend, healthy: bool| healthy && inet(b).is_some_and(|a| !tried.contains(&a));
        let b = match self {
            Self::RoundRobin(lb) => lb.select_with(key, MAX_ITERATIONS, accept),
            Self::Consistent(lb) => lb.select_with(key, MAX_ITERATIONS, accept),
        };
        b.as_ref().and_then(inet)
    }

    /// Whether `addr` is in the rotation (enabled and not failed by the health check).
    pub fn is_healthy(&self, addr: SocketAddr) -> bool {
        let b = Backend {
            addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
            weight: 1,
            ext: http::Extensions::new(),
        };
        match self {
            Self::RoundRobin(lb) => lb.backends().ready(&b),
            Self::Consistent(lb) => lb.backends().ready(&b),
        }
    }

    /// Runs one health-check pass over every upstream, in parallel (nothing when the route
    /// has no check).
    pub async fn check(&self) {
        match self {
            Self::RoundRobin(lb) => lb.backends().run_health_check(true).await,
            Self::Consistent(lb) => lb.backends().run_health_check(true).await,
        }
    }
}
