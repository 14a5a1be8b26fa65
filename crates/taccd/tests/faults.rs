//! Cancel in every state and crashes of the daemon, against real processes.

mod common;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_core::TaskState;

fn sleeper(marker: &str, seconds: u32) -> String {
    format!(
        "name: sleeper\nresources: {{cpus: 1}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo started\n  sleep {seconds} & wait\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_queued_and_running_tasks_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    // One CPU: the second task must queue behind the first.
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let client = daemon.client();
    let marker = format!("cancel-running-{}", std::process::id());
    let running = submit(&client, dir.path(), "running", &sleeper(&marker, 300), &[]).await;
    let queued = submit(
        &client,
        dir.path(),
        "queued",
        &sleeper("cancel-queued", 300),
        &[],
    )
    .await;
    wait_state(&client, running, &[TaskState::Running]).await;
    wait_log(&client, running, "started").await;
    assert!(!task_processes(&marker).is_empty());
    let view = client.get_task(queued).await.unwrap();
    assert_eq!(view.state, TaskState::Queued);
    assert_eq!(view.reason.as_deref(), Some("waiting for resources"));

    let reply = client.cancel(queued).await.unwrap();
    assert_eq!(
        reply.state,
        TaskState::Cancelled,
        "a queued task is cancelled at once"
    );
    client.cancel(running).await.unwrap();
    let view = wait_terminal(&client, running).await;
    assert_eq!(view.state, TaskState::Cancelled);
    assert_eq!(view.reason.as_deref(), Some("cancelled by user"));
    wait_no_processes(&marker).await;
    // Cancelling a finished task changes nothing.
    let again = client.cancel(running).await.unwrap();
    assert!(!again.changed);
    assert_eq!(
        client.get_task(queued).await.unwrap().state,
        TaskState::Cancelled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_starting_never_runs_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let agent = start_agent(&server, &dir.path().join("a"), &["--name", "frozen"]);
    wait_nodes(&client, 1).await;
    // A stopped agent cannot act on its assignment: the task stays `starting`.
    kill(Pid::from_raw(agent.pid() as i32), Signal::SIGSTOP).unwrap();
    let marker = format!("cancel-starting-{}", std::process::id());
    let task = submit(&client, dir.path(), "starting", &sleeper(&marker, 300), &[]).await;
    wait_state(&client, task, &[TaskState::Starting]).await;
    let reply = client.cancel(task).await.unwrap();
    assert_eq!(
        reply.state,
        TaskState::Starting,
        "the agent must confirm first"
    );
    kill(Pid::from_raw(agent.pid() as i32), Signal::SIGCONT).unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Cancelled);
    wait_no_processes(&marker).await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_daemon_loses_no_acknowledged_task_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &["--cpus", "1"]).await;
    let client = daemon.client();
    let done = submit(
        &client,
        dir.path(),
        "done",
        "name: done\nrun: echo finished-before-crash\n",
        &[],
    )
    .await;
    wait_state(&client, done, &[TaskState::Succeeded]).await;
    let marker = format!("kill9-{}", std::process::id());
    let running = submit(&client, dir.path(), "running", &sleeper(&marker, 300), &[]).await;
    let queued = submit(
        &client,
        dir.path(),
        "queued",
        "name: queued\nresources: {cpus: 1}\nrun: echo ran-after-restart\n",
        &[],
    )
    .await;
    wait_log(&client, running, "started").await;
    assert_eq!(
        client.get_task(queued).await.unwrap().state,
        TaskState::Queued
    );

    // The machine goes down: the server and the embedded agent, whose tasks are orphaned.
    daemon.crash();
    let mut restarted = start("dev", &data, &["--cpus", "1"]).await;
    let client = restarted.client();
    // The task that was running is lost with a reason, its logs so far kept...
    let view = wait_terminal(&client, running).await;
    assert_eq!(view.state, TaskState::Lost, "{view:?}");
    assert!(
        view.reason.as_deref().unwrap().contains("restarted"),
        "{view:?}"
    );
    assert!(log_text(&client, running).await.contains("started"));
    // ...and its processes, orphaned by the crash, are gone.
    wait_no_processes(&marker).await;
    // The queued one runs; the finished one is still there with its log.
    let view = wait_terminal(&client, queued).await;
    assert_eq!(view.state, TaskState::Succeeded);
    assert!(
        log_text(&client, queued)
            .await
            .contains("ran-after-restart")
    );
    assert_eq!(
        client.get_task(done).await.unwrap().state,
        TaskState::Succeeded
    );
    assert!(
        log_text(&client, done)
            .await
            .contains("finished-before-crash")
    );
    restarted.kill9();
}

