//! The decisions of the sweep controller, over what the store holds of a sweep: the
//! task each trial runs, how many trials to launch into free slots, which trials ASHA
//! stops, which trial is best, whether a sweep is still open and what its leaderboard
//! shows. The controller (`control/sweeps.rs`) reads, applies and launches.

use std::collections::BTreeMap;

use tacc_core::{GroupId, TaskId, TaskState, Timestamp};
use tacc_proto::{AttemptRef, MetricLine, SweepBoard, TrialView};
use tacc_schema::{Goal, SweepSpec, TaskSpec, TrialPoint, parameter_variable, substitute};
use tacc_store::{GroupRecord, MetricPoint, TaskRecord};

use crate::ServerError;
use crate::asha::{Asha, Observation};
use crate::control::CANCELLED_BY_USER;

/// One trial as the controller reads it: its record, its reported series of the sweep's
/// metric (step, value), and every metric point it reported.
pub(crate) type Trial = (TaskRecord, Vec<(u64, f64)>, Vec<MetricPoint>);

/// How a sweep stands, read from its trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SweepEnd {
    /// Still launching or running trials.
    Open,
    Best(TaskId),
    NoTrialSucceeded,
    Cancelled,
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

/// A sweep group's task and sweep, as stored.
pub(crate) fn sweep_of(group: &GroupRecord) -> Result<(TaskSpec, SweepSpec), ServerError> {
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

/// Every trial the sweep plans has been launched.
pub(crate) fn launched_all(record: &GroupRecord) -> bool {
    sweep_of(record).is_ok_and(|(_, sweep)| record.size as usize >= sweep.trials().len())
}

/// A trial's reported values of `metric` as (step, value), in arrival order, of its
/// latest attempt that reported any.
pub(crate) fn series(points: &[MetricPoint], metric: &str) -> Vec<(u64, f64)> {
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

/// The metric points an attempt reported at `at`, as the store keeps them.
pub(crate) fn metric_points(
    attempt: AttemptRef,
    lines: Vec<MetricLine>,
    at: Timestamp,
) -> Vec<MetricPoint> {
    lines
        .into_iter()
        .map(|line| MetricPoint {
            task: attempt.task,
            attempt: attempt.attempt,
            seq: 0,
            step: line.step,
            at,
            values: line.values,
        })
        .collect()
}

/// Whether the user cancelled the sweep (cancelling a sweep cancels its trials).
fn cancelled_by_user(trials: &[TaskRecord]) -> bool {
    trials
        .iter()
        .any(|t| t.reason.as_deref() == Some(CANCELLED_BY_USER))
}

/// Where a sweep stands before its best trial is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// A trial is unfinished, or one is left to launch and the user did not cancel it.
    Open,
    Cancelled,
    /// Every trial launched has ended: its best trial, if any, is its result.
    Ended,
}

/// Where a sweep stands from its `trials`, `launched_all` saying whether every trial it
/// plans has been launched.
pub(crate) fn standing(trials: &[TaskRecord], launched_all: bool) -> Standing {
    let cancelled = cancelled_by_user(trials);
    if trials.iter().any(|t| !t.state.is_terminal()) || (!cancelled && !launched_all) {
        return Standing::Open;
    }
    if cancelled {
        return Standing::Cancelled;
    }
    Standing::Ended
}

impl SweepEnd {
    /// How a sweep whose trials have all ended ended, with its best trial if any.
    pub(crate) fn of_best(best: Option<TaskId>) -> SweepEnd {
        match best {
            Some(best) => SweepEnd::Best(best),
            None => SweepEnd::NoTrialSucceeded,
        }
    }
}

/// Whether a sweep found in the store after a restart is open again: a trial is
/// unfinished, or trials are left to launch and the user did not cancel it.
pub(crate) fn reopens(trials: &[TaskRecord], planned: usize) -> bool {
    trials.iter().any(|t| !t.state.is_terminal())
        || (!cancelled_by_user(trials) && trials.len() < planned)
}

/// The succeeded trial with the best final value of `goal`'s metric, from each trial's
/// state, id and last reported value.
pub(crate) fn best_of(
    goal: Goal,
    trials: impl Iterator<Item = (TaskState, TaskId, Option<f64>)>,
) -> Option<TaskId> {
    let mut best: Option<(f64, TaskId)> = None;
    for (state, task, last) in trials {
        if state != TaskState::Succeeded {
            continue;
        }
        let Some(value) = last else {
            continue;
        };
        if best.is_none_or(|(b, _)| goal.better(value, b)) {
            best = Some((value, task));
        }
    }
    best.map(|(_, task)| task)
}

/// The trials ASHA stops, each with the reason it is given: every trial's rung values,
/// in the order they reached the server, decided at once.
pub(crate) fn asha_stops(sweep: &SweepSpec, trials: &[Trial]) -> BTreeMap<TaskId, String> {
    let Some(asha_spec) = &sweep.asha else {
        return BTreeMap::new();
    };
    let asha = Asha::new(asha_spec, sweep.goal);
    let mut arrivals: Vec<(Timestamp, u32, TaskId, Observation)> = Vec::new();
    for (trial, series, raw) in trials {
        let index = trial.group_index.unwrap_or(0);
        for observation in asha.observe(index, series) {
            let step = asha.rungs[observation.rung];
            let at = raw
                .iter()
                .filter(|p| p.values.contains_key(&sweep.metric))
                .find(|p| p.step >= step)
                .map_or(Timestamp(u64::MAX), |p| p.at);
            arrivals.push((at, observation.rung as u32, trial.id, observation));
        }
    }
    arrivals.sort_by_key(|(at, rung, task, _)| (*at, *task, *rung));
    let observations: Vec<Observation> = arrivals.iter().map(|a| a.3).collect();
    let stopped = asha.decide(&observations);
    trials
        .iter()
        .filter_map(|(trial, _, _)| {
            let why = stopped.get(&trial.group_index.unwrap_or(0))?;
            Some((trial.id, asha.reason(&sweep.metric, why)))
        })
        .collect()
}

/// The trials to launch now: the next `next` points after the `launched` ones. A trial
/// being stopped still holds its slot until it has ended, so never more than `parallel`
/// trials hold resources at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Launch {
    pub(crate) launched: usize,
    pub(crate) next: usize,
    pub(crate) unfinished: usize,
}

