//! Adaptive allocation on a real `taccd dev` cluster and the real cgroup hierarchy: a
//! CPU-hungry task with `adaptive:` bounds gets its CPU quota raised (read back from its
//! cgroup's own file), an idle over-provisioned task is shrunk so a queued task that did
//! not fit starts, and every change is in the task's history with its reason. The
//! classifier window and the policy cooldown are set to seconds.
//!
//! Needs root and a writable cgroup hierarchy: elsewhere the tests say SKIPPED loudly and
//! pass, except in CI (`CI=true`), where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

/// Fast adaptation: a verdict from 4 s of samples, a change at most every 2 s.
const FAST: &[&str] = &[
    "--adaptive",
    "on",
    "--adaptive-window",
    "4s",
    "--adaptive-cooldown",
    "2s",
];

/// The tests measure CPU use: on a small machine two of them at once would starve each
/// other's busy loops (and the verdicts with them), so they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The CPU quota (thousandths of a CPU) of `pid`'s cgroup, read from the file the
/// kernel enforces: v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
fn cgroup_quota_millis(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mount = Path::new("/sys/fs/cgroup");
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() && mount.join("cgroup.controllers").is_file() {
            let max = std::fs::read_to_string(mount.join(path).join("cpu.max")).ok()?;
            let mut fields = max.split_whitespace();
            let quota: u64 = fields.next()?.parse().ok()?;
            let period: u64 = fields.next()?.parse().ok()?;
            return Some(quota * 1000 / period);
        }
        if controllers.split(',').any(|c| c == "cpu") {
            let dir: PathBuf = mount.join(controllers).join(path);
            let dir = if dir.is_dir() {
                dir
            } else {
                mount.join("cpu").join(path)
            };
            let read = |file: &str| -> Option<i64> {
                std::fs::read_to_string(dir.join(file))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let (quota, period) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
            return (quota > 0).then(|| quota as u64 * 1000 / period as u64);
        }
    }
    None
}

/// The quota of the (first) process of the task marked `marker`.
fn task_quota(marker: &str) -> Option<u64> {
    task_processes(marker)
        .into_iter()
        .find_map(cgroup_quota_millis)
}

