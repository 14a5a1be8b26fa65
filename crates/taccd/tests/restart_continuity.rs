//! A server killed with `kill -9` in the middle of a 2-node gang — one rank already
//! finished its part, the other still running — loses nothing: the restarted server
//! (same data directory and database) carries the gang on as the same attempt, which ends
//! `succeeded` with no `lost` event and no rank run twice, and the fair-share standing is
//! the one it had. In split mode (a server and two agents) and embedded mode (`taccd dev`,
//! whose agent outlives the server and is adopted, plus a second agent), on SQLite and on
//! PostgreSQL.

mod common;

use common::*;
use tacc_core::TaskState;

/// The group's decayed fair-share usage now, as the server reports it.
async fn decayed_usage(client: &tacc_client::Client) -> f64 {
    let report = client.fairshare_report().await.unwrap();
    report.groups.iter().map(|g| g.decayed_usage).sum()
}

async fn gang_across_a_server_crash(backend: Backend, embedded: bool) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let markers = markers_dir(dir.path());
    let gate = markers.join("gate");
    let runs = markers.join("runs");
    let mode = if embedded { "dev" } else { "server" };
    let server_args = if embedded {
        backend.with(&["--cpus", "1"])
    } else {
        backend.args()
    };
    let mut server = start(mode, &data, &server_args).await;
    let url = server.url.clone();
    let client = server.client();
    let _agents: Vec<Daemon> = if embedded {
        vec![start_agent(
            &server,
            &dir.path().join("n2"),
            &["--name", "n2", "--cpus", "1"],
        )]
    } else {
        ["n1", "n2"]
            .into_iter()
            .map(|name| {
                start_agent(
                    &server,
                    &dir.path().join(name),
                    &["--name", name, "--cpus", "1"],
                )
            })
            .collect()
    };
    wait_nodes(&client, 2).await;
    let yaml = format!(
        "name: gang\nresources: {{nodes: 2, cpus: 1}}\nrun: |\n  \
         echo \"rank $NODE_RANK attempt $TACC_ATTEMPT\" >> {runs}\n  \
         if [ \"$NODE_RANK\" = 0 ]; then echo 'rank 0 done'; exit 0; fi\n  \
         echo 'rank 1 waiting'\n  \
         while [ ! -e {gate} ]; do sleep 0.05; done\n  \
         echo 'rank 1 done'\n",
        runs = runs.display(),
        gate = gate.display()
    );
    let task = submit(&client, dir.path(), "gang", &yaml, &[]).await;
    wait_log(&client, task, "rank 1 waiting").await;
    // The server knows rank 0 finished its part (its end was acknowledged), and has
    // kept the standing at least once since the gang started (every second).
    eventually("rank 0's end to be recorded", DEADLINE, || {
        let client = client.clone();
        async move {
            let usage = client.task_usage(task).await.ok()?;
            (usage.finished_ranks == [0]).then_some(())
        }
    })
    .await;
    eventually("the gang to have run two seconds", DEADLINE, || {
        let client = client.clone();
        async move {
            let started = client.get_task(task).await.ok()?.started_at?;
            let now = client.fairshare_report().await.ok()?.at;
            (now.millis_since(started) >= 2_000).then_some(())
        }
    })
    .await;
    let before = decayed_usage(&client).await;
    assert!(before > 0.0, "the gang accrued usage");

    server.kill9();
    let restarted = restart_on(mode, &data, &url, &server_args).await;
    let client = restarted.client();
    let after = decayed_usage(&client).await;
    assert!(
        after >= before * 0.99,
        "the standing survives the restart: {before} before, {after} after"
    );
    wait_nodes(&client, 2).await;
    let usage = client.task_usage(task).await.unwrap();
    assert_eq!(usage.state, TaskState::Running, "{usage:?}");
    assert_eq!(usage.finished_ranks, [0], "{usage:?}");

    std::fs::write(&gate, "").unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 1, "the same attempt: {view:?}");
    let states = attempt_states(&client, task).await;
    assert!(
        !states.iter().any(|(_, state)| *state == TaskState::Lost),
        "{states:?}"
    );
    let ran = std::fs::read_to_string(&runs).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["rank 0 attempt 1", "rank 1 attempt 1"],
        "each rank ran once"
    );
    assert!(log_text(&client, task).await.contains("rank 1 done"));
}

