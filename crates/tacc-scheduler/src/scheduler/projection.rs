//! Start estimates from the scheduler itself: a [`Projection`] runs a copy of the live
//! scheduler forward in virtual time, with every task that holds resources ending at its
//! time limit and every decision made by the same code that makes the live ones (quotas,
//! fair share, reservations, claims and preemptions, node shapes, CPUs, memory and GPUs),
//! and records when each queued task starts. Nothing new arrives in a projection, so an
//! estimate holds as long as nothing is submitted ahead of the task; tasks that end before
//! their limits can only make the real start earlier or, through backfill and ordering
//! anomalies, different — that is why the estimate is a range that starts at "now".
//!
//! A projection is bounded (a step cap and a time horizon) and deterministic, so a driver
//! can cache one per [`Scheduler::epoch`] and answer every task's estimate from it.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{Resources, TaskId, Timestamp};

use super::task::Phase;
use super::{Action, Event, Scheduler};
use crate::{LatestStart, PendingReason, StartEstimate, TaskEnd};

/// How far a projection may run before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectionLimits {
    /// Scheduling decisions (one per instant at which something ends) at most.
    pub max_steps: usize,
    /// Virtual time at most, from the state's present.
    pub horizon_secs: u64,
}

impl Default for ProjectionLimits {
    fn default() -> Self {
        ProjectionLimits {
            max_steps: 64,
            horizon_secs: 30 * 24 * 3600,
        }
    }
}

/// Most task ends named as what a start rests on (the rest are counted, not listed).
const MAX_NAMED: usize = 3;

/// Why a projection stopped before every queued task had started.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stop {
    /// Every queued task (or the one asked about) started.
    Done,
    /// Nothing more ends by a time limit; these hold resources with no time limit.
    NothingEnds { no_time_limit: Vec<TaskId> },
    /// The step cap or the horizon was reached at this time.
    Cap { at: Timestamp },
}

/// What a queued task looked like when the projection began.
#[derive(Debug, Clone)]
struct Waiting {
    not_before: Option<Timestamp>,
    /// No node carries its labels: its start depends on a node registering, not on time.
    waits_for_node: bool,
}

/// The scheduler's state run forward: when each queued task starts if everything ends at
/// its time limit and nothing new arrives.
#[derive(Debug, Clone)]
pub struct Projection {
    from: Timestamp,
    epoch: u64,
    steps: usize,
    waiting: BTreeMap<TaskId, Waiting>,
    starts: BTreeMap<TaskId, (Timestamp, Vec<TaskEnd>)>,
    stop: Stop,
}

impl Projection {
    /// The scheduler epoch it was computed at (see [`Scheduler::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The state's time it starts from.
    pub fn from(&self) -> Timestamp {
        self.from
    }

    /// Scheduling decisions it made.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Queued tasks it found a start for.
    pub fn started(&self) -> usize {
        self.starts.len()
    }

    /// The estimate for `task` as seen at `now`; `None` when the task was not queued when
    /// the projection began, or no node can run it yet (no estimate is meaningful).
    pub fn estimate(&self, task: TaskId, now: Timestamp) -> Option<StartEstimate> {
        let waiting = self.waiting.get(&task)?;
        if waiting.waits_for_node {
            return None;
        }
        // No earlier than now, nor before a retry's backoff ends: a running task may end
        // (or be cancelled) at any moment, so nothing later is a sure lower bound.
        let earliest = now.max(waiting.not_before.unwrap_or(now));
        let (latest, after) = match self.starts.get(&task) {
            // An estimate the clock has overtaken (a task past its limit not yet reported
            // ended) is "any moment now", never a start in the past.
            Some((at, after)) => (LatestStart::At((*at).max(earliest)), after.clone()),
            None => match &self.stop {
                Stop::NothingEnds { no_time_limit } => (
                    LatestStart::Unknown {
                        no_time_limit: no_time_limit.clone(),
                    },
                    Vec::new(),
                ),
                Stop::Cap { at } => (LatestStart::BeyondHorizon { after: *at }, Vec::new()),
                // Every task it followed started; one it did not follow has no answer.
                Stop::Done => return None,
            },
        };
        Some(StartEstimate {
            earliest,
            latest,
            after,
        })
    }
}

