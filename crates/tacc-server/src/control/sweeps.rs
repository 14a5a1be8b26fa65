//! Sweeps, a workflow of their own beside the control plane: a sweep is a group of kind
//! `sweep` whose elements are its trials, launched a few at a time (at most `parallel`
//! unfinished) until `max_trials`; each trial is the task with its parameter point
//! substituted into `run` and `setup` (`{{lr}}`) and set in the environment
//! (`TACC_PARAM_LR`). A controller ([`run_sweeps`]) reconciles every open sweep from the
//! store — what is launched, what runs, what was reported — so a restarted server
//! carries on where it stopped; with `method: asha` it stops the trials the pure
//! decisions of [`crate::asha`] name, and their slots go to new trials. The decisions are
//! in `rules/sweeps.rs`; what must run in a turn goes through `Control`'s entry points.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tacc_core::{GroupId, SnapshotId, TaskState};
use tacc_schema::TaskSpec;
use tacc_store::{GroupKind, GroupRecord, NewGroup, NewTask};
use tokio_util::sync::CancellationToken;

use super::handlers::accepted::Accepted;
use super::rules::sweeps::{Launch, asha_stops, sweep_of, trial_spec};
use super::workflow_parts::WorkflowParts;
use super::{Control, SubmitOptions};
use crate::ServerError;
use crate::asha::EARLY_STOPPED;

/// How often open sweeps are reconciled (trials launched, ASHA decisions applied).
pub(crate) const SWEEP_TICK: Duration = Duration::from_millis(250);

/// The sweeps that may still launch or stop trials: shared by the sweep controller, the
/// cancels that close them and the control plane's recovery, which opens again those its
/// queued stage tasks wait for.
#[derive(Debug, Default)]
pub(crate) struct OpenSweeps {
    open: std::sync::Mutex<BTreeSet<GroupId>>,
}

impl OpenSweeps {
    pub(crate) fn add(&self, group: GroupId) {
        self.open.lock().unwrap().insert(group);
    }

    pub(crate) fn remove(&self, group: GroupId) {
        self.open.lock().unwrap().remove(&group);
    }

    fn list(&self) -> Vec<GroupId> {
        self.open.lock().unwrap().iter().copied().collect()
    }
}

/// Submits sweeps and launches and stops their trials.
#[derive(Debug, Clone)]
pub(crate) struct Sweeps {
    parts: WorkflowParts,
}

impl Sweeps {
    /// The sweeps of `control`'s cluster.
    pub(crate) fn of(control: &Arc<Control>) -> Sweeps {
        Sweeps {
            parts: WorkflowParts::of(control),
        }
    }

    /// Accept a sweep: the group and its first `parallel` trials in one transaction,
    /// scheduled at once; the controller launches the rest as trials end.
    pub(crate) async fn submit(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        options: SubmitOptions,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<GroupRecord, ServerError> {
        let SubmitOptions {
            source,
            wait_for_capacity,
            translated,
        } = options;
        let (spec, mut submission) = self
            .parts
            .control
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
        let at = self.parts.clock.now();
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
                self.parts
                    .store
                    .create_group_keyed(new_group, elements, keyed)
                    .await?
            }
            None => self.parts.store.create_group(new_group, elements).await?,
        };
        let specs = trials.into_iter().map(|(_, spec)| spec);
        self.enqueue_trials(user, records.into_iter().zip(specs).collect())
            .await?;
        self.parts.sweeps.add(group.id);
        Ok(group)
    }

    /// Hand new trials to the scheduler (or hold them while no node can run anything).
    async fn enqueue_trials(
        &self,
        user: &str,
        trials: Vec<(tacc_store::TaskRecord, TaskSpec)>,
    ) -> Result<(), ServerError> {
        for _ in &trials {
            self.parts.metrics.submitted();
        }
        let accepted = Accepted {
            tasks: trials,
            ..Default::default()
        };
        self.parts.control.accept(user, accepted).await
    }

    /// Bring one sweep up to date: stop what ASHA stops, launch trials into free slots.
    /// Returns whether it may still launch or stop trials.
    async fn reconcile(&self, group: GroupId) -> Result<bool, ServerError> {
        let Some(record) = self.parts.facts.group(group).await? else {
            return Ok(false);
        };
        let (spec, sweep) = sweep_of(&record)?;
        let points = sweep.trials();
        let trials = self.parts.facts.trials_of(group, &sweep.metric).await?;
        let stops = asha_stops(&sweep, &trials);
        let mut stopping = BTreeSet::new();
        for (trial, _, _) in &trials {
            let Some(reason) = stops.get(&trial.id) else {
                continue;
            };
            if !trial.state.is_terminal() {
                stopping.insert(trial.id);
                if !trial.cancel_requested {
                    tracing::info!("sweep {group}: stopping trial task {}: {reason}", trial.id);
                    // The reason first: the trial's end keeps it (see attempts.rs).
                    self.parts
                        .control
                        .note_reason(trial.id, reason.clone())
                        .await?;
                    self.parts.control.cancel(trial.id).await?;
                }
            }
            let now_record = self.parts.facts.task_record(trial.id).await?;
            if let Some(now_record) = now_record
                && now_record.state == TaskState::Cancelled
                && !now_record
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(EARLY_STOPPED))
            {
                self.parts
                    .control
                    .note_reason(trial.id, reason.clone())
                    .await?;
            }
        }
        let states: Vec<TaskState> = trials.iter().map(|(t, _, _)| t.state).collect();
        let launch = Launch::of(sweep.parallel, points.len(), &states);
        let Launch { launched, next, .. } = launch;
        if next > 0 {
            let Some((first, _, _)) = trials.first() else {
                return Ok(false);
            };
            let at = self.parts.clock.now();
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
            let records = self.parts.store.add_group_elements(group, elements).await?;
            self.enqueue_trials(&record.user, records.into_iter().zip(specs).collect())
                .await?;
        }
        Ok(launch.still_open(points.len(), stopping.len()))
    }

    /// Open the sweeps found open in the store (after a restart).
    async fn load_open(&self) -> Result<(), ServerError> {
        for group in self.parts.facts.open_sweeps().await? {
            self.parts.sweeps.add(group);
        }
        Ok(())
    }
}

/// The sweep controller: reconcile every open sweep each tick until shutdown.
pub(crate) async fn run_sweeps(sweeps: Sweeps, shutdown: CancellationToken) {
    if let Err(e) = sweeps.load_open().await {
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
        for group in sweeps.parts.sweeps.list() {
            match sweeps.reconcile(group).await {
                Ok(true) => {}
                Ok(false) => {
                    sweeps.parts.sweeps.remove(group);
                    if let Err(e) = sweeps.parts.control.sweep_stage_ended(group).await {
                        tracing::error!("sweep {group}: its pipeline's next stages wait: {e}");
                        sweeps.parts.sweeps.add(group);
                    }
                }
                Err(e) => tracing::error!("sweep {group}: {e}; tried again shortly"),
            }
        }
    }
}
