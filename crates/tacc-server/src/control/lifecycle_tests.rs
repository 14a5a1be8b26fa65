//! Every dependability case of the task lifecycle (docs/RELIABILITY.md), one test each,
//! driven through the [`TestEnv`]: the control plane on a manual clock with fake agents.
//! The fault suite (`crates/taccd/tests/fault_suite.rs`) proves the same with real
//! processes and kills; these pin each rule down in milliseconds, so the first broken
//! rule names itself.

use std::time::Duration;

use tacc_core::TaskId;
use tacc_core::TaskState::{self, *};

use super::retry::RetrySettings;
use super::test_env::{HEARTBEAT, TestEnv, only};
use crate::clock::Clock;

const ONE_CPU: &str = "name: t\nresources: {cpus: 1}\nrun: true\n";

fn retried(on: &str, max: u32) -> String {
    format!(
        "name: t\nresources: {{cpus: 1}}\nrun: true\nretry: {{max_attempts: {max}, on: [{on}]}}\n"
    )
}

const MS: Duration = Duration::from_millis(1);

/// A server whose retries wait no backoff: a retry is placed in the turn that decides it.
async fn without_backoff() -> TestEnv {
    TestEnv::configured(|c| {
        c.retry = RetrySettings {
            backoff: Duration::ZERO,
            ..RetrySettings::default()
        }
    })
    .await
}

pub(super) fn assert_reason(record: &tacc_store::TaskRecord, prefix: &str) {
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(prefix)),
        "the reason should start with {prefix:?}: {record:?}"
    );
}

/// A retried task waiting out `backoff`: the server restarts a millisecond before it is
/// over and the agent registers again; the task is not placed before the backoff is
/// over, and is placed right after. Its new attempt's assignment.
async fn placed_after_its_backoff_across_a_restart(
    env: &mut TestEnv,
    agent: &mut super::test_env::FakeAgent,
    backoff: Duration,
) -> tacc_proto::AttemptRef {
    env.advance(backoff - MS);
    env.restart_server().await;
    env.register(agent, 1).await;
    env.check_liveness().await;
    assert!(
        env.poll(agent).await.is_empty(),
        "placed before its backoff"
    );
    env.advance(MS);
    env.check_liveness().await;
    only(&env.poll(agent).await)
}

#[tokio::test]
async fn a_task_is_placed_started_and_succeeds_once() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let task = env.submit(ONE_CPU).await;
    assert_eq!(env.state(task).await, Starting);
    let attempt = only(&env.poll(&mut agent).await);
    assert_eq!(env.report(&agent, vec![env.started(attempt)]).await, (1, 0));
    assert_eq!(env.state(task).await, Running);
    let out = env.output(&mut agent, attempt, "hello\n");
    env.report(&agent, vec![out]).await;
    assert_eq!(env.finish(&mut agent, attempt, 0).await, (1, 0));
    assert_eq!(env.state(task).await, Succeeded);
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
    );
    assert_eq!(env.log(task), "hello\n");
    assert!(env.poll(&mut agent).await.is_empty());
}

/// A follower of the log (`tcloud submit -f`) is woken by the task's end and then reads
/// the task: the end must be committed by then, or it finds the task still running and
/// waits out its poll period (a second for a task that printed nothing).
#[tokio::test]
async fn log_followers_are_woken_only_once_what_woke_them_is_committed() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.started(attempt)]).await;
    let out = env.output(&mut agent, attempt, "hello\n");
    env.report(&agent, vec![out]).await;
    env.finish(&mut agent, attempt, 0).await;
    let changes = env.control.committed.lock().unwrap().clone();
    // Where `task`'s transition to `to` is among the committed changes.
    let committed_at = |to: TaskState| {
        changes
            .iter()
            .position(|change| {
                matches!(change, tacc_store::TaskChange::Transition(t) if t.task == task && t.to == to)
            })
            .unwrap_or_else(|| panic!("the transition to {to} was committed"))
    };
    let (running_at, ended_at) = (committed_at(Running), committed_at(Succeeded));
    let woken: Vec<usize> = env
        .control
        .followers_woken
        .lock()
        .unwrap()
        .iter()
        .filter(|(woken, _)| *woken == task)
        .map(|(_, committed)| *committed)
        .collect();
    assert!(
        woken.iter().any(|committed| *committed > ended_at),
        "the followers were woken after the end was committed: {woken:?}, end at change {ended_at}"
    );
    assert!(
        woken.iter().all(|committed| *committed > running_at),
        "no follower is woken before the change that woke it is committed: {woken:?}"
    );
}

#[tokio::test]
async fn a_submit_without_any_node_waits_and_is_placed_when_one_registers() {
    let env = TestEnv::new().await;
    let task = env.submit(ONE_CPU).await;
    assert_eq!(env.state(task).await, Queued);
    assert_eq!(
        env.task(task).await.reason.as_deref(),
        Some(super::NO_NODE_REASON)
    );
    let mut agent = env.join("n1", 1).await;
    assert_eq!(env.state(task).await, Starting);
    assert_eq!(only(&env.poll(&mut agent).await).task, task);
}

#[tokio::test]
async fn a_node_is_lost_only_once_silent_past_the_heartbeat_timeout() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;

    // Checked every second, as a server does, up to the last millisecond of the term.
    env.pass_seconds(HEARTBEAT.as_secs(), &mut []).await;
    assert_eq!(env.node_state(&agent).await, "up");
    assert_eq!(env.state(task).await, Running);

    env.advance(MS);
    env.check_liveness().await;
    assert_eq!(env.node_state(&agent).await, "down");
    let record = env.task(task).await;
    assert_eq!(record.state, Lost);
    assert_reason(&record, "node_lost:");
    // A lost node's poll is refused: it must register again.
    assert!(env.try_poll(&agent).await.is_err());
}

#[tokio::test]
async fn every_poll_and_report_is_a_heartbeat() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    for _ in 0..4 {
        env.advance(HEARTBEAT - MS);
        env.poll(&mut agent).await;
        env.check_liveness().await;
    }
    assert_eq!(env.node_state(&agent).await, "up");
    env.advance(HEARTBEAT - MS);
    env.report(&agent, Vec::new()).await;
    env.advance(HEARTBEAT - MS);
    env.check_liveness().await;
    assert_eq!(env.node_state(&agent).await, "up");
}