impl Scheduler {
    /// Changes whenever the state changes in a way that can change a projection: every
    /// event but a [`Event::Tick`] that decided nothing. A driver caches a [`Projection`]
    /// per epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Count epochs on from after `earlier`: a driver that replaces its scheduler with a
    /// rebuilt one keeps epochs unique, so no projection cached for the old one is taken
    /// for the new one's.
    pub fn continue_epochs_after(&mut self, earlier: u64) {
        self.epoch = self.epoch.saturating_add(earlier).saturating_add(1);
    }

    /// Project every queued task's start (see the module documentation).
    pub fn project(&self, limits: ProjectionLimits) -> Projection {
        project(self.quiet_copy(), None, limits, self.epoch)
    }

    /// A copy whose decisions say only what starts and stops (see `unfit_shapes`).
    fn quiet_copy(&self) -> Scheduler {
        let mut copy = self.clone();
        copy.set_quiet(true);
        copy
    }

    /// What-if: the projection with the running tasks of `likely_ends` ending then instead
    /// of at their time limits (where that is earlier; never before the state's present):
    /// a likelier start where the history gives run times.
    pub fn project_likely(
        &self,
        likely_ends: &BTreeMap<TaskId, Timestamp>,
        limits: ProjectionLimits,
    ) -> Projection {
        let mut copy = self.quiet_copy();
        let present = copy.now.as_millis();
        for (task, at) in likely_ends {
            let Some(entry) = copy.tasks.get_mut(task) else {
                continue;
            };
            if !matches!(entry.phase, Phase::Running { .. }) {
                continue;
            }
            let key = at.as_millis().max(present).min(entry.end_key);
            if key == entry.end_key {
                continue;
            }
            copy.ends.remove(&(entry.end_key, *task));
            copy.ends.insert((key, *task));
            entry.end_key = key;
        }
        project(copy, None, limits, self.epoch)
    }

    /// Project one queued task's start, stopping as soon as it starts.
    pub fn project_task(&self, task: TaskId, limits: ProjectionLimits) -> Projection {
        project(self.quiet_copy(), Some(task), limits, self.epoch)
    }

    /// What-if: the projection of `task` had it asked for `per_node` instead (same
    /// submission time and place in the policy's order otherwise). `None` when the task
    /// is not queued, or could never run so.
    pub fn project_reshaped(
        &self,
        task: TaskId,
        per_node: Resources,
        limits: ProjectionLimits,
    ) -> Option<Projection> {
        self.project_as(task, limits, |request| request.per_node = per_node)
    }

    /// What-if: the projection of `task` had it selected nodes labelled `key=value`
    /// instead of the value it selects (another partition, another pool of nodes). `None`
    /// when the task is not queued, or could never run there.
    pub fn project_relabelled(
        &self,
        task: TaskId,
        key: &str,
        value: &str,
        limits: ProjectionLimits,
    ) -> Option<Projection> {
        self.project_as(task, limits, |request| {
            request
                .node_selector
                .insert(key.to_string(), value.to_string());
        })
    }

    /// The other values of the labels the queued `task` selects nodes by, as carried by
    /// the schedulable nodes up now (each label's values in order, at most `per_label` of
    /// them): where [`Scheduler::project_relabelled`] may look.
    pub fn other_label_values(&self, task: TaskId, per_label: usize) -> Vec<(String, String)> {
        let Some(entry) = self.tasks.get(&task) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for (key, asked) in &entry.request.node_selector {
            let values: std::collections::BTreeSet<&String> = self
                .cluster
                .nodes
                .values()
                .filter(|node| node.schedulable)
                .filter_map(|node| node.spec.labels.get(key))
                .filter(|value| *value != asked)
                .collect();
            found.extend(
                values
                    .into_iter()
                    .take(per_label)
                    .map(|value| (key.clone(), value.clone())),
            );
        }
        found
    }

