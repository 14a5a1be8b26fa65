//! Sweeps as pipeline stages. A sweep launches its trials over time, so the stages after
//! it cannot wait on a fixed set of tasks in the scheduler: they are kept queued outside
//! it (`Core::after_sweeps`) until every sweep stage they need, directly or through
//! other stages, has ended. Then they are handed to the scheduler — receiving the best
//! trial's outputs — or, when no trial succeeded or the sweep was cancelled, they end
//! with `dependency_failed: <stage> (group gN: …)` and never run. A single trial that
//! fails or is stopped early decides nothing: it is the search.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{GroupId, TaskId, TaskState};
use tacc_store::{GroupKind, StageRecord, StageSource, TaskChange, TaskRecord};

use super::{Control, Core, request_of};
use crate::ServerError;

/// What a stage ran as, which decides how its end and its outputs are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageKind {
    Task,
    Array,
    Sweep(GroupId),
}

/// How a sweep stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SweepEnd {
    /// Still launching or running trials.
    Open,
    Best(TaskId),
    NoTrialSucceeded,
    Cancelled,
}

impl Control {
    pub(crate) async fn stage_kind(&self, stage: &StageRecord) -> Result<StageKind, ServerError> {
        Ok(match stage.source {
            StageSource::Task(_) => StageKind::Task,
            StageSource::Group(group) => match self.store.get_group(group).await? {
                Some(record) if record.kind == GroupKind::Sweep => StageKind::Sweep(group),
                _ => StageKind::Array,
            },
        })
    }

    /// Where a sweep stands, read from the store: open while a trial is unfinished or one
    /// is left to launch (unless the user cancelled it).
    pub(crate) async fn sweep_end(&self, group: GroupId) -> Result<SweepEnd, ServerError> {
        let Some(record) = self.store.get_group(group).await? else {
            return Ok(SweepEnd::Cancelled);
        };
        let trials = self.group_elements(group).await?;
        let cancelled = trials
            .iter()
            .any(|t| t.reason.as_deref() == Some("cancelled by user"));
        if trials.iter().any(|t| !t.state.is_terminal())
            || (!cancelled && !Control::sweep_launched_all(&record))
        {
            return Ok(SweepEnd::Open);
        }
        if cancelled {
            return Ok(SweepEnd::Cancelled);
        }
        Ok(match self.best_trial(group).await? {
            Some(best) => SweepEnd::Best(best),
            None => SweepEnd::NoTrialSucceeded,
        })
    }

    /// The unfinished sweep stages `stage` waits for: sweeps among the stages it needs,
    /// directly or through others. Cached stages wait for nothing.
    pub(crate) async fn sweeps_awaited(
        &self,
        stage: &StageRecord,
        stages: &[StageRecord],
    ) -> Result<BTreeSet<GroupId>, ServerError> {
        let mut awaited = BTreeSet::new();
        if stage.cached {
            return Ok(awaited);
        }
        let by_name: BTreeMap<&str, &StageRecord> =
            stages.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut next: Vec<&str> = stage.needs.iter().map(String::as_str).collect();
        while let Some(name) = next.pop() {
            if !seen.insert(name) {
                continue;
            }
            let Some(needed) = by_name.get(name) else {
                continue;
            };
            if needed.cached {
                continue;
            }
            if let StageKind::Sweep(group) = self.stage_kind(needed).await?
                && self.sweep_end(group).await? == SweepEnd::Open
            {
                awaited.insert(group);
            }
            next.extend(needed.needs.iter().map(String::as_str));
        }
        Ok(awaited)
    }

    /// Keep queued stage tasks from the scheduler until `sweeps` have ended, saying so.
    pub(super) async fn wait_for_sweeps(
        &self,
        inner: &mut Core,
        tasks: &[TaskId],
        sweeps: &BTreeSet<GroupId>,
        stage_names: &str,
    ) -> Result<(), ServerError> {
        let groups: Vec<String> = sweeps.iter().map(ToString::to_string).collect();
        let reason = format!(
            "waiting for sweep stage {stage_names} ({}) to end",
            groups.join(", ")
        );
        let changes: Vec<TaskChange> = tasks
            .iter()
            .map(|task| TaskChange::Reason {
                task: *task,
                reason: Some(reason.clone()),
            })
            .collect();
        self.commit(&changes).await?;
        for task in tasks {
            inner.after_sweeps.insert(*task, sweeps.clone());
        }
        Ok(())
    }

