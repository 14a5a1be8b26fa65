//! The scheduler decided (Nomad's plan seam): its plan is applied to the core here — the
//! placed tasks become `starting` with their placements, the pending ones get the
//! scheduler's reason, the rejected ones fail (their pipeline dependents are seen to),
//! the preempted ones are withdrawn from their nodes to be requeued once stopped. The
//! shell reads the records the plan is about before, commits the changes with the
//! turn's, and then hands each started attempt to its nodes ([`on_placed`]).

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{NodeId, TaskId, TaskState};
use tacc_proto::{Assignment, AttemptRef, InputFile};
use tacc_scheduler::{Action, PendingReason, Plan};
use tacc_schema::TaskSpec;
use tacc_store::{StoredPlacement, TaskChange, TaskRecord, Transition};

use crate::control::effects::{Effects, FollowUp};
use crate::control::{Core, LiveNode, MASTER_PORTS, Submission, TaskAccount};

/// Apply `plan`: `records` holds the record, as the store holds it, of every task the
/// plan starts or rejects. Returns the records of the started tasks as they are once the
/// changes are committed, for [`on_placed`].
pub(crate) fn on_plan(
    core: &mut Core,
    fx: &mut Effects,
    plan: Plan,
    records: &BTreeMap<TaskId, TaskRecord>,
) -> Vec<TaskRecord> {
    let mut starts = Vec::new();
    // A stage task whose needed stage is rejected in this very plan must not start: the
    // scheduler saw the need leave and placed it; it ends as a dependency failure.
    let rejected: BTreeSet<TaskId> = plan
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::Reject { task, .. } => Some(*task),
            _ => None,
        })
        .collect();
    for action in plan.actions {
        match action {
            Action::Start { task, .. }
                if !rejected.is_empty()
                    && core
                        .stage_deps
                        .get(&task)
                        .is_some_and(|needed| needed.iter().any(|t| rejected.contains(t))) => {}
            Action::Start { task, placements } => {
                let Some(record) = records.get(&task) else {
                    continue;
                };
                let change = TaskChange::Transition(Transition {
                    placements: placements
                        .iter()
                        .map(|p| StoredPlacement {
                            node: p.node,
                            gpu_indices: p.gpu_indices.clone(),
                        })
                        .collect(),
                    ..Transition::new(
                        task,
                        TaskState::Queued,
                        TaskState::Starting,
                        record.attempt,
                        plan.at,
                    )
                });
                // A task that is not queued any more makes the commit fail, and the
                // scheduler is rebuilt from the store.
                let mut started = record.clone();
                if tacc_store::apply_transition(&mut started, &change).is_ok() {
                    starts.push(started);
                }
                fx.change(change);
            }
            // The task keeps the reason its retry was queued with (`retrying in …`).
            Action::Pending {
                reason: PendingReason::Backoff { .. },
                ..
            } => {}
            Action::Pending { task, reason } => fx.change(TaskChange::Reason {
                task,
                reason: Some(reason.to_string()),
            }),
            Action::Reject { task, reason } => {
                let Some(record) = records.get(&task) else {
                    continue;
                };
                let change = TaskChange::Transition(Transition {
                    reason: Some(reason.to_string()),
                    ..Transition::new(
                        task,
                        TaskState::Queued,
                        TaskState::Failed,
                        record.attempt,
                        plan.at,
                    )
                });
                fx.change(change);
                core.specs.remove(&task);
                core.stage_deps.remove(&task);
                fx.wake_logs(task);
                fx.follow_up(FollowUp::StopDependents {
                    record: Box::new(record.clone()),
                    state: TaskState::Failed,
                });
            }
            // The agent stops a withdrawn attempt with SIGTERM, then SIGKILL after the
            // task's grace period; its end comes back as a cancelled attempt and is
            // requeued.
            Action::Preempt { task, .. } => withdraw_to_requeue(core, fx, task),
        }
    }
    starts
}

/// What a started attempt's nodes need beside its record, gathered by the shell.
#[derive(Debug)]
pub(crate) struct Placed<'a> {
    pub record: &'a TaskRecord,
    pub account: &'a TaskAccount,
    pub secrets: &'a BTreeMap<String, String>,
    pub inputs: Vec<InputFile>,
}

