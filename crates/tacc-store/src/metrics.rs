//! Records of the metrics a task reports (`$TACC_METRICS`, one JSON line per step): kept
//! per attempt in the order they arrived, bounded per attempt, for sweeps' leaderboards
//! and early-stopping decisions.

use std::collections::BTreeMap;

use tacc_core::{AttemptNo, TaskId, Timestamp};

/// At most this many points are kept per attempt; later ones are dropped (the first ones
/// decide the early rungs of a sweep, so they are the ones to keep).
pub const MAX_METRIC_POINTS_PER_ATTEMPT: u32 = 10_000;

/// One reported line: its step and its named values.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    pub task: TaskId,
    pub attempt: AttemptNo,
    /// The order of arrival within the attempt, from 0 (assigned by the store).
    pub seq: u32,
    pub step: u64,
    /// When the server received it.
    pub at: Timestamp,
    pub values: BTreeMap<String, f64>,
}
