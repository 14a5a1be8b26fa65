//! Tasks were accepted (one submit, an array, a sweep's trials, a pipeline's stages):
//! made durable by the shell first, they reach the scheduler in one batch — or, while no
//! node takes work, wait in the core with the reason why (the scheduler would reject them
//! as never fitting an empty cluster) until a node is up ([`on_release_held`]).

use tacc_core::TaskId;
use tacc_scheduler::{Event, TaskRequest};
use tacc_store::{TaskChange, TaskRecord};

use crate::control::effects::Effects;
use crate::control::{Core, LiveNode, NO_NODE_REASON, ServerConfig, request_of};

/// Queue newly stored tasks, each with what the scheduler is told of it.
pub(crate) fn on_submitted(
    core: &mut Core,
    fx: &mut Effects,
    submitted: Vec<(TaskId, TaskRequest)>,
) {
    if submitted.is_empty() {
        return;
    }
    if core.nodes.values().any(LiveNode::schedulable) {
        let events: Vec<Event> = submitted
            .into_iter()
            .map(|(task, request)| Event::TaskSubmitted { task, request })
            .collect();
        match <[Event; 1]>::try_from(events) {
            Ok([one]) => fx.decide(one),
            Err(many) => fx.decide(Event::Batch(many)),
        }
        return;
    }
    for (task, _) in submitted {
        core.held.insert(task);
        fx.change(TaskChange::Reason {
            task,
            reason: Some(NO_NODE_REASON.into()),
        });
    }
}

/// A node takes work now: the tasks held while none did go to the scheduler. `records`
/// are the held tasks' records, as the store holds them (the shell reads them).
pub(crate) fn on_release_held(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    records: &[TaskRecord],
) {
    if !core.nodes.values().any(LiveNode::schedulable) {
        return;
    }
    for record in records {
        if !core.held.remove(&record.id) {
            continue;
        }
        let Some(spec) = core.specs.get(&record.id) else {
            continue;
        };
        let group = core.group_for(config, &record.user);
        let request = request_of(spec, record, record.submitted_at, group);
        fx.decide(Event::TaskSubmitted {
            task: record.id,
            request,
        });
    }
}

/// Whether [`on_release_held`] has anything to do: tasks are held and a node takes work.
pub(crate) fn held_are_due(core: &Core) -> bool {
    !core.held.is_empty() && core.nodes.values().any(LiveNode::schedulable)
}
