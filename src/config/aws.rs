//! Owns a Bedrock provider's AWS account as configuration data: its region ([`AwsAccount`])
//! and where its AWS credentials come from: the standard environment
//! chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`) or,
//! with `aws_profile: NAME`, that profile of the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`). Read at config load (and
//! reload): a changed file or environment is picked up by `SIGHUP`, never on the request
//! path. The secret parts are [`Secret`]s, never printed.
//!
//! Reference: <https://docs.aws.amazon.com/sdkref/latest/guide/file-format.html> (the
//! INI-style shared credentials file: `[name]` sections, `key = value` lines, `#`/`;`
//! comments) and <https://docs.aws.amazon.com/sdkref/latest/guide/environment-variables.html>.
//! The signer built from them is the provider registry's (`providers::bedrock::sigv4`).

use std::path::{Path, PathBuf};

use crate::secret::Secret;

/// One set of AWS credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    /// The access key id (`AKIA…` long-term, `ASIA…` temporary); not secret.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: Secret,
    /// The session token of temporary credentials, sent as `x-amz-security-token`.
    pub session_token: Option<Secret>,
}

/// A `kind: bedrock` provider's account: its region and the credentials read at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsAccount {
    /// `providers.<id>.region`, checked with [`valid_region`].
    pub region: String,
    /// The credentials of `aws_profile` or of the environment chain.
    pub credentials: AwsCredentials,
}

/// The runtime endpoint of `region`: `https://bedrock-runtime.{region}.amazonaws.com`.
pub fn default_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// Whether `region` looks like an AWS region (`us-east-2`, `eu-central-1`,
/// `us-gov-west-1`): lower-case letters, digits and `-`, starting with a letter. It goes
/// into the host name and the signature's scope as is.
pub fn valid_region(region: &str) -> bool {
    region.len() <= 32
        && region.starts_with(|c: char| c.is_ascii_lowercase())
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Why no credentials could be read; the message names the variable, file or profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CredentialsError(pub String);

/// The credentials of the environment chain, read with `var` (the process environment in
/// production, a map in tests).
///
/// # Errors
/// When `AWS_ACCESS_KEY_ID` or `AWS_SECRET_ACCESS_KEY` is unset or empty.
pub fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Result<AwsCredentials, CredentialsError> {
    let get = |name: &str| var(name).filter(|v| !v.is_empty());
    match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => Ok(AwsCredentials {
            access_key_id: id,
            secret_access_key: Secret::new(secret),
            session_token: get("AWS_SESSION_TOKEN").map(Secret::new),
        }),
        _ => Err(CredentialsError(
            "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials), or aws_profile".into(),
        )),
    }
}

/// The shared credentials file: `AWS_SHARED_CREDENTIALS_FILE`, else
/// `$HOME/.aws/credentials`.
pub fn shared_file(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(f) = var("AWS_SHARED_CREDENTIALS_FILE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(f));
    }
    var("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".aws").join("credentials"))
}

/// Profile `profile` of the shared credentials file at `path`.
///
/// # Errors
/// When the file cannot be read, has no such profile, or the profile lacks
/// `aws_access_key_id` or `aws_secret_access_key`.
pub fn from_profile(path: &Path, profile: &str) -> Result<AwsCredentials, CredentialsError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CredentialsError(format!(
            "cannot read the shared credentials file {}: {e}",
            path.display()
        ))
    })?;
    parse_profile(&text, profile).map_err(|m| {
        CredentialsError(format!(
            "{m} in the shared credentials file {}",
            path.display()
        ))
    })
}

/// Profile `profile` of a shared credentials file's text.
///
/// # Errors
/// A message when the profile or one of its two keys is missing.
pub fn parse_profile(text: &str, profile: &str) -> Result<AwsCredentials, String> {
    let mut in_section = false;
    let mut found = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // The credentials file names profiles bare (`[dev]`); `[profile dev]` is the
            // config file's spelling, accepted too.
            let name = name.trim();
            let name = name.strip_prefix("profile ").map_or(name, str::trim);
            in_section = name == profile;
            found |= in_section;
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "aws_access_key_id" => id = Some(v),
                "aws_secret_access_key" => secret = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
    }
    if !found {
        return Err(format!("no profile [{profile}]"));
    }
    match (
        id.filter(|v| !v.is_empty()),
        secret.filter(|v| !v.is_empty()),
    ) {
        (Some(access_key_id), Some(secret)) => Ok(AwsCredentials {
            access_key_id,
            secret_access_key: Secret::new(secret),
            session_token: token.filter(|t| !t.is_empty()).map(Secret::new),
        }),
        _ => Err(format!(
            "profile [{profile}] needs aws_access_key_id and aws_secret_access_key"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# comment\n[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = s3cr3t\n\n[temp]\naws_access_key_id=ASIATEMP\naws_secret_access_key=t3mp\naws_session_token = tok/en==\n[profile other]\naws_access_key_id = AKIAOTHER\n";

    #[test]
    fn profiles_parse_with_tokens_and_never_print_secrets() {
        let d = parse_profile(FILE, "default").unwrap();
        assert_eq!(d.access_key_id, "AKIADEFAULT");
        assert_eq!(d.secret_access_key.expose(), "s3cr3t");
        assert!(d.session_token.is_none());
        let t = parse_profile(FILE, "temp").unwrap();
        assert_eq!(
            t.session_token.as_ref().map(Secret::expose),
            Some("tok/en==")
        );
        assert!(!format!("{t:?}").contains("t3mp"));
        assert!(!format!("{t:?}").contains("tok/en"));
        assert_eq!(
            parse_profile(FILE, "other").unwrap_err(),
            "profile [other] needs aws_access_key_id and aws_secret_access_key"
        );
        assert_eq!(
            parse_profile(FILE, "nope").unwrap_err(),
            "no profile [nope]"
        );
    }

    #[test]
    fn the_environment_chain_needs_both_keys() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        let c = from_env(&env(&[
            ("AWS_ACCESS_KEY_ID", "AKIA1"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_SESSION_TOKEN", "t"),
        ]))
        .unwrap();
        assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("t"));
        assert!(from_env(&env(&[("AWS_ACCESS_KEY_ID", "AKIA1")])).is_err());
        assert!(from_env(&env(&[
            ("AWS_ACCESS_KEY_ID", "AKIA1"),
            ("AWS_SECRET_ACCESS_KEY", "")
        ]))
        .is_err());
        assert_eq!(
            shared_file(&env(&[("HOME", "/home/u")])),
            Some(PathBuf::from("/home/u/.aws/credentials"))
        );
        assert_eq!(
            shared_file(&env(&[
                ("HOME", "/home/u"),
                ("AWS_SHARED_CREDENTIALS_FILE", "/etc/c")
            ])),
            Some(PathBuf::from("/etc/c"))
        );
    }
}
