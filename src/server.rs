//! Owns process assembly: the Pingora `Server` with its `ServerConf` derived from our YAML,
//! the proxy service (the [`Gateway`]) on its plain listener (HTTP/1, h2c) and optional TLS
//! listener (ALPN h2 and http/1.1, certificates by SNI from [`crate::tls`]), the admin service, and background services (hot
//! reload, rate-limit sync, active health probes, passthrough health checks, graceful stream shutdown, the usage
//! ledger's writer, the response store's worker). The built-in
//! demo provider needs no service: it is reached in process (see [`crate::providers::demo`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pingora::apps::HttpServerOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig, TcpSocketOptions};
use pingora::protocols::TcpKeepalive;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::backpressure::Admission;
use crate::cli::Args;
use crate::config::Config;
use crate::edge::connection::DownstreamApp;
use crate::listeners::ListenerSet;
use crate::live::ConfigHandle;
use crate::proxy::Gateway;
use crate::reload::Reloader;
use crate::routing::probe::HealthProber;
use crate::shutdown::StreamShutdown;
use crate::tls::CertResolver;

/// L4 read buffer of a downstream connection, bytes (0 = reads go straight to the socket).
const DOWNSTREAM_L4_READ_BUFFER: usize = 0;

/// Bytes one read of an HTTP/1.x request body takes, 16 KiB like nginx's
/// `client_body_buffer_size` on 64-bit platforms. Pingora's default, 64 KiB, is a buffer sized
/// to what is left of the body, filled, and (as released) kept for the connection's life: with a
/// 32 KiB prompt that was 32 KiB of RSS per held stream. The patched pingora-core also
/// releases the buffer when the body ends (`benches/README.md`, fifth round).
const DOWNSTREAM_BODY_READ_SIZE: usize = 16 * 1024;

/// Errors assembling the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Pingora refused its configuration.
    #[error("cannot start the server: {0}")]
    Pingora(String),
    /// A listener cannot be bound (an address in use, a privileged port).
    #[error(transparent)]
    Listen(#[from] crate::listeners::ListenError),
    /// The usage ledger (or the response store in its database) cannot be opened.
    #[error("cannot open the usage ledger: {0}")]
    Ledger(#[from] crate::billing::ledger::LedgerError),
}

/// Opens the usage ledger and the response store in its database (each when enabled), so
/// that a bad database stops the start; their background services.
///
/// # Errors
/// [`StartError::Ledger`] when either cannot be opened.
fn open_databases(
    cfg: &Config,
) -> Result<
    (
        Option<crate::billing::ledger::LedgerService>,
        Option<crate::conversation::StoreService>,
    ),
    StartError,
> {
    // Relative ledger paths resolve against the working directory of this start (not the
    // one `-d` moves to); the ledger opens now so that a bad one stops the start.
    let ledger = if cfg.ledger.enabled {
        Some(crate::billing::ledger::install(
            &cfg.ledger.clone().absolute(),
        )?)
    } else {
        log::info!("usage ledger: disabled (ledger.enabled: false); no usage records are kept");
        None
    };
    // The response store lives in the ledger's database (also when only the store is on).
    let response_store = if cfg.response_store.enabled {
        Some(crate::conversation::install(
            &cfg.response_store,
            &cfg.ledger.clone().absolute().backend,
        )?)
    } else {
        log::info!("response store: disabled (response_store.enabled: false); store, previous_response_id and item_reference are refused");
        None
    };
    Ok((ledger, response_store))
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
        work_stealing: s.work_stealing,
        ..ServerConf::default()
    };
    // Open streams get `shutdown_grace_ms` (plus a second to write their error events:
    // Pingora drops every task when its grace period ends, so round up, never down).
    let grace_ms = u64::try_from(s.shutdown_grace.as_millis()).unwrap_or(u64::MAX);
    conf.grace_period_seconds = Some(grace_ms.div_ceil(1000).saturating_add(1));
    conf.graceful_shutdown_timeout_seconds = Some(2);
    conf
}

