//! Owns the command line (a contract: tooling outside the repository depends on it).
//!
//! - `sluice -c FILE`: run the gateway with the YAML config `FILE`.
//! - `sluice -t -c FILE`: validate `FILE`, exit 0, or non-zero with `file:line:col: key: message`.
//! - `-d` (daemonize) and `-u` (graceful upgrade: take over the listeners of a running Sluice)
//!   are passed to Pingora.
//! - `sluice reload [-c FILE] [--pid-file PATH]`: send the running Sluice `SIGHUP` (reload
//!   its config), found through the pid file (`server.pid_file` of `FILE`); exit 1 when there
//!   is none or it names a process that is not a Sluice.
//! - `sluice key new --tenant T [--name N]`: print a fresh virtual key (first line) and the
//!   line `key_sha256: <64 hex>` to put in the config; needs no config file.
//! - `sluice usage -c FILE [--since DATE] [--until DATE] [--tenant T] [--model M]
//!   [--format table|json|csv] [--summary] [--limit N]`: print the usage ledger that `FILE`'s
//!   `ledger:` section names (only that section is read). See [`crate::billing::ledger::query`]. With
//!   `ledger.enabled: false` it fails (exit 1) saying that the ledger is disabled.

use clap::{Parser, Subcommand};

/// Command line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: an LLM inference gateway on Pingora"
)]
pub struct Args {
    /// The YAML config file.
    #[arg(
        short = 'c',
        long = "conf",
        alias = "config",
        default_value = "conf/sluice.yaml"
    )]
    pub conf: String,
    /// Validate the config and exit (0 = valid), like `nginx -t`.
    #[arg(short = 't', long = "test")]
    pub test: bool,
    /// Run in the background (Pingora daemon mode; see `server.pid_file`, `server.error_log`).
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Graceful upgrade: take over the listening sockets of the running process (see
    /// `server.upgrade_sock`); then send the old process SIGQUIT yourself (`kill -QUIT <pid>`).
    #[arg(short = 'u', long = "upgrade")]
    pub upgrade: bool,
    /// A tool instead of the gateway (the flags above are then ignored).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Virtual keys.
    Key {
        /// What to do with keys.
        #[command(subcommand)]
        action: KeyAction,
    },
    /// Print the usage ledger (records or per tenant × model sums).
    Usage(UsageArgs),
    /// Reload the running Sluice's config: SIGHUP to the pid in its pid file.
    Reload(ReloadArgs),
}

/// `sluice reload ...`: signal the running process to reload.
#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// The YAML config the running Sluice was started with; its `server.pid_file` names the
    /// pid file (only that key is read).
    #[arg(
        short = 'c',
        long = "conf",
        alias = "config",
        default_value = "conf/sluice.yaml"
    )]
    pub conf: String,
    /// The pid file to read instead of the config's `server.pid_file`.
    #[arg(long)]
    pub pid_file: Option<String>,
}

impl ReloadArgs {
    /// Runs the command: what to print, or an error message.
    ///
    /// # Errors
    /// No readable config or pid file, a stale pid, or a signal that cannot be sent; as
    /// text.
    pub fn run(&self) -> Result<String, String> {
        let pid_file = match &self.pid_file {
            Some(p) => std::path::PathBuf::from(p),
            None => crate::pid_file::configured(std::path::Path::new(&self.conf))?,
        };
        crate::pid_file::send_reload(&pid_file)
    }
}

/// `sluice usage ...`: read the usage ledger.
#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// The YAML config whose `ledger:` section names the ledger (only that section is read).
    #[arg(
        short = 'c',
        long = "conf",
        alias = "config",
        default_value = "conf/sluice.yaml"
    )]
    pub conf: String,
    /// Records at or after this time: `YYYY-MM-DD` (UTC midnight) or RFC 3339.
    #[arg(long, value_parser = crate::billing::ledger::query::parse_date)]
    pub since: Option<i64>,
    /// Records before this time: `YYYY-MM-DD` (UTC midnight) or RFC 3339.
    #[arg(long, value_parser = crate::billing::ledger::query::parse_date)]
    pub until: Option<i64>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this standard model.
    #[arg(long)]
    pub model: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: crate::billing::ledger::query::Format,
    /// Sums per tenant and standard model instead of records.
    #[arg(long)]
    pub summary: bool,
    /// At most this many records: the newest N, printed oldest first.
    #[arg(long)]
    pub limit: Option<u64>,
}

impl UsageArgs {
    /// The filter these flags select.
    pub fn filter(&self) -> crate::billing::ledger::query::Filter {
        crate::billing::ledger::query::Filter {
            since: self.since,
            until: self.until,
            tenant: self.tenant.clone(),
            model: self.model.clone(),
            limit: self.limit,
        }
    }

    /// Runs the command: the formatted output, or an error message.
    ///
    /// # Errors
    /// A config or ledger error, as text.
    pub fn run(&self) -> Result<String, String> {
        use crate::billing::ledger::query;
        let settings = crate::config::Config::load_ledger(std::path::Path::new(&self.conf))
            .map_err(|e| format!("config error: {e}"))?
            .absolute();
        if !settings.enabled {
            return Err(format!(
                "the usage ledger is disabled in {} (ledger.enabled: false): Sluice records no usage, so there is none to show",
                self.conf
            ));
        }
        let filter = self.filter();
        filter.check()?;
        let out = if self.summary {
            query::summary(&settings, &filter).map(|r| query::format_summary(&r, self.format))
        } else {
            query::records(&settings, &filter).map(|r| query::format_records(&r, self.format))
        };
        out.map_err(|e| e.to_string())
    }
}

