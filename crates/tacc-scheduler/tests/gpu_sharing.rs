//! Shares of one GPU (`gpus: 0.5`) under every policy, over random sequences of
//! submissions and ends mixing shares and whole GPUs from users of two groups: no GPU
//! ever holds more than one GPU in shares, no GPU is shared by two tenants (users; or
//! groups where the operator allows it), a shared GPU is never also given whole, and
//! quotas count shares as fractions.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use tacc_core::{NodeId, Resources, TaskId, Timestamp, UserName};
use tacc_scheduler::{
    Action, Event, NodeSpec, Scheduler, SchedulerConfig, ShareGpusWithin, TaskRequest, policy_names,
};

/// One step: submit a task of `user` asking `gpus` hundredths (a share below 100, else
/// whole GPUs), or end the `pick`-th running task.
#[derive(Debug, Clone)]
enum Step {
    Submit {
        user: u8,
        hundredths: u32,
        nodes: u32,
    },
    End {
        pick: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..4, prop_oneof![1u32..100, Just(25), Just(50), Just(100), Just(200)], 1u32..=2)
            .prop_map(|(user, hundredths, nodes)| Step::Submit { user, hundredths, nodes }),
        1 => any::<usize>().prop_map(|pick| Step::End { pick }),
    ]
}

const USER_GPU_LIMIT: u64 = 2;

fn request(user: u8, hundredths: u32, nodes: u32, at: u64) -> TaskRequest {
    let share = (hundredths < 100).then_some(hundredths);
    TaskRequest {
        user: UserName::new(format!("u{user}")),
        // Users u0 and u2 are in g0, u1 and u3 in g1.
        group: Some(format!("g{}", user % 2)),
        per_node: Resources::new(
            1000,
            1 << 30,
            if share.is_some() { 0 } else { hundredths / 100 },
        ),
        gpu_share: share,
        nodes,
        submitted_at: Timestamp(at),
        ..Default::default()
    }
}

/// Replays `steps` and checks every GPU after every decision.
fn replay(
    policy: &str,
    within: ShareGpusWithin,
    gpus: &[u32],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut config = SchedulerConfig::default();
    config.default_user_limits.max_gpus = Some(USER_GPU_LIMIT);
    config.share_gpus_within = within;
    let mut scheduler = Scheduler::by_name(policy, config).unwrap();
    for (i, count) in gpus.iter().enumerate() {
        let spec = NodeSpec {
            id: NodeId(i as u64 + 1),
            capacity: Resources::new(64_000, 1 << 40, *count),
            gpu_type: None,
            labels: Default::default(),
        };
        scheduler.handle(Timestamp(0), Event::NodeUp(spec)).unwrap();
    }
    let mut requests: BTreeMap<TaskId, TaskRequest> = BTreeMap::new();
    let mut running: BTreeMap<TaskId, Vec<(NodeId, Vec<u32>)>> = BTreeMap::new();
    for (n, step) in steps.iter().enumerate() {
        let now = (n as u64 + 1) * 1000;
        let event = match step {
            Step::Submit {
                user,
                hundredths,
                nodes,
            } => {
                let task = TaskId(n as u64 + 1);
                let request = request(*user, *hundredths, *nodes, now);
                requests.insert(task, request.clone());
                Event::TaskSubmitted { task, request }
            }
            Step::End { pick } => {
                if running.is_empty() {
                    continue;
                }
                let task = *running.keys().nth(pick % running.len()).unwrap();
                running.remove(&task);
                Event::TaskEnded(task)
            }
        };
        let plan = scheduler.handle(Timestamp(now), event).unwrap();
        for action in &plan.actions {
            if let Action::Start { task, placements } = action {
                running.insert(
                    *task,
                    placements
                        .iter()
                        .map(|p| (p.node, p.gpu_indices.clone()))
                        .collect(),
                );
            }
        }
        // Every GPU: hundredths held in shares, their tenants, and whether given whole.
        let mut shared: BTreeMap<(NodeId, u32), (u32, BTreeSet<String>)> = BTreeMap::new();
        let mut whole: BTreeSet<(NodeId, u32)> = BTreeSet::new();
        let mut user_hundredths: BTreeMap<String, u64> = BTreeMap::new();
        for (task, placements) in &running {
            let request = &requests[task];
            *user_hundredths.entry(request.user.0.clone()).or_default() += request.gpu_hundredths();
            for (node, indices) in placements {
                match request.gpu_share {
                    Some(share) => {
                        prop_assert_eq!(indices.len(), 1, "a share is one GPU");
                        let tenant = match within {
                            ShareGpusWithin::User => request.user.0.clone(),
                            ShareGpusWithin::Group => request.group.clone().unwrap(),
                        };
                        let slot = shared.entry((*node, indices[0])).or_default();
                        slot.0 += share;
                        slot.1.insert(tenant);
                    }
                    None => {
                        for gpu in indices {
                            prop_assert!(
                                whole.insert((*node, *gpu)),
                                "GPU {} of {} given twice",
                                gpu,
                                node
                            );
                        }
                    }
                }
            }
        }
        for ((node, gpu), (hundredths, tenants)) in &shared {
            prop_assert!(
                *hundredths <= 100,
                "GPU {} of {} holds {} hundredths",
                gpu,
                node,
                hundredths
            );
            prop_assert_eq!(
                tenants.len(),
                1,
                "GPU {} of {} shared by {:?}",
                gpu,
                node,
                tenants
            );
            prop_assert!(
                !whole.contains(&(*node, *gpu)),
                "GPU {} of {} shared and whole",
                gpu,
                node
            );
            prop_assert!(*gpu < gpus[node.0 as usize - 1]);
        }
        for (user, hundredths) in &user_hundredths {
            prop_assert!(
                *hundredths <= USER_GPU_LIMIT * 100,
                "{} holds {} hundredths",
                user,
                hundredths
            );
        }
        scheduler.check_invariants().map_err(TestCaseError::fail)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x005b_a2ed),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn shares_never_exceed_one_gpu_nor_cross_tenants(
        gpus in prop::collection::vec(1u32..=3, 1..=3),
        steps in prop::collection::vec(step(), 1..=40),
        by_group in any::<bool>(),
    ) {
        let within = if by_group { ShareGpusWithin::Group } else { ShareGpusWithin::User };
        for policy in policy_names() {
            replay(policy, within, &gpus, &steps)?;
        }
    }
}

