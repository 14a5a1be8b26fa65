//! Start estimates checked against what really happens on a real `taccd dev` with a
//! second agent: a mix of waiting tasks (quota-blocked, CPU-only behind full CPUs, held
//! behind a backfill reservation, GPU) is queued, every estimate is recorded, the tasks
//! run to their time limits (`sleep 100` under a time limit of a few seconds, so every
//! end is predictable), and each task must start inside its estimated range.

mod common;

use std::collections::BTreeMap;

use common::*;
use tacc_core::{TaskId, TaskState, Timestamp};
use tacc_proto::{LatestStartView, TaskExplanation};

/// How late a real start may be after the projected latest start. The projection ends a
/// task at its placement time plus its time limit; the agent counts the limit from when
/// it launches the process (after the placement reaches it through its long poll and the
/// working directory is prepared), then sends SIGTERM and reports the end, and only then
/// is the next task placed and launched. Each of those steps takes well under a second on
/// loopback; a task two ends down a chain pays them twice.
const TOLERANCE_MS: u64 = 4_000;

async fn queued_with_reason(client: &tacc_client::Client, task: TaskId) -> TaskExplanation {
    eventually(
        &format!("task {task} to wait with a reason"),
        DEADLINE,
        || {
            let client = client.clone();
            async move {
                let why = client.explain(task).await.ok()?;
                (why.state == TaskState::Queued && why.reason.is_some()).then_some(why)
            }
        },
    )
    .await
}