    /// A sweep has ended (or was cancelled): the stage tasks waiting only for it go to the
    /// scheduler, or end with `dependency_failed` when it has no best trial.
    pub(crate) async fn sweep_stage_ended(&self, group: GroupId) -> Result<(), ServerError> {
        let Some(stage) = self.store.stage_of(StageSource::Group(group)).await? else {
            return Ok(());
        };
        let end = self.sweep_end(group).await?;
        if end == SweepEnd::Open {
            return Ok(());
        }
        let mut inner = self.inner.lock().await;
        if let Some((reason, state)) = self.stage_failure(&stage).await? {
            return self.end_dependents(&mut inner, &stage, reason, state).await;
        }
        let mut released = Vec::new();
        for (task, sweeps) in inner.after_sweeps.iter_mut() {
            if sweeps.remove(&group) && sweeps.is_empty() {
                released.push(*task);
            }
        }
        let mut submitted = Vec::new();
        for task in released {
            inner.after_sweeps.remove(&task);
            let Some(record) = self.facts.task_record(task).await? else {
                continue;
            };
            if record.state != TaskState::Queued {
                continue;
            }
            let Some(spec) = inner.specs.get(&task).cloned() else {
                continue;
            };
            if let Some(needed) = self.restore_dependencies(&record).await? {
                inner.stage_deps.insert(task, needed);
            }
            let owner_group = inner.group_for(&self.config, &record.user);
            submitted.push((
                task,
                request_of(&spec, &record, record.submitted_at, owner_group),
            ));
        }
        if submitted.is_empty() {
            return Ok(());
        }
        let cleared: Vec<TaskChange> = submitted
            .iter()
            .map(|(task, _)| TaskChange::Reason {
                task: *task,
                reason: None,
            })
            .collect();
        self.commit(&cleared).await?;
        self.queue_new(&mut inner, submitted).await
    }

    /// Why the stages after `stage` cannot run, and the state they end in, once `stage`
    /// has ended without succeeding: its first task that failed, was cancelled or was
    /// lost; a sweep without a best trial, or cancelled.
    pub(crate) async fn stage_failure(
        &self,
        stage: &StageRecord,
    ) -> Result<Option<(String, TaskState)>, ServerError> {
        if stage.cached {
            return Ok(None);
        }
        if let StageKind::Sweep(group) = self.stage_kind(stage).await? {
            let name = &stage.name;
            return Ok(match self.sweep_end(group).await? {
                SweepEnd::Best(_) | SweepEnd::Open => None,
                SweepEnd::NoTrialSucceeded => Some((
                    format!("dependency_failed: {name} (group {group}: no trial succeeded)"),
                    TaskState::Failed,
                )),
                SweepEnd::Cancelled => Some((
                    format!("dependency_failed: {name} (group {group} was cancelled)"),
                    TaskState::Cancelled,
                )),
            });
        }
        let failed = [TaskState::Failed, TaskState::Lost, TaskState::Cancelled];
        Ok(self
            .source_tasks(stage.source)
            .await?
            .into_iter()
            .find(|t| failed.contains(&t.state))
            .map(|t| {
                let state = if t.state == TaskState::Cancelled {
                    TaskState::Cancelled
                } else {
                    TaskState::Failed
                };
                (
                    format!("dependency_failed: {} (task {})", stage.name, t.id),
                    state,
                )
            }))
    }

    /// After a restart: the stages a queued stage task needs that had already failed
    /// when the server stopped, before it could end their dependents.
    pub(super) async fn failed_needs(
        &self,
        record: &TaskRecord,
    ) -> Result<Vec<(StageRecord, String, TaskState)>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(Vec::new());
        };
        let mut failed = Vec::new();
        for needed in self
            .store
            .pipeline_stages(stage.pipeline)
            .await?
            .into_iter()
            .filter(|s| stage.needs.contains(&s.name))
        {
            if let Some((reason, state)) = self.stage_failure(&needed).await? {
                failed.push((needed, reason, state));
            }
        }
        Ok(failed)
    }

    /// The unfinished sweeps (of earlier stages) a queued stage task waits for, each
    /// opened again so the controller launches and stops its trials.
    pub(super) async fn sweeps_awaited_by(
        &self,
        record: &TaskRecord,
    ) -> Result<std::collections::BTreeSet<GroupId>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(Default::default());
        };
        let stages = self.store.pipeline_stages(stage.pipeline).await?;
        let awaited = self.sweeps_awaited(&stage, &stages).await?;
        for group in &awaited {
            self.sweeps.add(*group);
        }
        Ok(awaited)
    }
}
