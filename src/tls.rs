//! Owns downstream TLS: loading the certificates of `server.tls.certificates` (PEM chain and
//! key, checked to match), choosing one per handshake by SNI ([`CertResolver`], a rustls
//! `ResolvesServerCert` behind an `ArcSwap`, so a hot reload hands new handshakes the
//! renewed certificates while open connections keep theirs), and the Pingora listener
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
//! Upstream, it loads a provider's `ca_file` ([`UpstreamCa`]): the roots that provider's
//! certificate is verified against instead of the system store (a private provider).

use std::collections::HashMap;
use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora::listeners::tls::{Acceptor, TlsSettings};
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Largest PEM file read, bytes (a chain is a few KiB; this stops `/dev/zero` & co).
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Which file of a certificate entry a [`CertError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertFile {
    /// The PEM certificate chain (`cert_path`).
    Cert,
    /// The PEM private key (`key_path`).
    Key,
}

/// Why a certificate entry cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The file cannot be read (missing, unreadable, not a regular file, too large).
    #[error("cannot read {}: {reason}", path.display())]
    Read {
        /// Which file.
        file: CertFile,
        /// Its path.
        path: PathBuf,
        /// The I/O error or the limit passed.
        reason: String,
    },
    /// The file is no PEM of the expected kind (no `CERTIFICATE` block, no private key
    /// block, or a block that does not decode).
    #[error("{}: {reason}", path.display())]
    Pem {
        /// Which file.
        file: CertFile,
        /// Its path.
        path: PathBuf,
        /// What is missing or broken.
        reason: String,
    },
    /// The key is of a kind rustls cannot sign with, or does not belong to the certificate.
    #[error("{} does not fit {}: {reason}", key.display(), cert.display())]
    Mismatch {
        /// The certificate chain file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        reason: String,
    },
}

impl CertError {
    /// The file the error is about (the key file for a mismatch).
    pub fn file(&self) -> CertFile {
        match self {
            Self::Read { file, .. } | Self::Pem { file, .. } => *file,
            Self::Mismatch { .. } => CertFile::Key,
        }
    }
}

fn read_pem(file: CertFile, path: &Path) -> Result<Vec<u8>, CertError> {
    let read_err = |reason: String| CertError::Read {
        file,
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| read_err(e.to_string()))?;
    if !meta.is_file() {
        return Err(read_err("not a regular file".into()));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(read_err(format!("larger than {MAX_PEM_BYTES} bytes")));
    }
    std::fs::read(path).map_err(|e| read_err(e.to_string()))
}

/// Loads one certificate: the PEM chain at `cert_path` (end entity first) and the PEM key
/// at `key_path` (PKCS#8, PKCS#1 RSA or SEC1 EC), checked to belong together.
///
/// # Errors
/// A [`CertError`] naming the file at fault.
pub fn load_certified_key(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, CertError> {
    let pem_err = |file: CertFile, path: &Path, reason: String| CertError::Pem {
        file,
        path: path.to_path_buf(),
        reason,
    };
    let cert_pem = read_pem(CertFile::Cert, cert_path)?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(cert_pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(CertFile::Cert, cert_path, format!("bad PEM: {e}")))?;
    if chain.is_empty() {
        return Err(pem_err(
            CertFile::Cert,
            cert_path,
            "no PEM `CERTIFICATE` block".into(),
        ));
    }
    let key_pem = read_pem(CertFile::Key, key_path)?;
    let key = rustls_pemfile::private_key(&mut BufReader::new(key_pem.as_slice()))
        .map_err(|e| pem_err(CertFile::Key, key_path, format!("bad PEM: {e}")))?
        .ok_or_else(|| {
            pem_err(
                CertFile::Key,
                key_path,
                "no PEM private key block (PKCS#8, RSA or EC)".into(),
            )
        })?;
    let provider = rustls::crypto::ring::default_provider();
    let certified =
        CertifiedKey::from_der(chain, key, &provider).map_err(|e| CertError::Mismatch {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
            reason: match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    "the private key is not the certificate's (its public key differs)".into()
                }
                e => e.to_string(),
            },
        })?;
    Ok(certified)
}

/// The trust anchors of one provider's `ca_file`, in the form Pingora's rustls connector
/// takes per peer (`PeerOptions::ca`).
#[derive(Clone)]
pub struct UpstreamCa {
    /// The certificates.
    pub roots: Arc<pingora::protocols::tls::CaType>,
    /// A hash of their DER bytes: Pingora's connection pool key ignores `PeerOptions::ca`, so
    /// this goes into the peer's `group_key` (a connection verified against other roots is
    /// never reused for this provider).
    pub fingerprint: u64,
}

impl std::fmt::Debug for UpstreamCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpstreamCa({} certificates)", self.roots.len())
    }
}

/// Loads the PEM certificates of a `ca_file`: each must be usable as a rustls trust anchor
/// (what the connector makes of it on every handshake).
///
/// # Errors
/// A [`CertError`] (about [`CertFile::Cert`]) for an unreadable file, no certificate, or one
/// that is no valid X.509 certificate.
pub fn load_ca_file(path: &Path) -> Result<UpstreamCa, CertError> {
    use pingora::utils::tls::WrappedX509;
    use x509_parser::prelude::FromDer;
    let pem_err = |reason: String| CertError::Pem {
        file: CertFile::Cert,
        path: path.to_path_buf(),
        reason,
    };
    let pem = read_pem(CertFile::Cert, path)?;
    let ders = rustls_pemfile::certs(&mut BufReader::new(pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(format!("bad PEM: {e}")))?;
    if ders.is_empty() {
        return Err(pem_err("no PEM `CERTIFICATE` block".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    let mut out = Vec::with_capacity(ders.len());
    let mut hasher = std::hash::DefaultHasher::new();
    for (i, der) in ders.into_iter().enumerate() {
        std::hash::Hash::hash(der.as_ref(), &mut hasher);
        roots
            .add(der.clone())
            .map_err(|e| pem_err(format!("certificate {} is no trust anchor: {e}", i + 1)))?;
        let wrapped = WrappedX509::try_new(der.to_vec(), |raw| {
            x509_parser::certificate::X509Certificate::from_der(raw).map(|(_, c)| c)
        })
        .map_err(|e| pem_err(format!("certificate {} does not parse: {e}", i + 1)))?;
        out.push(wrapped);
    }
    Ok(UpstreamCa {
        roots: Arc::from(out),
        fingerprint: std::hash::Hasher::finish(&hasher),
    })
}

/// One certificate as configured: the loaded key pair and the names it serves.
#[derive(Debug)]
pub struct CertEntry {
    /// Certificate chain and signing key.
    pub key: Arc<CertifiedKey>,
    /// `server_names` as written (lowercased).
    pub server_names: Vec<String>,
    /// Where the chain was read from (for logs).
    pub cert_path: PathBuf,
}

/// The certificates of `server.tls.certificates`, ready to resolve by SNI. Never empty.
#[derive(Debug)]
pub struct CertSet {
    entries: Vec<CertEntry>,
    /// Exact name → index into `entries`.
    exact: HashMap<String, usize>,
    /// Wildcard suffix (`.example.com` for `*.example.com`) → index into `entries`.
    wildcard: HashMap<String, usize>,
}

/// Why a list of entries cannot make a [`CertSet`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertSetError {
    /// No entry at all.
    #[error("at least one certificate is needed")]
    Empty,
    /// A server name that is no DNS name (or a wildcard other than a leading `*.`).
    #[error("`{name}` is not a DNS name (or `*.` and a DNS name)")]
    BadName {
        /// Index of the entry.
        entry: usize,
        /// Index of the name in its `server_names`.
        index: usize,
        /// The name.
        name: String,
    },
    /// The same server name in two entries.
    #[error("`{name}` is already served by certificates[{first}]")]
    Duplicate {
        /// Index of the entry.
        entry: usize,
        /// Index of the name in its `server_names`.
        index: usize,
        /// The name.
        name: String,
        /// The entry that has it first.
        first: usize,
    },
    /// An entry after the first with no server name: it could never be chosen.
    #[error("only the first certificate (the default) may have no server_names: this one would never be chosen")]
    Unreachable {
        /// Index of the entry.
        entry: usize,
    },
}

/// Whether `name` is a DNS host name (letters, digits, `-`, dots between labels).
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

impl CertSet {
    /// A set from entries in file order (the first is the default).
    ///
    /// # Errors
    /// A [`CertSetError`] for an empty list, a bad or duplicate name, or an entry after the
    /// first without names.
    pub fn new(entries: Vec<CertEntry>) -> Result<Self, CertSetError> {
        if entries.is_empty() {
            return Err(CertSetError::Empty);
        }
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for (e, entry) in entries.iter().enumerate() {
            if e > 0 && entry.server_names.is_empty() {
                return Err(CertSetError::Unreachable { entry: e });
            }
            for (i, name) in entry.server_names.iter().enumerate() {
                let (table, key) = match name.strip_prefix("*.") {
                    Some(rest) if is_dns_name(rest) => (&mut wildcard, format!(".{rest}")),
                    None if is_dns_name(name) => (&mut exact, name.clone()),
                    _ => {
                        return Err(CertSetError::BadName {
                            entry: e,
                            index: i,
                            name: name.clone(),
                        })
                    }
                };
                if let Some(&first) = table.get(&key) {
                    return Err(CertSetError::Duplicate {
                        entry: e,
                        index: i,
                        name: name.clone(),
                        first,
                    });
                }
                table.insert(key, e);
            }
        }
        Ok(Self {
            entries,
            exact,
            wildcard,
        })
    }

    /// The entries in file order.
    pub fn entries(&self) -> &[CertEntry] {
        &self.entries
    }

    /// The certificate for `sni`: exact name, then wildcard, then the first entry.
    pub fn resolve(&self, sni: Option<&str>) -> &Arc<CertifiedKey> {
        let idx = sni.and_then(|name| {
            let lower;
            let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                lower = name.to_ascii_lowercase();
                lower.as_str()
            } else {
                name
            };
            let name = name.strip_suffix('.').unwrap_or(name);
            self.exact.get(name).copied().or_else(|| {
                let dot = name.find('.')?;
                self.wildcard.get(&name[dot..]).copied()
            })
        });
        &self.entries[idx.unwrap_or(0)].key
    }
}

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
