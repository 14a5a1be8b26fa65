//! Pipelines end to end on a real dev cluster, submitted with `tcloud submit` from
//! `examples/pipeline`: stages run in dependency order, a stage reads the outputs of the
//! stages it needs from `inputs/<stage>/` (read-only), a failed stage stops its
//! dependents with `dependency_failed`, one command cancels a whole pipeline, and a rerun
//! with only the last stage's code changed reruns only that stage. The example's middle
//! stage is a sweep with early stopping; the stage after it reads the best trial's outputs.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use tacc_client::Client;
use tacc_core::{GroupId, TaskState};
use tacc_proto::{GroupDetail, StageView};

/// Submit a pipeline file with `tcloud submit --json`; its group and stages as answered.
fn submit_pipeline(daemon: &Daemon, home: &Path, file: &Path) -> (GroupId, Vec<StageView>) {
    let out = tcloud(daemon, home, &["submit", file.to_str().unwrap(), "--json"]);
    let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
    let group: GroupId = serde_json::from_value(reply["group"].clone()).unwrap();
    let stages: Vec<StageView> = serde_json::from_value(reply["stages"].clone()).unwrap();
    (group, stages)
}

async fn wait_pipeline_finished(client: &Client, group: GroupId) -> GroupDetail {
    eventually(&format!("pipeline {group} to finish"), DEADLINE, || {
        let client = client.clone();
        async move {
            let detail = client.get_group(group).await.ok()?;
            let done = detail.group.stages.iter().all(|s| {
                ["succeeded", "failed", "cancelled", "lost", "cached"].contains(&s.state.as_str())
            });
            let open = detail.group.counts.keys().any(|s| !s.is_terminal());
            (done && !open).then_some(detail)
        }
    })
    .await
}

fn stage<'a>(detail: &'a GroupDetail, name: &str) -> &'a StageView {
    detail
        .group
        .stages
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no stage {name} in {detail:?}"))
}

/// The example's sweep stage ended as planned: six trials, the worse ones stopped early
/// by ASHA, the best (lr 0.1) succeeded; every trial had ended before `evaluate` started,
/// and `evaluate` read the best trial's model. Returns the sweep's group.
async fn check_example_sweep(client: &Client, detail: &GroupDetail) -> GroupId {
    let train = stage(detail, "train");
    let sweep = train.group.expect("a sweep stage is a group");
    let board = client.sweep(sweep).await.unwrap();
    assert_eq!(board.trials.len(), 6, "{board:#?}");
    let best = board.best_trial.expect("a best trial");
    assert_eq!(
        train.reason.as_deref(),
        Some(format!("best trial: task {best}").as_str())
    );
    let leader = &board.trials[0];
    assert_eq!(leader.task_id, best, "{board:#?}");
    assert_eq!(leader.parameters["lr"], "0.1", "{board:#?}");
    assert!(
        board.trials.iter().any(|t| t
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("early_stopped:"))),
        "ASHA stopped some trials early: {board:#?}"
    );
    let evaluate = client
        .get_task(stage(detail, "evaluate").task.unwrap())
        .await
        .unwrap();
    for trial in &board.trials {
        let trial = client.get_task(trial.task_id).await.unwrap();
        assert!(
            evaluate.started_at.unwrap() >= trial.finished_at.unwrap(),
            "evaluate started after every trial ended: {trial:?} {evaluate:?}"
        );
    }
    let log = log_text(client, evaluate.id).await;
    assert!(
        log.contains("evaluated mean=10 lr=0.1 val_loss=") && log.contains("on 20 numbers"),
        "evaluate read the best trial's model and generate's data: {log}"
    );
    assert!(
        !log.contains("is writable"),
        "a stage's inputs are read-only to it: {log}"
    );
    sweep
}

