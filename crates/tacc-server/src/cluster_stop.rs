//! Stopping the embedded cluster on its administrator's request (`tcloud down`).
//!
//! A signal to `taccd dev` (SIGTERM, SIGINT) stops only the server: its agent and the
//! tasks on it carry on, and the next server on the same data directory adopts them (an
//! upgrade loses nothing). Stopping the whole cluster — agent and tasks included — is
//! asked for explicitly, by an admin, through `POST /v1/admin/cluster/stop`:
//!
//! - `if_idle`: only when no task is queued, starting or running; otherwise refused, with
//!   the tasks named, and nothing changes;
//! - `drain`: new work is refused from now on; the cluster stops once the tasks it has
//!   finish;
//! - `force`: as `drain`, and every active task is cancelled; each ends `cancelled` with
//!   the reason [`STOP_REASON`] once its agent confirms its processes are gone.
//!
//! When no task is left, [`ClusterStop::done`] fires: `taccd dev` stops its agent, then
//! itself. Whether a request stops, and what is cancelled, are plain functions
//! ([`decide`], [`to_cancel`]); the rest is a thin loop that looks at the store.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tacc_core::{TaskId, TaskState};
use tacc_proto::{ActiveTask, ClusterStopView, StopMode};
use tacc_store::{TaskChange, TaskFilter};
use tokio_util::sync::CancellationToken;

use crate::{Control, ServerError};

/// The reason a task cancelled by `tcloud down --force` ends with.
pub const STOP_REASON: &str = "cluster stopped by tcloud down";
/// How many active tasks a reply names (the count says how many there are).
const NAMED: u32 = 10;
/// How often a stop under way looks at what is left.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// The states of a task that keeps the cluster from stopping.
const ACTIVE: [TaskState; 3] = [TaskState::Queued, TaskState::Starting, TaskState::Running];

/// What a stop request does, given the stop already under way and the active tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopDecision {
    /// Tasks are active and the request would stop none of them: nothing changes.
    Refuse,
    /// Begin (or carry on with) a stop of this kind; the cluster stops once no task is
    /// left.
    Stop(StopMode),
}

/// A stop never weakens: a force stop stays one, a drain turns into a force stop when
/// asked, and a plain request during a drain carries on with the drain.
pub(crate) fn decide(
    requested: StopMode,
    under_way: Option<StopMode>,
    active: u64,
) -> StopDecision {
    let strongest = match (requested, under_way) {
        (StopMode::Force, _) | (_, Some(StopMode::Force)) => StopMode::Force,
        (StopMode::Drain, _) | (_, Some(StopMode::Drain)) => StopMode::Drain,
        _ => StopMode::IfIdle,
    };
    match strongest {
        StopMode::IfIdle if active > 0 && under_way.is_none() => StopDecision::Refuse,
        mode => StopDecision::Stop(mode),
    }
}

/// The active tasks (each with whether its cancel was asked for already) a force stop
/// still has to cancel: those it has not asked to cancel yet and no one else has either.
pub(crate) fn to_cancel(active: &[(TaskId, bool)], asked: &BTreeSet<TaskId>) -> Vec<TaskId> {
    active
        .iter()
        .filter(|(task, cancel_requested)| !cancel_requested && !asked.contains(task))
        .map(|(task, _)| *task)
        .collect()
}

/// The embedded cluster's stop: the one under way, and the signal that it is done.
#[derive(Debug, Default)]
pub struct ClusterStop {
    under_way: Mutex<Option<StopMode>>,
    done: CancellationToken,
}

impl ClusterStop {
    pub fn new() -> Arc<ClusterStop> {
        Arc::new(ClusterStop::default())
    }

    /// Cancelled once a stop found no task left: the embedding process stops its agent
    /// and exits.
    pub fn done(&self) -> CancellationToken {
        self.done.clone()
    }

    pub(crate) fn under_way(&self) -> Option<StopMode> {
        *self.under_way.lock().unwrap()
    }

    /// Records `mode` as the stop under way; true the first time (a watcher must start).
    fn begin(&self, mode: StopMode) -> bool {
        self.under_way.lock().unwrap().replace(mode).is_none()
    }

    /// New work (a submission, a rerun) is refused while the cluster stops.
    pub(crate) fn refuse_new_work(&self) -> Result<(), ServerError> {
        let Some(mode) = self.under_way() else {
            return Ok(());
        };
        let how = match mode {
            StopMode::Drain => {
                "it is draining (`tcloud down --drain`): it takes no new tasks and stops once \
                 its queued and running tasks have finished"
            }
            StopMode::Force => {
                "it is stopping (`tcloud down --force`): its tasks are being cancelled"
            }
            StopMode::IfIdle => "it is stopping (`tcloud down`)",
        };
        Err(ServerError::Conflict(format!(
            "the local cluster accepts no new tasks: {how}; submit again after `tcloud up`"
        )))
    }
}

fn active_filter(limit: Option<u32>) -> TaskFilter {
    TaskFilter {
        states: ACTIVE.to_vec(),
        limit,
        ..TaskFilter::default()
    }
}

/// Where the stop stands: the one under way and the tasks still active.
pub(crate) async fn view(
    control: &Control,
    stop: &ClusterStop,
) -> Result<ClusterStopView, ServerError> {
    let active_count = control.store.count_tasks(&active_filter(None)).await?;
    let active = control
        .store
        .list_tasks(&active_filter(Some(NAMED)))
        .await?
        .into_iter()
        .map(|task| ActiveTask {
            id: task.id,
            name: task.name,
            user: task.user,
            state: task.state,
        })
        .collect();
    Ok(ClusterStopView {
        stopping: stop.under_way(),
        active_count,
        active,
    })
}

