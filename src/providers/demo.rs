//! Owns the built-in demo provider: a loopback server (the project's mock upstream in demo
//! mode) that streams a deterministic reply in OpenAI's wire format, so the default config
//! runs with no API key and no network. Sluice reaches it through the same attempt loop,
//! connector and SSE path as a real provider.

use std::net::SocketAddr;
use std::sync::OnceLock;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::mock_upstream::{serve, MockState};

static ADDRESS: OnceLock<SocketAddr> = OnceLock::new();

/// The demo server's loopback address, once bound.
pub fn address() -> Option<SocketAddr> {
    ADDRESS.get().copied()
}

/// The demo server as a Pingora background service. The listener is bound up front (before
/// Pingora daemonizes or forks), so the address is known before the first request.
#[derive(Debug)]
pub struct DemoProvider {
    listener: std::sync::Mutex<Option<std::net::TcpListener>>,
}

impl DemoProvider {
    /// Binds `127.0.0.1:0` and records the address.
    ///
    /// # Errors
    /// If the loopback socket cannot be bound.
    pub fn bind() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let _ = ADDRESS.set(addr);
        Ok(Self {
            listener: std::sync::Mutex::new(Some(listener)),
        })
    }
}

#[async_trait]
impl BackgroundService for DemoProvider {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else {
            return;
        };
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                log::error!("demo provider cannot start: {e}");
                return;
            }
        };
        log::info!("demo provider listening on {:?}", address());
        tokio::select! {
            () = serve(listener, std::sync::Arc::new(MockState::demo())) => {}
            _ = shutdown.changed() => {}
        }
    }
}
