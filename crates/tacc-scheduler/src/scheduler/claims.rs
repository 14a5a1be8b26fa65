//! Claims: the capacity a preemption frees, held for the task it was made for (the
//! claimant) across decisions. Each decision first drops the claims that can no longer be
//! honoured and gives the remaining claimants, oldest first, the first chance to start;
//! meanwhile no other task may take a claimed node's held share ([`hold_allows`]) or the
//! quota a claimant needs ([`Scheduler::quota_held`]).

use std::collections::BTreeMap;

use tacc_core::{NodeId, Resources, TaskId, Timestamp};

use super::Scheduler;
use super::accounts::Extra;
use super::pass::PassState;
use super::{Action, Cluster};
use crate::PendingReason;

/// Capacity that preemption frees, held for the task that claimed it. It lasts across
/// decisions until the claimant starts, leaves the queue, can no longer be admitted, or
/// loses a claimed node; meanwhile no other task may start on the claimed share or take
/// the quota the claimant needs, and the claimant is considered before everyone else.
#[derive(Debug, Clone)]
pub(super) struct Claim {
    /// Creation order: a claimant respects the holds of older claims only.
    pub seq: u64,
    pub task: TaskId,
    /// The claimant's per-node share, held on each of `nodes`.
    pub need: Resources,
    pub nodes: Vec<NodeId>,
    /// Tasks stopping on those nodes whose release the claim counts on.
    pub incoming: Vec<TaskId>,
}

/// What a claim holds on one node during a decision.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hold {
    pub seq: u64,
    pub claimant: TaskId,
    pub need: Resources,
    /// What the claim's stopping tasks still hold there.
    pub incoming: Resources,
}

/// Whether a task with seniority `before` (claims with a smaller `seq` bind it) may take
/// `per_node` on `node` without eating into what a claim holds there.
pub(super) fn hold_allows(
    cluster: &Cluster,
    holds: &BTreeMap<NodeId, Hold>,
    node: NodeId,
    per_node: &Resources,
    before: u64,
) -> bool {
    match holds.get(&node) {
        Some(hold) if hold.seq < before => cluster.nodes[&node]
            .free
            .add(&hold.incoming)
            .covers(&hold.need.add(per_node)),
        _ => true,
    }
}

impl Scheduler {
    /// Hold `claim`'s nodes for this decision, each with what its stopping tasks still
    /// hold there.
    pub(super) fn hold_claim(&self, claim: &Claim, pass: &mut PassState) {
        for node in &claim.nodes {
            let incoming = claim
                .incoming
                .iter()
                .map(|id| self.tasks[id].share_on(*node))
                .fold(Resources::ZERO, |acc, r| acc.add(&r));
            pass.holds.insert(
                *node,
                Hold {
                    seq: claim.seq,
                    claimant: claim.task,
                    need: claim.need,
                    incoming,
                },
            );
        }
    }

