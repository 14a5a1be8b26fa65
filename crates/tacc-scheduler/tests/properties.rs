//! Property tests for every policy: no node over-allocated, limits never exceeded, gangs
//! all-or-nothing, determinism, and backfill never delays the reservation; start
//! estimates hold when every task ends at its time limit.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::pool::{PoolAction, PoolJob, PoolPolicy, PoolScheduler};
use tacc_scheduler::{
    Action, Event, GroupConfig, LatestStart, NodeSpec, Plan, ProjectionLimits, Scheduler,
    SchedulerConfig, StartEstimate, TaskRequest, policy_names,
};

#[derive(Debug, Clone)]
struct TaskCase {
    user: u8,
    gpus: u32,
    cpus: u64,
    nodes: u32,
    duration: u64,
    limit_known: bool,
    priority: u8,
    preemptible: bool,
    submit: u64,
}

fn task_case() -> impl Strategy<Value = TaskCase> {
    (
        0u8..4,
        0u32..=4,
        1u64..=8,
        1u32..=3,
        1u64..=100,
        any::<bool>(),
        0u8..3,
        any::<bool>(),
        0u64..60,
    )
        .prop_map(
            |(user, gpus, cpus, nodes, duration, limit_known, priority, preemptible, submit)| {
                TaskCase {
                    user,
                    gpus,
                    cpus,
                    nodes,
                    duration,
                    limit_known,
                    priority,
                    preemptible,
                    submit,
                }
            },
        )
}

const USER_GPU_LIMIT: u64 = 6;
const GROUP_RUNNING_LIMIT: u64 = 5;

fn config() -> SchedulerConfig {
    let mut config = SchedulerConfig::default();
    config.default_user_limits.max_gpus = Some(USER_GPU_LIMIT);
    config.groups.insert(
        "g0".into(),
        GroupConfig {
            guaranteed_gpus: 4,
            ..Default::default()
        },
    );
    let mut g1 = GroupConfig {
        guaranteed_gpus: 4,
        ..Default::default()
    };
    g1.limits.max_running_tasks = Some(GROUP_RUNNING_LIMIT);
    config.groups.insert("g1".into(), g1);
    config.preemption.min_run_secs = 5;
    config.preemption.grace_secs = 2;
    config
}

