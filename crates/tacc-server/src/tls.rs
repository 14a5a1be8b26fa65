//! HTTPS: the server's certificate and key, and a listener that hands the HTTP server
//! connections only once their TLS handshake is done.
//!
//! Handshakes run in their own tasks with a deadline, so a client that connects and says
//! nothing holds up no one else's connection. A client speaking plain HTTP to the TLS
//! port gets a plain-HTTP 400 that says to use `https://`, not a silent hang-up.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::ServerError;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The server's TLS settings: its certificate chain and private key.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    server: Arc<rustls::ServerConfig>,
    certificate: CertificateDer<'static>,
}

impl TlsConfig {
    /// Load a PEM certificate chain (the server's own certificate first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, ServerError> {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                ServerError::Config(format!(
                    "cannot read the TLS certificate {}: {e}",
                    cert.display()
                ))
            })?;
        let Some(certificate) = certs.first().cloned() else {
            return Err(ServerError::Config(format!(
                "{} holds no CERTIFICATE block",
                cert.display()
            )));
        };
        let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            ServerError::Config(format!(
                "cannot read the TLS private key {} (a PEM PRIVATE KEY block): {e}",
                key.display()
            ))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ServerError::Config(format!("TLS: {e}")))?
            .with_no_client_auth()
            .with_single_cert(certs, private_key)
            .map_err(|e| {
                ServerError::Config(format!(
                    "the TLS key {} does not fit the certificate {}: {e}",
                    key.display(),
                    cert.display()
                ))
            })?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig {
            server: Arc::new(server),
            certificate,
        })
    }

    /// The server's own certificate (DER), e.g. to print the fingerprint clients pin.
    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate
    }
}

/// A TCP listener whose connections come out TLS-terminated.
pub(crate) struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: &TlsConfig) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config.server.clone());
        let accepting = tokio::spawn(accept_loop(listener, acceptor, sender));
        Ok(TlsListener {
            local_addr,
            ready,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    /// Stop accepting (and free the port) when the HTTP server lets go of the listener.
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (mut tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::error!("cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        crate::set_nodelay(&mut tcp);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, tcp)).await {
                Ok(Ok(Some(tls))) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
            }
        });
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The TLS connection, or `None` when the client spoke plain HTTP (and was told so) or
/// left before saying anything.
async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
) -> io::Result<Option<TlsStream<TcpStream>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        if first[0].is_ascii_uppercase() {
            refuse_plain_http(tcp).await?;
        }
        return Ok(None);
    }
    acceptor.accept(tcp).await.map(Some)
}

/// Answer a plain-HTTP request with a 400 in the API's error format.
async fn refuse_plain_http(mut tcp: TcpStream) -> io::Result<()> {
    // Read what the client sent, so that closing does not reset the connection before it
    // reads the answer.
    let mut request = [0u8; 8192];
    let _ = tcp.read(&mut request).await?;
    let body = serde_json::to_string(&tacc_proto::ApiError {
        code: "tls_required".to_string(),
        message: "this TACC server only speaks HTTPS: use an https:// URL (and, for a \
                  self-signed certificate, pin the fingerprint its operator gives you)"
            .to_string(),
    })
    .map_err(io::Error::other)?;
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(response.as_bytes()).await?;
    tcp.shutdown().await
}
