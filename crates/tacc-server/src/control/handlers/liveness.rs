//! The liveness tick (every second): nodes silent past the heartbeat timeout go down and
//! their attempts are lost (`rules::liveness`); a stalled server gives every node a fresh
//! term; held-back flapping nodes that stayed up long enough get work again; retries
//! whose backoff is over are released; what a restart needs is marked for keeping.

use std::time::{Duration, Instant};

use tacc_core::{NodeId, Timestamp};
use tacc_proto::{AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;
use tacc_store::FairShareLedger;

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

/// The retried tasks whose backoff is over at `at` leave their wait, and the scheduler
/// is woken for them (it has them queued already).
pub(crate) fn on_retries_due(core: &mut Core, fx: &mut Effects, at: Timestamp) {
    let before = core.retry_at.len();
    core.retry_at.retain(|_, not_before| *not_before > at);
    if core.retry_at.len() < before {
        fx.decide(Event::Tick);
    }
}

/// A node's last-seen time is kept again once it is this much newer than the kept one.
const SEEN_KEPT_EVERY: Duration = Duration::from_secs(10);

/// What a restarted server needs and the store does not have yet: the fair-share
/// ledgers, when any changed, and the last-seen times of online nodes not kept for
/// [`SEEN_KEPT_EVERY`]. The shell writes them (outside the turn's transaction: losing
/// one costs a restart at most ten seconds of a node's silence or of usage decay) and
/// then tells the core what it kept with [`on_restart_facts_kept`].
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RestartFacts {
    /// Every ledger as it is now, when one changed since the last kept.
    pub ledgers: Option<Vec<FairShareLedger>>,
    pub seen: Vec<(NodeId, Timestamp)>,
}

impl RestartFacts {
    /// The ledgers that changed (what to write).
    pub(crate) fn changed_ledgers(&self, core: &Core) -> Vec<FairShareLedger> {
        self.ledgers
            .iter()
            .flatten()
            .filter(|l| !core.fairshare_saved.contains(l))
            .cloned()
            .collect()
    }
}

/// Mark what a restart would need that changed since it was last kept (see
/// [`RestartFacts`]); nothing when nothing did.
pub(crate) fn on_restart_facts_due(
    core: &Core,
    fx: &mut Effects,
    now: Timestamp,
    now_instant: Instant,
) {
    let ledgers: Vec<FairShareLedger> = core
        .scheduler
        .fairshare_ledgers()
        .into_iter()
        .map(|s| FairShareLedger {
            group: s.group,
            value: s.value,
            rate: s.rate,
            at: s.at,
        })
        .collect();
    let changed = ledgers.iter().any(|l| !core.fairshare_saved.contains(l));
    let seen = core
        .nodes
        .iter()
        .filter(|(_, live)| live.online)
        .map(|(id, live)| {
            let ago = now_instant
                .saturating_duration_since(live.last_seen)
                .as_millis() as u64;
            (*id, Timestamp(now.0.saturating_sub(ago)))
        })
        .filter(|(id, at)| {
            core.seen_saved
                .get(id)
                .is_none_or(|kept| at.millis_since(*kept) >= SEEN_KEPT_EVERY.as_millis() as u64)
        })
        .collect();
    let facts = RestartFacts {
        ledgers: changed.then_some(ledgers),
        seen,
    };
    if facts != RestartFacts::default() {
        fx.keep_for_restart = Some(facts);
    }
}

/// What of [`RestartFacts`] the store took: it is not written again until it changes.
pub(crate) fn on_restart_facts_kept(
    core: &mut Core,
    ledgers: Option<Vec<FairShareLedger>>,
    seen: Vec<(NodeId, Timestamp)>,
) {
    if let Some(ledgers) = ledgers {
        core.fairshare_saved = ledgers;
    }
    core.seen_saved.extend(seen);
}