#[tokio::test]
async fn a_stalled_server_loses_no_node_and_gives_each_a_fresh_term() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;
    env.check_liveness().await;

    // The server was stopped (no liveness check ran) for twice the term: the silence
    // was its own.
    env.advance(HEARTBEAT * 2);
    env.check_liveness().await;
    assert_eq!(env.node_state(&agent).await, "up");
    assert_eq!(env.state(task).await, Running);

    // A fresh term, not an endless one: a node that stays silent is lost after it.
    env.pass_a_term(&mut []).await;
    assert_eq!(env.node_state(&agent).await, "down");
    assert_eq!(env.state(task).await, Lost);
}

#[tokio::test]
async fn a_lost_attempt_is_retried_elsewhere_and_its_old_node_s_reports_are_rejected() {
    let env = TestEnv::new().await;
    let mut old = env.join("old", 1).await;
    let (task, first) = env.running(&mut old, &retried("node_failure", 2)).await;
    let mut new = env.join("new", 1).await;

    // `old` is cut off; `new` keeps polling.
    env.pass_a_term(&mut [&mut new]).await;
    assert_eq!(env.state(task).await, Queued, "waiting out its backoff");
    assert!(env.poll(&mut new).await.is_empty());
    env.advance(RetrySettings::default().backoff);
    env.check_liveness().await;
    let second = only(&env.poll(&mut new).await);
    assert_eq!((second.task, second.attempt.0), (task, 2));

    // The old node heals and speaks of attempt 1: every report is refused, none counts.
    env.register(&old, 1).await;
    let line = env.output(&mut old, first, "stale line\n");
    let stale = vec![line, env.started(first), env.exited(first, 0)];
    assert_eq!(env.report(&old, stale).await, (0, 3));
    assert_eq!(env.state(task).await, Starting);
    assert!(!env.log(task).contains("stale line"));

    env.report(&new, vec![env.started(second)]).await;
    env.finish(&mut new, second, 0).await;
    assert_eq!(
        env.history(task).await,
        [
            (1, Queued),
            (1, Starting),
            (1, Running),
            (1, Lost),
            (2, Queued),
            (2, Starting),
            (2, Running),
            (2, Succeeded)
        ]
    );
}

#[tokio::test]
async fn duplicated_and_reordered_reports_are_applied_once() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    let started = env.started(attempt);
    let line = env.output(&mut agent, attempt, "once\n");
    let batch = vec![started.clone(), started, line, env.exited(attempt, 0)];
    // The batch is sent again, as an agent does when the answer to it was lost.
    let first = env.report(&agent, batch.clone()).await;
    let again = env.report(&agent, batch).await;
    assert_eq!(first.0 + first.1, 4);
    assert_eq!(again.0 + again.1, 4);
    assert_eq!(env.log(task), "once\n");
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
    );
    // A late `started` and a second end with another code change nothing.
    env.report(&agent, vec![env.started(attempt), env.exited(attempt, 3)])
        .await;
    let record = env.task(task).await;
    assert_eq!((record.state, record.exit_code), (Succeeded, Some(0)));
}

#[tokio::test]
async fn an_end_reported_before_the_start_ends_the_attempt() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.exited(attempt, 0), env.started(attempt)])
        .await;
    assert_eq!(env.state(task).await, Succeeded);
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Succeeded)]
    );
}

#[tokio::test]
async fn terminal_states_never_change() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.finish(&mut agent, attempt, 7).await;
    assert_eq!(env.state(task).await, Failed);
    let before = env.history(task).await;
    env.control.cancel(task).await.unwrap();
    env.report(&agent, vec![env.exited(attempt, 0)]).await;
    env.advance(HEARTBEAT * 3);
    env.check_liveness().await;
    env.check_liveness().await;
    let record = env.task(task).await;
    assert_eq!((record.state, record.exit_code), (Failed, Some(7)));
    assert_eq!(env.history(task).await, before);
}

#[tokio::test]
async fn an_end_the_agent_could_not_deliver_counts_when_it_registers_again() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, attempt) = env.running(&mut agent, ONE_CPU).await;

    // The server dies; the process exits 0 meanwhile; the agent keeps its end.
    env.restart_server().await;
    assert!(
        env.try_poll(&agent).await.is_err(),
        "a new server knows no live node"
    );
    env.register(&agent, 1).await;
    env.finish(&mut agent, attempt, 0).await;
    assert_eq!(env.state(task).await, Succeeded);
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
    );
}

#[tokio::test]
async fn an_attempt_its_restarted_agent_does_not_claim_is_lost_and_retried() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, &retried("node_failure", 3)).await;

    // The agent restarted: its processes died with it, it claims nothing.
    agent.running.clear();
    env.register(&agent, 1).await;
    let record = env.task(task).await;
    assert_eq!(record.state, Queued);
    assert_eq!(record.attempt.0, 2);
    let lost = env.events(task).await;
    let lost = lost.iter().find(|e| e.state == Lost).expect("a lost event");
    assert!(
        lost.reason
            .as_deref()
            .unwrap()
            .starts_with("node_restarted:"),
        "{lost:?}"
    );
    env.advance(RetrySettings::default().backoff);
    env.check_liveness().await;
    assert_eq!(only(&env.poll(&mut agent).await).attempt.0, 2);
}

#[tokio::test]
async fn a_node_that_comes_back_stops_what_moved_away_before_it_gets_new_work() {
    let env = TestEnv::new().await;
    let mut old = env.join("old", 1).await;
    let (task, _) = env.running(&mut old, &retried("node_failure", 2)).await;
    let mut new = env.join("new", 1).await;
    env.pass_a_term(&mut [&mut new]).await;
    env.advance(RetrySettings::default().backoff);
    env.check_liveness().await;
    only(&env.poll(&mut new).await);

    // `old` heals still running attempt 1, and a new task is waiting for a CPU.
    env.register(&old, 1).await;
    let waiting = env.submit(ONE_CPU).await;
    assert_eq!(env.state(waiting).await, Starting);
    assert!(
        env.try_poll(&old).await.unwrap().is_empty(),
        "no new work while the stale attempt runs"
    );
    // It polls, its desired work says nothing of attempt 1: it stops it.
    let work = env.poll(&mut old).await;
    assert!(work.is_empty(), "{work:?}");
    assert!(old.running.is_empty());
    let fresh = env.poll(&mut old).await;
    assert_eq!(only(&fresh).task, waiting);
    assert_eq!(env.task(task).await.attempt.0, 2);
}