    /// The projection of the queued `task` with its request changed by `change`.
    fn project_as(
        &self,
        task: TaskId,
        limits: ProjectionLimits,
        change: impl FnOnce(&mut crate::TaskRequest),
    ) -> Option<Projection> {
        let entry = self.tasks.get(&task)?;
        if !entry.phase.is_queued() {
            return None;
        }
        let mut request = crate::TaskRequest::clone(&entry.request);
        change(&mut request);
        let mut sim = self.clone();
        let now = sim.now;
        // Withdrawn and submitted again at the present: the decision that follows is the
        // one the live scheduler would make for the reshaped task. Not a quiet one: the
        // projection reads the reshaped task's pending reason (whether it waits for a
        // node) from it.
        let plan = sim
            .handle(
                now,
                Event::Batch(vec![
                    Event::TaskCancelled(task),
                    Event::TaskSubmitted { task, request },
                ]),
            )
            .ok()?;
        sim.set_quiet(true);
        if plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Reject { task: t, .. } if *t == task))
        {
            return None;
        }
        let mut projection = project(sim, Some(task), limits, self.epoch);
        if plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Start { task: t, .. } if *t == task))
        {
            projection.waiting.insert(
                task,
                Waiting {
                    not_before: None,
                    waits_for_node: false,
                },
            );
            projection.starts.insert(task, (now, Vec::new()));
        }
        Some(projection)
    }
}

