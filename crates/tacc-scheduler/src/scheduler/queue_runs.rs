//! A decision costs what changed, not the length of the queue. `repeats` already answers
//! each element of an array without a placement search, but a decision still visited
//! every queued task: with 100,000 queued elements each decision (one per agent report)
//! walked 100,000 tasks to tell each what it had been told already, and the server's
//! rate fell to a quarter of its rate with 2,000.
//!
//! A *run* is a stretch of consecutive queue keys whose tasks ask for exactly the same
//! thing (`repeats::same_request`) and were last told the same pending reason. When the
//! walk reaches a task of a run while it holds a reusable answer (`Repeat`) equal to the
//! run's reason, for a task of the same request, in the same walk state, every task of
//! the rest of the run would get that answer from `repeat` — which changes nothing, since
//! each holds that reason already and reports only changes — so the walk jumps past the
//! run's end. The plan is the one the full walk makes, task for task (the property test
//! `tests/queue_runs.rs` compares both on random arrays, ends and cancellations).
//!
//! Runs are kept true by cutting them wherever the queue changes: a key inserted inside a
//! run, a key removed from one, a task of a run told another reason (`cut`, O(log n) each);
//! the walk records the runs it answered by repeat (`record`). A re-ranking rebuilds the
//! queue and forgets every run (the next decision walks the queue once and records them
//! again). Only the plain walk (no group guarantees, not a projection's quiet decision,
//! no claimant waiting) jumps; the others walk every task as before.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

use tacc_core::Timestamp;

use super::pass::PassState;
use super::repeats::{Repeat, same_request};
use super::task::Phase;
use super::{Action, QueueKey, Scheduler};
use crate::PendingReason;

/// The known runs of the queue, by their first key; disjoint, each inside the queue.
#[derive(Debug, Clone, Default)]
pub(super) struct QueueRuns {
    by_start: BTreeMap<QueueKey, Run>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    /// The run's last key (inclusive).
    pub end: QueueKey,
    /// The pending reason every task of the run was last told.
    pub reason: PendingReason,
}

/// The queue key just before `key` (exclusive), in queue order.
fn before(queue: &BTreeSet<QueueKey>, key: &QueueKey) -> Option<QueueKey> {
    queue.range(..*key).next_back().copied()
}

/// The queue key just after `key` (exclusive), in queue order.
pub(super) fn after(queue: &BTreeSet<QueueKey>, key: &QueueKey) -> Option<QueueKey> {
    queue.range((Excluded(*key), Unbounded)).next().copied()
}

impl QueueRuns {
    /// The run holding `key` (its first key and the run), if any.
    pub fn containing(&self, key: &QueueKey) -> Option<(QueueKey, &Run)> {
        self.by_start
            .range(..=*key)
            .next_back()
            .filter(|(_, run)| run.end >= *key)
            .map(|(start, run)| (*start, run))
    }

    /// Forget every run (the queue was rebuilt).
    pub fn clear(&mut self) {
        self.by_start.clear();
    }

    /// `key` was inserted, is being removed, or its task was told another reason: the run
    /// holding it, if any, keeps only the parts before and after it, which stay true.
    pub fn cut(&mut self, queue: &BTreeSet<QueueKey>, key: &QueueKey) {
        if self.by_start.is_empty() {
            return;
        }
        let Some((start, _)) = self.containing(key) else {
            return;
        };
        let run = self.by_start.remove(&start).expect("run just found");
        self.keep(Some(start), before(queue, key), &run.reason);
        self.keep(after(queue, key), Some(run.end), &run.reason);
    }

    /// Record that every key of `[start, end]` in the queue holds a task of one request
    /// told `reason`; runs overlapping it keep their parts outside it.
    pub fn record(
        &mut self,
        queue: &BTreeSet<QueueKey>,
        start: QueueKey,
        end: QueueKey,
        reason: PendingReason,
    ) {
        let overlapping: Vec<QueueKey> = self
            .by_start
            .range(..=end)
            .rev()
            .take_while(|(_, run)| run.end >= start)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            let run = self.by_start.remove(&s).expect("run just found");
            if s < start {
                self.keep(Some(s), before(queue, &start), &run.reason);
            }
            if run.end > end {
                self.keep(after(queue, &end), Some(run.end), &run.reason);
            }
        }
        if start != end {
            self.by_start.insert(start, Run { end, reason });
        }
    }

    /// Keep `[start, end]` as a run when both ends exist and it holds two keys or more.
    fn keep(&mut self, start: Option<QueueKey>, end: Option<QueueKey>, reason: &PendingReason) {
        if let (Some(start), Some(end)) = (start, end)
            && end > start
        {
            let reason = reason.clone();
            self.by_start.insert(start, Run { end, reason });
        }
    }

    /// Every run, for the invariant checks.
    pub fn iter(&self) -> impl Iterator<Item = (&QueueKey, &Run)> {
        self.by_start.iter()
    }
}

