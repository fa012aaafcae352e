//! Owns the built-in demo provider: the project's mock upstream in demo mode
//! ([`MockState::demo`]), which streams a deterministic reply in OpenAI's wire format so the
//! default config runs with no API key and no network. Sluice reaches it through the same
//! attempt loop, Pingora connector and SSE path as a real provider, but the connection is
//! in process: [`DemoConnector`] is the peer's custom L4 connector, and each "connection" is
//! one [`tokio::io::duplex`] pipe whose other end a task of the mock serves. There is no
//! listening socket, so no other process can reach the demo, and demo mode keeps no request
//! log, answers no control endpoint and ignores any client steering (the `mock` body field).

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use pingora::connectors::L4Connect;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::l4::stream::Stream;
use pingora::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};

use sluice_mock_upstream::{serve_stream, MockState};

/// Bytes buffered in each direction of one in-process demo connection (like a socket
/// buffer: the writer waits when the reader is this far behind).
const PIPE_BYTES: usize = 64 * 1024;

/// The demo's one shared state (demo mode: nothing per request is kept in it).
static STATE: LazyLock<Arc<MockState>> = LazyLock::new(|| Arc::new(MockState::demo()));

/// Pingora's custom L4 connector for the demo provider: every connect opens a fresh
/// in-process pipe and serves its far end with the demo mock on the current runtime.
#[derive(Debug, Default, Clone, Copy)]
pub struct DemoConnector;

/// The connector shared by every demo peer.
pub fn connector() -> Arc<DemoConnector> {
    static CONNECTOR: LazyLock<Arc<DemoConnector>> = LazyLock::new(|| Arc::new(DemoConnector));
    CONNECTOR.clone()
}

/// Gateway end of one in-process demo connection.
#[derive(Debug)]
struct DemoSocket(tokio::io::DuplexStream);

impl tokio::io::AsyncRead for DemoSocket {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for DemoSocket {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl VirtualSocket for DemoSocket {
    /// A pipe has no Nagle delay and no keepalive: every option is a no-op.
    fn set_socket_option(&self, _opt: VirtualSockOpt) -> std::io::Result<()> {
        Ok(())
    }
}

#[async_trait]
impl L4Connect for DemoConnector {
    async fn connect(&self, _addr: &SocketAddr) -> pingora::Result<Stream> {
        let (gateway_end, demo_end) = tokio::io::duplex(PIPE_BYTES);
        let state = STATE.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_stream(demo_end, state).await {
                log::debug!("demo provider: connection ended: {e}");
            }
        });
        Ok(Stream::from(VirtualSocketStream::new(Box::new(
            DemoSocket(gateway_end),
        ))))
    }
}
/// The adapter of `kind: demo`: an OpenAI-compatible provider served in-process
/// ([`connector`]), no key.
#[derive(Debug)]
pub struct Demo;

impl super::Adapter for Demo {
    fn base_dialect(&self) -> crate::protocol::UpstreamDialect {
        crate::protocol::UpstreamDialect::ChatCompletions
    }

    fn path(
        &self,
        _: &crate::config::Provider,
        _: &str,
        _: bool,
    ) -> std::borrow::Cow<'static, str> {
        super::openai::CHAT_COMPLETIONS_PATH.into()
    }

    fn authorize(
        &self,
        provider: &crate::config::Provider,
        _: &super::Credential,
        req: &mut pingora::http::RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        super::openai::authorize_bearer(provider, req)
    }

    fn connector(&self) -> Option<Arc<dyn L4Connect + Send + Sync>> {
        Some(connector())
    }
}
