//! Records of task groups (arrays now; sweeps and pipelines build on the same record),
//! of the history query over ended tasks, and of the notification outbox.

use serde::{Deserialize, Serialize};
use tacc_core::{GroupId, TaskId, TaskState, Timestamp};

/// What made a group: the kind decides how its spec is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    Array,
    Sweep,
    Pipeline,
}

impl GroupKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Array => "array",
            GroupKind::Sweep => "sweep",
            GroupKind::Pipeline => "pipeline",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<GroupKind> {
        [GroupKind::Array, GroupKind::Sweep, GroupKind::Pipeline]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

impl std::fmt::Display for GroupKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewGroup {
    pub kind: GroupKind,
    pub name: String,
    pub user: String,
    /// The spec as submitted (for an array, the task spec with its `array:`).
    pub spec: serde_json::Value,
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupRecord {
    pub id: GroupId,
    pub kind: GroupKind,
    pub name: String,
    pub user: String,
    pub spec: serde_json::Value,
    /// How many elements it has (a sweep's grows as its trials are launched).
    pub size: u32,
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupFilter {
    pub user: Option<String>,
    /// Only groups with an element in one of these states (any when empty).
    pub with_states: Vec<TaskState>,
    /// Only groups created at or after this time.
    pub since: Option<Timestamp>,
    pub limit: Option<u32>,
}

/// Ended tasks, newest end first, a page at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryFilter {
    pub user: Option<String>,
    /// Exact task name.
    pub name: Option<String>,
    /// Only these end states (every terminal state when empty).
    pub states: Vec<TaskState>,
    /// Ended at or after this time.
    pub since: Option<Timestamp>,
    /// The page after this (end time, id): the last row of the previous page.
    pub before: Option<(Timestamp, TaskId)>,
    pub limit: u32,
}

/// A notification to deliver, as queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// What it reports, e.g. `task:12` or `group:3`: queued once.
    pub key: String,
    pub user: String,
    pub url: String,
    /// The name of the user's secret that signs it.
    pub secret: String,
    pub body: String,
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub id: u64,
    pub key: String,
    pub user: String,
    pub url: String,
    pub secret: String,
    pub body: String,
    /// Tries made so far.
    pub attempts: u32,
    pub next_at: Timestamp,
    pub last_error: Option<String>,
    pub delivered_at: Option<Timestamp>,
    pub gave_up: bool,
}

/// How one try to deliver ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Delivered {
        at: Timestamp,
    },
    /// Try again at `next_at`.
    Retry {
        next_at: Timestamp,
        error: String,
    },
    /// No more tries.
    GaveUp {
        error: String,
    },
}
