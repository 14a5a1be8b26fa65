//! Shares of one GPU (`gpus: 0.5`) through a real `taccd dev --gpus 1`: two halves of one
//! user run at the same time on GPU 0 (both see `CUDA_VISIBLE_DEVICES=0`); two halves of
//! users in different groups never share it (fail-closed tenancy: the second waits for
//! the first to end); a user limited to one GPU runs two halves at once and the third
//! waits, over quota.

mod common;

use std::path::Path;

use common::*;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

/// A half-GPU task: prints its GPUs, notes when it starts and ends (ns since the epoch)
/// in the markers directory, and in between waits (at most a minute) for `wait_for` to
/// exist there; it fails if that never comes.
fn half(name: &str, markers: &Path, wait_for: &str, marker: &str) -> String {
    let m = markers.display();
    format!(
        "name: {name}\nresources: {{cpus: 0.25, gpus: 0.5, time_limit: 5m}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo gpus=$CUDA_VISIBLE_DEVICES share=$TACC_GPUS\n  date +%s%N > {m}/{name}.start\n  for i in $(seq 600); do [ -e {m}/{wait_for} ] && break; sleep 0.1; done\n  [ -e {m}/{wait_for} ] || exit 3\n  date +%s%N > {m}/{name}.end\n"
    )
}

fn stamp(markers: &Path, file: &str) -> u128 {
    std::fs::read_to_string(markers.join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

async fn succeeded_on_gpu_0(client: &Client, task: TaskId) {
    let view = wait_terminal(client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let log = log_text(client, task).await;
    assert!(log.contains("gpus=0 share=0.5"), "{log}");
}

/// The reason a queued task waits, once it has one.
async fn pending_reason(client: &Client, task: TaskId) -> String {
    eventually("a pending reason", DEADLINE, || {
        let client = client.clone();
        async move {
            let view = client.get_task(task).await.ok()?;
            (view.state == TaskState::Queued)
                .then_some(view.reason)
                .flatten()
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_halves_of_one_user_run_together_on_gpu_0() {
    let dir = tempfile::tempdir().unwrap();
    let markers = markers_dir(dir.path());
    let daemon = start("dev", &dir.path().join("d"), &["--gpus", "1"]).await;
    let alice = daemon.user_client("alice", Some("vision"), "user").await;
    let marker = format!("share-same-{}", std::process::id());
    // Each waits for the other to have started: both succeed only if they overlapped.
    let a = submit(
        &alice,
        dir.path(),
        "a",
        &half("a", &markers, "b.start", &marker),
        &[],
    )
    .await;
    let b = submit(
        &alice,
        dir.path(),
        "b",
        &half("b", &markers, "a.start", &marker),
        &[],
    )
    .await;
    succeeded_on_gpu_0(&alice, a).await;
    succeeded_on_gpu_0(&alice, b).await;
    let (a_start, a_end) = (stamp(&markers, "a.start"), stamp(&markers, "a.end"));
    let (b_start, b_end) = (stamp(&markers, "b.start"), stamp(&markers, "b.end"));
    assert!(
        a_start < b_end && b_start < a_end,
        "a ran {a_start}..{a_end}, b {b_start}..{b_end}: no overlap"
    );
    wait_no_processes(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halves_of_users_in_different_groups_never_share_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let markers = markers_dir(dir.path());
    let daemon = start("dev", &dir.path().join("d"), &["--gpus", "1"]).await;
    let alice = daemon.user_client("alice", Some("vision"), "user").await;
    let bob = daemon.user_client("bob", Some("nlp"), "user").await;
    let marker = format!("share-apart-{}", std::process::id());
    let a = submit(
        &alice,
        dir.path(),
        "a",
        &half("a", &markers, "release", &marker),
        &[],
    )
    .await;
    wait_state(&alice, a, &[TaskState::Running]).await;
    // Half of the GPU is free, but it is alice's: bob's half waits for a whole GPU.
    let b = submit(
        &bob,
        dir.path(),
        "b",
        &half("b", &markers, "a.end", &marker),
        &[],
    )
    .await;
    let reason = pending_reason(&bob, b).await;
    assert!(reason.contains("waiting for resources"), "{reason}");
    assert_eq!(alice.get_task(a).await.unwrap().state, TaskState::Running);
    std::fs::write(markers.join("release"), "").unwrap();
    succeeded_on_gpu_0(&alice, a).await;
    succeeded_on_gpu_0(&bob, b).await;
    let (a_end, b_start) = (stamp(&markers, "a.end"), stamp(&markers, "b.start"));
    assert!(
        a_end <= b_start,
        "alice's half ended at {a_end}, bob's started at {b_start}"
    );
    wait_no_processes(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_gpu_quota_holds_two_halves_and_the_third_waits() {
    let dir = tempfile::tempdir().unwrap();
    let markers = markers_dir(dir.path());
    let config = dir.path().join("tacc.toml");
    std::fs::write(&config, "[users.carol]\ngroup = \"vision\"\nmax_gpus = 1\n").unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--gpus", "2", "--config", config.to_str().unwrap()],
    )
    .await;
    let carol = daemon.user_client("carol", Some("vision"), "user").await;
    let marker = format!("share-quota-{}", std::process::id());
    let a = submit(
        &carol,
        dir.path(),
        "a",
        &half("a", &markers, "release", &marker),
        &[],
    )
    .await;
    let b = submit(
        &carol,
        dir.path(),
        "b",
        &half("b", &markers, "release", &marker),
        &[],
    )
    .await;
    wait_state(&carol, a, &[TaskState::Running]).await;
    wait_state(&carol, b, &[TaskState::Running]).await;
    // A second GPU is free, but carol's two halves are her one GPU.
    let c = submit(
        &carol,
        dir.path(),
        "c",
        &half("c", &markers, "release", &marker),
        &[],
    )
    .await;
    let reason = pending_reason(&carol, c).await;
    assert!(
        reason.contains("over user quota: at most 1 GPUs"),
        "{reason}"
    );
    std::fs::write(markers.join("release"), "").unwrap();
    for task in [a, b, c] {
        succeeded_on_gpu_0(&carol, task).await;
    }
    wait_no_processes(&marker).await;
}