impl Launch {
    /// Of a sweep of `planned` trials, at most `parallel` unfinished, whose launched
    /// trials are in `states`.
    pub(crate) fn of(parallel: u32, planned: usize, states: &[TaskState]) -> Launch {
        let unfinished = states.iter().filter(|s| !s.is_terminal()).count();
        let launched = states.len();
        let free = (parallel as usize).saturating_sub(unfinished);
        let next = free.min(planned.saturating_sub(launched));
        Launch {
            launched,
            next,
            unfinished,
        }
    }

    /// Whether the sweep may still launch or stop trials after this launch, with
    /// `stopping` trials being stopped.
    pub(crate) fn still_open(&self, planned: usize, stopping: usize) -> bool {
        self.launched + self.next < planned || self.unfinished + self.next > 0 || stopping > 0
    }
}

/// The leaderboard of sweep `record` from its trials: counts and the best trial are
/// those of the trials read here (one picture), trials ranked by their best value.
pub(crate) fn board(
    record: &GroupRecord,
    mut view: tacc_proto::GroupView,
    trials: Vec<Trial>,
) -> Result<SweepBoard, ServerError> {
    let (_, sweep) = sweep_of(record)?;
    let points = sweep.trials();
    let mut trials: Vec<TrialView> = trials
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
    view.counts = BTreeMap::new();
    for trial in &trials {
        *view.counts.entry(trial.state).or_default() += 1;
    }
    let best_trial = best_of(
        sweep.goal,
        trials.iter().map(|t| (t.state, t.task_id, t.last)),
    );
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
            Goal::Minimize => "minimize".into(),
            Goal::Maximize => "maximize".into(),
        },
        max_trials: points.len() as u32,
        parallel: sweep.parallel,
        best_trial,
        trials,
    })
}

