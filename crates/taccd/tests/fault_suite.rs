//! The fault suite of issue 10 against real processes: the server killed during a storm of
//! keyed submits (R1, on a server with its own agent and on the embedded cluster), a
//! restore after partial progress (R2), duplicated, reordered and stale agent reports
//! (R12), cancels followed at once by a crash (R13) and a stalled server (R6). Each run
//! records every client call and the checker in `fault_suite/history.rs` judges it. Every
//! scenario runs on each store: `…::on_sqlite` and `…::on_postgres` (a database of its own on
//! the server named by `TACC_TEST_POSTGRES_URL`, kept across the scenario's restarts).

mod common;
#[path = "fault_suite/history.rs"]
mod history;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::hand_node::HandNode;
use common::*;
use history::{History, check_events, marked_attempts, marked_script};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_client::Client;
use tacc_core::{AttemptNo, TaskId, TaskState};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef, SubmitTask};

/// The body of `POST /v1/tasks` for `yaml`, its code uploaded once and shared by every
/// submit of a scenario.
async fn submit_body(client: &Client, root: &Path, name: &str, yaml: &str) -> serde_json::Value {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), yaml).unwrap();
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    serde_json::to_value(SubmitTask {
        translated: Vec::new(),
        spec: serde_json::to_value(&loaded.spec).unwrap(),
        snapshot,
        source: None,
        wait_for_capacity: false,
    })
    .unwrap()
}

/// A task that only writes its markers around `body`, with a small CPU share so that
/// many run at once.
fn trivial_task(markers: &Path, name: &str, extra: &str, body: &str) -> String {
    format!(
        "name: {name}\nresources: {{cpus: 0.1}}\n{extra}environment: {{vars: {{MARKERS: {}}}}}\n{}",
        markers.display(),
        marked_script(body)
    )
}

