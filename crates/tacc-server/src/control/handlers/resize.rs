//! Adaptive allocation decides: a sample of rank 0 of a running attempt was judged by
//! the adaptive book (`adaptive.rs`: its signals window, verdict and change history);
//! here the cluster's mode and the task's `adaptive:` bounds say how far it may move, the
//! scheduler the room it has, and the re-allocation policy whether it moves now
//! ([`on_sample`]). A move ([`on_resize`]) goes to the scheduler first (accounting,
//! quotas and placement move with it; a shrink may start queued tasks, whose plan the
//! shell carries out), is recorded with its reason in the turn's transaction (the store's
//! resize history), and rides the nodes' desired work (`Assignment::allocation`) to the
//! agents. A change an agent could not apply ([`on_resize_failed`]) is undone where the
//! old allocation still fits, and recorded either way.

use tacc_adaptive::{
    Allocation, Bounds, Change, ChangeHistory, Reallocator, Room, Situation, Verdict,
};
use tacc_core::{NodeId, Resources, Timestamp};
use tacc_proto::AttemptRef;
use tacc_scheduler::{Event, Plan};
use tacc_schema::TaskSpec;
use tacc_store::{ResizeRecord, TaskChange};

use crate::control::Core;
use crate::control::adaptive::{AdaptiveMode, DefaultBounds};
use crate::control::effects::Effects;

/// The cluster's adaptive settings a decision is taken under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy<'a> {
    pub(crate) mode: AdaptiveMode,
    pub(crate) default_bounds: Option<DefaultBounds>,
    pub(crate) reallocator: &'a dyn Reallocator,
}

/// What the adaptive book made of a sample of rank 0 of `attempt`: the verdict on its
/// window, and the allocation in force with its change history (the policy's hysteresis).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judged<'a> {
    pub(crate) attempt: AttemptRef,
    pub(crate) verdict: &'a Verdict,
    pub(crate) current: Resources,
    pub(crate) history: ChangeHistory,
}

/// A change the policy decided and the core took: the book keeps `change` in the
/// attempt's history and waits for the agents to confirm `to`; the shell carries out
/// `plan` (what the scheduler decided of the move).
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) change: Change,
    pub(crate) from: Resources,
    pub(crate) to: Resources,
    pub(crate) plan: Plan,
}

/// The policy's decision on a judged sample at `now`, applied through [`on_resize`];
/// `None` when the attempt does not move (its task is unknown, its bounds or the mode
/// allow nothing, the scheduler gives no room, the policy sees no need, or the scheduler
/// refuses the move).
pub(crate) fn on_sample(
    core: &mut Core,
    fx: &mut Effects,
    now: Timestamp,
    policy: Policy<'_>,
    judged: Judged<'_>,
) -> Option<Decided> {
    let task = judged.attempt.task;
    let spec = core.specs.get(&task)?;
    let bounds = bounds(spec, judged.current, policy.mode, policy.default_bounds)?;
    let room = core.scheduler.resize_room(task)?;
    let current = judged.current;
    let situation = Situation {
        now,
        current: Allocation {
            cpu_millis: current.cpu_millis,
            memory_bytes: current.memory_bytes,
        },
        bounds,
        room: Room {
            cpu_millis: room.cpu_millis,
            memory_bytes: room.memory_bytes,
        },
        verdict: judged.verdict,
        history: judged.history,
    };
    let change = policy.reallocator.decide(&situation)?;
    let to = Resources::new(change.to.cpu_millis, change.to.memory_bytes, current.gpus);
    let plan = on_resize(
        core,
        fx,
        Resize {
            attempt: judged.attempt,
            from: current,
            to,
            reason: format!("adaptive: {}", change.reason),
            at: now,
        },
    )?;
    Some(Decided {
        change,
        from: current,
        to,
        plan,
    })
}

/// A move of a running attempt from `from` to `to` per node, with the reason kept in its
/// resize history.
#[derive(Debug, Clone)]
pub(crate) struct Resize {
    pub(crate) attempt: AttemptRef,
    pub(crate) from: Resources,
    pub(crate) to: Resources,
    pub(crate) reason: String,
    pub(crate) at: Timestamp,
}

