//! Owns the command line (a contract: tooling outside the repository depends on it).
//!
//! - `sluice -c FILE`: run the gateway with the YAML config `FILE`.
//! - `sluice -t -c FILE`: validate `FILE`, exit 0, or non-zero with `file:line:col: key: message`.
//! - `-d` (daemonize) and `-u` (graceful upgrade: take over the listeners of a running Sluice)
//!   are passed to Pingora.

use clap::Parser;

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
