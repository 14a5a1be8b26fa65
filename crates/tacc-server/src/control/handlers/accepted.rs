//! A workflow's tasks were accepted — an array's elements, a sweep's trials, a pipeline's
//! stages — and made durable by their service first. They reach the scheduler in one
//! batch, each stage task with the tasks it waits for; the tasks of a stage after an
//! unfinished sweep stay out of it (`Core::after_sweeps`), saying why, until the sweep
//! has ended (see [`super::sweep_ended`]).

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{GroupId, TaskId};
use tacc_schema::TaskSpec;
use tacc_store::{TaskChange, TaskRecord};

use crate::control::effects::Effects;
use crate::control::{Core, ServerConfig, request_of};

/// The tasks stage tasks wait for: `tasks` wait outside the scheduler for `sweeps` (the
/// sweep stages named `stage_names`) to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AwaitingSweeps {
    pub(crate) tasks: Vec<TaskId>,
    pub(crate) sweeps: BTreeSet<GroupId>,
    pub(crate) stage_names: String,
}

/// Newly stored tasks of one user, with what they run.
#[derive(Debug, Default)]
pub(crate) struct Accepted {
    pub(crate) tasks: Vec<(TaskRecord, TaskSpec)>,
    /// For stage tasks: the tasks of the stages they need that still run.
    pub(crate) depends: BTreeMap<TaskId, Vec<TaskId>>,
    pub(crate) awaiting: Vec<AwaitingSweeps>,
}

/// Queue `accepted` tasks of `user` (whose group by their identity is `identity_group`).
pub(crate) fn on_accepted(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    user: &str,
    identity_group: Option<String>,
    accepted: Accepted,
) {
    let Accepted {
        tasks,
        depends,
        awaiting,
    } = accepted;
    core.identity_groups
        .insert(user.to_string(), identity_group);
    let owner_group = core.group_for(config, user);
    for (record, spec) in &tasks {
        core.specs.insert(record.id, spec.clone());
    }
    core.stage_deps.extend(depends);
    let mut kept: BTreeSet<TaskId> = BTreeSet::new();
    for waiting in awaiting {
        on_awaiting_sweeps(core, fx, &waiting);
        kept.extend(waiting.tasks.iter().copied());
    }
    let submitted = tasks
        .iter()
        .filter(|(record, _)| !kept.contains(&record.id))
        .map(|(record, spec)| {
            let request = request_of(spec, record, record.submitted_at, owner_group.clone());
            (record.id, request)
        })
        .collect();
    super::submit::on_submitted(core, fx, submitted);
}

/// Keep queued stage tasks from the scheduler until their sweeps have ended, saying so.
fn on_awaiting_sweeps(core: &mut Core, fx: &mut Effects, waiting: &AwaitingSweeps) {
    let groups: Vec<String> = waiting.sweeps.iter().map(ToString::to_string).collect();
    let reason = format!(
        "waiting for sweep stage {} ({}) to end",
        waiting.stage_names,
        groups.join(", ")
    );
    for task in &waiting.tasks {
        fx.change(TaskChange::Reason {
            task: *task,
            reason: Some(reason.clone()),
        });
        core.after_sweeps.insert(*task, waiting.sweeps.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tacc_core::{NodeId, TaskState};

    use super::*;
    use crate::control::NO_NODE_REASON;
    use crate::control::rules::{test_node, test_record};

    fn core(node_up: bool) -> Core {
        let scheduler = tacc_scheduler::Scheduler::by_name("fifo", Default::default()).unwrap();
        let mut core = Core::new(scheduler, Instant::now());
        if node_up {
            core.nodes.insert(NodeId(1), test_node(1, Instant::now()));
        }
        core
    }

    fn spec() -> TaskSpec {
        tacc_schema::parse_task("task.yaml", "name: s\nrun: echo\n")
            .unwrap()
            .0
    }

    fn accepted() -> Accepted {
        Accepted {
            tasks: (1..=3)
                .map(|id| (test_record(id, TaskState::Queued, 1, &[]), spec()))
                .collect(),
            depends: [(TaskId(2), vec![TaskId(9)])].into(),
            awaiting: vec![AwaitingSweeps {
                tasks: vec![TaskId(3)],
                sweeps: [GroupId(5)].into(),
                stage_names: "`search`".into(),
            }],
        }
    }

    fn submitted(fx: &Effects) -> Vec<TaskId> {
        let mut tasks = Vec::new();
        for event in &fx.decide {
            let events = match event {
                tacc_scheduler::Event::Batch(events) => events.clone(),
                other => vec![other.clone()],
            };
            for event in events {
                if let tacc_scheduler::Event::TaskSubmitted { task, .. } = event {
                    tasks.push(task);
                }
            }
        }
        tasks
    }

    #[test]
    fn accepted_tasks_go_to_the_scheduler_in_one_batch_but_those_after_a_sweep_wait() {
        let mut core = core(true);
        let mut fx = Effects::default();
        let config = ServerConfig::new(std::env::temp_dir());
        on_accepted(&mut core, &mut fx, &config, "ann", None, accepted());
        assert_eq!(submitted(&fx), [TaskId(1), TaskId(2)]);
        assert_eq!(fx.decide.len(), 1, "one batch");
        assert_eq!(core.specs.len(), 3);
        assert_eq!(core.stage_deps[&TaskId(2)], [TaskId(9)]);
        assert_eq!(core.after_sweeps[&TaskId(3)], [GroupId(5)].into());
        let reasons: Vec<(TaskId, Option<String>)> = fx
            .changes
            .iter()
            .filter_map(|c| match c {
                TaskChange::Reason { task, reason } => Some((*task, reason.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            reasons,
            [(
                TaskId(3),
                Some(format!(
                    "waiting for sweep stage `search` ({}) to end",
                    GroupId(5)
                ))
            )]
        );
        assert_eq!(core.identity_groups.get("ann"), Some(&None));
    }

    #[test]
    fn accepted_tasks_are_held_while_no_node_takes_work() {
        let mut core = core(false);
        let mut fx = Effects::default();
        let config = ServerConfig::new(std::env::temp_dir());
        on_accepted(&mut core, &mut fx, &config, "ann", None, accepted());
        assert!(submitted(&fx).is_empty());
        assert_eq!(core.held, [TaskId(1), TaskId(2)].into());
        assert!(fx.changes.iter().any(|c| matches!(
            c,
            TaskChange::Reason { task: TaskId(1), reason: Some(r) } if r == NO_NODE_REASON
        )));
    }
}
