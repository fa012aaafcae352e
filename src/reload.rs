//! Owns hot reload: a Pingora background service that reloads the config on `SIGHUP` or when
//! the config file or one of its includes changes (debounced). Reload = load → validate →
//! swap; a bad file keeps the old snapshot and logs `file:line:col: key.path: message`.
//! In-flight requests keep the snapshot they pinned. Listener, thread and daemon settings need
//! a restart (or Pingora's graceful upgrade); a reload that changes them says so (a warning)
//! and keeps serving on the old listeners. The TLS certificates and keys are re-read by every
//! reload (they are inputs of the config, hashed and watched like its includes) and handed
//! to the TLS listener's resolver: new handshakes get them, open connections keep theirs.
//!
//! What is watched: the folders that hold the config file and each included file, plus each
//! included folder, not recursively (notify/inotify). A change event there only triggers a
//! check: the config's inputs (the main file and every file its `include:` resolves to, by
//! path and content) are hashed with SHA-256, and the config is reloaded only when that hash
//! differs from the one of the last reload attempt. So an unrelated file in the same folder
//! never reloads, and one edit seen twice (by the watcher and by a `SIGHUP`, or as several
//! editor writes) is one reload. A `SIGHUP` with unchanged inputs is logged and skipped.
//! `server.watch_config: false` leaves reloads to `SIGHUP`.
//!
//! It sits above [`crate::config`] (which only loads and validates): a reload also resizes
//! admission ([`crate::backpressure`]), swaps the passthrough table ([`crate::passthrough`],
//! whose unchanged routes keep their upstreams' health) and re-exports the config's metric
//! series, so config itself depends on none of them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::backpressure::Admission;
use crate::config::{expand_include, Config, ConfigError};
use crate::live::ConfigHandle;
use crate::metrics::metrics;
use crate::tls::CertResolver;

/// Quiet period after a file event before reloading (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(250);

/// Longest wait from the first file event to the reload check, however busy the folder.
const DEBOUNCE_MAX: Duration = Duration::from_millis(1000);

/// How many times [`load`] reads the config while its inputs keep changing under it.
const LOAD_TRIES: u32 = 5;

/// The config's inputs on disk: a fingerprint of what the config is made of and the folders
/// whose changes may alter it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    /// SHA-256 over the path and content (or read error) of the main file and of every file
    /// its `include:` entries resolve to, in load order.
    pub fingerprint: [u8; 32],
    /// Folders to watch (not recursively): those of the main file and of every included
    /// file (as named and, for symlinks, where they point), and every included folder.
    pub dirs: BTreeSet<PathBuf>,
}

/// The folder of `file` (`.` for a bare file name).
fn folder_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Adds the folder of `file`, and the folder of its symlink target when that differs.
fn add_folders(dirs: &mut BTreeSet<PathBuf>, file: &Path) {
    dirs.insert(folder_of(file));
    if let Ok(real) = std::fs::canonicalize(file) {
        dirs.insert(folder_of(&real));
    }
}

fn hash_file(h: &mut Sha256, file: &Path) -> Option<Vec<u8>> {
    h.update(file.as_os_str().as_encoded_bytes());
    h.update([0]);
    match std::fs::read(file) {
        Ok(bytes) => {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
            Some(bytes)
        }
        Err(e) => {
            h.update(format!("error: {}", e.kind()).as_bytes());
            None
        }
    }
}

/// Loads the config at `path` together with the fingerprint of the inputs it was loaded from.
///
/// The fingerprint is read before and after the load; when they differ, a writer changed the
/// files during the load (`std::fs::write` and most editors truncate, then write, so a reader
/// can see either state), and the load is repeated, at most [`LOAD_TRIES`] times. A
/// fingerprint that never settles is returned as read before the last load, so that the
/// next change event reloads again rather than being taken for "unchanged".
///
/// # Errors
/// The load's [`ConfigError`], returned inside the tuple with the fingerprint of the inputs
/// that were rejected (a rejected file is not retried until it changes).
pub fn load(path: &Path) -> ([u8; 32], Result<Config, ConfigError>) {
    load_with(path, inputs(path).fingerprint, Config::load)
}