/// `kill -9` of the embedded cluster's server alone: its agent and the task live on, the
/// task ends while the server is down, and the server started again on its address
/// records that end — attempt 1 succeeded, with what it printed during the outage, and
/// nothing ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ends_while_the_embedded_server_is_down_is_recorded_not_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let markers = markers_dir(dir.path());
    let gate = markers.join("gate");
    let ended = markers.join("ended");
    let retry = "retry: {max_attempts: 3, on: [node_failure]}";
    let yaml = format!(
        "name: outage\n{retry}\nrun: |\n  echo \"attempt $TACC_ATTEMPT before\"\n  \
         while [ ! -e {gate} ]; do sleep 0.05; done\n  echo during-the-outage\n  \
         echo $TACC_ATTEMPT >> {ended}\n",
        gate = gate.display(),
        ended = ended.display()
    );
    let mut daemon = start("dev", &data, &["--cpus", "1"]).await;
    let url = daemon.url.clone();
    let client = daemon.client();
    let task = submit(&client, dir.path(), "outage", &yaml, &[]).await;
    wait_log(&client, task, "attempt 1 before").await;
    daemon.kill9();
    std::fs::write(&gate, "").unwrap();
    eventually("the task to end while the server is down", DEADLINE, || {
        let done = std::fs::read_to_string(&ended).is_ok_and(|t| t == "1\n");
        async move { done.then_some(()) }
    })
    .await;
    let restarted = restart_on("dev", &data, &url, &["--cpus", "1"]).await;
    let client = restarted.client();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 1, "{view:?}");
    let log = log_text(&client, task).await;
    assert!(log.contains("during-the-outage"), "{log}");
    assert_eq!(std::fs::read_to_string(&ended).unwrap(), "1\n", "ran once");
    let states = attempt_states(&client, task).await;
    assert!(
        !states.iter().any(|(_, state)| *state == TaskState::Lost),
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_retried_on_node_failure_runs_again_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &[]).await;
    let client = daemon.client();
    let task = submit(
        &client,
        dir.path(),
        "resilient",
        "name: resilient\nretry: {max_attempts: 2, on: [node_failure]}\nrun: |\n  echo attempt $TACC_ATTEMPT\n  if [ \"$TACC_ATTEMPT\" = 1 ]; then sleep 300 & wait; fi\n",
        &[],
    )
    .await;
    wait_log(&client, task, "attempt 1").await;
    daemon.crash();
    let restarted = start("dev", &data, &[]).await;
    let client = restarted.client();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2);
    let states = attempt_states(&client, task).await;
    assert!(states.contains(&(1, TaskState::Lost)), "{states:?}");
}

