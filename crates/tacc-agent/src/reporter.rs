//! Sends the agent's reports to the server in the order they happened, batching whatever
//! piled up while the previous request was in flight, and retrying until it is accepted:
//! a server restart delays reports, it never drops them.

use std::sync::Arc;
use std::time::Duration;

use tacc_proto::AgentReport;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Backoff, Shared};

/// Reports sent in one request at most.
const MAX_BATCH: usize = 4096;

pub(crate) type ReportSender = mpsc::UnboundedSender<AgentReport>;
pub(crate) type ReportReceiver = mpsc::UnboundedReceiver<AgentReport>;

pub(crate) fn channel() -> (ReportSender, ReportReceiver) {
    mpsc::unbounded_channel()
}

/// Merge consecutive log reports of the same attempt into one.
fn coalesce(batch: Vec<AgentReport>) -> Vec<AgentReport> {
    let mut merged: Vec<AgentReport> = Vec::with_capacity(batch.len());
    for report in batch {
        if let (
            Some(AgentReport::Log {
                attempt: last,
                text: so_far,
            }),
            AgentReport::Log { attempt, text },
        ) = (merged.last_mut(), &report)
        {
            if last == attempt {
                so_far.push_str(text);
                continue;
            }
        }
        merged.push(report);
    }
    merged
}

pub(crate) async fn run(shared: Arc<Shared>, mut rx: ReportReceiver, shutdown: CancellationToken) {
    loop {
        let first = tokio::select! {
            report = rx.recv() => match report {
                Some(report) => report,
                None => return,
            },
            _ = shutdown.cancelled() => {
                flush_on_shutdown(&shared, &mut rx).await;
                return;
            }
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(report) => batch.push(report),
                Err(_) => break,
            }
        }
        let batch = coalesce(batch);
        let mut backoff = Backoff::default();
        loop {
            let Some(node) = shared.node() else {
                if backoff.wait(&shutdown).await.is_err() {
                    return;
                }
                continue;
            };
            match shared.client.agent_reports(node, batch.clone()).await {
                Ok(ack) => {
                    shared.lease.renewed(std::time::Instant::now());
                    let samples = batch
                        .iter()
                        .filter(|r| matches!(r, AgentReport::Usage(_)))
                        .count();
                    shared.sampling.delivered(samples);
                    if ack.rejected > 0 {
                        tracing::warn!(
                            "the server rejected {} of {} report(s) as not belonging to this \
                             node's current attempts",
                            ack.rejected,
                            batch.len()
                        );
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot deliver {} report(s) to the server, will retry: {e}",
                        batch.len()
                    );
                    if backoff.wait(&shutdown).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// One bounded attempt to deliver what is queued when the agent stops.
async fn flush_on_shutdown(shared: &Shared, rx: &mut ReportReceiver) {
    let mut batch = Vec::new();
    while let Ok(report) = rx.try_recv() {
        batch.push(report);
    }
    if let (Some(node), false) = (shared.node(), batch.is_empty()) {
        let send = shared.client.agent_reports(node, coalesce(batch));
        let _ = tokio::time::timeout(Duration::from_secs(2), send).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId, Timestamp};
    use tacc_proto::AttemptRef;

    #[test]
    fn consecutive_logs_of_one_attempt_merge_in_order() {
        let a = AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        };
        let b = AttemptRef {
            task: TaskId(2),
            attempt: AttemptNo(1),
        };
        let log = |attempt, text: &str| AgentReport::Log {
            attempt,
            text: text.to_string(),
        };
        let merged = coalesce(vec![
            log(a, "1\n"),
            log(a, "2\n"),
            log(b, "x\n"),
            AgentReport::Started {
                attempt: a,
                at: Timestamp(5),
            },
            log(a, "3\n"),
        ]);
        assert_eq!(
            merged,
            vec![
                log(a, "1\n2\n"),
                log(b, "x\n"),
                AgentReport::Started {
                    attempt: a,
                    at: Timestamp(5)
                },
                log(a, "3\n"),
            ]
        );
    }
}
