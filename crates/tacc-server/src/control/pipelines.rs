//! Pipelines in the control plane: a `pipeline` group with one task (or array group) per
//! stage, all durable in one transaction with the stages' needs and cache keys. A stage
//! waits in the scheduler (`depends_on`) for every task of the stages it needs; when one
//! of those ends without succeeding, its queued dependents end at once with
//! `dependency_failed: <stage> (task N)` and never run. A stage whose code snapshot,
//! normalised spec and inputs are those of an earlier succeeded run of the same user's
//! pipeline and stage is not run: it is `cached` and reuses that run's outputs.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use tacc_core::{GroupId, SnapshotId, TaskId, TaskState};
use tacc_proto::{InputFile, StageView};
use tacc_schema::{NotifySpec, PipelineSpec, StageSpec, TaskSpec};
use tacc_store::{
    GroupKind, GroupRecord, NewGroup, NewStage, NewStageRun, NewTask, StageRecord, StageSource,
    TaskChange, TaskRecord,
};

use super::effects::Effects;
use super::sweep_stages::{StageKind, SweepEnd};
use super::sweeps::trial_spec;
use super::{Control, Core, handlers, request_of};
use crate::ServerError;

/// One submitted stage: its task spec and the code snapshot it runs.
#[derive(Debug, Clone)]
pub struct StageSubmission {
    pub name: String,
    pub needs: Vec<String>,
    pub spec: TaskSpec,
    pub snapshot: SnapshotId,
}

/// What every task of one stage is submitted with.
struct Submitted<'a> {
    source: &'a Option<String>,
    at: tacc_core::Timestamp,
    submission: &'a serde_json::Value,
}

/// How a stage is made, decided before anything is written.
enum StagePlan {
    Single(TaskSpec),
    Array(TaskSpec),
    /// A sweep group with its first `parallel` trials; the sweep controller launches
    /// the rest.
    Sweep(TaskSpec),
    Cached(StageRecord),
}

