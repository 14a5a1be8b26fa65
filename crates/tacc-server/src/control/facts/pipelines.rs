//! Pipelines' stages: the tasks a stage ran as, where a stage and a pipeline stand, which
//! tasks a stage waits for, what it receives of the stages it needs, an earlier run a
//! stage may reuse, and which stages end when one fails.

use std::collections::BTreeMap;

use tacc_core::{GroupId, TaskId, TaskState};
use tacc_proto::{InputFile, StageView};
use tacc_store::{StageRecord, StageSource, TaskChange, TaskRecord};

use super::Facts;
use crate::ServerError;
use crate::control::handlers::accepted::AwaitingSweeps;
use crate::control::handlers::dependents::stages_ending_with;
use crate::control::rules::pipelines::{self, StageEnd, StageKind};
use crate::control::rules::sweeps::{SweepEnd, launched_all};

impl Facts {
    /// The stages of a pipeline, in order.
    pub(crate) async fn pipeline_stages(
        &self,
        pipeline: GroupId,
    ) -> Result<Vec<StageRecord>, ServerError> {
        Ok(self.store.pipeline_stages(pipeline).await?)
    }

    /// The stage a group ran as, if it is one.
    pub(crate) async fn stage_of_group(
        &self,
        group: GroupId,
    ) -> Result<Option<StageRecord>, ServerError> {
        Ok(self.group_shape(group).await?.and_then(|shape| shape.stage))
    }

    /// The tasks a stage ran as: its task, or every element of its array.
    pub(crate) async fn source_tasks(
        &self,
        source: StageSource,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        Ok(match source {
            StageSource::Task(task) => self.store.get_task(task).await?.into_iter().collect(),
            StageSource::Group(group) => self.group_elements(group).await?,
        })
    }

    /// The tasks whose outputs a dependent of this stage receives: a task stage's task,
    /// an array stage's every element, a sweep stage's best trial.
    pub(crate) async fn representative_tasks(
        &self,
        stage: &StageRecord,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        if let StageKind::Sweep(group) = self.stage_kind(stage).await? {
            return Ok(match self.sweep_end(group).await? {
                SweepEnd::Best(best) => self.store.get_task(best).await?.into_iter().collect(),
                _ => Vec::new(),
            });
        }
        self.source_tasks(stage.source).await
    }

    /// Where a stage's run stands: `Succeeded` only when every task did (a sweep: when
    /// it ended with a best trial); a failure state once any task ended without
    /// succeeding (a sweep: once it ended without a best trial); otherwise the least
    /// advanced open state. `None` when it has no task.
    pub(crate) async fn stage_state(
        &self,
        stage: &StageRecord,
    ) -> Result<Option<TaskState>, ServerError> {
        let tasks = self.source_tasks(stage.source).await?;
        if let StageKind::Sweep(group) = self.stage_kind(stage).await? {
            let states: Vec<TaskState> = tasks.iter().map(|t| t.state).collect();
            let end = self.sweep_end(group).await?;
            return Ok(Some(pipelines::sweep_stage_state(end, &states)));
        }
        Ok(pipelines::combined_state(tasks.iter().map(|t| t.state)))
    }

    /// An earlier run of this user's pipeline stage with the same key whose run
    /// succeeded, if any.
    pub(crate) async fn cached_run(
        &self,
        user: &str,
        pipeline: &str,
        stage: &str,
        key: &str,
    ) -> Result<Option<StageRecord>, ServerError> {
        for candidate in self
            .store
            .stages_with_key(user, pipeline, stage, key)
            .await?
        {
            if self.stage_state(&candidate).await? == Some(TaskState::Succeeded) {
                return Ok(Some(candidate));
            }
        }
        Ok(None)
    }

    /// For every task of the new stages, the tasks of the stages it needs that still run.
    pub(crate) async fn stage_dependencies(
        &self,
        stages: &[StageRecord],
    ) -> Result<BTreeMap<TaskId, Vec<TaskId>>, ServerError> {
        let mut tasks_of: BTreeMap<&str, Vec<TaskRecord>> = BTreeMap::new();
        for stage in stages {
            tasks_of.insert(stage.name.as_str(), self.source_tasks(stage.source).await?);
        }
        Ok(pipelines::stage_dependencies(stages, &tasks_of))
    }

