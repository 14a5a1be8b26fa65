//! `sjf`: shortest job first by the true duration (an oracle only a simulator has);
//! non-preemptive, greedy skipping. Tasks without a duration hint go last.

use std::sync::Arc;

use super::CLASS_STEP;
use crate::policy::{
    Backfill, HardLimits, OrderingPolicy, PackPlacement, Policy, PolicyEntry, RankContext,
    TaskView,
};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "sjf",
    summary: "shortest true duration first (oracle; simulator only), greedy skipping",
    build: || Policy {
        name: "sjf",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(ShortestFirst),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::Greedy,
        preemptive: false,
    },
};

#[derive(Debug, Clone, Copy, Default)]
pub struct ShortestFirst;

impl OrderingPolicy for ShortestFirst {
    fn rank(&self, _ctx: &RankContext<'_>, task: &TaskView<'_>) -> i64 {
        let duration = task
            .request
            .duration_hint_secs
            .unwrap_or(u64::MAX)
            .min(CLASS_STEP as u64 - 1) as i64;
        task.priority as i64 * CLASS_STEP - duration
    }
}
