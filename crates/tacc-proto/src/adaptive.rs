//! Wire forms of adaptive allocation: what holds a running task back (the classifier's
//! verdict, with its evidence), the allocation in force and the bounds it moves in, every
//! change with its reason, and a down-sampled history of the signals — for `tcloud why`,
//! `tcloud top` and `tcloud show`.

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, Resources, Timestamp};

/// The adaptive side of one task (its current attempt, or its last).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveView {
    /// The cluster's policy mode for this task: `off`, `shrink` or `on`.
    pub mode: String,
    /// Names of the classifier and the re-allocation policy (`rules`, `step`).
    pub classifier: String,
    pub policy: String,
    /// What the task file asked for per node.
    pub requested: Resources,
    /// What each node holds now (differs from `requested` after a change).
    pub allocation: Resources,
    /// The range the allocation may move in; `None`: it does not move (mode `off`, or no
    /// `adaptive:` bounds and no cluster default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<AdaptiveBounds>,
    /// The latest verdict, while the attempt runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictView>,
    /// Every change of the allocation, oldest first.
    #[serde(default)]
    pub changes: Vec<ResizeView>,
    /// The recorded signal history, oldest first (down-sampled).
    #[serde(default)]
    pub series: Vec<SignalPoint>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveBounds {
    pub min_cpu_millis: u64,
    pub max_cpu_millis: u64,
    pub min_memory_bytes: u64,
    pub max_memory_bytes: u64,
}

/// A classifier's judgement: `input_bound`, `cpu_bound`, `memory_pressure`,
/// `gpu_bound`, `over_provisioned`, `balanced` or `not_enough_data`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictView {
    pub at: Timestamp,
    pub bottleneck: String,
    /// `short`, `fit`, `idle` or `unknown`.
    pub cpu: String,
    pub memory: String,
    /// One line per figure the verdict rests on.
    pub evidence: Vec<String>,
}

/// One change of a task's per-node allocation.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeView {
    pub at: Timestamp,
    pub attempt: AttemptNo,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// The verdict and figures behind it, and what moved (`CPU 2.00 → 3.00`); or why
    /// an agent could not apply it.
    pub reason: String,
}

/// One down-sampled point of an attempt's signals (rank 0), as recorded.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalPoint {
    pub at: Timestamp,
    pub attempt: AttemptNo,
    pub cpu_used_millis: Option<u64>,
    pub cpu_quota_millis: u64,
    /// Thousandths of the interval the CPU quota held it back.
    pub cpu_throttled_permille: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    /// Tenths of a percent (PSI `some avg10` × 10; v1: 1000 while failures rise).
    pub memory_pressure_permille: Option<u32>,
    pub gpu_percent: Option<u32>,
    /// The verdict at this point.
    pub bottleneck: String,
}
