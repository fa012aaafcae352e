//! Owns downstream TLS: the certificates of `server.tls.certificates` (PEM chain and key,
//! checked to match; loaded as data by [`certs`] at config load), choosing one per
//! handshake by SNI ([`CertResolver`], a rustls `ResolvesServerCert` behind an `ArcSwap`,
//! so a hot reload hands new handshakes the renewed certificates while open connections
//! keep theirs), and the Pingora listener
//! settings (rustls through `pingora-core`: TLS 1.2 and 1.3 only, ALPN `h2` then
//! `http/1.1`), and the handshake itself ([`TlsListener`]).
//!
//! ## Why Sluice shakes hands itself
//!
//! Pingora 0.9.1 runs a TLS listener's handshake in its accept loop
//! (`pingora-core/src/services/listening.rs`, `run_endpoint`) before any application code:
//! bounded by a fixed 60 s, logged at ERROR for every failure (`Downstream handshake error
//! from ...`: on port 443 that is every scanner, bot and plain-HTTP client), and ahead of the
//! per-IP connection cap. No option changes any of the three. So the TLS port is a plain TCP
//! listener of the proxy service, and Sluice's connection app
//! ([`crate::edge::connection`]) hands its connections to [`TlsListener::accept`] after the
//! per-IP cap: the handshake must finish within `server.header_read_timeout_ms` (the same
//! deadline a plain connection has for its first head), and a failed or timed-out one is
//! counted in `sluice_tls_handshake_failures_total{reason}` and logged at DEBUG. The handshake
//! is Pingora's own (`Acceptor::tls_handshake`, the same rustls config and digests).
//!
//! Certificate choice: an exact server name first (case-insensitive), then a wildcard entry
//! `*.example.com` (one label, as RFC 6125 §6.4.3 allows), else the first certificate of the
//! list (also for clients that send no SNI, such as a bare `openssl s_client -connect`).
//!
//! Upstream, [`certs`] loads a provider's `ca_file` ([`UpstreamCa`]): the roots that provider's
//! certificate is verified against instead of the system store (a private provider).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora::listeners::tls::{Acceptor, TlsSettings};
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

pub mod certs;

pub use certs::*;

/// The SNI resolver handed to rustls: the current [`CertSet`], swapped whole on reload.
/// A handshake reads the set once; connections already established never look again.
#[derive(Debug)]
pub struct CertResolver {
    current: ArcSwap<CertSet>,
}

impl CertResolver {
    /// A resolver serving `set`.
    pub fn new(set: Arc<CertSet>) -> Self {
        Self {
            current: ArcSwap::new(set),
        }
    }

    /// New handshakes get `set` from now on.
    pub fn store(&self, set: Arc<CertSet>) {
        self.current.store(set);
    }

    /// The set new handshakes get.
    pub fn current(&self) -> Arc<CertSet> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .load()
                .resolve(client_hello.server_name())
                .clone(),
        )
    }
}

/// Pingora's TLS listener settings over `resolver`: rustls with TLS 1.2 and 1.3 only
/// (`pingora-core`'s rustls `TlsSettings::build` allows no other), no client
/// certificates, ALPN `h2` preferred then `http/1.1`.
///
/// # Errors
/// Pingora's, should its settings constructor refuse.
pub fn listener_settings(resolver: Arc<CertResolver>) -> pingora::Result<TlsSettings> {
    // The paths are unused once a resolver is set (`TlsSettings::build`).
    let mut settings = TlsSettings::intermediate("", "")?;
    settings.set_cert_resolver(resolver);
    settings.enable_h2();
    Ok(settings)
}

/// The downstream TLS listener (`server.tls_listen`) as Sluice serves it: its address, to
/// tell its connections from the plain listener's (both are plain TCP listeners of one
/// Pingora service; the config refuses two listeners that share a port and an address), and
/// the acceptor over the SNI resolver.
pub struct TlsListener {
    addr: SocketAddr,
    acceptor: Acceptor,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// The listener bound at `addr`, handing out `resolver`'s certificates.
    ///
    /// # Errors
    /// Pingora's, should its settings constructor refuse ([`listener_settings`]).
    pub fn new(addr: SocketAddr, resolver: Arc<CertResolver>) -> pingora::Result<Self> {
        Ok(Self {
            addr,
            acceptor: listener_settings(resolver)?.build(),
        })
    }

    /// Whether a connection accepted at the local address `local` came in on this listener:
    /// the same port, and the same address unless the listener's is unspecified (`0.0.0.0`,
    /// `[::]`).
    pub fn serves(&self, local: SocketAddr) -> bool {
        let (ip, own) = (local.ip().to_canonical(), self.addr.ip().to_canonical());
        local.port() == self.addr.port() && (own.is_unspecified() || own == ip)
    }

