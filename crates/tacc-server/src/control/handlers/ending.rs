//! An attempt ends: its outcome makes the task's state (`rules::ending`), the task is
//! retried after its backoff, requeued after a preemption, or leaves the queue for good;
//! its nodes stop whatever ranks still run, and the scheduler hears of the end.

use tacc_core::{TaskState, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;
use tacc_schema::RetrySpec;
use tacc_store::{TaskChange, TaskRecord, Transition};

use crate::control::effects::{Effects, FollowUp};
use crate::control::rules::ending::{self, AttemptEnd};
use crate::control::{Core, LiveNode, ServerConfig, request_of, retry};

/// An attempt's end as the shell found it: the task's record as the store holds it and
/// what ends it.
#[derive(Debug)]
pub(crate) struct End<'a> {
    pub record: TaskRecord,
    pub state: TaskState,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub at: Timestamp,
    /// The attempt was lost with its node (not stopped by the task itself).
    pub node_failure: bool,
    /// Retried as this says instead of the task's own `retry:` (a hung attempt whose
    /// `on_hang.then` is `retry`).
    pub retry_as: Option<RetrySpec>,
    /// Earlier attempts of the task lost with their node, where this end counts them
    /// (`rules::ending::counts_node_losses`; the shell reads them from the task's history).
    pub earlier_node_losses: u32,
    pub config: &'a ServerConfig,
}

/// End the attempt of `end.record` as `end.state`.
pub(crate) fn on_attempt_end(core: &mut Core, fx: &mut Effects, end: End<'_>) {
    let End {
        record,
        state,
        reason,
        exit_code,
        at,
        node_failure,
        retry_as,
        earlier_node_losses,
        config,
    } = end;
    let task = record.id;
    let attempt = AttemptRef {
        task,
        attempt: record.attempt,
    };
    core.preempting.remove(&task);
    core.cancel_reasons.remove(&task);
    core.finished_ranks.remove(&attempt);
    // A wait this attempt served is over (a retry below waits anew).
    core.retry_at.remove(&task);
    let spec = core.specs.get(&task).cloned();
    let plan = ending::plan_end(AttemptEnd {
        record: &record,
        policy: retry_as.as_ref().or(spec.as_ref().map(|s| &s.retry)),
        state,
        reason,
        exit_code,
        at,
        node_failure,
        earlier_node_losses,
        settings: &config.retry,
    });
    fx.changes.extend(plan.changes);
    let state = plan.state;
    if let Some(retry) = &plan.retry {
        fx.log_line(task, retry::attempt_marker(retry.next, &retry.cause));
    }
    withdraw_everywhere(core, fx, attempt);
    if plan.retry.is_none() {
        core.stage_deps.remove(&task);
        // Before the scheduler hears of the end: it would start dependents at once.
        if state != TaskState::Succeeded && state.is_terminal() {
            fx.follow_up(FollowUp::StopDependents {
                record: Box::new(record.clone()),
                state,
            });
        }
    }
    fx.decide(Event::TaskEnded(task));
    match (plan.retry, spec) {
        (Some(retry), Some(spec)) => {
            // Queued at once, so what depends on it keeps waiting, but placed no earlier
            // than the backoff allows (`release_due_retries` wakes it).
            core.retry_at.insert(task, retry.not_before);
            let group = core.group_for(config, &record.user);
            let request = request_of(&spec, &record, at, group);
            if core.nodes.values().any(LiveNode::schedulable) {
                fx.decide(Event::TaskSubmitted { task, request });
            } else {
                core.held.insert(task);
            }
        }
        _ => {
            core.specs.remove(&task);
        }
    }
    fx.wake_logs(task);
}

/// An attempt's process ended as `outcome` (the last rank of a gang, or the first to
/// fail); `blame` names the rank when the attempt had several. A preempted attempt that
/// stopped goes back to the queue; otherwise the attempt ends (see [`on_attempt_end`]).
pub(crate) fn on_attempt_finished(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    record: TaskRecord,
    outcome: &AttemptOutcome,
    at: Timestamp,
    blame: Option<String>,
) {
    let was_preempted = core.preempting.remove(&record.id);
    if was_preempted && *outcome == AttemptOutcome::Cancelled && !record.cancel_requested {
        return on_requeue_preempted(core, fx, record, at);
    }
    let (state, mut reason, exit_code) = ending::outcome_of(outcome, &record, blame);
    if state == TaskState::Cancelled
        && record.cancel_requested
        && let Some(why) = core.cancel_reasons.remove(&record.id)
    {
        reason = Some(why);
    }
    on_attempt_end(
        core,
        fx,
        End {
            record,
            state,
            reason,
            exit_code,
            at,
            node_failure: false,
            retry_as: None,
            // An attempt that finished was not lost with its node.
            earlier_node_losses: 0,
            config,
        },
    );
}

/// Why an attempt lost with its node ended, as its reason says it.
pub(crate) fn lost_reason(outcome: &AttemptOutcome) -> String {
    match outcome {
        AttemptOutcome::LaunchFailed { reason, message } => format!("{reason}: {message}"),
        other => format!("{other:?}"),
    }
}

/// An attempt's node vanished (lost, restarted, fenced, removed): the attempt is lost and
/// follows the retry policy — or, when a cancel was under way, it ends `cancelled`.
/// `earlier_node_losses` counts the task's earlier attempts lost with their node, where
/// the end counts them (the shell reads them from the task's history).
pub(crate) fn on_attempt_lost(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    record: TaskRecord,
    outcome: &AttemptOutcome,
    earlier_node_losses: u32,
    at: Timestamp,
) {
    let (state, reason) = if record.cancel_requested {
        let reason = core.cancel_reasons.remove(&record.id);
        (
            TaskState::Cancelled,
            reason.unwrap_or_else(|| crate::control::CANCELLED_BY_USER.to_string()),
        )
    } else {
        (TaskState::Lost, lost_reason(outcome))
    };
    on_attempt_end(
        core,
        fx,
        End {
            record,
            state,
            reason: Some(reason),
            exit_code: None,
            at,
            node_failure: true,
            retry_as: None,
            earlier_node_losses,
            config,
        },
    );
}

/// A preempted attempt has stopped: the task goes back to the queue as a new attempt.
pub(crate) fn on_requeue_preempted(
    core: &mut Core,
    fx: &mut Effects,
    record: TaskRecord,
    at: Timestamp,
) {
    let task = record.id;
    let reason = match core.requeue_reasons.remove(&task) {
        Some(why) => format!("{why} (attempt {})", record.attempt),
        None => format!("preempted during attempt {}", record.attempt),
    };
    fx.change(TaskChange::Transition(Transition {
        reason: Some(reason),
        ..Transition::new(
            task,
            record.state,
            TaskState::Queued,
            record.attempt.next(),
            at,
        )
    }));
    fx.log_line(
        task,
        retry::attempt_marker(record.attempt.next(), "preempted"),
    );
    let attempt = AttemptRef {
        task,
        attempt: record.attempt,
    };
    withdraw_everywhere(core, fx, attempt);
    fx.decide(Event::TaskPreempted(task));
    fx.wake_logs(task);
}

/// Take `attempt` out of every node's work; a node that still held a rank of it is woken,
/// so its agent stops the rank now (another rank ended the attempt).
fn withdraw_everywhere(core: &mut Core, fx: &mut Effects, attempt: AttemptRef) {
    for (node, live) in core.nodes.iter_mut() {
        if live.assignments.remove(&attempt).is_some() {
            fx.wake(*node);
        }
        live.cancelling.remove(&attempt);
    }
}
