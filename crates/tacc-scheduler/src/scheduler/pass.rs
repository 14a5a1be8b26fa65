//! One scheduling decision: settle the open claims, then walk the queue in rank order and
//! start every task that is ready (its dependencies gone), admitted (within limits), not
//! held back (by strict order, a claim, or an owner waiting for its guarantee) and fits
//! without delaying the reservation. A task that waits gets a pending reason, reported
//! only when it changes; the first blocked task may get a reservation (`backfill`) or
//! claim capacity by preemption (`preemption`).

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{NodeId, TaskId, Timestamp};

use super::backfill::Reservation;
use super::claims::Hold;
use super::repeats::Repeat;
use super::task::Phase;
use super::unfit_shapes::UnfitShapes;
use super::{Action, QueueKey, Scheduler};
use crate::PendingReason;
use crate::policy::Backfill;

/// What one decision carries from task to task.
#[derive(Debug, Default)]
pub(super) struct PassState {
    pub blocked_head: Option<TaskId>,
    pub reservation: Option<Reservation>,
    pub claimants: usize,
    /// Nodes held by claims (claims never share a node).
    pub holds: BTreeMap<NodeId, Hold>,
    /// Claimants still waiting after the claims were settled; the walk only keeps their
    /// place in line.
    pub waiting_claimants: BTreeSet<TaskId>,
    /// The first blocked task that stays within its group's guarantee.
    pub blocked_owner: Option<TaskId>,
    pub borrowing_sweep: bool,
    /// Answers of this decision by shape (see `unfit_shapes`).
    pub unfit: UnfitShapes,
}

impl Scheduler {
    /// One scheduling decision over the whole queue. When groups have guarantees, tasks
    /// that stay within their group's guarantee go first and borrowing tasks second (as
    /// in Kueue), so reclaimed capacity goes to its owner, not back to a borrower.
    pub(super) fn schedule(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        self.refresh_ranks(now);
        self.reservation = None;
        let mut pass = PassState::default();
        if !self.claims.is_empty() {
            self.settle_claims(now, &mut pass, actions);
        }
        let guarantees = self.groups.iter().any(|g| g.guaranteed_gpus > 0);
        if !guarantees {
            self.walk_by_runs(now, &mut pass, actions);
            return;
        }
        let mut repeat = None;
        let order: Vec<QueueKey> = self.queue.iter().copied().collect();
        let mut deferred = Vec::new();
        for key in order {
            if self.within_guarantee(&self.tasks[&key.task]) {
                self.consider_or_repeat(now, &key, &mut pass, &mut repeat, actions);
            } else {
                deferred.push(key);
            }
        }
        pass.borrowing_sweep = true;
        repeat = None;
        for key in &deferred {
            if self
                .tasks
                .get(&key.task)
                .is_some_and(|e| e.phase.is_queued())
            {
                self.consider_or_repeat(now, key, &mut pass, &mut repeat, actions);
            }
        }
    }

    /// [`Scheduler::consider`], unless an equal task just got an answer this one would
    /// get too (see [`super::repeats`]), or, in a quiet decision, a task of its shape was
    /// just found not to fit (see [`super::unfit_shapes`]).
    fn consider_or_repeat(
        &mut self,
        now: Timestamp,
        key: &QueueKey,
        pass: &mut PassState,
        repeat: &mut Option<Repeat>,
        actions: &mut Vec<Action>,
    ) {
        if self.passes_over(now, key, pass) || self.repeat(key.task, pass, repeat, actions) {
            return;
        }
        self.consider_and_remember(now, key.task, pass, repeat, actions);
    }

    /// [`Scheduler::consider`] the task; `repeat` becomes the answer it got, when that
    /// answer is reusable for its equals.
    pub(super) fn consider_and_remember(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        repeat: &mut Option<Repeat>,
        actions: &mut Vec<Action>,
    ) {
        let before = self.walk_state(pass);
        let waiting_claimant = pass.waiting_claimants.contains(&task);
        self.consider(now, task, pass, actions);
        *repeat = if waiting_claimant {
            None
        } else {
            self.remember(task, before, pass)
        };
    }

    /// Record why the queued task waits; `actions` hears of it only when the reason changes.
    pub(super) fn set_reason(
        &mut self,
        task: TaskId,
        reason: PendingReason,
        actions: &mut Vec<Action>,
    ) {
        if let Some(entry) = self.tasks.get_mut(&task)
            && let Phase::Queued { reason: last } = &mut entry.phase
            && last.as_ref() != Some(&reason)
        {
            *last = Some(reason.clone());
            // A run holds tasks told one reason: this one leaves its run (`queue_runs`).
            let key = entry.queue_key(task);
            self.runs.cut(&self.queue, &key);
            actions.push(Action::Pending { task, reason });
        }
    }

