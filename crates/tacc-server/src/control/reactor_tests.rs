//! The task lifecycle driven through the handlers alone, synchronously
//! ([`ReactorEnv`]): each case drives events, then reads the changes the steps committed,
//! the nodes they woke, and checks the core holds nothing once the tasks ended. The same
//! cases run through the shell, the store and the commits in `lifecycle_tests.rs`.

use tacc_core::TaskState::*;
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_store::TaskChange;

use super::reactor_env::{HEARTBEAT, ReactorEnv};

const ONE_CPU: &str = "name: t\nresources: {cpus: 1}\nrun: true\n";

fn exited(code: i32) -> AttemptOutcome {
    AttemptOutcome::Exited { code }
}

/// The one assignment of a poll.
fn only(work: &[tacc_proto::Assignment]) -> AttemptRef {
    assert_eq!(work.len(), 1, "one assignment: {work:?}");
    work[0].attempt
}

#[test]
fn a_task_is_placed_started_and_succeeds_and_nothing_is_left() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    env.woken();
    let task = env.submit(ONE_CPU);
    assert_eq!(env.take_transitions(), [(task, Queued, Starting)]);
    assert_eq!(env.woken(), [n1], "the node is told of its new work");
    let attempt = only(&env.poll(n1, &[]));
    assert_eq!(attempt.task, task);
    env.started(attempt);
    assert_eq!(env.take_transitions(), [(task, Starting, Running)]);
    env.finished(n1, attempt, exited(0));
    assert_eq!(env.take_transitions(), [(task, Running, Succeeded)]);
    assert!(env.poll(n1, &[]).is_empty(), "nothing is left to run");
    env.emptiness_check();
}

#[test]
fn a_task_submitted_before_any_node_is_held_then_placed_when_one_registers() {
    let mut env = ReactorEnv::new();
    let task = env.submit(ONE_CPU);
    assert_eq!(env.take_transitions(), [], "held: no node to place it on");
    let n1 = env.register("n1", 1);
    assert_eq!(env.take_transitions(), [(task, Queued, Starting)]);
    let attempt = only(&env.poll(n1, &[]));
    env.finished(n1, attempt, exited(0));
    assert_eq!(env.state(task), Succeeded);
    env.emptiness_check();
}

#[test]
fn an_end_and_the_start_it_makes_room_for_are_one_step() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let first = env.submit(ONE_CPU);
    let second = env.submit(ONE_CPU);
    assert_eq!(env.state(second), Queued, "one CPU: the second waits");
    let attempt = only(&env.poll(n1, &[]));
    env.take_changes();
    env.woken();
    env.finished(n1, attempt, exited(0));
    assert_eq!(
        env.take_transitions(),
        [(first, Starting, Succeeded), (second, Queued, Starting)]
    );
    assert!(env.woken().iter().all(|n| *n == n1));
    let next = only(&env.poll(n1, &[]));
    assert_eq!(next.task, second);
    env.finished(n1, next, exited(0));
    env.emptiness_check();
}

#[test]
fn a_queued_cancel_ends_at_once_and_leaves_nothing() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let running = env.submit(ONE_CPU);
    let queued = env.submit(ONE_CPU);
    env.take_changes();
    env.cancel(queued);
    assert_eq!(env.take_transitions(), [(queued, Queued, Cancelled)]);
    assert_eq!(
        env.record(queued).reason.as_deref(),
        Some("cancelled by user")
    );
    let attempt = only(&env.poll(n1, &[]));
    env.finished(n1, attempt, exited(0));
    assert_eq!(env.state(running), Succeeded);
    env.emptiness_check();
}

#[test]
fn a_running_cancel_is_asked_of_the_node_and_ends_when_it_confirms() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let task = env.submit(ONE_CPU);
    let attempt = only(&env.poll(n1, &[]));
    env.started(attempt);
    env.take_changes();
    env.woken();
    env.cancel(task);
    assert!(
        matches!(env.take_changes()[..], [TaskChange::CancelRequested { task: t }] if t == task),
        "only the request is committed: the task runs until its agent stops it"
    );
    assert_eq!(env.woken(), [n1], "the node is told to stop it");
    assert_eq!(env.state(task), Running);
    assert!(
        env.poll(n1, &[attempt]).is_empty(),
        "the attempt is no longer the node's work"
    );
    assert_eq!(
        env.state(task),
        Running,
        "not ended before the agent confirms"
    );
    env.poll(n1, &[]);
    assert_eq!(env.take_transitions(), [(task, Running, Cancelled)]);
    env.emptiness_check();
}

#[test]
fn a_failed_attempt_is_retried_as_a_new_one_in_the_same_step() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let task = env.submit(
        "name: t\nresources: {cpus: 1}\nrun: true\nretry: {max_attempts: 2, on: [failed]}\n",
    );
    let first = only(&env.poll(n1, &[]));
    env.take_changes();
    env.finished(n1, first, exited(3));
    assert_eq!(
        env.take_transitions(),
        [
            (task, Starting, Failed),
            (task, Failed, Queued),
            (task, Queued, Starting)
        ],
        "the end, the retry and its placement: one step"
    );
    assert!(
        env.log_lines(task)
            .iter()
            .any(|line| line.starts_with("=== attempt 2")),
        "the log marks where the second attempt begins"
    );
    let second = only(&env.poll(n1, &[]));
    assert_eq!(second.attempt.0, 2);
    env.finished(n1, second, exited(0));
    assert_eq!(env.state(task), Succeeded);
    env.emptiness_check();
}

