//! How an attempt ends: what its outcome makes of the task (state, reason, exit code),
//! and whether the task is retried — by its `retry:` policy, after a backoff, up to the
//! crash limit for a task whose attempts keep taking their node down. The decision is
//! the store changes to commit, in order, and the retry to arrange.

use tacc_core::{AttemptNo, TaskState, Timestamp};
use tacc_proto::AttemptOutcome;
use tacc_schema::{RetryOn, RetrySpec};
use tacc_store::{TaskChange, TaskRecord, Transition};

use crate::control::retry::{self, RetrySettings};

/// What an attempt's outcome makes of its task: state, reason and exit code. A cancel
/// the user asked for wins over how the process ended; `blame` names the rank whose end
/// it was when the attempt had several.
pub(in crate::control) fn outcome_of(
    outcome: &AttemptOutcome,
    record: &TaskRecord,
    blame: Option<String>,
) -> (TaskState, Option<String>, Option<i32>) {
    let (state, reason, exit_code) = match outcome {
        _ if record.cancel_requested => {
            (TaskState::Cancelled, Some("cancelled by user".into()), None)
        }
        AttemptOutcome::Cancelled => (TaskState::Cancelled, Some("cancelled".into()), None),
        AttemptOutcome::Exited { code: 0 } => (TaskState::Succeeded, None, Some(0)),
        AttemptOutcome::Exited { code } => (
            TaskState::Failed,
            Some(format!("exit code {code}")),
            Some(*code),
        ),
        AttemptOutcome::Signalled { signal } => (
            TaskState::Failed,
            Some(format!("killed by signal {signal}")),
            Some(128 + signal),
        ),
        AttemptOutcome::TimeLimit => (TaskState::Failed, Some("time limit reached".into()), None),
        AttemptOutcome::LaunchFailed { reason, message } => (
            TaskState::Failed,
            Some(format!("{reason}: {message}")),
            None,
        ),
    };
    let reason = match (state, blame, reason) {
        (TaskState::Failed, Some(blame), Some(reason)) => {
            Some(format!("{blame}: {reason}; the other ranks were stopped"))
        }
        // A sweep's trial stopped early keeps the reason it was stopped with.
        (TaskState::Cancelled, _, _)
            if record
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(crate::asha::EARLY_STOPPED)) =>
        {
            record.reason.clone()
        }
        (_, _, reason) => reason,
    };
    (state, reason, exit_code)
}

/// An attempt's end, as the shell found it.
#[derive(Debug)]
pub(in crate::control) struct AttemptEnd<'a> {
    pub record: &'a TaskRecord,
    /// The task's retry policy (none once its spec is forgotten).
    pub policy: Option<&'a RetrySpec>,
    pub state: TaskState,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub at: Timestamp,
    /// The attempt was lost with its node (not stopped by the task itself).
    pub node_failure: bool,
    /// Earlier attempts of the task lost with their node (see [`counts_node_losses`]).
    pub earlier_node_losses: u32,
    /// The operator's backoff and crash limit.
    pub settings: &'a RetrySettings,
}

/// A retry to arrange: attempt `next` is queued now and placed no earlier than
/// `not_before`; its log section opens with `cause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::control) struct Retry {
    pub next: AttemptNo,
    pub not_before: Timestamp,
    pub cause: String,
}

/// The decision on an attempt's end.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::control) struct EndPlan {
    /// Committed together, in order.
    pub changes: Vec<TaskChange>,
    /// Where the attempt ended (before any retry queued the task again).
    pub state: TaskState,
    pub retry: Option<Retry>,
}