/// Move a running attempt: the scheduler first, then its record for the turn's
/// transaction, then the desired work of its nodes (woken). The scheduler's plan is the
/// shell's to carry out; `None` when the scheduler refused the move (nothing changed).
pub(crate) fn on_resize(core: &mut Core, fx: &mut Effects, resize: Resize) -> Option<Plan> {
    let Resize {
        attempt,
        from,
        to,
        reason,
        at,
    } = resize;
    let task = attempt.task;
    let plan = match core
        .scheduler
        .handle(at, Event::TaskResized { task, per_node: to })
    {
        Ok(plan) => plan,
        Err(e) => {
            fx.inform(format!(
                "task {task}: the scheduler refused {from:?} → {to:?}: {e}"
            ));
            return None;
        }
    };
    fx.change(TaskChange::Resized(ResizeRecord {
        task,
        attempt: attempt.attempt,
        at,
        cpu_millis: to.cpu_millis,
        memory_bytes: to.memory_bytes,
        reason,
    }));
    for (node, live) in core.nodes.iter_mut() {
        if let Some(assignment) = live.assignments.get_mut(&attempt) {
            assignment.allocation = Some(to);
            fx.wake(*node);
        }
    }
    Some(plan)
}

/// The agent on `node` could not apply `applied` to `attempt`; `before` is what the
/// attempt held before the change the agents had not confirmed yet, if one was pending.
#[derive(Debug, Clone)]
pub(crate) struct ResizeFailed {
    pub(crate) node: NodeId,
    pub(crate) attempt: AttemptRef,
    pub(crate) applied: Resources,
    pub(crate) error: String,
    pub(crate) before: Option<Resources>,
    pub(crate) at: Timestamp,
}

/// A change an agent could not apply: undone where the previous allocation still fits
/// (the allocation moved back to, and the scheduler's plan of the move, are returned),
/// else recorded as it stands; adaptation of the attempt ends either way (the book
/// stopped it).
pub(crate) fn on_resize_failed(
    core: &mut Core,
    fx: &mut Effects,
    failed: ResizeFailed,
) -> Option<(Resources, Plan)> {
    let ResizeFailed {
        node,
        attempt,
        applied,
        error,
        before,
        at,
    } = failed;
    let name = core.node_name(node);
    let failed = format!(
        "the agent on {name} could not apply {} CPUs, {}: {error}",
        cpus(applied.cpu_millis),
        tacc_core::ByteSize::from_bytes(applied.memory_bytes)
    );
    fx.warn(format!("task {}: {failed}", attempt.task));
    if let Some(before) = before.filter(|b| *b != applied) {
        let undo = Resize {
            attempt,
            from: applied,
            to: before,
            reason: format!(
                "adaptive: {failed}; back to the previous allocation, no further changes"
            ),
            at,
        };
        if let Some(plan) = on_resize(core, fx, undo) {
            return Some((before, plan));
        }
    }
    fx.change(TaskChange::Resized(ResizeRecord {
        task: attempt.task,
        attempt: attempt.attempt,
        at,
        cpu_millis: applied.cpu_millis,
        memory_bytes: applied.memory_bytes,
        reason: format!("adaptive: {failed}; no further changes"),
    }));
    None
}

/// The bounds a task's allocation may move in under the cluster's `mode`, given what it
/// holds now (`current`): its `adaptive:` bounds, else the cluster's default multiples
/// of its request; `None`: it does not move.
pub(crate) fn bounds(
    spec: &TaskSpec,
    current: Resources,
    mode: AdaptiveMode,
    default_bounds: Option<DefaultBounds>,
) -> Option<Bounds> {
    let ((min_cpu, max_cpu), (min_memory, max_memory)) = match &spec.adaptive {
        Some(adaptive) => (
            adaptive.cpu_millis(&spec.resources),
            adaptive.memory_bytes(&spec.resources),
        ),
        None => {
            let default = default_bounds?;
            let asked = spec.resources.per_node();
            let scale = |amount: u64, by: f64| (amount as f64 * by).round() as u64;
            (
                (
                    scale(asked.cpu_millis, default.min),
                    scale(asked.cpu_millis, default.max),
                ),
                (
                    scale(asked.memory_bytes, default.min),
                    scale(asked.memory_bytes, default.max),
                ),
            )
        }
    };
    let (max_cpu, max_memory) = match mode {
        AdaptiveMode::Off => return None,
        AdaptiveMode::Shrink => (
            max_cpu.min(current.cpu_millis).max(min_cpu),
            max_memory.min(current.memory_bytes).max(min_memory),
        ),
        AdaptiveMode::On => (max_cpu, max_memory),
    };
    Some(Bounds {
        min: Allocation {
            cpu_millis: min_cpu,
            memory_bytes: min_memory,
        },
        max: Allocation {
            cpu_millis: max_cpu,
            memory_bytes: max_memory,
        },
    })
}

