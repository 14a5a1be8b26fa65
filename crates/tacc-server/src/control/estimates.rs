//! Start estimates for users: the scheduler's own projection of the queue
//! (`tacc_scheduler::Projection`), computed at most once per scheduler epoch, on a copy
//! of the scheduler and off the control plane's lock, and shared by every task view and
//! `why` until the scheduler's state changes; the what-ifs (fewer GPUs, other nodes);
//! their wire form. [`Estimates`] is a service of its own beside the control plane (the
//! API's state holds it): the one thing it asks of the control plane is a copy of the
//! scheduler ([`Control::scheduler_copy`]).

use std::sync::Arc;

use tacc_core::{Resources, TaskId, Timestamp};
use tacc_proto::{LatestStartView, NodesWhatIf, ShapeWhatIf, StartEstimateView, TaskEndView};
use tacc_scheduler::{
    LatestStart, LimitKind, PendingReason, Projection, ProjectionLimits, Scheduler,
    SchedulerConfig, StartEstimate,
};
use tacc_store::Store;
use tokio::sync::Mutex;

use super::Control;
use crate::ServerError;
use crate::auth::Authenticator;
use crate::clock::Clock;

/// Earlier runs of a user's task name needed before their median counts as its usual run
/// time, and the most looked at.
const RUNS_FOR_A_USUAL_TIME: (usize, u32) = (3, 20);

/// Start estimates, beside the control plane: the projection of the latest scheduler
/// epoch asked about, shared by every task view and `why`, and what-ifs of submissions.
/// Each works on a copy of the scheduler the control plane hands out
/// ([`Control::scheduler_copy`]), off its lock; nothing here changes the control plane.
/// Built with the API's state; clones share the cached projection.
#[derive(Debug, Clone)]
pub(crate) struct Estimates {
    control: Arc<Control>,
    store: Arc<dyn Store>,
    auth: Arc<Authenticator>,
    clock: Arc<dyn Clock>,
    /// Users, groups and limits as configured (who is accounted to which group).
    config: SchedulerConfig,
    /// The projection of the latest scheduler epoch asked about. Its lock is held while a
    /// projection is computed, so concurrent askers wait for one computation; the control
    /// plane's lock is held only to copy the scheduler, never while projecting.
    latest: Arc<Mutex<Option<Arc<Projection>>>>,
}

impl Estimates {
    /// The estimates of `control`'s scheduler, with nothing projected yet.
    pub(crate) fn of(control: &Arc<Control>) -> Estimates {
        Estimates {
            control: control.clone(),
            store: control.store.clone(),
            auth: control.auth.clone(),
            clock: control.clock.clone(),
            config: control.config.scheduler.clone(),
            latest: Arc::default(),
        }
    }

    /// The projection of the current scheduler state: the cached one while the
    /// scheduler's epoch has not moved, else a fresh one.
    pub(crate) async fn projection(&self) -> Arc<Projection> {
        let mut cached = self.latest.lock().await;
        let known = cached.as_ref().map(|projection| projection.epoch());
        let Some(copy) = self.control.scheduler_copy(known).await else {
            return cached.clone().expect("a projection of the current epoch");
        };
        let fresh =
            Arc::new(project_apart(move || copy.project(ProjectionLimits::default())).await);
        *cached = Some(fresh.clone());
        fresh
    }

    /// The latest start of the scheduler's projection for a queued task (the cached
    /// projection of the current epoch: listing many tasks projects once).
    pub(crate) async fn estimated_start(&self, task: TaskId) -> Option<Timestamp> {
        self.projection()
            .await
            .estimate(task, self.clock.now())
            .and_then(|estimate| estimate.latest_at())
    }

    /// When a task `user` submits with `spec` would start if submitted now: refused (with
    /// the reason a submit would give), at once, or the projection's answer — worked out on
    /// a copy of the scheduler, off the control plane's lock; nothing is stored.
    pub(crate) async fn estimate_submission(
        &self,
        user: &str,
        spec: tacc_schema::TaskSpec,
    ) -> Result<tacc_proto::SubmitEstimate, ServerError> {
        spec.validate()
            .map_err(|e| ServerError::InvalidTask(e.to_string()))?;
        let identity_group = self.auth.group_of(user).await?;
        let now = self.clock.now();
        let group = group_for(&self.config, user, identity_group);
        let request = super::request_for(&spec, user, now, group);
        let Some(copy) = self.control.scheduler_copy(None).await else {
            unreachable!("a copy is always given when no epoch is known");
        };
        if let Some(refusal) = copy.refusal(&request) {
            return Ok(tacc_proto::SubmitEstimate {
                refused: Some(refusal.reason.to_string()),
                starts_now: false,
                estimate: None,
            });
        }
        project_apart(move || hypothetical_start(copy, request, now)).await
    }

