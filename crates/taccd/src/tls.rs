//! Transport security of the daemon: the server's `--tls-cert/--tls-key`, the refusal to
//! serve plain HTTP beyond loopback without `--insecure`, how an agent trusts its server
//! (`--server-fingerprint`, `--server-ca`), and `taccd admin tls-init`, which makes a
//! self-signed certificate for a lab without a CA.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

/// The server's TLS options (`taccd server` and `taccd dev`).
#[derive(Debug, Args)]
pub struct ServerTlsArgs {
    /// Serve HTTPS with this PEM certificate chain (the server's certificate first);
    /// `taccd admin tls-init` makes a self-signed one.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback --listen address. Tokens and task data then
    /// cross the network in clear: only on a network you trust.
    #[arg(long, conflicts_with = "tls_cert")]
    pub insecure: bool,
}

impl ServerTlsArgs {
    /// The TLS configuration, when --tls-cert/--tls-key are given.
    pub fn load(&self) -> Result<Option<tacc_server::TlsConfig>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        Ok(Some(tacc_server::TlsConfig::from_pem_files(cert, key)?))
    }

    /// Refuse plain HTTP on an address beyond this machine unless --insecure was given.
    pub fn check_exposure(&self, listen: SocketAddr, data_dir: &Path) -> Result<()> {
        if self.tls_cert.is_some() || is_loopback(listen.ip()) {
            return Ok(());
        }
        if self.insecure {
            tracing::warn!(
                "serving plain HTTP on {listen} (--insecure): API tokens and task data cross the network unencrypted"
            );
            return Ok(());
        }
        let dir = data_dir.display();
        bail!(
            "refusing to serve plain HTTP on {listen}, an address other machines can reach: \
             anyone on the network could read API tokens and task data. Give the server a \
             certificate (for a self-signed one: `taccd admin tls-init --data-dir {dir}`, then \
             add `--tls-cert {dir}/tls/cert.pem --tls-key {dir}/tls/key.pem`), listen on \
             127.0.0.1 only, or, on a network you trust, accept the risk with --insecure"
        )
    }

    /// A client of this server from the same process (the embedded cluster's agent):
    /// pinned to the server's own certificate when TLS is on.
    pub fn local_client(&self, url: &str) -> Result<tacc_client::Client> {
        let client = tacc_client::Client::new(url);
        let Some(cert) = &self.tls_cert else {
            return Ok(client);
        };
        let fingerprint = file_fingerprint(cert)?;
        Ok(client.with_pinned_fingerprint(&fingerprint)?)
    }
}

/// 127.0.0.0/8 and ::1 (also as an IPv4-mapped IPv6 address).
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The SHA-256 fingerprint of the first certificate in a PEM file.
pub fn file_fingerprint(cert: &Path) -> Result<String> {
    let pem = std::fs::read(cert)
        .with_context(|| format!("cannot read the certificate {}", cert.display()))?;
    tacc_client::tls::pem_fingerprint(&pem).map_err(|e| anyhow::anyhow!("{}: {e}", cert.display()))
}

/// How an agent trusts an `https://` server.
#[derive(Debug, Args)]
pub struct AgentTlsArgs {
    /// SHA-256 fingerprint of the server's certificate (as printed by `taccd admin
    /// tls-init`): trust exactly that certificate, e.g. a self-signed one.
    #[arg(long, value_name = "HEX", env = "TACC_SERVER_FINGERPRINT")]
    pub server_fingerprint: Option<String>,
    /// PEM file of the CA that signed the server's certificate (instead of the public
    /// web PKI roots).
    #[arg(long, value_name = "PEM", conflicts_with = "server_fingerprint")]
    pub server_ca: Option<PathBuf>,
}

impl AgentTlsArgs {
    /// A client of `server` that trusts it as these options say.
    pub fn client(&self, server: &str) -> Result<tacc_client::Client> {
        let client = tacc_client::Client::new(server);
        if let Some(fingerprint) = &self.server_fingerprint {
            return Ok(client.with_pinned_fingerprint(fingerprint)?);
        }
        if let Some(ca) = &self.server_ca {
            let pem = std::fs::read(ca)
                .with_context(|| format!("cannot read the CA certificate {}", ca.display()))?;
            return Ok(client.with_ca(&pem)?);
        }
        Ok(client)
    }
}

/// `taccd admin tls-init`: a self-signed certificate for a lab without a CA.
#[derive(Debug, Args)]
pub struct TlsInitArgs {
    /// The server's data directory (`taccd admin --data-dir`); the certificate and key
    /// go to DATA_DIR/tls/.
    #[arg(skip)]
    pub data_dir: PathBuf,
    /// A DNS name clients use for the server (repeatable; default: this host's name and
    /// localhost, plus 127.0.0.1, when neither --host nor --ip is given).
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,
    /// An IP address clients use for the server (repeatable).
    #[arg(long = "ip", value_name = "ADDR")]
    pub ips: Vec<IpAddr>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 3650)]
    pub days: u32,
    /// Replace an existing certificate and key (clients pinned to the old one must be
    /// given the new fingerprint).
    #[arg(long)]
    pub force: bool,
}

