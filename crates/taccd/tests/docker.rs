//! TACC's container runtime against a real Docker engine: `taccd dev` with the engine at
//! /var/run/docker.sock and the locally built `tacc-test/busybox` image
//! (scripts/ci/setup-docker.sh starts the engine and builds the image).
//!
//! Without an engine these tests say SKIPPED loudly and pass — except in CI (`CI=true`),
//! where a missing engine is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use futures::StreamExt;
use tacc_core::{AttemptNo, TaskId, TaskState};

const SOCKET: &str = "/var/run/docker.sock";
const TEST_IMAGE: &str = "tacc-test/busybox:latest";

/// Whether the engine answers and has the test image; panics in CI when not.
fn docker_ready(test: &str) -> bool {
    let why = match Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", TEST_IMAGE])
        .output()
    {
        Ok(out) if out.status.success() => return true,
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("docker cannot run: {e}"),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: Docker with {TEST_IMAGE} is required in CI but is not usable ({why}); run scripts/ci/setup-docker.sh"
        );
    }
    // Straight to the terminal: the test harness swallows eprintln! of passing tests.
    use std::io::Write;
    let _ = write!(
        std::io::stderr(),
        "\n######## SKIPPED {test}: no Docker engine with {TEST_IMAGE} here ({why}).\n######## Run `sudo scripts/ci/setup-docker.sh` (or scripts/test.sh as root) to test against real Docker.\n"
    );
    false
}