/// R5, an agent stopped (`SIGSTOP`) while its task runs: the agent cannot fence itself,
/// so its watchdog kills the attempt — a process that left its group with `setsid`
/// too — once the agent has been silent for 2/3 of the
/// heartbeat timeout — before the server loses the node and retries the attempt on the
/// other agent. Continued, the agent's late report of the attempt changes nothing: the
/// task succeeds once, as attempt 2, on the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_s_attempt_is_killed_by_its_watchdog_before_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &["--heartbeat-timeout", "3"],
    )
    .await;
    let client = server.client();
    let frozen = start_agent(&server, &dir.path().join("a"), &["--name", "frozen"]);
    wait_nodes(&client, 1).await;
    let marker = format!("frozen-{}", std::process::id());
    let yaml = format!(
        "name: frozen\nretry: {{max_attempts: 2, on: [node_failure]}}\n\
         environment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo \"attempt $TACC_ATTEMPT\"\n  \
         if [ \"$TACC_ATTEMPT\" = 1 ]; then setsid sleep 600 & sleep 600 & wait; fi\n"
    );
    let task = submit(&client, dir.path(), "frozen", &yaml, &[]).await;
    wait_log(&client, task, "attempt 1").await;
    let _spare = start_agent(&server, &dir.path().join("b"), &["--name", "spare"]);
    wait_nodes(&client, 2).await;
    let agent = Pid::from_raw(frozen.pid() as i32);
    kill(agent, Signal::SIGSTOP).unwrap();
    let stopped = std::time::Instant::now();
    wait_no_processes(&marker).await;
    let fenced_after = stopped.elapsed();
    let view = client.get_task(task).await.unwrap();
    assert_eq!(
        view.attempt.0, 1,
        "attempt 1 was still running when attempt 2 was placed: {view:?}"
    );
    let view = wait_terminal(&client, task).await;
    kill(agent, Signal::SIGCONT).unwrap();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2, "{view:?}");
    assert_eq!(view.nodes, vec!["spare".to_string()]);
    eprintln!(
        "the stopped agent's attempt was killed {fenced_after:?} after SIGSTOP (heartbeat timeout 3 s)"
    );
    // The continued agent registers again; what it says of attempt 1 changes nothing.
    eventually("the stopped agent back", DEADLINE, || {
        let client = client.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            nodes
                .iter()
                .any(|n| n.name == "frozen" && n.state != "down")
                .then_some(())
        }
    })
    .await;
    let view = client.get_task(task).await.unwrap();
    assert_eq!((view.state, view.attempt.0), (TaskState::Succeeded, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_lost_after_the_heartbeat_timeout() {
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
    let marker = format!("silent-{}", std::process::id());
    let task = submit(&client, dir.path(), "orphan", &sleeper(&marker, 300), &[]).await;
    wait_state(&client, task, &[TaskState::Running]).await;
    agent.kill9();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Lost);
    assert!(
        view.reason
            .as_deref()
            .unwrap()
            .contains("stopped responding"),
        "{view:?}"
    );
    let nodes = client.list_nodes().await.unwrap();
    assert_eq!(nodes[0].state, "down");
    // Nothing of its task runs on: the agent's watchdog killed it when the agent died.
    wait_no_processes(&marker).await;
    let _agent = start_agent(&server, &dir.path().join("a"), &["--name", "doomed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_gang_runs_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let _a = start_agent(&server, &dir.path().join("a"), &["--name", "node-a"]);
    let _b = start_agent(&server, &dir.path().join("b"), &["--name", "node-b"]);
    wait_nodes(&client, 2).await;
    let task = submit(
        &client,
        dir.path(),
        "gang",
        "name: gang\nresources: {nodes: 2, cpus: 1}\nrun: echo \"rank $NODE_RANK of $WORLD_SIZE master $MASTER_ADDR:$MASTER_PORT\"\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let mut nodes = view.nodes.clone();
    nodes.sort();
    assert_eq!(nodes, vec!["node-a", "node-b"]);
    let log = log_text(&client, task).await;
    let port_of = |rank: u32| {
        let prefix = format!("[{rank}] rank {rank} of 2 master 127.0.0.1:");
        log.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no line of rank {rank} in {log}"))
            .parse::<u16>()
            .unwrap()
    };
    assert_eq!(port_of(0), port_of(1), "{log}");
    assert!((29500..30500).contains(&port_of(0)), "{log}");
}
