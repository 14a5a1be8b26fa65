//! Monitoring against a real `taccd dev` cluster and the real `tcloud` binary: a busy
//! task's CPU and memory show in `tcloud top --once --json` while it runs and its peak in
//! `tcloud show --json` after it ended; a task that writes nothing and uses no CPU is
//! flagged silent once the server's (test-sized) threshold has passed; a node's GPUs are
//! listed by `tcloud nodes --json`.
//!
//! Needs root and a cgroup hierarchy (per-attempt CPU and memory are read from the
//! attempt's cgroup): elsewhere the CPU test says SKIPPED, except in CI (`CI=true`),
//! where it fails. `tcloud` must be built beside `taccd` (`cargo build --workspace --bins`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use tacc_core::TaskState;

/// The `tcloud` binary built beside `taccd`.
fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build every binary first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// `tcloud ARGS --json` against `daemon` as its admin; the parsed output.
fn tcloud_json(daemon: &Daemon, home: &Path, args: &[&str]) -> serde_json::Value {
    let output = Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tcloud {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "tcloud {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn cgroups_or_skip(test: &str) -> bool {
    let usable = nix::unistd::geteuid().is_root()
        && (Path::new("/sys/fs/cgroup/cgroup.controllers").is_file()
            || Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file());
    if usable {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root and a writable cgroup hierarchy in CI");
    }
    eprintln!(
        "\n######## SKIPPED {test}: not root or no cgroup hierarchy, so no per-attempt usage.\n"
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_task_shows_in_top_while_it_runs_and_its_peak_in_show_after() {
    if !cgroups_or_skip("a_busy_task_shows_in_top_while_it_runs_and_its_peak_in_show_after") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();
    wait_nodes(&client, 1).await;
    // Busy for 10 s, then done: no output after the first line.
    let task = submit(
        &client,
        dir.path(),
        "busy",
        "name: busy\nresources: {cpus: 1, memory: 256MiB}\nrun: |\n  echo busy\n  end=$((SECONDS + 10))\n  while [ $SECONDS -lt $end ]; do :; done\n",
        &[],
    )
    .await;
    wait_state(&client, task, &[TaskState::Running]).await;
    let home = dir.path().join("home");
    let id = task.to_string();
    let rank = eventually("the busy rank in tcloud top", DEADLINE, || {
        let top = tcloud_json(&daemon, &home, &["top", "--once", "--json"]);
        let found = top.as_array().unwrap().iter().find_map(|usage| {
            (usage["task_id"] == serde_json::json!(task.0)).then(|| usage["ranks"][0].clone())
        });
        async move {
            let rank = found?;
            (rank["cpu_millis_used"].as_u64()? > 0 && rank["memory_bytes"].as_u64()? > 0)
                .then_some(rank)
        }
    })
    .await;
    eprintln!("tcloud top showed rank 0 as {rank}");
    assert_eq!(rank["node_rank"], 0);
    assert!(rank["cpu_millis_used"].as_u64().unwrap() <= 1100, "{rank}");
    assert!(rank["last_output_at"].is_u64(), "{rank}");
    // The same through the named task, with its allocation.
    let named = tcloud_json(&daemon, &home, &["top", &id, "--once", "--json"]);
    assert_eq!(named[0]["allocated"]["cpu_millis"], 1000, "{named}");
    assert_eq!(named[0]["state"], "running", "{named}");

    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let show = tcloud_json(&daemon, &home, &["show", &id, "--json"]);
    let peaks = show["peaks"].as_array().expect("show --json has peaks");
    assert_eq!(peaks.len(), 1, "{show}");
    assert_eq!(peaks[0]["attempt"], 1);
    // The peak is at least what `top` showed while it ran (not a fixed share of a CPU:
    // on a loaded machine the busy loop gets what the others leave it).
    let seen = rank["cpu_millis_used"].as_u64().unwrap();
    assert!(peaks[0]["cpu_millis"].as_u64().unwrap() >= seen, "{show}");
    assert!(peaks[0]["memory_bytes"].as_u64().unwrap() > 0, "{show}");
    // Ended: no live sample is listed any more, the peak stays.
    let usage = client.task_usage(task).await.unwrap();
    assert!(usage.ranks.is_empty(), "{usage:?}");
    assert_eq!(usage.peaks.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_prints_nothing_past_the_threshold_is_flagged_silent() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--silent-after", "3s", "--name", "quiet-node"],
    )
    .await;
    let client = daemon.client();
    wait_nodes(&client, 1).await;
    let task = submit(
        &client,
        dir.path(),
        "quiet",
        "name: quiet\nrun: sleep 300\n",
        &[],
    )
    .await;
    wait_state(&client, task, &[TaskState::Running]).await;
    let usage = eventually("the silent flag", DEADLINE, || {
        let client = client.clone();
        async move {
            let usage = client.task_usage(task).await.ok()?;
            usage
                .flags
                .iter()
                .any(|f| f.kind == "silent")
                .then_some(usage)
        }
    })
    .await;
    assert_eq!(usage.silent_after_secs, 3);
    let flag = usage.flags.iter().find(|f| f.kind == "silent").unwrap();
    assert_eq!(flag.node_rank, 0);
    assert_eq!(flag.node, "quiet-node");
    assert!(
        flag.message.starts_with("rank 0 on quiet-node silent for "),
        "{}",
        flag.message
    );
    assert!(usage.ranks[0].quiet_secs >= 3, "{usage:?}");
    assert_eq!(usage.ranks[0].last_output_at, None);
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_keeps_printing_is_not_silent() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--silent-after", "3s"]).await;
    let client = daemon.client();
    wait_nodes(&client, 1).await;
    let task = submit(
        &client,
        dir.path(),
        "chatty",
        "name: chatty\nrun: |\n  while :; do echo tick; sleep 0.5; done\n",
        &[],
    )
    .await;
    wait_state(&client, task, &[TaskState::Running]).await;
    // Samples for well past the threshold, none flagged.
    let started = std::time::Instant::now();
    let mut samples = 0;
    while started.elapsed() < std::time::Duration::from_secs(8) {
        let usage = client.task_usage(task).await.unwrap();
        assert!(usage.flags.is_empty(), "{usage:?}");
        if let Some(rank) = usage.ranks.first() {
            assert!(rank.last_output_at.is_some(), "{usage:?}");
            samples += 1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(samples > 0, "no sample arrived in 8 s");
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_gpus_are_listed_with_their_type_by_tcloud_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--gpus", "2", "--gpu-type", "A100"],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let nodes = tcloud_json(&daemon, &dir.path().join("home"), &["nodes", "--json"]);
    let gpus = nodes[0]["gpus"].as_array().expect("nodes carry gpus");
    // No NVIDIA driver on the test machines: the fakes `--gpus` asks for.
    assert_eq!(gpus.len(), 2, "{nodes}");
    assert_eq!(gpus[1]["index"], 1);
    assert_eq!(gpus[1]["model"], "A100");
    assert_eq!(gpus[1]["uuid"], "fake-1");
    assert_eq!(gpus[1]["health"], "fake");
}
