//! Facts of the control plane that used to live only in its memory and that a restarted
//! server needs to carry on as if it had never stopped: how each node rank of a multi-node
//! attempt ended (so a rank that finished is not counted lost, and the first failure is
//! still the one named), each group's decaying fair-share usage (so the standing does not
//! reset), when each node was last heard from, and the dashboard's signed-in sessions.

use tacc_core::{AttemptNo, NodeId, TaskId, Timestamp};

/// How one node rank of an attempt ended, recorded with the change that applied it
/// ([`crate::TaskChange::RankEnded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnd {
    pub task: TaskId,
    pub attempt: AttemptNo,
    /// The node rank (the index of its placement).
    pub rank: u32,
    pub node: NodeId,
    pub at: Timestamp,
    /// What went wrong, for a rank that did not succeed.
    pub failure: Option<String>,
}

/// One group's decaying fair-share usage as of `at`, with the rate it accrued at then:
/// the value at any later instant follows from these until the rate changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FairShareLedger {
    pub group: String,
    pub value: f64,
    pub rate: f64,
    pub at: Timestamp,
}

/// A signed-in dashboard session as kept: the store sees neither the session id (only its
/// SHA-256) nor the token it carries (sealed by the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardSession {
    /// The SHA-256 of the session id, hex.
    pub key: String,
    pub user: String,
    pub nonce: Vec<u8>,
    pub sealed: Vec<u8>,
    pub opened_at: Timestamp,
}
