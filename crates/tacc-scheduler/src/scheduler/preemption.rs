//! Preemption: when a task waits for resources, a group below its guarantee may reclaim
//! what borrowers hold, and (under preemptive policies) a higher level may stop a lower
//! one. Victims are running preemptible tasks past their minimum run time, cheapest lost
//! work first, kept only if the claimant's nodes need them; what they free is then held
//! for the claimant by a [`Claim`] while they stop within their grace period.

use tacc_core::{NodeId, TaskId, Timestamp};

use super::claims::Claim;
use super::pass::PassState;
use super::task::Phase;
use super::{Action, Scheduler};

impl Scheduler {
    /// Whether `task` may claim capacity by preemption at all.
    pub(super) fn may_claim(&self, task: TaskId) -> bool {
        if self.preemptible_running == 0 {
            return false;
        }
        self.reclaims(task) || (self.policy.preemptive && self.config.preemption.by_priority)
    }

    /// The task's group has a guarantee and is below it even after starting the task.
    fn reclaims(&self, task: TaskId) -> bool {
        let entry = &self.tasks[&task];
        self.config.preemption.reclaim
            && self.groups[entry.group].guaranteed_gpus > 0
            && self.within_guarantee(entry)
    }

    /// Pick preemptible victims that lose the least work and free room for `task`.
    /// The claimant's fit may not use a node another claim holds; the nodes it chooses
    /// are then held for it (with what is still running or stopping there counted in)
    /// until it starts.
    pub(super) fn try_preempt(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        let candidates = self.candidates(now, task);
        if candidates.is_empty() {
            return;
        }
        let Some((victims, claim)) = self.plan_claim(task, &candidates, pass) else {
            return;
        };
        self.next_claim += 1;
        self.hold_claim(&claim, pass);
        self.claims.push(claim);
        self.stop(now, victims, actions);
    }

    /// The running tasks `task` may stop, each with the work it would lose (GPU-ms run
    /// so far), cheapest first.
    fn candidates(&self, now: Timestamp, task: TaskId) -> Vec<(u64, TaskId)> {
        let reclaim = self.reclaims(task);
        let by_priority = self.policy.preemptive && self.config.preemption.by_priority;
        let ctx = self.rank_context(now);
        let claimant = &self.tasks[&task];
        let level = self
            .policy
            .ordering
            .preemption_level(&ctx, &self.view(now, task, claimant));
        let mut candidates: Vec<(u64, TaskId)> = Vec::new();
        for id in &self.running {
            let entry = &self.tasks[id];
            let Phase::Running { started_at, .. } = &entry.phase else {
                continue;
            };
            let exempt_ms = self.config.preemption.min_run_secs * 1000;
            if !entry.request.preemptible || now.millis_since(*started_at) < exempt_ms {
                continue;
            }
            let group = &self.groups[entry.group];
            let borrowing = group.account.usage.gpu_hundredths
                > group.guaranteed_gpus * u64::from(tacc_core::GPU_HUNDREDTHS);
            let reclaimable = reclaim && entry.group != claimant.group && borrowing;
            let outranked = by_priority
                && (entry.group == claimant.group || borrowing)
                && self
                    .policy
                    .ordering
                    .preemption_level(&ctx, &self.view(now, *id, entry))
                    < level;
            if reclaimable || outranked {
                let lost_work =
                    now.millis_since(*started_at) * entry.request.total().gpus.max(1) as u64;
                candidates.push((lost_work, *id));
            }
        }
        candidates.sort_unstable();
        candidates
    }