fn copy_example(to: &Path) -> PathBuf {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pipeline");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_pipeline_runs_in_order_passes_inputs_and_reruns_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let file = copy_example(&dir.path().join("pipeline"));

    let checked = tcloud(&daemon, &home, &["check", file.to_str().unwrap()]);
    assert!(
        checked.contains("valid pipeline: demo-pipeline")
            && checked.contains("train (needs generate)"),
        "{checked}"
    );
    let (group, stages) = submit_pipeline(&daemon, &home, &file);
    assert_eq!(
        stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["generate", "train", "evaluate"]
    );
    assert!(stages.iter().all(|s| s.state != "cached"), "{stages:?}");
    let detail = wait_pipeline_finished(&client, group).await;
    for name in ["generate", "train", "evaluate"] {
        assert_eq!(stage(&detail, name).state, "succeeded", "{detail:?}");
    }
    let train = check_example_sweep(&client, &detail).await;
    let generate = stage(&detail, "generate").task.unwrap();
    let evaluate = stage(&detail, "evaluate").task.unwrap();
    // Each stage started only after the stages it needs had ended.
    let g = client.get_task(generate).await.unwrap();
    for trial in client.get_group(train).await.unwrap().elements {
        let t = client.get_task(trial.task_id).await.unwrap();
        assert!(
            t.started_at.unwrap() >= g.finished_at.unwrap(),
            "{g:?} {t:?}"
        );
    }
    // A stage is no array element.
    assert!(
        !log_text(&client, generate)
            .await
            .contains("TACC_ARRAY_INDEX")
    );

    // `tcloud ps` folds the pipeline into one line with each stage's state.
    let table = tcloud(&daemon, &home, &["ps", "--all"]);
    let line = table
        .lines()
        .find(|l| l.starts_with(&group.to_string()))
        .unwrap_or_else(|| panic!("no line for {group}: {table}"));
    assert!(
        line.contains("pipeline 3")
            && line.contains("generate succeeded · train succeeded · evaluate succeeded"),
        "{line}"
    );
    let stages_table = tcloud(&daemon, &home, &["ps", &group.to_string()]);
    assert!(stages_table.contains("STAGE"), "{stages_table}");
    assert!(
        stages_table.contains(&format!("sweep {train}")),
        "{stages_table}"
    );
    // The sweep stage is shown on its pipeline's line, not as a group of its own.
    assert!(
        !table.lines().any(|l| l.starts_with(&format!("{train} "))),
        "{table}"
    );

    // Only the last stage's code changes: only it runs again, reading the cached inputs.
    let script = file.with_file_name("evaluate").join("evaluate.sh");
    let mut text = std::fs::read_to_string(&script).unwrap();
    text.push_str("echo second evaluation\n");
    std::fs::write(&script, text).unwrap();
    let (again, stages) = submit_pipeline(&daemon, &home, &file);
    let states: Vec<&str> = stages.iter().map(|s| s.state.as_str()).collect();
    assert_eq!(states[..2], ["cached", "cached"], "{stages:?}");
    assert_ne!(states[2], "cached", "{stages:?}");
    assert_eq!(
        stages[1].reason.as_deref(),
        Some(format!("cached: group {train}").as_str())
    );
    let detail = wait_pipeline_finished(&client, again).await;
    let rerun = stage(&detail, "evaluate");
    assert_eq!(rerun.state, "succeeded", "{detail:?}");
    let rerun_task = rerun.task.unwrap();
    assert_ne!(rerun_task, evaluate);
    let log = log_text(&client, rerun_task).await;
    assert!(
        log.contains("evaluated mean=10 lr=0.1") && log.contains("second evaluation"),
        "{log}"
    );

    // Nothing changed since: every stage is cached.
    let (_, stages) = submit_pipeline(&daemon, &home, &file);
    assert!(stages.iter().all(|s| s.state == "cached"), "{stages:?}");
    assert_eq!(
        stages[2].reason.as_deref(),
        Some(format!("cached: task {rerun_task}").as_str())
    );
}

/// Wait until `task`'s log contains `text` (`what` names the wait in a timeout).
async fn wait_log(client: &Client, task: tacc_core::TaskId, text: &str, what: &str) {
    eventually(what, DEADLINE, || {
        let client = client.clone();
        async move { log_text(&client, task).await.contains(text).then_some(()) }
    })
    .await;
}

