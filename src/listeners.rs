//! Owns the process's listening sockets: `server.listen`, `server.tls_listen` and
//! `server.admin_listen` are bound here, at start, before anything else is opened, so that an
//! address in use (or a port below 1024 without the capability) stops the start with an error
//! naming the key and the address, and a non-zero exit ([`ListenError`]).
//!
//! Pingora binds its listeners itself only when its services start, in their own threads:
//! an address in use is retried for 30 s, then the service thread panics and the process
//! runs on, serving nothing. So the sockets bound here are handed to Pingora through its
//! listening-fd table (the one a graceful upgrade fills with the old process's sockets):
//! [`Holding`] wraps each listening service and, when the service starts, puts its sockets
//! in the table under their configured address, which Pingora then takes instead of binding.
//! The table also goes on to the next process at a graceful upgrade, as Pingora's own sockets
//! would.
//!
//! With `-u` (graceful upgrade) nothing is bound up front: the sockets come from the running
//! process. One the old process did not hand over (a listener added to the config) is bound
//! when its service starts, and failing that the process exits 1.
//!
//! [`ListenerSet::readiness`] is what `/readyz` answers: ready while this process holds every
//! configured listener (a service holds its sockets from its start until it stops accepting,
//! at shutdown or after handing them over).

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;

use crate::config::ServerSettings;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({key}): {source}{hint}")]
pub struct ListenError {
    /// The config key of the listener (`server.listen`, `server.tls_listen`,
    /// `server.admin_listen`).
    pub key: &'static str,
    /// The address as configured.
    pub addr: String,
    /// What `bind`/`listen` answered.
    #[source]
    pub source: std::io::Error,
    /// What to do about it, for the common causes (empty otherwise).
    hint: String,
}

impl ListenError {
    fn new(key: &'static str, addr: &str, source: std::io::Error) -> Self {
        let port = addr.rsplit(':').next().unwrap_or("");
        let hint = match source.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "; another process listens there (`ss -ltnp 'sport = :{port}'` names it): stop \
                 it, or take its sockets over with a graceful upgrade (`sluice -u`) if it is \
                 a Sluice"
            ),
            std::io::ErrorKind::PermissionDenied => {
                "; ports below 1024 need CAP_NET_BIND_SERVICE (the shipped systemd unit grants it)"
                    .to_owned()
            }
            std::io::ErrorKind::AddrNotAvailable => {
                "; no interface of this machine has that address".to_owned()
            }
            _ => String::new(),
        };
        Self {
            key,
            addr: addr.to_owned(),
            source,
            hint,
        }
    }
}

/// One configured listener.
#[derive(Debug)]
struct Entry {
    /// Its config key.
    key: &'static str,
    /// The address as configured: Pingora's key for it in the listening-fd table.
    addr: String,
    /// The socket bound at start, until its service takes it (`None` with `-u`, or once
    /// taken).
    socket: Mutex<Option<TcpListener>>,
    /// The address the socket is bound to (the port chosen when the config says port 0).
    local: Option<SocketAddr>,
    /// Whether this process holds it now (its service is running with it).
    held: AtomicBool,
}

/// The configured listeners, bound or to be taken over, and which of them this process holds.
#[derive(Debug)]
pub struct ListenerSet {
    entries: Vec<Entry>,
}

/// Binds `addr` as Pingora would: its first resolved address, `SO_REUSEADDR` (std's
/// listener sets it), listening, non-blocking (the tokio listener Pingora makes of it
/// requires that).
fn bind(key: &'static str, addr: &str) -> Result<TcpListener, ListenError> {
    let at = addr
        .to_socket_addrs()
        .map_err(|e| ListenError::new(key, addr, e))?
        .next()
        .ok_or_else(|| {
            ListenError::new(
                key,
                addr,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "resolves to no address"),
            )
        })?;
    let l = TcpListener::bind(at).map_err(|e| ListenError::new(key, addr, e))?;
    l.set_nonblocking(true)
        .map_err(|e| ListenError::new(key, addr, e))?;
    Ok(l)
}

