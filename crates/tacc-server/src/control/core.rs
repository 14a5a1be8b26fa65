//! The control plane's core: plain data, as HyperQueue's `tako` has its `Core`. What the
//! server knows and decides with — the scheduler, the nodes and their work, the open
//! tasks' specs, the attempts with their per-rank progress, the waits of retries, stages
//! and sweeps — and nothing that does I/O: no store, clock, lock, channel or `async` here
//! (`architecture.rs` checks it). Handlers (`handlers/`) change it synchronously; the
//! shell (`shell.rs`) holds it under one lock and makes their effects durable.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use tacc_core::{GroupId, NodeId, TaskId, Timestamp};
use tacc_proto::{Assignment, AttemptRef};
use tacc_scheduler::{Event, NodeSpec, Scheduler};
use tacc_schema::TaskSpec;
use tacc_store::NodeRecord;

use super::ServerConfig;
use super::nodes::{FLAP_LOSSES, FLAP_WINDOW};

#[derive(Debug)]
pub(crate) struct LiveNode {
    pub(crate) record: NodeRecord,
    pub(crate) online: bool,
    pub(crate) last_seen: Instant,
    pub(crate) assignments: BTreeMap<AttemptRef, Assignment>,
    /// Attempts withdrawn by a cancel, until the agent confirms they are not running.
    pub(crate) cancelling: BTreeSet<AttemptRef>,
    /// When the node was lost recently (heartbeat timeouts), oldest first.
    pub(crate) losses: Vec<Instant>,
    /// A flapping node that came back is up but gets no work before this instant.
    pub(crate) held_back_until: Option<Instant>,
    /// Attempts the agent claimed at registration that are not (or no longer) its to
    /// run: until it has stopped them, it gets no new work.
    pub(crate) stale_claims: BTreeSet<AttemptRef>,
    /// A restarted server found attempts running here: the scheduler knows the node (as
    /// drained, so nothing new lands on it) and their allocations, as before the restart,
    /// until its agent registers again — or stays away for a heartbeat timeout and is lost.
    pub(crate) expected: bool,
}

#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) scheduler: Scheduler,
    pub(crate) nodes: BTreeMap<NodeId, LiveNode>,
    /// Queued tasks not yet given to the scheduler because no node is online: the
    /// scheduler would reject them as never fitting an empty cluster.
    pub(crate) held: BTreeSet<TaskId>,
    /// Retried tasks waiting out their backoff, and when they may run (see `retry`): the
    /// scheduler has them (their dependents keep waiting) but places them no earlier.
    pub(crate) retry_at: BTreeMap<TaskId, Timestamp>,
    /// Task specs of every non-terminal task, parsed once.
    pub(crate) specs: BTreeMap<TaskId, TaskSpec>,
    /// Tasks told to stop by a preemption, until their attempt has ended.
    pub(crate) preempting: BTreeSet<TaskId>,
    /// Node ranks of multi-node attempts that already ended successfully; the attempt
    /// succeeds when every rank has.
    pub(crate) finished_ranks: BTreeMap<AttemptRef, BTreeMap<u32, Timestamp>>,
    /// When node liveness was last checked (to tell a stalled server from silent nodes).
    pub(crate) last_liveness_check: Instant,
    /// The group of each task owner's identity (users the configuration file gives no
    /// group are accounted to this one).
    pub(crate) identity_groups: BTreeMap<String, Option<String>>,
    /// While set, events are collected here instead of decided one by one; the caller
    /// decides once for all of them (see `Control::agent_reports`).
    pub(crate) deferred: Option<Vec<Event>>,
    /// A turn is under way, or was dropped before its end: the core may hold changes the
    /// store does not (see `Control::turn_then`).
    pub(crate) torn: bool,
    /// Pipeline stage tasks and the tasks of the stages they need (the scheduler's
    /// `depends_on`), kept until they leave the queue.
    pub(crate) stage_deps: BTreeMap<TaskId, Vec<TaskId>>,
    /// Queued stage tasks kept from the scheduler until the sweep stages they need have
    /// ended (a sweep launches trials over time, so its tasks are no fixed dependency),
    /// with those sweeps' groups.
    pub(crate) after_sweeps: BTreeMap<TaskId, BTreeSet<GroupId>>,
    /// The fair-share ledgers as last kept in the store (see `restart.rs`).
    pub(crate) fairshare_saved: Vec<tacc_store::FairShareLedger>,
    /// Each node's last-seen time as last kept in the store.
    pub(crate) seen_saved: BTreeMap<NodeId, Timestamp>,
    /// Attempts whose owners were warned of their idle GPUs, and when.
    pub(crate) idle_warned: BTreeMap<AttemptRef, Timestamp>,
    /// Why a task the control plane (not the scheduler) stopped to requeue it was stopped.
    pub(crate) requeue_reasons: BTreeMap<TaskId, String>,
    /// Why a running task being cancelled was (when not simply by its user), until it ends.
    pub(crate) cancel_reasons: BTreeMap<TaskId, String>,
}

impl Core {
    /// A node's name, for messages (its id when the core no longer knows it).
    pub(crate) fn node_name(&self, node: NodeId) -> String {
        self.nodes
            .get(&node)
            .map_or_else(|| node.to_string(), |n| n.record.name.clone())
    }

