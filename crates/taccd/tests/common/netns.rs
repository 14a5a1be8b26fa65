//! A multi-host cluster on one machine for tests and benchmarks: a TLS server on the
//! bridge of scripts/ci/setup-netns.sh and agents in its network namespaces (`tacc-hN`),
//! each with its own address, as on separate machines.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tacc_client::Client;
use tacc_core::TaskId;

use super::*;

pub const BRIDGE_ADDRESS: &str = "10.250.78.1";

pub fn namespace(host: u32) -> String {
    format!("tacc-h{host}")
}

/// Whether the test network is here; panics in CI when it is not.
pub fn network_ready(test: &str) -> bool {
    let missing: Vec<String> = (1..=4)
        .map(namespace)
        .filter(|ns| !Path::new("/var/run/netns").join(ns).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("network namespaces {} are missing", missing.join(", "));
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: the multi-host network is required in CI ({why}); run scripts/ci/setup-netns.sh"
        );
    }
    eprintln!(
        "\n######## SKIPPED {test}: no multi-host network here ({why}).\n######## Run `sudo scripts/ci/setup-netns.sh` (or scripts/test.sh as root).\n"
    );
    false
}

/// A TLS server on the bridge, its certificate's fingerprint, and a pinned admin client.
pub struct Cluster {
    pub server: Daemon,
    pub fingerprint: String,
    pub client: Client,
    pub root: PathBuf,
}

impl Cluster {
    pub async fn start(root: &Path, extra: &[&str]) -> Cluster {
        let data = root.join("server");
        let out = Command::new(env!("CARGO_BIN_EXE_taccd"))
            .args(["admin", "tls-init", "--data-dir"])
            .arg(&data)
            .args(["--host", BRIDGE_ADDRESS])
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fingerprint = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SHA-256 fingerprint: "))
            .unwrap()
            .to_string();
        let tls = data.join("tls");
        let (cert, key) = (
            tls.join("cert.pem").display().to_string(),
            tls.join("key.pem").display().to_string(),
        );
        let mut args = vec![
            "--listen",
            "10.250.78.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        args.extend_from_slice(extra);
        let server = launch("server", &data, &args).await;
        let client = Client::new(&server.url)
            .with_pinned_fingerprint(&fingerprint)
            .unwrap()
            .with_token(server.token.clone());
        eventually("the server to answer over the bridge", DEADLINE, || {
            let client = client.clone();
            async move { client.health().await.ok() }
        })
        .await;
        Cluster {
            server,
            fingerprint,
            client,
            root: root.to_path_buf(),
        }
    }

    /// An agent on host `host` (its own network namespace) named `name`.
    pub fn agent(&self, host: u32, name: &str, extra: &[&str]) -> Daemon {
        let data_dir = self.root.join(name);
        std::fs::create_dir_all(&data_dir).unwrap();
        let join = self.server.admin(&["agent-token", "--ttl", "1h"]);
        let token_file = super::write_token_file(&data_dir.join("join.token"), &join);
        let log = std::fs::File::create(data_dir.join("agent.log")).unwrap();
        // nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup hierarchy.
        let child = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", namespace(host)))
            .arg(env!("CARGO_BIN_EXE_taccd"))
            .args(["agent", "--server", &self.server.url, "--data-dir"])
            .arg(&data_dir)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--server-fingerprint", &self.fingerprint])
            .args(["--name", name])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Daemon {
            child,
            url: self.server.url.clone(),
            data_dir,
            token: String::new(),
        }
    }

    pub async fn submit(&self, name: &str, yaml: &str) -> TaskId {
        submit(&self.client, &self.root, name, yaml, &[]).await
    }
}

/// Take host `host`'s link to the bridge down (`up: false`) or up again.
pub fn set_link(host: u32, up: bool) {
    let status = Command::new("ip")
        .args(["link", "set", &format!("veth-{}", namespace(host))])
        .arg(if up { "up" } else { "down" })
        .status()
        .unwrap();
    assert!(status.success());
}

/// Brings a host's link back up however the test ends.
pub struct LinkGuard(pub u32);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        set_link(self.0, true);
    }
}

/// The address of host `host` on the bridge.
pub fn host_address(host: u32) -> String {
    format!("10.250.78.{}", 10 + host)
}