/// Ids of the containers (running or not) the `taccd dev` in `dev_dir` labelled with
/// this task (task ids restart at 1 in every test's server, the owner label does not).
fn containers_of(dev_dir: &Path, task: TaskId) -> Vec<String> {
    let owner = std::fs::canonicalize(dev_dir.join("agent")).unwrap();
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=tacc.task={task}"),
            "--filter",
            &format!("label=tacc.owner={}", owner.display()),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

async fn wait_no_containers(dev_dir: &Path, task: TaskId) {
    eventually(
        "the task's containers to be removed",
        DEADLINE,
        || async move { containers_of(dev_dir, task).is_empty().then_some(()) },
    )
    .await;
}

/// The working directory of the task's first attempt on the `taccd dev` agent.
fn workdir_of(dev_dir: &Path, task: TaskId) -> PathBuf {
    dev_dir
        .join("agent")
        .join("work")
        .join(format!("{task}-1-r0"))
}

/// A script that waits (with a deadline) until the test drops `release` in its workdir.
const WAIT_FOR_RELEASE: &str =
    "  i=0; while [ ! -f release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_task_runs_with_its_limits_live_logs_and_outputs() {
    if !docker_ready("docker_task_runs_with_its_limits_live_logs_and_outputs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dev = start(
        "dev",
        &dev_dir,
        &["--docker-socket", SOCKET, "--cpus", "2", "--memory", "1GiB"],
    )
    .await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let yaml = format!(
        "name: boxed\nresources: {{cpus: 0.5, memory: 64MiB}}\nenvironment:\n  image: {TEST_IMAGE}\n  vars: {{GREETING: hello-from-vars}}\noutputs: [results/]\nrun: |\n  \
         if [ -f /sys/fs/cgroup/memory.max ]; then mem=$(cat /sys/fs/cgroup/memory.max); else mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes); fi\n  \
         if [ -f /sys/fs/cgroup/cpu.max ]; then set -- $(cat /sys/fs/cgroup/cpu.max); q=$1; p=$2; else q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); p=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); fi\n  \
         echo \"memory limit $mem\"\n  echo \"cpu quota $q period $p\"\n  \
         echo \"dockerenv $(test -f /.dockerenv && echo yes || echo no) $GREETING workdir-ok $(test \"$(pwd)\" = \"$TACC_WORKDIR\" && echo yes || echo no) code $(cat code.txt)\"\n  \
         echo to-stderr >&2\n  echo first-live\n{WAIT_FOR_RELEASE}  mkdir -p results && echo 42 > results/answer.txt\n  echo last-line\n"
    );
    let task = submit(
        &client,
        dir.path(),
        "boxed",
        &yaml,
        &[("code.txt", "snapshot-code")],
    )
    .await;
    // Live: the first lines arrive while the container still runs.
    let early = wait_log(&client, task, "first-live").await;
    assert!(!early.contains("last-line"), "{early}");
    assert_eq!(
        client.get_task(task).await.unwrap().state,
        TaskState::Running
    );
    assert_eq!(
        containers_of(&dev_dir, task).len(),
        1,
        "one labelled container per attempt"
    );
    let view = client.get_task(task).await.unwrap();
    assert!(
        view.reason
            .as_deref()
            .unwrap_or_default()
            .contains("runtime container: the task names a container image"),
        "{view:?}"
    );
    std::fs::write(workdir_of(&dev_dir, task).join("release"), "").unwrap();
    let mut follow = client.follow_logs(task, 0).await.unwrap();
    let mut followed = Vec::new();
    while let Some(chunk) = follow.next().await {
        followed.extend_from_slice(&chunk.unwrap());
    }
    let log = String::from_utf8(followed).unwrap();
    let view = wait_terminal(&client, task).await;
    println!("container task log:\n{log}");
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert!(
        log.contains(&format!("memory limit {}", 64 * 1024 * 1024)),
        "{log}"
    );
    let quota_line = log.lines().find(|l| l.starts_with("cpu quota")).unwrap();
    let numbers: Vec<u64> = quota_line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers[0] * 1000 / numbers[1], 500, "0.5 CPU: {quota_line}");
    assert!(
        log.contains("dockerenv yes hello-from-vars workdir-ok yes code snapshot-code"),
        "{log}"
    );
    assert!(
        log.contains("to-stderr") && log.contains("last-line"),
        "{log}"
    );
    let outputs = client.list_outputs(task).await.unwrap();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert_eq!(outputs[0].path, "results/answer.txt");
    let answer = client
        .get_output(task, AttemptNo(1), "results/answer.txt")
        .await
        .unwrap();
    assert_eq!(&answer[..], b"42\n");
    wait_no_containers(&dev_dir, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_cancel_stops_and_removes_the_container() {
    if !docker_ready("docker_cancel_stops_and_removes_the_container") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dev = start("dev", &dev_dir, &["--docker-socket", SOCKET]).await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let yaml = format!(
        "name: endless\nenvironment: {{image: {TEST_IMAGE}}}\nrun: |\n  echo ready\n  sleep 300\n"
    );
    let task = submit(&client, dir.path(), "endless", &yaml, &[]).await;
    wait_log(&client, task, "ready").await;
    assert_eq!(containers_of(&dev_dir, task).len(), 1);
    client.cancel(task).await.unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    wait_no_containers(&dev_dir, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcloud_exec_into_a_container_task_sees_the_container_as_the_task() {
    if !docker_ready("tcloud_exec_into_a_container_task_sees_the_container_as_the_task") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dev = start("dev", &dev_dir, &["--docker-socket", SOCKET]).await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let yaml = format!(
        "name: boxed\nenvironment:\n  image: {TEST_IMAGE}\n  vars: {{GREETING: hello-from-vars}}\nrun: |\n  \
         echo task-uid=$(id -u)\n  echo ready\n  sleep 300\n"
    );
    let task = submit(&client, dir.path(), "boxed", &yaml, &[]).await;
    let log = wait_log(&client, task, "ready").await;
    let task_uid = log
        .lines()
        .find_map(|l| l.strip_prefix("task-uid="))
        .expect("the task's uid in its log")
        .to_string();
    let home = dir.path().join("home");
    let id = task.to_string();
    // What the command sees is the container: the image's filesystem (busybox, no
    // /etc/os-release), the task's uid, directory and variables.
    let script = "echo uid=$(id -u); echo dockerenv=$(test -f /.dockerenv && echo yes); \
                  echo os-release=$(cat /etc/os-release 2>/dev/null | head -n 1 || true); \
                  echo pwd-is-workdir=$(test \"$(pwd)\" = \"$TACC_WORKDIR\" && echo yes); \
                  echo greeting=$GREETING; echo sh=$(readlink /bin/sh)";
    let out = tcloud(&dev, &home, &["exec", &id, "--", "sh", "-c", script]);
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    };
    assert_eq!(field("uid").as_deref(), Some(task_uid.as_str()), "{out}");
    assert_eq!(field("dockerenv").as_deref(), Some("yes"), "{out}");
    assert_eq!(
        field("os-release").as_deref(),
        Some(""),
        "the host's: {out}"
    );
    assert_eq!(field("pwd-is-workdir").as_deref(), Some("yes"), "{out}");
    assert_eq!(
        field("greeting").as_deref(),
        Some("hello-from-vars"),
        "{out}"
    );
    assert_eq!(field("sh").as_deref(), Some("/bin/busybox"), "{out}");
    // Its exit status is tcloud's.
    let status = Command::new(tcloud_binary())
        .args(["exec", &id, "--", "sh", "-c", "exit 6"])
        .env("TACC_HOME", &home)
        .env("TACC_SERVER", &dev.url)
        .env("TACC_TOKEN", &dev.token)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(6));
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
    wait_no_containers(&dev_dir, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_missing_image_fails_as_image_not_found() {
    if !docker_ready("docker_missing_image_fails_as_image_not_found") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dev = start("dev", &dev_dir, &["--docker-socket", SOCKET]).await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let task = submit(
        &client,
        dir.path(),
        "missing",
        "name: missing\nenvironment: {image: tacc-test/no-such-image:never}\nrun: echo never\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("image_not_found"), "{reason}");
    assert!(reason.contains("tacc-test/no-such-image:never"), "{reason}");
    assert!(containers_of(&dev_dir, task).is_empty());
}

/// The node is set up to isolate tasks in a default image, but its engine does not
/// answer: a task without an image runs as a process and is told so; a task with an
/// image is never run without it and fails as `runtime_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_switches_to_a_process_only_for_tasks_without_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dead_socket = dir.path().join("no-engine.sock").display().to_string();
    let dev = start(
        "dev",
        &dev_dir,
        &[
            "--docker-socket",
            &dead_socket,
            "--container-image",
            TEST_IMAGE,
        ],
    )
    .await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let task = submit(
        &client,
        dir.path(),
        "plain",
        &format!("name: plain\nrun: |\n  echo \"running in $TACC_WORKDIR\"\n{WAIT_FOR_RELEASE}"),
        &[],
    )
    .await;
    let log = wait_log(&client, task, "running in").await;
    assert!(
        log.contains("tacc: switched to process: container is unavailable (the container runtime is unavailable: Docker engine at"),
        "{log}"
    );
    let view = client.get_task(task).await.unwrap();
    let reason = view.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("runtime process: switched to process"),
        "{view:?}"
    );
    std::fs::write(workdir_of(&dev_dir, task).join("release"), "").unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");

    let boxed = submit(
        &client,
        dir.path(),
        "boxed",
        &format!("name: boxed\nenvironment: {{image: {TEST_IMAGE}}}\nrun: echo never\n"),
        &[],
    )
    .await;
    let view = wait_terminal(&client, boxed).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("runtime_unavailable"), "{reason}");
    assert!(reason.contains("runs only in a container"), "{reason}");
    assert!(!log_text(&client, boxed).await.contains("never"));
}

/// An agent that died (kill -9) leaves its container running; the agent's next life finds
/// it by its owner label and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_removes_the_containers_it_left() {
    if !docker_ready("a_restarted_agent_removes_the_containers_it_left") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let mut dev = start("dev", &dev_dir, &["--docker-socket", SOCKET]).await;
    let client = dev.client();
    wait_nodes(&client, 1).await;
    let yaml = format!(
        "name: orphan\nenvironment: {{image: {TEST_IMAGE}}}\nrun: |\n  echo ready\n  sleep 300\n"
    );
    let task = submit(&client, dir.path(), "orphan", &yaml, &[]).await;
    wait_log(&client, task, "ready").await;
    dev.crash();
    assert_eq!(
        containers_of(&dev_dir, task).len(),
        1,
        "the container outlives the agent"
    );
    let _dev = start("dev", &dev_dir, &["--docker-socket", SOCKET]).await;
    wait_no_containers(&dev_dir, task).await;
}
