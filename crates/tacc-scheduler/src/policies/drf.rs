//! `drf`: dominant-resource fairness — the group with the smallest dominant share
//! (largest of its GPU, CPU and memory fractions of the cluster) goes first; EASY backfill.

use std::sync::Arc;

use super::CLASS_STEP;
use crate::policy::{
    Backfill, HardLimits, OrderingPolicy, PackPlacement, Policy, PolicyEntry, RankContext,
    TaskView,
};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "drf",
    summary: "dominant-resource fairness across groups, EASY backfill",
    build: || Policy {
        name: "drf",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(DominantShare),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::Easy,
        preemptive: true,
    },
};

#[derive(Debug, Clone, Copy, Default)]
pub struct DominantShare;

impl OrderingPolicy for DominantShare {
    fn rank(&self, ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        let fraction = |used: u64, total: u64| {
            if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            }
        };
        let held = task.group_allocated;
        let total = ctx.cluster_total;
        let dominant = fraction(held.gpus as u64, total.gpus as u64)
            .max(fraction(held.cpu_millis, total.cpu_millis))
            .max(fraction(held.memory_bytes, total.memory_bytes));
        // Parts per billion of the cluster: exact enough, and an integer.
        task.priority as i64 * CLASS_STEP - (dominant * 1e9).round() as i64
    }
}