/// Run `sim` forward until every queued task (or `target`) started, nothing more ends by
/// a time limit, or `limits` are reached.
fn project(
    mut sim: Scheduler,
    target: Option<TaskId>,
    limits: ProjectionLimits,
    epoch: u64,
) -> Projection {
    let from = sim.now;
    let horizon = from.plus_secs(limits.horizon_secs).as_millis();
    let waiting: BTreeMap<TaskId, Waiting> = sim
        .queue
        .iter()
        .map(|key| &key.task)
        .filter(|id| target.is_none_or(|t| t == **id))
        .map(|id| {
            let entry = &sim.tasks[id];
            let waits_for_node = matches!(
                entry.phase,
                Phase::Queued {
                    reason: Some(
                        PendingReason::NoMatchingNode { .. }
                            | PendingReason::WaitingForCapacity { .. }
                    )
                }
            );
            (
                *id,
                Waiting {
                    not_before: entry.request.not_before.filter(|t| *t > from),
                    waits_for_node,
                },
            )
        })
        .collect();
    let mut unstarted: BTreeSet<TaskId> = waiting
        .iter()
        .filter(|(_, w)| !w.waits_for_node)
        .map(|(id, _)| *id)
        .collect();
    // Backoffs end at fixed times: a decision is due then even if nothing ends.
    let mut backoffs: BTreeSet<u64> = waiting
        .values()
        .filter_map(|w| w.not_before.map(Timestamp::as_millis))
        .collect();
    // Tasks told to stop by a preemption stop after the grace period (the driver then
    // reports them preempted); the same holds for victims chosen during the projection.
    let grace_ms = sim.config.preemption.grace_secs.saturating_mul(1000);
    let mut preempted: BTreeMap<u64, Vec<TaskId>> = BTreeMap::new();
    // Every task that holds resources is in `running`, in id order.
    for id in &sim.running {
        if let Phase::Preempting { since, .. } = sim.tasks[id].phase {
            let due = since
                .as_millis()
                .saturating_add(grace_ms)
                .max(from.as_millis());
            preempted.entry(due).or_default().push(*id);
        }
    }
    let mut starts = BTreeMap::new();
    let mut steps = 0;
    let mut now = from.as_millis();
    let stop = loop {
        if unstarted.is_empty() {
            break Stop::Done;
        }
        let next_end = sim
            .ends
            .iter()
            .find(|(_, id)| !sim.tasks[id].phase.is_preempting())
            .map(|(end, _)| *end)
            .filter(|end| *end != u64::MAX)
            .map(|end| end.max(now));
        let next = [
            next_end,
            backoffs.first().copied(),
            preempted.keys().next().copied(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(at) = next else {
            let no_time_limit = sim
                .ends
                .iter()
                .filter(|(end, _)| *end == u64::MAX)
                .map(|(_, id)| *id)
                .take(MAX_NAMED)
                .collect();
            break Stop::NothingEnds { no_time_limit };
        };
        if steps >= limits.max_steps || at > horizon {
            break Stop::Cap { at: Timestamp(now) };
        }
        steps += 1;
        now = at;
        let mut events = Vec::new();
        let mut ended = Vec::new();
        for (end, id) in &sim.ends {
            if *end > at {
                break;
            }
            if !sim.tasks[id].phase.is_preempting() {
                events.push(Event::TaskEnded(*id));
                ended.push(TaskEnd {
                    task: *id,
                    at: Timestamp(at),
                });
            }
        }
        while let Some(entry) = preempted.first_entry() {
            if *entry.key() > at {
                break;
            }
            events.extend(entry.remove().into_iter().map(Event::TaskPreempted));
        }
        while backoffs.first().is_some_and(|b| *b <= at) {
            backoffs.pop_first();
        }
        let Ok(plan) = sim.handle(Timestamp(at), Event::Batch(events)) else {
            // The copy contradicts itself only if the live state does; give up honestly.
            break Stop::Cap { at: Timestamp(now) };
        };
        ended.truncate(MAX_NAMED);
        for action in plan.actions {
            match action {
                Action::Start { task, .. } => {
                    if unstarted.remove(&task) {
                        starts.insert(task, (Timestamp(at), ended.clone()));
                    }
                }
                Action::Preempt { task, grace_secs } => preempted
                    .entry(at.saturating_add(grace_secs.saturating_mul(1000)))
                    .or_default()
                    .push(task),
                Action::Reject { task, .. } => {
                    unstarted.remove(&task);
                }
                Action::Pending { .. } => {}
            }
        }
    };
    // Decisions in the copy moved the placement clock of this thread into the future;
    // put it back at the state's present for whatever this thread places next.
    super::allocation_end::set_now(from);
    Projection {
        from,
        epoch,
        steps,
        waiting,
        starts,
        stop,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::{Limits, UserConfig};

    fn limited(mut request: TaskRequest, secs: u64) -> TaskRequest {
        request.time_limit_secs = Some(secs);
        request
    }

    fn estimate(s: &Scheduler, task: u64) -> StartEstimate {
        s.project(ProjectionLimits::default())
            .estimate(TaskId(task), Timestamp::from_secs(5))
            .expect("an estimate")
    }

    #[test]
    fn a_quota_blocked_task_starts_when_the_users_running_task_reaches_its_limit() {
        let mut config = SchedulerConfig::default();
        config.users.insert(
            "bob".into(),
            UserConfig {
                limits: Limits {
                    max_running_tasks: Some(1),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 0)).unwrap();
        let bob = |at| TaskRequest {
            user: UserName::new("bob"),
            ..request(1, 0, 1, at)
        };
        assert_eq!(
            started(&submit(&mut s, 1, limited(bob(0), 600))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, limited(bob(5_000), 60));
        assert!(matches!(
            pending_reason(&plan, 2),
            Some(PendingReason::OverUserQuota { .. })
        ));
        let estimate = estimate(&s, 2);
        assert_eq!(estimate.earliest, Timestamp::from_secs(5));
        assert_eq!(estimate.latest, LatestStart::At(Timestamp::from_secs(600)));
        assert_eq!(
            estimate.after,
            vec![TaskEnd {
                task: TaskId(1),
                at: Timestamp::from_secs(600)
            }]
        );
        // The explanation carries the same latest start.
        assert!(matches!(
            s.explain(TaskId(2)),
            Explanation::Queued { estimated_start: Some(at), .. } if at == Timestamp::from_secs(600)
        ));
    }

    #[test]
    fn a_task_held_behind_a_backfill_reservation_does_not_start_now() {
        let mut s = Scheduler::by_name("fifo-backfill", SchedulerConfig::default()).unwrap();
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        submit(&mut s, 1, limited(request(1, 2, 1, 0), 100));
        // Needs all four GPUs: reserved for when task 1 ends.
        submit(&mut s, 2, limited(request(1, 4, 1, 1), 10));
        // Fits now, but would still run at the shadow time: held for task 2.
        let plan = submit(&mut s, 3, limited(request(1, 1, 1, 5_000), 500));
        assert_eq!(
            pending_reason(&plan, 3),
            Some(&PendingReason::LowerPriority {
                blocked_by: TaskId(2)
            })
        );
        assert_eq!(
            estimate(&s, 2).latest,
            LatestStart::At(Timestamp::from_secs(100))
        );
        let held = estimate(&s, 3);
        assert_eq!(held.latest, LatestStart::At(Timestamp::from_secs(110)));
        assert_eq!(held.after[0].task, TaskId(2));
    }

    #[test]
    fn a_cpu_only_task_on_full_cpus_waits_for_the_cpus() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 2)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, limited(request(4, 0, 1, 0), 60))),
            vec![TaskId(1)]
        );
        // Two GPUs are free, but no CPU is.
        submit(&mut s, 2, limited(request(1, 0, 1, 5_000), 60));
        assert_eq!(
            estimate(&s, 2).latest,
            LatestStart::At(Timestamp::from_secs(60))
        );
    }

    #[test]
    fn the_estimate_is_unknown_when_a_blocker_has_no_time_limit() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        submit(&mut s, 1, limited(request(2, 0, 1, 0), 60));
        submit(&mut s, 2, request(2, 0, 1, 1));
        submit(&mut s, 3, limited(request(4, 0, 1, 5_000), 60));
        assert_eq!(
            estimate(&s, 3).latest,
            LatestStart::Unknown {
                no_time_limit: vec![TaskId(2)]
            }
        );
        assert!(matches!(
            s.explain(TaskId(3)),
            Explanation::Queued {
                estimated_start: None,
                ..
            }
        ));
    }

    #[test]
    fn a_projection_stops_at_its_step_cap() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 1, 0)).unwrap();
        for id in 1..=5 {
            submit(&mut s, id, limited(request(1, 0, 1, id), 10));
        }
        let capped = s.project(ProjectionLimits {
            max_steps: 2,
            ..Default::default()
        });
        assert_eq!(capped.steps(), 2);
        let at = |task| capped.estimate(TaskId(task), Timestamp(5)).unwrap().latest;
        assert_eq!(at(3), LatestStart::At(Timestamp(20_001)));
        assert_eq!(
            at(4),
            LatestStart::BeyondHorizon {
                after: Timestamp(20_001)
            }
        );
    }

    #[test]
    fn fewer_gpus_is_projected_as_a_what_if() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        submit(&mut s, 1, limited(request(1, 2, 1, 0), 100));
        submit(&mut s, 2, limited(request(1, 4, 1, 1), 100));
        let limits = ProjectionLimits::default();
        let now = Timestamp(1);
        let as_asked = s.project_task(TaskId(2), limits).estimate(TaskId(2), now);
        assert_eq!(
            as_asked.unwrap().latest,
            LatestStart::At(Timestamp::from_secs(100))
        );
        let half = s
            .project_reshaped(TaskId(2), Resources::new(1000, 1 << 30, 2), limits)
            .unwrap();
        assert_eq!(
            half.estimate(TaskId(2), now).unwrap().latest,
            LatestStart::At(now)
        );
        // The live state is untouched.
        assert_eq!(s.queue_len(), 1);
        s.check_invariants().unwrap();
    }

    #[test]
    fn another_pool_of_nodes_is_projected_as_a_what_if() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), labelled(1, 4, &[("pool", "a")]))
            .unwrap();
        s.handle(Timestamp(0), labelled(2, 4, &[("pool", "b")]))
            .unwrap();
        s.handle(
            Timestamp(0),
            labelled(3, 4, &[("pool", "c"), ("other", "x")]),
        )
        .unwrap();
        submit(&mut s, 1, limited(selecting(4, 1, &[("pool", "a")]), 100));
        submit(&mut s, 2, limited(selecting(4, 2, &[("pool", "a")]), 100));
        let limits = ProjectionLimits::default();
        let now = Timestamp(2);
        assert_eq!(
            s.other_label_values(TaskId(2), 3),
            vec![
                ("pool".to_string(), "b".to_string()),
                ("pool".to_string(), "c".to_string())
            ]
        );
        assert_eq!(s.other_label_values(TaskId(2), 1).len(), 1);
        // Task 1 holds pool a until its limit, 100 s after its start at 1 ms.
        let asked = s.project_task(TaskId(2), limits).estimate(TaskId(2), now);
        assert_eq!(asked.unwrap().latest, LatestStart::At(Timestamp(100_001)));
        let moved = s
            .project_relabelled(TaskId(2), "pool", "b", limits)
            .unwrap();
        assert_eq!(
            moved.estimate(TaskId(2), now).unwrap().latest,
            LatestStart::At(now)
        );
        // The live state is untouched.
        assert_eq!(s.queue_len(), 1);
        s.check_invariants().unwrap();
    }

    #[test]
    fn only_ticks_that_decide_nothing_keep_the_epoch() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 1, 0)).unwrap();
        let epoch = s.epoch();
        s.handle(Timestamp(10), Event::Tick).unwrap();
        assert_eq!(s.epoch(), epoch);
        submit(&mut s, 1, request(1, 0, 1, 20));
        assert_ne!(s.epoch(), epoch);
    }
}
