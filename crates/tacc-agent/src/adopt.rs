//! Attempts a previous life of this agent started whose execution outlived it (a Slurm
//! job keeps running when the agent on the login node restarts): the agent claims them
//! when it registers, forwards their output from where it stopped, and reports their end.

use std::sync::Arc;

use tacc_exec::RecoveredExecution;
use tacc_proto::{AgentReport, AttemptRef};
use tokio_util::sync::CancellationToken;

use crate::{Shared, now};

pub(crate) fn attempt_of(recovered: &RecoveredExecution) -> AttemptRef {
    AttemptRef {
        task: recovered.task,
        attempt: recovered.attempt,
    }
}

pub(crate) async fn run(
    shared: Arc<Shared>,
    recovered: RecoveredExecution,
    cancel: CancellationToken,
) {
    let attempt = attempt_of(&recovered);
    tracing::info!(
        "resuming task {} attempt {} (node rank {}), still running in the backend",
        attempt.task,
        attempt.attempt,
        recovered.node_rank
    );
    let RecoveredExecution {
        handle,
        mut output,
        node_rank,
        num_nodes,
        ..
    } = recovered;
    let prefix = (num_nodes > 1).then(|| format!("[{node_rank}] "));
    let forwarder = {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some(line) = output.recv().await {
                let text = format!("{}{}\n", prefix.as_deref().unwrap_or(""), line.text);
                shared.reports.send(AgentReport::Log {
                    attempt,
                    text,
                    offset: None,
                });
            }
        })
    };
    let stop = handle.cancel_token();
    let wait = handle.wait();
    tokio::pin!(wait);
    let outcome = tokio::select! {
        outcome = &mut wait => outcome,
        _ = cancel.cancelled() => {
            stop.cancel();
            wait.await
        }
    };
    let _ = forwarder.await;
    shared.reports.send(AgentReport::Finished {
        attempt,
        at: now(),
        outcome: crate::attempt::outcome_of(outcome),
        rank: None,
    });
}