fn task_yaml(name: &str, resources: &str, pool: &str, marker: &str) -> String {
    format!(
        "name: {name}\nresources: {{{resources}}}\nplacement: {{labels: {{pool: {pool}}}}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: sleep 100\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiting_task_starts_inside_its_estimated_range() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "policy = \"fifo-backfill\"\n\n[users.bob]\nmax_running_tasks = 1\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--name",
            "node-a",
            "--label",
            "pool=a",
            "--cpus",
            "2",
        ],
    )
    .await;
    let _b = start_agent(
        &daemon,
        &dir.path().join("b"),
        &[
            "--name", "node-b", "--label", "pool=b", "--cpus", "2", "--gpus", "2",
        ],
    );
    let admin = daemon.client();
    wait_nodes(&admin, 2).await;
    let alice = daemon.user_client("alice", None, "user").await;
    let bob = daemon.user_client("bob", None, "user").await;
    let marker = format!("estimates-{}", std::process::id());
    let root = dir.path();
    let put = |client: &tacc_client::Client, name: &str, resources: &str, pool: &str| {
        let (client, yaml) = (client.clone(), task_yaml(name, resources, pool, &marker));
        let name = name.to_string();
        async move { submit(&client, root, &name, &yaml, &[]).await }
    };

    // What runs: one CPU of node-a for 10 s, one CPU and both GPUs of node-b for 8 s
    // (long enough that every estimate below is recorded before either ends, even on a
    // slow machine).
    let a_running = put(&alice, "a-running", "cpus: 1, time_limit: 10s", "a").await;
    let b_running = put(&bob, "b-running", "cpus: 1, gpus: 2, time_limit: 8s", "b").await;
    wait_state(&alice, a_running, &[TaskState::Running]).await;
    wait_state(&bob, b_running, &[TaskState::Running]).await;

    // Bob may run one task at a time: this one waits for b-running to end.
    let quota = put(&bob, "quota", "cpus: 0.5, time_limit: 3s", "b").await;
    // Needs both CPUs of node-a: waits for a-running (the first task to wait for
    // resources: fifo-backfill reserves node-a for it).
    let cpu_only = put(&alice, "cpu-only", "cpus: 2, time_limit: 3s", "a").await;
    // Fits node-a's free CPU now, but would still run when the reservation starts.
    let held = put(&alice, "held", "cpus: 1, time_limit: 10s", "a").await;
    // Both GPUs are taken until b-running ends.
    let gpu = put(&alice, "gpu", "cpus: 0.5, gpus: 2, time_limit: 3s", "b").await;

    let mut estimates = BTreeMap::new();
    for (task, client) in [
        (quota, &bob),
        (cpu_only, &alice),
        (held, &alice),
        (gpu, &alice),
    ] {
        let why = queued_with_reason(client, task).await;
        let asked = tacc_server_now();
        let estimate = why.start_estimate.clone().expect("a start estimate");
        let LatestStartView::At { at: latest } = estimate.latest else {
            panic!("task {task}: every time limit is known, yet {why:?}");
        };
        // Before the estimate came from the scheduler itself these all said "now".
        assert!(
            latest.as_millis() > asked.as_millis() + 500,
            "task {task} cannot start now: {why:?}"
        );
        estimates.insert(task, (asked, estimate, why));
    }
    let reason = |task: TaskId| estimates[&task].2.reason.clone().unwrap_or_default();
    assert!(
        reason(quota).contains("over user quota"),
        "{}",
        reason(quota)
    );
    assert!(reason(held).contains("held for task"), "{}", reason(held));
    // What each estimate rests on.
    let quota_estimate = &estimates[&quota].1;
    assert_eq!(
        quota_estimate.after[0].task, b_running,
        "{quota_estimate:?}"
    );
    assert!(
        quota_estimate
            .basis
            .iter()
            .any(|b| b == "bob may run 1 task at a time"),
        "{quota_estimate:?}"
    );
    assert_eq!(estimates[&cpu_only].1.after[0].task, a_running);
    assert_eq!(estimates[&held].1.after[0].task, cpu_only);
    // The GPU task is asked whether half its GPUs would start it sooner: no, none is free.
    let what_if = estimates[&gpu].2.fewer_gpus.clone().expect("a what-if");
    assert_eq!((what_if.gpus_per_node, what_if.sooner), (1, false));

    // `tcloud why` says it for people.
    let home = dir.path().join("home");
    let text = tcloud(&daemon, &home, &["why", &quota.to_string()]);
    assert!(
        text.contains("estimated start: no earlier than")
            && text.contains(&format!("rests on: starts when task {b_running} ends"))
            && text.contains("bob may run 1 task at a time"),
        "{text}"
    );

    // So does the dashboard's task page (read with the admin's token, as a browser's
    // session would stand for it).
    let page = reqwest::Client::new()
        .get(format!("{}/ui/tasks/{}", daemon.url, quota.0))
        .bearer_auth(&daemon.token)
        .send()
        .await
        .unwrap();
    assert!(page.status().is_success(), "{}", page.status());
    let html = page.text().await.unwrap();
    assert!(
        html.contains("Starts no earlier than now, no later than")
            && html.contains(&format!("starts when task {b_running} ends (time limit"))
            && html.contains("bob may run 1 task at a time"),
        "{html}"
    );

    // Let everything run to its time limit; each start must fall inside its range.
    for (task, (_, estimate, _)) in &estimates {
        let view = wait_state(
            &admin,
            *task,
            &[TaskState::Running, TaskState::Failed, TaskState::Succeeded],
        )
        .await;
        let started = view.started_at.expect("a start time");
        let LatestStartView::At { at: latest } = estimate.latest else {
            unreachable!()
        };
        assert!(
            started >= estimate.earliest,
            "task {task} started at {started:?}, before its estimate {estimate:?}"
        );
        eprintln!(
            "task {task}: latest {latest:?}, started {started:?} ({} ms later)",
            started.as_millis() as i64 - latest.as_millis() as i64
        );
        assert!(
            started.as_millis() <= latest.as_millis() + TOLERANCE_MS,
            "task {task} started at {started:?}, {} ms after its latest start {latest:?}",
            started.as_millis().saturating_sub(latest.as_millis())
        );
    }
    for task in estimates.keys() {
        let view = wait_terminal(&admin, *task).await;
        assert!(
            view.reason
                .as_deref()
                .is_some_and(|r| r.contains("time limit")),
            "task {task} should have run to its time limit: {view:?}"
        );
    }
    wait_no_processes(&marker).await;
}