#[tokio::test]
async fn the_operator_s_backoff_and_crash_limit_are_the_ones_served() {
    let settings = RetrySettings {
        backoff: Duration::from_secs(2),
        backoff_max: Duration::from_secs(2),
        crash_limit: 1,
    };
    let mut env = TestEnv::configured(|config| config.retry = settings).await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("failed, node_failure", 3)).await;
    let first = only(&env.poll(&mut agent).await);
    env.finish(&mut agent, first, 1).await;
    let record = env.task(task).await;
    assert_reason(&record, "retrying in 2s");
    let second =
        placed_after_its_backoff_across_a_restart(&mut env, &mut agent, settings.backoff).await;
    assert_eq!(second.attempt.0, 2);
    // Its node goes silent: with a crash limit of one, that first crash ends it.
    env.pass_seconds(HEARTBEAT.as_secs() + 1, &mut []).await;
    let record = env.task(task).await;
    assert_eq!(record.state, Failed, "{record:?}");
    assert_reason(&record, "crash_limit:");
}

#[tokio::test]
async fn a_retried_task_waits_out_its_backoff_also_across_a_restart() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("failed", 2)).await;
    let first = only(&env.poll(&mut agent).await);
    env.finish(&mut agent, first, 1).await;
    let record = env.task(task).await;
    assert_eq!((record.state, record.attempt.0), (Queued, 2));
    assert_reason(&record, "retrying in 5s");
    assert!(env.log(task).contains("attempt 2"), "{}", env.log(task));

    let second = placed_after_its_backoff_across_a_restart(
        &mut env,
        &mut agent,
        RetrySettings::default().backoff,
    )
    .await;
    assert_eq!(second.attempt.0, 2);
    env.finish(&mut agent, second, 0).await;
    assert_eq!(env.state(task).await, Succeeded);
}

#[tokio::test]
async fn a_task_that_keeps_taking_its_node_down_fails_at_the_crash_limit() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("node_failure", 10)).await;
    for crash in 1..=RetrySettings::default().crash_limit {
        env.advance(RetrySettings::default().backoff * 2u32.pow(crash));
        env.check_liveness().await;
        let attempt = only(&env.poll(&mut agent).await);
        assert_eq!(attempt.attempt.0, crash);
        env.report(&agent, vec![env.started(attempt)]).await;
        // The node goes down with it; its agent comes back claiming nothing.
        agent.running.clear();
        env.register(&agent, 1).await;
    }
    let record = env.task(task).await;
    assert_eq!(record.state, Failed);
    assert_reason(&record, "crash_limit:");
    assert_eq!(record.attempt.0, RetrySettings::default().crash_limit);
}

#[tokio::test]
async fn a_cancel_of_a_queued_task_ends_it_at_once_and_holds_across_a_restart() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let busy = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    let queued = env.submit(ONE_CPU).await;
    assert_eq!(env.state(queued).await, Queued);
    env.control.cancel(queued).await.unwrap();
    assert_eq!(env.state(queued).await, Cancelled);
    env.restart_server().await;
    env.register(&agent, 1).await;
    assert_eq!(only(&env.poll(&mut agent).await), attempt);
    assert_eq!(attempt.task, busy);
    env.finish(&mut agent, attempt, 0).await;
    assert!(
        env.poll(&mut agent).await.is_empty(),
        "the cancelled task ran"
    );
    assert_eq!(env.history(queued).await, [(1, Queued), (1, Cancelled)]);
}

#[tokio::test]
async fn a_cancel_of_a_running_task_ends_it_when_its_agent_has_stopped_it() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;
    env.control.cancel(task).await.unwrap();
    assert_eq!(env.state(task).await, Running, "until the agent confirms");
    assert!(env.task(task).await.cancel_requested);

    // The server dies right after; the cancel is durable.
    env.restart_server().await;
    env.register(&agent, 1).await;
    let work = env.poll(&mut agent).await;
    assert!(
        work.is_empty(),
        "the cancelled attempt is not desired: {work:?}"
    );
    assert!(agent.running.is_empty());
    env.poll(&mut agent).await;
    assert_eq!(env.state(task).await, Cancelled);
    let record = env.task(task).await;
    assert_eq!(record.reason.as_deref(), Some("cancelled by user"));
}

#[tokio::test]
async fn a_cancel_while_starting_on_a_lost_node_ends_at_once() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("node_failure", 3)).await;
    only(&env.poll(&mut agent).await);
    env.pass_a_term(&mut []).await;
    // Lost and requeued; a cancel now ends the waiting retry at once.
    assert_eq!(env.state(task).await, Queued);
    env.control.cancel(task).await.unwrap();
    assert_eq!(env.state(task).await, Cancelled);
    env.register(&agent, 1).await;
    env.advance(RetrySettings::default().backoff * 2);
    env.check_liveness().await;
    assert!(env.poll(&mut agent).await.is_empty());
}

#[tokio::test]
async fn a_flapping_node_gets_work_only_once_it_stayed_up() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    for _ in 0..super::nodes::FLAP_LOSSES {
        env.pass_a_term(&mut []).await;
        assert_eq!(env.node_state(&agent).await, "down");
        env.register(&agent, 1).await;
    }
    assert_eq!(env.node_state(&agent).await, "flapping");
    let task = env.submit(ONE_CPU).await;
    assert!(env.poll(&mut agent).await.is_empty());
    assert_eq!(env.state(task).await, Queued);
    let stable_after = env.control.config.node_stable_after.as_secs();
    env.pass_seconds(stable_after, &mut [&mut agent]).await;
    assert_eq!(env.node_state(&agent).await, "up");
    assert_eq!(only(&env.poll(&mut agent).await).task, task);
}

#[tokio::test]
async fn ids_are_never_reused_across_restarts() {
    let mut env = TestEnv::new().await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3 {
        for _ in 0..3 {
            assert!(seen.insert(env.submit(ONE_CPU).await));
        }
        env.restart_server().await;
    }
    let queued: Vec<TaskState> = {
        let mut states = Vec::new();
        for task in &seen {
            states.push(env.state(*task).await);
        }
        states
    };
    assert!(queued.iter().all(|s| *s == Queued), "{queued:?}");
}

#[tokio::test]
async fn a_cancel_whose_node_never_comes_back_ends_within_the_heartbeat_timeout() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;
    env.control.cancel(task).await.unwrap();
    env.restart_server().await;
    // The agent never registers with the new server.
    env.pass_a_term(&mut []).await;
    assert_eq!(env.state(task).await, Cancelled);
}