async fn events_text(client: &Client, task: TaskId) -> String {
    client
        .task_events(task)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_bound_task_gets_its_quota_raised_within_its_bounds() {
    if !cgroups_or_skip("a_cpu_bound_task_gets_its_quota_raised_within_its_bounds") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--cpus", "4", "--memory", "4GiB"];
    args.extend_from_slice(FAST);
    let daemon = start("dev", &dir.path().join("d"), &args).await;
    let client = daemon.client();
    let marker = format!("hungry-{}", std::process::id());
    let task = submit(
        &client,
        dir.path(),
        "hungry",
        &format!(
            "name: hungry\nresources: {{cpus: 0.5, memory: 256MiB}}\nadaptive: {{cpus: 0.5..1}}\n\
             environment: {{vars: {{MARKER: {marker}}}}}\n\
             run: |\n  for i in 1 2; do (while :; do :; done) & done\n  wait\n"
        ),
        &[],
    )
    .await;
    wait_state(&client, task, &[TaskState::Running]).await;
    let started = eventually("the task's cgroup quota", DEADLINE, || {
        let marker = marker.clone();
        async move { task_quota(&marker) }
    })
    .await;
    assert_eq!(started, 500, "it starts with what resources.cpus asks");
    // Grown by a step (×1.5, at least half a CPU), capped at its bound: 0.5 → 1.
    let until = std::time::Instant::now() + Duration::from_secs(90);
    let grown = loop {
        if let Some(quota) = task_quota(&marker).filter(|q| *q > 500) {
            break quota;
        }
        if std::time::Instant::now() > until {
            let adaptive = client.explain(task).await.unwrap().adaptive;
            panic!(
                "the quota was not raised: it is {:?}; events:\n{}\n{adaptive:#?}",
                task_quota(&marker),
                events_text(&client, task).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(grown, 1000, "the maximum of adaptive.cpus");
    let events = events_text(&client, task).await;
    assert!(events.contains("cpu_bound"), "{events}");
    assert!(events.contains("CPU 0.50 → 1.00"), "{events}");
    let explanation = client.explain(task).await.unwrap();
    let adaptive = explanation.adaptive.expect("a running task has a verdict");
    assert_eq!(adaptive.allocation.cpu_millis, 1000);
    // Never past the bound, however CPU-bound it stays.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(task_quota(&marker), Some(1000));
    assert!(
        adaptive
            .changes
            .iter()
            .all(|c| c.reason.starts_with("adaptive: cpu_bound")),
        "{adaptive:?}"
    );
    let usage = client.task_usage(task).await.unwrap();
    // What `tcloud top` shows use against: the allocation in force, not the request.
    assert_eq!(usage.allocated.cpu_millis, 1000, "{usage:?}");
    assert!(usage.adaptive.is_some_and(|a| !a.series.is_empty()));
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_task_shrinks_and_a_queued_task_that_did_not_fit_starts() {
    if !cgroups_or_skip("an_idle_task_shrinks_and_a_queued_task_that_did_not_fit_starts") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--cpus", "2", "--memory", "4GiB"];
    args.extend_from_slice(FAST);
    let daemon = start("dev", &dir.path().join("d"), &args).await;
    let client = daemon.client();
    let marker = format!("idle-{}", std::process::id());
    let idle = submit(
        &client,
        dir.path(),
        "idle",
        &format!(
            "name: idle\nresources: {{cpus: 2, memory: 512MiB}}\nadaptive: {{cpus: 0.5..2}}\n\
             environment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 600\n"
        ),
        &[],
    )
    .await;
    wait_state(&client, idle, &[TaskState::Running]).await;
    let queued = submit(
        &client,
        dir.path(),
        "queued",
        "name: queued\nresources: {cpus: 1, memory: 256MiB}\nrun: echo started\n",
        &[],
    )
    .await;
    let view = client.get_task(queued).await.unwrap();
    assert_eq!(view.state, TaskState::Queued, "{view:?}");
    // The idle task gives back what it does not use; the queued task then fits.
    let ended = wait_terminal(&client, queued).await;
    assert_eq!(ended.state, TaskState::Succeeded, "{ended:?}");
    let quota = task_quota(&marker).expect("the idle task still runs in its cgroup");
    assert_eq!(quota, 500, "shrunk to its minimum (its peak is far below)");
    let events = events_text(&client, idle).await;
    assert!(events.contains("over_provisioned"), "{events}");
    assert!(events.contains("CPU 2.00 → 0.50"), "{events}");
    assert_eq!(
        client.get_task(idle).await.unwrap().state,
        TaskState::Running
    );
    // `tcloud top` shows use against the allocation in force, not the request (after a
    // resize to 1.5 CPUs it showed `CPU 1.2/0.5`: use against what the file asked).
    let usage = client.task_usage(idle).await.unwrap();
    assert_eq!(usage.allocated.cpu_millis, 500, "{usage:?}");
    let top = tcloud(
        &daemon,
        &dir.path().join("home"),
        &["top", "--once", &idle.0.to_string()],
    );
    let row = top
        .lines()
        .find(|l| {
            let mut cells = l.split_whitespace();
            cells.next() == Some(idle.0.to_string().as_str()) && cells.next() == Some("idle")
        })
        .unwrap_or_else(|| panic!("no row for task {idle}: {top}"));
    assert!(row.contains("/0.5") && !row.contains("/2 "), "{row}");
    client.cancel(idle).await.unwrap();
    wait_terminal(&client, idle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_adaptation_off_nothing_moves_but_the_verdict_is_shown() {
    if !cgroups_or_skip("with_adaptation_off_nothing_moves_but_the_verdict_is_shown") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &[
            "--cpus",
            "2",
            "--adaptive",
            "off",
            "--adaptive-window",
            "4s",
            "--adaptive-cooldown",
            "2s",
        ],
    )
    .await;
    let client = daemon.client();
    let marker = format!("off-{}", std::process::id());
    let task = submit(
        &client,
        dir.path(),
        "busy",
        &format!(
            "name: busy\nresources: {{cpus: 0.5, memory: 256MiB}}\nadaptive: {{cpus: 0.5..2}}\n\
             environment: {{vars: {{MARKER: {marker}}}}}\nrun: while :; do :; done\n"
        ),
        &[],
    )
    .await;
    wait_state(&client, task, &[TaskState::Running]).await;
    let verdict = eventually("a verdict", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let verdict = client.explain(task).await.ok()?.adaptive?.verdict?;
            (verdict.bottleneck != "not_enough_data").then_some(verdict)
        }
    })
    .await;
    // The busy loop is `cpu_bound` on an idle machine; on a loaded one it may not even
    // get its quota. Either way the verdict and its evidence are shown, and nothing moves.
    assert!(
        ["cpu_bound", "over_provisioned", "balanced"].contains(&verdict.bottleneck.as_str()),
        "{verdict:?}"
    );
    assert!(
        verdict.evidence[0].contains("of 0.50 cores used"),
        "{verdict:?}"
    );
    assert_eq!(task_quota(&marker), Some(500));
    let adaptive = client.explain(task).await.unwrap().adaptive.unwrap();
    assert!(adaptive.changes.is_empty(), "{adaptive:?}");
    assert_eq!(adaptive.mode, "off");
    assert!(
        adaptive.bounds.is_none(),
        "nothing moves with adaptation off"
    );
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
}