    /// When the queued `task` likely starts if the running tasks end after their users'
    /// usual run times for their names (the median of the last runs that succeeded, where
    /// there are enough) instead of at their limits: `None` when no running task has such
    /// a history, or it starts it no sooner than `latest`. `scheduler` is a copy of the
    /// live one.
    pub(crate) async fn likely_start(
        &self,
        scheduler: Scheduler,
        task: TaskId,
        latest: &LatestStartView,
        now: Timestamp,
    ) -> Result<Option<tacc_proto::LikelyStartView>, ServerError> {
        let running = self
            .store
            .list_tasks(&tacc_store::TaskFilter {
                states: vec![tacc_core::TaskState::Running],
                ..Default::default()
            })
            .await?;
        let mut usual: std::collections::BTreeMap<(String, String), Option<(u64, usize)>> =
            Default::default();
        let mut ends = std::collections::BTreeMap::new();
        let mut said = std::collections::BTreeMap::new();
        for record in running {
            let Some(started) = record.started_at else {
                continue;
            };
            let key = (record.user.clone(), record.name.clone());
            if !usual.contains_key(&key) {
                let (least, most) = RUNS_FOR_A_USUAL_TIME;
                let mut runs = self
                    .store
                    .recent_run_times(&record.user, &record.name, most)
                    .await?;
                runs.sort_unstable();
                let median = (runs.len() >= least).then(|| (runs[runs.len() / 2], runs.len()));
                usual.insert(key.clone(), median);
            }
            let Some((median, count)) = usual[&key] else {
                continue;
            };
            ends.insert(
                record.id,
                Timestamp(started.as_millis().saturating_add(median)),
            );
            said.insert(
                record.id,
                format!(
                    "task {} usually runs {} (median of {}'s last {count} runs of {})",
                    record.id,
                    crate::usage::human_duration(std::time::Duration::from_millis(median)),
                    record.user,
                    record.name
                ),
            );
        }
        if ends.is_empty() {
            return Ok(None);
        }
        let estimate = project_apart(move || {
            scheduler
                .project_likely(&ends, ProjectionLimits::default())
                .estimate(task, now)
        })
        .await;
        let Some(estimate) = estimate else {
            return Ok(None);
        };
        let LatestStart::At(at) = estimate.latest else {
            return Ok(None);
        };
        let sooner = match latest {
            LatestStartView::At { at: latest } => at < *latest,
            _ => true,
        };
        if !sooner {
            return Ok(None);
        }
        let mut because: Vec<String> = estimate
            .after
            .iter()
            .filter_map(|end| said.get(&end.task).cloned())
            .collect();
        if because.is_empty() {
            because = said.into_values().take(3).collect();
        }
        Ok(Some(tacc_proto::LikelyStartView { at, because }))
    }
}

/// The group `user`'s tasks are accounted to: the configured one (the scheduler's
/// configuration names it: `None` here), else their identity's (`identity`), as the
/// control plane does (`Core::group_for`).
fn group_for(config: &SchedulerConfig, user: &str, identity: Option<String>) -> Option<String> {
    let configured = config.users.get(user).is_some_and(|u| u.group.is_some());
    match configured {
        true => None,
        false => identity,
    }
}

/// The id the hypothetical task of [`Estimates::estimate_submission`] gets in the copy (no
/// real task ever has it: ids count up from 1).
const HYPOTHETICAL: TaskId = TaskId(u64::MAX);

/// Submit `request` to `scheduler` (a copy) and project its start.
fn hypothetical_start(
    mut scheduler: Scheduler,
    request: tacc_scheduler::TaskRequest,
    now: Timestamp,
) -> Result<tacc_proto::SubmitEstimate, ServerError> {
    let plan = scheduler
        .handle(
            now,
            tacc_scheduler::Event::TaskSubmitted {
                task: HYPOTHETICAL,
                request,
            },
        )
        .map_err(|e| ServerError::Internal(format!("estimating a submission: {e}")))?;
    let starts_now = plan.actions.iter().any(|action| {
        matches!(action, tacc_scheduler::Action::Start { task, .. } if *task == HYPOTHETICAL)
    });
    if starts_now {
        return Ok(tacc_proto::SubmitEstimate {
            refused: None,
            starts_now: true,
            estimate: None,
        });
    }
    let projection = scheduler.project(ProjectionLimits::default());
    let reason = match scheduler.explain_with(HYPOTHETICAL, Some(&projection)) {
        tacc_scheduler::Explanation::Queued { reason, .. } => reason,
        _ => None,
    };
    let estimate = projection
        .estimate(HYPOTHETICAL, now)
        .map(|estimate| view(&estimate, reason.as_ref(), "you"));
    Ok(tacc_proto::SubmitEstimate {
        refused: None,
        starts_now: false,
        estimate,
    })
}

/// Run a projection on a blocking thread: it may take a while on a large cluster.
async fn project_apart<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        // A blocking task is never aborted; it fails only by panicking (or when the
        // runtime shuts down, which ends this request too).
        Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
    }
}

/// Label values tried per label in the other-nodes what-if.
const OTHER_VALUES: usize = 3;

/// Whether the queued `task` has what-ifs to project: it asks for 2 or more GPUs per node
/// (half as many), or selects nodes by a label that other nodes up carry other values of
/// (another partition, another pool). Asked under the control plane's lock, so cheap.
pub(super) fn wants_what_ifs(scheduler: &Scheduler, task: TaskId, per_node: Resources) -> bool {
    per_node.gpus >= 2 || !scheduler.other_label_values(task, 1).is_empty()
}

