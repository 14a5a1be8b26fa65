//! The three pluggable decisions, in the spirit of Blox's modular scheduler:
//! admission (may this task start, quota-wise?), ordering (who goes first, and who may
//! preempt whom) and placement (which of the fitting nodes). A [`Policy`] bundles one of
//! each with a backfill mode. Built-in policies live one per file in `policies/` and are
//! registered in `policies/mod.rs`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp};

use crate::config::{Limits, SchedulerConfig};
use crate::{PendingReason, SchedulerError, TaskRequest};

/// What a policy may look at when ranking a task.
#[derive(Debug, Clone, Copy)]
pub struct RankContext<'a> {
    pub now: Timestamp,
    pub config: &'a SchedulerConfig,
    /// Capacity of all nodes that take new work.
    pub cluster_total: Resources,
}

/// A queued or running task, as policies see it.
#[derive(Debug, Clone, Copy)]
pub struct TaskView<'a> {
    pub id: TaskId,
    pub request: &'a TaskRequest,
    pub group: &'a str,
    /// Priority class after the user's cap.
    pub priority: Priority,
    /// 1 for the first attempt; each preemption adds one.
    pub attempt: u32,
    /// GPU-seconds received so far over all attempts (Tiresias' attained service).
    pub attained_gpu_secs: f64,
    /// Slurm's fair-share factor of the task's group: 1 = no recent usage, 0.5 = usage
    /// equal to its share, towards 0 = far over its share.
    pub group_fairshare: f64,
    /// Resources the task's group holds right now.
    pub group_allocated: Resources,
}

/// Current consumption of one user or group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// GPUs held, in hundredths of a GPU (a task on `gpus: 0.5` holds 50).
    pub gpu_hundredths: u64,
    pub cpu_millis: u64,
    pub running: u64,
    pub queued: u64,
}

/// Limits and usage of the task's user and group, for admission.
#[derive(Debug, Clone, Copy)]
pub struct QuotaView<'a> {
    pub user_limits: &'a Limits,
    pub user_usage: Usage,
    pub group_limits: &'a Limits,
    pub group_usage: Usage,
}

/// A node that fits the per-node request, offered to a [`PlacementPolicy`].
#[derive(Debug, Clone, Copy)]
pub struct NodeView {
    pub id: NodeId,
    pub free: Resources,
    pub capacity: Resources,
}

pub trait AdmissionPolicy: fmt::Debug + Send + Sync {
    /// May `task` start now as far as limits go? `Err` carries the pending reason.
    fn admit(&self, task: &TaskView<'_>, quota: &QuotaView<'_>) -> Result<(), PendingReason>;
}

pub trait OrderingPolicy: fmt::Debug + Send + Sync {
    /// Higher goes first; ties go to the earlier submission, then the lower id.
    fn rank(&self, ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64;
    /// A task may preempt (preemptible) tasks of a strictly lower level. The default is
    /// the priority class, so only `high` preempts `normal`, and `normal` `low`.
    fn preemption_level(&self, _ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        task.priority as i64
    }
}

pub trait PlacementPolicy: fmt::Debug + Send + Sync {
    /// Pick `request.nodes` distinct nodes out of `candidates`, which all fit the per-node
    /// request and arrive best fit first (fewest free GPUs, then lowest id).
    fn choose(
        &self,
        request: &TaskRequest,
        candidates: &mut dyn Iterator<Item = NodeView>,
    ) -> Option<Vec<NodeId>>;
}

/// How lower-ranked tasks may pass a blocked one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backfill {
    /// Strict order: a blocked task blocks everyone behind it.
    None,
    /// Any task that fits starts (greedy skipping); large tasks may starve.
    Greedy,
    /// EASY: the first blocked task gets a reservation; others start only if they cannot
    /// delay it (they end before it by their time limit, or use other resources).
    Easy,
}

/// A complete scheduling policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: &'static str,
    pub admission: Arc<dyn AdmissionPolicy>,
    pub ordering: Arc<dyn OrderingPolicy>,
    pub placement: Arc<dyn PlacementPolicy>,
    pub backfill: Backfill,
    /// Whether higher-level tasks preempt lower-level ones (reclaim of guaranteed shares
    /// happens under every policy when groups have guarantees).
    pub preemptive: bool,
}

