//! One task as the scheduler knows it: its request, the user and group it is charged to,
//! its rank, and its phase (queued, running, or stopping for a preemption). Whether and
//! where a task holds resources is answered here once ([`Phase::holding`]), for every
//! module that needs it.

use std::cmp::Reverse;
use std::sync::Arc;

use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp};

use super::QueueKey;
use super::unfit_shapes::ShapeClass;
use crate::{PendingReason, Placement, TaskRequest};

#[derive(Debug, Clone)]
pub(super) enum Phase {
    Queued {
        reason: Option<PendingReason>,
    },
    Running {
        placements: Vec<Placement>,
        started_at: Timestamp,
    },
    Preempting {
        placements: Vec<Placement>,
        started_at: Timestamp,
        since: Timestamp,
    },
}

impl Phase {
    /// Where the task holds resources and since when it has held them: running or
    /// stopping alike (a stopping task holds its share until it has stopped); `None`
    /// while queued.
    pub(super) fn holding(&self) -> Option<(&[Placement], Timestamp)> {
        match self {
            Phase::Running {
                placements,
                started_at,
            }
            | Phase::Preempting {
                placements,
                started_at,
                ..
            } => Some((placements, *started_at)),
            Phase::Queued { .. } => None,
        }
    }

    pub(super) fn is_queued(&self) -> bool {
        matches!(self, Phase::Queued { .. })
    }

    pub(super) fn is_preempting(&self) -> bool {
        matches!(self, Phase::Preempting { .. })
    }
}

#[derive(Debug, Clone)]
pub(super) struct TaskEntry {
    /// Shared, not owned: a projection copies the whole scheduler, and a request never
    /// changes but by a resize (which replaces it).
    pub request: Arc<TaskRequest>,
    /// Index of the user's account.
    pub user: usize,
    /// Index of the group's account.
    pub group: usize,
    pub priority: Priority,
    pub attempt: u32,
    /// GPU-milliseconds of finished attempts.
    pub attained_gpu_ms: u64,
    pub rank: i64,
    /// Key in `Scheduler::ends` while holding resources.
    pub end_key: u64,
    pub phase: Phase,
    /// The shape of its request, as numbered when it was last queued.
    pub shape: ShapeClass,
}

impl TaskEntry {
    /// The task's place in `Scheduler::queue` (at its current rank).
    pub(super) fn queue_key(&self, id: TaskId) -> QueueKey {
        QueueKey {
            rank: Reverse(self.rank),
            submitted_at: self.request.submitted_at,
            task: id,
            shape: self.shape,
            time_limit_secs: self.request.time_limit_secs,
        }
    }

    /// Where the task holds resources; empty while queued.
    pub(super) fn placements(&self) -> &[Placement] {
        self.phase
            .holding()
            .map_or(&[], |(placements, _)| placements)
    }

    /// What the task holds on `node` (nothing if it holds nothing there).
    pub(super) fn share_on(&self, node: NodeId) -> Resources {
        if self.placements().iter().any(|p| p.node == node) {
            self.request.per_node
        } else {
            Resources::ZERO
        }
    }

    /// The task's share on each of its nodes, as releases at sort key `key` for
    /// `Cluster::earliest_fit`.
    pub(super) fn releases(
        &self,
        key: u64,
        id: TaskId,
    ) -> impl Iterator<Item = (u64, TaskId, NodeId, Resources)> + '_ {
        let per_node = self.request.per_node;
        self.placements()
            .iter()
            .map(move |p| (key, id, p.node, per_node))
    }
}
