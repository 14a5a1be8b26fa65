//! The scheduler: one pure state machine fed [`Event`]s that answers each with a [`Plan`].
//! This file holds its state and the entry point ([`Scheduler::handle`]); each concern
//! has a module of its own: `task` (one task and its phase), `accounts` (what users and
//! groups hold, their limits and fair-share ledgers: all usage arithmetic), `lifecycle`
//! (how each event changes the state), `ranking` (queue order), `pass` (one scheduling
//! decision over the queue), `backfill` (EASY's reservation), `claims` (capacity held for
//! a preemption's beneficiary), `preemption` (choosing victims), `explanation` (why a
//! task waits), `projection` (when it starts: the scheduler run forward), `invariants` (consistency checks for tests) and
//! `standing` (the fair-share report).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, TaskId, Timestamp};

use crate::cluster::Cluster;
use crate::config::SchedulerConfig;
use crate::policy::{Policy, Usage};
use crate::{NodeSpec, PendingReason, Placement, SchedulerError, TaskRequest};

mod accounts;
pub(crate) mod allocation_end;
mod backfill;
mod claims;
mod explanation;
mod invariants;
mod ledgers;
mod lifecycle;
mod pass;
mod preemption;
mod projection;
mod queue_runs;
mod ranking;
mod repeats;
mod resize;
mod standing;
mod task;
#[cfg(test)]
mod testkit;
mod unfit_shapes;

pub use ledgers::LedgerState;
pub use projection::{Projection, ProjectionLimits};
pub use standing::{FairShareStanding, GroupStanding, UserStanding};

use accounts::{Account, GroupAccount};
use claims::Claim;
use task::TaskEntry;

/// Something that happened, fed to [`Scheduler::handle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    NodeUp(NodeSpec),
    /// The node is gone (lost or removed); tasks placed on it are no longer counted
    /// against it. The driver reports those tasks' end separately.
    NodeDown(NodeId),
    /// The node finishes what runs on it but takes no new tasks.
    NodeDrained(NodeId),
    /// A drained node takes new tasks again.
    NodeResumed(NodeId),
    TaskSubmitted {
        task: TaskId,
        request: TaskRequest,
    },
    /// A task already placed before the driver restarted: its resources are taken again.
    TaskRestored {
        task: TaskId,
        request: TaskRequest,
        placements: Vec<Placement>,
    },
    /// Cancelled while queued or running.
    TaskCancelled(TaskId),
    /// Finished in any way (success, failure, lost); its resources are free again.
    TaskEnded(TaskId),
    /// Failed; same effect as [`Event::TaskEnded`], kept apart for the record.
    TaskFailed(TaskId),
    /// A task told to stop by [`Action::Preempt`] has stopped: its resources are free and
    /// it goes back to the queue as a new attempt (keeping its submission time).
    TaskPreempted(TaskId),
    /// A running task's per-node CPU and memory changed (adaptive re-allocation); its
    /// GPUs stay. Rejected with [`SchedulerError::ResizeRejected`] where it does not fit.
    TaskResized {
        task: TaskId,
        per_node: tacc_core::Resources,
    },
    /// Nothing happened but time passed.
    Tick,
    /// Several things happened at this instant: apply them all (in order), then decide
    /// once. The simulator batches each instant (completions first, then arrivals); a
    /// restarted server can restore and resubmit everything in one event.
    Batch(Vec<Event>),
}

/// Why a submission is refused ([`Scheduler::refusal`]): the reason its rejection would
/// carry, and for a request the cluster can never hold, the part of it at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: PendingReason,
    pub misfit: Option<crate::MisfitPart>,
}

/// A decision of the scheduler, for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Start {
        task: TaskId,
        placements: Vec<Placement>,
    },
    /// The task stays queued, for this reason (only emitted when the reason changes).
    Pending { task: TaskId, reason: PendingReason },
    /// The task can never run on this cluster and leaves the queue.
    Reject { task: TaskId, reason: PendingReason },
    /// Send the task its checkpoint signal now and kill it after `grace_secs`; report
    /// [`Event::TaskPreempted`] once it has stopped (or `TaskEnded` if it finished).
    Preempt { task: TaskId, grace_secs: u64 },
}

/// The actions decided in answer to one event, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub at: Timestamp,
    pub actions: Vec<Action>,
}

/// A task's place in the queue. Queue order: higher rank first, then earlier submission,
/// then lower id (the id is unique, so the fields after it never decide). The key also
/// carries what a decision needs to tell, without looking the task up, that a task of
/// the same shape was just found not to fit (see `unfit_shapes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    rank: Reverse<i64>,
    submitted_at: Timestamp,
    task: TaskId,
    shape: unfit_shapes::ShapeClass,
    time_limit_secs: Option<u64>,
}

