//! Wire types of stopping the embedded cluster (`tcloud down`):
//! `POST /v1/admin/cluster/stop` asks for a stop, `GET /v1/admin/cluster/stop` shows how
//! far it has got.

use serde::{Deserialize, Serialize};
use tacc_core::{TaskId, TaskState};

/// How the cluster stops when tasks are still queued or running.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMode {
    /// Stop only if no task is queued or running; otherwise refuse and say which are.
    IfIdle,
    /// Refuse new submissions, let the queued and running tasks finish, then stop.
    Drain,
    /// Cancel the queued and running tasks now (they end `cancelled`), then stop.
    Force,
}

impl StopMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StopMode::IfIdle => "if_idle",
            StopMode::Drain => "drain",
            StopMode::Force => "force",
        }
    }
}

/// `POST /v1/admin/cluster/stop`'s body. `mode` has no default: a body without it is
/// refused, so that no request stops a cluster by accident.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopCluster {
    pub mode: StopMode,
}

/// A task that keeps the cluster from stopping at once.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveTask {
    pub id: TaskId,
    pub name: String,
    pub user: String,
    pub state: TaskState,
}

/// Where a stop of the cluster stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStopView {
    /// The stop under way (`None`: the cluster is not stopping, e.g. a refused `if_idle`).
    pub stopping: Option<StopMode>,
    /// How many tasks are queued, starting or running.
    pub active_count: u64,
    /// A few of them (the newest first, as `tcloud ps` lists them).
    pub active: Vec<ActiveTask>,
}
