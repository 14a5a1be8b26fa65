//! With every liveness check, the running attempts that have a hang policy (their task's
//! `on_hang`, or the cluster's `--hang-after` for multi-node tasks) are checked against
//! their ranks' last signs of life (`rules::hangs`), and the hung ones end — failed, or
//! retried when `on_hang.then` is `retry` — with a reason that names the ranks. Their
//! agents stop every rank (the attempt is withdrawn from them).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tacc_core::{TaskId, TaskState, Timestamp};
use tacc_proto::AttemptRef;
use tacc_schema::{HangAction, RetryOn, RetrySpec, TaskSpec};
use tacc_store::TaskRecord;

use super::ending::{End, on_attempt_end};
use crate::control::effects::Effects;
use crate::control::rules::hangs::{self, AttemptSilence};
use crate::control::{Core, ServerConfig};

/// A hung attempt retried by `on_hang.then: retry` runs this many times in all at least.
const HANG_RETRY_ATTEMPTS: u32 = 3;

/// The silence that makes an attempt of `spec` hung, and what follows; `None` when
/// nothing does.
pub(crate) fn policy_of(
    spec: &TaskSpec,
    cluster: Option<Duration>,
) -> Option<(Duration, HangAction)> {
    match &spec.on_hang {
        // A dev session sits silent by design; its idle timeout ends it.
        _ if spec.is_interactive() => None,
        Some(hang) => hang
            .after
            .map(|after| (Duration::from_secs(after.as_secs()), hang.then)),
        None if spec.resources.nodes > 1 => cluster.map(|after| (after, HangAction::Fail)),
        None => None,
    }
}

/// The attempts placed on nodes whose task has a hang policy: the shell reads their
/// records and their ranks' last signs of life for [`on_hang_check`].
pub(crate) fn watched(core: &Core, config: &ServerConfig) -> BTreeSet<AttemptRef> {
    core.nodes
        .values()
        .flat_map(|live| live.assignments.keys().copied())
        .filter(|attempt| {
            core.specs
                .get(&attempt.task)
                .is_some_and(|spec| policy_of(spec, config.hang_after).is_some())
        })
        .collect()
}

/// What the shell found of a watched attempt.
#[derive(Debug)]
pub(crate) struct Watched {
    pub attempt: AttemptRef,
    /// The task's record as the store holds it.
    pub record: TaskRecord,
    /// The last sign of life of each of its ranks that has been sampled.
    pub alive_at: BTreeMap<u32, Timestamp>,
}

/// End the watched attempts that are hung at `now`.
pub(crate) fn on_hang_check(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    now: Timestamp,
    watched: Vec<Watched>,
) {
    let mut checked: BTreeMap<AttemptRef, (AttemptSilence, HangAction, TaskRecord)> =
        BTreeMap::new();
    for Watched {
        attempt,
        record,
        alive_at,
    } in watched
    {
        let Some((after, then)) = core
            .specs
            .get(&attempt.task)
            .and_then(|spec| policy_of(spec, config.hang_after))
        else {
            continue;
        };
        let (Some(started_at), TaskState::Running) = (record.started_at, record.state) else {
            continue;
        };
        if record.attempt != attempt.attempt || record.cancel_requested {
            continue;
        }
        let silence = AttemptSilence {
            attempt,
            ranks: record.placements.len().max(1) as u32,
            after,
            started_at,
            finished: core
                .finished_ranks
                .get(&attempt)
                .cloned()
                .unwrap_or_default(),
            alive_at,
        };
        checked.insert(attempt, (silence, then, record));
    }
    let silences: Vec<AttemptSilence> = checked.values().map(|(s, _, _)| s.clone()).collect();
    for hang in hangs::find(&silences, now) {
        let Some((_, then, record)) = checked.remove(&hang.attempt) else {
            continue;
        };
        fx.warn(format!("task {}: {}", record.id, hang.reason));
        let retry_as = match then {
            HangAction::Fail => None,
            HangAction::Retry => Some(hang_retry(core, record.id)),
        };
        on_attempt_end(
            core,
            fx,
            End {
                record,
                state: TaskState::Failed,
                reason: Some(hang.reason),
                exit_code: None,
                at: now,
                node_failure: false,
                retry_as,
                earlier_node_losses: 0,
                config,
            },
        );
    }
}

/// The retry a hung attempt gets with `on_hang.then: retry`: the task's own, widened to
/// failures and to at least [`HANG_RETRY_ATTEMPTS`] attempts.
fn hang_retry(core: &Core, task: TaskId) -> RetrySpec {
    let own = core.specs.get(&task).map(|s| s.retry.clone());
    let mut on = own.as_ref().map(|r| r.on.clone()).unwrap_or_default();
    if !on.contains(&RetryOn::Failed) {
        on.push(RetryOn::Failed);
    }
    let max_attempts = own.map_or(1, |r| r.max_attempts).max(HANG_RETRY_ATTEMPTS);
    RetrySpec { max_attempts, on }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TaskSpec {
        tacc_schema::parse_task("task.yaml", yaml).unwrap().0
    }

    #[test]
    fn gangs_get_the_cluster_s_policy_and_a_task_s_own_wins() {
        let cluster = Some(Duration::from_secs(1800));
        let gang = spec("run: x\nresources: {nodes: 2}\n");
        assert_eq!(
            policy_of(&gang, cluster),
            Some((Duration::from_secs(1800), HangAction::Fail))
        );
        assert_eq!(policy_of(&gang, None), None, "the operator turned it off");
        let single = spec("run: x\n");
        assert_eq!(
            policy_of(&single, cluster),
            None,
            "one node: only when asked"
        );
        let asked = spec("run: x\non_hang: {after: 2m, then: retry}\n");
        assert_eq!(
            policy_of(&asked, None),
            Some((Duration::from_secs(120), HangAction::Retry))
        );
        let off = spec("run: x\nresources: {nodes: 2}\non_hang: off\n");
        assert_eq!(policy_of(&off, cluster), None);
    }
}