fn write_pipeline(dir: &Path, yaml: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("pipeline.yaml");
    std::fs::write(&file, yaml).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stage_stops_its_dependents_which_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    // `fan` is an array whose element 1 fails; `sum` waits for the whole array, `report`
    // for `sum`; `side` needs nothing and runs anyway.
    let file = write_pipeline(
        &dir.path().join("p"),
        "name: failing\nstages:\n  fan:\n    resources: {cpus: 0.5}\n    array: 0-2\n    run: test \"$TACC_ARRAY_INDEX\" -ne 1\n  sum:\n    needs: [fan]\n    resources: {cpus: 0.5}\n    run: echo SUM-RAN\n  report:\n    needs: [sum]\n    resources: {cpus: 0.5}\n    run: echo REPORT-RAN\n  side:\n    resources: {cpus: 0.5}\n    run: echo side\n",
    );
    let (group, _) = submit_pipeline(&daemon, &home, &file);
    let detail = wait_pipeline_finished(&client, group).await;
    let fan = stage(&detail, "fan");
    assert_eq!(fan.state, "failed", "{detail:?}");
    let fan_group = fan.group.expect("an array stage is a group");
    let failed = client
        .get_group(fan_group)
        .await
        .unwrap()
        .elements
        .into_iter()
        .find(|e| e.index == 1)
        .unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    for name in ["sum", "report"] {
        let s = stage(&detail, name);
        assert_eq!(s.state, "failed", "{detail:?}");
        let task = client.get_task(s.task.unwrap()).await.unwrap();
        assert!(task.started_at.is_none(), "{name} never ran: {task:?}");
        assert!(
            task.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("dependency_failed: ")),
            "{task:?}"
        );
    }
    let sum = client
        .get_task(stage(&detail, "sum").task.unwrap())
        .await
        .unwrap();
    assert_eq!(
        sum.reason.as_deref(),
        Some(format!("dependency_failed: fan (task {})", failed.task_id).as_str())
    );
    assert_eq!(stage(&detail, "side").state, "succeeded", "{detail:?}");
    // A stage the cluster can never run is refused at submit, with the whole pipeline:
    // nothing of it is queued.
    let file = write_pipeline(
        &dir.path().join("unfit"),
        "name: unfit\nstages:\n  big:\n    resources: {cpus: 64}\n    run: echo BIG\n  after:\n    needs: [big]\n    resources: {cpus: 0.5}\n    run: echo AFTER-RAN\n",
    );
    let before = client.list_tasks(&Default::default()).await.unwrap().len();
    let out = std::process::Command::new(tcloud_binary())
        .args(["submit", file.to_str().unwrap()])
        .env("TACC_HOME", &home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refused at submit") && err.contains("largest node"),
        "{err}"
    );
    let after = client.list_tasks(&Default::default()).await.unwrap().len();
    assert_eq!(before, after, "a refused pipeline queued tasks");
    // A pipeline is rerun by submitting its file again, which the refusal says.
    let refused = client
        .rerun_group_failed(group)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("submit its file again"), "{refused}");
    // The array stage is shown on its pipeline's line, not as a group of its own.
    let table = tcloud(&daemon, &home, &["ps", "--all"]);
    assert!(
        !table
            .lines()
            .any(|l| l.starts_with(&format!("{fan_group} "))),
        "{table}"
    );
}