pub fn init(args: TlsInitArgs) -> Result<()> {
    let (hosts, ips) = if args.hosts.is_empty() && args.ips.is_empty() {
        (
            vec![crate::host_name(), "localhost".to_string()],
            vec![IpAddr::from([127, 0, 0, 1])],
        )
    } else {
        (args.hosts.clone(), args.ips.clone())
    };
    let mut names = hosts.clone();
    names.dedup();
    names.extend(ips.iter().map(IpAddr::to_string));

    let dir = args.data_dir.join("tls");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    if !args.force {
        for path in [&cert_path, &key_path] {
            if path.exists() {
                bail!(
                    "{} already exists; clients may have pinned it. Use --force to replace it \
                     (then give every client the new fingerprint)",
                    path.display()
                );
            }
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;

    let (cert_pem, key_pem, der) = self_signed(&names, args.days)?;
    write_new(&key_path, key_pem.as_bytes(), 0o600)?;
    write_new(&cert_path, cert_pem.as_bytes(), 0o644)?;
    let fingerprint = tacc_client::tls::fingerprint(&der);

    let host = match (hosts.first(), ips.first()) {
        (Some(host), _) => host.clone(),
        (None, Some(IpAddr::V6(ip))) => format!("[{ip}]"),
        (None, Some(ip)) => ip.to_string(),
        (None, None) => unreachable!("at least one name"),
    };
    let data_dir = args.data_dir.display();
    let (cert, key) = (cert_path.display(), key_path.display());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Wrote a self-signed certificate for {}:\n  certificate  {cert}\n  private key  {key} (mode 0600: keep it secret)\n\nSHA-256 fingerprint: {fingerprint}\n\nServe with it:\n  taccd server --data-dir {data_dir} --listen 0.0.0.0:8383 --tls-cert {cert} --tls-key {key}\nOn each user's machine, pin it:\n  tcloud config add lab https://{host}:8383 --fingerprint {fingerprint}\nOn each node:\n  taccd agent --server https://{host}:8383 --server-fingerprint {fingerprint} --data-dir /var/lib/tacc-agent",
        names.join(", ")
    )?;
    Ok(())
}

/// A self-signed certificate for `names` (DNS names or IP addresses): its PEM, its key's
/// PEM and its DER.
fn self_signed(names: &[String], days: u32) -> Result<(String, String, Vec<u8>)> {
    let mut params = rcgen::CertificateParams::new(names.to_vec())
        .context("invalid name for the certificate")?;
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(
        rcgen::DnType::CommonName,
        format!("TACC server {}", names[0]),
    );
    params.distinguished_name = subject;
    let now = time::OffsetDateTime::now_utc();
    // A day of slack for clocks behind ours.
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(i64::from(days));
    let key = rcgen::KeyPair::generate().context("cannot generate a key pair")?;
    let cert = params
        .self_signed(&key)
        .context("cannot sign the certificate")?;
    Ok((cert.pem(), key.serialize_pem(), cert.der().to_vec()))
}

/// Write `bytes` to `path` with `mode`, atomically: a reader sees the old file or the
/// whole new one, and a key is never readable by others, not even while being written.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let partial = path.with_extension("pem.partial");
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(insecure: bool, tls: bool) -> ServerTlsArgs {
        ServerTlsArgs {
            tls_cert: tls.then(|| PathBuf::from("cert.pem")),
            tls_key: tls.then(|| PathBuf::from("key.pem")),
            insecure,
        }
    }

    #[test]
    fn loopback_needs_no_tls() {
        for listen in [
            "127.0.0.1:8383",
            "127.1.2.3:0",
            "[::1]:8383",
            "[::ffff:127.0.0.1]:80",
        ] {
            let listen = listen.parse().unwrap();
            args(false, false)
                .check_exposure(listen, Path::new("/d"))
                .unwrap();
        }
    }

    #[test]
    fn other_addresses_need_tls_or_insecure() {
        for listen in [
            "0.0.0.0:8383",
            "[::]:8383",
            "10.0.0.1:8383",
            "[::ffff:10.0.0.1]:80",
        ] {
            let listen = listen.parse().unwrap();
            let error = args(false, false)
                .check_exposure(listen, Path::new("/d"))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("taccd admin tls-init --data-dir /d"),
                "{error}"
            );
            assert!(error.contains("--insecure"), "{error}");
            args(true, false)
                .check_exposure(listen, Path::new("/d"))
                .unwrap();
            args(false, true)
                .check_exposure(listen, Path::new("/d"))
                .unwrap();
        }
    }

    #[test]
    fn self_signed_certificates_load_as_the_servers_and_match_their_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["tacc-head".to_string(), "10.1.2.3".to_string()];
        let (cert, key, der) = self_signed(&names, 30).unwrap();
        std::fs::write(dir.path().join("cert.pem"), &cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), &key).unwrap();
        let loaded = tacc_server::TlsConfig::from_pem_files(
            &dir.path().join("cert.pem"),
            &dir.path().join("key.pem"),
        )
        .unwrap();
        assert_eq!(loaded.certificate_der(), der.as_slice());
        assert_eq!(
            file_fingerprint(&dir.path().join("cert.pem")).unwrap(),
            tacc_client::tls::fingerprint(&der)
        );
    }
}
