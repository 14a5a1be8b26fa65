//! The executor contract against every backend, plus what only real processes can show.

use std::path::Path;
use std::time::Duration;

use tacc_exec::contract::{self, process_alive, wait_gone};
use tacc_exec::{Executor, ExitOutcome, FakeExecutor, ProcessExecutor};
use tokio::sync::mpsc;

#[tokio::test]
async fn fake_executor_meets_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract::run_all(&FakeExecutor::new(), dir.path()).await;
}

#[tokio::test]
async fn process_executor_meets_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract::run_all(&ProcessExecutor::new(), dir.path()).await;
    contract::stop_signal_comes_first_with_its_grace(&ProcessExecutor::new(), dir.path()).await;
}

/// Start a script that puts a `sleep` in the background and prints its pid.
async fn launch_with_child(
    script: &str,
    dir: &Path,
    limit: Option<Duration>,
) -> (tacc_exec::ExecutionHandle, u32) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut spec = contract::spec(dir, script);
    spec.time_limit = limit;
    let handle = ProcessExecutor::new().launch(spec, tx).await.unwrap();
    let line = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("pid printed")
        .expect("pid line");
    let child: u32 = line.text.trim().parse().expect("numeric pid");
    assert!(process_alive(child));
    (handle, child)
}

#[tokio::test]
async fn cancel_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, child) = launch_with_child("sleep 300 & echo $!\nwait", dir.path(), None).await;
    handle.cancel();
    assert_eq!(handle.wait().await, ExitOutcome::Cancelled);
    wait_gone(child).await;
}

#[tokio::test]
async fn time_limit_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, child) = launch_with_child(
        "sleep 300 & echo $!\nwait",
        dir.path(),
        Some(Duration::from_millis(500)),
    )
    .await;
    assert_eq!(handle.wait().await, ExitOutcome::TimeLimit);
    wait_gone(child).await;
}

#[tokio::test]
async fn leftovers_die_when_the_main_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, child) = launch_with_child(
        "sleep 300 >/dev/null 2>&1 & echo $!\nsleep 0.2",
        dir.path(),
        None,
    )
    .await;
    assert_eq!(handle.wait().await, ExitOutcome::Exited(0));
    wait_gone(child).await;
}

#[tokio::test]
async fn ignoring_sigterm_gets_sigkill_after_grace() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let spec = contract::spec(
        dir.path(),
        "trap '' TERM\necho armed\nwhile true; do sleep 0.1; done",
    );
    let handle = ProcessExecutor::new().launch(spec, tx).await.unwrap();
    let pid = handle.pid.unwrap();
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap();
    handle.cancel();
    assert_eq!(handle.wait().await, ExitOutcome::Cancelled);
    wait_gone(pid).await;
}

#[tokio::test]
async fn signal_death_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let handle = ProcessExecutor::new()
        .launch(contract::spec(dir.path(), "kill -SEGV $$"), tx)
        .await
        .unwrap();
    assert_eq!(handle.wait().await, ExitOutcome::Signalled(11));
}