/// A sweep stage fails only when the sweep has ended with no successful trial; what needs
/// it then never runs, and says which sweep it waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_stage_without_a_successful_trial_stops_what_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let file = write_pipeline(
        &dir.path().join("p"),
        "name: hopeless\nstages:\n  search:\n    resources: {cpus: 0.5}\n    run: echo trying {{x}}; exit 3\n    sweep:\n      method: grid\n      parameters: {x: [1, 2, 3]}\n      metric: loss\n      parallel: 2\n  use:\n    needs: [search]\n    resources: {cpus: 0.5}\n    run: echo USE-RAN\n",
    );
    let (group, stages) = submit_pipeline(&daemon, &home, &file);
    let waiting = client.get_task(stages[1].task.unwrap()).await.unwrap();
    let sweep = stages[0].group.expect("a sweep stage is a group");
    assert!(
        waiting.state.is_terminal()
            || waiting.reason.as_deref()
                == Some(format!("waiting for sweep stage `search` ({sweep}) to end").as_str()),
        "{waiting:?}"
    );
    let detail = wait_pipeline_finished(&client, group).await;
    assert_eq!(stage(&detail, "search").state, "failed", "{detail:?}");
    assert_eq!(
        stage(&detail, "search").reason.as_deref(),
        Some("no trial succeeded")
    );
    assert_eq!(client.get_group(sweep).await.unwrap().elements.len(), 3);
    let used = client
        .get_task(stage(&detail, "use").task.unwrap())
        .await
        .unwrap();
    assert_eq!(used.state, TaskState::Failed, "{used:?}");
    assert!(used.started_at.is_none(), "{used:?}");
    assert_eq!(
        used.reason.as_deref(),
        Some(format!("dependency_failed: search (group {sweep}: no trial succeeded)").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_pipeline_cancels_every_unfinished_stage() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let file = write_pipeline(
        &dir.path().join("p"),
        "name: long\nstages:\n  slow:\n    resources: {cpus: 0.5}\n    run: sleep 300\n  fan:\n    needs: [slow]\n    resources: {cpus: 0.5}\n    array: 0-3\n    run: echo fan\n  last:\n    needs: [fan]\n    resources: {cpus: 0.5}\n    run: echo last\n  wide:\n    resources: {cpus: 0.5}\n    array: 0-1\n    run: sleep 300\n  tune:\n    resources: {cpus: 0.5}\n    run: sleep 300 # {{x}}\n    sweep: {method: grid, parameters: {x: [1, 2, 3]}, metric: loss, parallel: 1}\n  tuned:\n    needs: [tune]\n    resources: {cpus: 0.5}\n    run: echo tuned\n",
    );
    let (group, stages) = submit_pipeline(&daemon, &home, &file);
    let slow = stages[0].task.unwrap();
    wait_state(&client, slow, &[TaskState::Running]).await;
    tcloud(&daemon, &home, &["cancel", &group.to_string()]);
    let detail = wait_pipeline_finished(&client, group).await;
    for s in &detail.group.stages {
        assert_eq!(s.state, "cancelled", "{detail:?}");
    }
    for array in ["fan", "wide", "tune"] {
        let elements = client
            .get_group(stage(&detail, array).group.unwrap())
            .await
            .unwrap()
            .elements;
        assert!(
            elements.iter().all(|e| e.state == TaskState::Cancelled),
            "{elements:?}"
        );
    }
    wait_no_processes("sleep 300").await;
}

/// The same example on a server with two agents of their own data directories: a stage's
/// inputs travel from the node that produced them through the server's outputs store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_pipeline_runs_on_a_multi_agent_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let _a = start_agent(
        &server,
        &dir.path().join("a"),
        &["--name", "node-a", "--cpus", "1"],
    );
    let _b = start_agent(
        &server,
        &dir.path().join("b"),
        &["--name", "node-b", "--cpus", "1"],
    );
    wait_nodes(&client, 2).await;
    let home = dir.path().join("home");
    let file = copy_example(&dir.path().join("pipeline"));
    let (group, _) = submit_pipeline(&server, &home, &file);
    let detail = wait_pipeline_finished(&client, group).await;
    for name in ["generate", "train", "evaluate"] {
        assert_eq!(stage(&detail, name).state, "succeeded", "{detail:?}");
    }
    check_example_sweep(&client, &detail).await;
}

/// A restarted server finds the needs of queued stages again in the store: a stage whose
/// needed stage was running when the server died still waits for it (retried after the
/// crash) and then reads its outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_keeps_stages_waiting_for_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let file = write_pipeline(
        &dir.path().join("p"),
        "name: restart\nstages:\n  first:\n    resources: {cpus: 0.5}\n    retry: {max_attempts: 2, on: [lost]}\n    run: |\n      echo \"first attempt $TACC_ATTEMPT\"\n      sleep 2\n      echo \"made by attempt $TACC_ATTEMPT\" > out.txt\n    outputs: [out.txt]\n  second:\n    needs: [first]\n    resources: {cpus: 0.5}\n    run: cat inputs/first/out.txt\n",
    );
    let (group, stages) = submit_pipeline(&daemon, &home, &file);
    let first = stages[0].task.unwrap();
    let second = stages[1].task.unwrap();
    wait_log(&client, first, "first attempt", "the first stage to run").await;
    daemon.kill9();
    let restarted = start("dev", &data, &["--cpus", "4"]).await;
    let client = restarted.client();
    let detail = wait_pipeline_finished(&client, group).await;
    assert_eq!(stage(&detail, "first").state, "succeeded", "{detail:?}");
    assert_eq!(stage(&detail, "second").state, "succeeded", "{detail:?}");
    let first_view = client.get_task(first).await.unwrap();
    let second_view = client.get_task(second).await.unwrap();
    assert!(
        second_view.started_at.unwrap() >= first_view.finished_at.unwrap(),
        "{first_view:?} {second_view:?}"
    );
    let log = log_text(&client, second).await;
    assert!(
        log.contains(&format!("made by attempt {}", first_view.attempt)),
        "{log}"
    );
}