on_both_stores!(
    a_gang_in_split_mode_continues_across_a_server_crash,
    threads = 2,
    run = |backend| gang_across_a_server_crash(backend, false)
);

on_both_stores!(
    a_gang_on_the_embedded_cluster_continues_across_a_server_crash,
    threads = 2,
    run = |backend| gang_across_a_server_crash(backend, true)
);

/// Every attempt of `task` so far, with no `lost` among them.
async fn assert_never_lost(client: &tacc_client::Client, task: tacc_core::TaskId) {
    let states = attempt_states(client, task).await;
    assert!(
        !states.iter().any(|(_, state)| *state == TaskState::Lost),
        "task {task}: {states:?}"
    );
}

/// The lines of a runs file, sorted.
fn runs_of(path: &std::path::Path) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

async fn pipeline_across_a_server_crash(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let markers = markers_dir(dir.path());
    let gate = markers.join("gate");
    let runs = markers.join("runs");
    let args = backend.with(&["--cpus", "2"]);
    let mut server = start("dev", &data, &args).await;
    let url = server.url.clone();
    let home = dir.path().join("home");
    let stage = |name: &str, needs: &str, wait: bool| {
        let wait = if wait {
            format!(
                "      while [ ! -e {} ]; do sleep 0.05; done\n",
                gate.display()
            )
        } else {
            String::new()
        };
        format!(
            "  {name}:\n{needs}    resources: {{cpus: 0.5}}\n    run: |\n      \
             echo \"{name} attempt $TACC_ATTEMPT\" >> {runs}\n      echo '{name} running'\n{wait}      \
             echo {name} > out.txt\n    outputs: [out.txt]\n",
            runs = runs.display()
        )
    };
    let yaml = format!(
        "name: three\nstages:\n{}{}{}",
        stage("first", "", false),
        stage("second", "    needs: [first]\n", true),
        stage("third", "    needs: [second]\n", false)
    );
    let file = dir.path().join("p").join("pipeline.yaml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, yaml).unwrap();
    let out = tcloud(
        &server,
        &home,
        &["submit", file.to_str().unwrap(), "--json"],
    );
    let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tasks: Vec<tacc_core::TaskId> = reply["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| serde_json::from_value(s["task"].clone()).unwrap())
        .collect();
    let client = server.client();
    wait_log(&client, tasks[1], "second running").await;

    server.kill9();
    let restarted = restart_on("dev", &data, &url, &args).await;
    let client = restarted.client();
    std::fs::write(&gate, "").unwrap();
    for task in &tasks {
        let view = wait_terminal(&client, *task).await;
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        assert_eq!(view.attempt.0, 1, "{view:?}");
        assert_never_lost(&client, *task).await;
    }
    assert_eq!(
        runs_of(&runs),
        ["first attempt 1", "second attempt 1", "third attempt 1"],
        "each stage ran once"
    );
}

on_both_stores!(
    a_pipeline_mid_stage_continues_across_a_server_crash,
    threads = 2,
    run = pipeline_across_a_server_crash
);

async fn sweep_across_a_server_crash(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let markers = markers_dir(dir.path());
    let gate = markers.join("gate");
    let runs = markers.join("runs");
    let args = backend.with(&["--cpus", "2"]);
    let mut server = start("dev", &data, &args).await;
    let url = server.url.clone();
    let home = dir.path().join("home");
    let task_dir = dir.path().join("sweep");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(
        task_dir.join("task.yaml"),
        format!(
            "name: sweep\nresources: {{cpus: 0.5}}\nrun: |\n  \
             echo \"trial {{{{x}}}} attempt $TACC_ATTEMPT\" >> {runs}\n  echo 'trial running'\n  \
             while [ ! -e {gate} ]; do sleep 0.05; done\n  \
             echo '{{\"step\": 1, \"loss\": {{{{x}}}}}}' >> \"$TACC_METRICS\"\n\
             sweep:\n  method: grid\n  parameters: {{x: [1, 2, 3, 4]}}\n  metric: loss\n  parallel: 2\n",
            runs = runs.display(),
            gate = gate.display()
        ),
    )
    .unwrap();
    let out = tcloud(
        &server,
        &home,
        &["submit", task_dir.to_str().unwrap(), "--json"],
    );
    let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
    let group: tacc_core::GroupId = serde_json::from_value(reply["group"].clone())
        .unwrap_or_else(|_| serde_json::from_value(reply["id"].clone()).unwrap());
    eventually("two trials to run", DEADLINE, || {
        let runs = runs.clone();
        async move { (runs_of(&runs).len() == 2).then_some(()) }
    })
    .await;

    server.kill9();
    let restarted = restart_on("dev", &data, &url, &args).await;
    let client = restarted.client();
    std::fs::write(&gate, "").unwrap();
    let board = eventually("the sweep to finish", DEADLINE, || {
        let client = client.clone();
        async move {
            let board = client.sweep(group).await.ok()?;
            let done =
                board.trials.len() == 4 && board.trials.iter().all(|t| t.state.is_terminal());
            done.then_some(board)
        }
    })
    .await;
    for trial in &board.trials {
        let view = client.get_task(trial.task_id).await.unwrap();
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        assert_eq!(view.attempt.0, 1, "{view:?}");
        assert_never_lost(&client, trial.task_id).await;
    }
    let ran = runs_of(&runs);
    assert_eq!(ran.len(), 4, "each trial ran once: {ran:?}");
    assert!(
        ran.iter().all(|line| line.ends_with("attempt 1")),
        "{ran:?}"
    );
    drop(server);
}

on_both_stores!(
    a_sweep_with_trials_running_continues_across_a_server_crash,
    threads = 2,
    run = sweep_across_a_server_crash
);

/// The resize scenarios measure CPU use: two at once on a small machine would starve
/// each other's busy loops (and the verdicts with them), so they take turns.
static ONE_RESIZE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn resized_task_across_a_server_crash(backend: Backend) {
    let _turn = ONE_RESIZE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let markers = markers_dir(dir.path());
    let gate = markers.join("gate");
    let runs = markers.join("runs");
    let args = backend.with(&[
        "--cpus",
        "2",
        "--memory",
        "2GiB",
        "--adaptive",
        "on",
        "--adaptive-window",
        "4s",
        "--adaptive-cooldown",
        "2s",
    ]);
    let mut server = start("dev", &data, &args).await;
    let url = server.url.clone();
    let client = server.client();
    let yaml = format!(
        "name: hungry\nresources: {{cpus: 0.5, memory: 256MiB}}\nadaptive: {{cpus: 0.5..1}}\n\
         run: |\n  echo \"attempt $TACC_ATTEMPT\" >> {runs}\n  \
         for i in 1 2; do (while [ ! -e {gate} ]; do :; done) & done\n  wait\n  echo fed\n",
        runs = runs.display(),
        gate = gate.display()
    );
    let task = submit(&client, dir.path(), "hungry", &yaml, &[]).await;
    let grown = |client: tacc_client::Client| async move {
        let adaptive = client.explain(task).await.ok()?.adaptive?;
        (adaptive.allocation.cpu_millis == 1000).then_some(())
    };
    let deadline = std::time::Duration::from_secs(90);
    eventually("the task to be resized to 1 CPU", deadline, || {
        grown(client.clone())
    })
    .await;

    server.kill9();
    let restarted = restart_on("dev", &data, &url, &args).await;
    let client = restarted.client();
    // The allocation in force is the resized one, not what the file asked.
    eventually("the resized allocation after the restart", DEADLINE, || {
        grown(client.clone())
    })
    .await;
    let usage = client.task_usage(task).await.unwrap();
    assert_eq!(usage.allocated.cpu_millis, 1000, "{usage:?}");
    std::fs::write(&gate, "").unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 1, "{view:?}");
    assert_never_lost(&client, task).await;
    assert_eq!(runs_of(&runs), ["attempt 1"], "it ran once");
}

on_both_stores!(
    a_task_just_resized_continues_across_a_server_crash,
    threads = 2,
    needs = cgroups_or_skip,
    run = resized_task_across_a_server_crash
);
