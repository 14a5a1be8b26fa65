//! Why a task waits, and until when: [`Scheduler::explain`] reports a running task's
//! placement, a stopping task's grace period, or a queued task's pending reason, its
//! place in line and the latest start of a projection (see `projection`).

use tacc_core::TaskId;

use super::task::Phase;
use super::{ProjectionLimits, Scheduler};
use crate::Explanation;

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
                // The latest start of the scheduler's own projection (none for a task no
                // node can run yet: that depends on a node registering, not on time).
                let estimated_start = self
                    .project_task(task, ProjectionLimits::default())
                    .estimate(task, self.now)
                    .and_then(|estimate| estimate.latest_at());
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
