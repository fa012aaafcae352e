//! Owns a `kind: vertex` provider's own settings as data: `project` and `region`
//! ([`VertexAccount`]), `credentials_file_env` (the service-account key file, read and
//! checked here, [`ServiceAccount`]) and `token_url` ([`TokenSource`]). The token cache built
//! from them is the provider registry's (`providers::token`). Errors name the key
//! (relative to `providers.<id>`) for the caller to locate.

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Endpoint;
use crate::secret::Secret;

/// Where a Vertex AI provider lives: its Google Cloud project and region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VertexAccount {
    /// `providers.<id>.project`: the Google Cloud project id (or number).
    pub project: String,
    /// `providers.<id>.region`: the Vertex AI location, e.g. `us-central1`, or `global`.
    pub region: String,
}

/// The default `base_url` for `region`.
pub fn default_base_url(region: &str) -> String {
    if region == "global" {
        "https://aiplatform.googleapis.com/v1".to_string()
    } else {
        format!("https://{region}-aiplatform.googleapis.com/v1")
    }
}

/// Whether `s` can be a project id or a region: non-empty, at most 63 characters of ASCII
/// lowercase letters, digits and `-` (it goes into the host name and the URL as is).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A service-account key, as read from its JSON key file.
#[derive(Clone)]
pub struct ServiceAccount {
    /// `client_email`: the account (the JWT's `iss`).
    pub client_email: String,
    /// `private_key_id`: the key's id (the JWT header's `kid`).
    pub private_key_id: String,
    /// `private_key`: the PEM RSA key (never printed).
    pub private_key: Secret,
    /// `token_uri`: where assertions are exchanged for tokens, if the file names one.
    pub token_uri: Option<String>,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .field("private_key", &self.private_key)
            .field("token_uri", &self.token_uri)
            .finish()
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    ty: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl ServiceAccount {
    /// Parses a key file's contents (`text`, held as a secret because it is one).
    ///
    /// # Errors
    /// A message naming what is wrong (not JSON, not `type: service_account`, a member
    /// missing, a private key that is no PEM RSA key); never the key itself.
    pub fn parse(text: &Secret) -> Result<ServiceAccount, String> {
        let f: KeyFile = serde_json::from_str(text.expose()).map_err(|e| {
            // serde's message may quote input: keep only its position.
            format!(
                "is not a service-account JSON key (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        match f.ty.as_deref() {
            Some("service_account") => {}
            Some(other) => {
                return Err(format!(
                    "has `type: {other}`; Vertex AI needs a service-account key (`type: service_account`)"
                ))
            }
            None => return Err("has no `type` (expected `service_account`)".into()),
        }
        let need = |v: Option<String>, name: &str| {
            v.filter(|s| !s.is_empty())
                .ok_or_else(|| format!("has no `{name}`"))
        };
        let account = ServiceAccount {
            client_email: need(f.client_email, "client_email")?,
            private_key_id: need(f.private_key_id, "private_key_id")?,
            private_key: Secret::new(need(f.private_key, "private_key")?),
            token_uri: f.token_uri.filter(|s| !s.is_empty()),
        };
        account.encoding_key()?;
        Ok(account)
    }

    /// The key as a signing key.
    ///
    /// # Errors
    /// If the private key is no PEM RSA key.
    pub(crate) fn encoding_key(&self) -> Result<jsonwebtoken::EncodingKey, String> {
        jsonwebtoken::EncodingKey::from_rsa_pem(self.private_key.expose().as_bytes())
            .map_err(|e| format!("has a `private_key` that is no PEM RSA private key ({e})"))
    }
}

/// Largest key file read, bytes (a service-account key is about 2.3 KiB).
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// What a Vertex provider's section says, as written.
pub(super) struct VertexSection {
    pub project: Option<String>,
    pub region: Option<String>,
    pub credentials_file_env: Option<String>,
    pub token_url: Option<String>,
}

impl VertexSection {
    /// Whether any Vertex-only key is set (an error on another kind).
    pub(super) fn first_set(&self) -> Option<&'static str> {
        [
            ("project", self.project.is_some()),
            ("region", self.region.is_some()),
            ("credentials_file_env", self.credentials_file_env.is_some()),
            ("token_url", self.token_url.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
    }
}

/// Where a Vertex AI provider's service-account key is exchanged for access tokens: the
/// key read at load and the token endpoint. Data only; the registry's token cache uses it.
#[derive(Debug, Clone)]
pub struct TokenSource {
    /// The service-account key.
    pub account: ServiceAccount,
    /// The token URL as written (`token_url`, else the key file's `token_uri`).
    pub url: String,
    /// The token URL's address.
    pub endpoint: Endpoint,
    /// The token URL's path and query (`/` when it has none).
    pub path: String,
    /// Names the account: a digest of the provider id, the key file and the token URL. The
    /// same key at the same endpoint keeps its cached token across reloads.
    pub cache_key: String,
}

/// A validated Vertex provider's parts.
pub(super) struct VertexParts {
    pub account: VertexAccount,
    pub token: TokenSource,
    /// The default endpoint for the region (used when `base_url` is not set).
    pub default_base_url: String,
}

/// Validates `section` of provider `id`; `parse_url` is the config's URL parser.
///
/// # Errors
/// `(key, message)`: `key` is `""` for the provider itself or a member name.
pub(super) fn build(
    id: &str,
    section: VertexSection,
    parse_url: impl Fn(&str) -> Result<Endpoint, String>,
) -> Result<VertexParts, (&'static str, String)> {
    let VertexSection {
        project,
        region,
        credentials_file_env,
        token_url,
    } = section;
    let required = |v: Option<String>, name: &'static str, example: &str| {
        v.ok_or((
            "",
            format!("{name} is required for kind vertex (e.g. {example})"),
        ))
    };
    let project = required(project, "project", "my-project")?;
    let region = required(region, "region", "us-central1")?;
    let var = required(
        credentials_file_env,
        "credentials_file_env",
        "GOOGLE_APPLICATION_CREDENTIALS",
    )?;
    if !valid_name(&project) {
        return Err((
            "project",
            "must be a Google Cloud project id (lowercase letters, digits, `-`)".into(),
        ));
    }
    if !valid_name(&region) {
        return Err((
            "region",
            "must be a Vertex AI region such as us-central1 (lowercase letters, digits, `-`)"
                .into(),
        ));
    }
    let path = match std::env::var_os(&var) {
        Some(p) if !p.is_empty() => std::path::PathBuf::from(p),
        _ => {
            return Err((
                "credentials_file_env",
                format!("environment variable `{var}` is not set (it names the service-account JSON key file)"),
            ))
        }
    };
    let text = read_key_file(&path).map_err(|m| {
        (
            "credentials_file_env",
            format!("`{var}` names `{}`, which {m}", path.display()),
        )
    })?;
    let account = ServiceAccount::parse(&text).map_err(|m| {
        (
            "credentials_file_env",
            format!("`{var}` names `{}`, which {m}", path.display()),
        )
    })?;
    let (url, key) = match (token_url, &account.token_uri) {
        (Some(u), _) => (u, "token_url"),
        (None, Some(u)) => (u.clone(), "credentials_file_env"),
        (None, None) => {
            return Err((
                "token_url",
                format!(
                    "the key file `{}` has no `token_uri`: set token_url",
                    path.display()
                ),
            ))
        }
    };
    let endpoint = parse_url(&url).map_err(|m| (key, format!("token URL {m}")))?;
    let token_path = if endpoint.base_path.is_empty() {
        "/".to_string()
    } else {
        endpoint.base_path.clone()
    };
    // One cache per account: the same key at the same endpoint keeps its token on reload.
    let mut h = Sha256::new();
    for part in [id.as_bytes(), text.expose().as_bytes(), url.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    let cache_key = hex::encode(h.finalize());
    Ok(VertexParts {
        default_base_url: default_base_url(&region),
        account: VertexAccount { project, region },
        token: TokenSource {
            account,
            url,
            endpoint,
            path: token_path,
            cache_key,
        },
    })
}

/// Reads the key file (bounded), as a secret.
fn read_key_file(path: &std::path::Path) -> Result<Secret, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut text = String::new();
    f.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot be read ({e})"))?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!(
            "is larger than {MAX_KEY_FILE_BYTES} bytes (no service-account key is)"
        ));
    }
    Ok(Secret::new(text))
}
