//! Owns loading TLS certificates as immutable data: a listener's certificate chains and keys
//! (checked to match) into a [`CertSet`] by server name, and a provider's `ca_file` into
//! [`UpstreamCa`]. Config validation calls it at load; the handshake machinery that serves a
//! set is the parent module's.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