    /// The tasks of each of the new `stages` that waits outside the scheduler for an
    /// unfinished sweep of the stages it needs, with those sweeps and the names of their
    /// stages.
    pub(crate) async fn stages_awaiting_sweeps(
        &self,
        stages: &[StageRecord],
    ) -> Result<Vec<AwaitingSweeps>, ServerError> {
        let mut waiting = Vec::new();
        for stage in stages {
            let awaited = self.sweeps_awaited(stage, stages).await?;
            if awaited.is_empty() {
                continue;
            }
            let names: Vec<String> = stages
                .iter()
                .filter(|s| matches!(s.source, StageSource::Group(g) if awaited.contains(&g)))
                .map(|s| format!("`{}`", s.name))
                .collect();
            let tasks = self
                .source_tasks(stage.source)
                .await?
                .iter()
                .map(|t| t.id)
                .collect();
            waiting.push(AwaitingSweeps {
                tasks,
                sweeps: awaited,
                stage_names: names.join(", "),
            });
        }
        Ok(waiting)
    }

    /// The stage a task ran as: its own, or its array's.
    pub(crate) async fn stage_of_task(
        &self,
        record: &TaskRecord,
    ) -> Result<Option<StageRecord>, ServerError> {
        // A stage's task is an element of its pipeline (a single-task stage) or of the
        // stage's array or sweep: a task of no group is no stage.
        let Some(group) = record.group else {
            return Ok(None);
        };
        let Some(shape) = self.group_shape(group).await? else {
            return Ok(None);
        };
        if shape.kind == tacc_store::GroupKind::Pipeline {
            return Ok(self.store.stage_of(StageSource::Task(record.id)).await?);
        }
        Ok(shape.stage)
    }

