//! Which version of the node's desired work the agent applied last, when the work
//! arrives on two paths: the work poll's answer, and a report batch's answer (the server
//! hands the node the work that the batch's ends made room for — a short task's end and
//! the next task's start then take one exchange, not a report and a poll answer).
//!
//! Versions only grow within one registration of the node with one server life, so an
//! answer older than what was applied (a poll answered just before a report batch's
//! answer overtook it) is dropped, never applied over newer work: the set would stop
//! attempts that the newer one started. Across registrations versions mean nothing to
//! each other: the poll loop starts afresh (`registered`), and work a report batch's
//! answer carries from before is dropped (its `generation` is no longer current).
//!
//! Beside it, what the reporter asks with ([`AskWork`]) and hands the poll loop
//! ([`HandedWork`]).

use std::sync::{Arc, Mutex};

use tacc_proto::{AttemptRef, WorkSince};
use tokio::sync::mpsc::UnboundedSender;

/// The work the agent applied last, and which registration it came from.
#[derive(Debug, Default)]
pub(crate) struct WorkVersion {
    /// Counts registrations: work handed under an earlier one is not applied.
    generation: u64,
    /// The version applied last in this registration (none yet).
    applied: Option<u64>,
}

/// Where an answer carrying the node's desired work came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The work poll's answer (the poll loop: one at a time, in order).
    Poll,
    /// A report batch's answer, asked for under `generation` (see [`WorkVersion::since`]).
    Report { generation: u64 },
}

impl WorkVersion {
    /// The node registered (again): what it applied before means nothing to the server
    /// now.
    pub(crate) fn registered(&mut self) {
        self.generation += 1;
        self.applied = None;
    }

    /// The version a poll says the agent has.
    pub(crate) fn after(&self) -> Option<u64> {
        self.applied
    }

    /// What a report batch sends to ask for newer work: the version applied and what runs
    /// (taken under the same lock as the version, so every attempt that version handed
    /// and that has not ended is listed), and the generation to hand the answer back
    /// under. Nothing before the poll loop applied work in this registration.
    pub(crate) fn since(
        &self,
        running: impl Iterator<Item = AttemptRef>,
    ) -> Option<(u64, WorkSince)> {
        let after = self.applied?;
        Some((
            self.generation,
            WorkSince {
                after: Some(after),
                running: running.collect(),
            },
        ))
    }

    /// Whether work of `version` that arrived on `path` is to be applied (and if so,
    /// it is taken as applied): only newer work of the current registration — a poll's
    /// first answer after registering whatever its version.
    pub(crate) fn take(&mut self, path: Path, version: u64) -> bool {
        if let Path::Report { generation } = path
            && (generation != self.generation || self.applied.is_none())
        {
            return false;
        }
        if self.applied.is_some_and(|applied| version <= applied) {
            return false;
        }
        self.applied = Some(version);
        true
    }
}

/// The node's desired work, carried by a report batch's answer, for the poll loop to
/// apply (`handed_work`).
#[derive(Debug)]
pub(crate) struct HandedWork {
    /// The registration the batch asked under.
    pub generation: u64,
    pub work: tacc_proto::DesiredWork,
}

/// Where a delivered batch asks for the node's newer work and hands it on.
pub(crate) struct AskWork {
    pub attempts: Arc<Mutex<crate::Attempts>>,
    pub handed: UnboundedSender<HandedWork>,
}

impl AskWork {
    /// The version applied and what runs, as of now.
    pub(crate) fn since(&self) -> Option<(u64, tacc_proto::WorkSince)> {
        let attempts = self.attempts.lock().unwrap();
        attempts.work.since(attempts.running.keys().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    #[test]
    fn newer_work_is_applied_from_either_path_and_older_work_never() {
        let mut work = WorkVersion::default();
        work.registered();
        assert_eq!(work.since([].into_iter()), None, "nothing to ask after yet");
        let report = Path::Report { generation: 1 };
        assert!(!work.take(report, 5), "before the poll's first answer");
        assert!(work.take(Path::Poll, 3));
        assert_eq!(work.after(), Some(3));
        assert!(work.take(report, 5), "a report batch's answer, newer");
        assert!(
            !work.take(Path::Poll, 4),
            "a poll answered before it, arriving late"
        );
        assert!(!work.take(Path::Poll, 5), "the same version again");
        assert!(!work.take(report, 5));
        assert_eq!(work.after(), Some(5));
        assert!(work.take(Path::Poll, 6));
        let (generation, since) = work.since([attempt(1), attempt(2)].into_iter()).unwrap();
        assert_eq!(generation, 1);
        assert_eq!(
            since,
            WorkSince {
                after: Some(6),
                running: vec![attempt(1), attempt(2)],
            }
        );
    }

    #[test]
    fn a_new_registration_starts_afresh_and_drops_what_was_asked_before_it() {
        let mut work = WorkVersion::default();
        work.registered();
        assert!(work.take(Path::Poll, 40));
        let (before, _) = work.since([].into_iter()).unwrap();
        // The server restarted: versions begin again, low.
        work.registered();
        assert_eq!(work.after(), None);
        assert!(work.take(Path::Poll, 1), "the new life's first answer");
        assert!(
            !work.take(Path::Report { generation: before }, 41),
            "asked of the previous life"
        );
        assert_eq!(work.after(), Some(1));
        let (now, _) = work.since([].into_iter()).unwrap();
        assert!(work.take(Path::Report { generation: now }, 2));
    }
}
