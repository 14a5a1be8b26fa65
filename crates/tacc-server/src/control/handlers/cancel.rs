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
            // A sweep's trial stopped early keeps the reason it was stopped with (set just
            // before the cancel), as a running one does when it ends (`rules::ending`).
            let reason = match &record.reason {
                Some(early) if early.starts_with(crate::asha::EARLY_STOPPED) => early.clone(),
                _ => reason.to_string(),
            };
            fx.change(TaskChange::Transition(Transition {
                reason: Some(reason),
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

/// Cancel every unfinished element of a group at once (`records`: its open elements, as
/// the store holds them): the queued ones end now, in one scheduling decision, and their
/// pipeline dependents are seen to; the placed ones are withdrawn as single tasks are.
/// Returns how many were asked to stop.
pub(crate) fn on_cancel_group(
    core: &mut Core,
    fx: &mut Effects,
    records: Vec<TaskRecord>,
    now: Timestamp,
    config: &ServerConfig,
) -> u64 {
    let count = records.len() as u64;
    let (queued, placed): (Vec<TaskRecord>, Vec<TaskRecord>) = records
        .into_iter()
        .partition(|t| t.state == TaskState::Queued);
    let mut events = Vec::new();
    for record in &queued {
        fx.change(TaskChange::Transition(Transition {
            reason: Some(CANCELLED_BY_USER.into()),
            ..Transition::new(
                record.id,
                TaskState::Queued,
                TaskState::Cancelled,
                record.attempt,
                now,
            )
        }));
        if core.withdraw(record.id) {
            events.push(Event::TaskCancelled(record.id));
        }
        fx.wake_logs(record.id);
    }
    // The elements are one stage: its dependents are seen to once.
    if let Some(first) = queued.into_iter().next() {
        fx.follow_up(FollowUp::StopDependents {
            record: Box::new(first),
            state: TaskState::Cancelled,
        });
    }
    if !events.is_empty() {
        fx.decide(Event::Batch(events));
    }
    for record in placed {
        on_cancel(
            core,
            fx,
            Cancel {
                record,
                reason: CANCELLED_BY_USER,
                now,
                config,
            },
        );
    }
    count
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tacc_core::{AttemptNo, NodeId, TaskId};

    use super::*;
    use crate::control::rules::polls::tests::assignment;
    use crate::control::rules::test_node;

    fn record(state: TaskState) -> TaskRecord {
        let placed: &[u64] = if state == TaskState::Queued {
            &[]
        } else {
            &[1]
        };
        crate::control::rules::test_record(1, state, 1, placed)
    }

    /// A core with node 1 running task 1's attempt (online or not).
    fn core(online: bool) -> Core {
        let scheduler = tacc_scheduler::Scheduler::by_name("fifo", Default::default()).unwrap();
        let mut core = Core::new(scheduler, Instant::now());
        let mut live = test_node(1, Instant::now());
        live.online = online;
        live.assignments.insert(attempt(), assignment(1));
        core.nodes.insert(NodeId(1), live);
        core
    }

    fn attempt() -> AttemptRef {
        AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        }
    }

    fn cancel(core: &mut Core, record: TaskRecord, reason: &str) -> Effects {
        let config = ServerConfig::new(std::env::temp_dir());
        let mut fx = Effects::default();
        on_cancel(
            core,
            &mut fx,
            Cancel {
                record,
                reason,
                now: Timestamp(9),
                config: &config,
            },
        );
        fx
    }

    #[test]
    fn a_running_task_is_withdrawn_and_its_node_woken_and_it_ends_when_confirmed() {
        let mut core = core(true);
        let fx = cancel(&mut core, record(TaskState::Running), CANCELLED_BY_USER);
        assert!(matches!(
            fx.changes[..],
            [TaskChange::CancelRequested { .. }]
        ));
        assert_eq!(fx.woken.iter().copied().collect::<Vec<_>>(), [NodeId(1)]);
        assert!(fx.decide.is_empty(), "the scheduler hears once it ended");
        let live = &core.nodes[&NodeId(1)];
        assert!(live.assignments.is_empty());
        assert!(live.cancelling.contains(&attempt()));
        assert!(
            core.cancel_reasons.is_empty(),
            "a user's cancel needs no reason kept"
        );
    }

    #[test]
    fn with_no_node_up_to_confirm_it_ends_at_once_with_the_reason_given() {
        let mut core = core(false);
        let fx = cancel(&mut core, record(TaskState::Running), "cluster stopped");
        let [
            TaskChange::CancelRequested { .. },
            TaskChange::Transition(end),
        ] = &fx.changes[..]
        else {
            panic!("{:?}", fx.changes);
        };
        assert_eq!(end.to, TaskState::Cancelled);
        assert_eq!(end.reason.as_deref(), Some("cluster stopped"));
        assert!(matches!(fx.decide[..], [Event::TaskEnded(TaskId(1))]));
        assert!(core.cancel_reasons.is_empty() && core.nodes[&NodeId(1)].assignments.is_empty());
    }

    #[test]
    fn a_queued_task_ends_now_and_its_dependents_are_seen_to() {
        let mut core = core(true);
        core.specs.insert(TaskId(1), serde_yaml_spec());
        let fx = cancel(&mut core, record(TaskState::Queued), CANCELLED_BY_USER);
        let [TaskChange::Transition(end)] = &fx.changes[..] else {
            panic!("{:?}", fx.changes);
        };
        assert_eq!(
            (end.from, end.to),
            (TaskState::Queued, TaskState::Cancelled)
        );
        assert!(matches!(fx.decide[..], [Event::TaskCancelled(TaskId(1))]));
        assert!(matches!(
            fx.follow_ups[..],
            [FollowUp::StopDependents {
                state: TaskState::Cancelled,
                ..
            }]
        ));
        assert!(core.specs.is_empty());
    }

    #[test]
    fn an_ended_task_or_a_second_cancel_changes_nothing() {
        let mut core = core(true);
        assert!(cancel(&mut core, record(TaskState::Succeeded), CANCELLED_BY_USER).is_empty());
        let mut asked = record(TaskState::Running);
        asked.cancel_requested = true;
        assert!(cancel(&mut core, asked, CANCELLED_BY_USER).is_empty());
    }

    fn serde_yaml_spec() -> tacc_schema::TaskSpec {
        tacc_schema::parse_task("t.yaml", "name: t\nresources: {cpus: 1}\nrun: true\n")
            .expect("a task spec")
            .0
    }
}
