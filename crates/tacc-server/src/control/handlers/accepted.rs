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
