//! TLS for the client: trust in the server's certificate, and errors that say why a
//! handshake failed.
//!
//! Three ways to trust an `https://` server:
//! - the bundled web PKI roots (the default, for a certificate from a public CA);
//! - one CA given as PEM ([`crate::Client::with_ca`]), for a lab's own CA;
//! - a pinned certificate ([`crate::Client::with_pinned_fingerprint`]): exactly the
//!   certificate whose DER has the given SHA-256, for a self-signed certificate made by
//!   `taccd admin tls-init`. The handshake signature is still verified against that
//!   certificate's key, so only the holder of its private key can pass. Names and validity
//!   dates are not checked: the pin names the one certificate the user was given.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use sha2::{Digest, Sha256};

/// The SHA-256 fingerprint of a certificate's DER, as 64 lower-case hex digits (what
/// `taccd admin tls-init` prints and what clients pin).
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The fingerprint of the first certificate in a PEM file's text (a server's own
/// certificate comes first in its chain).
pub fn pem_fingerprint(pem: &[u8]) -> Result<String, String> {
    let first = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or("no CERTIFICATE block in the PEM text")?
        .map_err(|e| format!("invalid PEM certificate: {e}"))?;
    Ok(fingerprint(&first))
}

/// Normalise a fingerprint as people paste it: lower-case hex, with or without `:`
/// separators (`openssl x509 -fingerprint -sha256` prints `AB:CD:…`).
pub fn parse_fingerprint(text: &str) -> Result<String, String> {
    let hex: String = text
        .trim()
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex)
    } else {
        Err(format!(
            "`{}` is not a SHA-256 certificate fingerprint: expected 64 hex digits, as printed by `taccd admin tls-init`",
            text.trim()
        ))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls configuration that accepts exactly the certificate with `fingerprint`
/// (already normalised by [`parse_fingerprint`]).
pub(crate) fn pinned_config(fingerprint: String) -> Result<rustls::ClientConfig, String> {
    let provider = provider();
    let verifier = PinnedCertificate {
        fingerprint,
        algorithms: provider.signature_verification_algorithms,
    };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// A rustls configuration that trusts the CA certificates in `pem` and nothing else.
pub(crate) fn ca_config(pem: &[u8]) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("invalid PEM certificate: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("unusable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block in the CA's PEM text".to_string());
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Accepts exactly one certificate, by the SHA-256 of its DER.
#[derive(Debug)]
pub(crate) struct PinnedCertificate {
    fingerprint: String,
    algorithms: WebPkiSupportedAlgorithms,
}

/// The server presented another certificate than the pinned one.
#[derive(Debug)]
pub(crate) struct PinMismatch {
    pinned: String,
    presented: String,
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server's certificate has SHA-256 fingerprint {}, not the pinned {}. \
             Someone may be intercepting the connection, or the server's certificate was \
             replaced: ask its operator for the new fingerprint before you pin it",
            self.presented, self.pinned
        )
    }
}

impl std::error::Error for PinMismatch {}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = fingerprint(end_entity);
        if presented == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(PinMismatch {
                    pinned: self.fingerprint.clone(),
                    presented,
                })),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why a request failed in TLS, in words that say what to do; `None` when the failure
/// was not a TLS one.
pub(crate) fn explain(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let tls = find_rustls_error(error)?;
    Some(match tls {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            match other.0.downcast_ref::<PinMismatch>() {
                Some(mismatch) => mismatch.to_string(),
                None => format!("the server's certificate was refused: {other}"),
            }
        }
        rustls::Error::InvalidCertificate(why) => format!(
            "the server's certificate is not trusted ({why}). For a self-signed certificate \
             (`taccd admin tls-init`), pin its fingerprint: `tcloud config add NAME URL \
             --fingerprint HEX`, or `taccd agent --server-fingerprint HEX`"
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server did not answer in TLS: if it serves plain HTTP, use an http:// URL"
                .to_string()
        }
        other => format!("TLS handshake failed: {other}"),
    })
}