/// Whether deciding this end needs the count of the task's earlier node losses (which
/// the shell reads from the task's events only then).
/// An attempt its own agent stopped with no cancel asked and no preemption under way: the
/// agent was shutting down (a new `taccd dev` stopping the embedded agent of a server
/// with other settings, an operator's stop). That is the node failing, not the task nor
/// its user: the attempt is lost — with the reason returned — and follows the retry
/// policy, never `cancelled`.
pub(in crate::control) fn stopped_by_its_agent(
    outcome: &AttemptOutcome,
    record: &TaskRecord,
    preempting: bool,
    node: &str,
) -> Option<AttemptOutcome> {
    (*outcome == AttemptOutcome::Cancelled && !record.cancel_requested && !preempting).then(|| {
        AttemptOutcome::LaunchFailed {
            reason: "agent_stopped".into(),
            message: format!(
                "the agent on node {node} stopped the attempt as it shut down (no cancel was asked)"
            ),
        }
    })
}

pub(in crate::control) fn counts_node_losses(state: TaskState, reason: Option<&str>) -> bool {
    state == TaskState::Lost && retry::crashed_node(reason)
}

pub(in crate::control) fn plan_end(end: AttemptEnd<'_>) -> EndPlan {
    let record = end.record;
    let wanted = end.policy.filter(|policy| {
        let wanted = match end.state {
            TaskState::Failed => policy.on.contains(&RetryOn::Failed),
            TaskState::Lost => {
                policy.on.contains(&RetryOn::Lost)
                    || (end.node_failure && policy.on.contains(&RetryOn::NodeFailure))
            }
            _ => false,
        };
        wanted && record.attempt.0 < policy.max_attempts
    });
    let losses = if counts_node_losses(end.state, end.reason.as_deref()) {
        end.earlier_node_losses + 1
    } else {
        0
    };
    // A task whose attempts keep taking their node down fails instead of taking down
    // node after node.
    let (state, reason, policy) = match wanted {
        Some(_) if losses >= end.settings.crash_limit => (
            TaskState::Failed,
            Some(retry::crash_limit_reason(losses)),
            None,
        ),
        policy => (end.state, end.reason, policy),
    };
    let mut changes = vec![TaskChange::Transition(Transition {
        reason: reason.clone(),
        exit_code: end.exit_code,
        ..Transition::new(record.id, record.state, state, record.attempt, end.at)
    })];
    let retry = policy.map(|policy| {
        let next = record.attempt.next();
        let delay = end.settings.backoff(record.attempt);
        changes.push(TaskChange::Transition(Transition {
            reason: Some(retry::retrying_reason(delay, next, policy.max_attempts)),
            ..Transition::new(record.id, state, TaskState::Queued, next, end.at)
        }));
        let cause = match state {
            TaskState::Lost => reason.clone().unwrap_or_else(|| "lost".into()),
            _ => state.as_str().to_string(),
        };
        Retry {
            next,
            not_before: Timestamp(end.at.0.saturating_add(delay.as_millis() as u64)),
            cause,
        }
    });
    EndPlan {
        changes,
        state,
        retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: TaskState, attempt: u32) -> TaskRecord {
        crate::control::rules::test_record(7, state, attempt, &[])
    }

    #[test]
    fn an_attempt_its_agent_stopped_unasked_is_lost_not_cancelled() {
        let running = record(TaskState::Running, 1);
        let cancelling = TaskRecord {
            cancel_requested: true,
            ..record(TaskState::Running, 1)
        };
        let cancelled = AttemptOutcome::Cancelled;
        let lost = stopped_by_its_agent(&cancelled, &running, false, "n1");
        assert!(
            matches!(&lost, Some(AttemptOutcome::LaunchFailed { reason, message })
                if reason == "agent_stopped" && message.contains("node n1")),
            "{lost:?}"
        );
        for (outcome, record, preempting, why) in [
            (&cancelled, &cancelling, false, "its user asked: a cancel"),
            (&cancelled, &running, true, "a preemption: requeued"),
            (
                &AttemptOutcome::Exited { code: 0 },
                &running,
                false,
                "it ended by itself",
            ),
            (&AttemptOutcome::TimeLimit, &running, false, "its own limit"),
        ] {
            assert_eq!(
                stopped_by_its_agent(outcome, record, preempting, "n1"),
                None,
                "{why}"
            );
        }
    }

    fn policy(on: &[RetryOn], max_attempts: u32) -> RetrySpec {
        RetrySpec {
            max_attempts,
            on: on.to_vec(),
        }
    }

    fn end<'a>(
        record: &'a TaskRecord,
        policy: Option<&'a RetrySpec>,
        state: TaskState,
        reason: &str,
        node_failure: bool,
        earlier_node_losses: u32,
    ) -> AttemptEnd<'a> {
        AttemptEnd {
            record,
            policy,
            state,
            reason: Some(reason.to_string()),
            exit_code: None,
            at: Timestamp(10_000),
            node_failure,
            earlier_node_losses,
            settings: &DEFAULTS,
        }
    }

    const DEFAULTS: RetrySettings = RetrySettings {
        backoff: std::time::Duration::from_secs(5),
        backoff_max: std::time::Duration::from_secs(300),
        crash_limit: 3,
    };

    /// The plan for an attempt that exited with code 1.
    fn failed(record: &TaskRecord, policy: &RetrySpec) -> EndPlan {
        plan_end(end(
            record,
            Some(policy),
            TaskState::Failed,
            "exit code 1",
            false,
            0,
        ))
    }

    /// The plan for an attempt lost with `reason`, with its node or not.
    fn lost(
        record: &TaskRecord,
        policy: &RetrySpec,
        reason: &str,
        node_failure: bool,
        earlier_node_losses: u32,
    ) -> EndPlan {
        let end = end(
            record,
            Some(policy),
            TaskState::Lost,
            reason,
            node_failure,
            earlier_node_losses,
        );
        plan_end(end)
    }

    fn states(plan: &EndPlan) -> Vec<(TaskState, TaskState, u32)> {
        plan.changes
            .iter()
            .map(|c| match c {
                TaskChange::Transition(t) => (t.from, t.to, t.attempt.0),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_user_s_cancel_wins_over_how_the_process_ended() {
        let mut running = record(TaskState::Running, 1);
        running.cancel_requested = true;
        let (state, reason, code) = outcome_of(&AttemptOutcome::Exited { code: 0 }, &running, None);
        assert_eq!(
            (state, reason.as_deref(), code),
            (TaskState::Cancelled, Some("cancelled by user"), None)
        );
    }

    #[test]
    fn a_failed_rank_is_named_and_a_signal_is_an_exit_code() {
        let running = record(TaskState::Running, 1);
        let (state, reason, code) = outcome_of(
            &AttemptOutcome::Signalled { signal: 9 },
            &running,
            Some("rank 3 (node n2)".into()),
        );
        assert_eq!(state, TaskState::Failed);
        assert_eq!(code, Some(137));
        assert_eq!(
            reason.as_deref(),
            Some("rank 3 (node n2): killed by signal 9; the other ranks were stopped")
        );
    }

    #[test]
    fn an_early_stopped_trial_keeps_its_reason() {
        let mut trial = record(TaskState::Running, 1);
        trial.reason = Some(format!("{} at step 4", crate::asha::EARLY_STOPPED));
        let (state, reason, _) = outcome_of(&AttemptOutcome::Cancelled, &trial, None);
        assert_eq!(state, TaskState::Cancelled);
        assert_eq!(reason, trial.reason);
    }

    #[test]
    fn an_end_without_a_wanted_retry_is_one_transition() {
        let running = record(TaskState::Running, 1);
        let only_lost = policy(&[RetryOn::Lost], 3);
        let plan = failed(&running, &only_lost);
        assert_eq!(states(&plan), [(TaskState::Running, TaskState::Failed, 1)]);
        assert_eq!(plan.retry, None);
    }

    #[test]
    fn a_wanted_retry_queues_the_next_attempt_after_its_backoff() {
        let running = record(TaskState::Running, 2);
        let on_failed = policy(&[RetryOn::Failed], 3);
        let plan = failed(&running, &on_failed);
        assert_eq!(
            states(&plan),
            [
                (TaskState::Running, TaskState::Failed, 2),
                (TaskState::Failed, TaskState::Queued, 3)
            ]
        );
        let retry = plan.retry.unwrap();
        assert_eq!(retry.next, AttemptNo(3));
        assert_eq!(
            retry.not_before,
            Timestamp(20_000),
            "10 s after the second attempt"
        );
        assert_eq!(retry.cause, "failed");
        let TaskChange::Transition(queued) = &plan.changes[1] else {
            unreachable!()
        };
        assert_eq!(
            queued.reason.as_deref(),
            Some("retrying in 10s (attempt 3 of 3)")
        );
    }

    #[test]
    fn the_last_allowed_attempt_is_not_retried() {
        let running = record(TaskState::Running, 3);
        let on_failed = policy(&[RetryOn::Failed], 3);
        let plan = failed(&running, &on_failed);
        assert_eq!(plan.retry, None);
    }

    #[test]
    fn node_failure_retries_only_losses_with_the_node() {
        let running = record(TaskState::Running, 1);
        let on_node = policy(&[RetryOn::NodeFailure], 3);
        let by_node = lost(&running, &on_node, "node_lost: gone", true, 0);
        assert_eq!(by_node.retry.unwrap().cause, "node_lost: gone");
        let other = lost(&running, &on_node, "lost", false, 0);
        assert_eq!(other.retry, None);
    }

    #[test]
    fn the_third_crash_of_a_node_fails_the_task() {
        let running = record(TaskState::Running, 3);
        let on_node = policy(&[RetryOn::NodeFailure], 10);
        let second = lost(&running, &on_node, "node_restarted: x", true, 1);
        assert!(second.retry.is_some());
        let third = lost(&running, &on_node, "node_restarted: x", true, 2);
        assert_eq!(third.state, TaskState::Failed);
        assert_eq!(third.retry, None);
        let TaskChange::Transition(failed) = &third.changes[0] else {
            unreachable!()
        };
        assert!(
            failed
                .reason
                .as_deref()
                .unwrap()
                .starts_with("crash_limit:")
        );
        // A removed node is no crash of the task's.
        let removed = lost(&running, &on_node, "node_removed: x", true, 5);
        assert!(removed.retry.is_some());
    }

    #[test]
    fn the_operator_s_settings_space_retries_and_limit_crashes() {
        assert_eq!(DEFAULTS, RetrySettings::default());
        let settings = RetrySettings {
            backoff: std::time::Duration::from_secs(2),
            backoff_max: std::time::Duration::from_secs(7),
            crash_limit: 1,
        };
        let on_node = policy(&[RetryOn::NodeFailure, RetryOn::Failed], 10);
        // 2 s, then 4 s, then capped at 7 s.
        for (attempt, after) in [(1, 12_000), (2, 14_000), (3, 17_000), (9, 17_000)] {
            let running = record(TaskState::Running, attempt);
            let plan = plan_end(AttemptEnd {
                settings: &settings,
                ..end(
                    &running,
                    Some(&on_node),
                    TaskState::Failed,
                    "exit code 1",
                    false,
                    0,
                )
            });
            assert_eq!(
                plan.retry.unwrap().not_before,
                Timestamp(after),
                "attempt {attempt}"
            );
        }
        // The first crash already reaches a limit of one.
        let running = record(TaskState::Running, 1);
        let crashed = plan_end(AttemptEnd {
            settings: &settings,
            ..end(
                &running,
                Some(&on_node),
                TaskState::Lost,
                "node_lost: x",
                true,
                0,
            )
        });
        assert_eq!(crashed.state, TaskState::Failed);
        assert_eq!(crashed.retry, None);
    }
}