/// A downstream listener (plain TCP; the TLS listener's handshake is Sluice's, see
/// [`crate::tls`]). Its L4 read buffer is off: Pingora's default 64 KiB buffer lives
/// as long as the connection (~8 KiB of RSS per held stream in `benches/streams_memory.rs`),
/// and request heads and bodies are read through Pingora's own buffers anyway. TCP keepalive
/// plus `TCP_USER_TIMEOUT` (the startup `downstream_write_timeout_ms`) find a client that
/// vanished without a FIN or RST: its unacknowledged heartbeats end the connection, which
/// cancels the upstream.
fn downstream_listener(addr: &str, write_timeout: Duration) -> ListenerConfig {
    let mut sock = TcpSocketOptions::default();
    sock.tcp_keepalive = Some(TcpKeepalive {
        idle: Duration::from_secs(60),
        interval: Duration::from_secs(10),
        count: 6,
        #[cfg(target_os = "linux")]
        user_timeout: write_timeout,
    });
    let _ = write_timeout;
    ListenerConfig::tcp(addr.to_string())
        .tcp_socket_options(sock)
        .l4_buffer(L4BufferSettings::default().read(DOWNSTREAM_L4_READ_BUFFER))
}

/// The proxy's HTTP server options: h2c with prior knowledge on the plain listener (the TLS
/// one negotiates by ALPN), idle HTTP/2 connections closed like idle HTTP/1 ones, and
/// HTTP/1.x request bodies read [`DOWNSTREAM_BODY_READ_SIZE`] bytes at a time (the
/// `h1_body_read_size` option of the patched pingora-core in `vendor/`).
fn http_server_options() -> HttpServerOptions {
    let mut o = HttpServerOptions::default();
    o.h2c = true;
    o.h2_idle_timeout = Some(Duration::from_secs(crate::proxy::DOWNSTREAM_KEEPALIVE_S));
    o.h1_body_read_size = Some(DOWNSTREAM_BODY_READ_SIZE);
    o
}