#[test]
fn a_gang_keeps_each_rank_s_end_and_succeeds_with_the_last() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let n2 = env.register("n2", 1);
    let task = env.submit("name: g\nresources: {nodes: 2, cpus: 1}\nrun: true\n");
    let attempt = only(&env.poll(n1, &[]));
    assert_eq!(
        only(&env.poll(n2, &[])),
        attempt,
        "one attempt on both nodes"
    );
    env.started(attempt);
    env.take_changes();
    env.woken();
    env.finished(n1, attempt, exited(0));
    assert!(
        matches!(env.take_changes()[..], [TaskChange::RankEnded(ref end)] if end.failure.is_none()),
        "the first rank's end is kept, the attempt goes on"
    );
    assert_eq!(env.woken(), [], "the other rank runs on undisturbed");
    assert_eq!(env.state(task), Running);
    env.finished(n2, attempt, exited(0));
    assert_eq!(env.state(task), Succeeded);
    env.emptiness_check();
}

#[test]
fn a_gang_s_first_failed_rank_ends_the_attempt_and_stops_the_others() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let n2 = env.register("n2", 1);
    let task = env.submit("name: g\nresources: {nodes: 2, cpus: 1}\nrun: true\n");
    let attempt = only(&env.poll(n1, &[]));
    env.poll(n2, &[]);
    env.started(attempt);
    env.woken();
    env.finished(n2, attempt, exited(7));
    let record = env.record(task);
    assert_eq!(record.state, Failed);
    assert!(
        record.reason.as_deref().is_some_and(|r| r.contains("n2")),
        "the reason names the rank that failed: {record:?}"
    );
    assert!(
        env.woken().contains(&n1),
        "the node still running its rank is told to stop it"
    );
    assert!(env.poll(n1, &[attempt]).is_empty());
    env.finished(n1, attempt, AttemptOutcome::Cancelled);
    assert_eq!(env.state(task), Failed, "the first failure stands");
    env.emptiness_check();
}

#[test]
fn a_silent_node_goes_down_and_its_attempt_is_lost() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let task = env.submit(ONE_CPU);
    let attempt = only(&env.poll(n1, &[]));
    env.started(attempt);
    let n2 = env.register("n2", 1);
    env.take_changes();
    // n1 falls silent; n2 keeps polling.
    env.pass_seconds(HEARTBEAT.as_secs() - 1, &[(n2, vec![])]);
    assert_eq!(
        env.take_transitions(),
        [],
        "still within the heartbeat timeout"
    );
    env.pass_seconds(2, &[(n2, vec![])]);
    let record = env.record(task);
    assert_eq!(record.state, Lost);
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("node_lost")),
        "{record:?}"
    );
    env.emptiness_check();
}

#[test]
fn a_drained_node_finishes_what_it_runs_and_takes_nothing_new_until_resumed() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let first = env.submit(ONE_CPU);
    let attempt = only(&env.poll(n1, &[]));
    env.drain(n1, true);
    let second = env.submit(ONE_CPU);
    env.finished(n1, attempt, exited(0));
    assert_eq!(env.state(first), Succeeded, "what it ran finishes");
    assert_eq!(
        env.state(second),
        Queued,
        "nothing new lands on a drained node"
    );
    assert!(env.poll(n1, &[]).is_empty());
    env.take_changes();
    env.drain(n1, false);
    assert_eq!(env.take_transitions(), [(second, Queued, Starting)]);
    let next = only(&env.poll(n1, &[]));
    env.finished(n1, next, exited(0));
    env.emptiness_check();
}

#[test]
fn a_node_still_running_work_cannot_be_removed_and_a_down_one_loses_its_attempts() {
    let mut env = ReactorEnv::new();
    let n1 = env.register("n1", 1);
    let n2 = env.register("n2", 1);
    let task = env.submit(ONE_CPU);
    let attempt = only(&env.poll(n1, &[]));
    env.started(attempt);
    assert_eq!(env.remove(n1), Err(1), "it is up and runs one task");
    env.pass_seconds(
        HEARTBEAT.as_secs() + 1,
        &[(n1, vec![attempt]), (n2, vec![])],
    );
    assert_eq!(env.state(task), Running, "a node that polls stays up");
    // n1's agent dies with the task's process: the node falls silent and goes down.
    env.pass_seconds(HEARTBEAT.as_secs() + 1, &[(n2, vec![])]);
    assert_eq!(env.state(task), Lost);
    assert_eq!(env.remove(n1), Ok(()), "a down node is removed");
    assert!(!env.core.nodes.contains_key(&n1));
    env.emptiness_check();
}
