//! Wire types of pipelines (`POST /v1/pipelines`): every stage's spec and code snapshot
//! in one request; a pipeline group's stages as `tcloud ps` shows them; and the files of
//! needed stages an agent fetches into `inputs/<stage>/`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, GroupId, SnapshotId, TaskId, TaskState};

/// One stage of a submitted pipeline.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitStage {
    pub name: String,
    #[serde(default)]
    pub needs: Vec<String>,
    /// The stage's normalised task spec (JSON form of the schema crate's `TaskSpec`).
    pub spec: serde_json::Value,
    pub snapshot: SnapshotId,
}

/// `POST /v1/pipelines`: the whole pipeline, stages in file order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitPipeline {
    pub name: String,
    pub stages: Vec<SubmitStage>,
    /// Where the pipeline file came from (informational).
    pub source: Option<String>,
    /// The pipeline's webhook, called once when every stage has ended (JSON form of the
    /// schema crate's `NotifySpec`: `{"webhook": …, "secret": …}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<serde_json::Value>,
    /// As [`crate::SubmitTask::wait_for_capacity`], for every stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_capacity: bool,
}

/// One stage as shown: what it ran as and where it is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageView {
    pub name: String,
    pub needs: Vec<String>,
    /// `queued`, `running`, `succeeded`, … (an array stage: the least advanced of its
    /// elements), or `cached` when an earlier run's outputs were reused.
    pub state: String,
    /// The task it ran as (or reused, when cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// The array or sweep group it ran as (or reused, when cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupId>,
    /// The group is a sweep (its trials), not an array.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sweep: bool,
    /// An array stage's elements per state.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<TaskState, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/pipelines` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineSubmitted {
    pub group: GroupId,
    pub stages: Vec<StageView>,
    /// What the platform changed of what each stage asked for, by stage name (as a
    /// single submit's reply says it); stages it changed nothing of are left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, Vec<crate::Override>>,
}

/// A file of a needed stage that an attempt gets under `inputs/<stage>/<name>`, or (stage
/// [`RESUME_STAGE`]) of the checkpoint a retried attempt resumes from; the agent
/// fetches it with `GET /v1/agents/{node}/inputs/{task}/{attempt}/{index}`, `index` its
/// place in [`crate::Assignment::inputs`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The stage that produced it, or [`RESUME_STAGE`] for a checkpoint file.
    pub stage: String,
    /// Relative to `inputs/<stage>/`.
    pub name: String,
    pub size: u64,
    /// Where it was kept: the producing task, attempt and rank.
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub rank: u32,
    pub path: String,
}

/// The `stage` of an input that is a file of the previous attempt's checkpoint directory:
/// the agent restores it into the attempt's own checkpoint directory (writable, and the
/// task's), not under `inputs/`. No stage can be named so (stage names have no `.`).
pub const RESUME_STAGE: &str = ".checkpoint";
