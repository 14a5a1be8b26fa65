//! One script on one runtime, to its end: the executor starts it, its process group is
//! recorded (so a restarted agent can kill what it left), its usage is sampled, and its
//! output lines are forwarded into the task's log — masked and, in a multi-process
//! attempt, prefixed with the rank — every one of them before its end is returned.
//! A line longer than [`tacc_exec::MAX_LINE_BYTES`] arrives in pieces and is written as
//! several log lines, all but the last ending with [`LINE_CONTINUES`]; a piece is cut
//! where no secret value straddles the cut, so masking sees every value whole.

use std::sync::Arc;
use std::time::Instant;

use tacc_exec::{ExecError, Executor, ExitOutcome, LaunchSpec, OutputLine, Stream};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};
use tokio_util::sync::CancellationToken;

use super::report;
use crate::Shared;
use crate::node_secrets::NodeSecrets;
use crate::now;
use crate::orphans::GroupRecord;
use crate::secrets::SecretMask;

/// How a task's output lines are written into its log: the node's prefix in a
/// multi-node attempt, and the secret values of every attempt on the node masked.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogLines {
    pub prefix: Option<String>,
    pub secrets: Arc<NodeSecrets>,
}

/// What ends each log line but the last of an output line that was too long for one.
pub(crate) const LINE_CONTINUES: &str = " [tacc: line continues]";

impl LogLines {
    fn format(&self, line: &str) -> String {
        self.render(&self.secrets.mask(), line, "\n")
    }

    fn render(&self, mask: &SecretMask, line: &str, end: &str) -> String {
        let line = mask.apply(line);
        let mut text = String::with_capacity(line.len() + end.len() + 8);
        if let Some(prefix) = &self.prefix {
            text.push_str(prefix);
        }
        text.push_str(&line);
        text.push_str(end);
        text
    }
}

/// Log text from an execution's output lines, holding back the unwritten end of each
/// stream's long line.
#[derive(Debug)]
struct LogText {
    lines: LogLines,
    /// Per stream (stdout, stderr): the part of a long line not written yet.
    carry: [String; 2],
}

impl LogText {
    fn new(lines: LogLines) -> Self {
        LogText {
            lines,
            carry: [String::new(), String::new()],
        }
    }

    /// The log text for `line`, if any is ready.
    fn next(&mut self, line: OutputLine) -> Option<String> {
        let slot = &mut self.carry[match line.stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }];
        if !line.partial {
            if slot.is_empty() {
                return Some(self.lines.format(&line.text));
            }
            slot.push_str(&line.text);
            let whole = std::mem::take(slot);
            return Some(self.lines.format(&whole));
        }
        slot.push_str(&line.text);
        let mask = self.lines.secrets.mask();
        // Keep enough back that a value starting near the end is seen whole next time.
        let keep = mask.longest().saturating_sub(1);
        if slot.len() <= keep {
            return None;
        }
        let mut cut = slot.len() - keep;
        while !slot.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = mask.safe_cut(slot, cut);
        if cut == 0 {
            return None;
        }
        let rest = slot.split_off(cut);
        let piece = std::mem::replace(slot, rest);
        Some(
            self.lines
                .render(&mask, &piece, &format!("{LINE_CONTINUES}\n")),
        )
    }

    /// What is left when the output ends.
    fn finish(self) -> impl Iterator<Item = String> {
        let lines = self.lines;
        self.carry
            .into_iter()
            .filter(|rest| !rest.is_empty())
            .map(move |rest| lines.format(&rest))
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
    let (tx, mut rx) = tacc_exec::output_channel();
    let phase = spec.phase;
    let handle = executor.launch(spec, tx).await?;
    // A session enters the task's run, never its setup.
    let enterable = handle.entry().filter(|_| phase == tacc_exec::Phase::Run);
    if let Some(entry) = &enterable {
        shared.entries.attach(attempt, record_name, entry.clone());
    }
    let record = handle.pid.and_then(|pid| {
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
    // The output is forwarded beside the wait, in this same task (no task spawned and
    // woken per execution); it ends when the executor closes the output, which it does
    // only after the last line, before it says how the execution ended.
    let forwarding = async {
        let send = |text| {
            report(
                shared,
                AgentReport::Log {
                    attempt,
                    text,
                    offset: None,
                },
            )
        };
        let mut log = LogText::new(lines);
        while let Some(line) = rx.recv().await {
            if let Some(clock) = &output_clock {
                clock.store(now().0, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(text) = log.next(line) {
                send(text);
            }
        }
        for text in log.finish() {
            send(text);
        }
    };
    let stop = handle.cancel_token();
    let waiting = async {
        let wait = handle.wait();
        tokio::pin!(wait);
        tokio::select! {
            outcome = &mut wait => outcome,
            _ = cancel.cancelled() => {
                stop.cancel();
                wait.await
            }
        }
    };
    // Every line is forwarded before the attempt's end is reported.
    let (outcome, ()) = tokio::join!(waiting, forwarding);
    shared.sampling.detach(attempt, record_name);
    shared.resizing.detach(attempt, record_name);
    if enterable.is_some() {
        shared.entries.detach(attempt, record_name);
    }
    // Killed by the watchdog while this agent was stopped: the node's fault, not the task's.
    if record.as_ref().is_some_and(|record| record.fenced()) {
        shared.fenced.lock().unwrap().insert(attempt);
        report(
            shared,
            AgentReport::Log {
                attempt,
                text: "tacc: this node's agent stopped answering; its watchdog stopped the \
                       attempt here so that it never runs twice\n"
                    .into(),
                offset: None,
            },
        );
    }
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
        let (secrets, _held) = NodeSecrets::fixed(&["s3cr3t-value".to_string()]);
        let lines = LogLines {
            prefix: Some("[1] ".into()),
            secrets,
        };
        assert_eq!(lines.format("key=s3cr3t-value"), "[1] key=***\n");
        assert_eq!(LogLines::default().format("plain"), "plain\n");
    }

    fn piece(text: &str, partial: bool) -> OutputLine {
        OutputLine {
            stream: Stream::Stdout,
            text: text.into(),
            partial,
        }
    }

    #[test]
    fn a_long_line_is_written_in_marked_pieces_with_secrets_masked_across_cuts() {
        let (secrets, _held) = NodeSecrets::fixed(&["s3cr3t-value".to_string()]);
        let mut log = LogText::new(LogLines {
            prefix: None,
            secrets,
        });
        // The secret straddles the cut between the first and second piece.
        let mut written: Vec<String> = [
            piece("aaaa s3cr3", true),
            piece("t-value bbbb", true),
            piece(" end", false),
        ]
        .into_iter()
        .filter_map(|line| log.next(line))
        .collect();
        written.extend(log.finish());
        let text = written.concat();
        assert!(!text.contains("s3cr3"), "{text}");
        assert_eq!(
            text.replace(&format!("{LINE_CONTINUES}\n"), ""),
            "aaaa *** bbbb end\n"
        );
        assert!(written.iter().all(|w| w.ends_with('\n')), "{written:?}");
    }
}