/// Submit `body` under `key` until the server acknowledges it, recording every try:
/// the same key each time, as a client that lost an answer must.
async fn submit_until_acknowledged(
    history: &History,
    who: usize,
    url: &str,
    token: &str,
    key: &str,
    body: &serde_json::Value,
) -> TaskId {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let sent = history.now();
        let reply = http
            .post(format!("{url}/v1/tasks"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await;
        let outcome = match reply {
            Ok(response) if response.status().is_success() => {
                match response.json::<tacc_proto::SubmitReply>().await {
                    Ok(reply) => Ok(reply.task_id),
                    Err(e) => Err(format!("reply unreadable: {e}")),
                }
            }
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                assert!(
                    status.is_server_error(),
                    "submit {key} refused with {status}: {text}"
                );
                Err(format!("{status}: {text}"))
            }
            Err(e) => Err(e.to_string()),
        };
        history.record(
            who,
            "submit",
            key,
            sent,
            outcome
                .as_ref()
                .map(|id| id.0.to_string())
                .map_err(Clone::clone),
        );
        if let Ok(id) = outcome {
            return id;
        }
        assert!(
            Instant::now() < end,
            "submit {key} never acknowledged in 90 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many submits R1 makes; `FAULT_R1_SUBMITS` scales it.
fn r1_submits() -> usize {
    std::env::var("FAULT_R1_SUBMITS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// R1 runs alone, the other scenarios beside each other: its storm (1000 submits, five
/// restarts, every task run) is the heaviest, and on a small machine two of them at
/// once stretch every wait towards its deadline.
static STORM: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const CLIENTS: usize = 8;
const KILLS: usize = 5;

/// R1: `mode` is `server` (with a separate agent) or `dev` (the embedded cluster, whose
/// agent is a process of its own): either agent lives through the kills of the server.
async fn r1(mode: &str, backend: Backend) {
    let _alone = STORM.write().await;
    let submits = r1_submits();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let markers = markers_dir(dir.path());
    let extra = if mode == "dev" {
        backend.with(&["--cpus", "16"])
    } else {
        backend.args()
    };
    let mut server = start(mode, &data, &extra).await;
    let url = server.url.clone();
    let token = server.token.clone();
    let _agent = (mode == "server").then(|| {
        start_agent(
            &server,
            &dir.path().join("a"),
            &["--name", "r1", "--cpus", "16"],
        )
    });
    if mode == "server" {
        wait_nodes(&server.client(), 1).await;
    }
    // Retried on node failure, so that an attempt lost by mistake shows as a second
    // attempt (which the check below refuses) rather than a task that never finishes.
    let retry = format!(
        "retry: {{max_attempts: {}, on: [node_failure]}}\n",
        KILLS + 1
    );
    let yaml = trivial_task(&markers, "r1", &retry, "true");
    let body = Arc::new(submit_body(&server.client(), dir.path(), "r1", &yaml).await);
    let history = Arc::new(History::new());
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let mut clients = Vec::new();
    for who in 0..CLIENTS {
        let (history, body, url, token, acknowledged) = (
            history.clone(),
            body.clone(),
            url.clone(),
            token.clone(),
            acknowledged.clone(),
        );
        clients.push(tokio::spawn(async move {
            for n in (who..submits).step_by(CLIENTS) {
                let key = format!("r1-{n}");
                submit_until_acknowledged(&history, who, &url, &token, &key, &body).await;
                acknowledged.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // A watcher lists every task all along, to catch a terminal state that changes.
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (history, watching) = (history.clone(), watching.clone());
        let client =
            Client::new(&url)
                .with_token(token.clone())
                .with_timeouts(tacc_client::Timeouts {
                    connect: Duration::from_secs(1),
                    request: Some(Duration::from_secs(5)),
                    attempts: 1,
                });
        tokio::spawn(async move {
            while watching.load(Ordering::SeqCst) {
                history.observe(&client, CLIENTS).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let mut kills = Vec::new();
    for k in 1..=KILLS {
        let at = submits * k / (KILLS + 1);
        eventually(
            &format!("{at} submits acknowledged"),
            Duration::from_secs(120),
            || {
                let done = acknowledged.load(Ordering::SeqCst) >= at;
                async move { done.then_some(()) }
            },
        )
        .await;
        server.kill9();
        kills.push(history.now());
        server = restart_on(mode, &data, &url, &extra).await;
    }
    for client in clients {
        client.await.unwrap();
    }
    let submitted_in = began.elapsed();
    let client = server.client();
    let keys = history.check_acknowledgements();
    assert_eq!(keys.len(), submits, "every logical submit acknowledged");
    let ids: std::collections::BTreeSet<TaskId> = keys.values().copied().collect();
    assert_eq!(ids.len(), submits, "one task per logical submit");
    let all_done = eventually("every task to finish", Duration::from_secs(120), || {
        let client = client.clone();
        let history = history.clone();
        async move {
            history.observe(&client, CLIENTS + 1).await;
            let tasks = client
                .list_tasks(&tacc_client::TaskQuery {
                    limit: Some(100_000),
                    ..Default::default()
                })
                .await
                .ok()?;
            tasks.iter().all(|t| t.state.is_terminal()).then_some(tasks)
        }
    })
    .await;
    let finished_in = began.elapsed();
    watching.store(false, Ordering::SeqCst);
    watcher.await.unwrap();
    // Exactly the acknowledged tasks exist, once each, and all succeeded.
    let listed: Vec<TaskId> = all_done.iter().map(|t| t.id).collect();
    let listed_set: std::collections::BTreeSet<TaskId> = listed.iter().copied().collect();
    assert_eq!(listed.len(), listed_set.len(), "a task listed twice");
    assert_eq!(
        listed_set, ids,
        "the server holds exactly the acknowledged tasks"
    );
    for task in &all_done {
        assert_eq!(task.state, TaskState::Succeeded, "{task:?}");
        let attempts = marked_attempts(&markers, task.id);
        let last = attempts.keys().max().copied();
        assert_eq!(
            last,
            Some(task.attempt.0),
            "task {}: the markers' last attempt is the server's",
            task.id
        );
        assert!(
            attempts[&task.attempt.0].1.is_some(),
            "task {}: its final attempt ended",
            task.id
        );
        // Both agents live through the kills (the embedded one is a process of its own):
        // nothing runs twice, not even what a crash caught running or ending.
        assert_eq!(
            attempts.len(),
            1,
            "task {}: ran more than once: {:?}",
            task.id,
            client.task_events(task.id).await
        );
        check_events(&client, task.id).await;
    }
    let observations = history.check_terminal_states_stay();
    let longest = history.longest_wait("submit");
    let calls = history.calls();
    let failed = calls
        .iter()
        .filter(|c| c.op == "submit" && c.outcome.is_err())
        .count();
    // How the failed calls failed: a server error's status and code, or no answer at all
    // (refused, reset or timed out while the server was down).
    let mut failures = std::collections::BTreeMap::<String, usize>::new();
    for call in calls.iter().filter(|c| c.op == "submit") {
        if let Err(e) = &call.outcome {
            let kind = match e.split_once(": ") {
                Some((status, body)) if status.as_bytes()[0].is_ascii_digit() => {
                    let code = serde_json::from_str::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v["code"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    format!("{status} {code}")
                }
                _ => "no answer".to_string(),
            };
            *failures.entry(kind).or_default() += 1;
        }
    }
    eprintln!(
        "R1 {mode} on {}: {submits} submits from {CLIENTS} clients, {KILLS} kills at {kills:?}; \
         {} submit calls ({failed} failed and retried with their key: {failures:?}; the longest wait \
         for an acknowledgement {longest:?}); all acknowledged in \
         {submitted_in:?}, all finished in {finished_in:?}, each in one attempt; \
         {observations} state observations checked",
        backend.name(),
        calls.iter().filter(|c| c.op == "submit").count(),
    );
}

on_both_stores!(
    r1_server_killed_during_keyed_submits_from_8_clients,
    threads = 4,
    needs = cgroups_or_skip,
    run = |backend| r1("server", backend)
);

on_both_stores!(
    r1_embedded_cluster_killed_during_keyed_submits_from_8_clients,
    threads = 4,
    needs = cgroups_or_skip,
    run = |backend| r1("dev", backend)
);

/// Whether `$MARKERS/gate-<task>` exists (the task waits for it).
fn gated(markers: &Path, name: &str, extra: &str) -> String {
    trivial_task(
        markers,
        name,
        extra,
        "while [ ! -e \"$MARKERS/gate-$TACC_TASK_ID\" ]; do sleep 0.05; done",
    )
}

fn open_gate(markers: &Path, task: TaskId) {
    std::fs::write(markers.join(format!("gate-{task}")), "").unwrap();
}

async fn wait_marked(markers: &Path, task: TaskId, attempt: u32) {
    eventually(
        &format!("task {task} attempt {attempt} to start"),
        DEADLINE,
        || {
            let started = marked_attempts(markers, task).contains_key(&attempt);
            async move { started.then_some(()) }
        },
    )
    .await;
}

on_both_stores!(
    r2_restore_after_partial_progress_reruns_only_unfinished_tasks,
    threads = 2,
    needs = cgroups_or_skip,
    run = r2
);

/// R2: the server and its agent both killed with half the tasks finished and half
/// running; after both are back, only the unfinished ones run again, as attempt 2, and
/// never while attempt 1 still lives.
async fn r2(backend: Backend) {
    let _beside_others = STORM.read().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let agent_dir = dir.path().join("a");
    let markers = markers_dir(dir.path());
    let mut server = start("server", &data, &backend.args()).await;
    let url = server.url.clone();
    let mut agent = start_agent(&server, &agent_dir, &["--name", "r2", "--cpus", "8"]);
    let client = server.client();
    wait_nodes(&client, 1).await;
    let history = History::new();
    let yaml = gated(
        &markers,
        "r2",
        "retry: {max_attempts: 3, on: [node_failure]}\n",
    );
    let body = submit_body(&client, dir.path(), "r2", &yaml).await;
    let mut tasks = Vec::new();
    for n in 0..6 {
        let key = format!("r2-{n}");
        tasks.push(submit_until_acknowledged(&history, 0, &url, &server.token, &key, &body).await);
    }
    for task in &tasks {
        wait_marked(&markers, *task, 1).await;
    }
    let (finished, unfinished) = tasks.split_at(3);
    for task in finished {
        open_gate(&markers, *task);
        let view = wait_terminal(&client, *task).await;
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        history.observe(&client, 0).await;
    }
    server.kill9();
    agent.kill9();
    let server = restart_on("server", &data, &url, &backend.args()).await;
    let client = server.client();
    let _agent = start_agent(&server, &agent_dir, &["--name", "r2", "--cpus", "8"]);
    for task in unfinished {
        wait_marked(&markers, *task, 2).await;
        open_gate(&markers, *task);
    }
    for task in &tasks {
        let view = wait_terminal(&client, *task).await;
        history.observe(&client, 0).await;
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        let attempts = marked_attempts(&markers, *task);
        let events = check_events(&client, *task).await;
        if finished.contains(task) {
            assert_eq!(view.attempt.0, 1, "a finished task ran again: {view:?}");
            assert_eq!(attempts.len(), 1, "task {task}: {attempts:?}");
        } else {
            assert_eq!(view.attempt.0, 2, "{view:?}");
            assert_eq!(
                attempts.keys().copied().collect::<Vec<_>>(),
                vec![1, 2],
                "task {task}"
            );
            assert!(
                events.contains(&(1, TaskState::Lost)) || events.contains(&(1, TaskState::Queued)),
                "task {task}: attempt 1 ended by the restart: {events:?}"
            );
        }
    }
    history.check_acknowledgements();
    let observations = history.check_terminal_states_stay();
    eprintln!(
        "R2 on {}: 3 of 6 tasks finished before server and agent were killed; after the restart \
         those stayed at attempt 1, the 3 unfinished ran as attempt 2; {observations} \
         observations checked",
        backend.name()
    );
}

impl HandNode {
    /// Poll until the server assigns `task` to this node; the attempt it was given.
    async fn assigned(&self, task: TaskId) -> AttemptRef {
        eventually(
            &format!("task {task} assigned to node {}", self.id),
            DEADLINE,
            || async move {
                let work = self
                    .client
                    .agent_work(self.id, None, Duration::from_millis(50), vec![])
                    .await
                    .ok()?;
                work.assignments
                    .iter()
                    .find(|a| a.attempt.task == task)
                    .map(|a| a.attempt)
            },
        )
        .await
    }

    async fn send(&self, reports: &[AgentReport]) -> (u32, u32) {
        let ack = self.client.agent_reports(self.id, reports).await.unwrap();
        (ack.accepted, ack.rejected)
    }
}

fn now() -> tacc_core::Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    tacc_core::Timestamp::from_millis(since_epoch.as_millis() as u64)
}

fn started(attempt: AttemptRef) -> AgentReport {
    AgentReport::Started { attempt, at: now() }
}

fn finished(attempt: AttemptRef, code: i32) -> AgentReport {
    AgentReport::Finished {
        attempt,
        at: now(),
        outcome: AttemptOutcome::Exited { code },
        rank: None,
    }
}

fn log(attempt: AttemptRef, text: &str) -> AgentReport {
    AgentReport::Log {
        attempt,
        text: text.into(),
        offset: None,
    }
}

on_both_stores!(
    r12_duplicated_reordered_and_stale_reports_are_applied_once,
    threads = 2,
    run = r12
);

/// R12: reports sent twice, in the wrong order, and by a node whose attempt was retried
/// elsewhere: each state change is applied once, a terminal state never changes, and the
/// stale attempt's reports, outputs and log lines are refused.
async fn r12(backend: Backend) {
    let _beside_others = STORM.read().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &backend.with(&["--heartbeat-timeout", "3"]),
    )
    .await;
    let client = server.client();
    let node = HandNode::register(&server, "hand-1").await;
    let history = History::new();
    let body = |name: &str| {
        format!(
            "name: {name}\nretry: {{max_attempts: 2, on: [node_failure]}}\noutputs: [out/]\nrun: echo {name}\n"
        )
    };

    // Duplicated: every report twice, and the whole batch again.
    let twice = submit(&client, dir.path(), "twice", &body("twice"), &[]).await;
    let attempt = node.assigned(twice).await;
    let batch = [
        started(attempt),
        started(attempt),
        finished(attempt, 0),
        finished(attempt, 0),
    ];
    let first = node.send(&batch).await;
    let again = node.send(&batch).await;
    history.observe(&client, 0).await;
    let view = client.get_task(twice).await.unwrap();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let events = check_events(&client, twice).await;
    assert_eq!(
        events
            .iter()
            .filter(|(_, s)| *s == TaskState::Succeeded)
            .count(),
        1,
        "{events:?}"
    );

    // Reordered: the end before the start, then a late failure report for the same
    // attempt: the first end counts, nothing after it.
    let reordered = submit(&client, dir.path(), "reordered", &body("reordered"), &[]).await;
    let attempt = node.assigned(reordered).await;
    node.send(&[finished(attempt, 0), started(attempt)]).await;
    node.send(&[finished(attempt, 3)]).await;
    history.observe(&client, 0).await;
    let view = client.get_task(reordered).await.unwrap();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.exit_code, Some(0), "{view:?}");
    let events = check_events(&client, reordered).await;
    assert!(
        !events.contains(&(1, TaskState::Running)),
        "a start after the end was applied: {events:?}"
    );

    // Stale: the node goes silent, its attempt is lost and retried on another node; the
    // old node's reports, log lines and outputs for attempt 1 are refused.
    let stale = submit(&client, dir.path(), "stale", &body("stale"), &[]).await;
    let old = node.assigned(stale).await;
    node.send(&[started(old), log(old, "attempt 1 running\n")])
        .await;
    let other = HandNode::register(&server, "hand-2").await;
    // hand-2 keeps polling (alive) while hand-1 says nothing past the heartbeat timeout.
    let current = other.assigned(stale).await;
    assert_eq!(current.attempt, AttemptNo(2), "retried as attempt 2");
    let nodes = client.list_nodes().await.unwrap();
    assert!(
        nodes
            .iter()
            .any(|n| n.name == "hand-1" && n.state == "down"),
        "{nodes:?}"
    );
    other
        .send(&[started(current), log(current, "attempt 2 running\n")])
        .await;
    // A log report delivered twice (the server's answer lost, the batch sent again) is
    // appended once: the agent tags it with where it starts in that node's output.
    let tagged = AgentReport::Log {
        attempt: current,
        text: "tagged line\n".into(),
        offset: Some(1000),
    };
    other.send(std::slice::from_ref(&tagged)).await;
    other.send(&[tagged]).await;
    let (accepted, rejected) = node
        .send(&[
            log(old, "STALE line of attempt 1\n"),
            finished(old, 1),
            started(old),
        ])
        .await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "stale").unwrap();
    let upload = node
        .client
        .put_output(
            node.id,
            stale,
            old.attempt,
            "out/stale.txt",
            tokio::fs::File::open(file.path()).await.unwrap(),
        )
        .await;
    assert!(upload.is_err(), "a stale attempt's output was taken");
    history.observe(&client, 0).await;
    let view = client.get_task(stale).await.unwrap();
    assert_eq!(
        (view.state, view.attempt),
        (TaskState::Running, AttemptNo(2)),
        "the stale end changed the task: {view:?}"
    );
    other
        .send(&[log(current, "attempt 2 done\n"), finished(current, 0)])
        .await;
    // A stale end after the task finished changes nothing either.
    node.send(&[finished(old, 0)]).await;
    let view = client.get_task(stale).await.unwrap();
    assert_eq!(
        (view.state, view.attempt),
        (TaskState::Succeeded, AttemptNo(2)),
        "{view:?}"
    );
    history.observe(&client, 0).await;
    let text = log_text(&client, stale).await;
    assert!(!text.contains("STALE"), "a stale log line was kept: {text}");
    assert!(text.contains("attempt 2 done"), "{text}");
    assert_eq!(
        text.matches("tagged line").count(),
        1,
        "a repeated log report was appended again: {text}"
    );
    let outputs = client.list_outputs(stale).await.unwrap();
    assert!(
        outputs.iter().all(|o| !o.path.contains("stale")),
        "{outputs:?}"
    );
    check_events(&client, stale).await;
    let observations = history.check_terminal_states_stay();
    eprintln!(
        "R12 on {}: duplicated batch acked {first:?} then {again:?} (accepted, rejected); stale \
         batch from the lost node acked ({accepted}, {rejected}); {observations} \
         observations checked",
        backend.name()
    );
    assert_eq!(
        (accepted, rejected),
        (0, 3),
        "every report of the stale attempt is refused"
    );
}

fn sleeper(markers: &Path, name: &str) -> String {
    trivial_task(markers, name, "", "sleep 300 & wait")
        .replace("resources: {cpus: 0.1}", "resources: {cpus: 1}")
}

on_both_stores!(
    r13_cancel_in_every_phase_survives_a_kill_right_after,
    threads = 2,
    needs = cgroups_or_skip,
    run = r13
);

/// R13: a cancel in each phase — queued, starting, running — with the server killed right
/// after it: after the restart the task is cancelled, stays so, and no process is left.
async fn r13(backend: Backend) {
    let _beside_others = STORM.read().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let markers = markers_dir(dir.path());
    let mut server = start("server", &data, &backend.args()).await;
    let url = server.url.clone();
    let agent = start_agent(
        &server,
        &dir.path().join("a"),
        &["--name", "r13", "--cpus", "1"],
    );
    wait_nodes(&server.client(), 1).await;
    let history = History::new();
    let mut cancelled = Vec::new();

    // Running.
    let client = server.client();
    let running = submit(
        &client,
        dir.path(),
        "running",
        &sleeper(&markers, "running"),
        &[],
    )
    .await;
    wait_marked(&markers, running, 1).await;
    let reply = client.cancel(running).await.unwrap();
    history.record(
        0,
        "cancel",
        running.to_string(),
        history.now(),
        Ok(format!("{:?}", reply.state)),
    );
    server.kill9();
    server = restart_on("server", &data, &url, &backend.args()).await;
    cancelled.push(("running", running));

    // Queued: behind a blocker that holds the node's one CPU.
    let client = server.client();
    let blocker = submit(
        &client,
        dir.path(),
        "blocker",
        &sleeper(&markers, "blocker"),
        &[],
    )
    .await;
    wait_marked(&markers, blocker, 1).await;
    let queued = submit(
        &client,
        dir.path(),
        "queued",
        &sleeper(&markers, "queued"),
        &[],
    )
    .await;
    assert_eq!(
        client.get_task(queued).await.unwrap().state,
        TaskState::Queued
    );
    let reply = client.cancel(queued).await.unwrap();
    assert_eq!(reply.state, TaskState::Cancelled);
    server.kill9();
    server = restart_on("server", &data, &url, &backend.args()).await;
    cancelled.push(("queued", queued));
    let client = server.client();
    // The agent must be back (registered with the new server) before it is stopped.
    wait_nodes(&client, 1).await;
    client.cancel(blocker).await.unwrap();
    cancelled.push(("blocker", blocker));
    wait_terminal(&client, blocker).await;

    // Starting: the agent stopped, so the assignment is not acted on.
    kill(Pid::from_raw(agent.pid() as i32), Signal::SIGSTOP).unwrap();
    let starting = submit(
        &client,
        dir.path(),
        "starting",
        &sleeper(&markers, "starting"),
        &[],
    )
    .await;
    wait_state(&client, starting, &[TaskState::Starting]).await;
    let reply = client.cancel(starting).await.unwrap();
    assert_eq!(
        reply.state,
        TaskState::Starting,
        "the agent must confirm first"
    );
    server.kill9();
    server = restart_on("server", &data, &url, &backend.args()).await;
    kill(Pid::from_raw(agent.pid() as i32), Signal::SIGCONT).unwrap();
    cancelled.push(("starting", starting));

    let client = server.client();
    for (phase, task) in &cancelled {
        let view = wait_terminal(&client, *task).await;
        history.observe(&client, 0).await;
        assert_eq!(view.state, TaskState::Cancelled, "{phase}: {view:?}");
        check_events(&client, *task).await;
        eventually(&format!("no process of the {phase} task"), DEADLINE, || {
            let alive = task_processes_of(&markers, *task);
            async move { alive.is_empty().then_some(()) }
        })
        .await;
    }
    assert!(
        marked_attempts(&markers, starting).is_empty(),
        "the task cancelled while starting ran"
    );
    assert!(
        marked_attempts(&markers, queued).is_empty(),
        "the queued task ran"
    );
    // Still cancelled a while later (the agent has reconnected and reported by now).
    let client2 = client.clone();
    eventually("the agent to be up again", DEADLINE, || {
        let client = client2.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            nodes.iter().all(|n| n.state == "up").then_some(())
        }
    })
    .await;
    for (phase, task) in &cancelled {
        let view = client.get_task(*task).await.unwrap();
        assert_eq!(view.state, TaskState::Cancelled, "{phase}: {view:?}");
    }
    history.observe(&client, 0).await;
    let observations = history.check_terminal_states_stay();
    eprintln!(
        "R13 on {}: cancelled while running, queued and starting, each followed by kill -9 of the server: all cancelled after restart, no process left; {observations} observations checked",
        backend.name()
    );
}

/// The live processes of `task` (its attempts' pid files name them).
fn task_processes_of(markers: &Path, task: TaskId) -> Vec<u32> {
    (1..=5)
        .filter_map(|a| std::fs::read_to_string(markers.join(format!("{task}.pid.{a}"))).ok())
        .filter_map(|pid| pid.trim().parse().ok())
        .filter(|pid| process_alive(*pid))
        .collect()
}

on_both_stores!(
    r6_a_stalled_server_loses_no_node_and_retries_nothing,
    threads = 2,
    needs = cgroups_or_skip,
    run = r6
);

/// R6: the server stopped (SIGSTOP) for twice its heartbeat timeout: after SIGCONT no node
/// is lost and the running task is neither stopped nor retried.
async fn r6(backend: Backend) {
    let _beside_others = STORM.read().await;
    let dir = tempfile::tempdir().unwrap();
    let markers = markers_dir(dir.path());
    let server = start(
        "server",
        &dir.path().join("s"),
        &backend.with(&["--heartbeat-timeout", "3"]),
    )
    .await;
    let client = server.client();
    let _agent = start_agent(&server, &dir.path().join("a"), &["--name", "r6"]);
    wait_nodes(&client, 1).await;
    let history = History::new();
    let yaml = gated(
        &markers,
        "r6",
        "retry: {max_attempts: 3, on: [node_failure]}\n",
    );
    let task = submit(&client, dir.path(), "r6", &yaml, &[]).await;
    wait_marked(&markers, task, 1).await;
    wait_state(&client, task, &[TaskState::Running]).await;
    let pid = Pid::from_raw(server.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The fault itself lasts this long: twice the heartbeat timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    kill(pid, Signal::SIGCONT).unwrap();
    // Watch for one more heartbeat timeout: the node stays up, the task keeps running.
    let until = Instant::now() + Duration::from_secs(4);
    let mut polls = 0;
    while Instant::now() < until {
        let nodes = client.list_nodes().await.unwrap();
        assert!(
            nodes.iter().all(|n| n.state == "up"),
            "a node was lost: {nodes:?}"
        );
        let view = client.get_task(task).await.unwrap();
        assert_eq!(
            (view.state, view.attempt),
            (TaskState::Running, AttemptNo(1)),
            "the stall stopped or retried the task: {view:?}"
        );
        history.observe(&client, 0).await;
        polls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    open_gate(&markers, task);
    let view = wait_terminal(&client, task).await;
    assert_eq!(
        (view.state, view.attempt),
        (TaskState::Succeeded, AttemptNo(1)),
        "{view:?}"
    );
    let attempts = marked_attempts(&markers, task);
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let events = check_events(&client, task).await;
    assert!(
        !events.iter().any(|(_, s)| *s == TaskState::Lost),
        "{events:?}"
    );
    history.observe(&client, 0).await;
    history.check_terminal_states_stay();
    eprintln!(
        "R6 on {}: server stopped 6 s with a 3 s heartbeat timeout; {polls} checks over the 4 s after SIGCONT saw the node up and the task running attempt 1; it then succeeded as attempt 1",
        backend.name()
    );
}
