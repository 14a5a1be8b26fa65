//! Wire types of usage accounting (`GET /v1/usage`, like Slurm's `sreport`) and of the
//! fair-share standing (`GET /v1/usage/fairshare`, like `sshare`).

use serde::{Deserialize, Serialize};
use tacc_core::Timestamp;

/// Whose usage a report's rows add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum UsageBy {
    #[default]
    User,
    Group,
}

impl UsageBy {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::User => "user",
            UsageBy::Group => "group",
        }
    }
}

/// The query of `GET /v1/usage`. Times are RFC 3339 (`2025-05-01T00:00:00Z`), a date
/// (`2025-05-01`, midnight UTC), `now`, or a duration ago (`90m`, `24h`, `7d`, `2w`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageQuery {
    /// Start of the window (inclusive); 7 days ago when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// End of the window (exclusive); now when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<UsageBy>,
}

/// Allocated resources × time of one user or group (or everyone, as the total).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageRow {
    /// The user or group; `-` for users in no group; `total` for the total.
    pub name: String,
    /// The user's group, in rows by user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Tasks with at least one attempt in the window.
    pub tasks: u64,
    /// Attempts in the window, each retry and preemption counted on its own.
    pub attempts: u64,
    /// Of those, attempts still holding their resources (counted up to the report's time).
    pub running: u64,
    pub cpu_hours: f64,
    pub gpu_hours: f64,
    pub memory_gib_hours: f64,
    /// Of `gpu_hours`, the GPU time actually used (utilisation summed over the GPUs, as
    /// the agents sampled it); absent from older servers.
    #[serde(default)]
    pub gpu_used_hours: f64,
    /// `gpu_hours` allocated but not used: idle GPU-hours.
    #[serde(default)]
    pub gpu_idle_hours: f64,
}

/// One bucket of a usage series.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsagePoint {
    /// Start of the bucket; it lasts the report's `bucket_secs`.
    pub start: Timestamp,
    pub cpu_hours: f64,
    pub gpu_hours: f64,
    pub memory_gib_hours: f64,
}

/// One row's usage over the window, bucket by bucket (every bucket listed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageSeries {
    pub name: String,
    pub points: Vec<UsagePoint>,
}

/// `GET /v1/usage`: what each user or group was allocated in `[since, until)`. Each
/// attempt holds its task's per-node resources on each of its nodes from the moment it
/// was placed (`starting`) until it ended or went back to the queue; a running attempt
/// counts up to `until` or now, whichever is earlier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    pub since: Timestamp,
    pub until: Timestamp,
    /// When the report was made: running attempts are counted up to here.
    pub at: Timestamp,
    pub by: UsageBy,
    /// Biggest GPU-hours first, then CPU-hours, then by name.
    pub rows: Vec<UsageRow>,
    pub total: UsageRow,
    /// The series' bucket: an hour for windows up to two days, else a day (UTC), else a
    /// week past a year.
    pub bucket_secs: u64,
    pub series: Vec<UsageSeries>,
}

/// Hard limits of a user or group; absent means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaLimits {
    pub max_gpus: Option<u64>,
    pub max_cpus: Option<u64>,
    pub max_running_tasks: Option<u64>,
    pub max_queued_tasks: Option<u64>,
}

/// What a user's or group's tasks hold and how many wait, now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatedNow {
    /// GPUs held, shares of one GPU counted as such (two tasks on `gpus: 0.5` hold 1).
    pub gpus: f64,
    pub cpu_millis: u64,
    pub running: u64,
    pub queued: u64,
}

/// One group's fair-share standing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupShare {
    pub group: String,
    /// The configured share weight.
    pub share: f64,
    /// The share over the sum of all known groups' shares.
    pub normalized_share: f64,
    /// Billing units × seconds, decayed by the half-life (a GPU-second counts the
    /// configured `gpu_weight`, a CPU-second `cpu_weight`).
    pub decayed_usage: f64,
    /// The decayed usage over all known groups' decayed usage.
    pub effective_usage: f64,
    /// `2^(-effective_usage / normalized_share)` as of the standing's time: 1 = no
    /// recent usage, 0.5 = usage equal to the share, towards 0 = far above it.
    pub fairshare: f64,
    /// The factor queued tasks are ranked with now (from the last recalculation).
    pub fairshare_in_use: f64,
    pub guaranteed_gpus: u64,
    pub limits: QuotaLimits,
    pub allocated: AllocatedNow,
}

/// One user's standing: their limits, what they hold, and their group's factor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserShare {
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The fair-share factor of the user's group (the policy ranks by group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairshare: Option<f64>,
    pub limits: QuotaLimits,
    pub allocated: AllocatedNow,
}

/// `GET /v1/usage/fairshare`: the scheduler's fair-share standing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FairShareReport {
    pub at: Timestamp,
    /// The scheduling policy; only `fairshare` ranks by the factor.
    pub policy: String,
    pub half_life_secs: u64,
    pub groups: Vec<GroupShare>,
    pub users: Vec<UserShare>,
}
