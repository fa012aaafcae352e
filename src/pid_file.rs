//! Owns the pid file of a Sluice running in the foreground (`server.pid_file`, default
//! `/tmp/sluice.pid`) and `sluice reload`, which reads it to send the running process
//! `SIGHUP`.
//!
//! With `-d` Pingora writes the pid file after it forks (the graceful-upgrade systemd
//! drop-in's `PIDFile=` reads it). In the foreground (`scripts/run.sh`, a terminal, a
//! `Type=simple` unit) Sluice writes it itself once its listeners are bound, so the process
//! to reload can be found the same way; a process started with `-u` writes it too, since it
//! is the one to signal from then on. At the end of a shutdown the file is removed if it
//! still names this process (after a graceful upgrade it names the new one and stays).

use std::io;
use std::path::{Path, PathBuf};

/// The default of `server.pid_file`.
pub const DEFAULT: &str = "/tmp/sluice.pid";

/// Writes this process's pid to `path` (replacing the file whole: a reader never sees a
/// partial line).
///
/// # Errors
/// When the file (or its temporary sibling) cannot be written or renamed.
pub fn write_own(path: &Path) -> io::Result<()> {
    let tmp = sibling(path, ".tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
    std::fs::rename(&tmp, path)
}

/// Removes `path` if it names this process (an exit hook; errors are ignored).
pub fn remove_if_own(path: &Path) {
    if read_pid(path).ok() == Some(std::process::id()) {
        let _ = std::fs::remove_file(path);
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// The pid a pid file holds.
fn read_pid(path: &Path) -> io::Result<u32> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `server.pid_file` of the config at `conf` (only that key of the main file is read, so no
/// provider key needs to be in the environment), or [`DEFAULT`].
///
/// # Errors
/// The file cannot be read or is not YAML, as text.
pub fn configured(conf: &Path) -> Result<PathBuf, String> {
    let text = std::fs::read_to_string(conf)
        .map_err(|e| format!("cannot read {}: {e}", conf.display()))?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("{} is not YAML: {e}", conf.display()))?;
    Ok(PathBuf::from(
        doc.get("server")
            .and_then(|s| s.get("pid_file"))
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or(DEFAULT),
    ))
}

/// Whether process `pid` is a Sluice (its command line's program name contains `sluice`):
/// a stale pid file may name a pid the system has given to another program since.
fn is_sluice(pid: u32) -> io::Result<bool> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let name = Path::new(std::str::from_utf8(program).unwrap_or_default())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(name.contains("sluice"))
}

/// `sluice reload`: sends `SIGHUP` to the Sluice whose pid `pid_file` holds; what to print.
///
/// # Errors
/// No pid file, a pid that is not running or not a Sluice, or a signal that cannot be sent;
/// as text.
pub fn send_reload(pid_file: &Path) -> Result<String, String> {
    let shown = pid_file.display();
    let pid = read_pid(pid_file).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            format!("no pid file at {shown} (server.pid_file): is Sluice running with this config?")
        }
        _ => format!("cannot read the pid file {shown}: {e}"),
    })?;
    match is_sluice(pid) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "process {pid} (from {shown}) is not a Sluice: the pid file is stale; not signalled"
            ))
        }
        Err(_) => {
            return Err(format!(
                "process {pid} (from {shown}) is not running: the pid file is stale"
            ))
        }
    }
    let target = i32::try_from(pid)
        .map(nix::unistd::Pid::from_raw)
        .map_err(|_| format!("pid {pid} in {shown} is out of range"))?;
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| format!("cannot signal process {pid} (from {shown}): {e}"))?;
    Ok(format!(
        "sluice: sent SIGHUP to process {pid} (from {shown}): it reloads its config; its log \
         says whether the reload was applied (a bad file keeps the old config)\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_file_is_ours_until_another_process_writes_it() {
        let dir = std::env::temp_dir().join(format!("sluice-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("s.pid");
        write_own(&file).expect("write");
        assert_eq!(read_pid(&file).expect("read"), std::process::id());
        // Another process's pid (as after a graceful upgrade): left alone.
        std::fs::write(&file, "1\n").expect("write");
        remove_if_own(&file);
        assert!(file.exists());
        write_own(&file).expect("write");
        remove_if_own(&file);
        assert!(!file.exists());
        // Process 1 (init, or the container's first program) is not a Sluice: never
        // signalled. (Not this test's own pid: the test binary is named `sluice-<hash>`.)
        std::fs::write(&file, "1\n").expect("write");
        let e = send_reload(&file).expect_err("not a sluice");
        assert!(
            e.contains("is not a Sluice") || e.contains("is not running"),
            "{e}"
        );
        let e = send_reload(&dir.join("none.pid")).expect_err("no file");
        assert!(e.contains("no pid file at"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn the_configured_pid_file_is_read_from_the_server_section_alone() {
        let dir = std::env::temp_dir().join(format!("sluice-pidconf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let conf = dir.join("c.yaml");
        std::fs::write(
            &conf,
            "server:\n  pid_file: /run/x.pid\nproviders: {p: {api_key_env: UNSET}}\n",
        )
        .expect("write");
        assert_eq!(configured(&conf), Ok(PathBuf::from("/run/x.pid")));
        std::fs::write(&conf, "server:\n  listen: 127.0.0.1:1\n").expect("write");
        assert_eq!(configured(&conf), Ok(PathBuf::from(DEFAULT)));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