/// [`load`] from inputs whose fingerprint was just read as `before`, with the reading of the
/// config given (tests make a writer land inside it).
fn load_with(
    path: &Path,
    mut before: [u8; 32],
    mut read: impl FnMut(&Path) -> Result<Config, ConfigError>,
) -> ([u8; 32], Result<Config, ConfigError>) {
    let mut tries = 1;
    loop {
        let loaded = read(path);
        let after = inputs(path).fingerprint;
        if after == before || tries == LOAD_TRIES {
            return (before, loaded);
        }
        before = after;
        tries += 1;
    }
}

/// Reads the config's inputs: the main file at `path`, the `include:` list found in it (if it
/// parses as YAML at all), and the files those entries resolve to (as [`Config::load`]
/// resolves them).
pub fn inputs(path: &Path) -> Inputs {
    let mut h = Sha256::new();
    let mut dirs = BTreeSet::new();
    add_folders(&mut dirs, path);
    let Some(main) = hash_file(&mut h, path) else {
        return Inputs {
            fingerprint: h.finalize().into(),
            dirs,
        };
    };
    let doc = serde_yaml::from_slice::<serde_yaml::Value>(&main).ok();
    let includes: Vec<String> = doc
        .as_ref()
        .and_then(|v| v.get("include").and_then(|i| i.as_sequence()).cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    let base = folder_of(path);
    // The TLS certificates and keys are inputs too: a renewed certificate (same config)
    // reloads, on SIGHUP or when its folder changes.
    for file in doc.as_ref().map(tls_files).unwrap_or_default() {
        let file = base.join(file);
        add_folders(&mut dirs, &file);
        h.update(b"tls\0");
        let _ = hash_file(&mut h, &file);
    }
    for pattern in includes {
        let full = if Path::new(&pattern).is_absolute() {
            PathBuf::from(&pattern)
        } else {
            base.join(&pattern)
        };
        if full.is_dir() {
            dirs.insert(full.clone());
        } else if let Some(literal) = full
            .ancestors()
            .skip(1)
            .find(|a| !a.to_string_lossy().contains(['*', '?', '[']))
        {
            // The deepest folder of a pattern without wildcards (`conf.d/*.yaml` → `conf.d`).
            dirs.insert(if literal.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                literal.to_path_buf()
            });
        }
        h.update(b"include\0");
        h.update(pattern.as_bytes());
        match expand_include(&base, &pattern) {
            Ok(files) => {
                for f in files {
                    add_folders(&mut dirs, &f);
                    let _ = hash_file(&mut h, &f);
                }
            }
            Err(e) => h.update(e.as_bytes()),
        }
    }
    Inputs {
        fingerprint: h.finalize().into(),
        dirs,
    }
}

/// The `cert_path` and `key_path` of every `server.tls.certificates` entry of a parsed main
/// file, in order (what [`crate::config`] loads; anything malformed is its error to report).
fn tls_files(doc: &serde_yaml::Value) -> Vec<String> {
    let Some(list) = doc
        .get("server")
        .and_then(|s| s.get("tls"))
        .and_then(|t| t.get("certificates"))
        .and_then(|c| c.as_sequence())
    else {
        return Vec::new();
    };
    list.iter()
        .flat_map(|c| [c.get("cert_path"), c.get("key_path")])
        .filter_map(|p| p.and_then(|p| p.as_str()).map(str::to_string))
        .collect()
}

/// Set by a `SIGHUP` that arrives before the reload service runs (see [`catch_early_sighup`]).
static EARLY_SIGHUP: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// Installs the `SIGHUP` handler at once, at process assembly: the signal's default action
/// would terminate the process, and the reload service only starts listening once Pingora
/// runs its services (after the listeners are up, so a `systemctl reload` right after start
/// could kill Sluice). A `SIGHUP` caught before the service runs is handled when it starts.
///
/// # Errors
/// If the handler cannot be installed.
pub fn catch_early_sighup() -> std::io::Result<()> {
    signal_hook::flag::register(signal_hook::consts::SIGHUP, EARLY_SIGHUP.clone()).map(drop)
}

/// Why a reload was asked for (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `SIGHUP`.
    Signal,
    /// A change in a watched folder.
    FileChange,
}