/// Builds the server from `cfg`, loaded by [`crate::reload::load`] from the files whose
/// fingerprint is `loaded_from`; `run_forever` it next.
///
/// # Errors
/// [`StartError`] when a listener cannot be bound (first, before anything else is opened),
/// or Pingora refuses its configuration, or a database cannot be opened.
#[expect(
    clippy::too_many_lines,
    reason = "the assembly of every service, in start order, read top to bottom"
)]
pub fn build(cfg: Config, loaded_from: [u8; 32], args: &Args) -> Result<Server, StartError> {
    if let Err(e) = crate::reload::catch_early_sighup() {
        log::warn!("cannot install the early SIGHUP handler: {e}");
    }
    // First: an address in use stops the start here, with its key and address, instead of
    // Pingora retrying it for 30 s in a service thread that then dies (`crate::listeners`).
    let listeners = ListenerSet::bind(&cfg.server, args.upgrade)?;
    let conf = server_conf(&cfg, args);
    let mut server = Server::new_with_opt_and_conf(Some(args.pingora_opt()), conf);
    server.bootstrap();

    let listen = cfg.server.listen.clone();
    let tls_listen = cfg.server.tls_listen.clone();
    let certificates = cfg
        .server
        .tls
        .clone()
        .map(|set| Arc::new(CertResolver::new(set)));
    let admin_listen = cfg.server.admin_listen.clone();
    // Absolute, so that reloads (and the watcher) still find it after `-d` changed the
    // working directory.
    let path = std::path::absolute(&args.conf).unwrap_or_else(|_| PathBuf::from(&args.conf));
    let pid_file = std::path::absolute(&cfg.server.pid_file)
        .unwrap_or_else(|_| PathBuf::from(&cfg.server.pid_file));
    let (ledger, response_store) = open_databases(&cfg)?;
    let admission = Arc::new(Admission::new(&cfg));
    let cfg_write_timeout = cfg.server.downstream_write_timeout;
    crate::metrics::init_config_series(&cfg);
    // The tokenizer table metering counts with is loaded now, once, before the listeners
    // open (and before a daemon fork): never on a request's path.
    // Building it reads tiktoken-rs's full table (~45 MB, dropped at once): its freed pages
    // go back to the OS here, while nothing else runs.
    let t0 = std::time::Instant::now();
    let table_bytes = crate::protocol::tokens::load();
    crate::backpressure::trim::trim();
    log::info!(
        "tokenizer loaded (o200k_base) in {} ms, {} KiB",
        t0.elapsed().as_millis(),
        table_bytes / 1024
    );
    let handle = Arc::new(ConfigHandle::new(cfg));

    // Pingora's proxy behind Sluice's own connection loop (head deadline, pipelining).
    let gateway = Gateway::new(handle.clone(), admission.clone());
    let passthrough = gateway.passthrough.clone();
    let mut http = pingora::proxy::http_proxy(&server.configuration, gateway);
    http.server_options = Some(http_server_options());
    // The TLS port is a plain TCP listener too: Sluice's connection app does the TLS
    // handshake itself (its deadline, its log level, after the per-IP cap; `crate::tls`).
    let tls = match (&tls_listen, &certificates) {
        (Some(addr), Some(resolver)) => {
            let at = addr
                .parse()
                .map_err(|e| StartError::Pingora(format!("server.tls_listen `{addr}`: {e}")))?;
            Some(
                crate::tls::TlsListener::new(at, resolver.clone())
                    .map_err(|e| StartError::Pingora(e.to_string()))?,
            )
        }
        _ => None,
    };
    let app = DownstreamApp::new(http, handle.clone()).with_tls(tls);
    let mut proxy = Service::new("sluice proxy".to_string(), app);
    proxy.add_listener(downstream_listener(&listen, cfg_write_timeout));
    if let Some(addr) = &tls_listen {
        proxy.add_listener(downstream_listener(addr, cfg_write_timeout));
    }
    let mut proxy_addrs = vec![listen.as_str()];
    proxy_addrs.extend(tls_listen.as_deref());
    let proxy = listeners.hold(proxy, &proxy_addrs);

    let mut admin = Service::new(
        "sluice admin".to_string(),
        AdminApp::new(handle.clone(), listeners.clone()),
    );
    admin.add_tcp(&admin_listen);
    admin.threads = Some(1);
    let admin = listeners.hold(admin, &[admin_listen.as_str()]);

    if let Some(ledger) = ledger {
        server.add_service(background_service("sluice usage ledger", ledger));
    }
    if let Some(store) = response_store {
        server.add_service(background_service("sluice response store", store));
    }
    server.add_service(background_service(
        "sluice rate limits",
        admission.limits_service(),
    ));
    server.add_service(background_service(
        "sluice config reload",
        Reloader::new(path, loaded_from, handle.clone(), admission)
            .with_certificates(certificates)
            .with_passthrough(passthrough.clone()),
    ));
    server.add_service(background_service(
        "sluice passthrough health checks",
        crate::passthrough::health::HealthChecks::new(passthrough),
    ));
    server.add_service(background_service(
        "sluice health probes",
        HealthProber::new(handle.clone()),
    ));
    server.add_service(background_service(
        "sluice stream shutdown",
        StreamShutdown::new(handle)
            .on_exit(crate::billing::ledger::flush_at_exit)
            .on_exit(crate::conversation::flush_at_exit)
            .on_exit(move || crate::pid_file::remove_if_own(&pid_file)),
    ));
    server.add_service(background_service(
        "sluice heap trim",
        crate::backpressure::trim::HeapTrimmer,
    ));
    server.add_service(proxy);
    server.add_service(admin);
    let shown = |key: &str, configured: &str| {
        listeners
            .local_addr(key)
            .map_or_else(|| configured.to_owned(), |a| a.to_string())
    };
    let (listen, admin_listen) = (
        shown("server.listen", &listen),
        shown("server.admin_listen", &admin_listen),
    );
    let how = if args.upgrade {
        " (sockets handed over by the previous process)"
    } else {
        ""
    };
    match &tls_listen {
        Some(tls) => {
            let tls = shown("server.tls_listen", tls);
            log::info!("sluice listening on {listen} and {tls} (TLS) (admin {admin_listen}){how}");
        }
        None => log::info!("sluice listening on {listen} (admin {admin_listen}){how}"),
    }
    Ok(server)
}