    /// The core of a control plane that knows nothing yet: `recover` (`mod.rs`) fills it
    /// from the store.
    pub(crate) fn new(scheduler: Scheduler, now: Instant) -> Core {
        Core {
            scheduler,
            nodes: BTreeMap::new(),
            held: BTreeSet::new(),
            retry_at: BTreeMap::new(),
            stage_deps: BTreeMap::new(),
            after_sweeps: BTreeMap::new(),
            specs: BTreeMap::new(),
            preempting: BTreeSet::new(),
            finished_ranks: BTreeMap::new(),
            last_liveness_check: now,
            fairshare_saved: Vec::new(),
            seen_saved: BTreeMap::new(),
            idle_warned: BTreeMap::new(),
            requeue_reasons: BTreeMap::new(),
            cancel_reasons: BTreeMap::new(),
            identity_groups: BTreeMap::new(),
            deferred: None,
            torn: false,
        }
    }

    /// Forget a queued task that leaves the queue without running (cancelled, or ended by
    /// a failed dependency). True when the scheduler has it and must be told.
    /// Forget everything about open tasks (kept nodes' liveness, the scheduler and the
    /// in-memory reasons aside), before they are read again from the store.
    pub(crate) fn clear_open_tasks(&mut self) {
        self.specs.clear();
        self.held.clear();
        self.retry_at.clear();
        self.stage_deps.clear();
        self.after_sweeps.clear();
        self.finished_ranks.clear();
        self.preempting.clear();
        self.deferred = None;
        for live in self.nodes.values_mut() {
            live.assignments.clear();
            live.cancelling.clear();
        }
    }

    pub(crate) fn withdraw(&mut self, task: TaskId) -> bool {
        self.specs.remove(&task);
        self.stage_deps.remove(&task);
        let waiting = self.after_sweeps.remove(&task).is_some();
        self.retry_at.remove(&task);
        !self.held.remove(&task) && !waiting
    }

    pub(crate) fn group_for(&self, config: &ServerConfig, user: &str) -> Option<String> {
        let configured = config
            .scheduler
            .users
            .get(user)
            .is_some_and(|u| u.group.is_some());
        if configured {
            return None;
        }
        self.identity_groups.get(user).cloned().flatten()
    }
}

impl LiveNode {
    pub(crate) fn new(record: NodeRecord, now: Instant) -> LiveNode {
        LiveNode {
            record,
            online: false,
            last_seen: now,
            assignments: BTreeMap::new(),
            cancelling: BTreeSet::new(),
            losses: Vec::new(),
            held_back_until: None,
            stale_claims: BTreeSet::new(),
            expected: false,
        }
    }

    /// Whether the scheduler may place work on the node (it knows the node as up).
    pub(crate) fn schedulable(&self) -> bool {
        self.online && self.held_back_until.is_none()
    }

    /// Whether the node was lost often enough lately to count as flapping.
    pub(crate) fn flapping(&self, now: Instant) -> bool {
        self.losses
            .iter()
            .filter(|at| now.saturating_duration_since(**at) < FLAP_WINDOW)
            .count()
            >= FLAP_LOSSES
    }
}

#[cfg(test)]
impl Core {
    /// What the core still holds about tasks, as `what: detail` lines: once every task
    /// has ended, nothing (a leftover is a leak some handler forgot to clean up; the
    /// lifecycle tests' `emptiness_check` asks).
    pub(crate) fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let mut note = |what: &str, items: Vec<String>| {
            if !items.is_empty() {
                left.push(format!("{what}: {}", items.join(", ")));
            }
        };
        note(
            "specs",
            self.specs.keys().map(ToString::to_string).collect(),
        );
        note("held", self.held.iter().map(ToString::to_string).collect());
        note(
            "retry waits",
            self.retry_at.keys().map(ToString::to_string).collect(),
        );
        note(
            "stage needs",
            self.stage_deps.keys().map(ToString::to_string).collect(),
        );
        note(
            "sweep waits",
            self.after_sweeps.keys().map(ToString::to_string).collect(),
        );
        note(
            "preempting",
            self.preempting.iter().map(ToString::to_string).collect(),
        );
        note(
            "finished ranks",
            self.finished_ranks
                .keys()
                .map(|a| a.task.to_string())
                .collect(),
        );
        note(
            "idle warnings",
            self.idle_warned
                .keys()
                .map(|a| a.task.to_string())
                .collect(),
        );
        note(
            "requeue reasons",
            self.requeue_reasons
                .keys()
                .map(ToString::to_string)
                .collect(),
        );
        note(
            "cancel reasons",
            self.cancel_reasons
                .keys()
                .map(ToString::to_string)
                .collect(),
        );
        for (node, live) in &self.nodes {
            note(
                &format!("node {node} assignments"),
                live.assignments
                    .keys()
                    .map(|a| a.task.to_string())
                    .collect(),
            );
            note(
                &format!("node {node} cancelling"),
                live.cancelling.iter().map(|a| a.task.to_string()).collect(),
            );
        }
        if self.deferred.as_ref().is_some_and(|d| !d.is_empty()) {
            left.push("scheduler events deferred past their turn".to_string());
        }
        left
    }
}

/// What the scheduler knows of a node.
pub(crate) fn node_spec(record: &NodeRecord) -> NodeSpec {
    NodeSpec {
        id: record.id,
        capacity: record.capacity,
        gpu_type: record.gpu_type.clone(),
        labels: record.labels.clone(),
    }
}
