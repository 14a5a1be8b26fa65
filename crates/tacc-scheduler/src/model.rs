use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp, UserName};

/// A machine as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub id: NodeId,
    pub capacity: Resources,
    /// GPU model, e.g. `A100`; all GPUs of a node share one type.
    pub gpu_type: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// What a task asks of the cluster.
///
/// Fields added after the first boundary (`group`, `node_selector`, `depends_on`,
/// `duration_hint_secs`) default to "not given" in serde, and [`Default`] exists so that
/// callers can write `TaskRequest { user, per_node, ..Default::default() }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRequest {
    pub user: UserName,
    /// Resources needed on each node.
    pub per_node: Resources,
    /// Number of nodes; more than one makes a gang that starts everywhere or nowhere.
    pub nodes: u32,
    pub gpu_type: Option<String>,
    pub priority: Priority,
    pub preemptible: bool,
    /// Upper bound on run time, used for backfill planning.
    pub time_limit_secs: Option<u64>,
    pub submitted_at: Timestamp,
    /// Team or project charged for the task; `None` takes the user's group from the
    /// configuration (or the user's own name when the user is not configured).
    #[serde(default)]
    pub group: Option<String>,
    /// Node labels the task needs (every pair must match exactly).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Tasks that must leave the scheduler (end in any way) before this one may start.
    #[serde(default)]
    pub depends_on: Vec<TaskId>,
    /// True run time, known only to a simulator replaying a trace; the `sjf` oracle
    /// policy orders by it. The live server leaves it `None`.
    #[serde(default)]
    pub duration_hint_secs: Option<u64>,
    /// A retry waiting out its backoff: it stays in the queue (so what depends on it keeps
    /// waiting) but is not placed before this time.
    #[serde(default)]
    pub not_before: Option<Timestamp>,
    /// Submitted on purpose for a cluster that will grow (`tcloud submit
    /// --wait-for-capacity`): a request no node could hold today waits, without holding up
    /// the queue, instead of being refused.
    #[serde(default)]
    pub wait_for_capacity: bool,
    /// A share of one GPU on each node, in hundredths (`gpus: 0.5` is 50; `1..=99`), packed
    /// with other shares of the same tenant on one GPU; `per_node.gpus` is 0 then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share: Option<u32>,
    /// Who the task may share a GPU with (see [`crate::ShareGpusWithin`]). The scheduler
    /// sets it when the task is submitted; a caller's value is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_tenant: Option<String>,
}

impl Default for TaskRequest {
    fn default() -> Self {
        TaskRequest {
            user: UserName::new(""),
            per_node: Resources::ZERO,
            nodes: 1,
            gpu_type: None,
            priority: Priority::Normal,
            preemptible: false,
            time_limit_secs: None,
            submitted_at: Timestamp(0),
            group: None,
            node_selector: BTreeMap::new(),
            depends_on: Vec::new(),
            duration_hint_secs: None,
            not_before: None,
            wait_for_capacity: false,
            gpu_share: None,
            gpu_tenant: None,
        }
    }
}

impl TaskRequest {
    /// Resources of the whole gang.
    pub fn total(&self) -> Resources {
        self.per_node.times(self.nodes)
    }

    /// What a node must have to ever hold one node's share: a share of a GPU needs a
    /// node with at least one GPU.
    pub fn footprint(&self) -> Resources {
        let mut need = self.per_node;
        if self.gpu_share.is_some() {
            need.gpus = need.gpus.max(1);
        }
        need
    }

    /// GPUs of the whole gang in hundredths, shares counted as such (`0.5` is 50): what
    /// quotas, guarantees, fair share and GPU-hours add up.
    pub fn gpu_hundredths(&self) -> u64 {
        let per_node = match self.gpu_share {
            Some(share) => u64::from(share),
            None => u64::from(self.per_node.gpus) * u64::from(tacc_core::GPU_HUNDREDTHS),
        };
        per_node * u64::from(self.nodes)
    }
}

/// Where one node's share of a task runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    /// Indices of the node's GPUs given to the task (for `CUDA_VISIBLE_DEVICES`).
    pub gpu_indices: Vec<u32>,
}

/// Which hard limit a queued task would break by starting now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    Gpus,
    Cpus,
    RunningTasks,
    QueuedTasks,
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitKind::Gpus => "GPUs",
            LimitKind::Cpus => "CPUs",
            LimitKind::RunningTasks => "running tasks",
            LimitKind::QueuedTasks => "queued tasks",
        })
    }
}

