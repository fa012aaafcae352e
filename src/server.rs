//! Owns process assembly: the Pingora `Server` with its `ServerConf` derived from our YAML,
//! the proxy service (the [`Gateway`]), the admin service, and background services (hot
//! reload, the demo provider, graceful stream shutdown).

use std::path::PathBuf;
use std::sync::Arc;

use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::backpressure::Admission;
use crate::cli::Args;
use crate::config::reload::Reloader;
use crate::config::{Config, ConfigHandle};
use crate::providers::demo::DemoProvider;
use crate::proxy::Gateway;
use crate::shutdown::StreamShutdown;

/// Errors assembling the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The demo provider's loopback socket could not be bound.
    #[error("cannot start the demo provider: {0}")]
    Demo(std::io::Error),
    /// Pingora refused its configuration.
    #[error("cannot start the server: {0}")]
    Pingora(String),
}

/// Pingora's `ServerConf` from our `server:` section.
fn server_conf(cfg: &Config, args: &Args) -> ServerConf {
    let s = &cfg.server;
    let mut conf = ServerConf {
        daemon: args.daemon,
        pid_file: s.pid_file.clone(),
        upgrade_sock: s.upgrade_sock.clone(),
        error_log: s.error_log.clone(),
        threads: s.threads,
        ..ServerConf::default()
    };
    // Open streams get `shutdown_grace_ms` (plus a second to write their error events).
    conf.grace_period_seconds = Some(s.shutdown_grace.as_secs() + 1);
    conf.graceful_shutdown_timeout_seconds = Some(2);
    conf
}

/// Builds the server; `run_forever` it next.
///
/// # Errors
/// [`StartError`] when a listener or the demo provider cannot be set up.
pub fn build(cfg: Config, args: &Args) -> Result<Server, StartError> {
    let conf = server_conf(&cfg, args);
    let mut server = Server::new_with_opt_and_conf(Some(args.pingora_opt()), conf);
    server.bootstrap();

    let listen = cfg.server.listen.clone();
    let admin_listen = cfg.server.admin_listen.clone();
    let path = PathBuf::from(&args.conf);
    let admission = Arc::new(Admission::new(&cfg));
    let handle = Arc::new(ConfigHandle::new(cfg));

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(handle.clone(), admission.clone()),
        "sluice proxy",
    );
    proxy.add_tcp(&listen);

    let mut admin = Service::new("sluice admin".to_string(), AdminApp::new(handle.clone()));
    admin.add_tcp(&admin_listen);
    admin.threads = Some(1);

    let demo = DemoProvider::bind().map_err(StartError::Demo)?;
    server.add_service(background_service("sluice demo provider", demo));
    server.add_service(background_service(
        "sluice config reload",
        Reloader::new(path, handle.clone(), admission),
    ));
    server.add_service(background_service(
        "sluice stream shutdown",
        StreamShutdown::new(handle),
    ));
    server.add_service(proxy);
    server.add_service(admin);
    log::info!("sluice listening on {listen} (admin {admin_listen})");
    Ok(server)
}