/// The reload service.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    handle: Arc<ConfigHandle>,
    admission: Arc<Admission>,
    /// The TLS listener's certificate resolver, when there is a TLS listener.
    certificates: Option<Arc<CertResolver>>,
    /// Fingerprint of the inputs of the last load or reload attempt (ok or not).
    last: Mutex<[u8; 32]>,
    /// The passthrough table a good reload swaps, if the process serves one.
    passthrough: Option<Arc<crate::passthrough::Router>>,
}

impl Reloader {
    /// Reloads `path` into `handle`; the running config was loaded from `path` by [`load`],
    /// which returned `loaded_from`, the fingerprint of the inputs it was read from.
    pub fn new(
        path: PathBuf,
        loaded_from: [u8; 32],
        handle: Arc<ConfigHandle>,
        admission: Arc<Admission>,
    ) -> Self {
        let last = Mutex::new(loaded_from);
        Self {
            path,
            handle,
            admission,
            certificates: None,
            last,
            passthrough: None,
        }
    }

    /// Also hands each reloaded config's certificates to the TLS listener's `resolver`
    /// (new handshakes use them; established connections keep theirs).
    #[must_use]
    pub fn with_certificates(mut self, resolver: Option<Arc<CertResolver>>) -> Self {
        self.certificates = resolver;
        self
    }

    /// Also swaps `router`'s passthrough table on every good reload.
    #[must_use]
    pub fn with_passthrough(mut self, router: Arc<crate::passthrough::Router>) -> Self {
        self.passthrough = Some(router);
        self
    }

    /// Reloads when the config's inputs changed since the last attempt; `None` when they
    /// did not (nothing is loaded, nothing counted). Calls are made one at a time, by the
    /// reloader's one task (signals and file events alike): the fingerprint is compared
    /// before the load and stored after it.
    pub fn reload_if_changed(&self, trigger: Trigger) -> Option<Result<(), ConfigError>> {
        let now = inputs(&self.path).fingerprint;
        if *self.last.lock().unwrap_or_else(|e| e.into_inner()) == now {
            match trigger {
                Trigger::Signal => log::info!(
                    "SIGHUP: {} and its includes are unchanged since the last reload; nothing to do",
                    self.path.display()
                ),
                Trigger::FileChange => log::debug!(
                    "a watched folder changed, but {} and its includes did not",
                    self.path.display()
                ),
            }
            return None;
        }
        match trigger {
            Trigger::Signal => log::info!("SIGHUP: reloading {}", self.path.display()),
            Trigger::FileChange => {
                log::info!("config file changed: reloading {}", self.path.display());
            }
        }
        Some(self.apply(load_with(&self.path, now, Config::load)))
    }