    /// When `record` ended as `state` for good without succeeding and was a task or array
    /// stage's task, that stage with the reason and state its dependents end with. A
    /// trial that fails or is stopped early is part of the search: the sweep's end
    /// decides (see `control/sweeps.rs`).
    pub(crate) async fn dependency_failure(
        &self,
        record: &TaskRecord,
        state: TaskState,
    ) -> Result<Option<(StageRecord, String, TaskState)>, ServerError> {
        if state == TaskState::Succeeded || !state.is_terminal() {
            return Ok(None);
        }
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(None);
        };
        if matches!(self.stage_kind(&stage).await?, StageKind::Sweep(_)) {
            return Ok(None);
        }
        Ok(pipelines::dependency_failure(&stage.name, record.id, state)
            .map(|(reason, end_state)| (stage, reason, end_state)))
    }

    /// The tasks of the stages that need `stage` directly or through others (as the
    /// store holds them), which end with it.
    pub(crate) async fn dependent_tasks(
        &self,
        stage: &StageRecord,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        let stages = self.pipeline_stages(stage.pipeline).await?;
        let mut tasks = Vec::new();
        for s in stages_ending_with(&stages, stage) {
            tasks.extend(self.source_tasks(s.source).await?);
        }
        Ok(tasks)
    }

    /// The needs of a queued stage task found again after a restart.
    pub(crate) async fn restore_dependencies(
        &self,
        record: &TaskRecord,
    ) -> Result<Option<Vec<TaskId>>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(None);
        };
        let stages = self.pipeline_stages(stage.pipeline).await?;
        let mut needed = Vec::new();
        for s in stages.iter().filter(|s| stage.needs.contains(&s.name)) {
            needed.extend(
                self.source_tasks(s.source)
                    .await?
                    .iter()
                    .filter(|t| !t.state.is_terminal())
                    .map(|t| t.id),
            );
        }
        Ok((!needed.is_empty()).then_some(needed))
    }

    /// After a restart: the stages a queued stage task needs that had already failed
    /// when the server stopped, before it could end their dependents.
    pub(crate) async fn failed_needs(
        &self,
        record: &TaskRecord,
    ) -> Result<Vec<(StageRecord, String, TaskState)>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(Vec::new());
        };
        let mut failed = Vec::new();
        for needed in self
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

    /// The files of the stages `record`'s stage needs, as its attempt receives them under
    /// `inputs/<stage>/`: a task stage's kept files of its last attempt, an array stage's
    /// under `<index>/`.
    pub(crate) async fn stage_inputs(
        &self,
        record: &TaskRecord,
    ) -> Result<Vec<InputFile>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(Vec::new());
        };
        if stage.needs.is_empty() {
            return Ok(Vec::new());
        }
        let stages = self.pipeline_stages(stage.pipeline).await?;
        let mut files = Vec::new();
        for needed in stages.iter().filter(|s| stage.needs.contains(&s.name)) {
            let array = self.stage_kind(needed).await? == StageKind::Array;
            for task in self.representative_tasks(needed).await? {
                let outputs = self.store.list_outputs(task.id).await?;
                files.extend(pipelines::input_files(&needed.name, array, &task, outputs));
            }
        }
        Ok(files)
    }

    /// Each stage's end state once `changes` are committed, when that ends the pipeline
    /// (every stage has ended; a sweep stage only once every trial was launched, or it
    /// was cancelled); `None` while something still runs or waits.
    pub(crate) async fn pipeline_end(
        &self,
        pipeline: GroupId,
        changes: &[TaskChange],
    ) -> Result<Option<BTreeMap<String, String>>, ServerError> {
        let mut settled: BTreeMap<TaskId, (TaskState, Option<String>)> = BTreeMap::new();
        for change in changes {
            if let TaskChange::Transition(t) = change {
                settled.insert(t.task, (t.to, t.reason.clone()));
            }
        }
        let mut states = BTreeMap::new();
        for stage in self.pipeline_stages(pipeline).await? {
            if stage.cached {
                states.insert(stage.name, "cached".to_string());
                continue;
            }
            let tasks: Vec<(TaskState, Option<String>)> = self
                .source_tasks(stage.source)
                .await?
                .into_iter()
                .map(|t| settled.get(&t.id).cloned().unwrap_or((t.state, t.reason)))
                .collect();
            // Whether every trial was launched is read only once every task has ended.
            let sweep_launched_all = match tasks.iter().all(|(s, _)| s.is_terminal()) {
                true => match self.stage_kind(&stage).await? {
                    StageKind::Sweep(group) => Some(match self.group(group).await? {
                        Some(record) => launched_all(&record),
                        None => true,
                    }),
                    _ => None,
                },
                false => None,
            };
            match pipelines::stage_end(&tasks, sweep_launched_all) {
                StageEnd::Open => return Ok(None),
                StageEnd::Empty => continue,
                StageEnd::Ended(state) => {
                    states.insert(stage.name, state.to_string());
                }
            }
        }
        Ok(Some(states))
    }

    /// Every stage of a pipeline as `tcloud ps` shows it.
    pub(crate) async fn stage_views(
        &self,
        pipeline: GroupId,
    ) -> Result<Vec<StageView>, ServerError> {
        let mut views = Vec::new();
        for stage in self.pipeline_stages(pipeline).await? {
            let tasks = self.source_tasks(stage.source).await?;
            let (task, group) = match stage.source {
                StageSource::Task(task) => (Some(task), None),
                StageSource::Group(group) => (None, Some(group)),
            };
            let sweep = matches!(self.stage_kind(&stage).await?, StageKind::Sweep(_));
            let (state, reason, counts) = if stage.cached {
                (
                    "cached".to_string(),
                    Some(format!("cached: {}", stage.source)),
                    BTreeMap::new(),
                )
            } else {
                let state = self
                    .stage_state(&stage)
                    .await?
                    .map_or_else(|| "empty".to_string(), |s| s.to_string());
                let reason = match self.stage_kind(&stage).await? {
                    StageKind::Sweep(group) => match self.sweep_end(group).await? {
                        SweepEnd::Best(best) => Some(format!("best trial: task {best}")),
                        SweepEnd::NoTrialSucceeded => Some("no trial succeeded".into()),
                        _ => None,
                    },
                    _ => tasks.iter().find_map(|t| t.reason.clone()),
                };
                let mut counts = BTreeMap::new();
                if group.is_some() {
                    for t in &tasks {
                        *counts.entry(t.state).or_insert(0u64) += 1;
                    }
                }
                (state, reason, counts)
            };
            views.push(StageView {
                name: stage.name,
                needs: stage.needs,
                state,
                task,
                group,
                sweep,
                counts,
                reason,
            });
        }
        Ok(views)
    }
}
