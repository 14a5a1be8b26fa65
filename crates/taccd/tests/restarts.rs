//! The retry and restart policy against real processes: backoff between attempts, the
//! crash limit of a task that keeps taking its node down (fault scenario R4), and the
//! marked log section of every retried attempt. Each scenario runs on SQLite
//! (`…::on_sqlite`) and on PostgreSQL (`…::on_postgres`, a database of its own that the
//! restarted server opens again).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use tacc_core::{AttemptNo, TaskState};
use tacc_proto::TaskView;

/// Wait until the task runs an attempt after `after`, or has ended.
async fn next_run(client: &tacc_client::Client, task: tacc_core::TaskId, after: u32) -> TaskView {
    eventually(
        &format!("task {task} to run an attempt after {after} or end"),
        DEADLINE,
        || {
            let client = client.clone();
            async move {
                let view = client.get_task(task).await.ok()?;
                let running = view.state == TaskState::Running && view.attempt.0 > after;
                (running || view.state.is_terminal()).then_some(view)
            }
        },
    )
    .await
}

fn agent(server: &Daemon, root: &Path, name: &str) -> Daemon {
    start_agent(server, &root.join(name), &["--name", name])
}

/// R4: the agent running the task is killed (kill -9) every time the task starts on it,
/// and restarted; after the third loss the task fails for good with the crash limit's
/// reason, each retry having waited out its backoff and opened a marked log section.
async fn crash_limit(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &backend.with(&["--heartbeat-timeout", "3"]),
    )
    .await;
    let client = server.client();
    let mut agents: BTreeMap<String, Daemon> = ["node-a", "node-b"]
        .into_iter()
        .map(|name| (name.to_string(), agent(&server, dir.path(), name)))
        .collect();
    wait_nodes(&client, 2).await;
    let marker = format!("crash-limit-{}", std::process::id());
    let yaml = format!(
        "name: crasher\nresources: {{cpus: 1}}\nretry: {{max_attempts: 10, on: [node_failure]}}\n\
         environment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo \"attempt $TACC_ATTEMPT\"\n  sleep 300 & wait\n"
    );
    let task = submit(&client, dir.path(), "crasher", &yaml, &[]).await;
    let mut losses = 0;
    let mut attempt = 0;
    let mut queued_at: Option<(std::time::Instant, u64)> = None;
    let view = loop {
        let view = next_run(&client, task, attempt).await;
        if view.state.is_terminal() {
            break view;
        }
        if let Some((at, wait)) = queued_at.take() {
            // Seen queued a little after it was, so up to a second less.
            assert!(
                at.elapsed().as_millis() as u64 + 1000 >= wait * 1000,
                "attempt {} ran {:?} after its retry was queued with a {wait}s backoff",
                view.attempt,
                at.elapsed()
            );
        }
        attempt = view.attempt.0;
        // Killed once the attempt has shown it runs, so its log section is not empty.
        let line = format!("attempt {attempt}\n");
        eventually("the attempt's first line", DEADLINE, || {
            let (client, line) = (client.clone(), line.clone());
            async move {
                let (bytes, _) = client.logs(task, 0).await.ok()?;
                String::from_utf8_lossy(&bytes)
                    .contains(&line)
                    .then_some(())
            }
        })
        .await;
        let node = view.nodes[0].clone();
        let mut doomed = agents
            .remove(&node)
            .expect("the task runs on a known agent");
        doomed.kill9();
        drop(doomed);
        losses += 1;
        agents.insert(node.clone(), agent(&server, dir.path(), &node));
        if losses < 3 {
            // Queued again, waiting out a backoff that says how long and which attempt.
            let queued = eventually("the retry to be queued", DEADLINE, || {
                let client = client.clone();
                async move {
                    let view = client.get_task(task).await.ok()?;
                    (view.state == TaskState::Queued && view.attempt.0 == attempt + 1)
                        .then_some(view)
                }
            })
            .await;
            let reason = queued.reason.clone().unwrap_or_default();
            let wait: u64 = 5 << (attempt - 1);
            assert_eq!(
                reason,
                format!("retrying in {wait}s (attempt {} of 10)", attempt + 1),
                "{queued:?}"
            );
            queued_at = Some((std::time::Instant::now(), wait));
        }
    };
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert_eq!(
        view.reason.as_deref(),
        Some("crash_limit: lost its node 3 times"),
        "{view:?}"
    );
    assert_eq!(view.attempt, AttemptNo(3), "{view:?}");
    assert_eq!(losses, 3);
    let log = log_text(&client, task).await;
    for n in 1..=3 {
        assert!(log.contains(&format!("attempt {n}\n")), "{log}");
    }
    for n in 2..=3 {
        let marked = log
            .lines()
            .any(|l| l.starts_with(&format!("=== attempt {n} (retry after node_")));
        assert!(marked, "no marker of attempt {n} in {log}");
    }
    wait_no_processes(&marker).await;
}

