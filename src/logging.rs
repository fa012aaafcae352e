//! Owns log output: `env_logger` with `RUST_LOG` (default `info`), formatted as
//! `timestamp level target message` or, with `server.log_format: json`, one JSON object per
//! line (`ts`, `level`, `target`, `msg`; access lines carry their fields at the top level).
//!
//! Pingora 0.9.1 logs every failed or timed-out downstream TLS handshake at ERROR
//! (`pingora_core::services::listening`: `Downstream handshake error from ADDR: ...`,
//! `Downstream handshake timeout`), with no option or hook to change it. On port 443 most of
//! those are scanners, bots and plain-HTTP clients, a flood at the level operators alert on.
//! Sluice counts them in `sluice_tls_handshake_failures_total{reason}` and logs them at DEBUG
//! instead; every other record of that module (e.g. `Accept() failed`) keeps its level.

use std::io::Write;

use crate::config::LogFormat;

/// Installs the global logger. Safe to call once; later calls are ignored.
pub fn init(format: LogFormat) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    match format {
        LogFormat::Text => {
            b.format(|buf, record| {
                writeln!(
                    buf,
                    "{} {:<5} {} {}",
                    buf.timestamp_millis(),
                    record.level(),
                    record.target(),
                    record.args()
                )
            });
        }
        LogFormat::Json => {
            b.format(|buf, record| {
                let msg = record.args().to_string();
                let mut obj = serde_json::Map::new();
                obj.insert("ts".into(), buf.timestamp_millis().to_string().into());
                obj.insert("level".into(), record.level().as_str().into());
                obj.insert("target".into(), record.target().into());
                match serde_json::from_str::<serde_json::Value>(&msg) {
                    Ok(serde_json::Value::Object(fields))
                        if record.target() == crate::proxy::access_log::TARGET =>
                    {
                        obj.extend(fields);
                    }
                    _ => {
                        obj.insert("msg".into(), msg.into());
                    }
                }
                writeln!(buf, "{}", serde_json::Value::Object(obj))
            });
        }
    }
    let logger = b.build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(NoPingoraTrace(logger))).is_ok() {
        log::set_max_level(max);
    }
}

/// The module whose ERROR records about downstream TLS handshakes are demoted.
const LISTENING_TARGET: &str = "pingora_core::services::listening";

/// What a record of [`LISTENING_TARGET`] says, when it is about a failed downstream
/// handshake: `Some("error")` or `Some("timeout")` (the label of
/// `sluice_tls_handshake_failures_total`), else `None`. The messages are Pingora 0.9.1's
/// (`pingora-core/src/services/listening.rs`, `run_endpoint`).
fn handshake_failure(message: &str) -> Option<&'static str> {
    if message.starts_with("Downstream handshake timeout") {
        Some("timeout")
    } else if message.starts_with("Downstream handshake error") {
        Some("error")
    } else {
        None
    }
}

/// Drops Pingora's TRACE records: they print whole request heads, and with them the provider
/// key Sluice injects (`RUST_LOG=trace` must not put a secret in the log). Also drops the file
/// watcher's DEBUG/TRACE records: with the log written into the watched config folder each of
/// its lines would report the previous one (a feedback loop).
struct NoPingoraTrace(env_logger::Logger);

impl log::Log for NoPingoraTrace {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        let t = m.target();
        let noisy = (m.level() == log::Level::Trace && t.starts_with("pingora"))
            || (m.level() >= log::Level::Debug
                && (t.starts_with("notify") || t.starts_with("inotify")));
        !noisy && self.0.enabled(m)
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.level() == log::Level::Error && record.target() == LISTENING_TARGET {
            // Rare apart from handshake failures; formatting the message is the price of
            // telling them apart (Pingora passes it with arguments).
            let message = record.args().to_string();
            if let Some(reason) = handshake_failure(&message) {
                crate::metrics::metrics()
                    .tls_handshake_failures_total
                    .with_label_values(&[reason])
                    .inc();
                let meta = log::Metadata::builder()
                    .level(log::Level::Debug)
                    .target(record.target())
                    .build();
                if self.enabled(&meta) {
                    self.0.log(
                        &log::Record::builder()
                            .metadata(meta)
                            .args(format_args!("{message}"))
                            .module_path(record.module_path())
                            .file(record.file())
                            .line(record.line())
                            .build(),
                    );
                }
                return;
            }
        }
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::handshake_failure;

    #[test]
    fn handshake_failures_are_told_from_other_listener_records() {
        assert_eq!(
            handshake_failure(
                "Downstream handshake error from 127.0.0.1:4711: TLSHandshakeFailure context: ..."
            ),
            Some("error")
        );
        assert_eq!(
            handshake_failure("Downstream handshake error: x"),
            Some("error")
        );
        assert_eq!(
            handshake_failure("Downstream handshake timeout"),
            Some("timeout")
        );
        assert_eq!(
            handshake_failure("Accept() failed Too many open files"),
            None
        );
        assert_eq!(handshake_failure("shutdown_signal error x"), None);
    }
}
