//! `fairshare` (production default): Slurm-style multifactor priority — age, group
//! fair share with decaying usage, priority class — with EASY backfill; high-class tasks
//! may preempt lower classes.

use std::sync::Arc;

use super::CLASS_STEP;
use crate::policy::{
    Backfill, HardLimits, OrderingPolicy, PackPlacement, Policy, PolicyEntry, RankContext,
    TaskView,
};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "fairshare",
    summary: "multifactor priority (age + fair share + class), EASY backfill (default)",
    build: || Policy {
        name: "fairshare",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(Multifactor),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::Easy,
        preemptive: true,
    },
};

#[derive(Debug, Clone, Copy, Default)]
pub struct Multifactor;

impl OrderingPolicy for Multifactor {
    fn rank(&self, ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        let weights = &ctx.config.fairshare;
        let age_secs = ctx.now.millis_since(task.request.submitted_at) as f64 / 1000.0;
        let age = if weights.max_age_secs == 0 {
            1.0
        } else {
            (age_secs / weights.max_age_secs as f64).min(1.0)
        };
        let priority = weights.weight_age * age + weights.weight_fairshare * task.group_fairshare;
        // The class is a tier (like Slurm's partition PriorityTier): a high task always
        // ranks above a normal one, so a task it preempts can never overtake it again.
        // Thousandths keep sub-unit differences while the rank stays an exact integer.
        task.priority as i64 * CLASS_STEP + (priority * 1000.0).round() as i64
    }
}
