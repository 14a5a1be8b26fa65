//! Resource limits of the process runtime through a real `taccd dev`: each attempt runs
//! in a cgroup of its own, so a task over its `memory:` ends with `out_of_memory`, and
//! cancel kills processes that left the task's process group with `setsid`.
//!
//! Needs root and a writable cgroup hierarchy: elsewhere the tests say SKIPPED loudly and
//! pass, except in CI (`CI=true`), where they fail.

mod common;

use common::*;
use tacc_core::TaskState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_over_its_memory_limit_fails_with_out_of_memory() {
    if !cgroups_or_skip("a_task_over_its_memory_limit_fails_with_out_of_memory") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    let hog = submit(
        &client,
        dir.path(),
        "hog",
        "name: hog\nresources: {cpus: 1, memory: 64MiB}\nrun: |\n  echo allocating\n  head -c 300M /dev/zero | tail > /dev/null\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, hog).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("out_of_memory: "), "{reason}");
    assert!(reason.contains("64 MiB"), "{reason}");
    let log = log_text(&client, hog).await;
    assert!(log.contains("allocating"), "{log}");
    // The same work under the limit succeeds.
    let fits = submit(
        &client,
        dir.path(),
        "fits",
        "name: fits\nresources: {cpus: 1, memory: 64MiB}\nrun: head -c 16M /dev/zero | tail > /dev/null\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&client, fits).await.state,
        TaskState::Succeeded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_what_left_the_process_group() {
    if !cgroups_or_skip("cancel_kills_what_left_the_process_group") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    let marker = format!("setsid-{}", std::process::id());
    let task = submit(
        &client,
        dir.path(),
        "escaper",
        &format!(
            "name: escaper\nresources: {{cpus: 1}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  setsid bash -c 'trap \"\" TERM; exec sleep 300' &\n  echo started\n  sleep 300\n"
        ),
        &[],
    )
    .await;
    eventually("the task's output", DEADLINE, || {
        let client = client.clone();
        async move {
            log_text(&client, task)
                .await
                .contains("started")
                .then_some(())
        }
    })
    .await;
    // The script (bash runs its last command in its own process) and the `sleep` in a
    // session of its own.
    // (`setsid` runs in the forked child, so wait until it has: a session of its own.)
    eventually(
        "the escaped process in a session of its own",
        DEADLINE,
        || {
            let marker = marker.clone();
            async move {
                let sessions: std::collections::BTreeSet<_> = task_processes(&marker)
                    .iter()
                    .filter_map(|&p| {
                        nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(p as i32))).ok()
                    })
                    .collect();
                (sessions.len() >= 2).then_some(())
            }
        },
    )
    .await;
    client.cancel(task).await.unwrap();
    assert_eq!(
        wait_terminal(&client, task).await.state,
        TaskState::Cancelled
    );
    wait_no_processes(&marker).await;
    eventually("the kill report in the log", DEADLINE, || {
        let client = client.clone();
        async move {
            let log = log_text(&client, task).await;
            log.contains("tacc: killed").then_some(())
        }
    })
    .await;
}

/// The agent reuses emptied cgroups on v1 (`tacc_exec::cgroups::CgroupPool`): the task
/// after one the kernel OOM-killed gets its own limit and its own outcome, never the
/// earlier task's `out_of_memory`. One CPU, so the two run one after the other and the
/// second takes the first's emptied cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_after_an_out_of_memory_one_has_its_own_limit_and_outcome() {
    if !cgroups_or_skip("the_task_after_an_out_of_memory_one_has_its_own_limit_and_outcome") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    let memory_dir = "d=/sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)";
    let hog = submit(
        &client,
        dir.path(),
        "hog",
        &format!(
            "name: hog\nresources: {{cpus: 1, memory: 64MiB}}\nrun: |\n  {memory_dir}\n  echo cgroup $d\n  head -c 300M /dev/zero | tail > /dev/null\n"
        ),
        &[],
    )
    .await;
    let view = wait_terminal(&client, hog).await;
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("out_of_memory: "), "{reason}");
    let next = submit(
        &client,
        dir.path(),
        "next",
        &format!(
            "name: next\nresources: {{cpus: 1, memory: 128MiB}}\nrun: |\n  {memory_dir}\n  echo cgroup $d\n  exit 3\n"
        ),
        &[],
    )
    .await;
    let view = wait_terminal(&client, next).await;
    let log = log_text(&client, next).await;
    assert_eq!(
        (view.state, view.exit_code),
        (TaskState::Failed, Some(3)),
        "{view:?}\n{log}"
    );
    if std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file() {
        let cgroup = |log: &str| {
            log.lines()
                .find_map(|l| l.strip_prefix("cgroup "))
                .map(str::to_string)
        };
        let first = cgroup(&log_text(&client, hog).await);
        assert_eq!(cgroup(&log), first, "the emptied cgroup was not reused");
        // Its limit is its own (read here: the agent's cgroups are not the task's to
        // read; the emptied cgroup keeps the last limit written until its next reuse).
        let dir = std::path::PathBuf::from(cgroup(&log).unwrap());
        let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (128u64 << 20).to_string());
    }
}
