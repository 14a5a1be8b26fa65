//! The decisions about pipelines, over what the store holds of their stages: how each
//! stage of a submitted pipeline is made (cached, a task, an array, a sweep) and keyed,
//! which tasks a stage waits for, where a stage and a pipeline stand, why the stages
//! after a failed one cannot run, and what a stage receives of the stages it needs.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use tacc_core::{SnapshotId, TaskId, TaskState, Timestamp};
use tacc_proto::InputFile;
use tacc_schema::TaskSpec;
use tacc_store::{
    GroupKind, NewGroup, NewStageRun, NewTask, OutputRecord, StageRecord, TaskRecord,
};

use super::arrays::{ArraySubmitted, NewArray, new_array};
use super::sweeps::{SweepEnd, trial_spec};
use crate::ServerError;

/// What a stage ran as, which decides how its end and its outputs are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageKind {
    Task,
    Array,
    Sweep(tacc_core::GroupId),
}

/// How a stage is made, decided before anything is written.
#[derive(Debug)]
pub(crate) enum StagePlan {
    Single(TaskSpec),
    Array(TaskSpec),
    /// A sweep group with its first `parallel` trials; the sweep controller launches
    /// the rest.
    Sweep(TaskSpec),
    Cached(StageRecord),
}

impl StagePlan {
    /// A stage with an earlier succeeded run of the same key reuses it; otherwise its
    /// spec says what it runs as.
    pub(crate) fn of(spec: &TaskSpec, cached: Option<StageRecord>) -> StagePlan {
        match cached {
            Some(earlier) => StagePlan::Cached(earlier),
            None if spec.sweep.is_some() => StagePlan::Sweep(spec.clone()),
            None if spec.array.is_some() => StagePlan::Array(spec.clone()),
            None => StagePlan::Single(spec.clone()),
        }
    }
}

/// What every task of one stage is submitted with.
pub(crate) struct Submitted<'a> {
    pub(crate) user: &'a str,
    pub(crate) snapshot: &'a SnapshotId,
    pub(crate) source: &'a Option<String>,
    pub(crate) at: Timestamp,
    pub(crate) submission: &'a serde_json::Value,
}

/// The new stage `name` as the store makes it from `plan`; `specs` gets the spec of each
/// task it makes, in order.
pub(crate) fn stage_run(
    name: &str,
    plan: StagePlan,
    submitted: &Submitted<'_>,
    specs: &mut Vec<TaskSpec>,
) -> Result<NewStageRun, ServerError> {
    let new_task = |spec: &TaskSpec| -> Result<NewTask, ServerError> {
        Ok(NewTask {
            name: spec.name.clone(),
            user: submitted.user.to_string(),
            spec: serde_json::to_value(spec).map_err(|e| ServerError::Internal(e.to_string()))?,
            snapshot: submitted.snapshot.clone(),
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
            // An array stage is an array as `tcloud submit --array` makes it.
            let NewArray {
                group,
                elements,
                element,
            } = new_array(
                spec,
                &ArraySubmitted {
                    user: submitted.user,
                    snapshot: submitted.snapshot,
                    source: submitted.source,
                    at: submitted.at,
                    submission: submitted.submission,
                    rerun_of: None,
                },
            )?;
            specs.extend(std::iter::repeat_n(element, elements.len()));
            NewStageRun::Array { group, elements }
        }
        StagePlan::Sweep(spec) => {
            let sweep = spec
                .sweep
                .clone()
                .ok_or_else(|| ServerError::Internal(format!("stage `{name}` lost its sweep")))?;
            // The sweep notifies nothing itself; the pipeline is the unit users watch.
            let spec = TaskSpec {
                notify: None,
                ..spec
            };
            let group_spec =
                serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?;
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
                    user: submitted.user.to_string(),
                    spec: group_spec,
                    created_at: submitted.at,
                },
                elements,
            }
        }
        StagePlan::Cached(earlier) => NewStageRun::Cached(earlier.source),
    })
}

/// For every task of the new `stages`, the tasks of the stages it needs that still run;
/// `tasks_of` holds each stage's tasks by name.
pub(crate) fn stage_dependencies(
    stages: &[StageRecord],
    tasks_of: &BTreeMap<&str, Vec<TaskRecord>>,
) -> BTreeMap<TaskId, Vec<TaskId>> {
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
    depends
}