impl Control {
    /// Accept a pipeline: validate every stage and the graph, decide which stages are
    /// cached, write the pipeline group, every stage's task or array and the stage rows
    /// in one transaction, then hand the new tasks to the scheduler in one batch.
    pub async fn submit_pipeline(
        &self,
        user: &str,
        name: String,
        stages: Vec<StageSubmission>,
        options: super::SubmitOptions,
        notify: Option<NotifySpec>,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<(GroupRecord, Vec<StageRecord>), ServerError> {
        // A pipeline file is never a translated legacy one.
        let super::SubmitOptions {
            source,
            wait_for_capacity,
            translated: _,
        } = options;
        if let Some(notify) = &notify {
            self.check_secrets(user, std::iter::once(&notify.secret))
                .await?;
        }
        let pipeline = PipelineSpec {
            notify: notify.clone(),
            name: name.clone(),
            stages: stages
                .iter()
                .map(|s| StageSpec {
                    name: s.name.clone(),
                    needs: s.needs.clone(),
                    task: s.spec.clone(),
                })
                .collect(),
        };
        pipeline
            .validate()
            .map_err(|e| ServerError::InvalidTask(e.to_string()))?;
        if let Some(notify) = &pipeline.notify {
            self.check_webhook(&notify.webhook)?;
        }
        // Every stage is checked (and refused) as a task of its own would be.
        let mut prepared = Vec::with_capacity(stages.len());
        let mut submissions = Vec::with_capacity(stages.len());
        for stage in &stages {
            let (spec, submission) = self
                .prepare(user, stage.spec.clone(), &stage.snapshot, wait_for_capacity)
                .await?;
            prepared.push(spec);
            submissions.push(submission.to_json());
        }
        // Keys in dependency order: a stage's inputs are identified by the keys of the
        // stages it needs, which stand for their code, spec and inputs in turn.
        let mut keys: BTreeMap<&str, String> = BTreeMap::new();
        let mut plans: BTreeMap<usize, (String, StagePlan)> = BTreeMap::new();
        for index in pipeline.topological_order() {
            let stage = &stages[index];
            let spec = &prepared[index];
            let inputs: Vec<(&str, &str)> = stage
                .needs
                .iter()
                .map(|n| (n.as_str(), keys[n.as_str()].as_str()))
                .collect();
            let key = cache_key(&stage.snapshot, spec, &inputs)?;
            let plan = match self.cached_run(user, &name, &stage.name, &key).await? {
                Some(earlier) => StagePlan::Cached(earlier),
                None if spec.sweep.is_some() => StagePlan::Sweep(spec.clone()),
                None if spec.array.is_some() => StagePlan::Array(spec.clone()),
                None => StagePlan::Single(spec.clone()),
            };
            keys.insert(stage.name.as_str(), key.clone());
            plans.insert(index, (key, plan));
        }
        let at = self.clock.now();
        let mut new_stages = Vec::with_capacity(stages.len());
        let mut element_specs: Vec<TaskSpec> = Vec::new();
        for (index, (key, plan)) in plans {
            let stage = &stages[index];
            let submitted = Submitted {
                source: &source,
                at,
                submission: &submissions[index],
            };
            let run = self.stage_run(user, stage, plan, &submitted, &mut element_specs)?;
            new_stages.push(NewStage {
                name: stage.name.clone(),
                needs: stage.needs.clone(),
                cache_key: key,
                run,
            });
        }
        let group_spec = serde_json::to_value(
            stages
                .iter()
                .map(|s| serde_json::json!({"name": s.name, "needs": s.needs}))
                .collect::<Vec<_>>(),
        )
        .map_err(|e| ServerError::Internal(e.to_string()))?;
        let committing = std::time::Instant::now();
        let new_group = NewGroup {
            kind: GroupKind::Pipeline,
            name: name.clone(),
            user: user.to_string(),
            spec: serde_json::json!({"stages": group_spec, "notify": notify}),
            created_at: at,
        };
        let (group, records, tasks) = match keyed {
            Some(keyed) => {
                self.store
                    .create_pipeline_keyed(new_group, new_stages, keyed)
                    .await?
            }
            None => self.store.create_pipeline(new_group, new_stages).await?,
        };
        self.metrics
            .committed("create_pipeline", committing.elapsed());
        // Tasks come back in stage order, each stage's elements together; the specs were
        // collected in the same order.
        let specs: BTreeMap<TaskId, TaskSpec> =
            tasks.iter().map(|t| t.id).zip(element_specs).collect();
        let depends = self.stage_dependencies(&records).await?;
        // Stages after an unfinished sweep wait outside the scheduler until it ends.
        let mut waiting: Vec<(Vec<TaskId>, BTreeSet<GroupId>, String)> = Vec::new();
        for stage in &records {
            if let StageKind::Sweep(group) = self.stage_kind(stage).await?
                && !stage.cached
            {
                self.sweeps.add(group);
            }
        }
        for stage in &records {
            let awaited = self.sweeps_awaited(stage, &records).await?;
            if awaited.is_empty() {
                continue;
            }
            let names: Vec<String> = records
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
            waiting.push((tasks, awaited, names.join(", ")));
        }
        for _ in &tasks {
            self.metrics.submitted();
        }
        let identity_group = self.auth.group_of(user).await?;
        let mut inner = self.inner.lock().await;
        inner
            .identity_groups
            .insert(user.to_string(), identity_group);
        let owner_group = inner.group_for(&self.config, user);
        for (task, spec) in &specs {
            inner.specs.insert(*task, spec.clone());
        }
        inner.stage_deps.extend(depends);
        let mut kept: BTreeSet<TaskId> = BTreeSet::new();
        for (tasks, sweeps, names) in &waiting {
            self.wait_for_sweeps(&mut inner, tasks, sweeps, names)
                .await?;
            kept.extend(tasks.iter().copied());
        }
        let submitted = tasks
            .iter()
            .filter(|record| !kept.contains(&record.id))
            .map(|record| {
                let request = request_of(&specs[&record.id], record, at, owner_group.clone());
                (record.id, request)
            })
            .collect();
        self.queue_new(&mut inner, submitted).await?;
        Ok((group, records))
    }

    /// The new stage as the store makes it; `specs` gets the spec of each task it makes,
    /// in order.
    fn stage_run(
        &self,
        user: &str,
        stage: &StageSubmission,
        plan: StagePlan,
        submitted: &Submitted<'_>,
        specs: &mut Vec<TaskSpec>,
    ) -> Result<NewStageRun, ServerError> {
        let new_task = |spec: &TaskSpec| -> Result<NewTask, ServerError> {
            Ok(NewTask {
                name: spec.name.clone(),
                user: user.to_string(),
                spec: serde_json::to_value(spec)
                    .map_err(|e| ServerError::Internal(e.to_string()))?,
                snapshot: stage.snapshot.clone(),
                source: submitted.source.clone(),
                submitted_at: submitted.at,
                submission: submitted.submission.clone(),
            })
        };
        Ok(match plan {
            StagePlan::Single(spec) => {
                // A stage notifies nothing itself; the pipeline is the unit users watch.
                let spec = TaskSpec {
                    notify: None,
                    ..spec
                };
                let task = new_task(&spec)?;
                specs.push(spec);
                NewStageRun::Task(task)
            }
            StagePlan::Array(spec) => {
                let array = spec.array.clone().ok_or_else(|| {
                    ServerError::Internal(format!("stage `{}` lost its array", stage.name))
                })?;
                let group_spec = serde_json::to_value(&spec)
                    .map_err(|e| ServerError::Internal(e.to_string()))?;
                let element = TaskSpec {
                    array: None,
                    notify: None,
                    ..spec
                };
                let task = new_task(&element)?;
                let elements: Vec<(u32, NewTask)> = array
                    .indices()
                    .iter()
                    .map(|index| (*index, task.clone()))
                    .collect();
                specs.extend(std::iter::repeat_n(element.clone(), elements.len()));
                NewStageRun::Array {
                    group: NewGroup {
                        kind: GroupKind::Array,
                        name: element.name.clone(),
                        user: user.to_string(),
                        spec: group_spec,
                        created_at: submitted.at,
                    },
                    elements,
                }
            }
            StagePlan::Sweep(spec) => {
                let sweep = spec.sweep.clone().ok_or_else(|| {
                    ServerError::Internal(format!("stage `{}` lost its sweep", stage.name))
                })?;
                // The sweep notifies nothing itself; the pipeline is the unit users watch.
                let spec = TaskSpec {
                    notify: None,
                    ..spec
                };
                let group_spec = serde_json::to_value(&spec)
                    .map_err(|e| ServerError::Internal(e.to_string()))?;
                let points = sweep.trials();
                let first = points.len().min(sweep.parallel as usize);
                let mut elements = Vec::with_capacity(first);
                for (index, point) in points[..first].iter().enumerate() {
                    let trial = trial_spec(&spec, point);
                    elements.push((index as u32, new_task(&trial)?));
                    specs.push(trial);
                }
                NewStageRun::Array {
                    group: NewGroup {
                        kind: GroupKind::Sweep,
                        name: spec.name.clone(),
                        user: user.to_string(),
                        spec: group_spec,
                        created_at: submitted.at,
                    },
                    elements,
                }
            }
            StagePlan::Cached(earlier) => NewStageRun::Cached(earlier.source),
        })
    }

    /// An earlier run of this user's pipeline stage with the same key whose run
    /// succeeded, if any.
    async fn cached_run(
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
    async fn stage_state(&self, stage: &StageRecord) -> Result<Option<TaskState>, ServerError> {
        let tasks = self.source_tasks(stage.source).await?;
        if let StageKind::Sweep(group) = self.stage_kind(stage).await? {
            return Ok(Some(match self.sweep_end(group).await? {
                SweepEnd::Best(_) => TaskState::Succeeded,
                SweepEnd::NoTrialSucceeded => TaskState::Failed,
                SweepEnd::Cancelled => TaskState::Cancelled,
                SweepEnd::Open => [TaskState::Running, TaskState::Starting]
                    .into_iter()
                    .find(|s| tasks.iter().any(|t| t.state == *s))
                    .unwrap_or(TaskState::Queued),
            }));
        }
        Ok(combined_state(tasks.iter().map(|t| t.state)))
    }

    /// For every task of the new stages, the tasks of the stages it needs that still run.
    async fn stage_dependencies(
        &self,
        stages: &[StageRecord],
    ) -> Result<BTreeMap<TaskId, Vec<TaskId>>, ServerError> {
        let mut tasks_of: BTreeMap<&str, Vec<TaskRecord>> = BTreeMap::new();
        for stage in stages {
            tasks_of.insert(stage.name.as_str(), self.source_tasks(stage.source).await?);
        }
        let mut depends = BTreeMap::new();
        for stage in stages.iter().filter(|s| !s.cached) {
            let needed: Vec<TaskId> = stage
                .needs
                .iter()
                .flat_map(|n| tasks_of[n.as_str()].iter())
                .filter(|t| !t.state.is_terminal())
                .map(|t| t.id)
                .collect();
            if needed.is_empty() {
                continue;
            }
            for task in &tasks_of[stage.name.as_str()] {
                depends.insert(task.id, needed.clone());
            }
        }
        Ok(depends)
    }

    /// The stage a task ran as: its own, or its array's.
    pub(crate) async fn stage_of_task(
        &self,
        record: &TaskRecord,
    ) -> Result<Option<StageRecord>, ServerError> {
        if let Some(stage) = self.store.stage_of(StageSource::Task(record.id)).await? {
            return Ok(Some(stage));
        }
        match record.group {
            Some(group) => Ok(self.store.stage_of(StageSource::Group(group)).await?),
            None => Ok(None),
        }
    }

    /// After `record` ended as `state` for good: when it was a pipeline stage's task and
    /// did not succeed, every queued task of the stages that need it (directly or
    /// through others) ends now, failed (or cancelled, when it was cancelled), with
    /// `dependency_failed: <stage> (task N)`, before the scheduler could start them.
    pub(super) async fn stop_dependents(
        &self,
        inner: &mut Core,
        record: &TaskRecord,
        state: TaskState,
    ) -> Result<(), ServerError> {
        if state == TaskState::Succeeded || !state.is_terminal() {
            return Ok(());
        }
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(());
        };
        // A trial that fails or is stopped early is part of the search: the sweep's end
        // decides (see `sweep_stages.rs`).
        if matches!(self.stage_kind(&stage).await?, StageKind::Sweep(_)) {
            return Ok(());
        }
        let end_state = if state == TaskState::Cancelled {
            TaskState::Cancelled
        } else {
            TaskState::Failed
        };
        let reason = format!("dependency_failed: {} (task {})", stage.name, record.id);
        self.end_dependents(inner, &stage, reason, end_state).await
    }

    /// End, as `end_state` with `reason`, every queued task of the stages that need
    /// `stage` directly or through others.
    pub(super) async fn end_dependents(
        &self,
        inner: &mut Core,
        stage: &StageRecord,
        reason: String,
        end_state: TaskState,
    ) -> Result<(), ServerError> {
        let stages = self.store.pipeline_stages(stage.pipeline).await?;
        let mut tasks = Vec::new();
        for s in handlers::dependents::stages_ending_with(&stages, stage) {
            tasks.extend(self.source_tasks(s.source).await?);
        }
        let mut fx = Effects::default();
        handlers::dependents::on_dependents_ended(
            inner,
            &mut fx,
            tasks,
            &reason,
            end_state,
            self.clock.now(),
        );
        Box::pin(self.carry(inner, fx)).await
    }

    /// The needs of a queued stage task found again after a restart.
    pub(super) async fn restore_dependencies(
        &self,
        record: &TaskRecord,
    ) -> Result<Option<Vec<TaskId>>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(None);
        };
        let stages = self.store.pipeline_stages(stage.pipeline).await?;
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
        let stages = self.store.pipeline_stages(stage.pipeline).await?;
        let mut files = Vec::new();
        for needed in stages.iter().filter(|s| stage.needs.contains(&s.name)) {
            let array = self.stage_kind(needed).await? == StageKind::Array;
            for task in self.representative_tasks(needed).await? {
                for output in self.store.list_outputs(task.id).await? {
                    if output.attempt != task.attempt {
                        continue;
                    }
                    let mut name = if output.rank == 0 {
                        output.path.clone()
                    } else {
                        format!("rank-{}/{}", output.rank, output.path)
                    };
                    if array {
                        name = format!("{}/{name}", task.group_index.unwrap_or_default());
                    }
                    files.push(InputFile {
                        stage: needed.name.clone(),
                        name,
                        size: output.size,
                        task: task.id,
                        attempt: output.attempt,
                        rank: output.rank,
                        path: output.path,
                    });
                }
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
        for stage in self.store.pipeline_stages(pipeline).await? {
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
            if tasks.iter().any(|(state, _)| !state.is_terminal()) {
                return Ok(None);
            }
            let state = match self.stage_kind(&stage).await? {
                StageKind::Sweep(group) => {
                    let cancelled = tasks
                        .iter()
                        .any(|(_, reason)| reason.as_deref() == Some("cancelled by user"));
                    let launched_all = match self.store.get_group(group).await? {
                        Some(record) => Control::sweep_launched_all(&record),
                        None => true,
                    };
                    if cancelled {
                        TaskState::Cancelled
                    } else if !launched_all {
                        return Ok(None);
                    } else if tasks.iter().any(|(s, _)| *s == TaskState::Succeeded) {
                        TaskState::Succeeded
                    } else {
                        TaskState::Failed
                    }
                }
                _ => match combined_state(tasks.iter().map(|(s, _)| *s)) {
                    Some(state) => state,
                    None => continue,
                },
            };
            states.insert(stage.name, state.to_string());
        }
        Ok(Some(states))
    }

    /// Every stage of a pipeline as `tcloud ps` shows it.
    pub async fn stage_views(&self, pipeline: GroupId) -> Result<Vec<StageView>, ServerError> {
        let mut views = Vec::new();
        for stage in self.store.pipeline_stages(pipeline).await? {
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

    /// Cancel every unfinished stage of a pipeline: its single tasks (the pipeline
    /// group's own elements) and each array stage's group.
    pub(super) async fn cancel_pipeline_arrays(
        &self,
        pipeline: GroupId,
    ) -> Result<u64, ServerError> {
        let mut count = 0;
        for stage in self.store.pipeline_stages(pipeline).await? {
            if let (StageSource::Group(group), false) = (stage.source, stage.cached) {
                self.close_sweep(group);
                count += self.cancel_group_elements(group).await?;
            }
        }
        Ok(count)
    }
}

/// Where a set of tasks stands as one: any failure state first, then the least advanced
/// open state, `Succeeded` only when all did.
fn combined_state(states: impl Iterator<Item = TaskState>) -> Option<TaskState> {
    let states: Vec<TaskState> = states.collect();
    if states.is_empty() {
        return None;
    }
    let failed = [TaskState::Failed, TaskState::Lost, TaskState::Cancelled];
    if let Some(bad) = failed.into_iter().find(|f| states.contains(f)) {
        return Some(bad);
    }
    let open = [TaskState::Queued, TaskState::Starting, TaskState::Running];
    if let Some(first) = open.into_iter().find(|o| states.contains(o)) {
        return Some(first);
    }
    states
        .into_iter()
        .find(|s| *s != TaskState::Succeeded)
        .or(Some(TaskState::Succeeded))
}

/// A stage's cache key: its code snapshot, its normalised spec, and the keys of the
/// stages it needs (which identify the outputs it receives), hashed.
fn cache_key(
    snapshot: &SnapshotId,
    spec: &TaskSpec,
    inputs: &[(&str, &str)],
) -> Result<String, ServerError> {
    let spec = serde_json::to_string(spec).map_err(|e| ServerError::Internal(e.to_string()))?;
    let mut hasher = Sha256::new();
    hasher.update(b"tacc-stage-v1\0");
    hasher.update(snapshot.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(spec.as_bytes());
    let mut inputs = inputs.to_vec();
    inputs.sort();
    for (stage, key) in inputs {
        hasher.update(b"\0");
        hasher.update(stage.as_bytes());
        hasher.update(b"=");
        hasher.update(key.as_bytes());
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(run: &str) -> TaskSpec {
        tacc_schema::parse_task("task.yaml", &format!("name: s\nrun: {run}\n"))
            .unwrap()
            .0
    }

    #[test]
    fn the_cache_key_follows_code_spec_and_inputs_only() {
        let a = "a".repeat(64).parse::<SnapshotId>().unwrap();
        let b = "b".repeat(64).parse::<SnapshotId>().unwrap();
        let base = cache_key(&a, &spec("x"), &[("gen", "k1")]).unwrap();
        assert_eq!(base, cache_key(&a, &spec("x"), &[("gen", "k1")]).unwrap());
        assert_ne!(base, cache_key(&b, &spec("x"), &[("gen", "k1")]).unwrap());
        assert_ne!(base, cache_key(&a, &spec("y"), &[("gen", "k1")]).unwrap());
        assert_ne!(base, cache_key(&a, &spec("x"), &[("gen", "k2")]).unwrap());
        let two = cache_key(&a, &spec("x"), &[("gen", "k1"), ("prep", "k3")]).unwrap();
        assert_eq!(
            two,
            cache_key(&a, &spec("x"), &[("prep", "k3"), ("gen", "k1")]).unwrap()
        );
    }

    #[test]
    fn a_stage_succeeded_only_when_every_task_did() {
        use TaskState::*;
        assert_eq!(
            combined_state([Succeeded, Succeeded].into_iter()),
            Some(Succeeded)
        );
        assert_eq!(
            combined_state([Succeeded, Running, Queued].into_iter()),
            Some(Queued)
        );
        assert_eq!(
            combined_state([Succeeded, Failed, Running].into_iter()),
            Some(Failed)
        );
        assert_eq!(combined_state(std::iter::empty()), None);
    }
}