/// Why a queued task is not running yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    /// Enough resources are not free right now.
    WaitingForResources,
    /// A task ahead of it in the queue is waiting, and the queue is first-in first-out.
    BehindOlderTask { blocked_by: TaskId },
    /// No node of the cluster could ever hold it; it is rejected.
    CannotFit { detail: String },
    /// Starting it would break a per-user hard limit.
    OverUserQuota { limit: LimitKind, max: u64 },
    /// Starting it would break a per-group hard limit.
    OverGroupQuota {
        group: String,
        limit: LimitKind,
        max: u64,
    },
    /// It would fit, but only on resources held back for a higher-priority task.
    LowerPriority { blocked_by: TaskId },
    /// A task it depends on has not ended yet.
    Dependency { on: TaskId },
    /// Too few nodes of the cluster carry the labels its `node_selector` asks for; it
    /// waits (without holding up the queue) until enough such nodes register.
    NoMatchingNode { detail: String },
    /// A retry waiting out its backoff until this time (see [`TaskRequest::not_before`]).
    Backoff { until: Timestamp },
    /// No node could hold it today, and it was submitted to wait for one
    /// ([`TaskRequest::wait_for_capacity`]); it holds up nothing meanwhile.
    WaitingForCapacity { detail: String },
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::WaitingForResources => f.write_str("waiting for resources"),
            PendingReason::BehindOlderTask { blocked_by } => {
                write!(f, "queued behind task {blocked_by}")
            }
            PendingReason::CannotFit { detail } => {
                write!(f, "can never fit this cluster: {detail}")
            }
            PendingReason::OverUserQuota { limit, max } => {
                write!(f, "over user quota: at most {max} {limit}")
            }
            PendingReason::OverGroupQuota { group, limit, max } => {
                write!(f, "over quota of group {group}: at most {max} {limit}")
            }
            PendingReason::LowerPriority { blocked_by } => write!(
                f,
                "lower priority: the free resources are held for task {blocked_by}"
            ),
            PendingReason::Dependency { on } => write!(f, "waiting for task {on} to end"),
            PendingReason::NoMatchingNode { detail } => {
                write!(f, "no node can run it yet: {detail}")
            }
            PendingReason::Backoff { until } => {
                write!(f, "retrying after a backoff, not before {} ms", until.0)
            }
            PendingReason::WaitingForCapacity { detail } => write!(
                f,
                "waiting for the cluster to grow (submitted with --wait-for-capacity): {detail}"
            ),
        }
    }
}

/// Where a task stands, as [`crate::Scheduler::explain`] tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Explanation {
    Queued {
        reason: Option<PendingReason>,
        /// Position in the policy's order (0 = next to be considered).
        position: usize,
        /// The latest start of the scheduler's projection (everything ahead runs to its
        /// time limit); `None` when a time limit it depends on is unknown, the projection
        /// gave up, or no node can run it yet.
        estimated_start: Option<Timestamp>,
        attempt: u32,
    },
    Running {
        placements: Vec<Placement>,
        started_at: Timestamp,
        attempt: u32,
    },
    /// A grace signal was sent; resources stay held until the driver reports it stopped.
    Preempting { since: Timestamp, attempt: u32 },
    /// The scheduler does not know the task (never submitted, or already ended).
    Unknown,
}

/// A task whose end, at its time limit, a projected start waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEnd {
    pub task: TaskId,
    pub at: Timestamp,
}

/// The latest start of a queued task, if everything ahead runs to its time limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LatestStart {
    At(Timestamp),
    /// It waits for tasks that have no time limit (these, the first few of them).
    Unknown {
        no_time_limit: Vec<TaskId>,
    },
    /// The projection's step cap or horizon came first: later than `after`.
    BeyondHorizon {
        after: Timestamp,
    },
}

/// When a queued task is expected to start, from a projection of the scheduler itself
/// (see `Scheduler::project`): no earlier than `earliest`, no later than `latest` unless
/// something is submitted ahead of it or a node is lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartEstimate {
    pub earliest: Timestamp,
    pub latest: LatestStart,
    /// The ends (at their time limits) of the tasks at whose end it starts, first few.
    pub after: Vec<TaskEnd>,
}

impl StartEstimate {
    /// The latest start as a time, when there is one.
    pub fn latest_at(&self) -> Option<Timestamp> {
        match self.latest {
            LatestStart::At(at) => Some(at),
            _ => None,
        }
    }
}
