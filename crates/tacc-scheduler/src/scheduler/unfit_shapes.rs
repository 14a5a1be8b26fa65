//! Within one decision, a task that waits for resources passes its answer on to later
//! tasks of the same shape. Once a task has been admitted (its own user's and group's
//! limits, its own dependencies and backoff: checked for every task), what happens next
//! depends only on what it asks of the nodes and on the state of the walk: whether it fits
//! around the reservation and the claims, whether it is held for another task, whether it
//! waits for a node. So while the walk stays where it was (nothing started, reserved,
//! claimed or stopped since), a task asking the nodes for the same thing gets the same
//! answer without a placement search.
//!
//! [`super::repeats`] covers only identical neighbours (same user, same everything); this
//! covers the common long queue of many users whose tasks come in a few shapes but with
//! all-different time limits. A time limit matters to placement only through whether the
//! task would still run at the reservation's shadow time, and on nodes bounded by a pilot
//! allocation; the answer is keyed by the former as a flag, and by the limit itself only
//! where the cluster has such nodes.
//!
//! Shapes are numbered as tasks are queued ([`ShapeClasses`]) and the number travels in the
//! queue's key, so a decision can tell a task's shape without looking the task up. A
//! projection's copy of the scheduler needs no pending reasons ([`Scheduler::quiet`]): it
//! passes over a task whose shape was just found not to fit without touching the task at
//! all, since whatever its own limits say, it does not start and moves nothing. Over
//! 100,000 queued tasks that is the difference between a projection step that reads every
//! task's record (hundreds of megabytes, cache misses all the way) and one that walks the
//! queue's keys.

use std::collections::BTreeMap;

use tacc_core::{TaskId, Timestamp};

use super::pass::PassState;
use super::repeats::WalkState;
use super::{QueueKey, Scheduler};
use crate::{PendingReason, TaskRequest};

/// Most shapes remembered at once in a decision; a queue cycling through more misses.
const MAX_SHAPES: usize = 16;

/// The number of a request's shape: what it asks of the nodes, time aside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ShapeClass(u32);

/// What a request asks of the nodes, time aside.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    /// CPU millis, memory bytes, GPUs per node.
    per_node: (u64, u64, u32),
    nodes: u32,
    gpu_type: Option<String>,
    node_selector: BTreeMap<String, String>,
    wait_for_capacity: bool,
}

/// The shapes seen so far, numbered in order of first sight (a handful on any real
/// queue; a shape stays numbered for the scheduler's life).
#[derive(Debug, Clone, Default)]
pub(super) struct ShapeClasses {
    known: BTreeMap<Shape, ShapeClass>,
}

impl ShapeClasses {
    pub(super) fn class_of(&mut self, request: &TaskRequest) -> ShapeClass {
        let shape = Shape {
            per_node: (
                request.per_node.cpu_millis,
                request.per_node.memory_bytes,
                request.per_node.gpus,
            ),
            nodes: request.nodes,
            gpu_type: request.gpu_type.clone(),
            node_selector: request.node_selector.clone(),
            wait_for_capacity: request.wait_for_capacity,
        };
        let next = ShapeClass(self.known.len() as u32);
        *self.known.entry(shape).or_insert(next)
    }
}

/// The answer a shape got, and where the walk was then.
#[derive(Debug, Clone)]
struct Answer {
    shape: ShapeClass,
    overlaps_reservation: bool,
    /// Its time limit, only where some node is bounded by a pilot allocation.
    time_limit_secs: Option<Option<u64>>,
    walk: WalkState,
    reason: PendingReason,
}

/// The answers of this decision, by shape, each valid while the walk stays as it was.
#[derive(Debug, Default)]
pub(super) struct UnfitShapes {
    answers: Vec<Answer>,
}

impl Scheduler {
    /// Turn off (or back on) the pending reasons of this scheduler's decisions, as in a
    /// projection's copy: only which tasks start and stop is needed, and a task a decision
    /// passes over keeps the reason it had. Public for the tests that compare both.
    #[doc(hidden)]
    pub fn set_quiet(&mut self, quiet: bool) {
        self.quiet = quiet;
    }

