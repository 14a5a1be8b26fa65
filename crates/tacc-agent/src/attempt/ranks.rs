//! The run phase of a node that starts several processes of one attempt
//! (`resources.processes: per_gpu` or a number), as torchrun does: every process gets its
//! own `RANK` and `LOCAL_RANK`, an equal share of the node's CPUs and memory in a cgroup
//! of its own, and all of the node's GPUs (`LOCAL_RANK` picks one). The first process to
//! fail ends the node's part: the others are stopped and the failing rank is named.

use std::sync::Arc;

use tacc_exec::{Executor, ExitOutcome, LaunchSpec};
use tacc_proto::AttemptRef;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::error::AttemptError;
use super::execution::{LogLines, launch};
use crate::Shared;

/// One process of the node's share: its global `RANK` and what to launch.
pub(crate) struct RankLaunch {
    pub rank: u32,
    pub spec: LaunchSpec,
    pub lines: LogLines,
    pub record_name: String,
}

/// How the node's processes ended: the outcome of the first that did not succeed (or
/// success when all did), with that process's rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RanksEnded {
    pub outcome: ExitOutcome,
    pub failed_rank: Option<u32>,
}

impl RanksEnded {
    /// An end no single rank is blamed for (one process, or the node's part stopped).
    pub fn whole_node(outcome: ExitOutcome) -> Self {
        RanksEnded {
            outcome,
            failed_rank: None,
        }
    }
}

/// Split the node's CPU and memory limits evenly between `processes` processes; a zero
/// limit (none) stays none.
pub(crate) fn share_of(total: u64, processes: u32) -> u64 {
    if total == 0 {
        0
    } else {
        (total / u64::from(processes.max(1))).max(1)
    }
}

/// Start every process, wait for all of them, and stop the rest as soon as one fails.
pub(crate) async fn run_ranks(
    shared: &Arc<Shared>,
    executor: Arc<dyn Executor>,
    attempt: AttemptRef,
    launches: Vec<RankLaunch>,
    cancel: &CancellationToken,
) -> Result<RanksEnded, AttemptError> {
    let stop_all = cancel.child_token();
    let mut running = JoinSet::new();
    for RankLaunch {
        rank,
        spec,
        lines,
        record_name,
    } in launches
    {
        let shared = shared.clone();
        let executor = executor.clone();
        let stop = stop_all.clone();
        running.spawn(async move {
            let ended = launch(
                &shared,
                executor.as_ref(),
                spec,
                attempt,
                lines,
                &stop,
                &record_name,
            )
            .await;
            (rank, ended)
        });
    }
    let mut first_failure: Option<Result<RanksEnded, AttemptError>> = None;
    while let Some(joined) = running.join_next().await {
        let (rank, ended) = match joined {
            Ok(ended) => ended,
            Err(e) => {
                stop_all.cancel();
                first_failure.get_or_insert(Err(AttemptError::Supervisor(e)));
                continue;
            }
        };
        let failure = match ended {
            Ok(ExitOutcome::Exited(0)) => continue,
            // A process stopped because another failed first is not the cause.
            Ok(ExitOutcome::Cancelled) if stop_all.is_cancelled() && !cancel.is_cancelled() => {
                continue;
            }
            Ok(ExitOutcome::Cancelled) => Ok(RanksEnded::whole_node(ExitOutcome::Cancelled)),
            Ok(outcome) => Ok(RanksEnded {
                outcome,
                failed_rank: Some(rank),
            }),
            Err(source) => Err(AttemptError::RankLaunch { rank, source }),
        };
        if first_failure.is_none() {
            first_failure = Some(failure);
            stop_all.cancel();
        }
    }
    first_failure.unwrap_or(Ok(RanksEnded::whole_node(ExitOutcome::Exited(0))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_shared_evenly_and_none_stays_none() {
        assert_eq!(share_of(4000, 4), 1000);
        assert_eq!(share_of(1000, 3), 333);
        assert_eq!(share_of(0, 8), 0);
        assert_eq!(share_of(1, 8), 1);
        assert_eq!(share_of(2048, 0), 2048);
    }
}
