//! Node lifecycle against real processes: drain, resume, remove, and cancel on a down node.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use tacc_client::Client;
use tacc_core::TaskState;
use tacc_proto::NodeView;

fn sleeper(name: &str, seconds: u32) -> String {
    format!(
        "name: {name}\nresources: {{cpus: 1}}\nrun: |\n  echo started\n  sleep {seconds} & wait\n"
    )
}

async fn node(client: &Client, name: &str) -> Option<NodeView> {
    client
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.name == name)
}

async fn wait_node_state(client: &Client, name: &str, state: &str) -> NodeView {
    eventually(&format!("node {name} to be {state}"), DEADLINE, || {
        let client = client.clone();
        async move { node(&client, name).await.filter(|n| n.state == state) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_finishes_its_tasks_and_takes_nothing_new_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let _a = start_agent(&server, &dir.path().join("a"), &["--name", "node-a"]);
    let _b = start_agent(&server, &dir.path().join("b"), &["--name", "node-b"]);
    wait_nodes(&client, 2).await;

    let first = submit(&client, dir.path(), "first", &sleeper("first", 3), &[]).await;
    let view = wait_state(&client, first, &[TaskState::Running]).await;
    let busy = view.nodes[0].clone();
    let other = if busy == "node-a" { "node-b" } else { "node-a" };

    let drained = client.drain_node(&busy, false).await.unwrap();
    assert_eq!(drained.state, "draining", "{drained:?}");
    // A node that still runs tasks is not removed.
    let refused = client.remove_node(&busy).await.unwrap_err();
    assert_eq!(refused.code(), Some("conflict"), "{refused}");

    // Two agents: the new task goes to the other node.
    let second = submit(&client, dir.path(), "second", &sleeper("second", 1), &[]).await;
    let view = wait_terminal(&client, second).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.nodes, vec![other.to_string()]);
    // The running task finishes where it runs.
    let view = wait_terminal(&client, first).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.nodes, vec![busy.clone()]);
    wait_node_state(&client, &busy, "drained").await;

    // Both drained: a new task waits, saying why.
    client.drain_node(other, false).await.unwrap();
    wait_node_state(&client, other, "drained").await;
    let third = submit(&client, dir.path(), "third", &sleeper("third", 1), &[]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let view = client.get_task(third).await.unwrap();
    assert_eq!(view.state, TaskState::Queued, "{view:?}");
    assert!(view.reason.is_some(), "{view:?}");

    let resumed = client.drain_node(&busy, true).await.unwrap();
    assert_eq!(resumed.state, "up");
    let view = wait_terminal(&client, third).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.nodes, vec![busy.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &["--cpus", "2"]).await;
    let client = daemon.client();
    wait_nodes(&client, 1).await;
    let name = client.list_nodes().await.unwrap()[0].name.clone();
    // Through `taccd admin`, which finds the server and the admin token in the data dir.
    let said = daemon.admin(&["node", "drain", &name]);
    assert!(said.contains("drained"), "{said}");
    daemon.kill9();

    let restarted = start("dev", &data, &["--cpus", "2"]).await;
    let client = restarted.client();
    wait_node_state(&client, &name, "drained").await;
    let task = submit(&client, dir.path(), "waits", &sleeper("waits", 0), &[]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client.get_task(task).await.unwrap().state,
        TaskState::Queued
    );
    let said = restarted.admin(&["node", "resume", &name]);
    assert!(said.contains("up"), "{said}");
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taccd_admin_node_says_when_no_server_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["admin", "--data-dir"])
        .arg(dir.path())
        .args(["node", "drain", "gpu-01"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no server is running"), "{stderr}");

    // A server that runs but left no admin token: say so.
    let server = start("server", &dir.path().join("s"), &[]).await;
    std::fs::remove_file(server.data_dir.join("admin.token")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["admin", "--data-dir"])
        .arg(&server.data_dir)
        .args(["node", "drain", "gpu-01"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no admin token"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_down_node_is_gone_and_its_credential_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &["--heartbeat-timeout", "2"],
    )
    .await;
    let client = server.client();
    let mut agent = start_agent(&server, &dir.path().join("a"), &["--name", "doomed"]);
    wait_nodes(&client, 1).await;
    let id = node(&client, "doomed").await.unwrap().id;
    agent.kill9();
    let down = wait_node_state(&client, "doomed", "down").await;
    let now = tacc_core::Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    );
    assert!(
        now.millis_since(down.last_seen) >= 1_500,
        "a down node shows when it was last seen: {down:?}"
    );

    client.remove_node("doomed").await.unwrap();
    assert!(node(&client, "doomed").await.is_none());
    let tokens = client.list_tokens().await.unwrap();
    let node_tokens: Vec<_> = tokens.iter().filter(|t| t.node == Some(id)).collect();
    assert!(!node_tokens.is_empty());
    assert!(
        node_tokens.iter().all(|t| t.revoked_at.is_some()),
        "{node_tokens:?}"
    );
    let again = client.remove_node("doomed").await.unwrap_err();
    assert_eq!(again.code(), Some("not_found"), "{again}");

    // The machine comes back: its old credential is refused, so it joins again with the
    // join token it is given, as a new node.
    let _back = start_agent(&server, &dir.path().join("a"), &["--name", "doomed"]);
    let back = wait_node_state(&client, "doomed", "up").await;
    assert_ne!(back.id, id);
}

/// After a restart the server expects a node that ran a task back (`unknown`) for one
/// heartbeat timeout. A cancel meanwhile waits for its agent; the agent is gone for good,
/// so the task ends `cancelled` (never `lost`) once the node is found down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_task_on_a_node_that_never_comes_back_ends_with_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let args = ["--heartbeat-timeout", "3"];
    let mut server = start("server", &data, &args).await;
    let client = server.client();
    let mut agent = start_agent(&server, &dir.path().join("a"), &["--name", "gone"]);
    wait_nodes(&client, 1).await;
    let task = submit(&client, dir.path(), "orphan", &sleeper("orphan", 300), &[]).await;
    wait_state(&client, task, &[TaskState::Running]).await;
    // The agent dies, and the server restarts before it could notice.
    agent.kill9();
    server.kill9();
    let server = start("server", &data, &args).await;
    let client = server.client();
    let unknown = node(&client, "gone").await.expect("the node is listed");
    assert_eq!(unknown.state, "unknown", "{unknown:?}");
    assert_eq!(
        client.get_task(task).await.unwrap().state,
        TaskState::Running
    );
    client.cancel(task).await.unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert_eq!(
        view.reason.as_deref(),
        Some("cancelled by user"),
        "{view:?}"
    );
    wait_node_state(&client, "gone", "down").await;
}

/// A node lost twice within the flap window that comes back is shown as `flapping` and
/// gets no work until it has stayed up for `--node-stable-after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_node_gets_work_only_once_it_has_been_stable() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &["--heartbeat-timeout", "1", "--node-stable-after", "4"],
    )
    .await;
    let client = server.client();
    let agent = start_agent(&server, &dir.path().join("a"), &["--name", "flappy"]);
    wait_node_state(&client, "flappy", "up").await;
    let pid = Pid::from_raw(agent.pid() as i32);
    for _ in 0..2 {
        // A stopped agent misses its heartbeats; continued, it registers again.
        kill(pid, Signal::SIGSTOP).unwrap();
        wait_node_state(&client, "flappy", "down").await;
        kill(pid, Signal::SIGCONT).unwrap();
        let state = eventually("the node back", DEADLINE, || {
            let client = client.clone();
            async move {
                let state = node(&client, "flappy").await?.state;
                (state != "down").then_some(state)
            }
        })
        .await;
        assert!(state == "up" || state == "flapping", "{state}");
    }
    let back = wait_node_state(&client, "flappy", "flapping").await;
    let task = submit(&client, dir.path(), "patient", &sleeper("patient", 0), &[]).await;
    let queued = client.get_task(task).await.unwrap();
    assert_eq!(queued.state, TaskState::Queued, "{queued:?}");
    let why = client.explain(task).await.unwrap();
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("flappy") && d.contains("stayed up")),
        "{why:?}"
    );
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let started = view.started_at.unwrap();
    assert!(
        started.millis_since(back.last_seen) >= 3_000,
        "the node got work {} ms after it came back",
        started.millis_since(back.last_seen)
    );
    assert_eq!(node(&client, "flappy").await.unwrap().state, "up");
}
