//! `fifo`: priority class, then arrival; a blocked task blocks everyone behind it.

use std::sync::Arc;

use crate::policy::{
    Backfill, HardLimits, OrderingPolicy, PackPlacement, Policy, PolicyEntry, RankContext,
    TaskView,
};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "fifo",
    summary: "arrival order within a priority class; a blocked head blocks everyone",
    build: || Policy {
        name: "fifo",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(ArrivalOrder),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::None,
        preemptive: false,
    },
};

/// Rank by class only; the scheduler breaks ties by submission time.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrivalOrder;

impl OrderingPolicy for ArrivalOrder {
    fn rank(&self, _ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        task.priority as i64
    }
}
