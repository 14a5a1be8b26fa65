//! Pipelines, a workflow of their own beside the control plane: a `pipeline` group with
//! one task (or array or sweep group) per stage, all durable in one transaction with the
//! stages' needs and cache keys. A stage waits in the scheduler (`depends_on`) for every
//! task of the stages it needs; when one of those ends without succeeding, its queued
//! dependents end at once with `dependency_failed: <stage> (task N)` and never run
//! (`Control::stop_dependents`). A stage whose code snapshot, normalised spec and inputs
//! are those of an earlier succeeded run of the same user's pipeline and stage is not
//! run: it is `cached` and reuses that run's outputs. The decisions are in
//! `rules/pipelines.rs`, the reads of stages in `facts/pipelines.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tacc_core::{SnapshotId, TaskId};
use tacc_schema::{NotifySpec, PipelineSpec, StageSpec, TaskSpec};
use tacc_store::{GroupKind, GroupRecord, NewGroup, NewStage, StageRecord};

use super::handlers::accepted::Accepted;
use super::rules::pipelines::{StageKind, StagePlan, Submitted, cache_key, stage_run};
use super::workflow_parts::WorkflowParts;
use super::{Control, SubmitOptions};
use crate::ServerError;

/// One submitted stage: its task spec and the code snapshot it runs.
#[derive(Debug, Clone)]
pub struct StageSubmission {
    pub name: String,
    pub needs: Vec<String>,
    pub spec: TaskSpec,
    pub snapshot: SnapshotId,
}

/// Submits pipelines.
#[derive(Debug, Clone)]
pub(crate) struct Pipelines {
    parts: WorkflowParts,
}

impl Pipelines {
    /// The pipelines of `control`'s cluster.
    pub(crate) fn of(control: &Arc<Control>) -> Pipelines {
        Pipelines {
            parts: WorkflowParts::of(control),
        }
    }

    /// Accept a pipeline: validate every stage and the graph, decide which stages are
    /// cached, write the pipeline group, every stage's task or array and the stage rows
    /// in one transaction, then hand the new tasks to the scheduler in one batch.
    pub(crate) async fn submit(
        &self,
        user: &str,
        name: String,
        stages: Vec<StageSubmission>,
        options: SubmitOptions,
        notify: Option<NotifySpec>,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<(GroupRecord, Vec<StageRecord>), ServerError> {
        // A pipeline file is never a translated legacy one.
        let SubmitOptions {
            source,
            wait_for_capacity,
            translated: _,
        } = options;
        if let Some(notify) = &notify {
            self.parts
                .control
                .check_secrets(user, std::iter::once(&notify.secret))
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
            self.parts.control.check_webhook(&notify.webhook)?;
        }
        // Every stage is checked (and refused) as a task of its own would be.
        let mut prepared = Vec::with_capacity(stages.len());
        let mut submissions = Vec::with_capacity(stages.len());
        for stage in &stages {
            let (spec, submission) = self
                .parts
                .control
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
            let cached = self
                .parts
                .facts
                .cached_run(user, &name, &stage.name, &key)
                .await?;
            keys.insert(stage.name.as_str(), key.clone());
            plans.insert(index, (key, StagePlan::of(spec, cached)));
        }
        let at = self.parts.clock.now();
        let mut new_stages = Vec::with_capacity(stages.len());
        let mut element_specs: Vec<TaskSpec> = Vec::new();
        for (index, (key, plan)) in plans {
            let stage = &stages[index];
            let submitted = Submitted {
                user,
                snapshot: &stage.snapshot,
                source: &source,
                at,
                submission: &submissions[index],
            };
            let run = stage_run(&stage.name, plan, &submitted, &mut element_specs)?;
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
                self.parts
                    .store
                    .create_pipeline_keyed(new_group, new_stages, keyed)
                    .await?
            }
            None => {
                self.parts
                    .store
                    .create_pipeline(new_group, new_stages)
                    .await?
            }
        };
        self.parts
            .metrics
            .committed("create_pipeline", committing.elapsed());
        // Tasks come back in stage order, each stage's elements together; the specs were
        // collected in the same order.
        let specs: BTreeMap<TaskId, TaskSpec> =
            tasks.iter().map(|t| t.id).zip(element_specs).collect();
        let depends = self.parts.facts.stage_dependencies(&records).await?;
        for stage in &records {
            if let StageKind::Sweep(group) = self.parts.facts.stage_kind(stage).await?
                && !stage.cached
            {
                self.parts.sweeps.add(group);
            }
        }
        // Stages after an unfinished sweep wait outside the scheduler until it ends.
        let awaiting = self.parts.facts.stages_awaiting_sweeps(&records).await?;
        for _ in &tasks {
            self.parts.metrics.submitted();
        }
        let accepted = Accepted {
            tasks: tasks
                .into_iter()
                .map(|record| {
                    let spec = specs[&record.id].clone();
                    (record, spec)
                })
                .collect(),
            depends,
            awaiting,
        };
        self.parts.control.accept(user, accepted).await?;
        Ok((group, records))
    }
}
