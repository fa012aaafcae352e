//! Owns log output: `env_logger` with `RUST_LOG` (default `info`), formatted as
//! `timestamp level target message` or, with `server.log_format: json`, one JSON object per
//! line (`ts`, `level`, `target`, `msg`; access lines carry their fields at the top level).

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
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}
