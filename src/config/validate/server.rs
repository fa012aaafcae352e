//! Owns the validation of `server:`: listeners (which must not overlap), TLS, body and
//! buffer limits, timeouts, the admin token, edge limits and the server-wide retry policy,
//! into [`ServerSettings`].

use std::path::Path;

use super::{ms, Sources};
use crate::config::error::ConfigError;
use crate::config::schema::ServerSection;
use crate::config::{HopTimeouts, ServerSettings};
use crate::secret::Secret;

/// Shortest accepted admin token, characters.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// `server.resume_linger_bytes` when not set (or `resume_buffer_bytes`, if smaller): 64 KiB,
/// more than a client's socket buffers usually hold unread when its connection dies.
const DEFAULT_RESUME_LINGER_BYTES: usize = 64 << 10;

/// A located error in the main file: `(key path, message)`.
type MainErr<'a> = &'a dyn Fn(&str, String) -> ConfigError;

/// `server:` → [`ServerSettings`], checked in file order of concern: admin token,
/// listeners, TLS, limits, edge, threads.
///
/// # Errors
/// The first problem, located in the main file.
pub(super) fn server_settings(
    server: ServerSection,
    sources: &Sources,
    main_err: MainErr<'_>,
) -> Result<ServerSettings, ConfigError> {
    let admin_token = admin_token(&server, main_err)?;
    check_listeners(&server, main_err)?;
    let tls = crate::config::tls::tls_settings(
        server.tls_listen.as_deref(),
        server.tls.as_ref(),
        &[
            ("server.listen", &server.listen),
            ("server.admin_listen", &server.admin_listen),
        ],
        sources.files[0]
            .0
            .parent()
            .unwrap_or_else(|| Path::new(".")),
        &main_err,
    )?;
    check_limits(&server, main_err)?;
    let edge = crate::config::edge::edge_settings(
        &crate::config::edge::EdgeSection {
            max_request_header_bytes: server.max_request_header_bytes,
            max_request_headers: server.max_request_headers,
            max_uri_bytes: server.max_uri_bytes,
            per_ip: server.per_ip.as_ref(),
            trusted_proxies: &server.trusted_proxies,
        },
        &main_err,
    )?;
    let threads = server.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if threads == 0 {
        return Err(main_err("server.threads", "must be greater than 0".into()));
    }
    let defaults = HopTimeouts {
        connect: ms(server.connect_timeout_ms),
        first_byte: ms(server
            .first_byte_timeout_ms
            .unwrap_or(crate::config::schema::DEFAULT_FIRST_BYTE_TIMEOUT_MS)),
        // A `first_byte_timeout_ms` set before the non-stream key existed keeps holding for
        // both shapes.
        first_byte_non_stream: ms(server
            .non_stream_first_byte_timeout_ms
            .or(server.first_byte_timeout_ms)
            .unwrap_or(crate::config::schema::DEFAULT_NON_STREAM_FIRST_BYTE_TIMEOUT_MS)),
        first_event: ms(server.first_event_timeout_ms),
        idle: ms(server.idle_timeout_ms),
        heartbeat: ms(server.heartbeat_interval_ms),
    };
    Ok(ServerSettings {
        listen: server.listen,
        tls_listen: server.tls_listen,
        tls,
        admin_listen: server.admin_listen,
        threads,
        work_stealing: server.work_stealing,
        log_format: server.log_format,
        max_request_body_bytes: server.max_request_body_bytes,
        max_response_body_bytes: server.max_response_body_bytes,
        default_timeouts: defaults,
        downstream_write_timeout: ms(server.downstream_write_timeout_ms.max(1)),
        max_buffered_bytes_per_stream: server.max_buffered_bytes_per_stream,
        max_event_bytes: server.max_event_bytes,
        shutdown_grace: ms(server.shutdown_grace_ms),
        max_stream_duration: server.max_stream_duration_ms.map(ms),
        max_concurrent_upstream_requests: server.max_concurrent_upstream_requests,
        queue_size: server.queue_size,
        queue_timeout: ms(server.queue_timeout_ms),
        rate_limit_window: ms(server.rate_limit_window_ms),
        admin_token,
        emit_route_headers: server.emit_route_headers,
        watch_config: server.watch_config,
        pid_file: server.pid_file,
        upgrade_sock: server.upgrade_sock,
        error_log: server.error_log,
        max_buffered_request_bytes: server.max_buffered_request_bytes,
        metrics_max_series_per_family: server.metrics_max_series_per_family,
        header_read_timeout: ms(server.header_read_timeout_ms),
        body_read_timeout: ms(server.body_read_timeout_ms),
        retry: crate::config::RetryPolicy::from_section(&server.retry),
        edge,
        resume_grace: ms(server.resume_grace_ms),
        resume_buffer_bytes: server.resume_buffer_bytes,
        resume_linger_bytes: server
            .resume_linger_bytes
            .unwrap_or(DEFAULT_RESUME_LINGER_BYTES.min(server.resume_buffer_bytes)),
        replica_id: server
            .replica_id
            .clone()
            .unwrap_or_else(|| random_replica_id().to_string()),
        responses_websocket: server.responses_websocket,
        responses_websocket_max_sessions: server.responses_websocket_max_sessions,
    })
}

