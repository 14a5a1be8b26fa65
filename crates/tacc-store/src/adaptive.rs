//! Records of adaptive allocation: the changes of a running attempt's allocation (each
//! with its reason) and the down-sampled series of its signals.

use tacc_core::{AttemptNo, TaskId, Timestamp};

/// One change of an attempt's per-node CPU and memory (see `TaskChange::Resized`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeRecord {
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub at: Timestamp,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub reason: String,
}

/// One recorded point of an attempt's signals; `point` is JSON the store keeps as is.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalRecord {
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub at: Timestamp,
    pub point: serde_json::Value,
}
