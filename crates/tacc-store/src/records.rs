use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, GroupId, NodeId, Resources, SnapshotId, TaskId, TaskState, Timestamp};

#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub name: String,
    pub user: String,
    pub spec: serde_json::Value,
    pub snapshot: SnapshotId,
    pub source: Option<String>,
    pub submitted_at: Timestamp,
    /// How it was submitted beyond its spec (JSON the server owns: `--wait-for-capacity`,
    /// the overrides said at submit); `{}` for nothing.
    pub submission: serde_json::Value,
}

impl NewTask {
    /// The record of the task as it is just after submission: queued, attempt 1.
    pub(crate) fn into_queued_record(self, id: TaskId) -> TaskRecord {
        TaskRecord {
            id,
            name: self.name,
            user: self.user,
            spec: self.spec,
            snapshot: self.snapshot,
            source: self.source,
            state: TaskState::Queued,
            reason: None,
            exit_code: None,
            attempt: AttemptNo::FIRST,
            placements: Vec::new(),
            cancel_requested: false,
            submitted_at: self.submitted_at,
            started_at: None,
            finished_at: None,
            group: None,
            group_index: None,
            submission: self.submission,
        }
    }
}

/// Where one node's share of a task was placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPlacement {
    pub node: NodeId,
    pub gpu_indices: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub id: TaskId,
    pub name: String,
    pub user: String,
    pub spec: serde_json::Value,
    pub snapshot: SnapshotId,
    pub source: Option<String>,
    pub state: TaskState,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub attempt: AttemptNo,
    pub placements: Vec<StoredPlacement>,
    pub cancel_requested: bool,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// The group the task is an element of, and its index there (`TACC_ARRAY_INDEX`).
    pub group: Option<GroupId>,
    pub group_index: Option<u32>,
    /// How it was submitted beyond its spec (see [`NewTask::submission`]).
    pub submission: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEvent {
    pub at: Timestamp,
    pub attempt: AttemptNo,
    pub state: TaskState,
    pub reason: Option<String>,
}

/// A task with every state transition it went through, oldest first: what usage
/// accounting reads to know when each attempt held its resources.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskHistory {
    pub task: TaskRecord,
    pub events: Vec<TaskEvent>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only tasks in one of these states (all states when empty).
    pub states: Vec<TaskState>,
    pub user: Option<String>,
    pub limit: Option<u32>,
    /// Only the elements of this group.
    pub group: Option<GroupId>,
    /// Only tasks that are no group's element (what `tcloud ps` lists one by one).
    pub ungrouped: bool,
}

/// A state change of one task; see [`TaskChange::Transition`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub task: TaskId,
    /// The state the caller saw; the change fails with a conflict if it moved meanwhile.
    pub from: TaskState,
    pub to: TaskState,
    pub attempt: AttemptNo,
    pub at: Timestamp,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub placements: Vec<StoredPlacement>,
}

impl Transition {
    pub fn new(
        task: TaskId,
        from: TaskState,
        to: TaskState,
        attempt: AttemptNo,
        at: Timestamp,
    ) -> Self {
        Transition {
            task,
            from,
            to,
            attempt,
            at,
            reason: None,
            exit_code: None,
            placements: Vec::new(),
        }
    }
}

/// One change to a task, applied with others in a single transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskChange {
    /// Move to a new state (and attempt), recording an event. Entering `starting` sets the
    /// placements; entering `running` sets `started_at`; a terminal state sets
    /// `finished_at`; re-entering `queued` (a retry) clears placements and exit code.
    Transition(Transition),
    /// Update the reason shown while the task stays in its state; no event.
    Reason {
        task: TaskId,
        reason: Option<String>,
    },
    /// A user asked to cancel a task that is starting or running.
    CancelRequested { task: TaskId },
    /// Adaptive allocation changed the per-node CPU and memory of the task's running
    /// attempt (kept in its resize history, not as a state event); a conflict when the
    /// task is not starting or running that attempt.
    Resized(crate::ResizeRecord),
    /// Queue a notification for delivery, in the same transaction as the state change it
    /// reports; one with a key already queued is ignored.
    Notify(crate::NewDelivery),
    /// One node rank of a multi-node attempt ended (kept, not a state event: the attempt
    /// ends when its ranks say so). Recording the same rank again replaces it.
    RankEnded(crate::RankEnd),
}

impl TaskChange {
    /// The task the change is about; `None` for a notification, which changes no task.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            TaskChange::Transition(t) => Some(t.task),
            TaskChange::Reason { task, .. } | TaskChange::CancelRequested { task } => Some(*task),
            TaskChange::Resized(resize) => Some(resize.task),
            TaskChange::RankEnded(end) => Some(end.task),
            TaskChange::Notify(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewNode {
    pub name: String,
    pub capacity: Resources,
    pub gpu_type: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub address: String,
    pub registered_at: Timestamp,
    /// Set when the node enrols (registers with a join token): `capacity` becomes the
    /// capacity it is enrolled with. `None` (a restart with its own credential) keeps the
    /// enrolled capacity and the approval state.
    pub enrolment: Option<NodeEnrolment>,
}

/// How a node enrols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeEnrolment {
    /// It waits for an administrator's approval before it gets work.
    pub pending: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    pub capacity: Resources,
    pub gpu_type: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub address: String,
    pub registered_at: Timestamp,
    /// An administrator drained the node: it takes no new tasks until resumed.
    pub drained: bool,
    /// The capacity the node enrolled with: offering more needs a new enrolment.
    pub enrolled_capacity: Resources,
    /// The node enrolled while approval was required and is not approved yet: it gets
    /// no work.
    pub pending: bool,
    /// When the server last heard from the node, as last kept (`None`: never kept).
    pub last_seen: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    pub task: TaskId,
    pub attempt: AttemptNo,
    /// The node rank that produced the file: every rank of an attempt keeps its own.
    pub rank: u32,
    /// Relative to that rank's working directory.
    pub path: String,
    pub size: u64,
}

/// The highest use seen of one rank of one attempt: each measure's own maximum, so the
/// CPU peak and the memory peak may come from different moments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePeak {
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub node_rank: u32,
    /// The node's name (a removed node's peaks keep it).
    pub node: String,
    /// Thousandths of a CPU, averaged over one sample period.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// The busiest of the rank's GPUs.
    pub gpu_utilization_percent: u32,
    /// GPU memory used, summed over the rank's GPUs.
    pub gpu_memory_bytes: u64,
    /// When a measure last rose.
    pub at: Timestamp,
    /// GPU time used so far, in milliseconds of one GPU fully busy: each sample period's
    /// utilisation summed over the rank's GPUs (only grows, so the maximum is the latest).
    pub gpu_busy_ms: u64,
}

impl UsagePeak {
    /// The maxima of both, each measure on its own; the later time.
    pub fn merge(&self, other: &UsagePeak) -> UsagePeak {
        UsagePeak {
            node: other.node.clone(),
            cpu_millis: self.cpu_millis.max(other.cpu_millis),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
            gpu_utilization_percent: self
                .gpu_utilization_percent
                .max(other.gpu_utilization_percent),
            gpu_memory_bytes: self.gpu_memory_bytes.max(other.gpu_memory_bytes),
            at: self.at.max(other.at),
            gpu_busy_ms: self.gpu_busy_ms.max(other.gpu_busy_ms),
            ..self.clone()
        }
    }
}
