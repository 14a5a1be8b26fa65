//! A sweep stage has ended with a best trial: the stage tasks that waited only for it
//! (`Core::after_sweeps`) go to the scheduler, each with the tasks of the stages it
//! needs that still run, and no longer say they wait. (A sweep that ended without a
//! best trial ends them instead: see [`super::dependents`].)

use tacc_core::{GroupId, TaskId, TaskState};
use tacc_store::{TaskChange, TaskRecord};

use crate::control::effects::Effects;
use crate::control::{Core, ServerConfig, request_of};

/// Take the tasks that waited for sweep `group` and for no other sweep out of waiting;
/// the shell reads their records for [`on_released`].
pub(crate) fn released_by(core: &mut Core, group: GroupId) -> Vec<TaskId> {
    let mut released = Vec::new();
    for (task, sweeps) in core.after_sweeps.iter_mut() {
        if sweeps.remove(&group) && sweeps.is_empty() {
            released.push(*task);
        }
    }
    for task in &released {
        core.after_sweeps.remove(task);
    }
    released
}

/// A released task as the store holds it, with the tasks it still waits for.
#[derive(Debug, Clone)]
pub(crate) struct Released {
    pub(crate) record: TaskRecord,
    pub(crate) needs: Option<Vec<TaskId>>,
}

/// Queue the released tasks still queued (a task ended meanwhile stays ended).
pub(crate) fn on_released(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    released: Vec<Released>,
) {
    let mut submitted = Vec::new();
    for Released { record, needs } in released {
        if record.state != TaskState::Queued {
            continue;
        }
        let Some(spec) = core.specs.get(&record.id).cloned() else {
            continue;
        };
        if let Some(needed) = needs {
            core.stage_deps.insert(record.id, needed);
        }
        let owner_group = core.group_for(config, &record.user);
        submitted.push((
            record.id,
            request_of(&spec, &record, record.submitted_at, owner_group),
        ));
    }
    for (task, _) in &submitted {
        fx.change(TaskChange::Reason {
            task: *task,
            reason: None,
        });
    }
    super::submit::on_submitted(core, fx, submitted);
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tacc_core::NodeId;
    use tacc_schema::TaskSpec;

    use super::*;
    use crate::control::effects::Effects;
    use crate::control::rules::{test_node, test_record};

    fn core() -> Core {
        let scheduler = tacc_scheduler::Scheduler::by_name("fifo", Default::default()).unwrap();
        let mut core = Core::new(scheduler, Instant::now());
        core.nodes.insert(NodeId(1), test_node(1, Instant::now()));
        core
    }

    fn spec() -> TaskSpec {
        tacc_schema::parse_task("task.yaml", "name: s\nrun: echo\n")
            .unwrap()
            .0
    }

    #[test]
    fn only_tasks_waiting_for_no_other_sweep_are_released() {
        let mut core = core();
        core.after_sweeps = [
            (TaskId(1), [GroupId(5)].into()),
            (TaskId(2), [GroupId(5), GroupId(6)].into()),
            (TaskId(3), [GroupId(6)].into()),
        ]
        .into();
        assert_eq!(released_by(&mut core, GroupId(5)), [TaskId(1)]);
        assert_eq!(
            core.after_sweeps,
            [
                (TaskId(2), [GroupId(6)].into()),
                (TaskId(3), [GroupId(6)].into())
            ]
            .into()
        );
        assert!(released_by(&mut core, GroupId(7)).is_empty());
    }

    #[test]
    fn released_queued_tasks_are_submitted_with_their_needs_and_no_longer_wait() {
        // (state, spec known, needs) → submitted
        let table = [
            (TaskState::Queued, true, Some(vec![TaskId(9)]), true),
            (TaskState::Queued, true, None, true),
            (TaskState::Queued, false, None, false),
            (TaskState::Failed, true, Some(vec![TaskId(9)]), false),
        ];
        for (state, known, needs, expected) in table {
            let mut core = core();
            if known {
                core.specs.insert(TaskId(1), spec());
            }
            let mut fx = Effects::default();
            let config = ServerConfig::new(std::env::temp_dir());
            let released = vec![Released {
                record: test_record(1, state, 1, &[]),
                needs: needs.clone(),
            }];
            on_released(&mut core, &mut fx, &config, released);
            assert_eq!(
                !fx.decide.is_empty(),
                expected,
                "{state:?} {known} {needs:?}"
            );
            let cleared = fx.changes.iter().any(|c| {
                matches!(
                    c,
                    TaskChange::Reason {
                        task: TaskId(1),
                        reason: None
                    }
                )
            });
            assert_eq!(cleared, expected, "{state:?} {known}");
            assert_eq!(
                core.stage_deps.get(&TaskId(1)).cloned(),
                needs.filter(|_| expected),
                "{state:?} {known}"
            );
        }
    }
}
