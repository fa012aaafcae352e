//! TLS and HTTP/2 test clients: a test CA made with rcgen that issues leaf certificates into
//! PEM files, a rustls client (SNI, ALPN and protocol versions chosen per test, the peer
//! certificate and the negotiated ALPN reported), and an HTTP/2 client (the `h2` crate) over
//! TLS or over plain TCP (h2c with prior knowledge) that records when each DATA frame arrived.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, SupportedProtocolVersion};
use tokio_rustls::TlsConnector;

use super::{TempDir, KEY};

/// A test certificate authority and the folder its issued files go to.
pub(crate) struct Pki {
    pub dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
    pub ca: CertificateDer<'static>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
}

impl Pki {
    /// A fresh CA (ECDSA P-256) in a new temporary folder.
    pub(crate) fn new() -> Pki {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "Sluice e2e test CA");
        let cert = params.self_signed(&key).expect("CA cert");
        Pki {
            dir: TempDir::new("pki"),
            issuer: Issuer::new(params, key),
            ca: cert.der().clone(),
            ca_pem: cert.pem(),
        }
    }

    /// `<stem>.pem` / `<stem>.key` in the folder.
    pub(crate) fn path(&self, stem: &str, ext: &str) -> PathBuf {
        self.dir.path().join(format!("{stem}.{ext}"))
    }

    /// Issues a leaf certificate for `names` and writes its chain and key as `<stem>.pem`
    /// and `<stem>.key` (each written to a temporary name and renamed, as a renewal tool
    /// would); returns the leaf's DER.
    pub(crate) fn issue(&self, stem: &str, names: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &self.issuer).expect("leaf cert");
        self.write(stem, "pem", &cert.pem());
        self.write(stem, "key", &key.serialize_pem());
        cert.der().to_vec()
    }

    /// Writes `<stem>.<ext>` atomically (temporary file, then rename).
    pub(crate) fn write(&self, stem: &str, ext: &str, text: &str) {
        let tmp = self.path(&format!(".{stem}.tmp"), ext);
        std::fs::write(&tmp, text).expect("write pem");
        std::fs::rename(&tmp, self.path(stem, ext)).expect("rename pem");
    }

    /// A client config trusting this CA only, offering `alpn` and `versions`.
    pub(crate) fn client(
        &self,
        alpn: &[&[u8]],
        versions: &[&'static SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).expect("CA root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    }
}

/// A multi-thread runtime with one worker: spawned connection tasks keep running while the
/// test's own future blocks on the harness's synchronous helpers.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// An established TLS connection and what the handshake chose.
pub(crate) struct Tls {
    pub stream: tokio_rustls::client::TlsStream<TcpStream>,
    /// The server's end-entity certificate, DER.
    pub peer_cert: Vec<u8>,
    /// The negotiated ALPN protocol.
    pub alpn: Option<Vec<u8>>,
    /// The negotiated protocol version.
    pub version: Option<rustls::ProtocolVersion>,
}

/// Connects to `addr` with SNI `sni`.
///
/// # Errors
/// The TLS handshake error (e.g. a refused protocol version).
pub(crate) async fn connect(
    addr: SocketAddr,
    sni: &str,
    cfg: Arc<ClientConfig>,
) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(sni.to_string()).expect("server name");
    let stream = TlsConnector::from(cfg).connect(name, tcp).await?;
    let (_, conn) = stream.get_ref();
    let peer_cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
    let version = conn.protocol_version();
    Ok(Tls {
        stream,
        peer_cert,
        alpn,
        version,
    })
}

/// An HTTP/2 client connection (its driver runs as a spawned task).
pub(crate) struct H2 {
    pub send: h2::client::SendRequest<Bytes>,
    pub authority: String,
}

/// HTTP/2 over `io` (TLS after ALPN h2, or plain TCP for h2c with prior knowledge).
pub(crate) async fn h2_handshake<T>(io: T, authority: &str) -> H2
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    H2 {
        send,
        authority: authority.to_string(),
    }
}

/// One HTTP/2 exchange in progress: the response head and the request's send half (to
/// reset the stream).
pub(crate) struct H2Exchange {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: h2::RecvStream,
    pub request: h2::SendStream<Bytes>,
}

impl H2 {
    /// Sends `method path` with the test key and `body` (JSON, may be empty), and waits for
    /// the response head.
    pub(crate) async fn request(&mut self, method: &str, path: &str, body: &str) -> H2Exchange {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.authority))
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(())
            .expect("request");
        let mut send = self.send.clone().ready().await.expect("h2 ready");
        let (resp, mut request) = send
            .send_request(req, body.is_empty())
            .expect("send request");
        if !body.is_empty() {
            request
                .send_data(Bytes::from(body.to_string()), true)
                .expect("send body");
        }
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .expect("response head in time")
            .expect("response head");
        let status = resp.status().as_u16();
        let (parts, body) = resp.into_parts();
        H2Exchange {
            status,
            headers: parts.headers,
            body,
            request,
        }
    }
}

impl H2Exchange {
    /// The next DATA frame (`None` at the end of the stream), with its arrival time.
    pub(crate) async fn next_frame(&mut self, timeout: Duration) -> Option<(Instant, Bytes)> {
        let data = tokio::time::timeout(timeout, self.body.data())
            .await
            .expect("a DATA frame in time")?
            .expect("DATA frame");
        let _ = self.body.flow_control().release_capacity(data.len());
        Some((Instant::now(), data))
    }

    /// Every DATA frame to the end of the stream, each with its arrival time.
    pub(crate) async fn frames(&mut self, timeout: Duration) -> Vec<(Instant, Bytes)> {
        let end = Instant::now() + timeout;
        let mut out = Vec::new();
        while let Some(f) = self
            .next_frame(end.saturating_duration_since(Instant::now()))
            .await
        {
            out.push(f);
        }
        out
    }
}

/// The concatenated body of `frames`.
pub(crate) fn concat(frames: &[(Instant, Bytes)]) -> Vec<u8> {
    frames.iter().flat_map(|(_, b)| b.iter().copied()).collect()
}