/// The rustls error somewhere in `error`'s chain. I/O errors hide the error they wrap
/// from `source()`, so each one's inner error is looked into as well.
fn find_rustls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(tls) = find_rustls_error(inner) {
                return Some(tls);
            }
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    fn verifier(pin: &str) -> PinnedCertificate {
        PinnedCertificate {
            fingerprint: pin.to_string(),
            algorithms: provider().signature_verification_algorithms,
        }
    }

    fn verify(
        verifier: &PinnedCertificate,
        der: &[u8],
    ) -> Result<ServerCertVerified, rustls::Error> {
        verifier.verify_server_cert(
            &CertificateDer::from(der.to_vec()),
            &[],
            &ServerName::try_from("example.org").unwrap(),
            &[],
            UnixTime::now(),
        )
    }

    #[test]
    fn fingerprint_is_lower_case_sha256_hex_of_the_der() {
        assert_eq!(fingerprint(b"hello"), HELLO_SHA256);
    }

    #[test]
    fn fingerprints_parse_with_colons_and_upper_case() {
        let colons = HELLO_SHA256
            .to_uppercase()
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(parse_fingerprint(&colons).unwrap(), HELLO_SHA256);
        assert_eq!(
            parse_fingerprint(&format!(" {HELLO_SHA256}\n")).unwrap(),
            HELLO_SHA256
        );
        for bad in [
            "",
            "abc",
            &HELLO_SHA256[1..],
            &format!("{HELLO_SHA256}00"),
            &HELLO_SHA256.replace('2', "g"),
        ] {
            let error = parse_fingerprint(bad).unwrap_err();
            assert!(error.contains("64 hex digits"), "{error}");
        }
    }

    #[test]
    fn the_pinned_certificate_is_accepted_whatever_the_server_name() {
        assert!(verify(&verifier(HELLO_SHA256), b"hello").is_ok());
    }

    #[test]
    fn any_other_certificate_is_refused_with_both_fingerprints() {
        let error = verify(&verifier(HELLO_SHA256), b"hello!").unwrap_err();
        let explained = explain(&error).unwrap();
        assert!(explained.contains(&fingerprint(b"hello!")), "{explained}");
        assert!(
            explained.contains(&format!("not the pinned {HELLO_SHA256}")),
            "{explained}"
        );
    }

    #[test]
    fn a_refusal_wrapped_in_io_errors_is_still_explained() {
        let error = verify(&verifier(HELLO_SHA256), b"other").unwrap_err();
        let wrapped =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, error));
        assert!(explain(&wrapped).unwrap().contains("not the pinned"));
        let plain = std::io::Error::other("connection reset");
        assert!(explain(&plain).is_none());
    }

    #[test]
    fn the_verifier_offers_the_providers_signature_schemes() {
        let schemes = verifier(HELLO_SHA256).supported_verify_schemes();
        assert!(schemes.contains(&SignatureScheme::ECDSA_NISTP256_SHA256));
        assert!(schemes.contains(&SignatureScheme::ED25519));
    }

    /// A self-signed certificate for `localhost`, its DER and its key.
    fn self_signed() -> (CertificateDer<'static>, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.der().clone(), key)
    }

    /// A server that presents `cert` but signs the handshake with `key` (which, for an
    /// impostor, is not the certificate's).
    fn server(cert: CertificateDer<'static>, key: &rcgen::KeyPair) -> rustls::ServerConfig {
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let signer = rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
        let certified = rustls::sign::CertifiedKey::new(vec![cert], signer);
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)))
    }

    /// Run a whole handshake in memory; the client's error if it refuses.
    fn handshake(
        client: rustls::ClientConfig,
        server: rustls::ServerConfig,
    ) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client), name)?;
        let mut server = rustls::ServerConnection::new(Arc::new(server))?;
        for _ in 0..10 {
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
            let mut wire = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut wire).unwrap();
            }
            server.read_tls(&mut wire.as_slice()).unwrap();
            if server.process_new_packets().is_err() {
                // The client's own verdict is what this module decides; a server-side
                // failure here is a test bug.
                panic!("the server refused the handshake");
            }
            let mut wire = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut wire).unwrap();
            }
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets()?;
        }
        panic!("the handshake did not finish");
    }

    #[test]
    fn a_real_handshake_with_the_pinned_certificate_succeeds() {
        let (cert, key) = self_signed();
        let pinned = pinned_config(fingerprint(&cert)).unwrap();
        handshake(pinned, server(cert, &key)).unwrap();
    }

    #[test]
    fn a_handshake_with_another_certificate_fails_on_the_pin() {
        let (cert, key) = self_signed();
        let (other, _) = self_signed();
        let pinned = pinned_config(fingerprint(&other)).unwrap();
        let error = handshake(pinned, server(cert, &key)).unwrap_err();
        assert!(
            explain(&error).unwrap().contains("not the pinned"),
            "{error}"
        );
    }

    #[test]
    fn the_pinned_certificate_without_its_key_fails_the_signature_check() {
        // An impostor can copy the public certificate, but cannot sign with its key.
        let (cert, _key) = self_signed();
        let (_, impostor_key) = self_signed();
        let pinned = pinned_config(fingerprint(&cert)).unwrap();
        let error = handshake(pinned, server(cert, &impostor_key)).unwrap_err();
        assert!(
            matches!(
                error,
                rustls::Error::InvalidCertificate(CertificateError::BadSignature)
            ),
            "{error:?}"
        );
    }

    #[test]
    fn a_ca_config_trusts_certificates_it_signed() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let trusting = ca_config(ca.pem().as_bytes()).unwrap();
        handshake(trusting, server(cert.der().clone(), &key)).unwrap();
        // The web PKI roots are not added: a certificate from elsewhere is refused.
        let (stranger, stranger_key) = self_signed();
        let trusting = ca_config(ca.pem().as_bytes()).unwrap();
        let error = handshake(trusting, server(stranger, &stranger_key)).unwrap_err();
        assert!(explain(&error).unwrap().contains("not trusted"), "{error}");
    }

    #[test]
    fn ca_pem_without_certificates_is_refused() {
        assert!(
            ca_config(b"not pem")
                .unwrap_err()
                .contains("no CERTIFICATE")
        );
        assert!(pem_fingerprint(b"").unwrap_err().contains("no CERTIFICATE"));
    }
}
