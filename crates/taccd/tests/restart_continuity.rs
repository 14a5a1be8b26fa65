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