fn cpus(millis: u64) -> String {
    format!("{:.2}", millis as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use tacc_core::{AttemptNo, TaskId};
    use tacc_scheduler::{NodeSpec, Placement, Scheduler, TaskRequest};

    use super::*;
    use crate::control::rules::polls::tests::assignment;
    use crate::control::rules::test_node;

    const GIB: u64 = 1 << 30;

    fn attempt() -> AttemptRef {
        AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        }
    }

    fn spec(adaptive: &str) -> TaskSpec {
        let text =
            format!("name: t\nrun: 'true'\nresources: {{cpus: 1, memory: 1GiB}}\n{adaptive}");
        tacc_schema::parse_task("t/task.yaml", &text).unwrap().0
    }

    /// A core whose node 1 (4 CPUs, 4 GiB) runs task 1's attempt 1 with 1 CPU and 1 GiB.
    fn core(adaptive: &str) -> Core {
        let mut scheduler = Scheduler::by_name("fifo", Default::default()).unwrap();
        let node = NodeSpec {
            id: NodeId(1),
            capacity: Resources::new(4000, 4 * GIB, 0),
            gpu_type: None,
            labels: BTreeMap::new(),
        };
        let request = TaskRequest {
            user: tacc_core::UserName::new("ann".to_string()),
            per_node: Resources::new(1000, GIB, 0),
            nodes: 1,
            ..TaskRequest::default()
        };
        scheduler
            .handle(
                Timestamp(0),
                Event::Batch(vec![
                    Event::NodeUp(node),
                    Event::TaskRestored {
                        task: TaskId(1),
                        request,
                        placements: vec![Placement {
                            node: NodeId(1),
                            gpu_indices: vec![],
                        }],
                    },
                ]),
            )
            .unwrap();
        let mut core = Core::new(scheduler, Instant::now());
        let mut live = test_node(1, Instant::now());
        live.assignments.insert(attempt(), assignment(1));
        core.nodes.insert(NodeId(1), live);
        core.specs.insert(TaskId(1), spec(adaptive));
        core
    }

    /// A policy that always asks for `to` (or nothing).
    #[derive(Debug)]
    struct Asks(Option<Allocation>);

    impl Reallocator for Asks {
        fn name(&self) -> &'static str {
            "asks"
        }

        fn decide(&self, situation: &Situation<'_>) -> Option<Change> {
            self.0.map(|to| Change {
                from: situation.current,
                to,
                reason: "wants it".into(),
            })
        }
    }

    fn grow_to(cpu_millis: u64) -> Asks {
        Asks(Some(Allocation {
            cpu_millis,
            memory_bytes: GIB,
        }))
    }

    fn sample(core: &mut Core, mode: AdaptiveMode, asks: &Asks) -> (Option<Decided>, Effects) {
        let verdict = Verdict::not_enough_data("a test");
        let mut fx = Effects::default();
        let decided = on_sample(
            core,
            &mut fx,
            Timestamp(5),
            Policy {
                mode,
                default_bounds: None,
                reallocator: asks,
            },
            Judged {
                attempt: attempt(),
                verdict: &verdict,
                current: Resources::new(1000, GIB, 0),
                history: ChangeHistory::default(),
            },
        );
        (decided, fx)
    }

    fn allocation_on_node(core: &Core) -> Option<Resources> {
        core.nodes[&NodeId(1)].assignments[&attempt()].allocation
    }

    #[test]
    fn a_decided_change_moves_the_scheduler_the_record_and_the_node() {
        let mut core = core("adaptive: {cpus: 1..3}\n");
        let (decided, fx) = sample(&mut core, AdaptiveMode::On, &grow_to(2000));
        let decided = decided.expect("a change");
        assert_eq!(decided.to, Resources::new(2000, GIB, 0));
        assert_eq!(decided.from, Resources::new(1000, GIB, 0));
        let [TaskChange::Resized(record)] = &fx.changes[..] else {
            panic!("{:?}", fx.changes);
        };
        assert_eq!((record.cpu_millis, record.at), (2000, Timestamp(5)));
        assert_eq!(record.reason, "adaptive: wants it");
        assert_eq!(fx.woken.iter().copied().collect::<Vec<_>>(), [NodeId(1)]);
        assert_eq!(allocation_on_node(&core), Some(decided.to));
        // The scheduler counts the new allocation: 2 of the node's 4 CPUs are left.
        assert_eq!(
            core.scheduler.resize_room(TaskId(1)).map(|r| r.cpu_millis),
            Some(2000)
        );
    }

    #[test]
    fn nothing_moves_without_bounds_a_mode_a_known_task_or_a_decision() {
        let cases: [(&str, AdaptiveMode, Asks, bool); 5] = [
            (
                "adaptive: {cpus: 1..3}\n",
                AdaptiveMode::Off,
                grow_to(2000),
                false,
            ),
            ("", AdaptiveMode::On, grow_to(2000), false),
            (
                "adaptive: {cpus: 1..3}\n",
                AdaptiveMode::On,
                Asks(None),
                false,
            ),
            // The scheduler refuses what the node cannot hold.
            (
                "adaptive: {cpus: 1..8}\n",
                AdaptiveMode::On,
                grow_to(8000),
                false,
            ),
            (
                "adaptive: {cpus: 1..3}\n",
                AdaptiveMode::Shrink,
                grow_to(500),
                true,
            ),
        ];
        for (adaptive, mode, asks, moves) in cases {
            let mut core = core(adaptive);
            let (decided, fx) = sample(&mut core, mode, &asks);
            assert_eq!(decided.is_some(), moves, "{adaptive} {mode} {asks:?}");
            assert_eq!(fx.changes.len(), usize::from(moves), "{adaptive} {mode}");
            assert_eq!(allocation_on_node(&core).is_some(), moves);
        }
        let mut unknown = core("adaptive: {cpus: 1..3}\n");
        unknown.specs.clear();
        assert!(
            sample(&mut unknown, AdaptiveMode::On, &grow_to(2000))
                .0
                .is_none()
        );
    }

    fn failed(before: Option<Resources>, applied: Resources) -> ResizeFailed {
        ResizeFailed {
            node: NodeId(1),
            attempt: attempt(),
            applied,
            error: "no cgroup".into(),
            before,
            at: Timestamp(7),
        }
    }

    #[test]
    fn a_change_an_agent_could_not_apply_is_undone_where_it_fits_and_recorded() {
        let mut core = core("adaptive: {cpus: 1..3}\n");
        let grown = Resources::new(2000, GIB, 0);
        let mut fx = Effects::default();
        on_resize(
            &mut core,
            &mut fx,
            Resize {
                attempt: attempt(),
                from: Resources::new(1000, GIB, 0),
                to: grown,
                reason: "grow".into(),
                at: Timestamp(5),
            },
        )
        .expect("it fits");
        let before = Resources::new(1000, GIB, 0);
        let mut fx = Effects::default();
        let undone = on_resize_failed(&mut core, &mut fx, failed(Some(before), grown));
        assert_eq!(undone.map(|(to, _)| to), Some(before));
        let [TaskChange::Resized(record)] = &fx.changes[..] else {
            panic!("{:?}", fx.changes);
        };
        assert_eq!(record.cpu_millis, 1000);
        assert!(
            record
                .reason
                .starts_with("adaptive: the agent on n1 could not apply 2.00 CPUs")
                && record
                    .reason
                    .ends_with("back to the previous allocation, no further changes"),
            "{}",
            record.reason
        );
        assert_eq!(fx.warnings.len(), 1);
        assert_eq!(allocation_on_node(&core), Some(before));
    }

    #[test]
    fn a_failed_change_with_nothing_to_undo_is_only_recorded() {
        // No change pending, or the pending one's previous allocation is what failed.
        let applied = Resources::new(1000, GIB, 0);
        for before in [None, Some(applied)] {
            let mut core = core("adaptive: {cpus: 1..3}\n");
            let mut fx = Effects::default();
            assert!(on_resize_failed(&mut core, &mut fx, failed(before, applied)).is_none());
            let [TaskChange::Resized(record)] = &fx.changes[..] else {
                panic!("{:?}", fx.changes);
            };
            assert_eq!((record.cpu_millis, record.at), (1000, Timestamp(7)));
            assert!(record.reason.ends_with("no cgroup; no further changes"));
            assert!(fx.woken.is_empty());
        }
    }

    #[test]
    fn bounds_follow_the_mode_the_task_file_and_the_cluster_default() {
        let current = Resources::new(2000, 2 * GIB, 0);
        let adaptive = spec("adaptive: {cpus: 1..8, memory: 1GiB..4GiB}\n");
        let on = bounds(&adaptive, current, AdaptiveMode::On, None).unwrap();
        assert_eq!((on.min.cpu_millis, on.max.cpu_millis), (1000, 8000));
        let shrink = bounds(&adaptive, current, AdaptiveMode::Shrink, None).unwrap();
        assert_eq!(
            (shrink.max.cpu_millis, shrink.max.memory_bytes),
            (2000, 2 * GIB)
        );
        assert!(bounds(&adaptive, current, AdaptiveMode::Off, None).is_none());
        let plain = spec("");
        assert!(bounds(&plain, current, AdaptiveMode::On, None).is_none());
        let half_to_double = Some(DefaultBounds { min: 0.5, max: 2.0 });
        let default = bounds(&plain, current, AdaptiveMode::On, half_to_double).unwrap();
        assert_eq!(
            (default.min.cpu_millis, default.max.cpu_millis),
            (500, 2000)
        );
    }
}