/// Where a set of tasks stands as one: any failure state first, then the least advanced
/// open state, `Succeeded` only when all did.
pub(crate) fn combined_state(states: impl Iterator<Item = TaskState>) -> Option<TaskState> {
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

/// Where a sweep stage's run stands: by how the sweep ended, or while it is open the
/// most advanced state of its trials (`states`).
pub(crate) fn sweep_stage_state(end: SweepEnd, states: &[TaskState]) -> TaskState {
    match end {
        SweepEnd::Best(_) => TaskState::Succeeded,
        SweepEnd::NoTrialSucceeded => TaskState::Failed,
        SweepEnd::Cancelled => TaskState::Cancelled,
        SweepEnd::Open => [TaskState::Running, TaskState::Starting]
            .into_iter()
            .find(|s| states.contains(s))
            .unwrap_or(TaskState::Queued),
    }
}

/// How one stage stands when its pipeline may be ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageEnd {
    /// A task of it still runs or waits (a sweep: a trial is left to launch).
    Open,
    Ended(TaskState),
    /// It has no task: it counts for nothing.
    Empty,
}

/// How a stage with `tasks` (state and reason each, as they will be) stands; a sweep
/// stage's with whether every trial was launched.
pub(crate) fn stage_end(
    tasks: &[(TaskState, Option<String>)],
    sweep_launched_all: Option<bool>,
) -> StageEnd {
    if tasks.iter().any(|(state, _)| !state.is_terminal()) {
        return StageEnd::Open;
    }
    match sweep_launched_all {
        Some(launched_all) => {
            let cancelled = tasks
                .iter()
                .any(|(_, reason)| reason.as_deref() == Some(crate::control::CANCELLED_BY_USER));
            if cancelled {
                StageEnd::Ended(TaskState::Cancelled)
            } else if !launched_all {
                StageEnd::Open
            } else if tasks.iter().any(|(s, _)| *s == TaskState::Succeeded) {
                StageEnd::Ended(TaskState::Succeeded)
            } else {
                StageEnd::Ended(TaskState::Failed)
            }
        }
        None => match combined_state(tasks.iter().map(|(s, _)| *s)) {
            Some(state) => StageEnd::Ended(state),
            None => StageEnd::Empty,
        },
    }
}

/// The state the dependents of a stage whose task ended as `state` end in: cancelled
/// with it, failed otherwise.
fn dependents_end(state: TaskState) -> TaskState {
    if state == TaskState::Cancelled {
        TaskState::Cancelled
    } else {
        TaskState::Failed
    }
}

/// When task `task` of stage `stage` (not a sweep's: its trials are the search) ended
/// for good as `state` without succeeding, the reason and state its dependents end with.
pub(crate) fn dependency_failure(
    stage: &str,
    task: TaskId,
    state: TaskState,
) -> Option<(String, TaskState)> {
    if state == TaskState::Succeeded || !state.is_terminal() {
        return None;
    }
    Some((
        format!("dependency_failed: {stage} (task {task})"),
        dependents_end(state),
    ))
}

/// Why the stages after task or array stage `stage` cannot run, from its `tasks`: its
/// first task that failed, was cancelled or was lost.
pub(crate) fn stage_failure(stage: &str, tasks: &[TaskRecord]) -> Option<(String, TaskState)> {
    let failed = [TaskState::Failed, TaskState::Lost, TaskState::Cancelled];
    tasks
        .iter()
        .find(|t| failed.contains(&t.state))
        .and_then(|t| dependency_failure(stage, t.id, t.state))
}

/// The files `task` of needed stage `stage` gives its dependents under
/// `inputs/<stage>/`: its kept files of its last attempt (other ranks' under
/// `rank-<r>/`), an array stage's under `<index>/`.
pub(crate) fn input_files(
    stage: &str,
    array: bool,
    task: &TaskRecord,
    outputs: Vec<OutputRecord>,
) -> Vec<InputFile> {
    outputs
        .into_iter()
        .filter(|output| output.attempt == task.attempt)
        .map(|output| {
            let mut name = if output.rank == 0 {
                output.path.clone()
            } else {
                format!("rank-{}/{}", output.rank, output.path)
            };
            if array {
                name = format!("{}/{name}", task.group_index.unwrap_or_default());
            }
            InputFile {
                stage: stage.to_string(),
                name,
                size: output.size,
                task: task.id,
                attempt: output.attempt,
                rank: output.rank,
                path: output.path,
            }
        })
        .collect()
}