/// The replica tag of a config without `server.replica_id`: 8 random hex digits drawn once
/// per process, so reloads keep the stream ids already handed out valid.
fn random_replica_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| format!("{:08x}", fastrand::u32(..)))
}

/// The admin token from the variable `server.admin_token_env` names (`None`: no key set).
fn admin_token(
    server: &ServerSection,
    main_err: MainErr<'_>,
) -> Result<Option<Secret>, ConfigError> {
    Ok(match &server.admin_token_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(v) if v.chars().count() >= MIN_ADMIN_TOKEN_CHARS => Some(Secret::new(v)),
            Ok(v) if !v.is_empty() => {
                return Err(main_err(
                    "server.admin_token_env",
                    format!(
                        "the admin token in `{var}` is too short ({} characters; at least {MIN_ADMIN_TOKEN_CHARS})",
                        v.chars().count()
                    ),
                ))
            }
            _ => {
                return Err(main_err(
                    "server.admin_token_env",
                    format!("environment variable `{var}` is not set"),
                ))
            }
        },
    })
}

/// `listen` and `admin_listen` are addresses, and not the same one.
fn check_listeners(server: &ServerSection, main_err: MainErr<'_>) -> Result<(), ConfigError> {
    for (k, v) in [
        ("server.listen", &server.listen),
        ("server.admin_listen", &server.admin_listen),
    ] {
        if v.parse::<std::net::SocketAddr>().is_err() {
            return Err(main_err(
                k,
                format!("`{v}` is not an address like 127.0.0.1:8080"),
            ));
        }
    }
    // Both listeners are bound with SO_REUSEPORT, so the same address twice binds without
    // error and the kernel then splits connections between the proxy and the admin
    // service: half the API calls would get the admin's 404.
    if let (Ok(l), Ok(a)) = (
        server.listen.parse::<std::net::SocketAddr>(),
        server.admin_listen.parse::<std::net::SocketAddr>(),
    ) {
        let overlap = l.port() == a.port()
            && l.port() != 0
            && (l.ip() == a.ip() || l.ip().is_unspecified() || a.ip().is_unspecified());
        if overlap {
            return Err(main_err(
                "server.admin_listen",
                format!(
                    "`{a}` overlaps `server.listen` ({l}): the proxy and the admin service \
                     need different ports"
                ),
            ));
        }
    }
    Ok(())
}

/// The body, buffer, event and rate limits and the read timeouts are in range.
fn check_limits(server: &ServerSection, main_err: MainErr<'_>) -> Result<(), ConfigError> {
    if server.max_request_body_bytes == 0 {
        return Err(main_err(
            "server.max_request_body_bytes",
            "must be greater than 0".into(),
        ));
    }
    if server.max_buffered_bytes_per_stream < 1024 {
        return Err(main_err(
            "server.max_buffered_bytes_per_stream",
            "must be at least 1024".into(),
        ));
    }
    if !(1..=3_600_000).contains(&server.resume_grace_ms) {
        return Err(main_err(
            "server.resume_grace_ms",
            "must be between 1 and 3600000 (an hour)".into(),
        ));
    }
    if server.resume_buffer_bytes < 1024 {
        return Err(main_err(
            "server.resume_buffer_bytes",
            "must be at least 1024".into(),
        ));
    }
    if server.responses_websocket_max_sessions == 0 {
        return Err(main_err(
            "server.responses_websocket_max_sessions",
            "must be at least 1 (server.responses_websocket: false turns the mode off)".into(),
        ));
    }
    if server
        .resume_linger_bytes
        .is_some_and(|b| b > server.resume_buffer_bytes)
    {
        return Err(main_err(
            "server.resume_linger_bytes",
            format!(
                "must be at most server.resume_buffer_bytes ({})",
                server.resume_buffer_bytes
            ),
        ));
    }
    if let Some(r) = &server.replica_id {
        if r.is_empty()
            || r.len() > 32
            || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(main_err(
                "server.replica_id",
                format!("`{r}` is not 1 to 32 characters of A-Z, a-z, 0-9 and `-`"),
            ));
        }
    }
    if server.max_event_bytes < 1024 {
        return Err(main_err(
            "server.max_event_bytes",
            "must be at least 1024".into(),
        ));
    }
    if server.rate_limit_window_ms == 0 {
        return Err(main_err(
            "server.rate_limit_window_ms",
            "must be greater than 0".into(),
        ));
    }
    if server.max_concurrent_upstream_requests == 0 {
        return Err(main_err(
            "server.max_concurrent_upstream_requests",
            "must be greater than 0".into(),
        ));
    }
    let copies = crate::config::COPIES_PER_BODY_BYTE;
    if server.max_buffered_request_bytes / copies < server.max_request_body_bytes {
        return Err(main_err(
            "server.max_buffered_request_bytes",
            format!(
                "must be at least {copies} x server.max_request_body_bytes ({}): a body of the allowed size counts {copies} times and must fit",
                server.max_request_body_bytes
            ),
        ));
    }
    for (k, v) in [
        (
            "server.header_read_timeout_ms",
            server.header_read_timeout_ms,
        ),
        ("server.body_read_timeout_ms", server.body_read_timeout_ms),
    ] {
        if v == 0 {
            return Err(main_err(k, "must be greater than 0".into()));
        }
    }
    Ok(())
}
