//! Which agent reports count. Never trust the other side: a node's report counts only
//! for an attempt of its own that is current, and an end only while the attempt has not
//! ended; the one exception is a node's own last word (its end and the lines before it)
//! about an attempt it was running when the task moved on without it (another rank ended
//! the attempt, a cancel, a preemption).

use tacc_proto::{AgentReport, AttemptRef};

/// The attempt a report is about, and whether it ends the node's part of it.
pub(in crate::control) fn subject(report: &AgentReport) -> (AttemptRef, bool) {
    match report {
        AgentReport::Log { attempt, .. }
        | AgentReport::RuntimeChosen { attempt, .. }
        | AgentReport::Started { attempt, .. }
        | AgentReport::Resized { attempt, .. }
        | AgentReport::Metrics { attempt, .. } => (*attempt, false),
        AgentReport::Finished { attempt, .. } => (*attempt, true),
        AgentReport::Usage(sample) => (sample.attempt, false),
    }
}

/// Why a report was refused, for the audit trail.
pub(in crate::control) fn rejection(report: &AgentReport) -> String {
    let (_, ending) = subject(report);
    format!(
        "{} report for an attempt this node does not run{}",
        report.kind(),
        if ending {
            " (or that already ended)"
        } else {
            ""
        }
    )
}

/// What becomes of one report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::control) enum Admission {
    /// Applied: it may change the task.
    Apply,
    /// Accepted for its output only: the task has moved on.
    LastWord,
    /// Refused and audited: not this node's, or stale.
    Reject,
}

/// `current`: the attempt is its task's current one, placed on this node (and, for an
/// end, still active). `held`: this node was running it and has not reported its end.
pub(in crate::control) fn admit(current: bool, held: bool) -> Admission {
    match (current, held) {
        (true, _) => Admission::Apply,
        (false, true) => Admission::LastWord,
        (false, false) => Admission::Reject,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_for_the_current_attempt_or_as_the_last_word_of_its_node() {
        assert_eq!(admit(true, true), Admission::Apply);
        assert_eq!(admit(true, false), Admission::Apply);
        assert_eq!(admit(false, true), Admission::LastWord);
        assert_eq!(admit(false, false), Admission::Reject);
    }
}