    /// Drop the claims that can no longer be honoured, then give each claimant, oldest
    /// claim first, the first chance to start.
    pub(super) fn settle_claims(
        &mut self,
        now: Timestamp,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        let mut claims = std::mem::take(&mut self.claims);
        claims.retain_mut(|claim| {
            let queued = self
                .tasks
                .get(&claim.task)
                .is_some_and(|e| e.phase.is_queued());
            let nodes_usable = claim.nodes.iter().all(|id| {
                self.cluster
                    .nodes
                    .get(id)
                    .is_some_and(|node| node.schedulable)
            });
            claim
                .incoming
                .retain(|id| self.tasks.get(id).is_some_and(|e| e.phase.is_preempting()));
            queued && nodes_usable
        });
        for claim in &claims {
            self.hold_claim(claim, pass);
        }
        let order: Vec<(u64, TaskId, bool)> = claims
            .iter()
            .map(|c| (c.seq, c.task, c.incoming.is_empty()))
            .collect();
        self.claims = claims;
        for (seq, task, nothing_incoming) in order {
            let entry = &self.tasks[&task];
            let admitted = self
                .policy
                .admission
                .admit(&self.view(now, task, entry), &self.quota_view(entry));
            if let Err(reason) = admitted {
                self.drop_claim(seq, pass);
                self.set_reason(task, reason, actions);
                continue;
            }
            if let Some(holder) = self.quota_held(now, task, seq) {
                pass.waiting_claimants.insert(task);
                let reason = PendingReason::LowerPriority { blocked_by: holder };
                self.set_reason(task, reason, actions);
                continue;
            }
            let request = &entry.request;
            let (cluster, holds) = (&self.cluster, &pass.holds);
            let allow = |node: NodeId| hold_allows(cluster, holds, node, &request.per_node, seq);
            let placement = cluster.place(request, self.policy.placement.as_ref(), &allow);
            if let Some(placements) = placement {
                self.drop_claim(seq, pass);
                self.start(now, task, placements, Some(actions));
            } else if nothing_incoming {
                // Everything it counted on is back and it still does not fit (a placement
                // policy's choice, a restored task): the walk treats it as any other task.
                self.drop_claim(seq, pass);
            } else {
                pass.waiting_claimants.insert(task);
                self.set_reason(task, PendingReason::WaitingForResources, actions);
            }
        }
    }

    fn drop_claim(&mut self, seq: u64, pass: &mut PassState) {
        self.claims.retain(|c| c.seq != seq);
        pass.holds.retain(|_, hold| hold.seq != seq);
    }

    /// A claim (older than `before`) whose claimant could no longer be admitted if `task`
    /// started now, counting every older claimant as started: claims hold quota too.
    pub(super) fn quota_held(&self, now: Timestamp, task: TaskId, before: u64) -> Option<TaskId> {
        let entry = &self.tasks[&task];
        let mut extra = Extra::default();
        extra.add(entry);
        for claim in self.claims.iter().filter(|c| c.seq < before) {
            if claim.task == task {
                continue;
            }
            let claimant = &self.tasks[&claim.task];
            if (claimant.user == entry.user || claimant.group == entry.group)
                && self
                    .policy
                    .admission
                    .admit(
                        &self.view(now, claim.task, claimant),
                        &self.quota_with(claimant, &extra),
                    )
                    .is_err()
            {
                return Some(claim.task);
            }
            extra.add(claimant);
        }
        None
    }

    /// Whether `task` would still be admitted once every open claimant has started.
    pub(super) fn admitted_after_claims(&self, now: Timestamp, task: TaskId) -> bool {
        let mut extra = Extra::default();
        for claim in &self.claims {
            extra.add(&self.tasks[&claim.task]);
        }
        let entry = &self.tasks[&task];
        self.policy
            .admission
            .admit(
                &self.view(now, task, entry),
                &self.quota_with(entry, &extra),
            )
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn what_victims_free_is_held_for_the_claimant() {
        // Once both its tasks are stopped, b is back within its guarantee and its older
        // task ranks first: without the claim it would take the GPUs straight back.
        let mut s = borrowed(&[("a", 4), ("b", 3)], &[(1, 3), (2, 1)]);
        let plan = owner_arrives(&mut s, 4);
        assert_eq!(s.preemptions(), 2, "{plan:?}");
        // The first victim stops: it may not start again on what the claimant needs.
        let plan = s
            .handle(Timestamp(710_000), Event::TaskPreempted(TaskId(2)))
            .unwrap();
        assert!(started(&plan).is_empty(), "{plan:?}");
        assert!(matches!(
            s.explain(TaskId(2)),
            Explanation::Queued {
                reason: Some(PendingReason::LowerPriority {
                    blocked_by: TaskId(9)
                }),
                ..
            }
        ));
        let plan = s
            .handle(Timestamp(720_000), Event::TaskPreempted(TaskId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(9)]);
    }
}
