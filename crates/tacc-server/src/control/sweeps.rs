//! Sweeps in the control plane: a sweep is a group of kind `sweep` whose elements are its
//! trials, launched a few at a time (at most `parallel` unfinished) until `max_trials`;
//! each trial is the task with its parameter point substituted into `run` and `setup`
//! (`{{lr}}`) and set in the environment (`TACC_PARAM_LR`). A controller reconciles every
//! open sweep from the store — what is launched, what runs, what was reported — so a
//! restarted server carries on where it stopped; with `method: asha` it stops the trials
//! the pure decisions of [`crate::asha`] name, and their slots go to new trials.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tacc_core::{GroupId, SnapshotId, TaskId, TaskState};
use tacc_proto::{MetricLine, SweepBoard, TrialView};
use tacc_schema::{SweepSpec, TaskSpec, TrialPoint, parameter_variable, substitute};
use tacc_store::{
    GroupFilter, GroupKind, GroupRecord, MetricPoint, NewGroup, NewTask, TaskChange, TaskRecord,
};
use tokio_util::sync::CancellationToken;

use super::{Control, request_of};
use crate::ServerError;
use crate::asha::{Asha, EARLY_STOPPED, Observation};

/// How often open sweeps are reconciled (trials launched, ASHA decisions applied).
pub(crate) const SWEEP_TICK: Duration = Duration::from_millis(250);

/// The sweeps that may still launch or stop trials.
#[derive(Debug, Default)]
pub(crate) struct OpenSweeps {
    open: std::sync::Mutex<BTreeSet<GroupId>>,
}

impl OpenSweeps {
    pub(crate) fn add(&self, group: GroupId) {
        self.open.lock().unwrap().insert(group);
    }

    fn remove(&self, group: GroupId) {
        self.open.lock().unwrap().remove(&group);
    }

    fn list(&self) -> Vec<GroupId> {
        self.open.lock().unwrap().iter().copied().collect()
    }
}

/// The task a trial runs: the sweep's task with the point substituted.
pub(crate) fn trial_spec(spec: &TaskSpec, point: &TrialPoint) -> TaskSpec {
    let mut trial = TaskSpec {
        sweep: None,
        array: None,
        notify: None,
        run: substitute(&spec.run, point),
        setup: spec.setup.as_ref().map(|s| substitute(s, point)),
        ..spec.clone()
    };
    for (name, value) in point {
        trial
            .environment
            .vars
            .insert(parameter_variable(name), value.clone());
    }
    trial
}

fn sweep_of(group: &GroupRecord) -> Result<(TaskSpec, SweepSpec), ServerError> {
    let spec: TaskSpec = serde_json::from_value(group.spec.clone()).map_err(|e| {
        ServerError::Internal(format!(
            "stored spec of sweep {} is unreadable: {e}",
            group.id
        ))
    })?;
    let sweep = spec
        .sweep
        .clone()
        .ok_or_else(|| ServerError::InvalidTask(format!("group {} is not a sweep", group.id)))?;
    Ok((spec, sweep))
}

/// A trial's reported values of `metric` as (step, value), in arrival order, of its
/// latest attempt that reported any.
fn series(points: &[MetricPoint], metric: &str) -> Vec<(u64, f64)> {
    let Some(attempt) = points
        .iter()
        .filter(|p| p.values.contains_key(metric))
        .map(|p| p.attempt)
        .max()
    else {
        return Vec::new();
    };
    points
        .iter()
        .filter(|p| p.attempt == attempt)
        .filter_map(|p| Some((p.step, *p.values.get(metric)?)))
        .collect()
}

