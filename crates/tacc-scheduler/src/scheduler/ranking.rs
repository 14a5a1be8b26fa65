//! Queue order. The ordering policy ranks each task from a [`TaskView`] (its request,
//! priority, attained service and its group's fair-share factor); a new or requeued task
//! is ranked at once, and the whole queue, with every group's fair-share factor, is
//! re-ranked at most once per recalculation period.

use tacc_core::{TaskId, Timestamp};

use super::task::TaskEntry;
use super::{QueueKey, Scheduler, standing};
use crate::policy::{RankContext, TaskView};

impl Scheduler {
    /// (Re)compute the task's rank and put it in the queue.
    pub(super) fn enqueue(&mut self, now: Timestamp, task: TaskId) {
        let rank = {
            let entry = &self.tasks[&task];
            self.policy
                .ordering
                .rank(&self.rank_context(now), &self.view(now, task, entry))
        };
        let shape = self.shapes.class_of(&self.tasks[&task].request);
        let entry = self.tasks.get_mut(&task).expect("known task");
        entry.rank = rank;
        entry.shape = shape;
        let key = entry.queue_key(task);
        self.queue.insert(key);
        self.runs.cut(&self.queue, &key);
    }

    pub(super) fn rank_context(&self, now: Timestamp) -> RankContext<'_> {
        RankContext {
            now,
            config: &self.config,
            cluster_total: self.cluster.schedulable_total(),
        }
    }

    /// The task as policies see it.
    pub(super) fn view<'a>(
        &'a self,
        now: Timestamp,
        id: TaskId,
        entry: &'a TaskEntry,
    ) -> TaskView<'a> {
        let group = &self.groups[entry.group];
        let current_run_ms = entry.phase.holding().map_or(0, |(_, started_at)| {
            now.millis_since(started_at) * entry.request.total().gpus as u64
        });
        TaskView {
            id,
            request: &entry.request,
            group: &group.account.name,
            priority: entry.priority,
            attempt: entry.attempt,
            attained_gpu_secs: (entry.attained_gpu_ms + current_run_ms) as f64 / 1000.0,
            group_fairshare: group.fairshare,
            group_allocated: group.allocated,
        }
    }

    /// Recompute fair-share factors and every queued task's rank, at most once per
    /// recalculation period (always when something made the ranks stale).
    pub(super) fn refresh_ranks(&mut self, now: Timestamp) {
        let period_ms = self.config.fairshare.recalc_period_secs * 1000;
        if let Some(at) = self.ranked_at
            && now.millis_since(at) < period_ms
        {
            return;
        }
        self.ranked_at = Some(now);
        let half_life = self.config.fairshare.half_life_secs;
        for group in &mut self.groups {
            group.ledger.advance(now.as_millis(), half_life);
        }
        let inputs: Vec<(f64, f64)> = self
            .groups
            .iter()
            .map(|g| (g.ledger.value, g.share))
            .collect();
        for (group, shares) in self.groups.iter_mut().zip(standing::fair_shares(&inputs)) {
            group.fairshare = shares.factor;
        }
        let ctx = self.rank_context(now);
        let ranks: Vec<(TaskId, i64)> = self
            .queue
            .iter()
            .map(|QueueKey { task: id, .. }| {
                (
                    *id,
                    self.policy
                        .ordering
                        .rank(&ctx, &self.view(now, *id, &self.tasks[id])),
                )
            })
            .collect();
        // Built in one go from the sorted keys: inserting 100,000 keys one by one into
        // the cleared set cost more than ranking them.
        let mut keys = Vec::with_capacity(ranks.len());
        for (id, rank) in ranks {
            let entry = self.tasks.get_mut(&id).expect("queued task");
            entry.rank = rank;
            keys.push(entry.queue_key(id));
        }
        keys.sort_unstable();
        self.queue = keys.into_iter().collect();
        self.runs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn high_priority_goes_first_and_gpu_indices_are_distinct() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 8, 2)).unwrap();
        submit(&mut s, 1, request(8, 0, 1, 1));
        submit(&mut s, 2, request(1, 1, 1, 2));
        let mut high = request(1, 1, 1, 3);
        high.priority = Priority::High;
        submit(&mut s, 3, high);
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        let starts: Vec<_> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, placements } => {
                    Some((*task, placements[0].gpu_indices.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(starts, vec![(TaskId(3), vec![0]), (TaskId(2), vec![1])]);
    }
}
