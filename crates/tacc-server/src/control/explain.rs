//! Why a task is where it is (`tcloud explain`), read from the core: the limits and
//! guarantees of its user and group, its place in the queue and the reason the scheduler
//! gives, its start estimate from the projection, and what holds it back when no node
//! can take it. A plain reading of the core and the projection; the what-ifs and the
//! likely start are projected afterwards, off the core's lock, by the caller.

use std::time::Duration;

use tacc_core::{Resources, TaskId, Timestamp};
use tacc_proto::StartEstimateView;
use tacc_scheduler::{Explanation, Projection, Scheduler, StartEstimate};
use tacc_store::TaskRecord;

use super::{Core, estimates};

/// What the core says of a task.
pub(crate) struct Explained {
    pub details: Vec<String>,
    pub position: Option<u64>,
    pub estimated_start: Option<Timestamp>,
    pub start_estimate: Option<StartEstimateView>,
    /// A copy of the scheduler, the task's per-node request and its estimate, when
    /// asking for less or for other nodes could start it sooner.
    pub what_if: Option<(Scheduler, Resources, StartEstimate)>,
    /// A copy of the scheduler for the likely start, when there is an estimate.
    pub likely_copy: Option<Scheduler>,
    pub policy: String,
}

pub(crate) fn explain(
    inner: &Core,
    record: &TaskRecord,
    projection: &Projection,
    now: Timestamp,
    node_stable_after: Duration,
) -> Explained {
    let task: TaskId = record.id;
    let config = inner.scheduler.config();
    let group = config.group_of(&record.user, None);
    let mut details = vec![format!("user {} is in group {group}", record.user)];
    let user_limits = config.user_limits(&record.user);
    let group_limits = config.group_limits(&group);
    for (whose, limits) in [("user", &user_limits), ("group", &group_limits)] {
        let mut parts = Vec::new();
        if let Some(max) = limits.max_gpus {
            parts.push(format!("{max} GPUs"));
        }
        if let Some(max) = limits.max_cpus {
            parts.push(format!("{max} CPUs"));
        }
        if let Some(max) = limits.max_running_tasks {
            parts.push(format!("{max} running tasks"));
        }
        if let Some(max) = limits.max_queued_tasks {
            parts.push(format!("{max} queued tasks"));
        }
        if !parts.is_empty() {
            details.push(format!("{whose} limits: at most {}", parts.join(", ")));
        }
    }
    let guaranteed = config.guaranteed_gpus(&group);
    if guaranteed > 0 {
        details.push(format!(
            "group {group} is guaranteed {guaranteed} GPUs and may borrow idle ones"
        ));
    }
    let (mut position, mut estimated_start) = (None, None);
    let (mut start_estimate, mut what_if) = (None, None);
    match inner.scheduler.explain_with(task, Some(projection)) {
        Explanation::Queued {
            position: at,
            estimated_start: start,
            reason,
            ..
        } => {
            position = Some(at as u64);
            estimated_start = start;
            if let Some(estimate) = projection.estimate(task, now) {
                start_estimate = Some(estimates::view(
                    &estimate,
                    reason.as_ref(),
                    record.user.as_str(),
                ));
                if let Some(spec) = inner.specs.get(&task)
                    && estimates::wants_what_ifs(&inner.scheduler, task, spec.resources.per_node())
                {
                    let copy = inner.scheduler.clone();
                    what_if = Some((copy, spec.resources.per_node(), estimate));
                }
            }
            let waits_for_node = matches!(
                reason,
                Some(tacc_scheduler::PendingReason::NoMatchingNode { .. })
            );
            if waits_for_node && let Some(spec) = inner.specs.get(&task) {
                details.push(crate::node_selector::advice(&crate::node_selector::of(
                    spec,
                )));
            } else if let Some(tacc_scheduler::PendingReason::WaitingForCapacity { .. }) = reason {
                details.push(
                    "no start estimate: it was submitted with --wait-for-capacity and no node that can hold it has joined yet"
                        .to_string(),
                );
            } else if start.is_none() && start_estimate.is_none() {
                details.push(
                    "no start estimate: a task it waits for has no time limit (set resources.time_limit to get one)"
                        .to_string(),
                );
            }
        }
        Explanation::Preempting { .. } => {
            details.push("it is being preempted and will be requeued".to_string())
        }
        Explanation::Running { .. } | Explanation::Unknown => {}
    }
    if inner.held.contains(&task) {
        let flapping: Vec<&str> = inner
            .nodes
            .values()
            .filter(|n| n.online && n.held_back_until.is_some())
            .map(|n| n.record.name.as_str())
            .collect();
        details.push(if flapping.is_empty() {
            "no node is online yet; start an agent (`taccd agent`) or `tcloud up`".to_string()
        } else {
            format!(
                "the only nodes up ({}) were lost repeatedly and get work once they have \
                 stayed up for {}s (`taccd server --node-stable-after`)",
                flapping.join(", "),
                node_stable_after.as_secs()
            )
        });
    }
    let likely_copy = start_estimate.is_some().then(|| inner.scheduler.clone());
    Explained {
        details,
        position,
        estimated_start,
        start_estimate,
        what_if,
        likely_copy,
        policy: inner.scheduler.policy_name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tacc_scheduler::ProjectionLimits;

    use super::explain;
    use crate::control::reactor_env::ReactorEnv;

    const ONE_CPU: &str = "name: t\nresources: {cpus: 1}\nrun: true\n";

    #[test]
    fn a_task_held_before_any_node_says_how_to_get_one() {
        let mut env = ReactorEnv::new();
        let task = env.submit(ONE_CPU);
        let projection = env.core.scheduler.project(ProjectionLimits::default());
        let explained = explain(
            &env.core,
            &env.record(task),
            &projection,
            tacc_core::Timestamp(0),
            Duration::from_secs(60),
        );
        assert!(
            explained
                .details
                .iter()
                .any(|d| d.starts_with("no node is online yet")),
            "{:?}",
            explained.details
        );
        assert!(explained.details[0].starts_with("user alice is in group"));
    }

    #[test]
    fn a_queued_task_has_its_place_and_a_placed_one_none() {
        let mut env = ReactorEnv::new();
        env.register("n1", 1);
        let running = env.submit(ONE_CPU);
        let queued = env.submit(ONE_CPU);
        let projection = env.core.scheduler.project(ProjectionLimits::default());
        let now = tacc_core::Timestamp(0);
        let waiting = Duration::from_secs(60);
        let of_queued = explain(&env.core, &env.record(queued), &projection, now, waiting);
        assert_eq!(of_queued.position, Some(0), "first in the queue");
        let of_running = explain(&env.core, &env.record(running), &projection, now, waiting);
        assert_eq!(of_running.position, None);
        assert!(of_running.start_estimate.is_none());
    }
}
