//! `server.tls_listen` and `server.tls:` (a contract: the key names are relied on outside
//! the repo): the schema, and its validation into a loaded [`CertSet`]. Every load (start,
//! `sluice -t`, each hot reload) reads the certificate and key files again and checks that
//! they parse and belong together, so a renewed certificate is picked up by a reload and a
//! broken one is refused like any other config error (file, line and key named).
//!
//! Relative `cert_path`/`key_path` resolve against the folder of the config file (as
//! `include:` entries do), whatever the working directory.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::error::ConfigError;
use crate::tls::certs::{load_certified_key, CertEntry, CertFile, CertSet, CertSetError};

/// `server.tls:`: the downstream TLS listener's certificates.
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Certificates chosen by SNI; the first is the default (no SNI, or a name no entry
    /// lists).
    #[serde(default)]
    pub certificates: Vec<CertificateSection>,
}

/// One entry of `server.tls.certificates`.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct CertificateSection {
    /// PEM certificate chain, end-entity certificate first.
    pub cert_path: String,
    /// PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of the end-entity certificate.
    pub key_path: String,
    /// Host names (SNI) this certificate serves, exact (`api.example.com`) or one-label
    /// wildcards (`*.example.com`). May be empty for the first entry only.
    #[serde(default)]
    pub server_names: Vec<String>,
}

/// Whether two listener addresses would take the same port (equal IPs, or one unspecified).
pub(super) fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Validates `tls_listen` and `tls` (of the main file, whose folder is `base`) against the
/// other listeners, and loads the certificates. `err` locates a message at a key of the
/// main file.
pub(super) fn tls_settings(
    tls_listen: Option<&str>,
    tls: Option<&TlsSection>,
    others: &[(&str, &str)],
    base: &Path,
    err: &impl Fn(&str, String) -> ConfigError,
) -> Result<Option<Arc<CertSet>>, ConfigError> {
    let certificates = tls.map_or(&[][..], |t| t.certificates.as_slice());
    let Some(listen) = tls_listen else {
        if tls.is_some() {
            return Err(err(
                "server.tls",
                "certificates are configured but `server.tls_listen` is not set (add \
                 `tls_listen: 0.0.0.0:443` to serve them)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    let Ok(addr) = listen.parse::<SocketAddr>() else {
        return Err(err(
            "server.tls_listen",
            format!("`{listen}` is not an address like 0.0.0.0:8443"),
        ));
    };
    for (key, other) in others {
        if other.parse().is_ok_and(|o| overlaps(addr, o)) {
            return Err(err(
                "server.tls_listen",
                format!("`{listen}` overlaps `{key}` ({other}): each listener needs its own port"),
            ));
        }
    }
    if certificates.is_empty() {
        return Err(err(
            "server.tls_listen",
            "a TLS listener needs `server.tls.certificates` (at least one cert_path, key_path)"
                .into(),
        ));
    }
    let mut entries = Vec::with_capacity(certificates.len());
    for (i, c) in certificates.iter().enumerate() {
        let at = format!("server.tls.certificates[{i}]");
        let cert_path = base.join(&c.cert_path);
        let key_path = base.join(&c.key_path);
        let key = load_certified_key(&cert_path, &key_path).map_err(|e| {
            let field = match e.file() {
                CertFile::Cert => "cert_path",
                CertFile::Key => "key_path",
            };
            err(&format!("{at}.{field}"), e.to_string())
        })?;
        entries.push(CertEntry {
            key: Arc::new(key),
            server_names: c
                .server_names
                .iter()
                .map(|n| n.to_ascii_lowercase())
                .collect(),
            cert_path,
        });
    }
    CertSet::new(entries)
        .map(|s| Some(Arc::new(s)))
        .map_err(|e| {
            let key = match &e {
                CertSetError::Empty => "server.tls.certificates".to_string(),
                CertSetError::BadName { entry, index, .. }
                | CertSetError::Duplicate { entry, index, .. } => {
                    format!("server.tls.certificates[{entry}].server_names[{index}]")
                }
                CertSetError::Unreachable { entry } => {
                    format!("server.tls.certificates[{entry}].server_names")
                }
            };
            err(&key, e.to_string())
        })
}
