//! A node polls for its work, saying what its agent runs now. The poll is its heartbeat;
//! a cancelled attempt it no longer runs has stopped (no report of it will come) and
//! ends; and it is handed its desired work (`rules::polls`: nothing new while attempts it
//! should not run are still there).

use std::time::Instant;

use tacc_core::{NodeId, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};

use super::ending::on_attempt_finished;
use crate::control::effects::Effects;
use crate::control::rules::polls;
use crate::control::{Core, ServerConfig};

/// Why a poll gets no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PollRefused {
    /// The node is unknown (removed, or never enrolled here).
    UnknownNode,
    /// The node must register first (its agent restarted, or the server did).
    NotRegistered,
}

/// The heartbeat: the node is seen at `seen`. Returns the cancelled attempts its agent
/// no longer runs, which the shell ends with [`on_cancel_settled`] once it has their
/// records — none when `running` may predate work that reached the node since (`knows`
/// false: `NodeAttempts::knows_its_work`), as an attempt missing from it may run.
pub(crate) fn on_poll(
    core: &mut Core,
    node: NodeId,
    running: &[AttemptRef],
    knows: bool,
    seen: Instant,
) -> Result<Vec<AttemptRef>, PollRefused> {
    let live = core.nodes.get_mut(&node).ok_or(PollRefused::UnknownNode)?;
    if !live.online {
        return Err(PollRefused::NotRegistered);
    }
    live.last_seen = seen;
    if !knows {
        return Ok(Vec::new());
    }
    Ok(polls::settled_cancels(live, running))
}

/// A cancelled attempt stopped: it ends `cancelled` (the record as the store holds it).
pub(crate) fn on_cancel_settled(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    record: tacc_store::TaskRecord,
    attempt: AttemptRef,
    at: Timestamp,
) {
    if record.attempt != attempt.attempt || !record.state.is_active() {
        return;
    }
    on_attempt_finished(
        core,
        fx,
        config,
        record,
        &AttemptOutcome::Cancelled,
        at,
        None,
    );
}

/// The node's desired work now (`released`: its held-back work became due, so a poll it
/// holds open must be answered too).
pub(crate) fn on_work(
    core: &mut Core,
    node: NodeId,
    running: &[AttemptRef],
) -> Result<polls::Desired, PollRefused> {
    let live = core.nodes.get_mut(&node).ok_or(PollRefused::UnknownNode)?;
    if !live.online {
        return Err(PollRefused::NotRegistered);
    }
    Ok(polls::desired(live, running))
}