#[tokio::test]
async fn an_attempt_whose_node_never_comes_back_after_a_restart_is_lost() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;
    env.restart_server().await;
    env.pass_seconds(HEARTBEAT.as_secs() - 1, &mut []).await;
    assert_eq!(
        env.state(task).await,
        Running,
        "lost before its node's term ran out"
    );
    env.advance(Duration::from_secs(2));
    env.check_liveness().await;
    assert_eq!(env.state(task).await, Lost);
}

#[tokio::test]
async fn a_cancel_whose_node_falls_silent_ends_with_the_node() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, &retried("node_failure", 3)).await;
    env.control.cancel(task).await.unwrap();
    env.pass_a_term(&mut []).await;
    let record = env.task(task).await;
    assert_eq!(record.state, Cancelled, "{record:?}");
    assert_eq!(record.reason.as_deref(), Some("cancelled by user"));
    assert_eq!(record.attempt.0, 1, "a cancelled task is not retried");
}

#[tokio::test]
async fn a_keyed_submit_retried_after_its_reply_was_lost_creates_one_task() {
    let mut env = TestEnv::new().await;
    let task = env.submit_keyed(ONE_CPU, "k-1").await.unwrap();
    // The reply was lost; the server even restarted before the client tried again.
    env.restart_server().await;
    let again = env.submit_keyed(ONE_CPU, "k-1").await;
    assert!(
        matches!(
            again,
            Err(crate::ServerError::Store(
                tacc_store::StoreError::AlreadyExists { .. }
            ))
        ),
        "{again:?}"
    );
    assert_eq!(
        env.kept_reply("k-1").await,
        Some(serde_json::json!({ "task_id": task }))
    );
    let other = env.submit_keyed(ONE_CPU, "k-2").await.unwrap();
    assert_ne!(other, task);
    let stored: Vec<TaskId> = env.all_tasks().await.iter().map(|t| t.id).collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
}

#[tokio::test]
async fn output_resent_to_a_restarted_server_is_appended_once() {
    let mut env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, attempt) = env.running(&mut agent, ONE_CPU).await;
    let first = env.output(&mut agent, attempt, "one\n");
    env.report(&agent, vec![first.clone()]).await;
    // The server died before its answer left; the agent registers again and resends.
    env.restart_server().await;
    env.register(&agent, 1).await;
    let second = env.output(&mut agent, attempt, "two\n");
    env.report(&agent, vec![first, second]).await;
    assert_eq!(env.log(task), "one\ntwo\n");

    // A new life of the agent counts its output from zero again.
    agent.life += 1;
    agent.running.clear();
    env.register(&agent, 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    let mut fresh = env.output(&mut agent, attempt, "three\n");
    if let tacc_proto::AgentReport::Log { offset, .. } = &mut fresh {
        *offset = Some(0);
    }
    env.report(&agent, vec![fresh]).await;
    assert_eq!(env.log(task), "three\n");
}

// Wake-ups: a decision that changes a node's work answers the poll that node holds open
// (see `comm.rs`); without one the agent hears of it only at its next poll, up to 30 s on.

#[tokio::test]
async fn a_placement_wakes_the_node_it_is_placed_on_and_no_other() {
    let env = TestEnv::new().await;
    let small = env.join("n1", 1).await;
    let mut big = env.join("n2", 4).await;
    let held_by_small = env.held_poll(&small);
    let held_by_big = env.held_poll(&big);
    env.woken();
    let task = env
        .submit("name: t\nresources: {cpus: 2}\nrun: true\n")
        .await;
    assert_eq!(env.woken(), [big.node]);
    assert!(held_by_big.has_changed().unwrap());
    assert!(!held_by_small.has_changed().unwrap());
    assert_eq!(only(&env.poll(&mut big).await).task, task);
}

#[tokio::test]
async fn a_cancel_wakes_the_node_running_the_task_at_once() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (task, _) = env.running(&mut agent, ONE_CPU).await;
    let held = env.held_poll(&agent);
    env.woken();
    env.control.cancel(task).await.unwrap();
    assert_eq!(env.woken(), [agent.node]);
    assert!(held.has_changed().unwrap());
    assert!(
        env.poll(&mut agent).await.is_empty(),
        "the cancelled attempt is withdrawn"
    );
}

#[tokio::test]
async fn output_and_start_reports_wake_nobody() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    let held = env.held_poll(&agent);
    env.woken();
    let out = env.output(&mut agent, attempt, "hello\n");
    env.report(&agent, vec![env.started(attempt), out]).await;
    assert_eq!(env.state(task).await, Running);
    assert_eq!(env.woken(), []);
    assert!(!held.has_changed().unwrap());
}

#[tokio::test]
async fn removing_a_node_answers_the_poll_it_holds_open() {
    let env = TestEnv::new().await;
    let agent = env.join("n1", 1).await;
    let mut held = env.held_poll(&agent);
    env.control.remove_node("n1").await.unwrap();
    assert!(held.changed().await.is_err(), "the held poll is answered");
    assert!(env.try_poll(&agent).await.is_err(), "the node is gone");
}

#[tokio::test]
async fn a_node_enrolled_while_approval_is_required_gets_work_only_once_approved() {
    let mut env = TestEnv::configured(|config| config.require_node_approval = true).await;
    let mut agent = env.enrol("fresh", 2).await;
    assert_eq!(env.node_state(&agent).await, "pending");
    let task = env.submit(ONE_CPU).await;
    assert!(
        env.poll(&mut agent).await.is_empty(),
        "work for a pending node"
    );
    assert_eq!(env.state(task).await, Queued);
    // A restart of the server or the agent keeps it pending.
    env.restart_server().await;
    env.register(&agent, 2).await;
    assert_eq!(env.node_state(&agent).await, "pending");
    assert!(
        env.poll(&mut agent).await.is_empty(),
        "work for a pending node"
    );

    let view = env.control.approve_node("fresh").await.unwrap();
    assert_eq!(view.state, "up");
    let attempt = only(&env.poll(&mut agent).await);
    assert_eq!(attempt.task, task);
    // A drained node that is approved stays drained.
    let mut other = env.enrol("other", 2).await;
    env.control.drain_node("other").await.unwrap();
    env.control.approve_node("other").await.unwrap();
    assert_eq!(env.node_state(&other).await, "drained");
    assert!(env.poll(&mut other).await.is_empty());
}

