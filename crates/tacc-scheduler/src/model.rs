use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, Priority, Resources, Timestamp, UserName};

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
}

/// Where one node's share of a task runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    /// Indices of the node's GPUs given to the task (for `CUDA_VISIBLE_DEVICES`).
    pub gpu_indices: Vec<u32>,
}

/// Why a queued task is not running yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    /// Enough resources are not free right now.
    WaitingForResources,
    /// A task ahead of it in the queue is waiting, and the queue is first-in first-out.
    BehindOlderTask { blocked_by: tacc_core::TaskId },
    /// No node of the cluster could ever hold it; it is rejected.
    CannotFit { detail: String },
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
        }
    }
}