impl Control {
    /// Accept a sweep: the group and its first `parallel` trials in one transaction,
    /// scheduled at once; the controller launches the rest as trials end.
    pub async fn submit_sweep(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        options: super::SubmitOptions,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<GroupRecord, ServerError> {
        let super::SubmitOptions {
            source,
            wait_for_capacity,
            translated,
        } = options;
        let (spec, mut submission) = self
            .prepare(user, spec, &snapshot, wait_for_capacity)
            .await?;
        submission.overrides.splice(0..0, translated);
        let submission = submission.to_json();
        let Some(sweep) = spec.sweep.clone() else {
            return Err(ServerError::InvalidTask(
                "the task has no `sweep:`; submit it as a single task".into(),
            ));
        };
        let points = sweep.trials();
        let first = points.len().min(sweep.parallel as usize);
        let at = self.clock.now();
        let trials: Vec<(u32, TaskSpec)> = points[..first]
            .iter()
            .enumerate()
            .map(|(index, point)| (index as u32, trial_spec(&spec, point)))
            .collect();
        let elements = trials
            .iter()
            .map(|(index, trial)| {
                Ok((
                    *index,
                    NewTask {
                        name: spec.name.clone(),
                        user: user.to_string(),
                        spec: serde_json::to_value(trial)
                            .map_err(|e| ServerError::Internal(e.to_string()))?,
                        snapshot: snapshot.clone(),
                        source: source.clone(),
                        submitted_at: at,
                        submission: submission.clone(),
                    },
                ))
            })
            .collect::<Result<Vec<_>, ServerError>>()?;
        let new_group = NewGroup {
            kind: GroupKind::Sweep,
            name: spec.name.clone(),
            user: user.to_string(),
            spec: serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?,
            created_at: at,
        };
        let (group, records) = match keyed {
            Some(keyed) => {
                self.store
                    .create_group_keyed(new_group, elements, keyed)
                    .await?
            }
            None => self.store.create_group(new_group, elements).await?,
        };
        let specs: Vec<TaskSpec> = trials.into_iter().map(|(_, spec)| spec).collect();
        self.enqueue_trials(user, &records, &specs).await?;
        self.sweeps.add(group.id);
        Ok(group)
    }

    /// Hand new trials to the scheduler (or hold them while no node can run anything).
    async fn enqueue_trials(
        &self,
        user: &str,
        records: &[TaskRecord],
        specs: &[TaskSpec],
    ) -> Result<(), ServerError> {
        for _ in records {
            self.metrics.submitted();
        }
        let identity_group = self.auth.group_of(user).await?;
        let mut inner = self.inner.lock().await;
        inner
            .identity_groups
            .insert(user.to_string(), identity_group);
        let owner_group = inner.group_for(&self.config, user);
        for (record, spec) in records.iter().zip(specs) {
            inner.specs.insert(record.id, spec.clone());
        }
        let submitted = records
            .iter()
            .zip(specs)
            .map(|(record, spec)| {
                let request = request_of(spec, record, record.submitted_at, owner_group.clone());
                (record.id, request)
            })
            .collect();
        self.queue_new(&mut inner, submitted).await?;
        Ok(())
    }

    /// Keep the metric points an attempt reported (the caller checked the attempt).
    pub(crate) async fn record_metrics(
        &self,
        attempt: tacc_proto::AttemptRef,
        lines: Vec<MetricLine>,
    ) -> Result<(), ServerError> {
        let at = self.clock.now();
        let points = lines
            .into_iter()
            .map(|line| MetricPoint {
                task: attempt.task,
                attempt: attempt.attempt,
                seq: 0,
                step: line.step,
                at,
                values: line.values,
            })
            .collect();
        self.store.append_metrics(points).await?;
        Ok(())
    }

    /// The sweep's trials with their points (by index) and reported series of the metric.
    async fn trials_of(
        &self,
        group: GroupId,
        metric: &str,
    ) -> Result<Vec<(TaskRecord, Vec<(u64, f64)>, Vec<MetricPoint>)>, ServerError> {
        let mut out = Vec::new();
        for record in self.group_elements(group).await? {
            let points = self.store.list_metrics(record.id).await?;
            out.push((record, series(&points, metric), points));
        }
        Ok(out)
    }

    /// The succeeded trial with the best final value of the sweep's metric.
    pub async fn best_trial(&self, group: GroupId) -> Result<Option<TaskId>, ServerError> {
        let record = self
            .store
            .get_group(group)
            .await?
            .ok_or(ServerError::GroupNotFound(group))?;
        let (_, sweep) = sweep_of(&record)?;
        let mut best: Option<(f64, TaskId)> = None;
        for (trial, series, _) in self.trials_of(group, &sweep.metric).await? {
            if trial.state != TaskState::Succeeded {
                continue;
            }
            let Some((_, value)) = series.last() else {
                continue;
            };
            if best.is_none_or(|(b, _)| sweep.goal.better(*value, b)) {
                best = Some((*value, trial.id));
            }
        }
        Ok(best.map(|(_, task)| task))
    }

    /// The leaderboard of a sweep.
    pub(crate) async fn sweep_board(
        &self,
        record: &GroupRecord,
        view: tacc_proto::GroupView,
    ) -> Result<SweepBoard, ServerError> {
        let (_, sweep) = sweep_of(record)?;
        let points = sweep.trials();
        let mut trials: Vec<TrialView> = self
            .trials_of(record.id, &sweep.metric)
            .await?
            .into_iter()
            .map(|(trial, series, _)| {
                let index = trial.group_index.unwrap_or(0);
                let best = series
                    .iter()
                    .map(|(_, v)| *v)
                    .reduce(|a, b| if sweep.goal.better(b, a) { b } else { a });
                TrialView {
                    index,
                    task_id: trial.id,
                    state: trial.state,
                    reason: trial.reason,
                    parameters: points.get(index as usize).cloned().unwrap_or_default(),
                    best,
                    last: series.last().map(|(_, v)| *v),
                    step: series.last().map(|(s, _)| *s),
                }
            })
            .collect();
        // One picture: the counts and the best trial are those of the trials read here,
        // not of other reads a trial's end may fall between.
        let mut view = view;
        view.counts = BTreeMap::new();
        for trial in &trials {
            *view.counts.entry(trial.state).or_default() += 1;
        }
        let mut best_trial: Option<(f64, TaskId)> = None;
        for trial in trials.iter().filter(|t| t.state == TaskState::Succeeded) {
            if let Some(value) = trial.last
                && best_trial.is_none_or(|(b, _)| sweep.goal.better(value, b))
            {
                best_trial = Some((value, trial.task_id));
            }
        }
        trials.sort_by(|a, b| match (a.best, b.best) {
            (Some(x), Some(y)) if sweep.goal.better(x, y) => std::cmp::Ordering::Less,
            (Some(x), Some(y)) if sweep.goal.better(y, x) => std::cmp::Ordering::Greater,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            _ => a.index.cmp(&b.index),
        });
        Ok(SweepBoard {
            group: view,
            method: sweep.method.as_str().into(),
            metric: sweep.metric.clone(),
            goal: match sweep.goal {
                tacc_schema::Goal::Minimize => "minimize".into(),
                tacc_schema::Goal::Maximize => "maximize".into(),
            },
            max_trials: points.len() as u32,
            parallel: sweep.parallel,
            best_trial: best_trial.map(|(_, task)| task),
            trials,
        })
    }

    /// Every trial the sweep plans has been launched.
    pub(crate) fn sweep_launched_all(record: &GroupRecord) -> bool {
        sweep_of(record).is_ok_and(|(_, sweep)| record.size as usize >= sweep.trials().len())
    }

    /// A sweep was cancelled: launch nothing more for it.
    pub(crate) fn close_sweep(&self, group: GroupId) {
        self.sweeps.remove(group);
    }

    /// Bring one sweep up to date: stop what ASHA stops, launch trials into free slots.
    /// Returns whether it may still launch or stop trials.
    async fn reconcile_sweep(&self, group: GroupId) -> Result<bool, ServerError> {
        let Some(record) = self.store.get_group(group).await? else {
            return Ok(false);
        };
        let (spec, sweep) = sweep_of(&record)?;
        let points = sweep.trials();
        let trials = self.trials_of(group, &sweep.metric).await?;
        let mut stopping = BTreeSet::new();
        if let Some(asha_spec) = &sweep.asha {
            let asha = Asha::new(asha_spec, sweep.goal);
            // Every trial's rung values, in the order they reached the server.
            let mut arrivals: Vec<(tacc_core::Timestamp, u32, TaskId, Observation)> = Vec::new();
            for (trial, series, raw) in &trials {
                let index = trial.group_index.unwrap_or(0);
                let observations = asha.observe(index, series);
                for observation in observations {
                    let step = asha.rungs[observation.rung];
                    let at = raw
                        .iter()
                        .filter(|p| p.values.contains_key(&sweep.metric))
                        .find(|p| p.step >= step)
                        .map_or(tacc_core::Timestamp(u64::MAX), |p| p.at);
                    arrivals.push((at, observation.rung as u32, trial.id, observation));
                }
            }
            arrivals.sort_by_key(|(at, rung, task, _)| (*at, *task, *rung));
            let observations: Vec<Observation> = arrivals.iter().map(|a| a.3).collect();
            let stopped = asha.decide(&observations);
            for (trial, _, _) in &trials {
                let Some(why) = stopped.get(&trial.group_index.unwrap_or(0)) else {
                    continue;
                };
                let reason = asha.reason(&sweep.metric, why);
                if !trial.state.is_terminal() {
                    stopping.insert(trial.id);
                    if !trial.cancel_requested {
                        tracing::info!("sweep {group}: stopping trial task {}: {reason}", trial.id);
                        // The reason first: the trial's end keeps it (see attempts.rs).
                        self.commit(&[TaskChange::Reason {
                            task: trial.id,
                            reason: Some(reason.clone()),
                        }])
                        .await?;
                        self.cancel(trial.id).await?;
                    }
                }
                let now_record = self.facts.task_record(trial.id).await?;
                if let Some(now_record) = now_record
                    && now_record.state == TaskState::Cancelled
                    && !now_record
                        .reason
                        .as_deref()
                        .is_some_and(|r| r.starts_with(EARLY_STOPPED))
                {
                    self.commit(&[TaskChange::Reason {
                        task: trial.id,
                        reason: Some(reason),
                    }])
                    .await?;
                }
            }
        }
        // A trial being stopped still holds its slot until it has ended: never more than
        // `parallel` trials hold resources at once.
        let unfinished = trials
            .iter()
            .filter(|(t, _, _)| !t.state.is_terminal())
            .count();
        let launched = trials.len();
        let free = (sweep.parallel as usize).saturating_sub(unfinished);
        let next = free.min(points.len().saturating_sub(launched));
        if next > 0 {
            let Some((first, _, _)) = trials.first() else {
                return Ok(false);
            };
            let at = self.clock.now();
            let specs: Vec<TaskSpec> = points[launched..launched + next]
                .iter()
                .map(|point| trial_spec(&spec, point))
                .collect();
            let elements = specs
                .iter()
                .enumerate()
                .map(|(offset, trial)| {
                    Ok((
                        (launched + offset) as u32,
                        NewTask {
                            name: record.name.clone(),
                            user: record.user.clone(),
                            spec: serde_json::to_value(trial)
                                .map_err(|e| ServerError::Internal(e.to_string()))?,
                            snapshot: first.snapshot.clone(),
                            source: first.source.clone(),
                            submitted_at: at,
                            // Later trials were submitted with the first.
                            submission: first.submission.clone(),
                        },
                    ))
                })
                .collect::<Result<Vec<_>, ServerError>>()?;
            let records = self.store.add_group_elements(group, elements).await?;
            self.enqueue_trials(&record.user, &records, &specs).await?;
        }
        Ok(launched + next < points.len() || unfinished + next > 0 || !stopping.is_empty())
    }

    /// Find the open sweeps in the store (after a restart): those with an unfinished
    /// trial or trials left to launch, unless the user cancelled one of their trials
    /// (cancelling a sweep cancels its trials).
    async fn load_open_sweeps(&self) -> Result<(), ServerError> {
        for group in self.store.list_groups(&GroupFilter::default()).await? {
            if group.kind != GroupKind::Sweep {
                continue;
            }
            let Ok((_, sweep)) = sweep_of(&group) else {
                continue;
            };
            let trials = self.group_elements(group.id).await?;
            let cancelled_by_user = trials
                .iter()
                .any(|t| t.reason.as_deref() == Some("cancelled by user"));
            let unfinished = trials.iter().any(|t| !t.state.is_terminal());
            if unfinished || (!cancelled_by_user && trials.len() < sweep.trials().len()) {
                self.sweeps.add(group.id);
            }
        }
        Ok(())
    }
}

/// The sweep controller: reconcile every open sweep each tick until shutdown.
pub async fn run_sweeps(control: Arc<Control>, shutdown: CancellationToken) {
    if let Err(e) = control.load_open_sweeps().await {
        tracing::error!(
            "cannot find the open sweeps: {e}; sweeps submitted before the restart wait"
        );
    }
    let mut tick = tokio::time::interval(SWEEP_TICK);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for group in control.sweeps.list() {
            match control.reconcile_sweep(group).await {
                Ok(true) => {}
                Ok(false) => {
                    control.sweeps.remove(group);
                    if let Err(e) = control.sweep_stage_ended(group).await {
                        tracing::error!("sweep {group}: its pipeline's next stages wait: {e}");
                        control.sweeps.add(group);
                    }
                }
                Err(e) => tracing::error!("sweep {group}: {e}; tried again shortly"),
            }
        }
    }
}
