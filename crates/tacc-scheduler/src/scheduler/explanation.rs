//! Why a task waits, and until when: [`Scheduler::explain`] reports a running task's
//! placement, a stopping task's grace period, or a queued task's pending reason, its
//! place in line and an estimated start from the reservation timeline.

use std::collections::BTreeMap;

use tacc_core::{TaskId, Timestamp};

use super::Scheduler;
use super::task::Phase;
use crate::{Explanation, PendingReason};

impl Scheduler {
    /// Where the task stands, why it waits, and when it may start.
    pub fn explain(&self, task: TaskId) -> Explanation {
        let Some(entry) = self.tasks.get(&task) else {
            return Explanation::Unknown;
        };
        match &entry.phase {
            Phase::Running {
                placements,
                started_at,
            } => Explanation::Running {
                placements: placements.clone(),
                started_at: *started_at,
                attempt: entry.attempt,
            },
            Phase::Preempting { since, .. } => Explanation::Preempting {
                since: *since,
                attempt: entry.attempt,
            },
            Phase::Queued { reason } => {
                // No estimate for a task no node can run yet: it depends on a node
                // registering, not on the timeline.
                let waits_for_node = matches!(
                    reason,
                    Some(
                        PendingReason::NoMatchingNode { .. }
                            | PendingReason::WaitingForCapacity { .. }
                    )
                );
                Explanation::Queued {
                    reason: reason.clone(),
                    position: self.queue.range(..entry.queue_key(task)).count(),
                    estimated_start: if waits_for_node {
                        None
                    } else {
                        self.estimate_start(task)
                    },
                    attempt: entry.attempt,
                }
            }
        }
    }

    /// Most tasks ahead that an estimate walks through before giving up.
    const ESTIMATE_HORIZON: usize = 2_000;

    /// Estimated start from the reservation timeline: the node-level shadow time for the
    /// reserved task; for others, a GPU-count timeline where running tasks end by their
    /// time limits and each task ahead takes the earliest slot that fits (conservative
    /// backfill over the aggregate pool).
    fn estimate_start(&self, target: TaskId) -> Option<Timestamp> {
        if let Some((head, shadow)) = self.reservation
            && head == target
        {
            return shadow;
        }
        let now = self.now.as_millis();
        let mut deltas: BTreeMap<u64, i64> = BTreeMap::new();
        for (end, id) in &self.ends {
            if *end != u64::MAX {
                *deltas.entry((*end).max(now)).or_default() +=
                    self.tasks[id].request.total().gpus as i64;
            }
        }
        let mut free = self.cluster.free_gpus_total() as i64;
        let mut profile: Vec<(u64, i64)> = vec![(now, free)];
        for (at, delta) in deltas {
            free += delta;
            if at == now {
                profile[0].1 = free;
            } else {
                profile.push((at, free));
            }
        }
        for (_, _, id) in self.queue.iter().take(Self::ESTIMATE_HORIZON) {
            let request = &self.tasks[id].request;
            let need = request.total().gpus as i64;
            let length = request
                .time_limit_secs
                .or(self.config.default_time_limit_secs)
                .map_or(u64::MAX, |s| s.saturating_mul(1000));
            let start = (0..profile.len()).find(|&i| {
                let until = profile[i].0.saturating_add(length);
                profile[i..]
                    .iter()
                    .take_while(|(t, _)| *t < until)
                    .all(|(_, free)| *free >= need)
            });
            let Some(i) = start else {
                if *id == target {
                    return None;
                }
                continue;
            };
            let begin = profile[i].0;
            if *id == target {
                return Some(Timestamp(begin));
            }
            let until = begin.saturating_add(length);
            if until != u64::MAX
                && let Err(pos) = profile.binary_search_by_key(&until, |(t, _)| *t)
            {
                let before = profile[pos - 1].1;
                profile.insert(pos, (until, before));
            }
            for (t, free) in profile.iter_mut().skip(i) {
                if *t >= until {
                    break;
                }
                *free -= need;
            }
        }
        None
    }
}