/// A request no node can hold is refused at submit; accepted with `wait_for_capacity`, it
/// waits, and keeps waiting across a server restart (the choice is kept with the task,
/// not only in memory), until a node that can hold it joins.
#[tokio::test]
async fn a_task_waiting_for_capacity_survives_a_restart_and_starts_on_a_bigger_node() {
    const BIG: &str = "name: big\nresources: {cpus: 4}\nrun: true\n";
    let mut env = TestEnv::new().await;
    let small = env.join("n1", 1).await;
    let refused = env.submit_with(BIG, Default::default()).await.unwrap_err();
    assert!(
        refused.to_string().contains("can never fit this cluster"),
        "{refused}"
    );
    assert!(
        env.all_tasks().await.is_empty(),
        "a refused task was stored"
    );
    let waiting = super::SubmitOptions {
        source: None,
        wait_for_capacity: true,
        ..Default::default()
    };
    let task = env.submit_with(BIG, waiting).await.unwrap();
    assert_eq!(env.state(task).await, Queued);

    env.restart_server().await;
    env.register(&small, 1).await;
    env.check_liveness().await;
    assert_eq!(env.state(task).await, Queued, "{:?}", env.task(task).await);
    assert_reason(&env.task(task).await, "waiting for the cluster to grow");

    let mut big = env.join("n2", 8).await;
    let attempt = only(&env.poll(&mut big).await);
    assert_eq!(attempt.task, task);
}

const GANG: &str = "name: g\nresources: {nodes: 2, cpus: 1}\nrun: true\n";

/// A 2-node gang placed on `first` and `second`, both ranks started.
async fn a_running_gang(
    env: &TestEnv,
    first: &mut super::test_env::FakeAgent,
    second: &mut super::test_env::FakeAgent,
) -> (TaskId, tacc_proto::AttemptRef) {
    let task = env.submit(GANG).await;
    let attempt = only(&env.poll(first).await);
    assert_eq!(only(&env.poll(second).await), attempt);
    env.report(first, vec![env.started(attempt)]).await;
    env.report(second, vec![env.started(attempt)]).await;
    assert_eq!(env.state(task).await, Running);
    (task, attempt)
}

#[tokio::test]
async fn a_gang_with_a_finished_rank_continues_as_the_same_attempt_across_a_restart() {
    for finished_rank_registers_first in [false, true] {
        let mut env = TestEnv::new().await;
        let mut n1 = env.join("n1", 1).await;
        let mut n2 = env.join("n2", 1).await;
        let (task, attempt) = a_running_gang(&env, &mut n1, &mut n2).await;
        // One rank finishes its part; then the server dies.
        env.finish(&mut n1, attempt, 0).await;
        assert_eq!(env.state(task).await, Running);
        env.restart_server().await;
        // Its agents come back in either order; n1 (its part done) claims nothing.
        if finished_rank_registers_first {
            env.register(&n1, 1).await;
            env.register(&n2, 1).await;
        } else {
            env.register(&n2, 1).await;
            env.register(&n1, 1).await;
        }
        assert_eq!(env.state(task).await, Running, "no rank was lost");
        assert!(
            env.poll(&mut n1).await.is_empty(),
            "a finished rank is not run again"
        );
        assert_eq!(only(&env.poll(&mut n2).await), attempt);
        env.finish(&mut n2, attempt, 0).await;
        assert_eq!(
            env.history(task).await,
            [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)],
            "the same attempt, never lost"
        );
    }
}

#[tokio::test]
async fn a_gang_whose_agents_come_back_one_by_one_after_a_restart_is_kept() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    let mut n2 = env.join("n2", 1).await;
    let (task, attempt) = a_running_gang(&env, &mut n1, &mut n2).await;
    env.restart_server().await;
    env.register(&n2, 1).await;
    // Most of a heartbeat term passes before the other agent is back.
    env.pass_seconds(HEARTBEAT.as_secs() - 5, &mut [&mut n2])
        .await;
    assert_eq!(env.node_state(&n1).await, "unknown");
    env.register(&n1, 1).await;
    assert_eq!(env.node_state(&n1).await, "up");
    env.pass_a_term(&mut [&mut n1, &mut n2]).await;
    assert_eq!(env.state(task).await, Running);
    env.finish(&mut n1, attempt, 0).await;
    env.finish(&mut n2, attempt, 0).await;
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
    );
}

#[tokio::test]
async fn a_gang_whose_other_node_never_comes_back_after_a_restart_is_lost_naming_it() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    let mut n2 = env.join("n2", 1).await;
    let (task, attempt) = a_running_gang(&env, &mut n1, &mut n2).await;
    env.restart_server().await;
    env.register(&n2, 1).await;
    env.pass_a_term(&mut [&mut n2]).await;
    let record = env.task(task).await;
    assert_eq!(record.state, Lost);
    assert_reason(&record, "node_lost: node n1 did not come back");
    // n2 is told to stop its rank.
    assert!(env.poll(&mut n2).await.is_empty());
    assert!(!n2.running.contains(&attempt));
}

#[tokio::test]
async fn a_restarted_server_places_nothing_on_a_node_before_its_agent_is_back_and_then_does() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 2).await;
    let (running, _) = env.running(&mut n1, ONE_CPU).await;
    env.restart_server().await;
    // n1 has a free CPU, but its agent is not back: the first task goes to n2, the
    // second waits.
    let mut n2 = env.join("n2", 1).await;
    let first = env.submit(ONE_CPU).await;
    let second = env.submit(ONE_CPU).await;
    assert_eq!(only(&env.poll(&mut n2).await).task, first);
    assert_eq!(
        env.state(second).await,
        Queued,
        "nothing placed on n1 meanwhile"
    );
    env.register(&n1, 2).await;
    // Back: the node takes new work beside what it kept running.
    let work = env.poll(&mut n1).await;
    let tasks: Vec<TaskId> = work.iter().map(|a| a.attempt.task).collect();
    assert_eq!(tasks, [running, second], "{work:?}");
    assert_eq!(env.state(running).await, Running);
}