/// Replays the cases with a virtual clock, checking every plan; returns all plans.
/// `memos`: whether decisions reuse answers between equal tasks (the default); `quiet`:
/// whether they leave pending reasons out (as a projection's do).
fn replay(
    policy: &str,
    nodes: &[(u32, u64)],
    tasks: &[TaskCase],
    memos: bool,
    quiet: bool,
) -> Result<Vec<Plan>, TestCaseError> {
    let mut scheduler = Scheduler::by_name(policy, config()).unwrap();
    scheduler.set_walk_memos(memos);
    scheduler.set_quiet(quiet);
    let mut capacity = BTreeMap::new();
    for (i, (gpus, cpus)) in nodes.iter().enumerate() {
        let spec = NodeSpec {
            id: NodeId(i as u64 + 1),
            capacity: Resources::new(cpus * 1000, 1 << 40, *gpus),
            gpu_type: None,
            labels: Default::default(),
        };
        capacity.insert(spec.id, spec.capacity);
        scheduler.handle(Timestamp(0), Event::NodeUp(spec)).unwrap();
    }
    let requests: Vec<TaskRequest> = tasks
        .iter()
        .map(|t| TaskRequest {
            user: UserName::new(format!("u{}", t.user)),
            group: Some(format!("g{}", t.user % 2)),
            per_node: Resources::new(t.cpus * 1000, 1 << 30, t.gpus),
            nodes: t.nodes,
            priority: [Priority::Low, Priority::Normal, Priority::High][t.priority as usize],
            preemptible: t.preemptible,
            time_limit_secs: t.limit_known.then_some(t.duration),
            duration_hint_secs: Some(t.duration),
            submitted_at: Timestamp::from_secs(t.submit),
            ..Default::default()
        })
        .collect();
    let mut arrivals: Vec<usize> = (0..tasks.len()).collect();
    arrivals.sort_by_key(|i| (tasks[*i].submit, *i));
    // (time ms, kind 0 end / 1 preempted, task index, version)
    let mut timers: BinaryHeap<Reverse<(u64, u8, usize, u32)>> = BinaryHeap::new();
    let mut version = vec![0u32; tasks.len()];
    let mut held: BTreeMap<usize, Vec<(NodeId, Vec<u32>)>> = BTreeMap::new();
    let mut plans = Vec::new();
    let mut next = 0;
    loop {
        let now = [
            timers.peek().map(|Reverse((t, ..))| *t),
            arrivals.get(next).map(|i| tasks[*i].submit * 1000),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = now else { break };
        let mut events = Vec::new();
        while let Some(Reverse((t, kind, i, v))) = timers.peek().copied() {
            if t != now {
                break;
            }
            timers.pop();
            if version[i] != v {
                continue;
            }
            version[i] += 1;
            held.remove(&i);
            let id = TaskId(i as u64 + 1);
            events.push(if kind == 0 {
                Event::TaskEnded(id)
            } else {
                Event::TaskPreempted(id)
            });
        }
        while next < arrivals.len() && tasks[arrivals[next]].submit * 1000 == now {
            let i = arrivals[next];
            events.push(Event::TaskSubmitted {
                task: TaskId(i as u64 + 1),
                request: requests[i].clone(),
            });
            next += 1;
        }
        let plan = scheduler
            .handle(Timestamp(now), Event::Batch(events))
            .unwrap();
        for action in &plan.actions {
            match action {
                Action::Start { task, placements } => {
                    let i = task.0 as usize - 1;
                    let request = &requests[i];
                    let nodes: BTreeSet<NodeId> = placements.iter().map(|p| p.node).collect();
                    prop_assert_eq!(
                        nodes.len(),
                        request.nodes as usize,
                        "gang all-or-nothing on distinct nodes"
                    );
                    for p in placements {
                        prop_assert_eq!(p.gpu_indices.len(), request.per_node.gpus as usize);
                    }
                    held.insert(
                        i,
                        placements
                            .iter()
                            .map(|p| (p.node, p.gpu_indices.clone()))
                            .collect(),
                    );
                    timers.push(Reverse((now + tasks[i].duration * 1000, 0, i, version[i])));
                }
                Action::Preempt { task, grace_secs } => {
                    let i = task.0 as usize - 1;
                    prop_assert!(
                        requests[i].preemptible,
                        "only preemptible tasks are preempted"
                    );
                    version[i] += 1;
                    timers.push(Reverse((now + grace_secs * 1000, 1, i, version[i])));
                }
                _ => {}
            }
        }
        // No node over-allocated, no GPU given twice, limits respected.
        let mut used: BTreeMap<NodeId, (Resources, BTreeSet<u32>)> = BTreeMap::new();
        let mut user_gpus: BTreeMap<String, u64> = BTreeMap::new();
        let mut group_running: BTreeMap<String, u64> = BTreeMap::new();
        for (i, placements) in &held {
            let request = &requests[*i];
            *user_gpus.entry(request.user.0.clone()).or_default() += request.total().gpus as u64;
            *group_running
                .entry(request.group.clone().unwrap())
                .or_default() += 1;
            for (node, gpus) in placements {
                let slot = used
                    .entry(*node)
                    .or_insert((Resources::ZERO, BTreeSet::new()));
                slot.0 = slot.0.add(&request.per_node);
                for gpu in gpus {
                    prop_assert!(
                        slot.1.insert(*gpu),
                        "GPU {} of node {} given twice",
                        gpu,
                        node
                    );
                    prop_assert!(*gpu < capacity[node].gpus);
                }
            }
        }
        for (node, (total, _)) in &used {
            prop_assert!(capacity[node].covers(total), "node {} over-allocated", node);
        }
        for gpus in user_gpus.values() {
            prop_assert!(*gpus <= USER_GPU_LIMIT);
        }
        prop_assert!(group_running.get("g1").copied().unwrap_or(0) <= GROUP_RUNNING_LIMIT);
        scheduler.check_invariants().map_err(TestCaseError::fail)?;
        // Backfill never delays the reservation: what the head could get now is no later
        // than what it was promised before anything was backfilled.
        if let Some((head, Some(promised))) = scheduler.reservation()
            && let Some(Some(possible)) = scheduler.recompute_reservation(head)
        {
            prop_assert!(
                possible <= promised,
                "reservation of {} moved from {} to {}",
                head,
                promised,
                possible
            );
        }
        plans.push(plan);
        if plans.len() > 2_000 {
            let tail: Vec<_> = plans[plans.len() - 4..].iter().collect();
            let states: Vec<_> = (1..=tasks.len() as u64)
                .map(|id| (id, scheduler.explain(TaskId(id))))
                .collect();
            return Err(TestCaseError::fail(format!(
                "{policy}: no progress: {tail:?} STATES {states:?}"
            )));
        }
    }
    Ok(plans)
}

/// Drives the real scheduler the way the live server does (one decision per instant at
/// which something happens, no ticks) with every task ending exactly at its time limit,
/// and after every decision taken once nothing more arrives, projects every queued task's
/// start; each estimate must contain the start that really happens.
fn estimates_hold(
    policy: &str,
    nodes: &[(u32, u64)],
    tasks: &[TaskCase],
) -> Result<usize, TestCaseError> {
    let mut scheduler = Scheduler::by_name(policy, config()).unwrap();
    for (i, (gpus, cpus)) in nodes.iter().enumerate() {
        let spec = NodeSpec {
            id: NodeId(i as u64 + 1),
            capacity: Resources::new(cpus * 1000, 1 << 40, *gpus),
            gpu_type: None,
            labels: Default::default(),
        };
        scheduler.handle(Timestamp(0), Event::NodeUp(spec)).unwrap();
    }
    let last_arrival = tasks.iter().map(|t| t.submit * 1000).max().unwrap_or(0);
    // (time ms, kind 0 end / 1 preempted, task index, version)
    let mut timers: BinaryHeap<Reverse<(u64, u8, usize, u32)>> = BinaryHeap::new();
    let mut version = vec![0u32; tasks.len()];
    // Estimates not yet checked: task index → (taken at, estimate).
    let mut open: Vec<(usize, u64, StartEstimate)> = Vec::new();
    let mut checked = 0;
    let mut arrived = 0;
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|i| (tasks[*i].submit, *i));
    for step in 0.. {
        prop_assert!(step < 2_000, "{}: no progress", policy);
        let now = [
            timers.peek().map(|Reverse((t, ..))| *t),
            order.get(arrived).map(|i| tasks[*i].submit * 1000),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = now else { break };
        let mut events = Vec::new();
        while let Some(Reverse((t, kind, i, v))) = timers.peek().copied() {
            if t != now {
                break;
            }
            timers.pop();
            if version[i] != v {
                continue;
            }
            version[i] += 1;
            let id = TaskId(i as u64 + 1);
            events.push(if kind == 0 {
                Event::TaskEnded(id)
            } else {
                Event::TaskPreempted(id)
            });
        }
        while arrived < order.len() && tasks[order[arrived]].submit * 1000 == now {
            let t = &tasks[order[arrived]];
            events.push(Event::TaskSubmitted {
                task: TaskId(order[arrived] as u64 + 1),
                request: TaskRequest {
                    user: UserName::new(format!("u{}", t.user)),
                    group: Some(format!("g{}", t.user % 2)),
                    per_node: Resources::new(t.cpus * 1000, 1 << 30, t.gpus),
                    nodes: t.nodes,
                    priority: [Priority::Low, Priority::Normal, Priority::High]
                        [t.priority as usize],
                    preemptible: t.preemptible,
                    time_limit_secs: Some(t.duration),
                    submitted_at: Timestamp::from_secs(t.submit),
                    ..Default::default()
                },
            });
            arrived += 1;
        }
        let plan = scheduler
            .handle(Timestamp(now), Event::Batch(events))
            .unwrap();
        for action in &plan.actions {
            match action {
                Action::Start { task, .. } => {
                    let i = task.0 as usize - 1;
                    timers.push(Reverse((now + tasks[i].duration * 1000, 0, i, version[i])));
                    for (_, at, estimate) in open.iter().filter(|(j, ..)| *j == i) {
                        prop_assert!(
                            estimate.earliest.as_millis() <= now,
                            "{}: task {} started at {} before its earliest {:?} (estimated at {})",
                            policy,
                            task,
                            now,
                            estimate,
                            at
                        );
                        match estimate.latest {
                            LatestStart::At(latest) => prop_assert!(
                                now <= latest.as_millis(),
                                "{}: task {} started at {} after its latest {:?} (estimated at {})",
                                policy,
                                task,
                                now,
                                estimate,
                                at
                            ),
                            LatestStart::BeyondHorizon { after } => {
                                prop_assert!(now >= after.as_millis())
                            }
                            LatestStart::Unknown { .. } => prop_assert!(
                                false,
                                "{}: every task has a time limit, yet {:?}",
                                policy,
                                estimate
                            ),
                        }
                        checked += 1;
                    }
                    open.retain(|(j, ..)| *j != i);
                }
                Action::Preempt { task, grace_secs } => {
                    let i = task.0 as usize - 1;
                    version[i] += 1;
                    timers.push(Reverse((now + grace_secs * 1000, 1, i, version[i])));
                }
                _ => {}
            }
        }
        if now >= last_arrival {
            // Nothing arrives from here on: the estimate of every queued task must hold.
            let projection = scheduler.project(ProjectionLimits::default());
            open.clear();
            for i in 0..tasks.len() {
                if let Some(estimate) = projection.estimate(TaskId(i as u64 + 1), Timestamp(now)) {
                    open.push((i, now, estimate));
                }
            }
        }
    }
    prop_assert!(
        open.is_empty(),
        "{}: estimated tasks never started: {:?}",
        policy,
        open
    );
    Ok(checked)
}

/// The seed every run uses, so CI replays the same cases each time (project rule: tests
/// are deterministic). `PROPTEST_RNG_SEED=N` (and `PROPTEST_CASES=N`) explore others
/// locally; a failure found that way is recorded in `properties.proptest-regressions`,
/// whose cases run first on every run.
const PINNED_SEED: u64 = 0x7acc_5eed;

fn pinned(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(PINNED_SEED),
        // Integration tests have no lib.rs or main.rs beside them, which the default
        // `SourceParallel` looks for: keep the regressions next to this file.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(pinned(1024))]

    #[test]
    fn every_policy_keeps_its_invariants_and_is_deterministic(
        nodes in prop::collection::vec((0u32..=8, 4u64..=16), 1..=5),
        tasks in prop::collection::vec(task_case(), 1..=30),
    ) {
        for policy in policy_names() {
            let first = replay(policy, &nodes, &tasks, true, false)?;
            let second = replay(policy, &nodes, &tasks, true, false)?;
            prop_assert_eq!(first, second, "policy {} is not deterministic", policy);
        }
    }

    /// Reusing answers within a decision (equal neighbours, tasks of one shape) is an
    /// optimisation only: every plan, pending reasons included, is the one the full
    /// walk makes; and a quiet decision (a projection's, which passes over tasks of a
    /// shape that does not fit) starts and stops exactly what the full walk does. Tasks
    /// come in few shapes here so that the reuse happens often.
    #[test]
    fn reusing_answers_within_a_decision_changes_no_plan(
        nodes in prop::collection::vec((0u32..=8, 4u64..=16), 1..=5),
        tasks in prop::collection::vec(task_case(), 1..=40),
    ) {
        let tasks: Vec<TaskCase> = tasks
            .into_iter()
            .map(|t| TaskCase {
                gpus: t.gpus % 3,
                cpus: 1 + t.cpus % 2,
                nodes: 1 + t.nodes % 2,
                ..t
            })
            .collect();
        // What starts and stops, without the pending reasons a quiet decision leaves out.
        let moves = |plans: Vec<Plan>| -> Vec<Plan> {
            plans
                .into_iter()
                .map(|mut plan| {
                    plan.actions.retain(|a| !matches!(a, Action::Pending { .. }));
                    plan
                })
                .collect()
        };
        for policy in policy_names() {
            let walked = replay(policy, &nodes, &tasks, false, false)?;
            let reused = replay(policy, &nodes, &tasks, true, false)?;
            prop_assert_eq!(&reused, &walked, "policy {}: reuse changed a plan", policy);
            let quiet = replay(policy, &nodes, &tasks, true, true)?;
            prop_assert_eq!(
                moves(quiet),
                moves(walked),
                "policy {}: a quiet decision started or stopped something else",
                policy
            );
        }
    }

    #[test]
    fn pool_policies_never_overfill_and_las2d_matches_a_from_scratch_greedy(
        jobs in prop::collection::vec((1u32..=6, 1u64..=5000, 0u64..3000), 1..=40),
        capacity in 4u32..=12,
    ) {
        for policy in PoolPolicy::ALL {
            let mut pool = PoolScheduler::new(policy, capacity);
            let mut order: Vec<usize> = (0..jobs.len()).collect();
            order.sort_by_key(|i| (jobs[*i].2, *i));
            let mut remaining: Vec<u64> = jobs.iter().map(|j| j.1 * 1000).collect();
            let mut running: BTreeMap<usize, u64> = BTreeMap::new();
            let mut attained = vec![0u64; jobs.len()];
            let mut done = BTreeSet::new();
            let mut arrived: Vec<usize> = Vec::new();
            let mut next = 0;
            loop {
                let finish = running.iter().map(|(i, start)| start + remaining[*i]).min();
                let candidates = [finish, order.get(next).map(|i| jobs[*i].2 * 1000), pool.next_wakeup()];
                let Some(now) = candidates.into_iter().flatten().min() else { break };
                let finished: Vec<usize> = running
                    .iter()
                    .filter(|(i, start)| **start + remaining[**i] == now)
                    .map(|(i, _)| *i)
                    .collect();
                for i in finished {
                    running.remove(&i);
                    done.insert(i);
                    pool.complete(now, i as u64);
                }
                pool.advance(now);
                while next < order.len() && jobs[order[next]].2 * 1000 == now {
                    let i = order[next];
                    if jobs[i].0 <= capacity {
                        let job = PoolJob { id: i as u64, gpus: jobs[i].0, duration_ms: jobs[i].1 * 1000 };
                        pool.submit(now, job).unwrap();
                        arrived.push(i);
                    }
                    next += 1;
                }
                for action in pool.decide(now) {
                    match action {
                        PoolAction::Start(id) => {
                            running.insert(id as usize, now);
                        }
                        PoolAction::Preempt(id) => {
                            let start = running.remove(&(id as usize)).unwrap();
                            remaining[id as usize] -= now - start;
                            attained[id as usize] += (now - start) * jobs[id as usize].0 as u64;
                        }
                    }
                }
                let in_use: u32 = running.keys().map(|i| jobs[*i].0).sum();
                prop_assert!(in_use <= capacity, "{} over capacity", policy);
                if policy == PoolPolicy::Las2d {
                    // The reference: recompute from scratch with exact attained service.
                    let level = |i: usize| {
                        let a = attained[i] + running.get(&i).map_or(0, |s| (now - s) * jobs[i].0 as u64);
                        [3_250_000u64, 7_200_000].iter().filter(|t| a >= **t).count()
                    };
                    let mut room = capacity;
                    let mut expected = BTreeSet::new();
                    for q in 0..3 {
                        for &i in &arrived {
                            if !done.contains(&i) && level(i) == q && jobs[i].0 <= room {
                                room -= jobs[i].0;
                                expected.insert(i);
                            }
                        }
                    }
                    let actual: BTreeSet<usize> = running.keys().copied().collect();
                    prop_assert_eq!(actual, expected, "las2d allocation at {} ms", now);
                }
            }
            prop_assert_eq!(done.len(), arrived.len(), "{} finished every job", policy);
        }
    }

}

proptest! {
    #![proptest_config(pinned(256))]

    #[test]
    fn every_task_starts_within_its_estimated_range_when_tasks_end_at_their_limits(
        nodes in prop::collection::vec((0u32..=8, 4u64..=16), 1..=5),
        tasks in prop::collection::vec(task_case(), 1..=30),
    ) {
        for policy in policy_names() {
            estimates_hold(policy, &nodes, &tasks)?;
        }
    }
}
