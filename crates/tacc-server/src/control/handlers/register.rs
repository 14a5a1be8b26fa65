//! An agent registers (or registers again), saying what it still runs. The node comes up
//! (held back when it has been flapping, waiting when it needs an admin's approval); each
//! attempt the server placed there is judged against the claim (`rules::claims`): kept,
//! given back to the scheduler as it was before a restart, stopped then cancelled, or
//! lost — its processes went with the agent's previous life. Attempts the agent claims
//! that are no longer its own must be gone before it gets new work.

use std::collections::BTreeSet;
use std::time::Instant;

use tacc_core::NodeId;
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;
use tacc_store::{NodeRecord, TaskRecord};

use crate::control::core::node_spec;
use crate::control::effects::Effects;
use crate::control::nodes::FLAP_WINDOW;
use crate::control::rules::claims::{self, Claim};
use crate::control::{Core, LiveNode, ServerConfig, placements_of, request_of};

/// A registration as the shell found it: the node's record as the store now holds it,
/// what its agent claims to run, and the attempts starting or running anywhere.
#[derive(Debug)]
pub(crate) struct Registration<'a> {
    pub record: NodeRecord,
    pub claimed: BTreeSet<AttemptRef>,
    pub active: Vec<TaskRecord>,
    pub seen: Instant,
    pub config: &'a ServerConfig,
}

/// Bring the node up and judge its attempts; returns those lost with the agent's previous
/// life, which the shell ends (`handlers::ending::on_attempt_lost`) once it has their
/// records and histories.
pub(crate) fn on_register(
    core: &mut Core,
    fx: &mut Effects,
    registration: Registration<'_>,
) -> Vec<(AttemptRef, AttemptOutcome)> {
    let Registration {
        record,
        claimed,
        active,
        seen,
        config,
    } = registration;
    // A node that re-registers while still online (its agent restarted faster than the
    // heartbeat timeout) is already known to the scheduler with its allocations. So does
    // a node a restarted server expected back with the attempts it ran: the scheduler
    // knows it (drained) with their allocations, as before the restart.
    let was_expected = core.nodes.get(&record.id).is_some_and(|n| n.expected);
    let was_online = was_expected || core.nodes.get(&record.id).is_some_and(|n| n.online);
    let stable_after = config.node_stable_after;
    let live = core
        .nodes
        .entry(record.id)
        .or_insert_with(|| LiveNode::new(record.clone(), seen));
    let became_pending = record.pending && !live.record.pending;
    live.record = record.clone();
    live.online = true;
    live.expected = false;
    live.last_seen = seen;
    if record.pending {
        fx.warn(format!(
            "node {} enrolled and waits for an admin's approval (`taccd admin node approve {}`): \
             it gets no work until then",
            record.name, record.name
        ));
    }
    if !was_online && live.flapping(seen) {
        fx.warn(format!(
            "node {} came back after being lost {} times in {}s: no work for it until it has \
             stayed up for {}s",
            record.name,
            live.losses.len(),
            FLAP_WINDOW.as_secs(),
            stable_after.as_secs()
        ));
        live.held_back_until = Some(seen + stable_after);
    }
    let schedulable = live.schedulable();
    if !was_online && live.held_back_until.is_none() {
        joins_scheduler(core, fx, record.id);
    } else if was_expected {
        if schedulable && !record.drained && !record.pending {
            fx.decide(Event::NodeResumed(record.id));
        }
    } else if was_online && became_pending && schedulable && !record.drained {
        // Enrolled again while up: held back like a drained node until approved.
        fx.decide(Event::NodeDrained(record.id));
    }

    let mut lost = Vec::new();
    for task in active
        .into_iter()
        .rev()
        .filter(|t| t.placements.iter().any(|p| p.node == record.id))
    {
        let attempt = AttemptRef {
            task: task.id,
            attempt: task.attempt,
        };
        // A rank that already finished its part claims nothing and needs nobody.
        let finished = core.finished_ranks.get(&attempt);
        let done = |rank: usize| finished.is_some_and(|done| done.contains_key(&(rank as u32)));
        let own_rank = task.placements.iter().position(|p| p.node == record.id);
        if own_rank.is_some_and(done) {
            continue;
        }
        let all_nodes_online = task
            .placements
            .iter()
            .enumerate()
            .filter(|(rank, _)| !done(*rank))
            .all(|(_, p)| {
                core.nodes
                    .get(&p.node)
                    .is_some_and(|n| n.online || n.expected)
            });
        match claims::judge(
            claimed.contains(&attempt),
            task.cancel_requested,
            all_nodes_online,
            was_online,
        ) {
            Claim::Keep => {}
            Claim::Restore => {
                if let Some(spec) = core.specs.get(&task.id) {
                    let group = core.group_for(config, &task.user);
                    fx.decide(Event::TaskRestored {
                        task: task.id,
                        request: request_of(spec, &task, task.submitted_at, group),
                        placements: placements_of(&task.placements),
                    });
                }
            }
            Claim::StopThenCancel => {
                if let Some(live) = core.nodes.get_mut(&record.id) {
                    live.cancelling.insert(attempt);
                }
            }
            Claim::Lose => lost.push((
                attempt,
                AttemptOutcome::LaunchFailed {
                    reason: "node_restarted".into(),
                    message: format!(
                        "the agent on node {} restarted while the attempt was {}; its processes were stopped",
                        record.name, task.state
                    ),
                },
            )),
        }
    }
    lost
}

/// After the registration's losses and released tasks: what the agent claims that is no
/// longer its own is stopped before it gets new work; its poll is answered now.
pub(crate) fn on_claims_settled(
    core: &mut Core,
    fx: &mut Effects,
    node: NodeId,
    claimed: BTreeSet<AttemptRef>,
) {
    let Some(live) = core.nodes.get_mut(&node) else {
        return;
    };
    live.stale_claims = claimed
        .into_iter()
        .filter(|attempt| !live.assignments.contains_key(attempt))
        .collect();
    if !live.stale_claims.is_empty() {
        fx.warn(format!(
            "node {} still runs {} attempt(s) that ended or moved while it was away: they are \
             stopped before it gets new work",
            live.record.name,
            live.stale_claims.len()
        ));
    }
    fx.wake(node);
}

/// Tell the scheduler a node is up (and drained, if it is drained or waits for approval:
/// the scheduler places nothing on it either way).
pub(crate) fn joins_scheduler(core: &Core, fx: &mut Effects, node: NodeId) {
    let Some(live) = core.nodes.get(&node) else {
        return;
    };
    fx.decide(Event::NodeUp(node_spec(&live.record)));
    if live.record.drained || live.record.pending {
        fx.decide(Event::NodeDrained(node));
    }
}
