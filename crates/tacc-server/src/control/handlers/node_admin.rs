//! An administrator drains, resumes, approves or removes a node (the store's record of
//! the node is changed by the shell first): the scheduler hears what changes where it may
//! place work; a removed node's attempts are lost, and the poll it holds open is answered.

use tacc_core::NodeId;
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;

use crate::control::Core;
use crate::control::effects::Effects;

/// The node `name`, if the core knows one so named.
pub(crate) fn node_named(core: &Core, name: &str) -> Option<NodeId> {
    core.nodes
        .iter()
        .find(|(_, n)| n.record.name == name)
        .map(|(id, _)| *id)
}

/// Drained: what runs there finishes and nothing new is placed; resumed: it takes work
/// again. A node waiting for approval stays held back whatever its drain says.
pub(crate) fn on_drain(core: &mut Core, fx: &mut Effects, node: NodeId, drained: bool) {
    let Some(live) = core.nodes.get_mut(&node) else {
        return;
    };
    let changed = live.record.drained != drained;
    live.record.drained = drained;
    if changed && live.schedulable() && !live.record.pending {
        fx.decide(if drained {
            Event::NodeDrained(node)
        } else {
            Event::NodeResumed(node)
        });
    }
}

/// Approved: a node that waited for an admin gets work from now on (unless drained).
/// True when it did wait: the tasks held for want of a node may go to it.
pub(crate) fn on_approve(core: &mut Core, fx: &mut Effects, node: NodeId) -> bool {
    let Some(live) = core.nodes.get_mut(&node) else {
        return false;
    };
    let was_pending = live.record.pending;
    live.record.pending = false;
    fx.wake(node);
    if was_pending && live.schedulable() && !live.record.drained {
        fx.decide(Event::NodeResumed(node));
        return true;
    }
    false
}

/// Why a node cannot be removed now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StillRunning {
    pub tasks: usize,
}

/// The node leaves: refused while it is up and runs tasks (drain it first); otherwise
/// its attempts are returned to be lost (the shell ends them with their records), and
/// the node is forgotten once they are ([`on_forget`]).
pub(crate) fn on_remove(
    core: &mut Core,
    fx: &mut Effects,
    node: NodeId,
) -> Result<Vec<(AttemptRef, AttemptOutcome)>, StillRunning> {
    let Some(live) = core.nodes.get(&node) else {
        return Ok(Vec::new());
    };
    let attempts: Vec<AttemptRef> = live.assignments.keys().copied().collect();
    if live.online && !attempts.is_empty() {
        return Err(StillRunning {
            tasks: attempts.len(),
        });
    }
    // A node expected back after a restart is known to the scheduler too.
    if live.schedulable() || live.expected {
        fx.decide(Event::NodeDown(node));
    }
    let name = live.record.name.clone();
    Ok(attempts
        .into_iter()
        .map(|attempt| {
            (
                attempt,
                AttemptOutcome::LaunchFailed {
                    reason: "node_removed".into(),
                    message: format!("node {name} was removed by an administrator"),
                },
            )
        })
        .collect())
}

/// Forget a removed node.
pub(crate) fn on_forget(core: &mut Core, node: NodeId) {
    core.nodes.remove(&node);
}