#[tokio::test]
async fn the_fair_share_standing_survives_a_restart() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    let (_task, _) = env.running(&mut n1, ONE_CPU).await;
    env.pass_seconds(120, &mut [&mut n1]).await;
    let usage = |standing: tacc_scheduler::FairShareStanding| -> f64 {
        standing.groups.iter().map(|g| g.decayed_usage).sum()
    };
    let now = env.clock.now();
    let before = usage(env.control.fairshare_standing(now).await);
    assert!(before > 0.0, "the running task accrued usage");
    env.restart_server().await;
    let after = usage(env.control.fairshare_standing(now).await);
    assert!(
        (after - before).abs() <= before * 1e-6,
        "standing before {before}, after {after}"
    );
    // And it keeps accruing for the task that ran through the restart.
    env.register(&n1, 1).await;
    env.pass_seconds(60, &mut [&mut n1]).await;
    let later = usage(env.control.fairshare_standing(env.clock.now()).await);
    assert!(later > after, "{later} > {after}");
}

#[tokio::test]
async fn a_report_batch_is_one_turn_and_one_transaction() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 4).await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(env.submit(ONE_CPU).await);
    }
    let attempts: Vec<_> = env
        .poll(&mut agent)
        .await
        .iter()
        .map(|a| a.attempt)
        .collect();
    assert_eq!(attempts.len(), 3);
    let commits = env.control.metrics.commits("apply");
    // One batch: every start, then every end (as an agent reports short tasks).
    let mut reports: Vec<_> = attempts.iter().map(|a| env.started(*a)).collect();
    reports.extend(attempts.iter().map(|a| env.exited(*a, 0)));
    env.report(&agent, reports).await;
    assert_eq!(
        env.control.metrics.commits("apply") - commits,
        1,
        "a batch is one turn: its starts and ends go in one transaction"
    );
    for task in &tasks {
        assert_eq!(
            env.history(*task).await,
            [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
        );
    }
    // Starts alone are committed together before the batch is acknowledged.
    let more: Vec<TaskId> = vec![env.submit(ONE_CPU).await, env.submit(ONE_CPU).await];
    let attempts: Vec<_> = env
        .poll(&mut agent)
        .await
        .iter()
        .map(|a| a.attempt)
        .collect();
    let commits = env.control.metrics.commits("apply");
    env.report(&agent, attempts.iter().map(|a| env.started(*a)).collect())
        .await;
    assert_eq!(env.control.metrics.commits("apply") - commits, 1);
    for task in more {
        assert_eq!(env.state(task).await, Running);
    }
}

#[tokio::test]
async fn a_node_expected_back_after_a_restart_can_be_removed_and_its_attempt_is_lost() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    let (task, _) = env.running(&mut n1, &retried("node_failure", 2)).await;
    env.restart_server().await;
    assert_eq!(env.node_state(&n1).await, "unknown");
    env.control.remove_node("n1").await.unwrap();
    let events = env.events(task).await;
    assert!(
        events.iter().any(|e| e.state == Lost
            && e.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("node_removed:"))),
        "{events:?}"
    );
    // The scheduler forgot the node: the retry waits for another one and gets it.
    let mut n2 = env.join("n2", 1).await;
    env.advance(RetrySettings::default().backoff);
    env.check_liveness().await;
    assert_eq!(only(&env.poll(&mut n2).await).attempt.0, 2);
}

#[tokio::test]
async fn the_likely_start_rests_on_the_usual_run_time_of_the_task_ahead() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let train = "name: train\nresources: {cpus: 1, time_limit: 1h}\nrun: train\n";
    // Alice's last runs of `train` took 60 s, 70 s and 80 s: usually 70 s.
    for secs in [60, 70, 80] {
        let (_, attempt) = env.running(&mut agent, train).await;
        env.advance(Duration::from_secs(secs));
        env.finish(&mut agent, attempt, 0).await;
    }
    let (running, _) = env.running(&mut agent, train).await;
    let started = env.task(running).await.started_at.unwrap();
    let waiting = env.submit(train).await;
    let why = env
        .control
        .explain(waiting, &super::Estimates::of(&env.control))
        .await
        .unwrap();
    let estimate = why.start_estimate.expect("an estimate");
    assert_eq!(
        estimate.latest,
        tacc_proto::LatestStartView::At {
            at: tacc_core::Timestamp(started.as_millis() + 3_600_000)
        },
        "at the latest when the running one reaches its time limit"
    );
    let likely = estimate.likely.expect("a likelier start");
    assert_eq!(likely.at.as_millis(), started.as_millis() + 70_000);
    assert_eq!(
        likely.because,
        [format!(
            "task {running} usually runs 1m10s (median of alice's last 3 runs of train)"
        )]
    );
    // A task of another name waiting behind the same running task gets it too.
    let other = env
        .submit("name: other\nresources: {cpus: 1, time_limit: 1h}\nrun: x\n")
        .await;
    let why = env
        .control
        .explain(other, &super::Estimates::of(&env.control))
        .await
        .unwrap();
    assert!(
        why.start_estimate.is_some_and(|e| e.likely.is_some()),
        "it waits behind the same running train task"
    );
}

#[tokio::test]
async fn without_a_history_there_is_no_likelier_start() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let train = "name: train\nresources: {cpus: 1, time_limit: 1h}\nrun: train\n";
    env.running(&mut agent, train).await;
    let waiting = env.submit(train).await;
    let estimate = env
        .control
        .explain(waiting, &super::Estimates::of(&env.control))
        .await
        .unwrap()
        .start_estimate;
    let estimate = estimate.expect("an estimate");
    assert_eq!(estimate.likely, None, "{estimate:?}");
}

#[tokio::test]
async fn a_staged_start_keeps_its_place_before_what_the_batch_says_after_it() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    // The start, then the runtime the agent chose, in one batch: the reason the second
    // sets is not overwritten by the first, committed after it.
    env.report(
        &agent,
        vec![
            env.started(attempt),
            tacc_proto::AgentReport::RuntimeChosen {
                attempt,
                runtime: "container".into(),
                why: "the task names a container image".into(),
            },
        ],
    )
    .await;
    let record = env.task(task).await;
    assert_eq!(record.state, Running);
    assert_eq!(
        record.reason.as_deref(),
        Some("runtime container: the task names a container image")
    );
}