/// The what-ifs of a queued task from `scheduler` (a copy of the live one), off the
/// control plane's lock: made on demand for the one task, each projection stopping when
/// the task starts.
pub(super) async fn what_ifs(
    scheduler: Scheduler,
    task: TaskId,
    per_node: Resources,
    asked: StartEstimate,
    now: Timestamp,
) -> (Option<ShapeWhatIf>, Vec<NodesWhatIf>) {
    project_apart(move || what_ifs_of(&scheduler, task, per_node, &asked, now)).await
}

/// [`what_ifs`] itself: the same task asking for half its GPUs per node, and selecting
/// each other value of its labels (a few per label) that nodes up carry.
fn what_ifs_of(
    scheduler: &Scheduler,
    task: TaskId,
    per_node: Resources,
    asked: &StartEstimate,
    now: Timestamp,
) -> (Option<ShapeWhatIf>, Vec<NodesWhatIf>) {
    let limits = ProjectionLimits::default();
    let fewer_gpus = (per_node.gpus >= 2)
        .then(|| {
            let gpus = per_node.gpus / 2;
            let reshaped = Resources { gpus, ..per_node };
            let estimate = scheduler
                .project_reshaped(task, reshaped, limits)?
                .estimate(task, now)?;
            Some(ShapeWhatIf {
                gpus_per_node: gpus,
                latest: latest_view(&estimate.latest),
                sooner: sooner(&estimate, asked),
            })
        })
        .flatten();
    let other_nodes = scheduler
        .other_label_values(task, OTHER_VALUES)
        .into_iter()
        .filter_map(|(label, value)| {
            let estimate = scheduler
                .project_relabelled(task, &label, &value, limits)?
                .estimate(task, now)?;
            Some(NodesWhatIf {
                latest: latest_view(&estimate.latest),
                sooner: sooner(&estimate, asked),
                label,
                value,
            })
        })
        .collect();
    (fewer_gpus, other_nodes)
}

/// Whether `other` starts sooner than `asked` (a known latest start beats an unknown one).
fn sooner(other: &StartEstimate, asked: &StartEstimate) -> bool {
    match (other.latest_at(), asked.latest_at()) {
        (Some(other), Some(asked)) => other < asked,
        (Some(_), None) => true,
        _ => false,
    }
}

pub(super) fn latest_view(latest: &LatestStart) -> LatestStartView {
    match latest {
        LatestStart::At(at) => LatestStartView::At { at: *at },
        LatestStart::Unknown { no_time_limit } => LatestStartView::Unknown {
            no_time_limit: no_time_limit.clone(),
        },
        LatestStart::BeyondHorizon { after } => LatestStartView::BeyondHorizon { after: *after },
    }
}

/// The wire form of `estimate`, with what it rests on besides the ends of tasks (the
/// limit or hold that keeps the task waiting) said for people.
pub(super) fn view(
    estimate: &StartEstimate,
    reason: Option<&PendingReason>,
    user: &str,
) -> StartEstimateView {
    let mut basis = Vec::new();
    if let Some(reason) = reason
        && let Some(said) = rests_on(reason, user)
    {
        basis.push(said);
    }
    if let LatestStart::Unknown { no_time_limit } = &estimate.latest {
        let tasks: Vec<String> = no_time_limit.iter().map(|t| format!("task {t}")).collect();
        basis.push(if tasks.is_empty() {
            "nothing ahead of it ends by a time limit".to_string()
        } else {
            format!(
                "it waits for {} without a time limit (set resources.time_limit to get an estimate)",
                tasks.join(", ")
            )
        });
    }
    StartEstimateView {
        earliest: estimate.earliest,
        latest: latest_view(&estimate.latest),
        after: estimate
            .after
            .iter()
            .map(|end| TaskEndView {
                task: end.task,
                at: end.at,
            })
            .collect(),
        basis,
        likely: None,
    }
}

/// The limit or hold behind a pending reason, as a fact the estimate rests on.
fn rests_on(reason: &PendingReason, user: &str) -> Option<String> {
    let amount = |limit: LimitKind, max: u64| match limit {
        LimitKind::RunningTasks => format!("run {max} task{} at a time", plural(max)),
        LimitKind::QueuedTasks => format!("queue {max} task{}", plural(max)),
        other => format!("use {max} {other} at a time"),
    };
    Some(match reason {
        PendingReason::OverUserQuota { limit, max } => {
            format!("{user} may {}", amount(*limit, *max))
        }
        PendingReason::OverGroupQuota { group, limit, max } => {
            format!("group {group} may {}", amount(*limit, *max))
        }
        PendingReason::LowerPriority { blocked_by } => {
            format!("the free resources are held for task {blocked_by}")
        }
        PendingReason::BehindOlderTask { blocked_by } => {
            format!("the queue is first-in first-out and task {blocked_by} goes first")
        }
        PendingReason::Dependency { on } => format!("task {on} must end first"),
        _ => return None,
    })
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
