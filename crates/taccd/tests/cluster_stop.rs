//! Stopping the embedded cluster, against real `taccd dev` processes and the real `tcloud`:
//! a signal restarts the server alone (an upgrade) and loses no task; `tcloud down` stops
//! nothing while tasks run unless told how (`--force` cancels them, `--drain` lets them
//! finish), and never leaves a task `lost` or a process behind.
//! `tcloud` must be built beside `taccd` (`cargo build -p taccd -p tcloud --bins`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use tacc_client::Client;
use tacc_core::{AttemptNo, TaskState};

/// The reason a task cancelled by `tcloud down --force` ends with.
const STOP_REASON: &str = "cluster stopped by tcloud down";

/// A task that says it started, waits for `MARKERS/go`, then says it finished.
fn gated(name: &str, marker: &str, markers: &Path) -> String {
    format!(
        "name: {name}\nresources: {{cpus: 1}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo started\n  while [ ! -f {go} ]; do sleep 0.1; done\n  echo finished after the gate\n",
        go = markers.join("go").display()
    )
}

fn touch_go(markers: &Path) {
    std::fs::write(markers.join("go"), "").unwrap();
}

/// The pid of the dev cluster's agent on `data` (`DATA/embedded-agent.json`), if recorded.
fn embedded_agent_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("embedded-agent.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["process"]["pid"].as_u64().map(|pid| pid as u32)
}

