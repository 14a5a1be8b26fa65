//! `tacc-scheduler`: layer 3 of TACC, the scheduling layer, as a pure deterministic state
//! machine. Events come in (task submitted, task finished, node up, …) each with the time
//! at which it happened; a [`Plan`] of actions comes out (start task T on nodes N with GPU
//! indices G, mark task U pending for reason R, reject task V).
//!
//! It must not do I/O, spawn threads, or read a clock: the live server and the trace
//! simulator drive the very same code, and the same event sequence always yields the same
//! plans (ordered maps only, never `HashMap` iteration). It depends on `tacc-core`, `serde`
//! and `thiserror` only: never tokio, a network or file crate, or a clock.
//!
//! Policies plug in through three traits ([`policy::AdmissionPolicy`],
//! [`policy::OrderingPolicy`], [`policy::PlacementPolicy`]); built-ins are registered in
//! [`policies`]. [`pool`] is the one-pool model the trace simulator uses for speed.

mod cluster;
pub mod config;
mod gpu_sharing;
mod model;
pub mod policies;
pub mod policy;
pub mod pool;
mod scheduler;

pub use cluster::{Misfit, MisfitPart};
pub use config::{
    FairShareConfig, GroupConfig, Limits, PreemptionConfig, SchedulerConfig, UserConfig,
};
pub use gpu_sharing::ShareGpusWithin;
pub use model::{
    Explanation, LatestStart, LimitKind, NodeSpec, PendingReason, Placement, StartEstimate,
    TaskEnd, TaskRequest,
};
pub use policy::{Backfill, Policy, PolicyEntry, policy_names};
pub use scheduler::{
    Action, Event, FairShareStanding, GroupStanding, LedgerState, Plan, Projection,
    ProjectionLimits, Refusal, Scheduler, UserStanding,
};

/// Errors from feeding the scheduler an event that contradicts its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("task {0} is already known to the scheduler")]
    DuplicateTask(tacc_core::TaskId),
    #[error("node {0} is already known to the scheduler")]
    DuplicateNode(tacc_core::NodeId),
    #[error("placement of task {task} names node {node}, which the scheduler does not know")]
    UnknownNode {
        task: tacc_core::TaskId,
        node: tacc_core::NodeId,
    },
    #[error("unknown scheduling policy `{name}` (known: {known})")]
    UnknownPolicy { name: String, known: String },
    #[error("pool job {job} asks for {gpus} GPUs but the pool has only {capacity}")]
    PoolJobTooLarge { job: u64, gpus: u32, capacity: u32 },
    #[error("task {task} cannot be resized: {why}")]
    ResizeRejected {
        task: tacc_core::TaskId,
        why: String,
    },
    #[error("pool job {0} is already known")]
    DuplicatePoolJob(u64),
}
