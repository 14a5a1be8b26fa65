//! What lets a restarted server carry on as if it had never stopped. Facts that used to
//! live only in memory are kept in the store as they change — how each rank of a
//! multi-node attempt ended (with the change that records it), each group's fair-share
//! ledger and each node's last-seen time (both at most once per liveness check, when they
//! changed) — and read back at start. Nodes that held running attempts are known to the
//! scheduler again at once, with those attempts' allocations, as before the restart:
//! drained (nothing new lands on them) until their agents register again and claim what
//! they still run, or stay away for a heartbeat timeout and are lost.

use std::time::Duration;

use tacc_core::Timestamp;
use tacc_scheduler::{Event, LedgerState};
use tacc_store::{FairShareLedger, TaskRecord};

use super::nodes::node_spec;
use super::{Control, Core, placements_of, request_of};
use crate::ServerError;

/// A node's last-seen time is kept again once it is this much newer than the kept one.
const SEEN_KEPT_EVERY: Duration = Duration::from_secs(10);

impl Control {
    /// After a restart: the nodes of the attempts that were running become known to the
    /// scheduler (drained) and the attempts hold their allocations there again.
    pub(super) async fn expect_back(&self, inner: &mut Core, running: Vec<TaskRecord>) {
        let holding: Vec<tacc_core::NodeId> = inner
            .nodes
            .iter()
            .filter(|(_, live)| !live.assignments.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for node in holding {
            let Some(live) = inner.nodes.get_mut(&node) else {
                continue;
            };
            live.expected = true;
            let spec = node_spec(&live.record);
            self.drive(inner, Event::NodeUp(spec)).await;
            self.drive(inner, Event::NodeDrained(node)).await;
        }
        for record in running {
            let Some(spec) = inner.specs.get(&record.id) else {
                continue;
            };
            let group = inner.group_for(&self.config, &record.user);
            let event = Event::TaskRestored {
                task: record.id,
                request: request_of(spec, &record, record.submitted_at, group),
                placements: placements_of(&record.placements),
            };
            self.drive(inner, event).await;
        }
    }

    /// After a restart: every group's fair-share usage as it was kept, advanced to now.
    pub(super) async fn restore_fairshare(&self, inner: &mut Core) -> Result<(), ServerError> {
        let kept = self.store.load_fairshare().await?;
        let states: Vec<LedgerState> = kept
            .iter()
            .map(|l| LedgerState {
                group: l.group.clone(),
                value: l.value,
                rate: l.rate,
                at: l.at,
            })
            .collect();
        inner.scheduler.restore_fairshare(&states, self.clock.now());
        inner.fairshare_saved = kept;
        Ok(())
    }

    /// Keep what changed of the fair-share ledgers and the nodes' last-seen times (called
    /// with every liveness check). A store that cannot take them now gets them next time.
    pub(super) async fn keep_restart_facts(&self, inner: &mut Core) {
        let ledgers: Vec<FairShareLedger> = inner
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
        let changed: Vec<FairShareLedger> = ledgers
            .iter()
            .filter(|l| !inner.fairshare_saved.contains(l))
            .cloned()
            .collect();
        if !changed.is_empty() {
            match self.store.save_fairshare(&changed).await {
                Ok(()) => inner.fairshare_saved = ledgers,
                Err(e) => tracing::warn!("cannot keep the fair-share ledgers: {e}"),
            }
        }
        let now = self.clock.now();
        let seen: Vec<(tacc_core::NodeId, Timestamp)> = inner
            .nodes
            .iter()
            .filter(|(_, live)| live.online)
            .map(|(id, live)| {
                let ago = self.clock.since(live.last_seen).as_millis() as u64;
                (*id, Timestamp(now.0.saturating_sub(ago)))
            })
            .filter(|(id, at)| {
                inner
                    .seen_saved
                    .get(id)
                    .is_none_or(|kept| at.millis_since(*kept) >= SEEN_KEPT_EVERY.as_millis() as u64)
            })
            .collect();
        if !seen.is_empty() {
            match self.store.save_nodes_seen(&seen).await {
                Ok(()) => inner.seen_saved.extend(seen),
                Err(e) => tracing::warn!("cannot keep the nodes' last-seen times: {e}"),
            }
        }
    }
}
