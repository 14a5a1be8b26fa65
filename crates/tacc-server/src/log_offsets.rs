//! Where each node's output of each attempt has been applied up to, so that a log report
//! delivered twice (the server applied it, its answer was lost, the agent sent the batch
//! again) is appended once — also when the server restarted in between. Agents tag each
//! output report with the byte offset it starts at in that node's output of the attempt;
//! offsets only grow within one life of the agent (`RegisterAgent::life`), so a report at
//! or below the last one applied is a repeat.
//!
//! What was applied is kept in memory and, beside each task's log, in a small record file
//! (`<task>.offsets`, a line per applied report: node, attempt, life, offset), appended
//! right after the log itself: a server that starts again reads it back the first time a
//! node reports on the attempt. A report is marked applied only once its text is in the
//! log, so one whose append failed (a full disk) is taken again when resent.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use tacc_core::{NodeId, TaskId};
use tacc_proto::AttemptRef;

/// More attempts than a server holds at once: past it the memory starts afresh (the
/// record files still answer for what they hold).
const MAX_TRACKED: usize = 100_000;

#[derive(Debug)]
pub(crate) struct LogOffsets {
    /// The logs' directory, where the record files lie.
    dir: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last applied offset per node and attempt, in the node's current life.
    applied: BTreeMap<(NodeId, AttemptRef), u64>,
    /// Each registered node's life.
    lives: BTreeMap<NodeId, u64>,
}

impl LogOffsets {
    pub fn new(dir: PathBuf) -> LogOffsets {
        LogOffsets {
            dir,
            state: Mutex::default(),
        }
    }

    /// Append `node`'s output of `attempt` to the task's log, unless it is a repeat of a
    /// report already applied; marked applied only once it is in the log.
    pub(crate) fn append_once(
        &self,
        logs: &crate::logs::LogBook,
        node: NodeId,
        attempt: AttemptRef,
        text: &str,
        offset: Option<u64>,
    ) -> std::io::Result<()> {
        if !self.is_new(node, attempt, offset) {
            return Ok(());
        }
        logs.append(attempt.task, text)?;
        self.applied(node, attempt, offset);
        Ok(())
    }

    fn record_path(&self, task: TaskId) -> PathBuf {
        self.dir.join(format!("{task}.offsets"))
    }

    /// Whether a log report of `node` for `attempt` starting at `offset` is new. Reports
    /// without an offset (the agent's own notes) are always new.
    pub fn is_new(&self, node: NodeId, attempt: AttemptRef, offset: Option<u64>) -> bool {
        let Some(offset) = offset else {
            return true;
        };
        let mut state = self.state.lock().unwrap();
        let life = state.lives.get(&node).copied().unwrap_or(0);
        if !state.applied.contains_key(&(node, attempt)) {
            if life != 0 {
                if let Some(last) = self.recorded(node, attempt, life) {
                    state.applied.insert((node, attempt), last);
                }
            } else if let Some((life, last)) = self.latest_recorded(node, attempt) {
                // The node registered with another server (a replica that led before this
                // one): its current life is the last one recorded beside the log, and
                // what that server applied is a repeat here too.
                state.lives.insert(node, life);
                state.applied.insert((node, attempt), last);
            }
        }
        state
            .applied
            .get(&(node, attempt))
            .is_none_or(|last| offset > *last)
    }

