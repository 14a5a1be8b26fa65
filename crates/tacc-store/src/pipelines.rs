//! Records of pipeline stages: what each stage of a `pipeline` group ran as (a task, an
//! array group) or reused (a cached earlier run), the stages it needs, and its cache key.

use tacc_core::{GroupId, TaskId};

use crate::{NewGroup, NewTask};

/// What a stage ran as, or, for a cached stage, the earlier run it reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StageSource {
    Task(TaskId),
    Group(GroupId),
}

impl StageSource {
    pub(crate) fn columns(self) -> (Option<i64>, Option<i64>) {
        match self {
            StageSource::Task(task) => (Some(task.0 as i64), None),
            StageSource::Group(group) => (None, Some(group.0 as i64)),
        }
    }
}

impl std::fmt::Display for StageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageSource::Task(task) => write!(f, "task {task}"),
            StageSource::Group(group) => write!(f, "group {group}"),
        }
    }
}

/// How a new stage is made.
#[derive(Debug, Clone, PartialEq)]
pub enum NewStageRun {
    /// One task: an element of the pipeline group, its index the stage's position.
    Task(NewTask),
    /// An array: a group of its own, its elements as `create_group` makes them.
    Array {
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    },
    /// Not run: the outputs of an earlier succeeded run of the same stage.
    Cached(StageSource),
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewStage {
    pub name: String,
    pub needs: Vec<String>,
    pub cache_key: String,
    pub run: NewStageRun,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRecord {
    pub pipeline: GroupId,
    pub position: u32,
    pub name: String,
    pub needs: Vec<String>,
    pub cache_key: String,
    pub source: StageSource,
    /// The stage reused `source`, an earlier run, instead of running.
    pub cached: bool,
    pub user: String,
    pub pipeline_name: String,
}
