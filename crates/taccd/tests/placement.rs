//! Which node a task runs on, through real `taccd` processes: agents register the runtimes
//! they offer and the operator's `--label`s; a task's `runtime` and `placement.labels`
//! select among them; a task no node can run yet is accepted and waits, explained, until
//! a node that can registers. (Slurm agents beside process agents: `tests/slurm.rs`.)

mod common;

use std::process::Command;

use common::*;
use tacc_core::{TaskId, TaskState};

async fn wait_reason(
    client: &tacc_client::Client,
    task: TaskId,
    needle: &str,
) -> tacc_proto::TaskExplanation {
    eventually(&format!("reason `{needle}`"), DEADLINE, || {
        let client = client.clone();
        async move {
            let why = client.explain(task).await.ok()?;
            why.reason
                .as_deref()
                .is_some_and(|r| r.contains(needle))
                .then_some(why)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_wait_for_a_node_with_their_labels_and_run_when_it_registers() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("server"), &[]).await;
    let client = server.client();
    // A socket named explicitly is offered even while no engine answers there.
    let socket = dir.path().join("no-engine.sock").display().to_string();
    let _a = start_agent(
        &server,
        &dir.path().join("a"),
        &[
            "--name",
            "node-a",
            "--label",
            "pool=a",
            "--cpus",
            "2",
            "--docker-socket",
            &socket,
        ],
    );
    wait_nodes(&client, 1).await;
    let nodes = client.list_nodes().await.unwrap();
    assert_eq!(
        nodes[0]
            .labels
            .get("tacc.io/runtime.container")
            .map(String::as_str),
        Some("true"),
        "{nodes:?}"
    );
    assert_eq!(
        nodes[0]
            .labels
            .get("tacc.io/runtime.process")
            .map(String::as_str),
        Some("true"),
        "{nodes:?}"
    );
    assert_eq!(
        nodes[0].labels.get("pool").map(String::as_str),
        Some("a"),
        "{nodes:?}"
    );

    // No Slurm agent here: `runtime: slurm` is accepted, waits, and says what to start.
    let slurm = submit(
        &client,
        dir.path(),
        "slurm",
        "name: slurm\nruntime: slurm\nrun: echo never\n",
        &[],
    )
    .await;
    let why = wait_reason(&client, slurm, "no node can run it yet").await;
    assert!(
        why.reason
            .as_deref()
            .unwrap()
            .contains("labelled tacc.io/runtime.slurm=true, and none of the 1 node(s) up are"),
        "{why:?}"
    );
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("taccd agent --backend slurm")),
        "{why:?}"
    );

    // Labels only a node that has not registered yet carries: it waits for that node.
    let on_b = submit(
        &client,
        dir.path(),
        "on-b",
        "name: on-b\nplacement: {labels: {pool: b}}\nrun: echo \"ran as task $TACC_TASK_ID\"\n",
        &[],
    )
    .await;
    let why = wait_reason(&client, on_b, "pool=b").await;
    assert_eq!(why.state, TaskState::Queued, "{why:?}");
    assert!(
        why.details.iter().any(|d| d.contains("--label pool=b")),
        "{why:?}"
    );
    assert_eq!(why.estimated_start, None, "{why:?}");

    // Neither holds up what can run: `runtime: process` and plain tasks run on node-a.
    for (name, yaml) in [
        ("process", "name: process\nruntime: process\nrun: echo ok\n"),
        ("plain", "name: plain\nrun: echo ok\n"),
        (
            "on-a",
            "name: on-a\nplacement: {labels: {pool: a}}\nrun: echo ok\n",
        ),
    ] {
        let task = submit(&client, dir.path(), name, yaml, &[]).await;
        let view = wait_terminal(&client, task).await;
        assert_eq!(view.state, TaskState::Succeeded, "{name}: {view:?}");
        assert_eq!(view.nodes, vec!["node-a".to_string()], "{name}: {view:?}");
    }

    // The node it waits for registers: the task starts there at once, and is not
    // mistaken for an attempt the new node's agent left behind.
    let _b = start_agent(
        &server,
        &dir.path().join("b"),
        &["--name", "node-b", "--label", "pool=b", "--cpus", "2"],
    );
    let view = wait_terminal(&client, on_b).await;
    let log = log_text(&client, on_b).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert_eq!(view.attempt.0, 1, "{view:?}");
    assert_eq!(view.nodes, vec!["node-b".to_string()], "{view:?}");
    assert!(log.contains(&format!("ran as task {on_b}")), "{log}");

    let view = client.get_task(slurm).await.unwrap();
    assert_eq!(view.state, TaskState::Queued, "still waiting: {view:?}");
    client.cancel(slurm).await.unwrap();
    let view = wait_terminal(&client, slurm).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
}

#[test]
fn an_agent_refuses_labels_that_are_the_platforms_own() {
    let dir = tempfile::tempdir().unwrap();
    for (label, expected) in [
        ("tacc.io/runtime.slurm=true", "set by the agent itself"),
        ("pool", "KEY=VALUE"),
        ("pool=a b", "white space"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_taccd"))
            .args(["agent", "--server", "http://127.0.0.1:9", "--data-dir"])
            .arg(dir.path())
            .args(["--label", label])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{label}: {stderr}");
        assert!(stderr.contains(expected), "{label}: {stderr}");
    }
}
