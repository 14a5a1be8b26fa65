//! The shell around `rules::hangs`: with every liveness check, the running attempts that
//! have a hang policy (their task's `on_hang`, or the cluster's `--hang-after` for
//! multi-node tasks) are checked against their ranks' last signs of life, and the hung
//! ones are ended — failed, or retried when `on_hang.then` is `retry` — with a reason that
//! names the ranks. Their agents stop every rank (the attempt is withdrawn from them).

use std::collections::BTreeSet;
use std::time::Duration;

use tacc_core::TaskState;
use tacc_proto::AttemptRef;
use tacc_schema::{HangAction, RetryOn, RetrySpec, TaskSpec};

use super::rules::hangs::{self, AttemptSilence};
use super::{Control, Core};
use crate::ServerError;

/// A hung attempt retried by `on_hang.then: retry` runs this many times in all at least.
const HANG_RETRY_ATTEMPTS: u32 = 3;

/// The silence that makes an attempt of `spec` hung, and what follows; `None` when
/// nothing does.
pub(super) fn policy_of(
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

impl Control {
    /// End the attempts found hung now.
    pub(super) async fn end_hung_attempts(&self, inner: &mut Core) -> Result<(), ServerError> {
        let running: BTreeSet<AttemptRef> = inner
            .nodes
            .values()
            .flat_map(|live| live.assignments.keys().copied())
            .collect();
        let mut checked = Vec::new();
        for attempt in running {
            let Some((after, then)) = inner
                .specs
                .get(&attempt.task)
                .and_then(|spec| policy_of(spec, self.config.hang_after))
            else {
                continue;
            };
            let Some(record) = self.task_record(attempt.task).await? else {
                continue;
            };
            let (Some(started_at), TaskState::Running) = (record.started_at, record.state) else {
                continue;
            };
            if record.attempt != attempt.attempt || record.cancel_requested {
                continue;
            }
            checked.push((
                AttemptSilence {
                    attempt,
                    ranks: record.placements.len().max(1) as u32,
                    after,
                    started_at,
                    finished: inner
                        .finished_ranks
                        .get(&attempt)
                        .cloned()
                        .unwrap_or_default(),
                    alive_at: self.usage.alive_ranks(attempt),
                },
                then,
            ));
        }
        if checked.is_empty() {
            return Ok(());
        }
        let now = self.clock.now();
        let silences: Vec<AttemptSilence> = checked.iter().map(|(s, _)| s.clone()).collect();
        for hang in hangs::find(&silences, now) {
            let Some(record) = self.task_record(hang.attempt.task).await? else {
                continue;
            };
            let then = checked
                .iter()
                .find(|(s, _)| s.attempt == hang.attempt)
                .map_or(HangAction::Fail, |(_, then)| *then);
            tracing::warn!("task {}: {}", record.id, hang.reason);
            let retry_as = match then {
                HangAction::Fail => None,
                HangAction::Retry => {
                    let own = inner.specs.get(&record.id).map(|s| s.retry.clone());
                    let mut on = own.as_ref().map(|r| r.on.clone()).unwrap_or_default();
                    if !on.contains(&RetryOn::Failed) {
                        on.push(RetryOn::Failed);
                    }
                    let max_attempts = own.map_or(1, |r| r.max_attempts).max(HANG_RETRY_ATTEMPTS);
                    Some(RetrySpec { max_attempts, on })
                }
            };
            self.end_attempt_retrying(
                inner,
                record,
                TaskState::Failed,
                Some(hang.reason),
                None,
                now,
                false,
                retry_as,
            )
            .await?;
        }
        Ok(())
    }
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