    /// The victims (cheapest first) whose release lets `task` fit, and the claim that
    /// holds the nodes it would take; `None` when no victim is needed or none would do.
    fn plan_claim(
        &self,
        task: TaskId,
        candidates: &[(u64, TaskId)],
        pass: &PassState,
    ) -> Option<(Vec<TaskId>, Claim)> {
        let claimant = &self.tasks[&task];
        // Tasks already stopping free their share first, then candidates in order.
        let preempting = self
            .running
            .iter()
            .filter(|id| self.tasks[id].phase.is_preempting());
        let releases = preempting
            .map(|id| (0, *id))
            .chain(
                candidates
                    .iter()
                    .enumerate()
                    .map(|(i, (_, id))| (i as u64 + 1, *id)),
            )
            .flat_map(|(key, id)| self.tasks[&id].releases(key, id));
        let unclaimed = |node: NodeId| !pass.holds.contains_key(&node);
        let fit = self
            .cluster
            .earliest_fit(&claimant.request, releases, &unclaimed)?;
        let victims: Vec<TaskId> = candidates
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| fit.needed.contains(id))
            .collect();
        let need = claimant.request.per_node;
        // Releases are taken cheapest first, so an early one may turn out unneeded once a
        // later, bigger one is in: keep a victim only if its nodes need it.
        let mut needed = fit.needed.clone();
        for victim in victims.iter().rev() {
            let spare = fit.free_after.keys().all(|node| {
                let mut free = self.cluster.nodes[node].free;
                for id in needed.iter().filter(|id| *id != victim) {
                    free = free.add(&self.tasks[id].share_on(*node));
                }
                free.covers(&need)
            });
            if spare {
                needed.remove(victim);
            }
        }
        let victims: Vec<TaskId> = victims
            .into_iter()
            .filter(|id| needed.contains(id))
            .collect();
        if victims.is_empty() {
            return None;
        }
        let claim = Claim {
            seq: self.next_claim,
            task,
            need,
            nodes: fit.free_after.keys().copied().collect(),
            incoming: needed.iter().copied().collect(),
        };
        Some((victims, claim))
    }

    /// Tell the victims to stop: each keeps its share until it has stopped, at the latest
    /// when its grace period ends.
    fn stop(&mut self, now: Timestamp, victims: Vec<TaskId>, actions: &mut Vec<Action>) {
        let grace_secs = self.config.preemption.grace_secs;
        for victim in victims {
            let entry = self.tasks.get_mut(&victim).expect("running task");
            let Phase::Running {
                placements,
                started_at,
            } = &entry.phase
            else {
                continue;
            };
            entry.phase = Phase::Preempting {
                placements: placements.clone(),
                started_at: *started_at,
                since: now,
            };
            let old_key = entry.end_key;
            let new_key = now.plus_secs(grace_secs).as_millis().min(old_key);
            entry.end_key = new_key;
            if entry.request.preemptible {
                self.preemptible_running -= 1;
            }
            self.ends.remove(&(old_key, victim));
            self.ends.insert((new_key, victim));
            self.preemptions += 1;
            actions.push(Action::Preempt {
                task: victim,
                grace_secs,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn owners_reclaim_borrowed_gpus_by_preemption() {
        let mut s = borrowed(&[("a", 2), ("b", 2)], &[(1, 1), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(
            s.group_usage("b").gpu_hundredths,
            400,
            "b borrows a's idle share"
        );
        let plan = owner_arrives(&mut s, 2);
        let victims: Vec<TaskId> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Preempt {
                    task,
                    grace_secs: 30,
                } => Some(*task),
                _ => None,
            })
            .collect();
        // The two that ran the shortest lose the least work.
        assert_eq!(victims, vec![TaskId(4), TaskId(3)]);
        assert_eq!(s.preemptions(), 2);
        s.handle(Timestamp(720_000), Event::TaskPreempted(TaskId(3)))
            .unwrap();
        let plan = s
            .handle(Timestamp(720_000), Event::TaskPreempted(TaskId(4)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(9)]);
        assert!(matches!(
            s.explain(TaskId(4)),
            Explanation::Queued { attempt: 2, .. }
        ));
    }

    #[test]
    fn only_the_victims_the_claimant_needs_are_preempted() {
        let mut s = borrowed(&[("a", 2), ("b", 2)], &[(1, 3), (2, 1)]);
        let plan = owner_arrives(&mut s, 2);
        // Task 2 loses less work, but stopping it alone frees 1 GPU of the 2 needed, and
        // once task 1 is stopped task 2 is not needed at all.
        let preempted: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Preempt { .. }))
            .collect();
        assert_eq!(
            preempted,
            vec![&Action::Preempt {
                task: TaskId(1),
                grace_secs: 30
            }]
        );
    }
}
