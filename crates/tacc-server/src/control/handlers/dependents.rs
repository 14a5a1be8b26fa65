//! A pipeline stage failed or was cancelled for good: the queued tasks of every stage
//! that needs it, directly or through others, end now — failed, or cancelled when it
//! was cancelled — with `dependency_failed: <stage> (task N)`, before the scheduler
//! could start them.

use std::collections::BTreeSet;

use tacc_core::{TaskState, Timestamp};
use tacc_scheduler::Event;
use tacc_store::{StageRecord, TaskChange, TaskRecord, Transition};

use crate::control::Core;
use crate::control::effects::Effects;

/// The stages of a pipeline (`stages`) whose tasks end with `stage`: those needing it
/// directly or through others, not `stage` itself nor the cached ones (their outputs
/// stand). The shell reads these stages' tasks for [`on_dependents_ended`].
pub(crate) fn stages_ending_with<'a>(
    stages: &'a [StageRecord],
    stage: &StageRecord,
) -> Vec<&'a StageRecord> {
    let mut ended: BTreeSet<&str> = BTreeSet::from([stage.name.as_str()]);
    // Stages are few: repeat until no stage newly depends on an ended one.
    loop {
        let before = ended.len();
        for s in stages {
            if s.needs.iter().any(|n| ended.contains(n.as_str())) {
                ended.insert(s.name.as_str());
            }
        }
        if ended.len() == before {
            break;
        }
    }
    stages
        .iter()
        .filter(|s| !s.cached && s.name != stage.name && ended.contains(s.name.as_str()))
        .collect()
}

/// End the queued ones of `tasks` (the dependent stages' tasks, as the store holds them)
/// as `end_state` with `reason`.
pub(crate) fn on_dependents_ended(
    core: &mut Core,
    fx: &mut Effects,
    tasks: Vec<TaskRecord>,
    reason: &str,
    end_state: TaskState,
    at: Timestamp,
) {
    let mut events = Vec::new();
    for task in tasks.into_iter().filter(|t| t.state == TaskState::Queued) {
        fx.change(TaskChange::Transition(Transition {
            reason: Some(reason.to_string()),
            ..Transition::new(task.id, TaskState::Queued, end_state, task.attempt, at)
        }));
        if core.withdraw(task.id) {
            events.push(Event::TaskCancelled(task.id));
        }
        fx.wake_logs(task.id);
    }
    if !events.is_empty() {
        fx.decide(Event::Batch(events));
    }
}
