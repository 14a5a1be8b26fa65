//! `fifo-backfill`: arrival order with EASY backfill driven by time limits.

use std::sync::Arc;

use super::fifo::ArrivalOrder;
use crate::policy::{Backfill, HardLimits, PackPlacement, Policy, PolicyEntry};

pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "fifo-backfill",
    summary: "arrival order; EASY backfill around the first blocked task's reservation",
    build: || Policy {
        name: "fifo-backfill",
        admission: Arc::new(HardLimits),
        ordering: Arc::new(ArrivalOrder),
        placement: Arc::new(PackPlacement),
        backfill: Backfill::Easy,
        preemptive: false,
    },
};
