//! Behaviour every [`Executor`](crate::Executor) must show; each backend's tests run it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tacc_core::{AttemptNo, Priority, TaskId, UserName};

use crate::{Executor, ExitOutcome, LaunchSpec, OutputLine, Owner, Phase, Stream};

/// A launch spec with a minimal environment, for tests: the `run` phase of a one-node
/// attempt of task 1.
pub fn spec(workdir: &Path, script: &str) -> LaunchSpec {
    LaunchSpec {
        label: "contract".into(),
        owner: Owner {
            task: TaskId(1),
            task_name: "contract".into(),
            attempt: AttemptNo::FIRST,
            node_rank: 0,
            num_nodes: 1,
            local_rank: 0,
            rank: 0,
            user: UserName::new("contract"),
            priority: Priority::Normal,
        },
        phase: Phase::Run,
        workdir: workdir.to_path_buf(),
        script: script.into(),
        env: BTreeMap::from([
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            ("GREETING".to_string(), "hello from env".to_string()),
        ]),
        time_limit: None,
        kill_grace: Duration::from_millis(500),
        stop_signal: nix::sys::signal::Signal::SIGTERM,
        placement: Default::default(),
    }
}

async fn collect(mut rx: crate::OutputReceiver) -> Vec<OutputLine> {
    let mut lines = Vec::new();
    while let Some(line) = rx.recv().await {
        lines.push(line);
    }
    lines
}

/// Whether `pid` is a live process (a zombie has exited; only a live process counts).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Wait (polling, 10 s deadline) until `pid` is no live process; panics past it.
pub async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn run_all(executor: &dyn Executor, workdir: &Path) {
    output_and_exit_code(executor, workdir).await;
    success_is_exit_zero(executor, workdir).await;
    time_limit_stops_it(executor, workdir).await;
    cancel_stops_it(executor, workdir).await;
    missing_workdir_is_an_error(executor, workdir).await;
}

pub async fn output_and_exit_code(executor: &dyn Executor, workdir: &Path) {
    let (tx, rx) = crate::output_channel();
    let handle = executor
        .launch(
            spec(workdir, "echo first\necho oops >&2\necho $GREETING\nexit 3"),
            tx,
        )
        .await
        .unwrap();
    assert_eq!(handle.wait().await, ExitOutcome::Exited(3));
    let lines = collect(rx).await;
    let stdout: Vec<&str> = lines
        .iter()
        .filter(|l| l.stream == Stream::Stdout)
        .map(|l| l.text.as_str())
        .collect();
    let stderr: Vec<&str> = lines
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| l.text.as_str())
        .collect();
    assert_eq!(stdout, vec!["first", "hello from env"]);
    assert_eq!(stderr, vec!["oops"]);
}

pub async fn success_is_exit_zero(executor: &dyn Executor, workdir: &Path) {
    let (tx, _rx) = crate::output_channel();
    let handle = executor.launch(spec(workdir, "true"), tx).await.unwrap();
    assert_eq!(handle.wait().await, ExitOutcome::Exited(0));
}

pub async fn time_limit_stops_it(executor: &dyn Executor, workdir: &Path) {
    let (tx, _rx) = crate::output_channel();
    let mut limited = spec(workdir, "sleep 30");
    limited.time_limit = Some(Duration::from_millis(300));
    let started = Instant::now();
    let handle = executor.launch(limited, tx).await.unwrap();
    assert_eq!(handle.wait().await, ExitOutcome::TimeLimit);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

pub async fn cancel_stops_it(executor: &dyn Executor, workdir: &Path) {
    let (tx, mut rx) = crate::output_channel();
    let handle = executor
        .launch(spec(workdir, "echo ready\nsleep 30"), tx)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("output in time");
    assert_eq!(first.map(|l| l.text), Some("ready".to_string()));
    let started = Instant::now();
    handle.cancel();
    assert_eq!(handle.wait().await, ExitOutcome::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The stop signal (a task's `checkpoint.signal`) reaches the task first, on cancel and
/// at the time limit alike, and the grace lets it finish writing a checkpoint. For every
/// executor that runs the script itself (a fake that runs nothing is exempt).
pub async fn stop_signal_comes_first_with_its_grace(executor: &dyn Executor, workdir: &Path) {
    let script = "trap 'sleep 0.5; echo \"saved at $1\" > checkpoint.txt; exit 0' USR1\n\
                  echo ready\nsleep 30 & wait\n";
    for (ending, expected) in [
        ("cancel", ExitOutcome::Cancelled),
        ("limit", ExitOutcome::TimeLimit),
    ] {
        let _ = std::fs::remove_file(workdir.join("checkpoint.txt"));
        let (tx, mut rx) = crate::output_channel();
        let mut checkpointing = spec(workdir, &script.replace("$1", ending));
        checkpointing.stop_signal = nix::sys::signal::Signal::SIGUSR1;
        checkpointing.kill_grace = Duration::from_secs(10);
        if ending == "limit" {
            checkpointing.time_limit = Some(Duration::from_secs(1));
        }
        let handle = executor.launch(checkpointing, tx).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("output in time");
        assert_eq!(first.map(|l| l.text), Some("ready".to_string()));
        if ending == "cancel" {
            handle.cancel();
        }
        assert_eq!(handle.wait().await, expected, "{ending}");
        let saved = std::fs::read_to_string(workdir.join("checkpoint.txt"))
            .unwrap_or_else(|e| panic!("no checkpoint written on {ending}: {e}"));
        assert_eq!(saved, format!("saved at {ending}\n"));
    }
}

pub async fn missing_workdir_is_an_error(executor: &dyn Executor, workdir: &Path) {
    let (tx, _rx) = crate::output_channel();
    let err = executor
        .launch(spec(&workdir.join("does-not-exist"), "true"), tx)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does-not-exist"), "{err}");
}