/// A task that waits on its pool of nodes is told that another pool would start it now:
/// `why` carries the what-if, and `tcloud why` and the dashboard's task page say it in the
/// same words (one formatter, `tacc_proto::estimate_text`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_says_when_another_pool_of_nodes_would_start_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--name", "node-a", "--label", "pool=a", "--cpus", "2"],
    )
    .await;
    let _b = start_agent(
        &daemon,
        &dir.path().join("b"),
        &["--name", "node-b", "--label", "pool=b", "--cpus", "2"],
    );
    let admin = daemon.client();
    wait_nodes(&admin, 2).await;
    let marker = format!("other-pool-{}", std::process::id());
    let root = dir.path();
    // Both CPUs of pool a for a minute; the second task, on pool a too, waits for them.
    let busy = submit(
        &admin,
        root,
        "busy",
        &task_yaml("busy", "cpus: 2, time_limit: 60s", "a", &marker),
        &[],
    )
    .await;
    wait_state(&admin, busy, &[TaskState::Running]).await;
    let waiting = submit(
        &admin,
        root,
        "waiting",
        &task_yaml("waiting", "cpus: 1, time_limit: 5s", "a", &marker),
        &[],
    )
    .await;
    let why = queued_with_reason(&admin, waiting).await;
    let estimate = why.start_estimate.clone().expect("a start estimate");
    assert!(
        matches!(estimate.latest, LatestStartView::At { .. }),
        "{why:?}"
    );
    let elsewhere = why
        .other_nodes
        .iter()
        .find(|w| w.label == "pool" && w.value == "b")
        .unwrap_or_else(|| panic!("no what-if for pool b: {why:?}"));
    assert!(elsewhere.sooner, "{why:?}");
    let LatestStartView::At { at } = elsewhere.latest else {
        panic!("{why:?}");
    };
    assert!(
        at.as_millis() <= tacc_server_now().as_millis() + 1_000,
        "pool b is free now: {why:?}"
    );

    let said = "on nodes labelled pool=b: now (sooner)";
    let home = dir.path().join("home");
    let text = tcloud(&daemon, &home, &["why", &waiting.to_string()]);
    assert!(text.contains(said), "{text}");
    let html = reqwest::Client::new()
        .get(format!("{}/ui/tasks/{}", daemon.url, waiting.0))
        .bearer_auth(&daemon.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains(said), "{html}");

    for task in [waiting, busy] {
        admin.cancel(task).await.unwrap();
        wait_terminal(&admin, task).await;
    }
    wait_no_processes(&marker).await;
}

/// The server and this test share the machine's clock.
fn tacc_server_now() -> Timestamp {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Timestamp(millis)
}

/// `tcloud why` asks the user's other clusters (profiles with a token) when the same task
/// would start there if submitted now: one that is free says now, one where it can never
/// fit says it would refuse it and why, and one that does not answer is said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_asks_the_other_clusters_of_your_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let busy = start("dev", &dir.path().join("busy"), &["--cpus", "1"]).await;
    let idle = start("dev", &dir.path().join("idle"), &["--cpus", "2"]).await;
    let small = start("dev", &dir.path().join("small"), &["--cpus", "0.5"]).await;
    let admin = busy.client();
    wait_nodes(&admin, 1).await;
    wait_nodes(&idle.client(), 1).await;
    wait_nodes(&small.client(), 1).await;
    let root = dir.path();
    let yaml = |name: &str| {
        format!("name: {name}\nresources: {{cpus: 1, time_limit: 60s}}\nrun: sleep 100\n")
    };
    let holder = submit(&admin, root, "holder", &yaml("holder"), &[]).await;
    wait_state(&admin, holder, &[TaskState::Running]).await;
    let waiting = submit(&admin, root, "waiting", &yaml("waiting"), &[]).await;
    queued_with_reason(&admin, waiting).await;

    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let profile = |name: &str, url: &str, token: &str| {
        format!("[clusters.{name}]\nurl = \"{url}\"\ntoken = \"{token}\"\n")
    };
    let config = format!(
        "current = \"busy\"\n{}{}{}{}",
        profile("busy", &busy.url, &busy.token),
        profile("idle", &idle.url, &idle.token),
        profile("small", &small.url, &small.token),
        profile("gone", &gone_url, "tacc_not_a_real_token"),
    );
    let path = home.join("config.toml");
    std::fs::write(&path, config).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    let text = tcloud(&busy, &home, &["why", &waiting.to_string()]);
    assert!(
        text.contains("if submitted now to your other clusters:"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "- on cluster idle ({}): would start now",
            idle.url
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("- on cluster small ({}): refused (", small.url))
            && text.contains("can never fit"),
        "{text}"
    );
    assert!(
        text.contains(&format!("- on cluster gone ({gone_url}): could not tell")),
        "{text}"
    );
    assert!(!text.contains("on cluster busy"), "{text}");
    // Nothing was stored on the clusters asked.
    assert!(
        idle.client()
            .list_tasks(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    for task in [waiting, holder] {
        admin.cancel(task).await.unwrap();
    }
}