    /// Swaps in `loaded` (loaded and validated by [`load_with`]), or keeps the old config
    /// when it was rejected. Either way the inputs `read` are remembered, so that the same
    /// files are not loaded again.
    ///
    /// # Errors
    /// The [`ConfigError`] of the rejected file (logged and counted here).
    fn apply(
        &self,
        (read, loaded): ([u8; 32], Result<Config, ConfigError>),
    ) -> Result<(), ConfigError> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = read;
        match loaded {
            Ok(new) => {
                let old = self.handle.snapshot();
                let restart: Vec<&str> = [
                    ("server.listen", old.server.listen != new.server.listen),
                    (
                        "server.tls_listen",
                        old.server.tls_listen != new.server.tls_listen,
                    ),
                    (
                        "server.admin_listen",
                        old.server.admin_listen != new.server.admin_listen,
                    ),
                    ("server.threads", old.server.threads != new.server.threads),
                    (
                        "server.work_stealing",
                        old.server.work_stealing != new.server.work_stealing,
                    ),
                    // The writer thread and its database are opened once, at startup.
                    ("ledger", old.ledger != new.ledger),
                    ("response_store", old.response_store != new.response_store),
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
                for w in new.warnings() {
                    log::warn!("{w}");
                }
                crate::metrics::init_config_series(&new);
                self.admission.reconfigure(&new);
                if let Some(p) = &self.passthrough {
                    p.apply(&new);
                }
                log::info!(
                    "config reloaded file={} models={} providers={} virtual_keys={} passthrough_routes={}",
                    self.path.display(),
                    new.models.len(),
                    new.providers.len(),
                    new.keys.len(),
                    new.passthrough.len()
                );
                if let (Some(resolver), Some(set)) = (&self.certificates, &new.server.tls) {
                    resolver.store(set.clone());
                    log::info!(
                        "TLS certificates reloaded: {} (new handshakes use them)",
                        set.entries()
                            .iter()
                            .map(|e| e.cert_path.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
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

/// Whether an event about `paths` concerns only files whose path starts with `ignore`.
fn only_ignored(paths: &[PathBuf], ignore: Option<&Path>) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Some(ignore) = ignore else { return false };
    !paths.is_empty()
        && paths.iter().all(|p| {
            p.as_os_str()
                .as_bytes()
                .starts_with(ignore.as_os_str().as_bytes())
        })
}

/// The file watcher: notify on the folders of [`Inputs::dirs`], each event a nudge on `tx`.
struct Watch {
    watcher: Option<notify::RecommendedWatcher>,
    dirs: BTreeSet<PathBuf>,
}

impl Watch {
    /// A watcher nudging `tx`. Events only about files whose path starts with `ignore` (the
    /// SQLite usage ledger and its `-wal`/`-shm` files, which a ledger kept beside the config
    /// writes every flush interval) are not nudges.
    fn new(tx: tokio::sync::mpsc::Sender<()>, ignore: Option<PathBuf>) -> Self {
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                if !matches!(ev.kind, notify::EventKind::Access(_))
                    && !only_ignored(&ev.paths, ignore.as_deref())
                {
                    let _ = tx.try_send(());
                }
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                log::warn!("file watching unavailable ({e}); SIGHUP still reloads");
                None
            }
        };
        Self {
            watcher,
            dirs: BTreeSet::new(),
        }
    }

    /// Watches exactly `dirs` (non-recursively) from now on.
    fn set(&mut self, dirs: &BTreeSet<PathBuf>) {
        use notify::Watcher;
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        for gone in self.dirs.difference(dirs) {
            let _ = w.unwatch(gone);
        }
        for new in dirs.difference(&self.dirs) {
            if let Err(e) = w.watch(new, notify::RecursiveMode::NonRecursive) {
                log::warn!(
                    "cannot watch {} for config changes ({e}); SIGHUP still reloads",
                    new.display()
                );
            }
        }
        self.dirs.clone_from(dirs);
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
        let ledger = match self.handle.snapshot().ledger.clone().absolute().backend {
            crate::billing::ledger::Backend::Sqlite { path } => Some(path),
            _ => None,
        };
        let mut watch = Watch::new(tx, ledger);
        watch.set(&inputs(&self.path).dirs);
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                log::warn!("cannot install the SIGHUP handler: {e}");
                None
            }
        };
        log::info!(
            "config reload ready: SIGHUP reloads {}{}",
            self.path.display(),
            if self.handle.snapshot().server.watch_config {
                ", and so do changes of it and its includes"
            } else {
                " (server.watch_config: false)"
            }
        );
        // What changed or was signalled while the process was starting.
        if EARLY_SIGHUP.swap(false, Ordering::SeqCst) {
            let _ = self.reload_if_changed(Trigger::Signal);
        } else if self.handle.snapshot().server.watch_config {
            let _ = self.reload_if_changed(Trigger::FileChange);
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let _ = self.reload_if_changed(Trigger::Signal);
                }
                Some(()) = rx.recv() => {
                    // Debounce: wait until events stop for a moment, but not longer than
                    // `DEBOUNCE_MAX`: a file beside the config that changes all the time (a
                    // log written many times a second) must not hold a reload back for ever.
                    let deadline = tokio::time::Instant::now() + DEBOUNCE_MAX;
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep(DEBOUNCE) => break,
                            () = tokio::time::sleep_until(deadline) => break,
                            Some(()) = rx.recv() => {}
                        }
                    }
                    if self.handle.snapshot().server.watch_config {
                        let _ = self.reload_if_changed(Trigger::FileChange);
                    }
                }
            }
            // Includes may have changed: follow them.
            watch.set(&inputs(&self.path).dirs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_writes_beside_the_config_are_not_nudges() {
        let db = Path::new("/etc/sluice/sluice-usage.db");
        let p = |s: &str| PathBuf::from(s);
        for f in [
            "sluice-usage.db",
            "sluice-usage.db-wal",
            "sluice-usage.db-shm",
        ] {
            assert!(
                only_ignored(&[p(&format!("/etc/sluice/{f}"))], Some(db)),
                "{f}"
            );
        }
        assert!(!only_ignored(&[p("/etc/sluice/sluice.yaml")], Some(db)));
        assert!(!only_ignored(
            &[
                p("/etc/sluice/sluice-usage.db-wal"),
                p("/etc/sluice/sluice.yaml")
            ],
            Some(db)
        ));
        assert!(
            !only_ignored(&[], Some(db)),
            "an event naming no path may be anything"
        );
        assert!(!only_ignored(&[p("/etc/sluice/sluice-usage.db")], None));
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!(
            "sluice-reload-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(p.join("conf.d")).expect("mkdir");
        Dir(p)
    }

    #[test]
    fn the_fingerprint_covers_the_main_file_and_its_includes_only() {
        let d = dir("fp");
        let main = d.0.join("sluice.yaml");
        std::fs::write(&main, "include: [conf.d/*.yaml]\nserver: {}\n").expect("write");
        std::fs::write(d.0.join("conf.d/a.yaml"), "providers: {}\n").expect("write");
        let first = inputs(&main);
        assert!(first.dirs.contains(&d.0), "{:?}", first.dirs);
        assert!(first.dirs.contains(&d.0.join("conf.d")), "{:?}", first.dirs);
        assert_eq!(first.dirs.len(), 2, "{:?}", first.dirs);

        // An unrelated YAML next to the config, and a non-matching file in the include folder.
        std::fs::write(d.0.join("other.yaml"), "x: 1\n").expect("write");
        std::fs::write(d.0.join("conf.d/notes.txt"), "x").expect("write");
        assert_eq!(inputs(&main).fingerprint, first.fingerprint);

        // An included file's content, a new included file, the main file: each changes it.
        std::fs::write(d.0.join("conf.d/a.yaml"), "providers: {p: {}}\n").expect("write");
        let second = inputs(&main).fingerprint;
        assert_ne!(second, first.fingerprint);
        std::fs::write(d.0.join("conf.d/b.yaml"), "{}\n").expect("write");
        let third = inputs(&main).fingerprint;
        assert_ne!(third, second);
        std::fs::write(&main, "include: [conf.d/*.yaml]\nserver: {threads: 1}\n").expect("write");
        assert_ne!(inputs(&main).fingerprint, third);
    }

    /// A write that lands while the config is read (after the fingerprint was taken) is
    /// read again, so the fingerprint returned is that of the config returned: without
    /// this, one edit during a reload was reloaded twice (the file seemed to change again).
    #[test]
    fn load_returns_the_fingerprint_of_what_it_loaded_when_a_write_lands_during_the_read() {
        let d = dir("race");
        let main = d.0.join("sluice.yaml");
        let text = |threads: usize| {
            format!(
                "server: {{threads: {threads}}}\nproviders: {{demo: {{kind: demo}}}}\n\
                 models: {{demo/echo: {{routes: [{{provider: demo, upstream_model: e}}]}}}}\n\
                 tenants: {{t: {{}}}}\nvirtual_keys: [{{key: sk-test-0001, tenant: t}}]\n"
            )
        };
        let fingerprint_of = |threads: usize| {
            std::fs::write(&main, text(threads)).expect("write");
            inputs(&main).fingerprint
        };
        let (one, two) = (fingerprint_of(1), fingerprint_of(2));

        std::fs::write(&main, text(1)).expect("write");
        let mut reads = 0;
        let (read, loaded) = load_with(&main, inputs(&main).fingerprint, |p| {
            reads += 1;
            if reads == 1 {
                std::fs::write(p, text(2)).expect("write");
            }
            Config::load(p)
        });
        assert_eq!(loaded.expect("loads").server.threads, 2);
        assert_eq!(read, two);
        assert_eq!(reads, 2, "read again once the fingerprint settled");

        // A file that never settles: the fingerprint returned is one read before the last
        // load, never the current one, so the next change event reloads again.
        std::fs::write(&main, text(1)).expect("write");
        let mut n = 0;
        let (read, _) = load_with(&main, inputs(&main).fingerprint, |p| {
            n += 1;
            std::fs::write(p, text(1 + n % 2)).expect("write");
            Config::load(p)
        });
        assert_eq!(n, LOAD_TRIES as usize);
        assert_ne!(read, inputs(&main).fingerprint);
        assert!(read == one || read == two);
    }
}
