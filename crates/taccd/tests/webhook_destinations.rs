//! Where webhook notifications may go, against a real `taccd dev`: a user's `notify:`
//! cannot make the server call loopback or internal addresses (its own admin API, a
//! metadata service) unless the operator allows them — refused at submit when the URL
//! names a literal address, and at send time when a host name resolves to one (never
//! connected to, given up at once, audited with the reason). The operator's allowance
//! lets them through.

mod common;

use common::webhook::Receiver;
use common::*;
use tacc_client::{Client, ClientError};
use tacc_core::TaskState;

async fn set_hook_key(client: &Client) {
    client
        .put_secret("HOOK_KEY", b"webhook-destination-key".to_vec())
        .await
        .unwrap();
}

fn notified_task(url: &str) -> String {
    format!("name: notified\nnotify: {{webhook: \"{url}\", secret: HOOK_KEY}}\nrun: echo done\n")
}

/// Submit a task file through the API; the error it was refused with, if it was.
async fn try_submit(client: &Client, root: &std::path::Path, yaml: &str) -> Option<ClientError> {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join("task.yaml"), yaml).unwrap();
    let loaded = tacc_schema::load_task(root).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    client
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_to_a_literal_internal_address_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    set_hook_key(&client).await;
    let (receiver, url) = Receiver::start(0).await;
    let port = daemon.url.rsplit(':').next().unwrap().to_string();
    for (i, (hook, kind)) in [
        (url.clone(), "loopback"),
        // The finding: the server posting to its own admin API.
        (format!("http://127.0.0.1:{port}/v1/admin/gc"), "loopback"),
        (format!("http://[::ffff:127.0.0.1]:{port}/x"), "loopback"),
        (
            "http://169.254.169.254/latest/meta-data".to_string(),
            "link-local",
        ),
        ("http://10.0.0.7/hook".to_string(), "private"),
    ]
    .into_iter()
    .enumerate()
    {
        let error = try_submit(
            &client,
            &dir.path().join(format!("t{i}")),
            &notified_task(&hook),
        )
        .await
        .unwrap_or_else(|| panic!("{hook} was accepted"));
        let ClientError::Api { code, message, .. } = &error else {
            panic!("{hook}: {error}");
        };
        assert_eq!(code, "invalid_task", "{message}");
        for part in ["notify.webhook", kind, "--webhook-allow-private"] {
            assert!(message.contains(part), "{hook}: `{part}` not in: {message}");
        }
    }
    // `tcloud submit` points at the line of the task file that wrote the webhook.
    let task_dir = dir.path().join("by-tcloud");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(task_dir.join("task.yaml"), notified_task(&url)).unwrap();
    let output = std::process::Command::new(tcloud_binary())
        .args(["submit", task_dir.to_str().unwrap()])
        .env("TACC_HOME", dir.path().join("home"))
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("task.yaml:2:") && stderr.contains("loopback address"),
        "{stderr}"
    );
    assert!(receiver.requests().is_empty());
    let queued = client
        .list_tasks(&tacc_client::TaskQuery::default())
        .await
        .unwrap();
    assert!(queued.is_empty(), "a refused task was queued: {queued:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_name_that_resolves_to_loopback_is_never_called() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    set_hook_key(&client).await;
    let (receiver, url) = Receiver::start(0).await;
    // A host name is not an address: accepted at submit, checked once resolved.
    let hook = url.replace("127.0.0.1", "localhost");
    let task = submit(&client, dir.path(), "named", &notified_task(&hook), &[]).await;
    assert_eq!(
        wait_terminal(&client, task).await.state,
        TaskState::Succeeded
    );
    let refusal = eventually("the refusal to be audited", DEADLINE, || {
        let client = client.clone();
        async move {
            client
                .audit(200)
                .await
                .ok()?
                .into_iter()
                .find(|e| e.action == "notify.refused")
        }
    })
    .await;
    assert!(
        refusal.detail.contains("localhost resolves to")
            && refusal.detail.contains("loopback")
            && refusal.detail.contains("--webhook-allow"),
        "{refusal:?}"
    );
    assert!(refusal.target.contains(&hook), "{refusal:?}");
    // Given up at once: the refusal is the delivery's end, so nothing can follow it.
    assert!(
        receiver.requests().is_empty(),
        "the receiver was called: {:?}",
        receiver.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_range_is_delivered_to() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "1", "--webhook-allow", "127.0.0.0/8"],
    )
    .await;
    let client = daemon.client();
    set_hook_key(&client).await;
    let (receiver, url) = Receiver::start(0).await;
    // By name (localhost may also resolve to ::1, which stays refused: the allowed
    // 127.0.0.1 is what is connected to) and by address.
    let by_name = url.replace("127.0.0.1", "localhost");
    for (name, hook) in [("by-name", &by_name), ("by-address", &url)] {
        let task = submit(&client, dir.path(), name, &notified_task(hook), &[]).await;
        assert_eq!(
            wait_terminal(&client, task).await.state,
            TaskState::Succeeded
        );
    }
    eventually("both notifications to arrive", DEADLINE, || {
        let receiver = receiver.clone();
        async move { (receiver.requests().len() == 2).then_some(()) }
    })
    .await;
}