#[tokio::test]
async fn the_plan_a_batch_of_ends_calls_for_commits_with_them() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(env.submit(ONE_CPU).await);
    }
    let first: Vec<_> = env
        .poll(&mut agent)
        .await
        .iter()
        .map(|a| a.attempt)
        .collect();
    assert_eq!(first.len(), 2, "two fit on two CPUs");
    let commits = env.control.metrics.commits("apply");
    let mut reports: Vec<_> = first.iter().map(|a| env.started(*a)).collect();
    reports.extend(first.iter().map(|a| env.exited(*a, 0)));
    env.report(&agent, reports).await;
    assert_eq!(
        env.control.metrics.commits("apply") - commits,
        1,
        "the ends, and the starts of the two waiting tasks they make room for, in one transaction"
    );
    let next: Vec<_> = env
        .poll(&mut agent)
        .await
        .iter()
        .map(|a| a.attempt)
        .collect();
    assert_eq!(
        next.len(),
        2,
        "the two waiting tasks were handed to the node"
    );
    for task in &tasks[..2] {
        assert_eq!(env.task(*task).await.state, TaskState::Succeeded);
    }
    for task in &tasks[2..] {
        assert_eq!(env.task(*task).await.state, TaskState::Starting);
    }
}

// Turns of the reactor, read as tako's tests read them: what each event committed
// (`take_changes`), whom it woke (`woken`), and that nothing is left once tasks end
// (`emptiness_check`).

#[tokio::test]
async fn a_turn_commits_its_changes_wakes_whom_it_concerns_and_leaves_nothing() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    assert_eq!(env.take_transitions(), [(task, Queued, Starting)]);
    env.woken();
    env.report(&agent, vec![env.started(attempt)]).await;
    assert_eq!(env.take_transitions(), [(task, Starting, Running)]);
    assert_eq!(env.woken(), [], "a start changes no node's work");
    env.finish(&mut agent, attempt, 0).await;
    assert_eq!(env.take_transitions(), [(task, Running, Succeeded)]);
    assert_eq!(
        env.woken(),
        [agent.node],
        "the node's poll is answered: the attempt left its work"
    );
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_cancel_is_one_change_then_the_confirmed_end_and_nothing_is_left() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.started(attempt)]).await;
    env.take_changes();
    env.woken();
    env.control.cancel(task).await.unwrap();
    assert!(
        matches!(
            env.take_changes()[..],
            [tacc_store::TaskChange::CancelRequested { task: t }] if t == task
        ),
        "the cancel is recorded, the task still runs until its agent confirms"
    );
    assert_eq!(env.woken(), [agent.node], "its node hears of it at once");
    // The agent stopped it: its next poll no longer reports it.
    agent.running.remove(&attempt);
    assert!(env.poll(&mut agent).await.is_empty());
    assert_eq!(env.take_transitions(), [(task, Running, Cancelled)]);
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_queued_cancel_ends_at_once_and_leaves_nothing() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let running = env.submit(ONE_CPU).await;
    let queued = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.take_changes();
    env.woken();
    env.control.cancel(queued).await.unwrap();
    assert_eq!(env.take_transitions(), [(queued, Queued, Cancelled)]);
    assert_eq!(env.woken(), [], "no node held it");
    env.finish(&mut agent, attempt, 0).await;
    assert_eq!(env.state(running).await, Succeeded);
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_gang_commits_each_rank_s_end_and_succeeds_with_the_last() {
    let env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    let mut n2 = env.join("n2", 1).await;
    let (task, attempt) = a_running_gang(&env, &mut n1, &mut n2).await;
    env.take_changes();
    env.woken();
    env.finish(&mut n1, attempt, 0).await;
    assert!(
        matches!(
            env.take_changes()[..],
            [tacc_store::TaskChange::RankEnded(ref end)] if end.rank == 0 && end.failure.is_none()
        ),
        "rank 0's part is kept, the attempt goes on"
    );
    assert_eq!(env.woken(), [], "the other rank runs on undisturbed");
    env.finish(&mut n2, attempt, 0).await;
    let changes = env.take_changes();
    assert!(
        matches!(changes[..], [
            tacc_store::TaskChange::RankEnded(ref end),
            tacc_store::TaskChange::Transition(ref t),
        ] if end.rank == 1 && t.to == Succeeded && t.task == task),
        "{changes:?}"
    );
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_failed_attempt_is_retried_as_a_new_one_and_nothing_is_left_once_it_succeeds() {
    let env = without_backoff().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("failed", 2)).await;
    let first = only(&env.poll(&mut agent).await);
    env.take_changes();
    env.finish(&mut agent, first, 3).await;
    assert_eq!(
        env.take_transitions(),
        [
            (task, Starting, Failed),
            (task, Failed, Queued),
            (task, Queued, Starting)
        ],
        "the end, the retry and its placement: one turn"
    );
    let second = only(&env.poll(&mut agent).await);
    assert_eq!(second.attempt.0, 2);
    env.finish(&mut agent, second, 0).await;
    assert_eq!(env.state(task).await, Succeeded);
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_node_s_last_seen_time_survives_a_restart() {
    let mut env = TestEnv::new().await;
    let mut n1 = env.join("n1", 1).await;
    env.pass_seconds(25, &mut [&mut n1]).await;
    let heard = env.clock.now();
    // The node falls silent; the server dies before the heartbeat timeout.
    env.pass_seconds(3, &mut []).await;
    env.restart_server().await;
    env.advance(Duration::from_secs(60));
    let view = env
        .control
        .node_views()
        .await
        .into_iter()
        .find(|n| n.name == "n1")
        .expect("the node is still known");
    assert_eq!(view.state, "down", "not heard from in this server's life");
    // Kept every 10 s while the node is heard (`restart.rs`), so at most that early.
    assert!(
        view.last_seen <= heard && heard.millis_since(view.last_seen) <= 10_000,
        "last seen {:?}, heard at {heard:?}: the kept time, not the restart's",
        view.last_seen
    );
}

/// A turn dropped at an await (a request whose client went away, a loop stopped) after
/// its handlers changed the core leaves the core saying what the store does not: the next
/// turn reads it again from the store first, so a running attempt is not dropped from its
/// node's work (which would stop it) and nothing is placed twice.
#[tokio::test]
async fn a_turn_dropped_half_way_is_undone_before_the_next_one() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 2).await;
    let task = env.submit(ONE_CPU).await;
    let attempt = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.started(attempt)]).await;
    let mut torn = Box::pin(env.control.turn(async |core: &mut super::Core| {
        core.clear_open_tasks();
        std::future::pending::<()>().await;
        Ok(())
    }));
    assert!(
        torn.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    );
    drop(torn);
    assert_eq!(
        only(&env.poll(&mut agent).await),
        attempt,
        "the attempt is still its node's"
    );
    assert_eq!(env.state(task).await, Running);
    env.finish(&mut agent, attempt, 0).await;
    assert_eq!(
        env.history(task).await,
        [(1, Queued), (1, Starting), (1, Running), (1, Succeeded)]
    );
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_turn_whose_commit_fails_acknowledges_nothing_and_the_core_is_rebuilt() {
    let env = without_backoff().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("failed", 2)).await;
    let first = only(&env.poll(&mut agent).await);
    env.report(&agent, vec![env.started(first)]).await;
    env.take_changes();
    // The batch carrying the end cannot be committed (the turn's commit, and its retry at
    // the turn's end): it is refused, nothing of it stays.
    env.fail_next_commits(2);
    let refused = env
        .control
        .agent_reports(agent.node, vec![env.exited(first, 3)], None)
        .await;
    assert!(
        refused.is_err(),
        "a batch that is not durable is not acknowledged"
    );
    assert_eq!(env.take_changes(), []);
    assert_eq!(
        env.state(task).await,
        Running,
        "the store never saw the end"
    );
    // The core agrees with the store again: the attempt is the node's, the task's spec
    // (and its retry policy) known.
    assert_eq!(only(&env.poll(&mut agent).await), first);
    // The agent sends the batch again: the end counts once, and the retry follows.
    env.finish(&mut agent, first, 3).await;
    let second = only(&env.poll(&mut agent).await);
    assert_eq!(second.attempt.0, 2, "retried by its policy");
    env.report(&agent, vec![env.started(second)]).await;
    env.finish(&mut agent, second, 0).await;
    assert_eq!(
        env.history(task).await,
        [
            (1, Queued),
            (1, Starting),
            (1, Running),
            (1, Failed),
            (2, Queued),
            (2, Starting),
            (2, Running),
            (2, Succeeded)
        ]
    );
    env.emptiness_check().await;
}