    fn consider(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        if pass.waiting_claimants.contains(&task) {
            // Settled already; it only keeps its place in line.
            self.note_blocked(now, task, pass);
            return;
        }
        let entry = &self.tasks[&task];
        // A retry waiting out its backoff holds nothing up and takes nothing yet.
        if let Some(until) = entry.request.not_before.filter(|until| *until > now) {
            self.set_reason(task, PendingReason::Backoff { until }, actions);
            return;
        }
        if let Some(dep) = entry
            .request
            .depends_on
            .iter()
            .find(|d| self.tasks.contains_key(d))
        {
            let reason = PendingReason::Dependency { on: *dep };
            self.set_reason(task, reason, actions);
            return;
        }
        if let (Backfill::None, Some(head)) = (self.policy.backfill, pass.blocked_head) {
            self.set_reason(
                task,
                PendingReason::BehindOlderTask { blocked_by: head },
                actions,
            );
            return;
        }
        let admitted = self
            .policy
            .admission
            .admit(&self.view(now, task, entry), &self.quota_view(entry));
        if let Err(reason) = admitted {
            self.set_reason(task, reason, actions);
            return;
        }
        if !self.claims.is_empty()
            && let Some(claimant) = self.quota_held(now, task, u64::MAX)
        {
            let reason = PendingReason::LowerPriority {
                blocked_by: claimant,
            };
            self.set_reason(task, reason, actions);
            return;
        }
        if pass.borrowing_sweep
            && self.policy.backfill == Backfill::Greedy
            && let Some(owner) = pass.blocked_owner
        {
            // Greedy policies have no reservation: hold borrowers while an owner waits.
            self.set_reason(
                task,
                PendingReason::LowerPriority { blocked_by: owner },
                actions,
            );
            return;
        }
        if let Some(reason) = self.unfit_answer(now, task, pass) {
            self.set_reason(task, reason, actions);
            return;
        }
        let before = self.walk_state(pass);
        if let Some(reason) = self.fit_or_wait(now, task, pass, actions) {
            self.remember_unfit(now, task, before, reason, pass);
        }
    }

    /// The admitted `task` starts if it fits, or waits: the reason it waits, if it does.
    /// What happens here depends only on what the task asks of the nodes and on the walk
    /// (see [`super::unfit_shapes`]).
    fn fit_or_wait(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) -> Option<PendingReason> {
        let request = &self.tasks[&task].request;
        if let Some(placements) = self.place_around(now, request, pass) {
            Self::backfilled(now, request, &self.config, &placements, pass);
            self.start(now, task, placements, Some(actions));
            return None;
        }
        // Too few nodes carry its labels: nothing running or reserved stands in its way,
        // so it neither holds up the queue nor claims anything.
        let reason = if let Some(detail) = self.cluster.selector_unmet(request) {
            PendingReason::NoMatchingNode { detail }
        } else if request.wait_for_capacity
            && let Some(detail) = self.cluster.never_fits(request)
        {
            // Submitted to wait for a node that can hold it: no preemption or reservation
            // would help, so like the above it waits aside.
            PendingReason::WaitingForCapacity { detail }
        } else if let Some(blocked_by) = self.held_for_another(request, pass) {
            if self.policy.backfill == Backfill::None {
                pass.blocked_head.get_or_insert(task);
            }
            PendingReason::LowerPriority { blocked_by }
        } else {
            // Under EASY only the reserved head claims: a task behind it could not use
            // what its victims free, and the victims would restart at once. For the same
            // reason a borrowing task never claims: owners, considered first, would take
            // the room. A claimant must be admitted alongside the older claimants (claims
            // hold quota), and its victims' share is then held for it until it starts
            // (see `Claim`).
            if self.would_claim(now, task, pass) {
                pass.claimants += 1;
                self.try_preempt(now, task, pass, actions);
            }
            self.note_blocked(now, task, pass);
            PendingReason::WaitingForResources
        };
        self.set_reason(task, reason.clone(), actions);
        Some(reason)
    }