/// A stage's cache key: its code snapshot, its normalised spec, and the keys of the
/// stages it needs (which identify the outputs it receives), hashed.
pub(crate) fn cache_key(
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
    use crate::control::rules::test_record;
    use TaskState::*;

    fn spec(run: &str) -> TaskSpec {
        tacc_schema::parse_task("task.yaml", &format!("name: s\nrun: {run}\n"))
            .unwrap()
            .0
    }

    fn stage(name: &str, needs: &[&str], cached: bool) -> StageRecord {
        StageRecord {
            pipeline: tacc_core::GroupId(1),
            position: 0,
            name: name.into(),
            needs: needs.iter().map(|n| n.to_string()).collect(),
            cache_key: String::new(),
            source: tacc_store::StageSource::Task(TaskId(0)),
            cached,
            user: "ann".into(),
            pipeline_name: "p".into(),
        }
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

    #[test]
    fn which_stages_end_a_pipeline_and_how() {
        let user = Some(crate::control::CANCELLED_BY_USER.to_string());
        // (each task's state and reason, a sweep's `launched all`, how the stage stands)
        type Case<'a> = (&'a [(TaskState, Option<String>)], Option<bool>, StageEnd);
        let table: &[Case] = &[
            (&[(Running, None)], None, StageEnd::Open),
            (&[], None, StageEnd::Empty),
            (
                &[(Succeeded, None), (Failed, None)],
                None,
                StageEnd::Ended(Failed),
            ),
            (&[(Succeeded, None)], None, StageEnd::Ended(Succeeded)),
            // A sweep: open until every trial was launched, unless cancelled.
            (&[(Succeeded, None)], Some(false), StageEnd::Open),
            (
                &[(Cancelled, user.clone())],
                Some(false),
                StageEnd::Ended(Cancelled),
            ),
            (
                &[(Failed, None), (Succeeded, None)],
                Some(true),
                StageEnd::Ended(Succeeded),
            ),
            (&[(Failed, None)], Some(true), StageEnd::Ended(Failed)),
            (&[(Queued, None)], Some(true), StageEnd::Open),
        ];
        for (tasks, sweep, end) in table {
            assert_eq!(stage_end(tasks, *sweep), *end, "{tasks:?} {sweep:?}");
        }
    }

    #[test]
    fn a_failed_or_cancelled_stage_task_ends_its_dependents_and_a_success_does_not() {
        let table = [
            (Succeeded, None),
            (Running, None),
            (Failed, Some(Failed)),
            (Lost, Some(Failed)),
            (Cancelled, Some(Cancelled)),
        ];
        for (state, end) in table {
            let failure = dependency_failure("gen", TaskId(4), state);
            assert_eq!(failure.as_ref().map(|f| f.1), end, "{state:?}");
            if let Some((reason, _)) = failure {
                assert_eq!(reason, "dependency_failed: gen (task 4)");
            }
        }
        let tasks = [
            test_record(1, Succeeded, 1, &[]),
            test_record(2, Lost, 1, &[]),
        ];
        assert_eq!(
            stage_failure("gen", &tasks),
            Some(("dependency_failed: gen (task 2)".into(), Failed))
        );
        assert_eq!(stage_failure("gen", &tasks[..1]), None);
    }

    #[test]
    fn a_stage_waits_for_the_unfinished_tasks_of_the_stages_it_needs() {
        let stages = [
            stage("a", &[], false),
            stage("b", &[], false),
            stage("c", &["a", "b"], false),
            stage("d", &["a"], true),
        ];
        let tasks_of: BTreeMap<&str, Vec<TaskRecord>> = [
            ("a", vec![test_record(1, Running, 1, &[])]),
            ("b", vec![test_record(2, Succeeded, 1, &[])]),
            (
                "c",
                vec![
                    test_record(3, Queued, 1, &[]),
                    test_record(4, Queued, 1, &[]),
                ],
            ),
            ("d", vec![test_record(5, Succeeded, 1, &[])]),
        ]
        .into();
        let depends = stage_dependencies(&stages, &tasks_of);
        assert_eq!(
            depends,
            [(TaskId(3), vec![TaskId(1)]), (TaskId(4), vec![TaskId(1)])].into()
        );
    }

    #[test]
    fn a_sweep_stage_stands_as_its_sweep_ended_or_its_most_advanced_trial() {
        assert_eq!(sweep_stage_state(SweepEnd::Best(TaskId(1)), &[]), Succeeded);
        assert_eq!(sweep_stage_state(SweepEnd::NoTrialSucceeded, &[]), Failed);
        assert_eq!(sweep_stage_state(SweepEnd::Cancelled, &[]), Cancelled);
        assert_eq!(
            sweep_stage_state(SweepEnd::Open, &[Queued, Starting, Succeeded]),
            Starting
        );
        assert_eq!(sweep_stage_state(SweepEnd::Open, &[Succeeded]), Queued);
    }

    #[test]
    fn inputs_are_the_last_attempts_files_by_rank_and_index() {
        let output = |attempt: u32, rank: u32, path: &str| OutputRecord {
            task: TaskId(9),
            attempt: tacc_core::AttemptNo(attempt),
            rank,
            path: path.into(),
            size: 3,
        };
        let mut task = test_record(9, Succeeded, 2, &[]);
        task.group_index = Some(4);
        let outputs = vec![
            output(1, 0, "old"),
            output(2, 0, "m.pt"),
            output(2, 1, "m.pt"),
        ];
        let names = |array| -> Vec<String> {
            input_files("train", array, &task, outputs.clone())
                .into_iter()
                .map(|f| f.name)
                .collect()
        };
        assert_eq!(names(false), ["m.pt", "rank-1/m.pt"]);
        assert_eq!(names(true), ["4/m.pt", "4/rank-1/m.pt"]);
    }
}
