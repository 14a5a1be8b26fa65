//! One decision over a queue of many identical tasks (the elements of an array) costs one
//! placement attempt, not one per task: once a task stayed queued without changing
//! anything the walk carries from task to task, the next task asking for exactly the
//! same thing, in the same state of the walk, would meet the same answer, so it gets that
//! answer without the placement search. Without this a 10,000-element array made every
//! decision search the cluster 10,000 times, and running it was quadratic.

use tacc_core::TaskId;

use super::Scheduler;
use super::pass::PassState;
use super::task::{Phase, TaskEntry};
use crate::PendingReason;

/// What the walk carries from task to task, and the cluster's occupancy: while it is
/// unchanged, equal requests get equal answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WalkState {
    blocked_head: Option<TaskId>,
    reservation: Option<TaskId>,
    claimants: usize,
    holds: usize,
    blocked_owner: Option<TaskId>,
    borrowing_sweep: bool,
    claims: usize,
    running: usize,
    preemptible_running: usize,
}

/// The answer a task got, reusable for its equals.
#[derive(Debug, Clone)]
pub(super) struct Repeat {
    like: TaskId,
    walk: WalkState,
    reason: PendingReason,
}

impl Repeat {
    /// The answer it gives.
    pub(super) fn reason(&self) -> &PendingReason {
        &self.reason
    }
}

/// Whether two queued tasks ask for exactly the same thing of the same accounts.
pub(super) fn same_request(a: &TaskEntry, b: &TaskEntry) -> bool {
    let (x, y) = (&a.request, &b.request);
    a.user == b.user
        && a.group == b.group
        && a.priority == b.priority
        && a.attempt == b.attempt
        && a.attained_gpu_ms == b.attained_gpu_ms
        && x.depends_on.is_empty()
        && y.depends_on.is_empty()
        && x.not_before.is_none()
        && y.not_before.is_none()
        && x.per_node == y.per_node
        && x.nodes == y.nodes
        && x.gpu_type == y.gpu_type
        && x.preemptible == y.preemptible
        && x.time_limit_secs == y.time_limit_secs
        && x.node_selector == y.node_selector
}

impl Scheduler {
    pub(super) fn walk_state(&self, pass: &PassState) -> WalkState {
        WalkState {
            blocked_head: pass.blocked_head,
            reservation: pass.reservation.as_ref().map(|r| r.task),
            claimants: pass.claimants,
            holds: pass.holds.len(),
            blocked_owner: pass.blocked_owner,
            borrowing_sweep: pass.borrowing_sweep,
            claims: self.claims.len(),
            running: self.running.len(),
            preemptible_running: self.preemptible_running,
        }
    }

    /// Give `task` the answer its equal got, if the walk is where it was then; true when
    /// it did (the task needs no further consideration in this decision).
    pub(super) fn repeat(
        &mut self,
        task: TaskId,
        pass: &PassState,
        repeat: &Option<Repeat>,
        actions: &mut Vec<crate::Action>,
    ) -> bool {
        let Some(repeat) = repeat.as_ref().filter(|_| self.walk_memos) else {
            return false;
        };
        if pass.waiting_claimants.contains(&task) || self.walk_state(pass) != repeat.walk {
            return false;
        }
        let (Some(entry), Some(like)) = (self.tasks.get(&task), self.tasks.get(&repeat.like))
        else {
            return false;
        };
        if !matches!(entry.phase, Phase::Queued { .. }) || !same_request(entry, like) {
            return false;
        }
        self.set_reason(task, repeat.reason.clone(), actions);
        true
    }

    /// Whether [`Scheduler::repeat`] would give `task` the answer `reason` now, without
    /// changing anything (see `queue_runs`: the task of a run holds that reason already).
    pub(super) fn would_repeat(
        &self,
        task: TaskId,
        reason: &PendingReason,
        pass: &PassState,
        repeat: &Option<Repeat>,
    ) -> bool {
        let Some(repeat) = repeat.as_ref().filter(|_| self.walk_memos) else {
            return false;
        };
        if repeat.reason != *reason
            || !pass.waiting_claimants.is_empty()
            || self.walk_state(pass) != repeat.walk
        {
            return false;
        }
        let (Some(entry), Some(like)) = (self.tasks.get(&task), self.tasks.get(&repeat.like))
        else {
            return false;
        };
        matches!(entry.phase, Phase::Queued { .. }) && same_request(entry, like)
    }

    /// After `task` was considered: the answer to reuse, when it stayed queued and the
    /// walk did not move (`before` is the walk before it was considered).
    pub(super) fn remember(
        &self,
        task: TaskId,
        before: WalkState,
        pass: &PassState,
    ) -> Option<Repeat> {
        let Phase::Queued {
            reason: Some(reason),
        } = &self.tasks.get(&task)?.phase
        else {
            return None;
        };
        (self.walk_state(pass) == before).then(|| Repeat {
            like: task,
            walk: before,
            reason: reason.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use crate::{Action, Event, Explanation, Scheduler, SchedulerConfig, TaskRequest};
    use tacc_core::{TaskId, Timestamp};

    /// An array's elements: the walk answers equal tasks alike (without searching the
    /// cluster for each), every policy, and starts them in order as room frees.
    #[test]
    fn identical_queued_tasks_wait_alike_and_start_in_order() {
        for policy in crate::policy_names() {
            if policy == "sjf" {
                continue;
            }
            let mut s = Scheduler::by_name(policy, SchedulerConfig::default()).unwrap();
            s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
            let events = (1..=200)
                .map(|id| Event::TaskSubmitted {
                    task: TaskId(id),
                    request: TaskRequest {
                        time_limit_secs: Some(60),
                        ..request(1, 0, 1, 1)
                    },
                })
                .collect();
            let plan = s.handle(Timestamp(1), Event::Batch(events)).unwrap();
            assert_eq!(
                started(&plan),
                (1..=4).map(TaskId).collect::<Vec<_>>(),
                "{policy}"
            );
            let waiting = plan
                .actions
                .iter()
                .filter(|a| matches!(a, Action::Pending { .. }))
                .count();
            assert_eq!(
                waiting, 196,
                "{policy}: every other element is told why it waits"
            );
            for id in 5..=200 {
                assert!(
                    matches!(s.explain(TaskId(id)), Explanation::Queued { .. }),
                    "{policy}: task {id}"
                );
            }
            let plan = s.handle(Timestamp(2), Event::TaskEnded(TaskId(2))).unwrap();
            assert_eq!(started(&plan), [TaskId(5)], "{policy}");
            s.check_invariants().unwrap();
        }
    }
}
