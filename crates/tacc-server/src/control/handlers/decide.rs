//! The scheduler decides on events: each is given what the core keeps beside the
//! scheduler — the stage tasks a pipeline task waits for, the not-before time of a retry
//! waiting out its backoff — and the scheduler (a pure state machine in the core) answers
//! with a plan, which the shell applies (`handlers::plan`) in the turn's transaction.

use tacc_core::{TaskId, Timestamp};
use tacc_scheduler::{Event, Plan, SchedulerError};

use crate::control::Core;

/// Decide on `event` at `now`.
pub(crate) fn on_decide(
    core: &mut Core,
    now: Timestamp,
    mut event: Event,
) -> Result<Plan, SchedulerError> {
    patch(core, &mut event);
    core.scheduler.handle(now, event)
}

/// Give each submitted task what the core keeps about it for the scheduler: the tasks a
/// pipeline stage task needs (every way it reaches the scheduler — a submit, a retry, a
/// held task released, a rebuild — carries them), and the not-before time of a retry.
pub(crate) fn patch(core: &Core, event: &mut Event) {
    if core.stage_deps.is_empty() && core.retry_at.is_empty() {
        return;
    }
    match event {
        Event::TaskSubmitted { task, request } => {
            if let Some(needed) = core.stage_deps.get(task) {
                request.depends_on = needed.clone();
            }
            request.not_before = not_before(core, *task);
        }
        Event::Batch(events) => {
            for event in events {
                patch(core, event);
            }
        }
        _ => {}
    }
}

fn not_before(core: &Core, task: TaskId) -> Option<Timestamp> {
    core.retry_at.get(&task).copied()
}
