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