impl ListenerSet {
    /// The listeners of `server`: bound now, or (with `upgrade`) left for the running
    /// process to hand over.
    ///
    /// # Errors
    /// The first listener that cannot be bound (nothing stays bound then).
    pub fn bind(server: &ServerSettings, upgrade: bool) -> Result<Arc<Self>, ListenError> {
        let mut wanted = vec![("server.listen", server.listen.clone())];
        if let Some(tls) = &server.tls_listen {
            wanted.push(("server.tls_listen", tls.clone()));
        }
        wanted.push(("server.admin_listen", server.admin_listen.clone()));
        let mut entries = Vec::with_capacity(wanted.len());
        for (key, addr) in wanted {
            let socket = if upgrade {
                None
            } else {
                Some(bind(key, &addr)?)
            };
            entries.push(Entry {
                key,
                local: socket.as_ref().and_then(|s| s.local_addr().ok()),
                addr,
                socket: Mutex::new(socket),
                held: AtomicBool::new(false),
            });
        }
        Ok(Arc::new(Self { entries }))
    }

    /// The address the listener of config key `key` is bound to (`None` before it is
    /// bound, i.e. with `-u`, or for a key not configured).
    pub fn local_addr(&self, key: &str) -> Option<SocketAddr> {
        self.entries.iter().find(|e| e.key == key)?.local
    }

    /// `inner`, a listening service whose listeners are `addrs` (as configured), made to
    /// take this set's sockets when it starts.
    pub fn hold<S: Service>(self: &Arc<Self>, inner: S, addrs: &[&str]) -> Holding<S> {
        Holding {
            inner,
            set: self.clone(),
            entries: self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| addrs.contains(&e.addr.as_str()))
                .map(|(i, _)| i)
                .collect(),
        }
    }

    /// `Ok` with a line per listener when this process holds every configured listener;
    /// `Err` naming those it does not hold.
    ///
    /// # Errors
    /// The listeners not held, as text.
    pub fn readiness(&self) -> Result<String, String> {
        let mut held = String::new();
        let mut missing = Vec::new();
        for e in &self.entries {
            if e.held.load(Ordering::Acquire) {
                held.push_str(&format!("listening on {} ({})\n", e.addr, e.key));
            } else {
                missing.push(format!("{} ({})", e.addr, e.key));
            }
        }
        if missing.is_empty() {
            Ok(held)
        } else {
            Err(format!(
                "not ready: this process does not hold {}\n",
                missing.join(", ")
            ))
        }
    }

    /// Puts the sockets of `entries` in Pingora's listening-fd table (an address already
    /// there, handed over by the previous process, is left as it is) and marks them held.
    /// A socket neither bound at start nor handed over is bound now; failing that, the
    /// process exits 1.
    fn hand_to(&self, entries: &[usize], fds: &ListenFds) {
        for &i in entries {
            let e = &self.entries[i];
            let ours = e
                .socket
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let mut table = fds.lock();
            if table.get(&e.addr).is_none() {
                let socket = match ours.map_or_else(|| bind(e.key, &e.addr), Ok) {
                    Ok(s) => s,
                    Err(err) => {
                        log::error!("{err}");
                        std::process::exit(1);
                    }
                };
                table.add(e.addr.clone(), socket.into_raw_fd());
            }
            e.held.store(true, Ordering::Release);
        }
    }

    fn release(&self, entries: &[usize]) {
        for &i in entries {
            self.entries[i].held.store(false, Ordering::Release);
        }
    }
}

/// A listening service that takes its sockets from a [`ListenerSet`] (see the module docs).
pub struct Holding<S> {
    inner: S,
    set: Arc<ListenerSet>,
    /// Indices of its listeners in the set.
    entries: Vec<usize>,
}

#[async_trait]
impl<S: Service> Service for Holding<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        if let Some(fds) = &fds {
            self.set.hand_to(&self.entries, fds);
        }
        self.inner
            .start_service(fds, shutdown, listeners_per_fd)
            .await;
        // The service stopped accepting: its listeners are closed or handed over.
        self.set.release(&self.entries);
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn runtime_opts_override(
        &self,
        global: &pingora::server::RuntimeOpts,
    ) -> Option<pingora::server::RuntimeOpts> {
        self.inner.runtime_opts_override(global)
    }

    fn on_startup_delay(&self, time_waited: std::time::Duration) {
        self.inner.on_startup_delay(time_waited);
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_in_use_is_an_error_naming_key_address_and_remedy() {
        let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = busy.local_addr().expect("addr").to_string();
        let e = bind("server.listen", &addr).expect_err("in use");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot listen on {addr} (server.listen): ")),
            "{text}"
        );
        assert!(text.contains("ss -ltnp"), "{text}");
        assert_eq!(e.source.kind(), std::io::ErrorKind::AddrInUse);
    }
}