    /// A report starting at `offset` is in the log now.
    pub fn applied(&self, node: NodeId, attempt: AttemptRef, offset: Option<u64>) {
        let Some(offset) = offset else {
            return;
        };
        let mut state = self.state.lock().unwrap();
        if state.applied.len() >= MAX_TRACKED {
            state.applied.clear();
        }
        state.applied.insert((node, attempt), offset);
        let life = state.lives.get(&node).copied().unwrap_or(0);
        if life == 0 {
            return;
        }
        let line = format!("{} {} {life} {offset}\n", node.0, attempt.attempt.0);
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.record_path(attempt.task))
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = written {
            // The memory still answers until this server stops.
            tracing::warn!(
                "cannot record the applied output of task {}: {e}",
                attempt.task
            );
        }
    }

    /// The node registered. An agent in a new life counts its output from zero, so what
    /// was applied in an earlier life no longer says what is a repeat.
    pub fn registered(&self, node: NodeId, life: u64) {
        let mut state = self.state.lock().unwrap();
        if life == 0 || state.lives.get(&node) != Some(&life) {
            state.applied.retain(|(n, _), _| *n != node);
        }
        state.lives.insert(node, life);
    }

    /// The life of the node's last record for the attempt, and the last offset applied in
    /// it.
    fn latest_recorded(&self, node: NodeId, attempt: AttemptRef) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(self.record_path(attempt.task)).ok()?;
        let mut latest: Option<(u64, u64)> = None;
        for line in text.lines() {
            let Ok(fields) = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<Vec<u64>, _>>()
            else {
                continue;
            };
            if let [n, a, life, offset] = fields[..]
                && n == node.0
                && a == u64::from(attempt.attempt.0)
            {
                latest = match latest {
                    Some((l, last)) if l == life => Some((life, last.max(offset))),
                    _ => Some((life, offset)),
                };
            }
        }
        latest
    }

    /// The last offset the record file holds for the node's attempt in `life`.
    fn recorded(&self, node: NodeId, attempt: AttemptRef, life: u64) -> Option<u64> {
        let text = std::fs::read_to_string(self.record_path(attempt.task)).ok()?;
        text.lines()
            .filter_map(|line| {
                let fields: Vec<u64> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                match fields[..] {
                    [n, a, l, offset]
                        if n == node.0 && a == u64::from(attempt.attempt.0) && l == life =>
                    {
                        Some(offset)
                    }
                    _ => None,
                }
            })
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::AttemptNo;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn attempt() -> AttemptRef {
        AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        }
    }

    /// Apply a report if it is new, as the control plane does; whether it was.
    fn apply(offsets: &LogOffsets, node: NodeId, offset: Option<u64>) -> bool {
        let new = offsets.is_new(node, attempt(), offset);
        if new {
            offsets.applied(node, attempt(), offset);
        }
        new
    }

    #[test]
    fn a_repeated_report_is_dropped_and_a_new_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = LogOffsets::new(dir.path().to_path_buf());
        offsets.registered(A, 7);
        offsets.registered(B, 8);
        assert!(apply(&offsets, A, Some(0)));
        assert!(!apply(&offsets, A, Some(0)), "the same report again");
        assert!(apply(&offsets, A, Some(120)));
        assert!(!apply(&offsets, A, Some(0)), "an older one, late");
        assert!(apply(&offsets, B, Some(0)), "another node's output");
        assert!(apply(&offsets, A, None), "the agent's own notes");
        assert!(apply(&offsets, A, None));
    }

    #[test]
    fn a_restarted_server_still_knows_what_it_applied() {
        let dir = tempfile::tempdir().unwrap();
        let before = LogOffsets::new(dir.path().to_path_buf());
        before.registered(A, 7);
        assert!(apply(&before, A, Some(0)));
        assert!(apply(&before, A, Some(300)));
        drop(before);
        let after = LogOffsets::new(dir.path().to_path_buf());
        after.registered(A, 7);
        assert!(!apply(&after, A, Some(300)), "resent across the restart");
        assert!(apply(&after, A, Some(600)));
    }

    #[test]
    fn a_replica_taking_over_knows_what_the_one_before_applied() {
        let dir = tempfile::tempdir().unwrap();
        let old_leader = LogOffsets::new(dir.path().to_path_buf());
        old_leader.registered(A, 7);
        assert!(apply(&old_leader, A, Some(0)));
        assert!(apply(&old_leader, A, Some(300)));
        // The agent registered with the old leader only; it resends its last batch to
        // the new one, sharing the logs directory.
        let new_leader = LogOffsets::new(dir.path().to_path_buf());
        assert!(
            !apply(&new_leader, A, Some(300)),
            "resent after the failover"
        );
        assert!(apply(&new_leader, A, Some(600)));
        let later = LogOffsets::new(dir.path().to_path_buf());
        assert!(!apply(&later, A, Some(600)), "and kept for the next one");
    }

    #[test]
    fn a_new_life_of_the_agent_counts_from_zero() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = LogOffsets::new(dir.path().to_path_buf());
        offsets.registered(A, 7);
        assert!(apply(&offsets, A, Some(500)));
        offsets.registered(A, 7);
        assert!(
            !apply(&offsets, A, Some(500)),
            "the same life registered again"
        );
        offsets.registered(A, 9);
        assert!(apply(&offsets, A, Some(0)), "a restarted agent");
        let restarted = LogOffsets::new(dir.path().to_path_buf());
        restarted.registered(A, 9);
        assert!(!apply(&restarted, A, Some(0)));
        assert!(apply(&restarted, A, Some(1)));
    }

    #[test]
    fn a_report_not_marked_applied_is_taken_when_resent() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = LogOffsets::new(dir.path().to_path_buf());
        offsets.registered(A, 7);
        // Its append failed: it was never marked applied.
        assert!(offsets.is_new(A, attempt(), Some(0)));
        assert!(offsets.is_new(A, attempt(), Some(0)));
    }

    #[test]
    fn an_agent_without_a_life_is_new_at_every_registration() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = LogOffsets::new(dir.path().to_path_buf());
        offsets.registered(A, 0);
        assert!(apply(&offsets, A, Some(0)));
        assert!(!apply(&offsets, A, Some(0)));
        offsets.registered(A, 0);
        assert!(apply(&offsets, A, Some(0)));
    }
}
