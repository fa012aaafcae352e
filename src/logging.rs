//! Owns log output: `env_logger` with `RUST_LOG` (default `info`), formatted as
//! `timestamp level target message` or, with `server.log_format: json`, one JSON object per
//! line (`ts`, `level`, `target`, `msg`; access lines carry their fields at the top level);
//! and the format of an access line's fields ([`Field`], [`format_line`]).

use std::fmt::Write as _;
use std::io::Write;

use crate::config::LogFormat;

/// Log target of access lines (`RUST_LOG=sluice::access=info`).
pub const TARGET: &str = "sluice::access";

/// One access-log value, formatted where the line is written (no string per field).
pub enum Field<'a> {
    /// Text as is (quoted and escaped in text lines unless plain ASCII).
    Text(&'a str),
    /// A count.
    Count(u64),
    /// USD with 9 decimals.
    Usd(f64),
}

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(s) => f.write_str(s),
            Self::Count(n) => f.write_str(itoa::Buffer::new().format(*n)),
            Self::Usd(v) => write!(f, "{v:.9}"),
        }
    }
}

/// One access line of `fields` in `format`: `key=value` pairs (a value that is empty or not
/// plain printable ASCII quoted and escaped, so a client cannot forge or break lines), or a
/// JSON object of strings. Both access logs use it: the LLM endpoints' (`crate::proxy::access_log`) and the
/// passthrough routes' ([`crate::passthrough::log`]).
pub fn format_line(fields: &[(&str, Field<'_>)], format: LogFormat) -> String {
    if format == LogFormat::Json {
        let mut obj = serde_json::Map::new();
        for (k, v) in fields {
            obj.insert((*k).to_string(), serde_json::Value::String(v.to_string()));
        }
        serde_json::Value::Object(obj).to_string()
    } else {
        let mut s = String::with_capacity(384);
        for (i, (k, v)) in fields.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(k);
            s.push('=');
            match v {
                // Values can carry client text (a model name): anything but plain ASCII is
                // quoted and escaped, so a client cannot forge or break log lines.
                Field::Text(v) if v.is_empty() || !v.bytes().all(|b| b.is_ascii_graphic()) => {
                    s.push('"');
                    s.extend(v.chars().flat_map(char::escape_default));
                    s.push('"');
                }
                // Text and counts are pushed as they are (no formatting machinery per
                // field: this runs for every request).
                Field::Text(v) => s.push_str(v),
                Field::Count(n) => s.push_str(itoa::Buffer::new().format(*n)),
                v @ Field::Usd(_) => {
                    let _ = write!(s, "{v}");
                }
            }
        }
        s
    }
}

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
                    Ok(serde_json::Value::Object(fields)) if record.target() == TARGET => {
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
/// its lines would report the previous one (a feedback loop). And says what Pingora's
/// expected waits mean ([`expected_wait`]).
struct NoPingoraTrace(env_logger::Logger);

/// Pingora's target for the graceful upgrade's socket hand-over.
const TRANSFER_FD: &str = "pingora_core::server::transfer_fd";

/// What Sluice logs instead of a record Pingora logs as an error although it is part of
/// the normal course: `sluice -u` polling the upgrade socket (once a second, up to 5 times)
/// before the running process got its SIGQUIT and sent its sockets. Every graceful upgrade
/// logged one `ERROR ... No incoming socket transfer` per second waited; it is an INFO line
/// saying so. Running out of retries is still Pingora's ERROR (`Bootstrap failed`).
fn expected_wait(record: &log::Record<'_>) -> Option<&'static str> {
    (record.level() == log::Level::Error
        && record.target() == TRANSFER_FD
        && record
            .args()
            .to_string()
            .starts_with("No incoming socket transfer"))
    .then_some(
        "graceful upgrade: the running process has not sent its listening sockets yet \
         (send it SIGQUIT: `kill -QUIT <old pid>`); asking again in 1 s, 5 times in all",
    )
}

impl log::Log for NoPingoraTrace {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        let t = m.target();
        let noisy = (m.level() == log::Level::Trace && t.starts_with("pingora"))
            || (m.level() >= log::Level::Debug
                && (t.starts_with("notify") || t.starts_with("inotify")));
        !noisy && self.0.enabled(m)
    }

    fn log(&self, record: &log::Record<'_>) {
        if let Some(text) = expected_wait(record) {
            let meta = log::Metadata::builder()
                .level(log::Level::Info)
                .target(record.target())
                .build();
            if self.enabled(&meta) {
                self.0.log(
                    &log::Record::builder()
                        .metadata(meta)
                        .module_path(record.module_path())
                        .file(record.file())
                        .line(record.line())
                        .args(format_args!("{text}"))
                        .build(),
                );
            }
            return;
        }
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}
