//! EASY backfill. The first task that waits for resources gets a [`Reservation`]: the
//! time its share frees up as running tasks end by their time limits (the shadow time),
//! on the nodes it would take then. A task behind it may start now only if it ends
//! before the shadow time or leaves the reservation's share free on those nodes.

use std::collections::BTreeMap;

use tacc_core::{NodeId, Resources, TaskId, Timestamp};

use super::Scheduler;
use super::claims::hold_allows;
use super::pass::PassState;
use crate::config::SchedulerConfig;
use crate::{Placement, TaskRequest};

/// The first blocked task's reservation in the current decision.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub task: TaskId,
    pub shadow: Option<Timestamp>,
    pub need: Resources,
    pub free_after: BTreeMap<NodeId, Resources>,
}

impl Reservation {
    /// Whether a task starting now may still run at the shadow time (it is not sure to
    /// end before, by its time limit), so it must leave the reserved share free.
    pub(super) fn overlaps(
        &self,
        now: Timestamp,
        time_limit_secs: Option<u64>,
        config: &SchedulerConfig,
    ) -> bool {
        match (
            self.shadow,
            time_limit_secs.or(config.default_time_limit_secs),
        ) {
            (Some(shadow), Some(limit)) => now.plus_secs(limit) > shadow,
            _ => true,
        }
    }
}

impl Scheduler {
    /// Where and when the blocked `task` could start as running tasks end by their
    /// time limits (EASY's shadow time and the resources it needs then).
    pub(super) fn reserve(&self, now: Timestamp, task: TaskId) -> Option<Reservation> {
        let request = &self.tasks[&task].request;
        let releases = self.ends.iter().flat_map(|(end, id)| {
            let at = if *end == u64::MAX {
                u64::MAX
            } else {
                (*end).max(now.as_millis())
            };
            self.tasks[id].releases(at, *id)
        });
        let fit = self.cluster.earliest_fit(request, releases, &|_| true)?;
        let shadow = if fit.releases_used == 0 {
            Some(now)
        } else if fit.at == u64::MAX {
            None
        } else {
            Some(Timestamp(fit.at))
        };
        Some(Reservation {
            task,
            shadow,
            need: request.per_node,
            free_after: fit.free_after,
        })
    }

    /// The reservation the blocked `task` would get from the current state; for tests
    /// ("backfill never delays the reservation").
    #[doc(hidden)]
    pub fn recompute_reservation(&self, task: TaskId) -> Option<Option<Timestamp>> {
        self.tasks.get(&task)?;
        self.reserve(self.now, task).map(|r| r.shadow)
    }

    /// Nodes for `request` now that keep what claims hold and, if the task may still run
    /// at the shadow time, the reservation's share on its nodes.
    pub(super) fn place_around(
        &self,
        now: Timestamp,
        request: &TaskRequest,
        pass: &PassState,
    ) -> Option<Vec<Placement>> {
        let use_per_node = request.per_node;
        let (cluster, holds) = (&self.cluster, &pass.holds);
        let keeps_holds = |node: NodeId| hold_allows(cluster, holds, node, &use_per_node, u64::MAX);
        let placement = self.policy.placement.as_ref();
        match &pass.reservation {
            Some(held) if held.overlaps(now, request.time_limit_secs, &self.config) => {
                let need = held.need;
                let keeps_reservation = |node: NodeId| {
                    held.free_after
                        .get(&node)
                        .is_none_or(|free| free.covers(&use_per_node.add(&need)))
                        && keeps_holds(node)
                };
                cluster.place(request, placement, &keeps_reservation)
            }
            _ => cluster.place(request, placement, &keeps_holds),
        }
    }

    /// A task placed beside the reservation that may still run at the shadow time uses
    /// up that much of the room the reservation leaves on its nodes.
    pub(super) fn backfilled(
        now: Timestamp,
        request: &TaskRequest,
        config: &SchedulerConfig,
        placements: &[Placement],
        pass: &mut PassState,
    ) {
        if let Some(held) = &mut pass.reservation
            && held.overlaps(now, request.time_limit_secs, config)
        {
            for p in placements {
                if let Some(free) = held.free_after.get_mut(&p.node) {
                    *free = free.saturating_sub(&request.per_node);
                }
            }
        }
    }

    /// The task that `request` must wait for although it fits now: the reserved task, or
    /// the claimant holding a node it would take. `None` when it does not fit at all.
    pub(super) fn held_for_another(
        &self,
        request: &TaskRequest,
        pass: &PassState,
    ) -> Option<TaskId> {
        if pass.reservation.is_none() && pass.holds.is_empty() {
            return None;
        }
        let placements = self
            .cluster
            .place(request, self.policy.placement.as_ref(), &|_| true)?;
        let claimant = placements
            .iter()
            .find_map(|p| pass.holds.get(&p.node).map(|hold| hold.claimant));
        match (&pass.reservation, claimant) {
            (Some(held), _) => Some(held.task),
            (None, Some(claimant)) => Some(claimant),
            (None, None) => unreachable!("placement vetoed by nothing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn easy_backfill_respects_the_reservation() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        let mut long = request(1, 2, 1, 0);
        long.time_limit_secs = Some(100);
        submit(&mut s, 1, long);
        let mut big = request(1, 4, 1, 1);
        big.time_limit_secs = Some(10);
        submit(&mut s, 2, big);
        assert_eq!(
            s.reservation(),
            Some((TaskId(2), Some(Timestamp::from_secs(100))))
        );
        // Ends before the reservation: may backfill.
        let mut short = request(1, 1, 1, 2);
        short.time_limit_secs = Some(50);
        assert_eq!(started(&submit(&mut s, 3, short)), vec![TaskId(3)]);
        // Would still run at 100 s: must wait, with the reason saying why.
        let mut late = request(1, 1, 1, 3);
        late.time_limit_secs = Some(500);
        let plan = submit(&mut s, 4, late);
        assert!(started(&plan).is_empty());
        assert!(plan.actions.contains(&Action::Pending {
            task: TaskId(4),
            reason: PendingReason::LowerPriority {
                blocked_by: TaskId(2)
            }
        }));
        match s.explain(TaskId(2)) {
            Explanation::Queued {
                estimated_start,
                position,
                ..
            } => {
                assert_eq!(estimated_start, Some(Timestamp::from_secs(100)));
                assert_eq!(position, 0);
            }
            other => panic!("{other:?}"),
        }
    }
}
