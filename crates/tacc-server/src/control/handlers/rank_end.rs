//! A node's rank of an attempt finished. A multi-node attempt succeeds when every node
//! rank has (each rank's end is kept, so a restarted server knows which are done); the
//! first rank that does not succeed ends the attempt for all, named in the reason.

use tacc_core::{NodeId, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_store::{RankEnd, TaskChange, TaskRecord};

use super::ending::on_attempt_finished;
use crate::control::effects::Effects;
use crate::control::{Core, ServerConfig};

/// A rank's end as the shell found it: the task's record as the store holds it (its
/// current attempt, still active), the node that reported and what it said.
#[derive(Debug)]
pub(crate) struct RankFinished<'a> {
    pub record: TaskRecord,
    pub node: NodeId,
    pub attempt: AttemptRef,
    pub outcome: AttemptOutcome,
    /// The process rank that ended it, when the agent knows (several per node).
    pub process_rank: Option<u32>,
    pub at: Timestamp,
    pub config: &'a ServerConfig,
}

pub(crate) fn on_rank_finished(core: &mut Core, fx: &mut Effects, end: RankFinished<'_>) {
    let RankFinished {
        record,
        node,
        attempt,
        outcome,
        process_rank,
        at,
        config,
    } = end;
    if record.attempt != attempt.attempt || !record.state.is_active() {
        return;
    }
    let nodes = record.placements.len() as u32;
    let node_rank = record
        .placements
        .iter()
        .position(|p| p.node == node)
        .map_or(0, |r| r as u32);
    if nodes > 1 {
        // Kept, so a restarted server knows this rank's part is done (or which failed).
        let failure = match &outcome {
            AttemptOutcome::Exited { code: 0 } => None,
            AttemptOutcome::Cancelled => Some("cancelled".to_string()),
            other => crate::usage::failure_of(other),
        };
        fx.change(TaskChange::RankEnded(RankEnd {
            task: attempt.task,
            attempt: attempt.attempt,
            rank: node_rank,
            node,
            at,
            failure,
        }));
    }
    if nodes > 1
        && outcome == (AttemptOutcome::Exited { code: 0 })
        && !record.cancel_requested
        && !core.preempting.contains(&record.id)
    {
        let done = core.finished_ranks.entry(attempt).or_default();
        done.insert(node_rank, at);
        if (done.len() as u32) < nodes {
            return;
        }
    }
    let processes = core
        .specs
        .get(&record.id)
        .map_or(1, |spec| spec.resources.processes_per_node());
    let blame = (nodes * processes > 1).then(|| {
        let rank = process_rank.unwrap_or(node_rank * processes);
        let name = core.node_name(node);
        if processes > 1 {
            format!(
                "rank {rank} (node {name}, local rank {})",
                rank.saturating_sub(node_rank * processes)
            )
        } else {
            format!("rank {rank} (node {name})")
        }
    });
    on_attempt_finished(core, fx, config, record, &outcome, at, blame);
}