/// Why the stages after sweep stage `name` (group `group`) cannot run, and the state they
/// end in, once the sweep has ended as `end`; `None` while it is open or found a best.
pub(crate) fn sweep_stage_failure(
    name: &str,
    group: GroupId,
    end: SweepEnd,
) -> Option<(String, TaskState)> {
    match end {
        SweepEnd::Best(_) | SweepEnd::Open => None,
        SweepEnd::NoTrialSucceeded => Some((
            format!("dependency_failed: {name} (group {group}: no trial succeeded)"),
            TaskState::Failed,
        )),
        SweepEnd::Cancelled => Some((
            format!("dependency_failed: {name} (group {group} was cancelled)"),
            TaskState::Cancelled,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::rules::test_record;
    use TaskState::*;

    fn trial(id: u64, state: TaskState, reason: Option<&str>) -> TaskRecord {
        TaskRecord {
            reason: reason.map(str::to_string),
            ..test_record(id, state, 1, &[])
        }
    }

    #[test]
    fn free_slots_get_the_next_trials_and_stopping_ones_hold_theirs() {
        // (parallel, planned, launched states) → (next, still open with no stopping)
        let table: &[(u32, usize, &[TaskState], usize, bool)] = &[
            (2, 5, &[], 2, true),
            (2, 5, &[Running, Queued], 0, true),
            (2, 5, &[Succeeded, Running], 1, true),
            (3, 4, &[Succeeded, Failed, Cancelled], 1, true),
            (2, 2, &[Succeeded, Failed], 0, false),
            (4, 3, &[Succeeded], 2, true),
        ];
        for (parallel, planned, states, next, open) in table {
            let launch = Launch::of(*parallel, *planned, states);
            assert_eq!(launch.next, *next, "{parallel} {planned} {states:?}");
            assert_eq!(launch.still_open(*planned, 0), *open, "{states:?}");
        }
        // A trial being stopped keeps the sweep open though nothing else would.
        assert!(Launch::of(2, 2, &[Succeeded, Failed]).still_open(2, 1));
    }

    #[test]
    fn a_sweep_ends_once_every_trial_ended_and_all_were_launched_unless_cancelled() {
        let user = Some(CANCELLED_BY_USER);
        // (each trial's state and reason, every trial launched, where the sweep stands)
        type Case<'a> = (&'a [(TaskState, Option<&'a str>)], bool, Standing);
        let table: &[Case] = &[
            (&[(Running, None)], true, Standing::Open),
            (&[(Succeeded, None)], false, Standing::Open),
            (&[(Cancelled, user)], false, Standing::Cancelled),
            (&[(Cancelled, user), (Running, None)], false, Standing::Open),
            (&[(Succeeded, None), (Failed, None)], true, Standing::Ended),
            (&[(Failed, None)], true, Standing::Ended),
        ];
        for (states, launched_all, expected) in table {
            let trials: Vec<TaskRecord> = states
                .iter()
                .enumerate()
                .map(|(i, (s, r))| trial(i as u64 + 1, *s, *r))
                .collect();
            assert_eq!(
                standing(&trials, *launched_all),
                *expected,
                "{states:?} {launched_all}"
            );
        }
        assert_eq!(
            SweepEnd::of_best(Some(TaskId(1))),
            SweepEnd::Best(TaskId(1))
        );
        assert_eq!(SweepEnd::of_best(None), SweepEnd::NoTrialSucceeded);
    }

    #[test]
    fn a_restarted_server_reopens_unfinished_sweeps_and_those_not_fully_launched() {
        let user = Some(CANCELLED_BY_USER);
        assert!(reopens(&[trial(1, Running, None)], 1));
        assert!(reopens(&[trial(1, Succeeded, None)], 2));
        assert!(!reopens(&[trial(1, Succeeded, None)], 1));
        assert!(!reopens(&[trial(1, Cancelled, user)], 2));
    }

    #[test]
    fn the_best_trial_is_a_succeeded_one_with_the_best_last_value() {
        let trials = [
            (Succeeded, TaskId(1), Some(0.5)),
            (Failed, TaskId(2), Some(0.1)),
            (Succeeded, TaskId(3), Some(0.3)),
            (Succeeded, TaskId(4), None),
        ];
        assert_eq!(best_of(Goal::Minimize, trials.into_iter()), Some(TaskId(3)));
        assert_eq!(best_of(Goal::Maximize, trials.into_iter()), Some(TaskId(1)));
        assert_eq!(best_of(Goal::Minimize, trials[1..2].iter().copied()), None);
    }

    #[test]
    fn a_series_is_the_latest_reporting_attempt_of_the_metric() {
        let point = |attempt: u32, step: u64, name: &str, value: f64| MetricPoint {
            task: TaskId(1),
            attempt: tacc_core::AttemptNo(attempt),
            seq: 0,
            step,
            at: Timestamp(0),
            values: [(name.to_string(), value)].into(),
        };
        let points = [
            point(1, 1, "loss", 0.9),
            point(2, 1, "loss", 0.8),
            point(2, 2, "acc", 0.1),
            point(2, 3, "loss", 0.7),
            point(3, 1, "acc", 0.2),
        ];
        assert_eq!(series(&points, "loss"), vec![(1, 0.8), (3, 0.7)]);
        assert_eq!(series(&points, "acc"), vec![(1, 0.2)]);
        assert!(series(&points, "other").is_empty());
    }

    #[test]
    fn a_sweep_stage_fails_its_dependents_only_once_ended_without_a_best() {
        let group = GroupId(7);
        assert_eq!(sweep_stage_failure("s", group, SweepEnd::Open), None);
        assert_eq!(
            sweep_stage_failure("s", group, SweepEnd::Best(TaskId(1))),
            None
        );
        assert_eq!(
            sweep_stage_failure("s", group, SweepEnd::NoTrialSucceeded),
            Some((
                format!("dependency_failed: s (group {group}: no trial succeeded)"),
                Failed
            ))
        );
        assert_eq!(
            sweep_stage_failure("s", group, SweepEnd::Cancelled),
            Some((
                format!("dependency_failed: s (group {group} was cancelled)"),
                Cancelled
            ))
        );
    }
}
