//! A task is cancelled (by its user, or by `tcloud down --force` with its own reason): a
//! queued task ends at once; a placed one is withdrawn from its nodes and ends when their
//! agents confirm — at once when none of its nodes is up to confirm (`rules::cancel`).

use tacc_core::{TaskState, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;
use tacc_store::{TaskChange, TaskRecord, Transition};

use super::ending::on_attempt_finished;
use crate::control::effects::{Effects, FollowUp};
use crate::control::rules::cancel::{CancelPlan, plan_cancel};
use crate::control::{CANCELLED_BY_USER, Core, ServerConfig};

/// A cancel as the shell found it: the task's record as the store holds it.
#[derive(Debug)]
pub(crate) struct Cancel<'a> {
    pub record: TaskRecord,
    pub reason: &'a str,
    pub now: Timestamp,
    pub config: &'a ServerConfig,
}

pub(crate) fn on_cancel(core: &mut Core, fx: &mut Effects, cancel: Cancel<'_>) {
    let Cancel {
        mut record,
        reason,
        now,
        config,
    } = cancel;
    let task = record.id;
    // An attempt whose node is gone has nobody left to confirm the cancel.
    let placed_on_a_live_node = record.placements.iter().any(|p| {
        core.nodes
            .get(&p.node)
            .is_some_and(|n| n.online || n.expected)
    });
    match plan_cancel(record.state, record.cancel_requested, placed_on_a_live_node) {
        CancelPlan::EndQueued => {
            fx.change(TaskChange::Transition(Transition {
                reason: Some(reason.into()),
                ..Transition::new(
                    task,
                    TaskState::Queued,
                    TaskState::Cancelled,
                    record.attempt,
                    now,
                )
            }));
            fx.follow_up(FollowUp::StopDependents {
                record: Box::new(record),
                state: TaskState::Cancelled,
            });
            if core.withdraw(task) {
                fx.decide(Event::TaskCancelled(task));
            }
            fx.wake_logs(task);
        }
        CancelPlan::Withdraw { end_now } => {
            let requested = TaskChange::CancelRequested { task };
            // The end below, when there is one, sees the cancel as the store will.
            let _ = tacc_store::apply_transition(&mut record, &requested);
            fx.change(requested);
            if reason != CANCELLED_BY_USER {
                core.cancel_reasons.insert(task, reason.to_string());
            }
            let attempt = AttemptRef {
                task,
                attempt: record.attempt,
            };
            for (node, live) in core.nodes.iter_mut() {
                if live.assignments.remove(&attempt).is_some() {
                    live.cancelling.insert(attempt);
                    fx.wake(*node);
                }
            }
            if end_now {
                on_attempt_finished(
                    core,
                    fx,
                    config,
                    record,
                    &AttemptOutcome::Cancelled,
                    now,
                    None,
                );
            }
        }
        CancelPlan::Nothing => {}
    }
}