/// One line of the policy registry.
#[derive(Debug, Clone, Copy)]
pub struct PolicyEntry {
    pub name: &'static str,
    pub summary: &'static str,
    pub build: fn() -> Policy,
}

impl Policy {
    /// The registered policy called `name`.
    pub fn by_name(name: &str) -> Result<Policy, SchedulerError> {
        crate::policies::POLICIES
            .iter()
            .find(|entry| entry.name == name)
            .map(|entry| (entry.build)())
            .ok_or_else(|| SchedulerError::UnknownPolicy {
                name: name.to_string(),
                known: policy_names().join(", "),
            })
    }

    /// The production default: multifactor fair share with EASY backfill.
    pub fn production_default() -> Policy {
        (crate::policies::fairshare::ENTRY.build)()
    }
}

/// Names of all registered policies, in registration order.
pub fn policy_names() -> Vec<&'static str> {
    crate::policies::POLICIES.iter().map(|e| e.name).collect()
}

/// Admission by the configured hard limits of the user and the group.
#[derive(Debug, Clone, Copy, Default)]
pub struct HardLimits;

impl AdmissionPolicy for HardLimits {
    fn admit(&self, task: &TaskView<'_>, quota: &QuotaView<'_>) -> Result<(), PendingReason> {
        let total = task.request.total();
        let checks = |limits: &Limits, usage: &Usage| {
            let over = |max: Option<u64>, value: u64| max.filter(|max| value > *max);
            // Limits are whole GPUs; shares count as such (two tasks on 0.5 are one GPU).
            let hundredths = u64::from(tacc_core::GPU_HUNDREDTHS);
            if let Some(max) = over(
                limits.max_gpus.map(|max| max.saturating_mul(hundredths)),
                usage.gpu_hundredths + task.request.gpu_hundredths(),
            ) {
                return Err((crate::LimitKind::Gpus, max / hundredths));
            }
            if let Some(max) = over(
                limits.max_cpus.map(|c| c * 1000),
                usage.cpu_millis + total.cpu_millis,
            ) {
                return Err((crate::LimitKind::Cpus, max / 1000));
            }
            if let Some(max) = over(limits.max_running_tasks, usage.running + 1) {
                return Err((crate::LimitKind::RunningTasks, max));
            }
            Ok(())
        };
        checks(quota.user_limits, &quota.user_usage)
            .map_err(|(limit, max)| PendingReason::OverUserQuota { limit, max })?;
        checks(quota.group_limits, &quota.group_usage).map_err(|(limit, max)| {
            PendingReason::OverGroupQuota {
                group: task.group.to_string(),
                limit,
                max,
            }
        })
    }
}

/// Best fit: the candidates with the fewest free GPUs, so big holes stay whole for big
/// tasks and gangs land on as few partially used nodes as possible.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackPlacement;

impl PlacementPolicy for PackPlacement {
    fn choose(
        &self,
        request: &TaskRequest,
        candidates: &mut dyn Iterator<Item = NodeView>,
    ) -> Option<Vec<NodeId>> {
        let chosen: Vec<NodeId> = candidates
            .take(request.nodes as usize)
            .map(|n| n.id)
            .collect();
        (chosen.len() == request.nodes as usize).then_some(chosen)
    }
}

/// Tiresias' discretised two-dimensional LAS: queue level of a task from its attained
/// GPU-seconds, with thresholds at 3250 and 7200 GPU-seconds.
pub const LAS2D_THRESHOLDS_GPU_SECS: [u64; 2] = [3250, 7200];

/// 0, 1 or 2: the LAS queue a task with this much attained service sits in.
pub fn las2d_level(attained_gpu_secs: f64) -> i64 {
    LAS2D_THRESHOLDS_GPU_SECS
        .iter()
        .filter(|threshold| attained_gpu_secs >= **threshold as f64)
        .count() as i64
}