/// The scheduler's whole state: a pure function of the events fed to it.
#[derive(Debug, Clone)]
pub struct Scheduler {
    policy: Policy,
    config: SchedulerConfig,
    cluster: Cluster,
    tasks: BTreeMap<TaskId, TaskEntry>,
    queue: BTreeSet<QueueKey>,
    /// Stretches of the queue known to get one answer (see `queue_runs`).
    runs: queue_runs::QueueRuns,
    /// Queued tasks the last decision visited one by one (runs passed over count none).
    visited: usize,
    running: BTreeSet<TaskId>,
    preemptible_running: usize,
    /// (expected end in ms, task) of every task holding resources; `u64::MAX` = unknown.
    ends: BTreeSet<(u64, TaskId)>,
    users: Vec<Account>,
    user_index: BTreeMap<String, usize>,
    groups: Vec<GroupAccount>,
    group_index: BTreeMap<String, usize>,
    ranked_at: Option<Timestamp>,
    now: Timestamp,
    reservation: Option<(TaskId, Option<Timestamp>)>,
    preemptions: u64,
    /// Open claims, oldest first.
    claims: Vec<Claim>,
    next_claim: u64,
    /// Bumped by every event that may change what a projection finds (see `projection`).
    epoch: u64,
    /// Whether a decision reuses answers between equal tasks (`repeats`, `unfit_shapes`);
    /// off only for the tests that check the reuse changes no decision.
    walk_memos: bool,
    /// Set in a projection's copy: its decisions need not say why a task waits (see
    /// `unfit_shapes`), only which tasks start and stop.
    quiet: bool,
    /// The shapes of requests seen, numbered (see `unfit_shapes`).
    shapes: unfit_shapes::ShapeClasses,
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new()
    }
}

impl Scheduler {
    /// The production default: `fairshare` with an open configuration.
    pub fn new() -> Self {
        Self::with_policy(Policy::production_default(), SchedulerConfig::default())
    }

    /// The production default policy with the operator's configuration.
    pub fn with_config(config: SchedulerConfig) -> Self {
        Self::with_policy(Policy::production_default(), config)
    }

    pub fn with_policy(policy: Policy, config: SchedulerConfig) -> Self {
        let mut scheduler = Scheduler {
            policy,
            config,
            cluster: Cluster::default(),
            tasks: BTreeMap::new(),
            queue: BTreeSet::new(),
            runs: Default::default(),
            visited: 0,
            running: BTreeSet::new(),
            preemptible_running: 0,
            ends: BTreeSet::new(),
            users: Vec::new(),
            user_index: BTreeMap::new(),
            groups: Vec::new(),
            group_index: BTreeMap::new(),
            ranked_at: None,
            now: Timestamp(0),
            reservation: None,
            preemptions: 0,
            claims: Vec::new(),
            next_claim: 0,
            epoch: 0,
            walk_memos: true,
            quiet: false,
            shapes: Default::default(),
        };
        // Configured groups exist from the start, so their shares count in fair share.
        let names: Vec<String> = scheduler.config.groups.keys().cloned().collect();
        for name in names {
            scheduler.group_id(&name);
        }
        scheduler
    }

    /// A registered policy by name (see [`crate::policy_names`]).
    pub fn by_name(name: &str, config: SchedulerConfig) -> Result<Self, SchedulerError> {
        Ok(Self::with_policy(Policy::by_name(name)?, config))
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Number of tasks waiting.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Number of tasks holding resources (running or being preempted).
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Preemptions decided so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The reservation of the last decision, as computed before anything was backfilled:
    /// the first blocked task and when it is expected to start (`None`: unknown).
    pub fn reservation(&self) -> Option<(TaskId, Option<Timestamp>)> {
        self.reservation
    }

    /// Current usage of a group (GPUs, CPUs, running and queued tasks).
    pub fn group_usage(&self, group: &str) -> Usage {
        self.group_index
            .get(group)
            .map_or_else(Usage::default, |g| self.groups[*g].account.usage)
    }

    /// Turn the reuse of answers within a decision off or on; for tests that compare
    /// both (the reuse is an optimisation and must change no decision).
    #[doc(hidden)]
    pub fn set_walk_memos(&mut self, on: bool) {
        self.walk_memos = on;
    }

    /// Queued tasks the last decision visited one by one, not counting the runs it passed
    /// over whole (see `queue_runs`); for tests that a decision costs what changed.
    #[doc(hidden)]
    pub fn visited_last(&self) -> usize {
        self.visited
    }

    /// Apply one event and decide what to do now.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Result<Plan, SchedulerError> {
        self.now = now;
        allocation_end::set_now(now);
        let tick = matches!(event, Event::Tick);
        let mut actions = Vec::new();
        self.apply(now, event, &mut actions)?;
        self.schedule(now, &mut actions);
        // A tick that decided nothing leaves the future as it was projected.
        if !tick || !actions.is_empty() {
            self.epoch += 1;
        }
        Ok(Plan { at: now, actions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_the_fairshare_default() {
        assert_eq!(Scheduler::new().policy_name(), "fairshare");
    }
}