/// A retried task waits its backoff out even across a restart of the server: the wait is
/// read back from the durable event that queued it, not started over or forgotten.
async fn backoff_across_a_restart(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let args = backend.with(&["--cpus", "1"]);
    let mut server = start("dev", &data, &args).await;
    let client = server.client();
    let yaml = "name: flaky\nresources: {cpus: 1}\nretry: {max_attempts: 2, on: [failed]}\n\
                run: |\n  echo \"attempt $TACC_ATTEMPT\"\n  test \"$TACC_ATTEMPT\" = 2\n";
    let task = submit(&client, dir.path(), "flaky", yaml, &[]).await;
    let queued = eventually("the retry to be queued", DEADLINE, || {
        let client = client.clone();
        async move {
            let view = client.get_task(task).await.ok()?;
            (view.state == TaskState::Queued && view.attempt.0 == 2).then_some(view)
        }
    })
    .await;
    let queued_at = std::time::Instant::now();
    assert_eq!(
        queued.reason.as_deref(),
        Some("retrying in 5s (attempt 2 of 2)")
    );
    server.kill9();
    drop(server);
    let server = start("dev", &data, &args).await;
    let client = server.client();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    // It started no earlier than the backoff allowed (less the time to the queued view).
    assert!(
        queued_at.elapsed() >= std::time::Duration::from_secs(4),
        "attempt 2 ran {:?} after attempt 1 was queued for a retry",
        queued_at.elapsed()
    );
    let log = log_text(&client, task).await;
    let first = log.find("attempt 1\n").expect(&log);
    let marker = log
        .find("=== attempt 2 (retry after failed) ===\n")
        .expect(&log);
    let second = log.find("attempt 2\n").expect(&log);
    assert!(first < marker && marker < second, "{log}");
}

/// A checkpointing task: at its time limit it is sent its checkpoint signal, writes a
/// counter into its checkpoint directory within the grace, and is retried; the next
/// attempt runs on another agent (the first node is drained) and resumes from the
/// counter through `$TACC_RESUME_FROM`, which the first attempt did not have. The log
/// shows both attempts' sections.
async fn resume_on_another_node(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &backend.args()).await;
    let client = server.client();
    let _a = agent(&server, dir.path(), "node-a");
    let _b = agent(&server, dir.path(), "node-b");
    wait_nodes(&client, 2).await;
    let yaml = r#"name: resumer
resources: {cpus: 1, time_limit: 6s}
checkpoint: {signal: SIGUSR1, grace: 3s}
retry: {max_attempts: 2, on: [failed]}
run: |
  n=$(cat "${TACC_RESUME_FROM:-/nonexistent}/counter" 2>/dev/null || echo 0)
  echo "attempt $TACC_ATTEMPT resumes from ${TACC_RESUME_FROM:-nothing} at $n"
  if [ "$TACC_ATTEMPT" -ge 2 ]; then echo "done at $n"; exit 0; fi
  trap 'sleep 1; echo $((n + 1)) > "$TACC_CHECKPOINT_DIR/counter"; echo "checkpointed $((n + 1))"; exit 1' USR1
  sleep 300 & wait
