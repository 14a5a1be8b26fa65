//! HTTPS: the server's certificate and key, and the handshake the listener
//! (`connections.rs`) runs on each connection before it speaks HTTP.
//!
//! Each handshake runs in its connection's own task with a deadline, so a client that
//! connects and says nothing holds up no one else's connection. A client speaking plain HTTP to the TLS
//! port gets a plain-HTTP 400 that says to use `https://`, not a silent hang-up.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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

    /// What completes handshakes with this certificate.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.server.clone())
    }

    /// The server's own certificate (DER), e.g. to print the fingerprint clients pin.
    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate
    }
}

/// The TLS connection, or `None` when the client spoke plain HTTP (and was told so) or
/// left before saying anything; an error past [`HANDSHAKE_TIMEOUT`].
pub(crate) async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
) -> io::Result<Option<TlsStream<TcpStream>>> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake_within(acceptor, tcp))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake timed out"))?
}

async fn handshake_within(
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
