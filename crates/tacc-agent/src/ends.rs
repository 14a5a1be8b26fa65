//! Ends of attempts recorded on disk until the server has acknowledged them
//! (`DATA/ends/TASK-ATTEMPT.json`, each a `finished` report). An agent that stops before
//! its reports got through — the server was away, the disk was full, `tcloud down` came
//! first — finds them when it starts again: it claims those attempts when it registers,
//! never starts them again, and reports their end, so the server marks them finished,
//! never `lost` and run a second time.
//!
//! The room for a record is taken when the attempt starts ([`RECORD_BYTES`] of blanks),
//! and its end is written over it in place: an attempt that ends while the disk is full
//! (perhaps filled by the attempt itself) still has its end recorded.

use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use tacc_proto::{AgentReport, AttemptRef};

/// The room reserved for one end (an end with a long message may take more, then it is
/// written as a new file).
const RECORD_BYTES: usize = 4096;

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
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.iter().all(u8::is_ascii_whitespace) {
                // Room reserved for an attempt that had not ended.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match serde_json::from_slice::<AgentReport>(&bytes).ok() {
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

    /// Take the room for the end of `attempt`, which starts now.
    pub(crate) fn reserve(&self, attempt: AttemptRef) {
        let path = self.path(attempt);
        let reserved = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| {
                file.write_all(&[b' '; RECORD_BYTES])?;
                file.sync_data()
            });
        if let Err(e) = reserved {
            let _ = std::fs::remove_file(&path);
            tracing::warn!(
                "cannot reserve room for the end of task {} attempt {} in {} ({e}); it is \
                 recorded when the attempt ends, if there is room then",
                attempt.task,
                attempt.attempt,
                self.dir.display()
            );
        }
    }

    /// Write `bytes` over the room reserved at `path`; `false` when there is none.
    fn write_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
        let file = match std::fs::OpenOptions::new().write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if bytes.len() > RECORD_BYTES || file.metadata()?.len() < RECORD_BYTES as u64 {
            return Ok(false);
        }
        let mut padded = bytes.to_vec();
        padded.resize(RECORD_BYTES, b' ');
        file.write_all_at(&padded, 0)?;
        file.sync_data()?;
        Ok(true)
    }

    /// Keep `end` (a `finished` report) until [`EndRecords::delivered`], in the room
    /// reserved for it where there is some. A record that cannot be written leaves the
    /// end in memory only: it is still delivered unless the agent stops first, and the
    /// log says so.
    pub(crate) fn record(&self, end: &AgentReport) {
        let attempt = AgentReport::attempt(end);
        let path = self.path(attempt);
        let written = serde_json::to_vec(end)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                if Self::write_in_place(&path, &bytes)? {
                    return Ok(());
                }
                crate::write_private(&path, &bytes)
            });
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
        records.reserve(AgentReport::attempt(&end(1)));
        records.record(&end(1));
        records.record(&end(2));
        // An attempt that started and had not ended.
        records.reserve(AgentReport::attempt(&end(5)));
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

#[cfg(test)]
mod full_disk_tests {
    use super::*;

    /// Whether this process may mount (root with CAP_SYS_ADMIN).
    fn tmpfs(size: &str) -> Option<tempfile::TempDir> {
        let dir = tempfile::tempdir().ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(dir)
    }

    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }

    #[test]
    fn an_end_is_recorded_in_its_reserved_room_on_a_full_disk() {
        let Some(volume) = tmpfs("1m") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root and must be able to mount a tmpfs"
            );
            eprintln!(
                "######## SKIPPED an_end_is_recorded_in_its_reserved_room_on_a_full_disk: cannot mount a tmpfs (not root?)"
            );
            return;
        };
        let _unmount = Unmount(volume.path());
        let (records, _) = EndRecords::open(volume.path().join("ends")).unwrap();
        let attempt = AttemptRef {
            task: tacc_core::TaskId(9),
            attempt: tacc_core::AttemptNo(1),
        };
        records.reserve(attempt);
        // The attempt fills the disk.
        let fill = std::fs::File::create(volume.path().join("fill")).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while (&fill).write_all(&chunk).is_ok() {}
        let end = AgentReport::Finished {
            attempt,
            at: tacc_core::Timestamp(5),
            outcome: tacc_proto::AttemptOutcome::Exited { code: 0 },
            rank: None,
        };
        records.record(&end);
        let (_, found) = EndRecords::open(volume.path().join("ends")).unwrap();
        assert_eq!(found, [end]);
    }
}
