//! `sluice-mock-upstream`: a standalone mock model provider (OpenAI Chat Completions and
//! Anthropic Messages wire formats) for Sluice's tests; see `sluice_mock_upstream`.
//!
//! Prints exactly one line `listening on ADDR` to stdout after binding, logs to stderr
//! (`RUST_LOG`), and runs until SIGINT/SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use sluice_mock_upstream::{serve, Behavior, MockState};

/// Command line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "sluice-mock-upstream",
    about = "Mock LLM provider for Sluice tests"
)]
struct Args {
    /// Address to listen on (port 0 picks an ephemeral port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Process-wide default behaviour as JSON (see `sluice_mock_upstream::Behavior`).
    #[arg(long)]
    behavior: Option<String>,
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                log::warn!("cannot install SIGTERM handler: {e}");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .init();
    let args = Args::parse();
    let behavior = match args.behavior.as_deref() {
        Some(json) => match Behavior::from_json(json) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("invalid --behavior JSON: {e}");
                return ExitCode::from(2);
            }
        },
        None => Behavior::default(),
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            return ExitCode::from(1);
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cannot read local address: {e}");
            return ExitCode::from(1);
        }
    };
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "listening on {addr}")
            .and_then(|_| out.flush())
            .is_err()
        {
            log::warn!("cannot write the listening line to stdout");
        }
    }
    log::info!("sluice-mock-upstream listening on {addr}");
    let state = std::sync::Arc::new(MockState::new(behavior));
    tokio::select! {
        _ = serve(listener, state) => {}
        _ = shutdown_signal() => {
            log::info!("sluice-mock-upstream: shutting down");
        }
    }
    ExitCode::SUCCESS
}