/// Events of a task that went through a stop: one attempt, never `lost`.
async fn assert_one_attempt_never_lost(client: &Client, task: tacc_core::TaskId) {
    let states = attempt_states(client, task).await;
    assert!(
        states
            .iter()
            .all(|(attempt, state)| *attempt == 1 && *state != TaskState::Lost),
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_restarts_the_server_alone_and_the_next_one_adopts_the_running_task() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let markers = markers_dir(outside.path());
    let data = dir.path().join("d");
    // The agent stops its tasks once its server has been gone for the heartbeat timeout:
    // a generous one, so that a slow machine restarts the server well within it.
    let flags = ["--heartbeat-timeout", "60"];
    let server = start("dev", &data, &flags).await;
    let client = server.client();
    let marker = format!("upgrade-{}", std::process::id());
    let task = submit(
        &client,
        dir.path(),
        "upgrade",
        &gated("upgrade", &marker, &markers),
        &[],
    )
    .await;
    wait_log(&client, task, "started").await;
    let agent = embedded_agent_pid(&data).expect("the agent's record");

    // SIGTERM, as an operator upgrading the server sends it.
    let mut old = server;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = eventually("the server to exit", DEADLINE, || {
        let status = old.child.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(status.success(), "{status:?}");
    assert!(process_alive(agent), "the agent stopped with its server");
    assert!(
        !task_processes(&marker).is_empty(),
        "the task stopped with the server"
    );

    // The new server adopts the agent and its task, which finishes as the same attempt.
    let server = restart_on("dev", &data, &old.url, &flags).await;
    drop(old);
    let client = server.client();
    touch_go(&markers);
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt, AttemptNo(1), "{view:?}");
    assert_one_attempt_never_lost(&client, task).await;
    let log = log_text(&client, task).await;
    assert!(
        log.contains("started") && log.contains("finished after the gate"),
        "{log}"
    );
    assert_eq!(
        embedded_agent_pid(&data),
        Some(agent),
        "the agent was started anew instead of adopted"
    );
}

/// A user's own `tcloud` environment (TACC_HOME) with the local cluster `tcloud up`
/// started on a port of its own; whatever a test leaves running is stopped when dropped.
struct LocalCluster {
    home: tempfile::TempDir,
    port: u16,
}

impl LocalCluster {
    fn up() -> LocalCluster {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = LocalCluster {
            home: tempfile::tempdir().unwrap(),
            port,
        };
        cluster.ok(&["up", "--port", &port.to_string()]);
        cluster
    }

    fn data(&self) -> PathBuf {
        self.home.path().join("local")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(tcloud_binary());
        command
            .args(args)
            .env("TACC_HOME", self.home.path())
            .env("TACC_TACCD", env!("CARGO_BIN_EXE_taccd"))
            .env_remove("TACC_SERVER")
            .env_remove("TACC_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    fn tcloud(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.tcloud(args);
        assert!(
            out.status.success(),
            "tcloud {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The local admin's client (`tcloud up` logged in with the same token).
    fn client(&self) -> Client {
        let token = std::fs::read_to_string(self.data().join("admin.token")).unwrap();
        Client::new(&format!("http://127.0.0.1:{}", self.port)).with_token(token.trim())
    }

    fn is_running(&self) -> bool {
        std::fs::read_to_string(self.data().join("taccd.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_some_and(process_alive)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.tcloud(&["down", "--force"]);
        clean_up_dev_cluster(&self.data());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcloud_down_refuses_while_a_task_runs_and_force_cancels_it_leaving_no_process() {
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let markers = markers_dir(outside.path());
    let cluster = LocalCluster::up();
    let client = cluster.client();
    wait_nodes(&client, 1).await;
    let marker = format!("down-force-{}", std::process::id());
    let task = submit(
        &client,
        outside.path(),
        "busy",
        &gated("busy", &marker, &markers),
        &[],
    )
    .await;
    wait_log(&client, task, "started").await;

    // A plain `tcloud down` stops nothing, says which task keeps it and what to do.
    let refused = cluster.tcloud(&["down"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(9), "{said}");
    assert!(
        said.contains("1 task queued or running")
            && said.contains(&format!("{task} busy (running"))
            && said.contains("--force")
            && said.contains("--drain"),
        "{said}"
    );
    assert!(cluster.is_running());
    assert_eq!(
        client.get_task(task).await.unwrap().state,
        TaskState::Running
    );

    // --force stops the task (its processes are gone once it returns), the agent, the server.
    let agent = embedded_agent_pid(&cluster.data()).expect("the agent's record");
    let stopped = cluster.ok(&["down", "--force"]);
    assert!(stopped.contains("Stopped the local cluster"), "{stopped}");
    assert!(
        task_processes(&marker).is_empty(),
        "the task's processes live on"
    );
    assert!(!process_alive(agent), "the agent lives on");
    assert!(!cluster.is_running());

    // Started again, the cluster tells how the task ended: cancelled by the stop.
    cluster.ok(&["up", "--port", &cluster.port.to_string()]);
    let client = cluster.client();
    let view = client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert_eq!(view.reason.as_deref(), Some(STOP_REASON), "{view:?}");
    // The history says so too, not "cancelled by user".
    let events = client.task_events(task).await.unwrap();
    let ended = events.last().unwrap();
    assert_eq!(
        (ended.state, ended.reason.as_deref()),
        (TaskState::Cancelled, Some(STOP_REASON)),
        "{events:?}"
    );
    assert_one_attempt_never_lost(&client, task).await;
    // Nothing runs now: a plain `tcloud down` stops it.
    cluster.ok(&["down"]);
    assert!(!cluster.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcloud_down_drain_refuses_new_tasks_lets_the_running_one_finish_then_stops() {
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let markers = markers_dir(outside.path());
    let cluster = LocalCluster::up();
    let client = cluster.client();
    wait_nodes(&client, 1).await;
    let marker = format!("down-drain-{}", std::process::id());
    let task = submit(
        &client,
        outside.path(),
        "long",
        &gated("long", &marker, &markers),
        &[],
    )
    .await;
    wait_log(&client, task, "started").await;

    let mut draining = cluster.command(&["down", "--drain"]).spawn().unwrap();
    let stop = client.clone();
    eventually("the drain to begin", DEADLINE, || {
        let stop = stop.clone();
        async move { stop.cluster_stop().await.ok()?.stopping }
    })
    .await;

    // A new task is refused, naming the drain.
    let new_task = outside.path().join("late");
    std::fs::create_dir_all(&new_task).unwrap();
    std::fs::write(new_task.join("task.yaml"), "name: late\nrun: echo late\n").unwrap();
    let refused = cluster.tcloud(&["submit", new_task.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("draining (`tcloud down --drain`)"), "{said}");
    assert!(
        draining.try_wait().unwrap().is_none(),
        "the drain ended while a task runs"
    );

    // The running task finishes; then the cluster stops and `tcloud down --drain` says so.
    touch_go(&markers);
    let status = eventually("the drain to end", DEADLINE, || {
        let status = draining.try_wait().unwrap();
        async move { status }
    })
    .await;
    let mut printed = String::new();
    std::io::Read::read_to_string(draining.stdout.as_mut().unwrap(), &mut printed).unwrap();
    let mut progress = String::new();
    std::io::Read::read_to_string(draining.stderr.as_mut().unwrap(), &mut progress).unwrap();
    assert!(status.success(), "{printed}\n{progress}");
    assert!(printed.contains("Stopped the local cluster"), "{printed}");
    assert!(
        progress.contains("Draining: new tasks are refused; waiting for 1 task to finish"),
        "{progress}"
    );
    assert!(!cluster.is_running());
    assert!(task_processes(&marker).is_empty());

    // Started again: the task succeeded, as its only attempt; the late one was never made.
    cluster.ok(&["up", "--port", &cluster.port.to_string()]);
    let client = cluster.client();
    let view = client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_one_attempt_never_lost(&client, task).await;
    let all = client
        .list_tasks(&tacc_client::TaskQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
}