"#;
    let task = submit(&client, dir.path(), "resumer", yaml, &[]).await;
    let first = wait_state(&client, task, &[TaskState::Running]).await;
    assert_eq!(first.attempt, AttemptNo(1));
    let first_node = first.nodes[0].clone();
    // The retry must go elsewhere: the first node takes no new work.
    client.drain_node(&first_node, false).await.unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt, AttemptNo(2), "{view:?}");
    assert_ne!(view.nodes[0], first_node, "{view:?}");
    let log = log_text(&client, task).await;
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("no `{needle}` in the log:\n{log}"))
    };
    let started = at("attempt 1 resumes from nothing at 0\n");
    let saved = at("checkpointed 1\n");
    let marker = at("=== attempt 2 (retry after failed) ===\n");
    let resumed = at(".tacc-checkpoint at 1\n");
    let done = at("done at 1\n");
    assert!(
        started < saved && saved < marker && marker < resumed && resumed < done,
        "{log}"
    );
    assert!(
        log[marker..].contains("attempt 2 resumes from /"),
        "attempt 2 was not given TACC_RESUME_FROM: {log}"
    );
}

/// The agent running a checkpointing task is killed (`kill -9`) after the task wrote its
/// checkpoint: the running attempt's checkpoint was copied to the server meanwhile, so
/// the retry on the other agent resumes from it; the log marks the node loss.
async fn resume_after_a_lost_agent(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &backend.with(&["--heartbeat-timeout", "3"]),
    )
    .await;
    let client = server.client();
    let mut agents: BTreeMap<String, Daemon> = ["node-a", "node-b"]
        .into_iter()
        .map(|name| (name.to_string(), agent(&server, dir.path(), name)))
        .collect();
    wait_nodes(&client, 2).await;
    let marker = format!("synced-{}", std::process::id());
    let yaml = format!(
        r#"name: survivor
resources: {{cpus: 1}}
retry: {{max_attempts: 2, on: [node_failure]}}
environment: {{vars: {{MARKER: {marker}}}}}
run: |
  n=$(cat "${{TACC_RESUME_FROM:-/nonexistent}}/counter" 2>/dev/null || echo 0)
  echo "attempt $TACC_ATTEMPT resumes at $n"
  if [ "$TACC_ATTEMPT" -ge 2 ]; then echo "done at $n"; exit 0; fi
  echo 41 > "$TACC_CHECKPOINT_DIR/counter.tmp"
  mv "$TACC_CHECKPOINT_DIR/counter.tmp" "$TACC_CHECKPOINT_DIR/counter"
  sleep 300 & wait
"#
    );
    let task = submit(&client, dir.path(), "survivor", &yaml, &[]).await;
    let first = wait_state(&client, task, &[TaskState::Running]).await;
    let node = first.nodes[0].clone();
    eventually(
        "the running attempt's checkpoint on the server",
        DEADLINE,
        || {
            let client = client.clone();
            async move {
                let outputs = client.list_outputs(task).await.ok()?;
                outputs
                    .iter()
                    .any(|o| o.attempt.0 == 1 && o.path == ".tacc-checkpoint/counter")
                    .then_some(())
            }
        },
    )
    .await;
    let mut doomed = agents.remove(&node).unwrap();
    doomed.kill9();
    drop(doomed);
    let view = wait_terminal(&client, task).await;
    // Back up, it stops what its previous life left running.
    agents.insert(node.clone(), agent(&server, dir.path(), &node));
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt, AttemptNo(2), "{view:?}");
    assert_ne!(view.nodes[0], node, "{view:?}");
    let log = log_text(&client, task).await;
    let marker_at = log
        .find("=== attempt 2 (retry after node_lost) ===\n")
        .unwrap_or_else(|| panic!("no marker in {log}"));
    assert!(
        log[..marker_at].contains("attempt 1 resumes at 0\n"),
        "{log}"
    );
    assert!(log[marker_at..].contains("done at 41\n"), "{log}");
    wait_no_processes(&marker).await;
}

on_both_stores!(
    a_task_that_keeps_killing_its_node_fails_at_the_crash_limit,
    threads = 2,
    run = crash_limit
);

on_both_stores!(
    a_retry_backoff_survives_a_server_restart,
    threads = 2,
    run = backoff_across_a_restart
);

on_both_stores!(
    a_retried_attempt_resumes_from_the_checkpoint_on_another_node,
    threads = 2,
    run = resume_on_another_node
);

on_both_stores!(
    a_retry_after_a_lost_agent_resumes_from_the_checkpoint_it_synced,
    threads = 2,
    run = resume_after_a_lost_agent
);
