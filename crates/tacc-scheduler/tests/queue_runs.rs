//! A decision passes over a run of the queue (consecutive equal tasks told one reason) in
//! one step instead of visiting each task (`scheduler/queue_runs.rs`). That is an
//! optimisation only: on random arrays, ends, preemptions, cancellations, drains and the
//! passing of time (re-ranking), every plan — pending reasons included — must be the one
//! the full walk makes, for every policy, and the runs kept must stay true
//! (`check_invariants` checks them after every decision).

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::{
    Action, Event, NodeSpec, Scheduler, SchedulerConfig, TaskRequest, policy_names,
};

#[derive(Debug, Clone)]
enum Op {
    /// An array of `len` equal tasks, submitted as one batch (as the server does).
    Submit {
        len: u64,
        user: u8,
        cpus: u64,
        gpus: u32,
        priority: u8,
        preemptible: bool,
        limit_secs: Option<u64>,
    },
    /// The `n`-th task holding resources (mod their number) ends (or, being preempted,
    /// stops).
    End(usize),
    /// The `n`-th known task (mod their number) is cancelled, queued or not.
    Cancel(usize),
    /// Time passes (past the fair-share recalculation period now and then).
    Advance(u64),
    /// Node 2 is drained, or resumed.
    Drain(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=40, 0u8..3, 1u64..=3, 0u32..=2, 0u8..3, any::<bool>(), prop::option::of(1u64..=100))
            .prop_map(|(len, user, cpus, gpus, priority, preemptible, limit_secs)| Op::Submit {
                len, user, cpus, gpus, priority, preemptible, limit_secs,
            }),
        6 => (0usize..64).prop_map(Op::End),
        1 => (0usize..256).prop_map(Op::Cancel),
        2 => (1u64..=90).prop_map(Op::Advance),
        1 => any::<bool>().prop_map(Op::Drain),
    ]
}

fn config() -> SchedulerConfig {
    let mut config = SchedulerConfig::default();
    // Some quota answers beside the resource ones.
    config.default_user_limits.max_gpus = Some(3);
    config.preemption.min_run_secs = 5;
    config
}

fn node(id: u64, cpus: u64, gpus: u32) -> Event {
    Event::NodeUp(NodeSpec {
        id: NodeId(id),
        capacity: Resources::new(cpus * 1000, 1 << 40, gpus),
        gpu_type: None,
        labels: Default::default(),
    })
}

/// Feeds the same events to a scheduler that jumps over runs and to one that walks every
/// task (answer reuse off), asserting equal plans after every event.
fn replay(policy: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut runs = Scheduler::by_name(policy, config()).unwrap();
    let mut walk = Scheduler::by_name(policy, config()).unwrap();
    walk.set_walk_memos(false);
    let mut now = 0u64;
    let mut next_id = 1u64;
    let mut known: BTreeSet<TaskId> = BTreeSet::new();
    let mut holding: BTreeSet<TaskId> = BTreeSet::new();
    let mut preempting: BTreeSet<TaskId> = BTreeSet::new();
    let mut events = vec![node(1, 4, 2), node(2, 3, 1)];
    for op in ops {
        match op {
            Op::Submit {
                len,
                user,
                cpus,
                gpus,
                priority,
                preemptible,
                limit_secs,
            } => {
                let request = TaskRequest {
                    user: UserName::new(format!("u{user}")),
                    per_node: Resources::new(cpus * 1000, 1 << 30, *gpus),
                    priority: [Priority::Low, Priority::Normal, Priority::High][*priority as usize],
                    preemptible: *preemptible,
                    time_limit_secs: *limit_secs,
                    submitted_at: Timestamp(now),
                    ..Default::default()
                };
                let batch = (0..*len)
                    .map(|i| {
                        known.insert(TaskId(next_id + i));
                        Event::TaskSubmitted {
                            task: TaskId(next_id + i),
                            request: request.clone(),
                        }
                    })
                    .collect();
                next_id += len;
                events.push(Event::Batch(batch));
            }
            Op::End(n) if !holding.is_empty() => {
                let task = *holding.iter().nth(n % holding.len()).unwrap();
                holding.remove(&task);
                if preempting.remove(&task) {
                    events.push(Event::TaskPreempted(task));
                } else {
                    known.remove(&task);
                    events.push(Event::TaskEnded(task));
                }
            }
            Op::End(_) => events.push(Event::Tick),
            Op::Cancel(n) if !known.is_empty() => {
                let task = *known.iter().nth(n % known.len()).unwrap();
                known.remove(&task);
                holding.remove(&task);
                preempting.remove(&task);
                events.push(Event::TaskCancelled(task));
            }
            Op::Cancel(_) => events.push(Event::Tick),
            Op::Advance(secs) => {
                now += secs * 1000;
                events.push(Event::Tick);
            }
            Op::Drain(true) => events.push(Event::NodeDrained(NodeId(2))),
            Op::Drain(false) => events.push(Event::NodeResumed(NodeId(2))),
        }
        for event in events.drain(..) {
            let at = Timestamp(now);
            let jumped = runs.handle(at, event.clone());
            let walked = walk.handle(at, event.clone());
            prop_assert_eq!(&jumped, &walked, "policy {}: after {:?}", policy, event);
            let Ok(plan) = walked else { continue };
            for action in &plan.actions {
                match action {
                    Action::Start { task, .. } => {
                        holding.insert(*task);
                    }
                    Action::Preempt { task, .. } => {
                        preempting.insert(*task);
                    }
                    Action::Reject { task, .. } => {
                        known.remove(task);
                    }
                    Action::Pending { .. } => {}
                }
            }
            runs.check_invariants().map_err(TestCaseError::fail)?;
            walk.check_invariants().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(runs.queue_len(), walk.queue_len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x7acc_4a11),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn passing_over_runs_changes_no_plan(ops in prop::collection::vec(op(), 1..=60)) {
        for policy in policy_names() {
            replay(policy, &ops)?;
        }
    }
}

/// The point of runs: once an array's elements wait alike, a decision visits the few
/// tasks at the head of the queue, not the whole queue. 20,000 queued elements, 2,000
/// ends one by one: each decision starts the next element and the run carries the rest.
#[test]
fn a_long_array_is_walked_once_then_passed_over() {
    let mut s = Scheduler::new();
    s.handle(Timestamp(0), node(1, 2, 0)).unwrap();
    let request = TaskRequest {
        user: UserName::new("u"),
        per_node: Resources::new(1000, 1 << 20, 0),
        ..Default::default()
    };
    let batch = (1..=20_000)
        .map(|id| Event::TaskSubmitted {
            task: TaskId(id),
            request: request.clone(),
        })
        .collect();
    let plan = s.handle(Timestamp(1), Event::Batch(batch)).unwrap();
    assert_eq!(
        plan.actions
            .iter()
            .filter(|a| matches!(a, Action::Start { .. }))
            .count(),
        2
    );
    s.check_invariants().unwrap();
    for id in 1..=2_000u64 {
        let plan = s
            .handle(Timestamp(2), Event::TaskEnded(TaskId(id)))
            .unwrap();
        assert!(
            matches!(&plan.actions[..], [Action::Start { task, .. }] if *task == TaskId(id + 2)),
            "{plan:?}"
        );
    }
    s.check_invariants().unwrap();
    assert_eq!(s.queue_len(), 20_000 - 2_002);
    assert!(
        s.visited_last() < 10,
        "the last decision visited {} queued tasks",
        s.visited_last()
    );
}
