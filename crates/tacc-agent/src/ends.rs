//! The ends of attempts that the server has not acknowledged yet, kept on disk so that
//! they outlive the agent itself. An embedded cluster (`taccd dev`) loses its agent with
//! its server: without this record, an attempt that finished just before a crash was
//! unknown to the agent's next life, the server marked it lost (`node_restarted`) and ran
//! it again. Now the next life claims it at registration and reports its end again.
//!
//! The record is an append-only file of JSON lines (`ended` with the `finished` report,
//! `acked` with the attempt), rewritten with only the pending ends when the agent starts
//! and whenever it has grown long: two short appends per attempt, no file per attempt.
//! A torn last line (the agent killed mid-write) is skipped. Written without `fsync`: it
//! must survive the agent's process, not the machine (whose attempts die with it anyway).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tacc_proto::{AgentReport, AttemptRef};

/// After this many appended lines the file is rewritten with the pending ends only.
const COMPACT_AFTER: usize = 4096;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    Ended(AgentReport),
    Acked(AttemptRef),
}

/// The pending ends, in memory and on disk.
#[derive(Debug)]
pub(crate) struct EndJournal {
    path: PathBuf,
    file: File,
    pending: BTreeMap<AttemptRef, AgentReport>,
    lines: usize,
}

impl EndJournal {
    /// Open the record at `path`, keeping the ends a previous life left pending.
    pub fn open(path: &Path) -> std::io::Result<EndJournal> {
        let mut pending = BTreeMap::new();
        if let Ok(file) = File::open(path) {
            for line in std::io::BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Entry>(&line) {
                    Ok(Entry::Ended(report)) => {
                        pending.insert(report.attempt(), report);
                    }
                    Ok(Entry::Acked(attempt)) => {
                        pending.remove(&attempt);
                    }
                    Err(_) => {}
                }
            }
        }
        let mut journal = EndJournal {
            path: path.to_path_buf(),
            file: rewrite(path, &pending)?,
            lines: pending.len(),
            pending,
        };
        journal.file.flush()?;
        Ok(journal)
    }

    /// The ends not acknowledged yet (those of a previous life included).
    pub fn pending(&self) -> impl Iterator<Item = (&AttemptRef, &AgentReport)> {
        self.pending.iter()
    }

    pub fn ended(&mut self, report: &AgentReport) -> std::io::Result<()> {
        if self.pending.get(&report.attempt()) == Some(report) {
            return Ok(());
        }
        self.pending.insert(report.attempt(), report.clone());
        self.append(&Entry::Ended(report.clone()))
    }

    pub fn acked(&mut self, attempt: AttemptRef) -> std::io::Result<()> {
        if self.pending.remove(&attempt).is_none() {
            return Ok(());
        }
        if self.lines >= COMPACT_AFTER {
            self.file = rewrite(&self.path, &self.pending)?;
            self.lines = self.pending.len();
            return Ok(());
        }
        self.append(&Entry::Acked(attempt))
    }

    fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
        let mut line = serde_json::to_string(entry).map_err(std::io::Error::other)?;
        line.push('\n');
        // One write per line, so a crash tears at most the last one.
        self.file.write_all(line.as_bytes())?;
        self.lines += 1;
        Ok(())
    }
}

/// Replace the file at `path` with the `pending` ends (through a rename, so a crash
/// leaves the old or the new one) and open it for appending.
fn rewrite(path: &Path, pending: &BTreeMap<AttemptRef, AgentReport>) -> std::io::Result<File> {
    let fresh = path.with_extension("new");
    let mut text = String::new();
    for report in pending.values() {
        text.push_str(
            &serde_json::to_string(&Entry::Ended(report.clone())).map_err(std::io::Error::other)?,
        );
        text.push('\n');
    }
    std::fs::write(&fresh, text)?;
    std::fs::rename(&fresh, path)?;
    std::fs::OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId, Timestamp};
    use tacc_proto::AttemptOutcome;

    fn finished(task: u64) -> AgentReport {
        AgentReport::Finished {
            attempt: AttemptRef {
                task: TaskId(task),
                attempt: AttemptNo(1),
            },
            at: Timestamp::from_millis(task),
            outcome: AttemptOutcome::Exited { code: 0 },
            rank: None,
        }
    }

    #[test]
    fn unacknowledged_ends_outlive_the_journal_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ends.jsonl");
        let mut journal = EndJournal::open(&path).unwrap();
        journal.ended(&finished(1)).unwrap();
        journal.ended(&finished(2)).unwrap();
        journal.acked(finished(1).attempt()).unwrap();
        drop(journal);
        // The agent killed in the middle of a line.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"{\"ended\":{\"kind\":\"fin").unwrap();
        let journal = EndJournal::open(&path).unwrap();
        let pending: Vec<_> = journal.pending().map(|(_, r)| r.clone()).collect();
        assert_eq!(pending, vec![finished(2)]);
        // Reopening rewrote the file with the pending end only.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[test]
    fn a_long_journal_is_compacted_to_what_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ends.jsonl");
        let mut journal = EndJournal::open(&path).unwrap();
        journal.ended(&finished(0)).unwrap();
        for task in 1..=COMPACT_AFTER as u64 {
            journal.ended(&finished(task)).unwrap();
            journal.acked(finished(task).attempt()).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().count() < 8, "{} lines", text.lines().count());
        drop(journal);
        let journal = EndJournal::open(&path).unwrap();
        assert_eq!(journal.pending().count(), 1);
    }
}
