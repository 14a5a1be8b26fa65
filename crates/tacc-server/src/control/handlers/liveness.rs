//! The liveness tick (every second): nodes silent past the heartbeat timeout go down and
//! their attempts are lost (`rules::liveness`); a stalled server gives every node a fresh
//! term; held-back flapping nodes that stayed up long enough get work again.

use std::time::{Duration, Instant};

use tacc_core::NodeId;
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;

use super::register::joins_scheduler;
use crate::control::Core;
use crate::control::effects::Effects;
use crate::control::rules::liveness;

/// What the shell does after the tick: the nodes lost (whose attempt bookkeeping it
/// forgets) and their attempts, which it ends (`handlers::ending::on_attempt_lost`) once
/// it has their records and histories.
#[derive(Debug, Default)]
pub(crate) struct Tick {
    pub lost_nodes: Vec<NodeId>,
    pub lost_attempts: Vec<(AttemptRef, AttemptOutcome)>,
}

pub(crate) fn on_liveness_tick(
    core: &mut Core,
    fx: &mut Effects,
    now: Instant,
    timeout: Duration,
) -> Tick {
    let found = {
        let Core {
            nodes,
            finished_ranks,
            last_liveness_check,
            ..
        } = core;
        liveness::check(nodes, finished_ranks, last_liveness_check, now, timeout)
    };
    if let Some(stalled) = found.stalled_for {
        fx.warn(format!(
            "the server did not check node liveness for {}s (was it stopped?): giving every \
             node a fresh heartbeat period",
            stalled.as_secs()
        ));
    }
    for node in found.stable {
        if let Some(live) = core.nodes.get(&node) {
            fx.inform(format!(
                "node {} has been stable: it gets work again",
                live.record.name
            ));
        }
        joins_scheduler(core, fx, node);
    }
    let mut tick = Tick::default();
    for lost in found.lost {
        let name = lost.name;
        fx.warn(format!(
            "node {name} missed its heartbeat for {timeout:?}: marking it offline"
        ));
        tick.lost_nodes.push(lost.node);
        if lost.was_schedulable {
            fx.decide(Event::NodeDown(lost.node));
        }
        for attempt in lost.attempts {
            let message = if lost.after_restart {
                format!(
                    "node {name} did not come back within {}s of the server's restart",
                    timeout.as_secs()
                )
            } else {
                format!(
                    "node {name} stopped responding (no heartbeat for {}s)",
                    timeout.as_secs()
                )
            };
            tick.lost_attempts.push((
                attempt,
                AttemptOutcome::LaunchFailed {
                    reason: "node_lost".into(),
                    message,
                },
            ));
        }
    }
    tick
}
