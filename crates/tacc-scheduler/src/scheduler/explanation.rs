//! Why a task waits, and until when: [`Scheduler::explain`] reports a running task's
//! placement, a stopping task's grace period, or a queued task's pending reason, its
//! place in line and the latest start of a projection (see `projection`).

use tacc_core::TaskId;

use super::task::Phase;
use super::{Projection, ProjectionLimits, Scheduler};
use crate::Explanation;

impl Scheduler {
    /// Where the task stands, why it waits, and when it may start (by a projection made
    /// for this task alone).
    pub fn explain(&self, task: TaskId) -> Explanation {
        self.explain_with(task, None)
    }

    /// [`Scheduler::explain`] with the start taken from `projection` (one a driver cached
    /// for the current [`Scheduler::epoch`]) instead of a fresh one.
    pub fn explain_with(&self, task: TaskId, projection: Option<&Projection>) -> Explanation {
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
                // The latest start of the scheduler's own projection (none for a task no
                // node can run yet, or one waiting for capacity: that depends on a node
                // registering, not on time).
                let estimate = match projection {
                    Some(projection) => projection.estimate(task, self.now),
                    None => self
                        .project_task(task, ProjectionLimits::default())
                        .estimate(task, self.now),
                };
                let estimated_start = estimate.and_then(|estimate| estimate.latest_at());
                Explanation::Queued {
                    reason: reason.clone(),
                    position: self.queue.range(..entry.queue_key(task)).count(),
                    estimated_start,
                    attempt: entry.attempt,
                }
            }
        }
    }
}
