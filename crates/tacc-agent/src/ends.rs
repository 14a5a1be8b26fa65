//! Ends of attempts recorded on disk until the server has acknowledged them
//! (`DATA/ends/TASK-ATTEMPT.json`, each a `finished` report). An agent that stops before
//! its reports got through — the server was away, the disk was full, `tcloud down` came
//! first — finds them when it starts again: it claims those attempts when it registers,
//! never starts them again, and reports their end, so the server marks them finished,
//! never `lost` and run a second time.

use std::path::{Path, PathBuf};

use tacc_proto::{AgentReport, AttemptRef};

#[derive(Debug)]
pub(crate) struct EndRecords {
    dir: PathBuf,
}

impl EndRecords {
    /// The records under `dir` (created when missing), and the ends they hold.
    pub(crate) fn open(dir: PathBuf) -> std::io::Result<(EndRecords, Vec<AgentReport>)> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let mut ends = Vec::new();
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                // A write cut short (`.partial`) recorded nothing.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<AgentReport>(&bytes).ok())
            {
                Some(end @ AgentReport::Finished { .. }) => ends.push(end),
                _ => {
                    tracing::warn!("ignoring the unreadable end record {}", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        ends.sort_by_key(AgentReport::attempt);
        Ok((EndRecords { dir }, ends))
    }

    fn path(&self, attempt: AttemptRef) -> PathBuf {
        self.dir
            .join(format!("{}-{}.json", attempt.task, attempt.attempt))
    }

    /// Keep `end` (a `finished` report) until [`EndRecords::delivered`]. A record that
    /// cannot be written (the disk is full) leaves the end in memory only: it is still
    /// delivered unless the agent stops first, and the log says so.
    pub(crate) fn record(&self, end: &AgentReport) {
        let attempt = AgentReport::attempt(end);
        let written = serde_json::to_vec(end)
            .map_err(std::io::Error::other)
            .and_then(|bytes| crate::write_private(&self.path(attempt), &bytes));
        if let Err(e) = written {
            tracing::warn!(
                "cannot record the end of task {} attempt {} in {} ({e}); it is kept in memory \
                 until the server takes it",
                attempt.task,
                attempt.attempt,
                self.dir.display()
            );
        }
    }

    /// The server has answered for the end of `attempt`.
    pub(crate) fn delivered(&self, attempt: AttemptRef) {
        let _ = std::fs::remove_file(self.path(attempt));
    }
}

/// Where an agent with data directory `data_dir` keeps its end records.
pub(crate) fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join("ends")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId, Timestamp};
    use tacc_proto::AttemptOutcome;

    fn end(task: u64) -> AgentReport {
        AgentReport::Finished {
            attempt: AttemptRef {
                task: TaskId(task),
                attempt: AttemptNo(1),
            },
            at: Timestamp(5),
            outcome: AttemptOutcome::Exited { code: 0 },
            rank: None,
        }
    }

    #[test]
    fn ends_outlive_the_agent_until_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let (records, found) = EndRecords::open(dir.path().join("ends")).unwrap();
        assert!(found.is_empty());
        records.record(&end(1));
        records.record(&end(2));
        records.delivered(AgentReport::attempt(&end(1)));
        std::fs::write(dir.path().join("ends/3-1.json.partial"), b"{").unwrap();
        std::fs::write(dir.path().join("ends/4-1.json"), b"not json").unwrap();
        // The next life of the agent.
        let (_, found) = EndRecords::open(dir.path().join("ends")).unwrap();
        assert_eq!(found, [end(2)]);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("ends"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["2-1.json"]);
    }
}