/// A stage waiting for a sweep stage still waits after a restart, for the trials launched
/// before and after it, and then reads the best trial's outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_keeps_stages_waiting_for_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &["--cpus", "4"]).await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let file = write_pipeline(
        &dir.path().join("p"),
        "name: restart-sweep\nstages:\n  search:\n    resources: {cpus: 0.5}\n    run: |\n      echo \"trial {{x}}\"\n      sleep 1\n      echo '{\"step\": 1, \"loss\": {{x}}}' >> \"$TACC_METRICS\"\n      echo \"x={{x}}\" > best.txt\n    outputs: [best.txt]\n    sweep:\n      method: grid\n      parameters: {x: [3, 1, 2]}\n      metric: loss\n      parallel: 1\n  after:\n    needs: [search]\n    resources: {cpus: 0.5}\n    run: cat inputs/search/best.txt\n",
    );
    let (group, stages) = submit_pipeline(&daemon, &home, &file);
    let sweep = stages[0].group.unwrap();
    let after = stages[1].task.unwrap();
    let first_trial = client.get_group(sweep).await.unwrap().elements[0].task_id;
    wait_log(&client, first_trial, "trial 3", "the first trial to run").await;
    daemon.kill9();
    let restarted = start("dev", &data, &["--cpus", "4"]).await;
    let client = restarted.client();
    let detail = wait_pipeline_finished(&client, group).await;
    assert_eq!(stage(&detail, "search").state, "succeeded", "{detail:?}");
    assert_eq!(stage(&detail, "after").state, "succeeded", "{detail:?}");
    let board = client.sweep(sweep).await.unwrap();
    assert_eq!(board.trials.len(), 3, "{board:#?}");
    let after_view = client.get_task(after).await.unwrap();
    for trial in &board.trials {
        let trial = client.get_task(trial.task_id).await.unwrap();
        assert!(
            after_view.started_at.unwrap() >= trial.finished_at.unwrap(),
            "{trial:?} {after_view:?}"
        );
    }
    let log = log_text(&client, after).await;
    assert!(log.contains("x=1"), "the best trial's output: {log}");
}

/// A pipeline with `notify:` calls its webhook once, signed, when its last stage has
/// ended — array and sweep stages included — naming each stage's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_notifies_once_when_its_last_stage_ends() {
    let dir = tempfile::tempdir().unwrap();
    // The receiver listens on loopback, an internal address: the operator allows it.
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "4", "--webhook-allow-private"],
    )
    .await;
    let client = daemon.client();
    let home = dir.path().join("home");
    let key = "pipeline-hook-key";
    client
        .put_secret("HOOK_KEY", key.as_bytes().to_vec())
        .await
        .unwrap();
    let (receiver, url) = common::webhook::Receiver::start(0).await;
    let file = write_pipeline(
        &dir.path().join("p"),
        &format!(
            "name: notified\nnotify: {{webhook: \"{url}\", secret: HOOK_KEY}}\nstages:\n  first:\n    resources: {{cpus: 0.5}}\n    run: echo first\n  fan:\n    needs: [first]\n    resources: {{cpus: 0.5}}\n    array: 0-1\n    run: test \"$TACC_ARRAY_INDEX\" -ne 1\n  tune:\n    needs: [first]\n    resources: {{cpus: 0.5}}\n    run: |\n      echo '{{\"step\": 1, \"loss\": {{{{x}}}}}}' >> \"$TACC_METRICS\"\n    sweep: {{method: grid, parameters: {{x: [2, 1]}}, metric: loss, parallel: 1}}\n  last:\n    needs: [tune]\n    resources: {{cpus: 0.5}}\n    run: echo last\n"
        ),
    );
    let (group, _) = submit_pipeline(&daemon, &home, &file);
    let detail = wait_pipeline_finished(&client, group).await;
    assert_eq!(stage(&detail, "last").state, "succeeded", "{detail:?}");
    let requests = eventually("the pipeline's notification", DEADLINE, || {
        let receiver = receiver.clone();
        async move {
            let requests = receiver.requests();
            (!requests.is_empty()).then_some(requests)
        }
    })
    .await;
    assert_eq!(requests.len(), 1, "one notification: {requests:?}");
    let (headers, body) = &requests[0];
    assert_eq!(
        headers.get("x-tacc-signature"),
        Some(&common::webhook::sign(key, body))
    );
    let event: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(event["event"], "pipeline.ended", "{event}");
    assert_eq!(event["pipeline"]["id"], group.to_string(), "{event}");
    assert_eq!(event["pipeline"]["state"], "failed", "{event}");
    let stages = &event["pipeline"]["stages"];
    assert_eq!(stages["first"], "succeeded", "{event}");
    assert_eq!(stages["fan"], "failed", "{event}");
    assert_eq!(stages["tune"], "succeeded", "{event}");
    assert_eq!(stages["last"], "succeeded", "{event}");
}
