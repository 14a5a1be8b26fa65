//! Helpers shared by the scheduler's unit tests: nodes, requests, submitting, and reading
//! a plan's starts and pending reasons.

pub(super) use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp, UserName};

pub(super) use super::{Action, Event, Plan, Scheduler};
pub(super) use crate::{
    Explanation, GroupConfig, LimitKind, NodeSpec, PendingReason, Placement, SchedulerConfig,
    TaskRequest,
};

pub(super) fn node(id: u64, cpus: u64, gpus: u32) -> Event {
    Event::NodeUp(NodeSpec {
        id: NodeId(id),
        capacity: Resources::new(cpus * 1000, 64 << 30, gpus),
        gpu_type: None,
        labels: Default::default(),
    })
}

pub(super) fn request(cpus: u64, gpus: u32, nodes: u32, at: u64) -> TaskRequest {
    TaskRequest {
        user: UserName::new("alice"),
        per_node: Resources::new(cpus * 1000, 1 << 30, gpus),
        nodes,
        submitted_at: Timestamp(at),
        ..Default::default()
    }
}

pub(super) fn fifo() -> Scheduler {
    Scheduler::by_name("fifo", SchedulerConfig::default()).unwrap()
}

pub(super) fn submit(s: &mut Scheduler, id: u64, req: TaskRequest) -> Plan {
    s.handle(
        req.submitted_at,
        Event::TaskSubmitted {
            task: TaskId(id),
            request: req,
        },
    )
    .unwrap()
}

pub(super) fn started(plan: &Plan) -> Vec<TaskId> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Start { task, .. } => Some(*task),
            _ => None,
        })
        .collect()
}

pub(super) fn labelled(id: u64, cpus: u64, labels: &[(&str, &str)]) -> Event {
    Event::NodeUp(NodeSpec {
        id: NodeId(id),
        capacity: Resources::new(cpus * 1000, 64 << 30, 0),
        gpu_type: None,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

pub(super) fn selecting(cpus: u64, at: u64, selector: &[(&str, &str)]) -> TaskRequest {
    TaskRequest {
        node_selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..request(cpus, 0, 1, at)
    }
}

pub(super) fn pending_reason(plan: &Plan, task: u64) -> Option<&PendingReason> {
    plan.actions.iter().find_map(|a| match a {
        Action::Pending { task: t, reason } if *t == TaskId(task) => Some(reason),
        _ => None,
    })
}

/// A configuration where each named group is guaranteed that many GPUs.
pub(super) fn guaranteed(groups: &[(&str, u64)]) -> SchedulerConfig {
    let mut config = SchedulerConfig::default();
    for (name, guaranteed_gpus) in groups {
        config.groups.insert(
            name.to_string(),
            GroupConfig {
                guaranteed_gpus: *guaranteed_gpus,
                ..Default::default()
            },
        );
    }
    config
}

/// One node of 8 CPUs and 4 GPUs, groups guaranteed GPUs as `guarantees` says, and group
/// `b` running preemptible tasks `(id, gpus)`, each submitted at `id` ms.
pub(super) fn borrowed(guarantees: &[(&str, u64)], borrowers: &[(u64, u32)]) -> Scheduler {
    let mut s = Scheduler::with_config(guaranteed(guarantees));
    s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
    for (id, gpus) in borrowers {
        let borrower = TaskRequest {
            group: Some("b".into()),
            preemptible: true,
            ..request(1, *gpus, 1, *id)
        };
        submit(&mut s, *id, borrower);
    }
    s
}

/// Task 9 of group `a`, asking for `gpus`, arrives at 700 s: past the borrowers' minimum
/// run time, so they may be preempted.
pub(super) fn owner_arrives(s: &mut Scheduler, gpus: u32) -> Plan {
    let owner = TaskRequest {
        group: Some("a".into()),
        ..request(1, gpus, 1, 10)
    };
    s.handle(
        Timestamp(700_000),
        Event::TaskSubmitted {
            task: TaskId(9),
            request: owner,
        },
    )
    .unwrap()
}