    /// Whether the task would start a claim now (the test `consider` makes before it
    /// claims), which no remembered answer covers: a task that claims moves the walk.
    pub(super) fn would_claim(&self, now: Timestamp, task: TaskId, pass: &PassState) -> bool {
        pass.claimants < self.config.preemption.max_claimants_per_pass
            && pass.reservation.is_none()
            && !pass.borrowing_sweep
            && self.may_claim(task)
            && (self.claims.is_empty() || self.admitted_after_claims(now, task))
    }

    fn overlaps_reservation(
        &self,
        now: Timestamp,
        time_limit_secs: Option<u64>,
        pass: &PassState,
    ) -> bool {
        pass.reservation
            .as_ref()
            .is_some_and(|held| held.overlaps(now, time_limit_secs, &self.config))
    }

    fn find_answer<'p>(
        &self,
        now: Timestamp,
        shape: ShapeClass,
        time_limit_secs: Option<u64>,
        pass: &'p PassState,
    ) -> Option<&'p PendingReason> {
        if pass.unfit.answers.is_empty() || !self.walk_memos {
            return None;
        }
        let overlaps = self.overlaps_reservation(now, time_limit_secs, pass);
        let limit = self
            .cluster
            .has_time_bound_nodes()
            .then_some(time_limit_secs);
        let walk = self.walk_state(pass);
        pass.unfit
            .answers
            .iter()
            .find(|a| {
                a.shape == shape
                    && a.overlaps_reservation == overlaps
                    && a.time_limit_secs == limit
                    && a.walk == walk
            })
            .map(|a| &a.reason)
    }

    /// The answer a task of this shape got in this decision with the walk where it is
    /// now, if any (and the task would not claim: see [`Scheduler::would_claim`]).
    pub(super) fn unfit_answer(
        &self,
        now: Timestamp,
        task: TaskId,
        pass: &PassState,
    ) -> Option<PendingReason> {
        let entry = &self.tasks[&task];
        let reason = self.find_answer(now, entry.shape, entry.request.time_limit_secs, pass)?;
        (!self.would_claim(now, task, pass)).then(|| reason.clone())
    }

    /// In a quiet decision: whether the queued task behind `key` can be passed over
    /// without being looked at: a task of its shape was just found not to fit, nothing
    /// moved since, and it would neither claim nor keep a settled claimant's place.
    pub(super) fn passes_over(&self, now: Timestamp, key: &QueueKey, pass: &PassState) -> bool {
        self.quiet
            && !pass.waiting_claimants.contains(&key.task)
            && self
                .find_answer(now, key.shape, key.time_limit_secs, pass)
                .is_some()
            && !self.would_claim(now, key.task, pass)
    }

    /// Remember the answer the task got, when the walk did not move while it was
    /// considered (`before`: the walk then).
    pub(super) fn remember_unfit(
        &self,
        now: Timestamp,
        task: TaskId,
        before: WalkState,
        reason: PendingReason,
        pass: &mut PassState,
    ) {
        if self.walk_state(pass) != before {
            return;
        }
        let entry = &self.tasks[&task];
        let limit = entry.request.time_limit_secs;
        let answer = Answer {
            shape: entry.shape,
            overlaps_reservation: self.overlaps_reservation(now, limit, pass),
            time_limit_secs: self.cluster.has_time_bound_nodes().then_some(limit),
            walk: before,
            reason,
        };
        let answers = &mut pass.unfit.answers;
        // One answer per shape: the newest walk replaces an older one.
        answers.retain(|known| {
            (
                known.shape,
                known.overlaps_reservation,
                known.time_limit_secs,
            ) != (
                answer.shape,
                answer.overlaps_reservation,
                answer.time_limit_secs,
            )
        });
        if answers.len() >= MAX_SHAPES {
            answers.remove(0);
        }
        answers.push(answer);
    }
}
