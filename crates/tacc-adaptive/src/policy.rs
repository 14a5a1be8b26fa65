//! The re-allocation contract: a verdict, the allocation in force, the owner's bounds,
//! the room to grow into and what changed lately in; at most one change out.

use std::fmt;

use serde::{Deserialize, Serialize};
use tacc_core::{ByteSize, Timestamp};

use crate::Verdict;

/// What one attempt holds per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.2} CPUs, {}",
            self.cpu_millis as f64 / 1000.0,
            ByteSize::from_bytes(self.memory_bytes)
        )
    }
}

/// What the owner allows (`adaptive: {cpus: 2..8, memory: 8GiB..32GiB}`) or the
/// cluster's default policy gives: an allocation is never moved outside these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub min: Allocation,
    pub max: Allocation,
}

impl Bounds {
    pub fn contains(&self, allocation: Allocation) -> bool {
        (self.min.cpu_millis..=self.max.cpu_millis).contains(&allocation.cpu_millis)
            && (self.min.memory_bytes..=self.max.memory_bytes).contains(&allocation.memory_bytes)
    }
}

/// How much an attempt may grow by now: the least of its node's free capacity and its
/// owner's remaining quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Room {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Grow,
    Shrink,
}

/// The latest change of each resource of an attempt, kept by the caller: what the
/// policy's hysteresis looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChangeHistory {
    pub cpu: Option<(Timestamp, Direction)>,
    pub memory: Option<(Timestamp, Direction)>,
}

impl ChangeHistory {
    /// Notes a change made at `at`.
    pub fn record(&mut self, change: &Change, at: Timestamp) {
        if let Some(direction) = change.cpu_direction() {
            self.cpu = Some((at, direction));
        }
        if let Some(direction) = change.memory_direction() {
            self.memory = Some((at, direction));
        }
    }
}

/// A decided change, with the reason written into the task's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub from: Allocation,
    pub to: Allocation,
    /// `input_bound (GPU 25% busy; CPU 1.98 of 2.00 cores used …): CPU 2.00 → 3.00`.
    pub reason: String,
}

impl Change {
    pub fn cpu_direction(&self) -> Option<Direction> {
        direction(self.from.cpu_millis, self.to.cpu_millis)
    }

    pub fn memory_direction(&self) -> Option<Direction> {
        direction(self.from.memory_bytes, self.to.memory_bytes)
    }

    /// Whether the change gives capacity back (the scheduler may start queued work).
    pub fn frees_capacity(&self) -> bool {
        self.to.cpu_millis < self.from.cpu_millis || self.to.memory_bytes < self.from.memory_bytes
    }
}

fn direction(from: u64, to: u64) -> Option<Direction> {
    match to.cmp(&from) {
        std::cmp::Ordering::Greater => Some(Direction::Grow),
        std::cmp::Ordering::Less => Some(Direction::Shrink),
        std::cmp::Ordering::Equal => None,
    }
}

/// Everything a [`Reallocator`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct Situation<'a> {
    pub now: Timestamp,
    pub current: Allocation,
    pub bounds: Bounds,
    pub room: Room,
    pub verdict: &'a Verdict,
    pub history: ChangeHistory,
}

/// Decides whether and how to change a running attempt's allocation. Pure: the same
/// situation gives the same answer.
pub trait Reallocator: Send + Sync + fmt::Debug {
    /// A short name for logs and `--json` (`step`).
    fn name(&self) -> &'static str;
    fn decide(&self, situation: &Situation<'_>) -> Option<Change>;
}
