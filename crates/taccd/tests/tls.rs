//! Transport security with real daemons: `taccd admin tls-init`, HTTPS with a pinned
//! self-signed certificate (tasks, log streams and agents all over TLS), the errors a
//! client gets for a wrong pin, an unpinned certificate or plain HTTP, and the refusal to
//! serve plain HTTP beyond loopback without `--insecure`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use futures::StreamExt;
use tacc_client::{Client, ClientError};
use tacc_core::TaskState;

fn taccd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_taccd"))
}

/// `taccd admin tls-init --data-dir DIR EXTRA…`; the fingerprint it printed.
fn tls_init(data_dir: &Path, extra: &[&str]) -> String {
    let output = taccd()
        .args(["admin", "tls-init", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("SHA-256 fingerprint: "))
        .unwrap_or_else(|| panic!("no fingerprint in:\n{stdout}"))
        .to_string()
}

/// The arguments that serve DIR/tls/{cert,key}.pem.
fn tls_args(data_dir: &Path) -> Vec<String> {
    let tls = data_dir.join("tls");
    vec![
        "--tls-cert".into(),
        tls.join("cert.pem").display().to_string(),
        "--tls-key".into(),
        tls.join("key.pem").display().to_string(),
    ]
}

fn pinned(url: &str, fingerprint: &str) -> Client {
    Client::new(url)
        .with_pinned_fingerprint(fingerprint)
        .unwrap()
}

/// Start `taccd MODE --data-dir DIR ARGS…` and wait for the URL it writes; the daemon is
/// not asked anything (its certificate may not be trusted by the default client).
async fn spawn(mode: &str, data_dir: &Path, args: &[String]) -> Daemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    launch(mode, data_dir, &args).await
}

async fn healthy(client: &Client) {
    eventually("the server to answer over TLS", DEADLINE, || {
        let client = client.clone();
        async move { client.health().await.ok() }
    })
    .await;
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_init_writes_a_private_key_and_refuses_to_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let first = tls_init(&data, &["--host", "head.lab.test", "--ip", "10.9.8.7"]);
    assert_eq!(first.len(), 64);
    assert!(
        first
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(mode(&data.join("tls")), 0o700);
    assert_eq!(mode(&data.join("tls/key.pem")), 0o600);
    let cert = std::fs::read(data.join("tls/cert.pem")).unwrap();
    assert_eq!(tacc_client::tls::pem_fingerprint(&cert).unwrap(), first);

    let again = taccd()
        .args(["admin", "tls-init", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert_eq!(std::fs::read(data.join("tls/cert.pem")).unwrap(), cert);

    let replaced = tls_init(&data, &["--force"]);
    assert_ne!(replaced, first);
    assert_eq!(mode(&data.join("tls/key.pem")), 0o600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_cluster_over_tls_runs_a_task_for_a_pinned_client() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let fingerprint = tls_init(&data, &[]);
    let mut args = tls_args(&data);
    args.extend(["--listen".into(), "127.0.0.1:0".into()]);
    let daemon = spawn("dev", &data, &args).await;
    assert!(
        daemon.url.starts_with("https://127.0.0.1:"),
        "{}",
        daemon.url
    );
    let client = pinned(&daemon.url, &fingerprint).with_token(daemon.token.clone());
    healthy(&client).await;
    // The embedded agent trusts its own server's certificate.
    wait_nodes(&client, 1).await;

    let task = submit(
        &client,
        dir.path(),
        "hello",
        "name: hello\nrun: echo over tls\n",
        &[],
    )
    .await;
    let mut stream = client.follow_logs(task, 0).await.unwrap();
    let mut followed = Vec::new();
    while let Some(chunk) = stream.next().await {
        followed.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&followed).contains("over tls"));
    assert_eq!(
        wait_terminal(&client, task).await.state,
        TaskState::Succeeded
    );

    // A client pinned to another certificate is told so, with both fingerprints.
    let other = "ab".repeat(32);
    let error = pinned(&daemon.url, &other).health().await.unwrap_err();
    let ClientError::Tls { reason, .. } = &error else {
        panic!("not a TLS error: {error:?}");
    };
    assert!(
        reason.contains(&fingerprint) && reason.contains(&format!("not the pinned {other}")),
        "{reason}"
    );

    // Without a pin, the self-signed certificate is not trusted, and the error says how
    // to pin it.
    let error = Client::new(&daemon.url).health().await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Tls { reason, .. } if reason.contains("--fingerprint")),
        "{error:?}"
    );

    // Plain HTTP to the TLS port gets an answer saying to use https://.
    let plain = daemon.url.replace("https://", "http://");
    let error = Client::new(&plain).health().await.unwrap_err();
    assert_eq!(error.code(), Some("tls_required"), "{error:?}");
    assert!(error.to_string().contains("https://"), "{error}");

    // A pin on an http:// URL would protect nothing: it is refused.
    let error = Client::new(&plain)
        .with_pinned_fingerprint(&fingerprint)
        .unwrap_err();
    assert!(error.to_string().contains("https://"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_agent_joins_through_its_server_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let fingerprint = tls_init(&data, &[]);
    let mut args = tls_args(&data);
    args.extend(["--listen".into(), "127.0.0.1:0".into()]);
    let mut server = spawn("server", &data, &args).await;
    let client = pinned(&server.url, &fingerprint).with_token(server.token.clone());
    healthy(&client).await;

    let _agent = start_agent(
        &server,
        &dir.path().join("agent"),
        &[
            "--name",
            "pinned-node",
            "--server-fingerprint",
            &fingerprint,
        ],
    );
    wait_nodes(&client, 1).await;
    let nodes = client.list_nodes().await.unwrap();
    assert_eq!(nodes[0].name, "pinned-node");

    // A clean stop over TLS: SIGTERM ends the server with success.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = eventually("the server to exit", DEADLINE, || {
        let status = server.child.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_beyond_loopback_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let refused = taccd()
        .args(["server", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("refusing to serve plain HTTP on 0.0.0.0:0")
            && stderr.contains("taccd admin tls-init")
            && stderr.contains("--insecure"),
        "{stderr}"
    );
    assert!(!data.join("taccd.json").exists());

    let args = ["--listen", "0.0.0.0:0", "--insecure"].map(String::from);
    let daemon = spawn("server", &data, &args).await;
    // Reach it over loopback only.
    let url = daemon.url.replace("0.0.0.0", "127.0.0.1");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    healthy(&Client::new(&url)).await;
}
