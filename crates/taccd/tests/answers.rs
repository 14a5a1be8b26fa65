//! Answers a user can trust (issue 26's smaller wrong answers), each reproduced with the
//! real `tcloud` against a real `taccd dev` cluster: a followed pipeline's exit code comes
//! from its own stages (cached ones count as done), a sweep is announced by its trials, a
//! checkpoint signal every runtime delivers draws no "not sent" warning, a task's outcome
//! line counts the time it spent preparing, and a dataset fetch leaves the agent's log
//! clean.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// `tcloud ARGS` against `daemon` as its admin, whatever its exit code.
fn tcloud_run(daemon: &Daemon, home: &Path, args: &[&str]) -> Output {
    Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last line `tcloud` wrote to stderr (a followed task's or group's outcome).
fn last_line(out: &Output) -> String {
    stderr(out).lines().last().unwrap_or_default().to_string()
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// A copy of `examples/pipeline` under `to`; its pipeline file.
fn copy_pipeline(to: &Path) -> PathBuf {
    let example = example("pipeline");
    for stage in ["generate", "train", "evaluate"] {
        std::fs::create_dir_all(to.join(stage)).unwrap();
        let script = format!("{stage}.sh");
        std::fs::copy(
            example.join(stage).join(&script),
            to.join(stage).join(&script),
        )
        .unwrap();
    }
    std::fs::copy(example.join("pipeline.yaml"), to.join("pipeline.yaml")).unwrap();
    to.join("pipeline.yaml")
}

/// `tcloud submit examples/pipeline/pipeline.yaml -f` exited 5 although every stage
/// succeeded: on a first run after another group (a 10-element array) had run, and on a
/// second run whose first stages were cached. Both exit 0 now, and the line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_pipeline_exits_0_after_another_group_and_with_cached_stages() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let home = dir.path().join("home");

    let array = dir.path().join("ten");
    std::fs::create_dir_all(&array).unwrap();
    std::fs::write(
        array.join("task.yaml"),
        "name: ten\nresources: {cpus: 0.5, memory: 64MiB}\nrun: echo element $TACC_ARRAY_INDEX\n",
    )
    .unwrap();
    let out = tcloud_run(
        &daemon,
        &home,
        &["submit", array.to_str().unwrap(), "--array", "0-9", "-f"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        last_line(&out).ends_with("(10 attempts over 10 elements)"),
        "{}",
        stderr(&out)
    );

    let file = copy_pipeline(&dir.path().join("pipeline"));
    let out = tcloud_run(&daemon, &home, &["submit", file.to_str().unwrap(), "-f"]);
    let line = last_line(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        line.starts_with("pipeline g2 succeeded after ")
            && line.contains(": generate succeeded · train succeeded · evaluate succeeded ("),
        "{line}"
    );
    // Generate, six trials, evaluate: the pipeline's own tasks, not the array's.
    assert!(line.ends_with("(8 tasks run)"), "{line}");

    // Only evaluate/ changes: generate and train are cached, evaluate runs, all is well.
    let script = file.with_file_name("evaluate").join("evaluate.sh");
    let mut text = std::fs::read_to_string(&script).unwrap();
    text.push_str("echo second evaluation\n");
    std::fs::write(&script, text).unwrap();
    let out = tcloud_run(&daemon, &home, &["submit", file.to_str().unwrap(), "-f"]);
    let line = last_line(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        line.contains("succeeded after ")
            && line.contains(": generate cached · train cached · evaluate succeeded (1 task run)"),
        "{line}"
    );
}

/// A six-trial sweep was announced as `Submitted array g1 (sweep-lr, 2 elements …)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_is_announced_as_a_sweep_of_its_trials() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let home = dir.path().join("home");
    let out = tcloud_run(
        &daemon,
        &home,
        &["submit", example("sweep").to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("Submitted sweep g1 (sweep-lr, 6 trials, 2 at a time: tasks 1…)"),
        "{text}"
    );
    let json = tcloud_run(
        &daemon,
        &home,
        &["submit", example("sweep").to_str().unwrap(), "--json"],
    );
    let reply: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(reply["kind"], "sweep", "{reply}");
    assert_eq!(reply["trials"], 6, "{reply}");
    for group in ["g1", "g2"] {
        tcloud(&daemon, &home, &["cancel", group]);
    }
}

/// `checkpoint: {signal: SIGUSR1}` drew `SIGUSR1 is not sent yet … handle SIGTERM`,
/// although every runtime sends it. Neither `check` nor `submit` says so now, and the
/// task does get SIGUSR1 when cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_checkpoint_signal_draws_no_warning_and_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let task_dir = dir.path().join("ckpt");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(
        task_dir.join("task.yaml"),
        "name: ckpt\nresources: {cpus: 0.5, memory: 64MiB}\ncheckpoint:\n  signal: SIGUSR1\n  grace: 10s\n\
         run: |\n  trap 'echo got USR1; exit 0' USR1\n  echo ready\n  sleep 60 & wait\n",
    )
    .unwrap();
    let checked = tcloud_run(&daemon, &home, &["check", task_dir.to_str().unwrap()]);
    assert_eq!(checked.status.code(), Some(0), "{}", stderr(&checked));
    assert!(
        !stderr(&checked).contains("warning"),
        "{}",
        stderr(&checked)
    );
    let submitted = tcloud_run(
        &daemon,
        &home,
        &["submit", task_dir.to_str().unwrap(), "--json"],
    );
    assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
    assert!(
        !stderr(&submitted).contains("not sent"),
        "{}",
        stderr(&submitted)
    );
    let reply: serde_json::Value = serde_json::from_slice(&submitted.stdout).unwrap();
    let task = tacc_core::TaskId(reply["task_id"].as_u64().unwrap());
    wait_log(&client, task, "ready").await;
    client.cancel(task).await.unwrap();
    wait_terminal(&client, task).await;
    let log = log_text(&client, task).await;
    assert!(log.contains("got USR1"), "{log}");
}

