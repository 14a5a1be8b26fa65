//! The live server runs the scheduler crate unchanged, configured from its file: limits
//! hold tasks back with a reason, `why` explains, bad configuration is refused.

mod common;

use common::*;
use tacc_core::TaskState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_limits_from_the_configuration_hold_tasks_with_a_reason_and_an_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "policy = \"fairshare\"\n\n[users.alice]\ngroup = \"vision\"\nmax_running_tasks = 1\n\n[groups.vision]\nguaranteed_gpus = 0\nmax_cpus = 64\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let alice = daemon.user_client("alice", Some("vision"), "user").await;
    let marker = format!("limits-{}", std::process::id());
    let yaml = format!(
        "name: limited\nresources: {{cpus: 0.5, time_limit: 2m}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 300\n"
    );
    let first = submit(&alice, dir.path(), "first", &yaml, &[]).await;
    wait_state(&alice, first, &[TaskState::Running]).await;
    let second = submit(&alice, dir.path(), "second", &yaml, &[]).await;
    let view = eventually("the second task's pending reason", DEADLINE, || {
        let alice = alice.clone();
        async move {
            let view = alice.get_task(second).await.ok()?;
            view.reason.is_some().then_some(view)
        }
    })
    .await;
    assert_eq!(view.state, TaskState::Queued);
    let reason = view.reason.clone().unwrap();
    assert!(
        reason.contains("over user quota") && reason.contains("1"),
        "{reason}"
    );

    let why = alice.explain(second).await.unwrap();
    assert_eq!(why.policy, "fairshare");
    assert_eq!(why.queue_position, Some(0));
    assert!(
        why.details.iter().any(|d| d.contains("group vision")),
        "{why:?}"
    );
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("at most 1 running tasks")),
        "{why:?}"
    );
    // A different user is not held back by alice's limit.
    let bob = daemon.user_client("bob", None, "user").await;
    let bobs = submit(
        &bob,
        dir.path(),
        "bobs",
        "name: bobs\nresources: {cpus: 0.5}\nrun: echo hi\n",
        &[],
    )
    .await;
    assert_eq!(wait_terminal(&bob, bobs).await.state, TaskState::Succeeded);

    alice.cancel(first).await.unwrap();
    wait_state(&alice, second, &[TaskState::Running]).await;
    alice.cancel(second).await.unwrap();
    wait_terminal(&alice, second).await;
    wait_no_processes(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_estimate_comes_from_time_limits() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    let marker = format!("estimate-{}", std::process::id());
    let yaml = format!(
        "name: timed\nresources: {{cpus: 1, time_limit: 10m}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 300\n"
    );
    let running = submit(&client, dir.path(), "running", &yaml, &[]).await;
    wait_state(&client, running, &[TaskState::Running]).await;
    let waiting = submit(&client, dir.path(), "waiting", &yaml, &[]).await;
    let view = eventually("an estimate", DEADLINE, || {
        let client = client.clone();
        async move {
            let view = client.get_task(waiting).await.ok()?;
            view.estimated_start.map(|at| (view, at))
        }
    })
    .await;
    let (view, at) = view;
    let started = client.get_task(running).await.unwrap().started_at.unwrap();
    // The running task may use its whole 10 minutes; the waiting one starts after that.
    let expected = started.plus_secs(600);
    assert!(
        at.millis_since(expected) < 5_000 && expected.millis_since(at) < 5_000,
        "{at:?} vs {expected:?}"
    );
    assert_eq!(view.state, TaskState::Queued);
    client.cancel(waiting).await.unwrap();
    client.cancel(running).await.unwrap();
    wait_terminal(&client, running).await;
    wait_no_processes(&marker).await;
}

#[test]
fn bad_configuration_is_refused_with_the_file_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[users.alice]\nmax_gpu = 3\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("d"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("max_gpu"), "{err}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--policy",
            "sjf",
            "--data-dir",
        ])
        .arg(dir.path().join("d2"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sjf") && err.contains("simulator"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_task_preempts_a_preemptible_one_which_is_requeued() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "policy = \"fairshare\"\n\n[preemption]\ngrace_secs = 1\nmin_run_secs = 0\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "1", "--config", config.to_str().unwrap()],
    )
    .await;
    let client = daemon.client();
    let marker = format!("preempted-{}", std::process::id());
    let low = submit(
        &client,
        dir.path(),
        "low",
        &format!(
            "name: low\npriority: low\npreemptible: true\nresources: {{cpus: 1}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo attempt $TACC_ATTEMPT\n  if [ \"$TACC_ATTEMPT\" = 1 ]; then sleep 300 & wait; fi\n"
        ),
        &[],
    )
    .await;
    wait_state(&client, low, &[TaskState::Running]).await;
    let high = submit(
        &client,
        dir.path(),
        "high",
        "name: high\npriority: high\nresources: {cpus: 1}\nrun: echo urgent\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&client, high).await.state,
        TaskState::Succeeded
    );
    let view = wait_terminal(&client, low).await;
    assert_eq!(
        (view.state, view.attempt.0),
        (TaskState::Succeeded, 2),
        "{view:?}"
    );
    let events = client.task_events(low).await.unwrap();
    assert!(
        events.iter().any(|e| e.state == TaskState::Queued
            && e.reason.as_deref() == Some("preempted during attempt 1")),
        "{events:?}"
    );
    wait_no_processes(&marker).await;
}

/// A user the configuration file does not list is accounted to the group of their
/// identity (`taccd admin user add NAME --group G`): the group's limits hold them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_limits_apply_to_the_group_of_a_users_identity() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "policy = \"fairshare\"\n\n[groups.vision]\nmax_running_tasks = 1\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let carol = daemon.user_client("carol", Some("vision"), "user").await;
    let dave = daemon.user_client("dave", Some("vision"), "user").await;
    let erin = daemon.user_client("erin", Some("nlp"), "user").await;
    let yaml = "name: held\nresources: {cpus: 0.5, time_limit: 2m}\nrun: sleep 300\n";
    let first = submit(&carol, dir.path(), "first", yaml, &[]).await;
    wait_state(&carol, first, &[TaskState::Running]).await;
    let second = submit(&dave, dir.path(), "second", yaml, &[]).await;
    let view = eventually("dave's pending reason", DEADLINE, || {
        let dave = dave.clone();
        async move {
            let view = dave.get_task(second).await.ok()?;
            view.reason.is_some().then_some(view)
        }
    })
    .await;
    assert_eq!(view.state, TaskState::Queued);
    let reason = view.reason.unwrap();
    assert!(reason.contains("group"), "{reason}");
    // Another group is not held back.
    let other = submit(
        &erin,
        dir.path(),
        "other",
        "name: other\nresources: {cpus: 0.5}\nrun: echo hi\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&erin, other).await.state,
        TaskState::Succeeded
    );
    carol.cancel(first).await.unwrap();
    wait_state(&dave, second, &[TaskState::Running]).await;
    dave.cancel(second).await.unwrap();
    wait_terminal(&dave, second).await;
}