/// `sluice key ...`.
#[derive(Debug, Subcommand)]
pub enum KeyAction {
    /// Print a fresh random virtual key and its `key_sha256:` line for the config.
    New {
        /// The tenant the key will belong to (`virtual_keys[].tenant`).
        #[arg(long)]
        tenant: String,
        /// A label for logs (`virtual_keys[].name`).
        #[arg(long)]
        name: Option<String>,
    },
}

impl Args {
    /// The options Pingora's `Server` understands.
    pub fn pingora_opt(&self) -> pingora::server::configuration::Opt {
        pingora::server::configuration::Opt {
            upgrade: self.upgrade,
            daemon: self.daemon,
            nocapture: false,
            test: false,
            conf: None,
        }
    }
}

/// Prefix of every generated virtual key (the demo key `sk-sluice-demo-0001` has it too).
pub const KEY_PREFIX: &str = "sk-sluice-";

/// Random bytes in a generated key (192 bits, printed as 48 hex digits).
const KEY_RANDOM_BYTES: usize = 24;

/// A generated virtual key: the secret for the client and what the config stores.
#[derive(Debug)]
pub struct NewKey {
    /// `sk-sluice-<48 hex>`, from the OS CSPRNG.
    pub key: String,
    /// Lowercase hex SHA-256 of `key` (the config's `key_sha256`).
    pub sha256_hex: String,
}

impl NewKey {
    /// A fresh key from the operating system's CSPRNG (`getrandom`).
    ///
    /// # Errors
    /// When the OS random source fails.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; KEY_RANDOM_BYTES];
        getrandom::fill(&mut bytes)?;
        let key = format!("{KEY_PREFIX}{}", hex::encode(bytes));
        let sha256_hex = hex::encode(crate::auth::hash_key(&key));
        Ok(Self { key, sha256_hex })
    }

    /// What `sluice key new` prints on stdout: the key on the first line, then the line
    /// `key_sha256: <64 hex>` (a contract: scripts read both lines).
    pub fn stdout_text(&self) -> String {
        format!("{}\nkey_sha256: {}\n", self.key, self.sha256_hex)
    }

    /// The config entries for the key (printed on stderr as a hint): first the
    /// `tenants:` entry for `tenant` (a key whose tenant is not under `tenants:` is a config
    /// error, `unknown tenant`), then the `virtual_keys:` entry. Each part is a `#` comment
    /// line naming its section, then the entry indented by two spaces, ready to paste under
    /// that section.
    pub fn config_entry(&self, tenant: &str, name: Option<&str>) -> String {
        #[derive(serde::Serialize)]
        struct Entry<'a> {
            key_sha256: &'a str,
            tenant: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<&'a str>,
        }
        #[derive(serde::Serialize)]
        struct NoLimits {}
        let tenants =
            serde_yaml::to_string(&std::collections::BTreeMap::from([(tenant, NoLimits {})]))
                .unwrap_or_default();
        let keys = serde_yaml::to_string(&[Entry {
            key_sha256: &self.sha256_hex,
            tenant,
            name,
        }])
        .unwrap_or_default();
        let mut out = String::from(
            "# add under tenants: in the config, unless it is there (a key of an unknown tenant is rejected):\n",
        );
        indent_into(&mut out, &tenants);
        out.push_str(
            "# add under virtual_keys: in the config (only the hash is stored; the key is shown once):\n",
        );
        indent_into(&mut out, &keys);
        out
    }
}

/// Appends each line of `yaml` to `out`, indented by two spaces.
fn indent_into(out: &mut String, yaml: &str) {
    for line in yaml.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_prefixed_random_hex_and_its_hash_is_the_auth_hash() {
        let a = NewKey::generate().expect("getrandom");
        let b = NewKey::generate().expect("getrandom");
        assert_ne!(a.key, b.key);
        let hex_part = a.key.strip_prefix(KEY_PREFIX).expect("prefix");
        assert_eq!(hex_part.len(), 48);
        assert!(hex_part.bytes().all(|c| c.is_ascii_hexdigit()));
        // sha256("sk-sluice-demo-0001"), computed independently with sha256sum.
        let demo = NewKey {
            key: "sk-sluice-demo-0001".into(),
            sha256_hex: hex::encode(crate::auth::hash_key("sk-sluice-demo-0001")),
        };
        assert_eq!(demo.sha256_hex, DEMO_KEY_SHA256);
        let text = a.stdout_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [a.key.clone(), format!("key_sha256: {}", a.sha256_hex)]
        );
    }

    const DEMO_KEY_SHA256: &str =
        "876389d64ee43161647cb785948a38a8434cad3fc882c9990e90896392b3cab6";

    #[test]
    fn the_config_entry_is_yaml_for_tenants_then_virtual_keys() {
        let k = NewKey::generate().expect("getrandom");
        let entry = k.config_entry("team-a", Some("ci: bot"));
        // Comment line, tenant entry, comment line, key entry: pasted under their sections.
        let (tenants, keys) = entry
            .split_once("\n# add under virtual_keys:")
            .expect("two parts");
        assert!(tenants.starts_with("# add under tenants:"), "{entry}");
        let tenants = format!(
            "tenants:\n{}\n",
            tenants.lines().skip(1).collect::<Vec<_>>().join("\n")
        );
        let keys = format!(
            "virtual_keys:\n{}\n",
            keys.lines().skip(1).collect::<Vec<_>>().join("\n")
        );
        let v: serde_yaml::Value = serde_yaml::from_str(&(tenants + &keys)).expect("yaml");
        assert!(v["tenants"]["team-a"].is_mapping(), "{entry}");
        let key = &v["virtual_keys"][0];
        assert_eq!(key["key_sha256"].as_str(), Some(k.sha256_hex.as_str()));
        assert_eq!(key["tenant"].as_str(), Some("team-a"));
        assert_eq!(key["name"].as_str(), Some("ci: bot"));
    }
}
