//! The executor contract against every backend, plus what only real processes can show.

use std::path::Path;
use std::time::Duration;

use tacc_exec::contract::{self, process_alive, wait_gone};
use tacc_exec::{Executor, ExitOutcome, FakeExecutor, ProcessExecutor};

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
    let (tx, mut rx) = tacc_exec::output_channel();
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
    let (tx, mut rx) = tacc_exec::output_channel();
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
    let (tx, _rx) = tacc_exec::output_channel();
    let handle = ProcessExecutor::new()
        .launch(contract::spec(dir.path(), "kill -SEGV $$"), tx)
        .await
        .unwrap();
    assert_eq!(handle.wait().await, ExitOutcome::Signalled(11));
}

/// A reader that falls behind holds the task back: its output waits in the task's pipe,
/// not in the agent's memory. Once the reader catches up every line arrives, in order,
/// and the task runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_falls_behind_holds_the_task_back_instead_of_buffering() {
    let dir = tempfile::tempdir().unwrap();
    const LINES: usize = 5000;
    // 1000-byte lines: 5 MB, far more than the channel, a pipe and a read buffer hold.
    let script =
        format!("for i in $(seq 1 {LINES}); do printf '%01000d\\n' $i; done\ntouch finished");
    let (tx, mut rx) = tacc_exec::output_channel();
    let handle = ProcessExecutor::new()
        .launch(contract::spec(dir.path(), &script), tx)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while rx.len() < tacc_exec::OUTPUT_BUFFER_LINES {
        assert!(
            std::time::Instant::now() < deadline,
            "the channel never filled: {} lines in it",
            rx.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !dir.path().join("finished").exists(),
        "the task ran ahead of its reader: its output was buffered somewhere"
    );
    let waiting = tokio::spawn(handle.wait());
    let mut received = 0;
    while let Some(line) = rx.recv().await {
        received += 1;
        assert_eq!(line.text, format!("{received:01000}"));
    }
    assert_eq!(received, LINES);
    assert_eq!(waiting.await.unwrap(), ExitOutcome::Exited(0));
    assert!(dir.path().join("finished").exists());
}

/// A reader slower than the drain limit still gets every line a task printed before it
/// ended: only a silent pipe is given up, never one whose reader is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_every_line_after_the_task_ended() {
    let dir = tempfile::tempdir().unwrap();
    const LINES: usize = 2000;
    let script = format!("for i in $(seq 1 {LINES}); do echo $i; done");
    let (tx, mut rx) = tacc_exec::output_channel();
    let handle = ProcessExecutor::new()
        .launch(contract::spec(dir.path(), &script), tx)
        .await
        .unwrap();
    let waiting = tokio::spawn(handle.wait());
    let mut received = 0;
    while let Some(line) = rx.recv().await {
        received += 1;
        assert_eq!(line.text, received.to_string());
        if received % 100 == 0 {
            // 20 pauses of 150 ms: 3 s, longer than the 2 s a silent pipe is given.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    assert_eq!(received, LINES);
    assert_eq!(waiting.await.unwrap(), ExitOutcome::Exited(0));
}