/// Hand a started attempt to its nodes: one assignment per node, each node woken.
pub(crate) fn on_placed(core: &mut Core, fx: &mut Effects, placed: Placed<'_>) {
    let Some(spec) = core.specs.get(&placed.record.id) else {
        return;
    };
    let assignments = assignments_for(
        placed.record,
        spec,
        &core.nodes,
        placed.account,
        placed.secrets,
    );
    for (node, mut assignment) in assignments {
        assignment.inputs = placed.inputs.clone();
        if let Some(live) = core.nodes.get_mut(&node) {
            live.assignments.insert(assignment.attempt, assignment);
            fx.wake(node);
        }
    }
}

/// Withdraw `task`'s running attempt from its nodes so that it is requeued once its
/// agents have stopped it (with its checkpoint signal and grace, as a preemption).
pub(crate) fn withdraw_to_requeue(core: &mut Core, fx: &mut Effects, task: TaskId) {
    core.preempting.insert(task);
    for (node, live) in core.nodes.iter_mut() {
        let withdrawn: Vec<AttemptRef> = live
            .assignments
            .keys()
            .filter(|a| a.task == task)
            .copied()
            .collect();
        for attempt in withdrawn {
            live.assignments.remove(&attempt);
            live.cancelling.insert(attempt);
            fx.wake(*node);
        }
    }
}

/// One assignment per node of a placed attempt, rank 0 being the master.
pub(crate) fn assignments_for(
    record: &TaskRecord,
    spec: &TaskSpec,
    nodes: &BTreeMap<NodeId, LiveNode>,
    account: &TaskAccount,
    secrets: &BTreeMap<String, String>,
) -> Vec<(NodeId, Assignment)> {
    let mut instruction = tacc_compiler::compile(
        record.id,
        record.attempt,
        &record.user,
        spec,
        record.snapshot.clone(),
    );
    instruction.unix_user = account.unix_user.clone();
    Submission::of(record).apply_to(&mut instruction);
    if let (Some(group), Some(index)) = (record.group, record.group_index) {
        instruction.set_array_element(tacc_compiler::ArrayElement {
            group: group.0,
            index,
        });
    }
    let instruction = serde_json::to_value(&instruction).expect("instructions serialise");
    let master = record.placements.first().map(|p| p.node);
    let master_addr = master
        .and_then(|node| nodes.get(&node))
        .map_or_else(|| "127.0.0.1".to_string(), |n| n.record.address.clone());
    let attempt = AttemptRef {
        task: record.id,
        attempt: record.attempt,
    };
    let master_port = free_master_port(nodes, master, attempt);
    record
        .placements
        .iter()
        .enumerate()
        .map(|(rank, placement)| {
            (
                placement.node,
                Assignment {
                    attempt,
                    instruction: instruction.clone(),
                    node_rank: rank as u32,
                    gpu_indices: placement.gpu_indices.clone(),
                    master_addr: master_addr.clone(),
                    master_port,
                    secrets: secrets.clone(),
                    allocation: None,
                    inputs: Vec::new(),
                    task_uid: account.task_uid,
                },
            )
        })
        .collect()
}

/// A rendezvous port for `attempt` on its rank 0's node that no other attempt whose rank
/// 0 runs there holds. The search starts at a point derived from the attempt, so the
/// same attempt gets the same port when a restarted server rebuilds its assignments.
pub(crate) fn free_master_port(
    nodes: &BTreeMap<NodeId, LiveNode>,
    master: Option<NodeId>,
    attempt: AttemptRef,
) -> u16 {
    let taken: BTreeSet<u16> = master
        .and_then(|node| nodes.get(&node))
        .map(|live| {
            live.assignments
                .values()
                .filter(|a| a.node_rank == 0 && a.attempt != attempt)
                .map(|a| a.master_port)
                .collect()
        })
        .unwrap_or_default();
    let span = u64::from(MASTER_PORTS.end - MASTER_PORTS.start);
    let start = attempt
        .task
        .0
        .wrapping_mul(31)
        .wrapping_add(u64::from(attempt.attempt.0))
        % span;
    (0..span)
        .map(|i| MASTER_PORTS.start + ((start + i) % span) as u16)
        .find(|port| !taken.contains(port))
        .unwrap_or(MASTER_PORTS.start)
}
