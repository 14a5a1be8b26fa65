//! One script on one runtime, to its end: the executor starts it, its process group is
//! recorded (so a restarted agent can kill what it left), its usage is sampled, and its
//! output lines are forwarded into the task's log — masked and, in a multi-process
//! attempt, prefixed with the rank — every one of them before its end is returned.

use std::sync::Arc;
use std::time::Instant;

use tacc_exec::{ExecError, Executor, ExitOutcome, LaunchSpec, OutputLine};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::report;
use crate::Shared;
use crate::now;
use crate::orphans::GroupRecord;
use crate::secrets::SecretMask;

/// How a task's output lines are written into its log: the node's prefix in a
/// multi-node attempt, and the task's secret values masked.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogLines {
    pub prefix: Option<String>,
    pub mask: Arc<SecretMask>,
}

impl LogLines {
    fn format(&self, line: &str) -> String {
        let line = self.mask.apply(line);
        let mut text = String::with_capacity(line.len() + 8);
        if let Some(prefix) = &self.prefix {
            text.push_str(prefix);
        }
        text.push_str(&line);
        text.push('\n');
        text
    }
}

/// Run one script to its end, forwarding its output; `Err` when it could not start.
pub(crate) async fn launch(
    shared: &Arc<Shared>,
    executor: &dyn Executor,
    spec: LaunchSpec,
    attempt: AttemptRef,
    lines: LogLines,
    cancel: &CancellationToken,
    record_name: &str,
) -> Result<ExitOutcome, ExecError> {
    let (tx, mut rx) = mpsc::unbounded_channel::<OutputLine>();
    let handle = executor.launch(spec, tx).await?;
    let _record = handle.pid.and_then(|pid| {
        GroupRecord::write(&shared.config.data_dir.join("run"), record_name, pid).ok()
    });
    if let Some(reader) = handle.usage_reader() {
        shared
            .sampling
            .attach(attempt, record_name, reader, Instant::now());
    }
    if let Some(resizer) = handle.resizer() {
        shared.resizing.attach(attempt, record_name, resizer);
    }
    let output_clock = shared.sampling.output_clock(attempt);
    let forwarder = {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if let Some(clock) = &output_clock {
                    clock.store(now().0, std::sync::atomic::Ordering::Relaxed);
                }
                let text = lines.format(&line.text);
                report(&shared, AgentReport::Log { attempt, text });
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
    shared.sampling.detach(attempt, record_name);
    shared.resizing.detach(attempt, record_name);
    // Every line is forwarded before the attempt's end is reported.
    let _ = forwarder.await;
    Ok(outcome)
}

/// How an execution's end is reported as the attempt's.
pub(crate) fn outcome_of(outcome: ExitOutcome) -> AttemptOutcome {
    match outcome {
        ExitOutcome::Exited(code) => AttemptOutcome::Exited { code },
        ExitOutcome::Signalled(signal) => AttemptOutcome::Signalled { signal },
        ExitOutcome::TimeLimit => AttemptOutcome::TimeLimit,
        ExitOutcome::Cancelled => AttemptOutcome::Cancelled,
        ExitOutcome::Infrastructure { reason, message } => {
            AttemptOutcome::LaunchFailed { reason, message }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_masked_then_prefixed() {
        let secrets = ["s3cr3t-value".to_string()];
        let lines = LogLines {
            prefix: Some("[1] ".into()),
            mask: Arc::new(SecretMask::new(&secrets)),
        };
        assert_eq!(lines.format("key=s3cr3t-value"), "[1] key=***\n");
        assert_eq!(LogLines::default().format("plain"), "plain\n");
    }
}
