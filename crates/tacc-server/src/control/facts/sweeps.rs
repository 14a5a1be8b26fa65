//! Sweeps' trials and how sweeps stand: each trial with its reported series of the
//! sweep's metric, the best trial, the leaderboard, whether a sweep is open or how it
//! ended, and the sweeps a pipeline stage waits for.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{GroupId, TaskId, TaskState};
use tacc_proto::SweepBoard;
use tacc_store::{GroupFilter, GroupKind, GroupRecord, StageRecord, StageSource, TaskRecord};

use super::Facts;
use crate::ServerError;
use crate::control::rules::pipelines::{self, StageKind};
use crate::control::rules::sweeps::{
    self, Standing, SweepEnd, Trial, launched_all, series, sweep_of,
};

impl Facts {
    /// The sweep's trials, by index, with their reported series of `metric`.
    pub(crate) async fn trials_of(
        &self,
        group: GroupId,
        metric: &str,
    ) -> Result<Vec<Trial>, ServerError> {
        let mut out = Vec::new();
        for record in self.group_elements(group).await? {
            let points = self.store.list_metrics(record.id).await?;
            out.push((record, series(&points, metric), points));
        }
        Ok(out)
    }

    /// The succeeded trial with the best final value of the sweep's metric.
    pub(crate) async fn best_trial(&self, group: GroupId) -> Result<Option<TaskId>, ServerError> {
        let record = self
            .group(group)
            .await?
            .ok_or(ServerError::GroupNotFound(group))?;
        let (_, sweep) = sweep_of(&record)?;
        let trials = self.trials_of(group, &sweep.metric).await?;
        Ok(sweeps::best_of(
            sweep.goal,
            trials
                .iter()
                .map(|(trial, series, _)| (trial.state, trial.id, series.last().map(|(_, v)| *v))),
        ))
    }

    /// The leaderboard of a sweep.
    pub(crate) async fn sweep_board(
        &self,
        record: &GroupRecord,
        view: tacc_proto::GroupView,
    ) -> Result<SweepBoard, ServerError> {
        let (_, sweep) = sweep_of(record)?;
        let trials = self.trials_of(record.id, &sweep.metric).await?;
        sweeps::board(record, view, trials)
    }

    /// Where a sweep stands, read from the store: open while a trial is unfinished or one
    /// is left to launch (unless the user cancelled it).
    pub(crate) async fn sweep_end(&self, group: GroupId) -> Result<SweepEnd, ServerError> {
        let Some(record) = self.group(group).await? else {
            return Ok(SweepEnd::Cancelled);
        };
        let trials = self.group_elements(group).await?;
        Ok(match sweeps::standing(&trials, launched_all(&record)) {
            Standing::Open => SweepEnd::Open,
            Standing::Cancelled => SweepEnd::Cancelled,
            Standing::Ended => SweepEnd::of_best(self.best_trial(group).await?),
        })
    }

    /// What a stage ran as.
    pub(crate) async fn stage_kind(&self, stage: &StageRecord) -> Result<StageKind, ServerError> {
        Ok(match stage.source {
            StageSource::Task(_) => StageKind::Task,
            StageSource::Group(group) => match self.group(group).await? {
                Some(record) if record.kind == GroupKind::Sweep => StageKind::Sweep(group),
                _ => StageKind::Array,
            },
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

    /// The unfinished sweeps (of earlier stages) a queued stage task waits for.
    pub(crate) async fn sweeps_awaited_by(
        &self,
        record: &TaskRecord,
    ) -> Result<BTreeSet<GroupId>, ServerError> {
        let Some(stage) = self.stage_of_task(record).await? else {
            return Ok(Default::default());
        };
        let stages = self.store.pipeline_stages(stage.pipeline).await?;
        self.sweeps_awaited(&stage, &stages).await
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
            let end = self.sweep_end(group).await?;
            return Ok(sweeps::sweep_stage_failure(&stage.name, group, end));
        }
        let tasks = self.source_tasks(stage.source).await?;
        Ok(pipelines::stage_failure(&stage.name, &tasks))
    }

    /// The sweeps found open in the store (after a restart): those with an unfinished
    /// trial or trials left to launch, unless the user cancelled them.
    pub(crate) async fn open_sweeps(&self) -> Result<Vec<GroupId>, ServerError> {
        let mut open = Vec::new();
        for group in self.store.list_groups(&GroupFilter::default()).await? {
            if group.kind != GroupKind::Sweep {
                continue;
            }
            let Ok((_, sweep)) = sweep_of(&group) else {
                continue;
            };
            let trials = self.group_elements(group.id).await?;
            if sweeps::reopens(&trials, sweep.trials().len()) {
                open.push(group.id);
            }
        }
        Ok(open)
    }
}