/// A loopback HTTP server that answers every request with `body`, but only after `delay`:
/// a slow dataset source.
async fn slow_server(body: &'static [u8], delay: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/weights.bin", listener.local_addr().unwrap());
    let body = Arc::new(body);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                // The slowness under test, not a wait for a condition.
                tokio::time::sleep(delay).await;
                let header = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(header.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    url
}

/// Seconds in a duration as the outcome line writes one below a minute (`5.8s`).
fn seconds(text: &str) -> f64 {
    text.trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("not seconds: {text}"))
}

/// A task that waited 5.8 s for its environment reported `succeeded after 0s`. Here it
/// waits 2 s for its dataset: the outcome line says the whole wait and both its parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outcome_of_a_followed_task_counts_its_preparation() {
    let dir = tempfile::tempdir().unwrap();
    let url = slow_server(b"weights\n", Duration::from_secs(2)).await;
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let home = dir.path().join("home");
    let task_dir = dir.path().join("prepared");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(
        task_dir.join("task.yaml"),
        format!(
            "name: prepared\nresources: {{cpus: 0.5, memory: 64MiB}}\n\
             datasets:\n  - {{name: weights, source: '{url}', mount: data/weights.bin}}\n\
             run: cat data/weights.bin\n"
        ),
    )
    .unwrap();
    // Off the runtime's threads: the slow server answers on them meanwhile.
    let (url, token, path) = (daemon.url.clone(), daemon.token.clone(), task_dir.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(tcloud_binary())
            .args(["submit", path.to_str().unwrap(), "-f"])
            .env("TACC_HOME", home)
            .env("TACC_SERVER", url)
            .env("TACC_TOKEN", token)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = last_line(&out);
    // `task 1 succeeded after 2.3s (2.1s preparing, 0.2s running)`
    let (_, after) = line
        .split_once(" succeeded after ")
        .unwrap_or_else(|| panic!("{line}"));
    let (total, parts) = after.split_once(" (").unwrap_or_else(|| panic!("{line}"));
    let (preparing, running) = parts
        .trim_end_matches(" running)")
        .split_once(" preparing, ")
        .unwrap_or_else(|| panic!("{line}"));
    let (total, preparing, running) = (seconds(total), seconds(preparing), seconds(running));
    assert!(preparing >= 2.0, "{line}");
    assert!(total >= preparing && total >= 2.0, "{line}");
    assert!((total - preparing - running).abs() <= 0.15, "{line}");
}

/// Every dataset fetch wrote `chmod: cannot access '…/datasets/.fetch-…': No such file
/// or directory` into agent.log (the staging directory was "made writable" before it
/// existed, by a `chmod` child).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_fetch_leaves_the_agent_log_clean() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("corpus");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("sub").join("a.txt"), "corpus-line\n").unwrap();
    let data = dir.path().join("d");
    let daemon = start("dev", &data, &["--cpus", "2"]).await;
    let client = daemon.client();
    let task = submit(
        &client,
        dir.path(),
        "reader",
        &format!(
            "name: reader\nresources: {{cpus: 0.5, memory: 64MiB}}\n\
             datasets:\n  - {{name: corpus, source: '{}', mount: data/corpus}}\n\
             run: cat data/corpus/sub/a.txt\n",
            source.display()
        ),
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    let log = log_text(&client, task).await;
    assert_eq!(view.state, tacc_core::TaskState::Succeeded, "{log}");
    assert!(log.contains("tacc: dataset `corpus` fetched"), "{log}");
    let agent_log = std::fs::read_to_string(data.join("agent.log")).unwrap();
    assert!(
        !agent_log.contains("chmod") && !agent_log.contains("cannot access"),
        "{agent_log}"
    );
}