/// An admin asks for a stop: decide, begin it (watching it to its end, once), and say
/// where it stands. `shutdown` ends the watching with the server.
pub(crate) async fn request(
    control: &Arc<Control>,
    stop: &Arc<ClusterStop>,
    requested: StopMode,
    shutdown: CancellationToken,
) -> Result<ClusterStopView, ServerError> {
    let active = control.store.count_tasks(&active_filter(None)).await?;
    if let StopDecision::Stop(mode) = decide(requested, stop.under_way(), active)
        && stop.begin(mode)
    {
        tracing::info!(
            "the cluster stops on request ({}): {active} tasks active",
            mode.as_str()
        );
        tokio::spawn(watch(control.clone(), stop.clone(), shutdown));
    }
    view(control, stop).await
}

/// Look at what is left until nothing is, cancelling what a force stop must; then fire
/// [`ClusterStop::done`].
async fn watch(control: Arc<Control>, stop: Arc<ClusterStop>, shutdown: CancellationToken) {
    let mut asked = BTreeSet::new();
    let mut named = BTreeSet::new();
    loop {
        match look(&control, &stop, &mut asked, &mut named).await {
            Ok(true) => {
                tracing::info!("no task is left: the cluster stops");
                stop.done.cancel();
                return;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("stopping the cluster: {e}; trying again"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}

/// One look: cancel what must be, name the stop in the reason of the tasks it cancelled
/// that have ended; true once no task is active.
async fn look(
    control: &Control,
    stop: &ClusterStop,
    asked: &mut BTreeSet<TaskId>,
    named: &mut BTreeSet<TaskId>,
) -> Result<bool, ServerError> {
    let active = control.store.list_tasks(&active_filter(None)).await?;
    if stop.under_way() == Some(StopMode::Force) {
        let marked: Vec<(TaskId, bool)> = active
            .iter()
            .map(|task| (task.id, task.cancel_requested))
            .collect();
        for task in to_cancel(&marked, asked) {
            match control.cancel_because(task, STOP_REASON).await {
                Ok(_) | Err(ServerError::TaskNotFound(_)) => {
                    asked.insert(task);
                }
                Err(e) => tracing::warn!("cannot cancel task {task} to stop the cluster: {e}"),
            }
        }
    }
    let still: BTreeSet<TaskId> = active.iter().map(|task| task.id).collect();
    for &task in asked.difference(&still) {
        if named.contains(&task) {
            continue;
        }
        name_the_stop(control, task).await?;
        named.insert(task);
    }
    Ok(active.is_empty())
}

/// A task the stop cancelled ended `cancelled` with the control plane's generic reason:
/// say what stopped it.
async fn name_the_stop(control: &Control, task: TaskId) -> Result<(), ServerError> {
    let Some(record) = control.store.get_task(task).await? else {
        return Ok(());
    };
    if record.state == TaskState::Cancelled && record.reason.as_deref() != Some(STOP_REASON) {
        control
            .commit(&[TaskChange::Reason {
                task,
                reason: Some(STOP_REASON.into()),
            }])
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use StopMode::*;

    #[test]
    fn a_request_stops_when_it_may_and_a_stop_never_weakens() {
        let cases = [
            // (requested, under way, active tasks) → decision
            (IfIdle, None, 0, StopDecision::Stop(IfIdle)),
            (IfIdle, None, 3, StopDecision::Refuse),
            (Drain, None, 3, StopDecision::Stop(Drain)),
            (Drain, None, 0, StopDecision::Stop(Drain)),
            (Force, None, 3, StopDecision::Stop(Force)),
            (IfIdle, Some(Drain), 3, StopDecision::Stop(Drain)),
            (IfIdle, Some(Force), 3, StopDecision::Stop(Force)),
            (Drain, Some(Force), 3, StopDecision::Stop(Force)),
            (Force, Some(Drain), 3, StopDecision::Stop(Force)),
            (Drain, Some(Drain), 1, StopDecision::Stop(Drain)),
            // A plain stop already begun (a task slipped in after the count) waits for it.
            (IfIdle, Some(IfIdle), 1, StopDecision::Stop(IfIdle)),
        ];
        for (requested, under_way, active, expected) in cases {
            assert_eq!(
                decide(requested, under_way, active),
                expected,
                "{requested:?} with {under_way:?} under way and {active} active"
            );
        }
    }

    #[test]
    fn a_force_stop_cancels_each_task_once_and_none_already_cancelling() {
        let active = [(TaskId(1), false), (TaskId(2), true), (TaskId(3), false)];
        let asked = BTreeSet::from([TaskId(3)]);
        assert_eq!(to_cancel(&active, &asked), vec![TaskId(1)]);
        assert!(to_cancel(&[], &asked).is_empty());
    }

    #[test]
    fn new_work_is_refused_while_stopping_and_says_how() {
        let stop = ClusterStop::default();
        stop.refuse_new_work().unwrap();
        assert!(stop.begin(Drain));
        let refused = stop.refuse_new_work().unwrap_err().to_string();
        assert!(
            refused.contains("draining (`tcloud down --drain`)") && refused.contains("tcloud up"),
            "{refused}"
        );
        assert!(
            !stop.begin(Force),
            "a second request starts no second watcher"
        );
        let refused = stop.refuse_new_work().unwrap_err().to_string();
        assert!(refused.contains("--force"), "{refused}");
    }
}