/// The scenarios of the brief, spelled out: two halves of one user share GPU 0; two
/// halves of users in different groups take a GPU each, or wait for one.
#[test]
fn two_halves_of_one_user_share_a_gpu_and_two_tenants_never_do() {
    let node = |gpus| {
        Event::NodeUp(NodeSpec {
            id: NodeId(1),
            capacity: Resources::new(8_000, 1 << 40, gpus),
            gpu_type: None,
            labels: Default::default(),
        })
    };
    let starts = |plan: &tacc_scheduler::Plan| -> Vec<(TaskId, Vec<u32>)> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, placements } => {
                    Some((*task, placements[0].gpu_indices.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let submit = |s: &mut Scheduler, id: u64, user: u8| {
        s.handle(
            Timestamp(id),
            Event::TaskSubmitted {
                task: TaskId(id),
                request: request(user, 50, 1, id),
            },
        )
        .unwrap()
    };

    let mut same = Scheduler::by_name("fifo", SchedulerConfig::default()).unwrap();
    same.handle(Timestamp(0), node(1)).unwrap();
    assert_eq!(starts(&submit(&mut same, 1, 0)), vec![(TaskId(1), vec![0])]);
    assert_eq!(starts(&submit(&mut same, 2, 0)), vec![(TaskId(2), vec![0])]);

    // u0 (group g0) and u1 (group g1) on a one-GPU node: the second waits for the GPU.
    let mut apart = Scheduler::by_name("fifo", SchedulerConfig::default()).unwrap();
    apart.handle(Timestamp(0), node(1)).unwrap();
    assert_eq!(
        starts(&submit(&mut apart, 1, 0)),
        vec![(TaskId(1), vec![0])]
    );
    assert!(starts(&submit(&mut apart, 2, 1)).is_empty());
    let after = apart
        .handle(Timestamp(10), Event::TaskEnded(TaskId(1)))
        .unwrap();
    assert_eq!(starts(&after), vec![(TaskId(2), vec![0])]);

    // Users of one group share when the operator allows groups; not otherwise.
    let config = SchedulerConfig {
        share_gpus_within: ShareGpusWithin::Group,
        ..SchedulerConfig::default()
    };
    let mut group = Scheduler::by_name("fifo", config).unwrap();
    group.handle(Timestamp(0), node(1)).unwrap();
    assert_eq!(
        starts(&submit(&mut group, 1, 0)),
        vec![(TaskId(1), vec![0])]
    );
    assert_eq!(
        starts(&submit(&mut group, 2, 2)),
        vec![(TaskId(2), vec![0])],
        "u0 and u2 are both in g0"
    );
    assert!(starts(&submit(&mut group, 3, 1)).is_empty(), "u1 is in g1");
}

/// A user limited to 1 GPU runs two halves at once, and the third waits.
#[test]
fn quotas_count_each_half_as_half_a_gpu() {
    let mut config = SchedulerConfig::default();
    config.default_user_limits.max_gpus = Some(1);
    let mut s = Scheduler::by_name("fifo", config).unwrap();
    s.handle(
        Timestamp(0),
        Event::NodeUp(NodeSpec {
            id: NodeId(1),
            capacity: Resources::new(8_000, 1 << 40, 4),
            gpu_type: None,
            labels: Default::default(),
        }),
    )
    .unwrap();
    let mut started = 0;
    for id in 1..=3 {
        let plan = s
            .handle(
                Timestamp(id),
                Event::TaskSubmitted {
                    task: TaskId(id),
                    request: request(0, 50, 1, id),
                },
            )
            .unwrap();
        started += plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Start { .. }))
            .count();
        if id == 3 {
            let reason = plan.actions.iter().find_map(|a| match a {
                Action::Pending { reason, .. } => Some(reason.to_string()),
                _ => None,
            });
            assert_eq!(reason.as_deref(), Some("over user quota: at most 1 GPUs"));
        }
    }
    assert_eq!(started, 2);
    let standing = s.standing(Timestamp(5));
    assert_eq!(standing.users[0].usage.gpu_hundredths, 100);
}
