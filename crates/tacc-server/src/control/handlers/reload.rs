//! The open tasks come back into the core from the store — at a start, or in a live
//! server after a turn whose commit failed. What the store says of each task (read by the
//! shell) is laid back: queued tasks held until the scheduler hears of them, with the
//! retry wait, the stage needs or the sweeps they wait for; attempts being cancelled
//! awaiting their agents' confirmation; running attempts back in their nodes' work, with
//! the allocation in force and without the ranks that already finished their part.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{GroupId, NodeId, Resources, TaskId, TaskState, Timestamp};
use tacc_proto::{AttemptRef, InputFile};
use tacc_scheduler::{Event, LedgerState};
use tacc_schema::TaskSpec;
use tacc_store::{FairShareLedger, TaskRecord};

use super::plan::assignments_for;
use crate::control::core::node_spec;
use crate::control::effects::Effects;
use crate::control::{Core, ServerConfig, TaskAccount, placements_of, request_of};

/// One open task as the shell read it.
#[derive(Debug)]
pub(crate) struct Reloaded {
    pub record: TaskRecord,
    pub spec: TaskSpec,
    /// The owner's group from their identity, when the core does not know it yet.
    pub identity_group: Option<Option<String>>,
    pub facts: Facts,
}

/// What the store says of an open task beside its record.
#[derive(Debug)]
pub(crate) enum Facts {
    Queued {
        /// The unfinished sweeps of earlier stages it waits for (outside the scheduler).
        awaited_sweeps: BTreeSet<GroupId>,
        /// A retry's not-before time, when it waits out a backoff.
        retry_at: Option<Timestamp>,
        /// The unfinished tasks of the stages it needs.
        needs: Option<Vec<TaskId>>,
    },
    /// Placed, and a cancel is under way.
    Cancelling,
    Running(Box<Placed>),
}

/// What a running attempt's nodes need to be given it back.
#[derive(Debug)]
pub(crate) struct Placed {
    pub account: TaskAccount,
    pub secrets: BTreeMap<String, String>,
    pub inputs: Vec<InputFile>,
    /// Ranks of a multi-node attempt that already ended their part, and when.
    pub finished: BTreeMap<u32, Timestamp>,
    /// The allocation in force, where adaptive allocation moved it.
    pub allocation: Option<Resources>,
}

/// Lay the open tasks back into the core (oldest first). Returns the records of the
/// running attempts, which the scheduler must hear of as they are placed.
pub(crate) fn on_reloaded(core: &mut Core, open: Vec<Reloaded>) -> Vec<TaskRecord> {
    let mut running = Vec::new();
    for Reloaded {
        record,
        spec,
        identity_group,
        facts,
    } in open
    {
        let attempt = AttemptRef {
            task: record.id,
            attempt: record.attempt,
        };
        match facts {
            Facts::Queued {
                awaited_sweeps,
                retry_at,
                needs,
            } => {
                // A stage after an unfinished sweep waits for it outside the scheduler.
                if !awaited_sweeps.is_empty() {
                    core.after_sweeps.insert(record.id, awaited_sweeps);
                } else {
                    core.held.insert(record.id);
                    if let Some(at) = retry_at {
                        core.retry_at.insert(record.id, at);
                    }
                    if let Some(needed) = needs {
                        core.stage_deps.insert(record.id, needed);
                    }
                }
            }
            // Stopped once its nodes' agents are back and confirm, or ended with them
            // when they are not (the liveness tick).
            Facts::Cancelling => {
                for placement in &record.placements {
                    if let Some(live) = core.nodes.get_mut(&placement.node) {
                        live.cancelling.insert(attempt);
                    }
                }
            }
            Facts::Running(placed) => {
                let Placed {
                    account,
                    secrets,
                    inputs,
                    finished,
                    allocation,
                } = *placed;
                for (node, mut assignment) in
                    assignments_for(&record, &spec, &core.nodes, &account, &secrets)
                {
                    // A rank that already finished is not handed out again: its part is
                    // done, and its agent rightly claims nothing.
                    if finished.contains_key(&assignment.node_rank) {
                        continue;
                    }
                    assignment.allocation = allocation;
                    assignment.inputs = inputs.clone();
                    if let Some(live) = core.nodes.get_mut(&node) {
                        live.assignments.insert(assignment.attempt, assignment);
                    }
                }
                if !finished.is_empty() {
                    core.finished_ranks.insert(attempt, finished);
                }
                running.push(record.clone());
            }
        }
        if let Some(group) = identity_group {
            core.identity_groups.insert(record.user.clone(), group);
        }
        core.specs.insert(record.id, spec);
    }
    running
}

/// Whether the facts of `record` are those of a queued task, a cancel under way, or a
/// running attempt (the shell reads what each needs).
pub(crate) fn kind_of(record: &TaskRecord) -> Kind {
    if record.state == TaskState::Queued {
        Kind::Queued
    } else if record.cancel_requested {
        Kind::Cancelling
    } else {
        Kind::Running
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Queued,
    Cancelling,
    Running,
}

/// After a restart: the nodes of the attempts that were running become known to the
/// scheduler again, drained (nothing new lands on them until their agents register and
/// claim what they still run), and those attempts hold their allocations there as
/// before.
pub(crate) fn on_expected_back(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    running: Vec<TaskRecord>,
) {
    let holding: Vec<NodeId> = core
        .nodes
        .iter()
        .filter(|(_, live)| !live.assignments.is_empty())
        .map(|(id, _)| *id)
        .collect();
    for node in holding {
        let Some(live) = core.nodes.get_mut(&node) else {
            continue;
        };
        live.expected = true;
        fx.decide(Event::NodeUp(node_spec(&live.record)));
        fx.decide(Event::NodeDrained(node));
    }
    for record in running {
        let Some(spec) = core.specs.get(&record.id) else {
            continue;
        };
        let group = core.group_for(config, &record.user);
        fx.decide(Event::TaskRestored {
            task: record.id,
            request: request_of(spec, &record, record.submitted_at, group),
            placements: placements_of(&record.placements),
        });
    }
}

/// After a restart: every group's fair-share usage as it was kept, advanced to `now`.
pub(crate) fn on_fairshare_restored(core: &mut Core, kept: Vec<FairShareLedger>, now: Timestamp) {
    let states: Vec<LedgerState> = kept
        .iter()
        .map(|l| LedgerState {
            group: l.group.clone(),
            value: l.value,
            rate: l.rate,
            at: l.at,
        })
        .collect();
    core.scheduler.restore_fairshare(&states, now);
    core.fairshare_saved = kept;
}