    /// Bookkeeping for a task that waits for resources in this decision.
    pub(super) fn note_blocked(&mut self, now: Timestamp, task: TaskId, pass: &mut PassState) {
        if !pass.borrowing_sweep && pass.blocked_owner.is_none() {
            pass.blocked_owner = Some(task);
        }
        match self.policy.backfill {
            Backfill::None => {
                pass.blocked_head.get_or_insert(task);
            }
            Backfill::Greedy => {}
            Backfill::Easy => {
                if pass.reservation.is_none() {
                    pass.reservation = self.reserve(now, task);
                    self.reservation = pass.reservation.as_ref().map(|r| (r.task, r.shadow));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn a_selector_no_node_matches_waits_without_holding_up_the_queue() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 4, &[("kind", "process")]))
            .unwrap();
        let plan = submit(&mut s, 1, selecting(1, 1, &[("kind", "slurm")]));
        let Some(PendingReason::NoMatchingNode { detail }) = pending_reason(&plan, 1) else {
            panic!("{plan:?}");
        };
        assert!(
            detail.contains("1 node(s) labelled kind=slurm, and none of the 1 node(s) up are"),
            "{detail}"
        );
        assert!(
            PendingReason::NoMatchingNode {
                detail: detail.clone()
            }
            .to_string()
            .starts_with("no node can run it yet: ")
        );
        assert!(
            matches!(
                s.explain(TaskId(1)),
                Explanation::Queued {
                    estimated_start: None,
                    ..
                }
            ),
            "no estimate while no node can run it"
        );
        // FIFO: a later task that can run is not kept behind it.
        assert_eq!(
            started(&submit(&mut s, 2, selecting(1, 2, &[("kind", "process")]))),
            vec![TaskId(2)]
        );
        assert_eq!(
            started(&submit(&mut s, 3, request(1, 0, 1, 3))),
            vec![TaskId(3)]
        );
        // The node it waits for registers: it starts there.
        let plan = s
            .handle(Timestamp(4), labelled(2, 4, &[("kind", "slurm")]))
            .unwrap();
        match &plan.actions[..] {
            [Action::Start { task, placements }] => {
                assert_eq!(*task, TaskId(1));
                assert_eq!(placements[0].node, NodeId(2));
            }
            other => panic!("{other:?}"),
        }
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_queued_task_whose_nodes_went_down_waits_for_them() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 1, &[("kind", "slurm")]))
            .unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, selecting(1, 1, &[("kind", "slurm")]))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, selecting(1, 2, &[("kind", "slurm")]));
        assert_eq!(
            pending_reason(&plan, 2),
            Some(&PendingReason::WaitingForResources)
        );
        let plan = s.handle(Timestamp(3), Event::NodeDown(NodeId(1))).unwrap();
        assert!(
            matches!(
                pending_reason(&plan, 2),
                Some(PendingReason::NoMatchingNode { .. })
            ),
            "{plan:?}"
        );
    }

    #[test]
    fn fifo_starts_what_fits_and_blocks_behind_the_head() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 2)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(3, 1, 1, 1))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, request(2, 0, 1, 2));
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::WaitingForResources
            }]
        );
        // Task 3 would fit, but FIFO keeps it behind task 2.
        let plan = submit(&mut s, 3, request(1, 0, 1, 3));
        assert!(started(&plan).is_empty());
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        assert_eq!(started(&plan), vec![TaskId(2), TaskId(3)]);
    }

    #[test]
    fn gangs_start_on_all_nodes_or_none() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 4)).unwrap();
        s.handle(Timestamp(0), node(2, 4, 4)).unwrap();
        submit(&mut s, 1, request(1, 2, 1, 1));
        let plan = submit(&mut s, 2, request(1, 4, 2, 2));
        assert!(started(&plan).is_empty(), "only one node has 4 free GPUs");
        let plan = s.handle(Timestamp(3), Event::TaskEnded(TaskId(1))).unwrap();
        match &plan.actions[..] {
            [Action::Start { task, placements }] => {
                assert_eq!(*task, TaskId(2));
                assert_eq!(placements.len(), 2);
                assert!(placements.iter().all(|p| p.gpu_indices == vec![0, 1, 2, 3]));
            }
            other => panic!("unexpected plan {other:?}"),
        }
    }

    #[test]
    fn dependencies_wait_for_the_task_they_name() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 0)).unwrap();
        submit(&mut s, 1, request(1, 0, 1, 0));
        let mut after = request(1, 0, 1, 1);
        after.depends_on = vec![TaskId(1)];
        let plan = submit(&mut s, 2, after);
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::Dependency { on: TaskId(1) }
            }]
        );
        let plan = s.handle(Timestamp(5), Event::TaskEnded(TaskId(1))).unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    #[test]
    fn a_retry_waits_out_its_backoff_and_what_depends_on_it_waits_too() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 0)).unwrap();
        let mut retry = request(1, 0, 1, 0);
        retry.not_before = Some(Timestamp(5_000));
        let plan = submit(&mut s, 1, retry);
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(1),
                reason: PendingReason::Backoff {
                    until: Timestamp(5_000)
                }
            }]
        );
        // It holds nothing up: a task behind it starts; one that needs it waits.
        let plan = submit(&mut s, 2, request(1, 0, 1, 1));
        assert_eq!(started(&plan), vec![TaskId(2)]);
        let mut after = request(1, 0, 1, 2);
        after.depends_on = vec![TaskId(1)];
        assert!(started(&submit(&mut s, 3, after)).is_empty());
        let plan = s.handle(Timestamp(4_999), Event::Tick).unwrap();
        assert!(started(&plan).is_empty());
        let plan = s.handle(Timestamp(5_000), Event::Tick).unwrap();
        assert_eq!(started(&plan), vec![TaskId(1)]);
        let plan = s
            .handle(Timestamp(6_000), Event::TaskEnded(TaskId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(3)]);
    }
}
