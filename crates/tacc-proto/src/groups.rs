//! Wire types of task groups (`/v1/groups`: arrays now, sweeps and pipelines later) and
//! of the history of ended tasks (`/v1/history`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, GroupId, TaskId, TaskState, Timestamp};

use crate::TaskView;

/// A group as `tcloud ps` shows it: one line with its elements counted by state.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    pub id: GroupId,
    /// `array`, `sweep` or `pipeline`.
    pub kind: String,
    pub name: String,
    pub user: String,
    /// Elements it was created with.
    pub size: u32,
    /// Elements per state (states with none left out).
    pub counts: BTreeMap<TaskState, u64>,
    pub created_at: Timestamp,
    /// The group this one reran the failed elements of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<GroupId>,
    /// A pipeline's stages in file order, each with its state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<crate::StageView>,
}

impl GroupView {
    /// Every element has ended.
    pub fn is_finished(&self) -> bool {
        self.counts.keys().all(|state| state.is_terminal())
    }
}

/// One element of a group, as `tcloud ps g12` lists it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElementView {
    pub index: u32,
    pub task_id: TaskId,
    pub state: TaskState,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub attempt: AttemptNo,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
}

/// `GET /v1/groups/{id}`: the group and every element, by index.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDetail {
    pub group: GroupView,
    pub elements: Vec<ElementView>,
}

/// `POST /v1/groups/{id}/cancel`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCancelReply {
    pub group: GroupId,
    /// Unfinished elements asked to stop.
    pub cancelled: u64,
}

/// `POST /v1/groups/{id}/rerun`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRerun {
    /// Only the elements that failed, were cancelled or were lost (the only kind of rerun
    /// of a group there is today; `false` is refused).
    pub failed: bool,
}

/// A new group made by a submission or a rerun.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSubmitted {
    pub group: GroupId,
    pub elements: u32,
    /// The first element's task id; the others follow in index order.
    pub first_task: TaskId,
}

/// `GET /v1/history`: ended tasks, newest end first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub tasks: Vec<TaskView>,
    /// Pass as `before` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// One trial of a sweep on its leaderboard.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialView {
    /// The trial's number in the sweep (its element index).
    pub index: u32,
    pub task_id: TaskId,
    pub state: TaskState,
    pub reason: Option<String>,
    /// Parameter name → value, as substituted.
    pub parameters: BTreeMap<String, String>,
    /// The best value of the metric it reported (by the sweep's goal).
    pub best: Option<f64>,
    /// The last value it reported, and at which step.
    pub last: Option<f64>,
    pub step: Option<u64>,
}

/// `GET /v1/groups/{id}/sweep`: a sweep's leaderboard, best trial first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepBoard {
    pub group: GroupView,
    /// `grid`, `random` or `asha`.
    pub method: String,
    pub metric: String,
    /// `minimize` or `maximize`.
    pub goal: String,
    pub max_trials: u32,
    pub parallel: u32,
    /// The succeeded trial with the best final value, once there is one.
    pub best_trial: Option<TaskId>,
    /// Best first: by best value (by the goal), trials without a value last.
    pub trials: Vec<TrialView>,
}
