//! The `sluice` binary: parse the command line, load and validate the config, then run the
//! Pingora server (or, with `-t`, only validate; or run a tool subcommand such as
//! `sluice key new` or `sluice usage`).

use std::process::ExitCode;

use clap::Parser;
use sluice::cli::{Args, Command, KeyAction, NewKey};

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Key {
        action: KeyAction::New { tenant, name },
    }) = &args.command
    {
        return match NewKey::generate() {
            Ok(k) => {
                print!("{}", k.stdout_text());
                eprint!("{}", k.config_entry(tenant, name.as_deref()));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: cannot read the OS random source: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Some(Command::Reload(reload)) = &args.command {
        return report(reload.run());
    }
    if let Some(Command::Usage(usage)) = &args.command {
        return report(usage.run());
    }
    // Before the config is read: the default global cap is derived from the raised limit.
    let nofile = sluice::fd_limit::raise_nofile_limit();
    // With the fingerprint of the files it was read from: the reloader compares against it.
    let (loaded_from, cfg) = sluice::reload::load(std::path::Path::new(&args.conf));
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: config error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.test {
        for w in cfg.warnings() {
            eprintln!("sluice: warning: {w}");
        }
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
    for w in cfg.warnings() {
        log::warn!("{w}");
    }
    log::info!(
        "open-file limit {}; at most {} concurrent upstream requests",
        nofile.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        cfg.server.max_concurrent_upstream_requests
    );
    let pid_file = cfg.server.pid_file.clone();
    match sluice::server::build(cfg, loaded_from, &args) {
        Ok(server) => {
            // With -d Pingora writes it after the fork; in the foreground Sluice does, so
            // that `sluice reload` finds this process (`sluice::pid_file`).
            if !args.daemon {
                if let Err(e) = sluice::pid_file::write_own(std::path::Path::new(&pid_file)) {
                    log::warn!("cannot write the pid file {pid_file} (server.pid_file): {e}; `sluice reload` will not find this process");
                }
            }
            server.run_forever()
        }
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// A tool subcommand's end: its output on stdout and success, or its error on stderr and
/// exit status 1.
fn report(outcome: Result<String, String>) -> ExitCode {
    match outcome {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::from(1)
        }
    }
}
