//! Sweeps end to end on a real dev cluster, with `examples/sweep`: six trials of a small
//! training script that reports `val_loss` per step in `$TACC_METRICS`, two at a time;
//! ASHA stops the clearly worse trials at a rung with a reason and their slots go to the
//! next trials; the leaderboard lists the best first; the best trial's outputs are one
//! command away.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use tacc_client::Client;
use tacc_core::{GroupId, TaskState};
use tacc_proto::{SubmitTask, SweepBoard};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sweep")
}

async fn wait_sweep_done(client: &Client, group: GroupId) -> SweepBoard {
    eventually(&format!("sweep {group} to end"), DEADLINE, || {
        let client = client.clone();
        async move {
            let board = client.sweep(group).await.ok()?;
            let all = board.trials.len() as u32 == board.max_trials;
            (all && board.trials.iter().all(|t| t.state.is_terminal())).then_some(board)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_stops_bad_trials_early_and_the_best_trial_leads_the_board() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    let loaded = tacc_schema::load_task(&example()).unwrap();
    let snapshot = upload(&client, &loaded.code_root).await;
    let started = std::time::Instant::now();
    let reply = client
        .submit(&SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: Some("examples/sweep".into()),
            wait_for_capacity: false,
        })
        .await
        .unwrap();
    let submitted = reply.group.expect("a sweep makes a group");
    assert_eq!(
        submitted.elements, 2,
        "the first `parallel` trials start at once"
    );
    let group = submitted.group;

    // At most `parallel` trials are ever unfinished at once.
    let board = eventually(&format!("sweep {group} to end"), DEADLINE, || {
        let client = client.clone();
        async move {
            let board = client.sweep(group).await.ok()?;
            let unfinished = board
                .trials
                .iter()
                .filter(|t| !t.state.is_terminal())
                .count();
            assert!(
                unfinished <= 2,
                "{unfinished} trials unfinished: {board:#?}"
            );
            let all = board.trials.len() as u32 == board.max_trials;
            (all && board.trials.iter().all(|t| t.state.is_terminal())).then_some(board)
        }
    })
    .await;
    let elapsed = started.elapsed();
    assert_eq!(board, wait_sweep_done(&client, group).await);
    assert_eq!(board.trials.len(), 6);
    assert_eq!(
        (board.method.as_str(), board.metric.as_str()),
        ("asha", "val_loss")
    );

    // lr=0.1 (trial 0) is the best and runs all 18 steps; lr 0.01, 1.0 and 3.0 are far
    // worse at rung 0 than what came before them and are stopped there.
    let best = &board.trials[0];
    assert_eq!(best.index, 0, "{board:#?}");
    assert_eq!(best.parameters["lr"], "0.1");
    assert_eq!(best.state, TaskState::Succeeded);
    assert_eq!(best.step, Some(18));
    assert_eq!(board.best_trial, Some(best.task_id));
    assert_eq!(
        client.get_task(best.task_id).await.unwrap().state,
        TaskState::Succeeded
    );
    for lr in ["0.01", "1.0", "3.0"] {
        let trial = board
            .trials
            .iter()
            .find(|t| t.parameters["lr"] == lr)
            .unwrap();
        assert_eq!(trial.state, TaskState::Cancelled, "lr={lr}: {trial:#?}");
        let reason = trial.reason.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with("early_stopped: rung 0 (step 2, val_loss ")
                && reason.contains("top 1/3 needed ≤ "),
            "lr={lr}: {reason}"
        );
        assert!(
            trial.step.unwrap() < 18,
            "lr={lr} ran to the end: {trial:#?}"
        );
    }
    // Best first: by the best reported value.
    let bests: Vec<f64> = board.trials.iter().map(|t| t.best.unwrap()).collect();
    assert!(bests.windows(2).all(|w| w[0] <= w[1]), "{bests:?}");
    // The metrics the trial reported are the server's: its last value at step 18.
    assert!((best.last.unwrap() - 0.1111).abs() < 1e-3, "{best:#?}");
    eprintln!("sweep of 6 trials (2 at a time, ASHA) ended in {elapsed:?}");

    // The CLI: the leaderboard, the same as JSON, `ps` as one line, the best outputs.
    let home = dir.path().join("home");
    let text = tcloud(&daemon, &home, &["sweep", &group.to_string()]);
    let rows: Vec<&str> = text.lines().skip(2).collect();
    assert!(
        rows[0].contains("lr=0.1 ") && rows[0].contains("SUCCEEDED"),
        "{text}"
    );
    assert!(text.contains("early_stopped: rung 0"), "{text}");
    let json: SweepBoard = serde_json::from_str(&tcloud(
        &daemon,
        &home,
        &["sweep", &group.to_string(), "--json"],
    ))
    .unwrap();
    assert_eq!(json, board);
    let ps = tcloud(&daemon, &home, &["ps", "--all"]);
    let line = ps
        .lines()
        .find(|l| l.starts_with(&group.to_string()))
        .unwrap_or_else(|| panic!("no line for {group} in:\n{ps}"));
    assert!(
        line.contains("sweep-lr") && line.contains("sweep 6"),
        "{line}"
    );
    let dest = dir.path().join("best");
    tcloud(
        &daemon,
        &home,
        &[
            "sweep",
            &group.to_string(),
            "--best-outputs",
            dest.to_str().unwrap(),
        ],
    );
    let model = std::fs::read_to_string(dest.join("out/model.txt")).unwrap();
    assert_eq!(model.trim(), "lr=0.1 val_loss=0.1111");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_mistake_is_reported_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("task.yaml"),
        "name: s\nrun: sh train.sh {{lr}}\nsweep:\n  method: grid\n  parameters:\n    lr: {min: 0.001, max: 0.1}\n  metric: val_loss\n",
    )
    .unwrap();
    let error = tacc_schema::load_task(dir.path()).unwrap_err().to_string();
    assert!(error.contains("task.yaml:6:"), "{error}");
    assert!(error.contains("use `method: random`"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_waits_for_every_trial_and_names_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let output = Command::new(tcloud_binary())
        .args(["submit", example().to_str().unwrap(), "-f"])
        .env("TACC_HOME", dir.path().join("home"))
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("sweep g1 ended after ")
            && last.contains(": 6 trials, ")
            && last.contains("stopped early; best trial 0 (task ")
            && last.ends_with("lr=0.1 val_loss 0.1111"),
        "{stderr}"
    );
    let board = daemon.client().sweep(GroupId(1)).await.unwrap();
    assert_eq!(board.trials.len(), 6);
    assert!(
        board.trials.iter().all(|t| t.state.is_terminal()),
        "{board:#?}"
    );
}
