//! An agent says an attempt's process started: a task still `starting` as that attempt
//! becomes `running` (a late or repeated start changes nothing).

use tacc_core::{TaskState, Timestamp};
use tacc_proto::AttemptRef;
use tacc_store::{TaskChange, TaskRecord, Transition};

use crate::control::Core;
use crate::control::effects::{Effects, Metric};

pub(crate) fn on_started(
    _core: &mut Core,
    fx: &mut Effects,
    record: &TaskRecord,
    attempt: AttemptRef,
    at: Timestamp,
) {
    if record.attempt != attempt.attempt || record.state != TaskState::Starting {
        return;
    }
    fx.change(TaskChange::Transition(Transition::new(
        attempt.task,
        TaskState::Starting,
        TaskState::Running,
        attempt.attempt,
        at,
    )));
    fx.count(Metric::Started {
        submitted_at: record.submitted_at,
        attempt: attempt.attempt,
    });
}