    /// The TLS handshake of the accepted connection `stream` within `timeout`: the TLS
    /// stream, or `None` when it failed or timed out (then counted in
    /// `sluice_tls_handshake_failures_total{reason}`, `error` or `timeout`, and logged at
    /// DEBUG with the peer `peer`). Dropping the stream closes the connection.
    pub async fn accept(&self, stream: Stream, timeout: Duration, peer: &str) -> Option<Stream> {
        let l4 = match stream.into_any().downcast::<L4Stream>() {
            Ok(l4) => *l4,
            Err(_) => {
                // Every listener of the proxy service is plain TCP: a bug if it happens.
                log::error!(
                    target: "sluice::tls",
                    "a connection of the TLS listener is not a TCP stream; closed: peer={peer}"
                );
                return None;
            }
        };
        let reason = match tokio::time::timeout(timeout, self.acceptor.tls_handshake(l4)).await {
            Ok(Ok(tls)) => return Some(Box::new(tls)),
            Ok(Err(e)) => {
                log::debug!(target: "sluice::tls", "TLS handshake failed: {e} peer={peer}");
                "error"
            }
            Err(_) => {
                log::debug!(
                    target: "sluice::tls",
                    "TLS handshake not done within server.header_read_timeout_ms ({} ms): peer={peer}",
                    timeout.as_millis()
                );
                "timeout"
            }
        };
        crate::metrics::metrics()
            .tls_handshake_failures_total
            .with_label_values(&[reason])
            .inc();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_listener_serves_its_port_on_its_address_or_any() {
        let resolver = || {
            let set = CertSet::new(vec![entry(&["a.test"])]).expect("set");
            Arc::new(CertResolver::new(Arc::new(set)))
        };
        let any = TlsListener::new("0.0.0.0:8443".parse().expect("addr"), resolver()).expect("l");
        let one = TlsListener::new("10.0.0.5:8443".parse().expect("addr"), resolver()).expect("l");
        let at = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert!(any.serves(at("10.0.0.5:8443")));
        assert!(any.serves(at("127.0.0.1:8443")));
        assert!(any.serves(at("[::ffff:127.0.0.1]:8443")));
        assert!(!any.serves(at("127.0.0.1:8080")));
        assert!(one.serves(at("10.0.0.5:8443")));
        assert!(!one.serves(at("127.0.0.1:8443")));
    }

    fn dummy_key() -> Arc<CertifiedKey> {
        // A syntactically valid chain is not needed for resolution: any key will do.
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["x.test".into()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
        let provider = rustls::crypto::ring::default_provider();
        Arc::new(CertifiedKey::from_der(vec![cert.der().clone()], der, &provider).expect("ck"))
    }

    fn entry(names: &[&str]) -> CertEntry {
        CertEntry {
            key: dummy_key(),
            server_names: names.iter().map(|s| (*s).to_string()).collect(),
            cert_path: PathBuf::from("x.pem"),
        }
    }

    #[test]
    fn resolves_exact_then_wildcard_then_default() {
        let set = CertSet::new(vec![
            entry(&["a.example.com"]),
            entry(&["b.example.com"]),
            entry(&["*.example.org"]),
        ])
        .expect("set");
        let k = |i: usize| &set.entries()[i].key;
        assert!(Arc::ptr_eq(set.resolve(Some("b.example.com")), k(1)));
        assert!(Arc::ptr_eq(set.resolve(Some("B.Example.COM.")), k(1)));
        assert!(Arc::ptr_eq(set.resolve(Some("x.example.org")), k(2)));
        assert!(Arc::ptr_eq(set.resolve(Some("y.x.example.org")), k(0)));
        assert!(Arc::ptr_eq(set.resolve(Some("example.org")), k(0)));
        assert!(Arc::ptr_eq(set.resolve(None), k(0)));
    }

    #[test]
    fn rejects_empty_bad_duplicate_and_unreachable() {
        assert_eq!(CertSet::new(vec![]).err(), Some(CertSetError::Empty));
        assert!(matches!(
            CertSet::new(vec![entry(&["a..b"])]),
            Err(CertSetError::BadName {
                entry: 0,
                index: 0,
                ..
            })
        ));
        assert!(matches!(
            CertSet::new(vec![entry(&["a.b"]), entry(&["c.d", "a.b"])]),
            Err(CertSetError::Duplicate {
                entry: 1,
                index: 1,
                first: 0,
                ..
            })
        ));
        assert!(matches!(
            CertSet::new(vec![entry(&[]), entry(&[])]),
            Err(CertSetError::Unreachable { entry: 1 })
        ));
        assert!(CertSet::new(vec![entry(&[])]).is_ok());
    }
}
