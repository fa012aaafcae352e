//! Validation of a `kind: vertex` provider's own settings: `project`, `region`,
//! `credentials_file_env` (the service-account key file, read and checked here) and
//! `token_url`, into its [`VertexAccount`] and the [`TokenCache`] its requests share.
//! Errors name the key (relative to `providers.<id>`) for the caller to locate.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Endpoint;
use crate::providers::google_auth::{ServiceAccount, ServiceAccountFetcher};
use crate::providers::token::TokenCache;
use crate::providers::vertex::{self, VertexAccount};
use crate::secret::Secret;

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
    pub fn first_set(&self) -> Option<&'static str> {
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

/// A validated Vertex provider's parts.
pub(super) struct VertexParts {
    pub account: VertexAccount,
    pub bearer: Arc<TokenCache>,
    /// The default endpoint for the region (used when `base_url` is not set).
    pub default_base_url: String,
}

/// Validates `section` of provider `id`; `parse_url` is the config's URL parser, `timeouts`
/// `(connect, first_byte)` bound each token fetch.
///
/// # Errors
/// `(key, message)`: `key` is `""` for the provider itself or a member name.
pub(super) fn build(
    id: &str,
    section: VertexSection,
    parse_url: impl Fn(&str) -> Result<Endpoint, String>,
    timeouts: (Duration, Duration),
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
    if !vertex::valid_name(&project) {
        return Err((
            "project",
            "must be a Google Cloud project id (lowercase letters, digits, `-`)".into(),
        ));
    }
    if !vertex::valid_name(&region) {
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
    let digest = hex::encode(h.finalize());
    let (connect, first_byte) = timeouts;
    let bearer = TokenCache::shared(&digest, || {
        TokenCache::new(
            id,
            Box::new(ServiceAccountFetcher::new(
                account, url, endpoint, token_path, connect,
            )),
            connect + first_byte,
        )
    });
    Ok(VertexParts {
        default_base_url: vertex::default_base_url(&region),
        account: VertexAccount { project, region },
        bearer,
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
