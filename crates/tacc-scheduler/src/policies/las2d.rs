//! `las2d`: Tiresias' discretised two-dimensional least-attained-service. Attained
//! service is GPUs × seconds run; three queues split at 3250 and 7200 GPU-seconds; a task
//! in a higher queue preempts (preemptible) tasks in lower ones; greedy skipping.

use std::sync::Arc;

use super::CLASS_STEP;
use crate::policy::{
    Backfill, HardLimits, OrderingPolicy, PackPlacement, Policy, PolicyEntry, RankContext,
    TaskView, las2d_level,
};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "las2d",
    summary: "Tiresias 2D-LAS: three attained-service queues, preemptive",
    build: || Policy {
        name: "las2d",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(LeastAttained),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::Greedy,
        preemptive: true,
    },
};

#[derive(Debug, Clone, Copy, Default)]
pub struct LeastAttained;

impl OrderingPolicy for LeastAttained {
    fn rank(&self, ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        self.preemption_level(ctx, task)
    }

    fn preemption_level(&self, _ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        task.priority as i64 * CLASS_STEP - las2d_level(task.attained_gpu_secs)
    }
}
