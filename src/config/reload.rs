//! Owns hot reload: a Pingora background service that reloads the config on `SIGHUP` or when a
//! YAML file in the config's folder changes (debounced). Reload = load → validate → swap; a
//! bad file keeps the old snapshot and logs `file:line:col: key.path: message`. In-flight
//! requests keep the snapshot they pinned. Listener, thread and daemon settings need a
//! restart (or Pingora's graceful upgrade); a reload that changes them says so.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::{Config, ConfigHandle};
use crate::backpressure::Admission;
use crate::metrics::metrics;

/// Quiet period after a file event before reloading (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(250);

/// The reload service.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    handle: Arc<ConfigHandle>,
    admission: Arc<Admission>,
}

impl Reloader {
    /// Reloads `path` into `handle`.
    pub fn new(path: PathBuf, handle: Arc<ConfigHandle>, admission: Arc<Admission>) -> Self {
        Self {
            path,
            handle,
            admission,
        }
    }

    /// Loads, validates and swaps in the config; on error keeps the old one.
    ///
    /// # Errors
    /// The [`super::ConfigError`] of the rejected file (already logged and counted).
    pub fn reload(&self) -> Result<(), super::ConfigError> {
        match Config::load(&self.path) {
            Ok(new) => {
                let old = self.handle.snapshot();
                let restart: Vec<&str> = [
                    ("server.listen", old.server.listen != new.server.listen),
                    (
                        "server.admin_listen",
                        old.server.admin_listen != new.server.admin_listen,
                    ),
                    ("server.threads", old.server.threads != new.server.threads),
                ]
                .into_iter()
                .filter_map(|(k, changed)| changed.then_some(k))
                .collect();
                if !restart.is_empty() {
                    log::warn!(
                        "config reloaded, but {} only take effect after a restart or graceful upgrade",
                        restart.join(", ")
                    );
                }
                self.admission.reconfigure(&new);
                log::info!(
                    "config reloaded file={} models={} providers={} virtual_keys={}",
                    self.path.display(),
                    new.models.len(),
                    new.providers.len(),
                    new.keys.len()
                );
                self.handle.store(new);
                metrics()
                    .config_reloads_total
                    .with_label_values(&["ok"])
                    .inc();
                Ok(())
            }
            Err(e) => {
                log::error!("config reload rejected, keeping the previous config: {e}");
                metrics()
                    .config_reloads_total
                    .with_label_values(&["error"])
                    .inc();
                Err(e)
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
        let watch_dir = self
            .path
            .parent()
            .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf);
        let file_tx = tx.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                let yaml = ev
                    .paths
                    .iter()
                    .any(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"));
                if yaml && !matches!(ev.kind, notify::EventKind::Access(_)) {
                    let _ = file_tx.try_send(());
                }
            }
        });
        let _watcher = match watcher {
            Ok(mut w) => {
                use notify::Watcher;
                match w.watch(&watch_dir, notify::RecursiveMode::Recursive) {
                    Ok(()) => Some(w),
                    Err(e) => {
                        log::warn!(
                            "cannot watch {} for changes ({e}); SIGHUP still reloads",
                            watch_dir.display()
                        );
                        None
                    }
                }
            }
            Err(e) => {
                log::warn!("file watching unavailable ({e}); SIGHUP still reloads");
                None
            }
        };
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                log::warn!("cannot install the SIGHUP handler: {e}");
                None
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    log::info!("SIGHUP: reloading {}", self.path.display());
                    let _ = self.reload();
                }
                Some(()) = rx.recv() => {
                    // Debounce: wait until events stop for a moment.
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep(DEBOUNCE) => break,
                            Some(()) = rx.recv() => {}
                        }
                    }
                    log::info!("config file changed: reloading {}", self.path.display());
                    let _ = self.reload();
                }
            }
        }
    }
}