/// A new `taccd dev` stops the embedded agent of a server with other settings; that
/// agent stops its running attempt and its end (cancelled, though nobody asked) reaches
/// the server: the node failed, not the task — the attempt is lost and retried, never
/// `cancelled` (found by `pipelines.rs::a_restarted_server_keeps_stages_waiting_for_what_they_need`).
#[tokio::test]
async fn an_attempt_its_agent_stopped_unasked_is_lost_and_retried_not_cancelled() {
    let env = without_backoff().await;
    let mut agent = env.join("n1", 1).await;
    let task = env.submit(&retried("lost", 2)).await;
    let first = only(&env.poll(&mut agent).await);
    let started = env.started(first);
    env.report(&agent, vec![started]).await;
    let stopped = tacc_proto::AgentReport::Finished {
        attempt: first,
        at: env.clock.now(),
        outcome: tacc_proto::AttemptOutcome::Cancelled,
        rank: None,
    };
    env.report(&agent, vec![stopped]).await;
    agent.running.remove(&first);
    let history = env.history(task).await;
    assert!(
        history.contains(&(1, Lost)) && !history.iter().any(|(_, s)| *s == Cancelled),
        "{history:?}"
    );
    let events = env.events(task).await;
    assert!(
        events.iter().any(|e| e
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("agent_stopped:"))),
        "{events:?}"
    );
    let second = only(&env.poll(&mut agent).await);
    assert_eq!(second.attempt.0, 2, "retried as a new attempt");
    env.finish(&mut agent, second, 0).await;
    assert_eq!(env.state(task).await, Succeeded);
    env.emptiness_check().await;
}

#[tokio::test]
async fn a_report_batch_that_ends_a_task_carries_the_next_one_and_the_held_poll_stays_open() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (first, attempt) = env.running(&mut agent, ONE_CPU).await;
    let next = env.submit(ONE_CPU).await;
    assert_eq!(env.state(next).await, Queued, "the node is full");
    let mut held = env.held_poll(&agent);
    held.borrow_and_update();

    // The end of the first frees the node: the batch's answer carries the next task.
    let handed = env
        .report_asking_work(&mut agent, vec![env.exited(attempt, 0)])
        .await
        .expect("the answer carries the node's new work");
    assert_eq!(env.state(first).await, Succeeded);
    assert_eq!(only(&handed).task, next);
    assert_eq!(env.state(next).await, Starting);
    // The poll the agent holds open was woken by the change, which the node has already:
    // it stays open.
    assert!(held.has_changed().unwrap());
    let version = *held.borrow_and_update();
    assert_eq!(agent.work_version.get(), Some(version));
    assert!(env.control.already_handed(agent.node, version).await);

    // A batch that changes nothing of the node's work carries none.
    let started = env.started(only(&handed));
    assert_eq!(
        env.report_asking_work(&mut agent, vec![started]).await,
        None
    );
    assert_eq!(env.state(next).await, Running);
    // A poll from the version it has is not answered with anything new either.
    assert_eq!(env.poll(&mut agent).await, handed);
    assert_eq!(agent.work_version.get(), Some(version));
}

#[tokio::test]
async fn a_running_list_from_before_a_handover_never_ends_a_cancelled_attempt() {
    let env = TestEnv::new().await;
    let mut agent = env.join("n1", 1).await;
    let (_, first) = env.running(&mut agent, ONE_CPU).await;
    let next = env.submit(ONE_CPU).await;
    // What a poll held open since then says: the version it had and what ran.
    let (stale_after, stale_running) = (agent.work_version.get(), vec![first]);

    // The first ends; the batch's answer hands the next to the node, which starts it.
    let handed = env
        .report_asking_work(&mut agent, vec![env.exited(first, 0)])
        .await
        .expect("the next task");
    let attempt = only(&handed);
    env.report(&agent, vec![env.started(attempt)]).await;
    env.control.cancel(next).await.unwrap();

    // The held poll is answered (the cancel changed the node's work) with its list from
    // before the handover, which lacks the next task's attempt: that says nothing of it.
    let (work, _) = env
        .control
        .poll_work(agent.node, stale_after, &stale_running)
        .await
        .unwrap();
    assert!(
        work.assignments.is_empty(),
        "the cancelled attempt is not desired"
    );
    assert_eq!(
        env.state(next).await,
        Running,
        "ended while the node may still run it"
    );
    assert_eq!(
        env.control.node_attempts.rank_of(agent.node, attempt),
        Some(0),
        "its last reports are still the node's to send"
    );

    // The agent applies that answer (it stops the attempt) and polls from it.
    agent.work_version.set(Some(work.version));
    agent.running.clear();
    env.poll(&mut agent).await;
    assert_eq!(env.state(next).await, Cancelled);
    let record = env.task(next).await;
    assert_eq!(record.reason.as_deref(), Some("cancelled by user"));
}
