//! The `sluice` binary: parse the command line, load and validate the config, then run the
//! Pingora server (or, with `-t`, only validate).

use std::process::ExitCode;

use clap::Parser;
use sluice::cli::Args;
use sluice::config::Config;

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match Config::load(std::path::Path::new(&args.conf)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: config error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.test {
        println!(
            "sluice: config {} is valid ({} models, {} providers, {} virtual keys)",
            args.conf,
            cfg.models.len(),
            cfg.providers.len(),
            cfg.keys.len()
        );
        return ExitCode::SUCCESS;
    }
    sluice::logging::init(cfg.server.log_format);
    match sluice::server::build(cfg, &args) {
        Ok(server) => server.run_forever(),
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    }
}