impl Scheduler {
    /// One decision's walk of the queue in rank order, without group guarantees: each
    /// task is answered by repeat or considered (as `consider_or_repeat` does), and a run
    /// the current answer covers is passed in one step. The stretches answered by repeat
    /// are recorded as runs for the next decisions.
    pub(super) fn walk_by_runs(
        &mut self,
        now: Timestamp,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        // A projection's quiet walk passes over tasks by shape instead (`unfit_shapes`).
        let jumps = self.walk_memos && !self.quiet;
        let mut repeat: Option<Repeat> = None;
        // Keys answered by repeat since the last task considered: first, last, answer.
        let mut answered: Option<(QueueKey, QueueKey, PendingReason)> = None;
        let mut next = self.queue.first().copied();
        self.visited = 0;
        while let Some(key) = next {
            self.visited += 1;
            if jumps
                && let Some((_, run)) = self.runs.containing(&key)
                && self.would_repeat(key.task, &run.reason, pass, &repeat)
            {
                // Every task of [key, run.end] would be told what it was told already.
                let end = run.end;
                answered = Some(match answered {
                    Some((first, _, reason)) => (first, end, reason),
                    None => (key, end, run.reason.clone()),
                });
                next = after(&self.queue, &end);
                continue;
            }
            if self.passes_over(now, &key, pass) {
                next = after(&self.queue, &key);
                continue;
            }
            if self.repeat(key.task, pass, &repeat, actions) {
                if jumps {
                    answered = Some(match answered {
                        Some((first, _, reason)) => (first, key, reason),
                        None => (
                            key,
                            key,
                            repeat.as_ref().expect("repeated").reason().clone(),
                        ),
                    });
                }
                next = after(&self.queue, &key);
                continue;
            }
            // The stretch ends before a task that may change the walk: record it first,
            // so that whatever this consideration changes cuts it like any other run.
            if let Some((first, last, reason)) = answered.take() {
                self.runs.record(&self.queue, first, last, reason);
            }
            self.consider_and_remember(now, key.task, pass, &mut repeat, actions);
            next = after(&self.queue, &key);
        }
        if let Some((first, last, reason)) = answered {
            self.runs.record(&self.queue, first, last, reason);
        }
    }

    /// The runs are true: each lies in the queue, holds tasks of one request told the
    /// run's reason, and no two overlap. For the invariant checks.
    pub(super) fn check_runs(&self) -> Result<(), String> {
        let mut previous_end: Option<QueueKey> = None;
        for (start, run) in self.runs.iter() {
            if previous_end.is_some_and(|end| end >= *start) || run.end <= *start {
                return Err(format!("run {start:?}..{:?} overlaps or is empty", run.end));
            }
            previous_end = Some(run.end);
            let first = &self.tasks[&start.task];
            for key in self.queue.range(*start..=run.end) {
                let entry = self
                    .tasks
                    .get(&key.task)
                    .ok_or_else(|| format!("run holds unknown task {}", key.task))?;
                match &entry.phase {
                    Phase::Queued { reason: Some(r) } if *r == run.reason => {}
                    other => {
                        return Err(format!(
                            "task {} of a run told {:?} is {other:?}",
                            key.task, run.reason
                        ));
                    }
                }
                if !same_request(entry, first) {
                    return Err(format!("task {} differs from its run's first", key.task));
                }
            }
            if !self.queue.contains(start) || !self.queue.contains(&run.end) {
                return Err(format!(
                    "run {start:?}..{:?} ends outside the queue",
                    run.end
                ));
            }
        }
        Ok(())
    }
}
