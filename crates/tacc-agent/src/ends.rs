//! Ends of attempts recorded on disk until the server has acknowledged them (each a
//! `finished` report, in `DATA/ends/slot-N.end`). An agent that stops before its reports
//! got through — the server was away, the disk was full, `tcloud down` came first —
//! finds them when it starts again: it claims those attempts when it registers, never
//! starts them again, and reports their end, so the server marks them finished, never
//! `lost` and run a second time.
//!
//! A slot is taken when the attempt starts ([`RECORD_BYTES`] of blanks) and the end is
//! written over it in place: an attempt that ends while the disk is full (perhaps filled
//! by the attempt itself) still has its end recorded. Slots are blanked and reused, never
//! deleted: a file created and deleted per attempt costs ext4 a search for a free inode
//! each time (see `orphans`). Records are not synced: they outlive the agent's process,
//! not a crash of the machine (whose running attempts are lost anyway).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tacc_proto::{AgentReport, AttemptRef};

/// The room of one slot; an end with a longer message than fits is written past it.
const RECORD_BYTES: usize = 4096;
const BLANK: [u8; RECORD_BYTES] = [b' '; RECORD_BYTES];

#[derive(Debug)]
pub(crate) struct EndRecords {
    dir: PathBuf,
    slots: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    /// The slot of each attempt that started (or ended) here and is not acknowledged.
    taken: BTreeMap<AttemptRef, u32>,
    /// Blank slots, ready for the next attempt.
    free: Vec<u32>,
    /// The first slot number never used.
    next: u32,
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
        let mut slots = Slots::default();
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let path = entry.path();
            let slot = path
                .file_name()
                .and_then(|name| name.to_str()?.strip_prefix("slot-")?.strip_suffix(".end"))
                .and_then(|n| n.parse::<u32>().ok());
            let Some(slot) = slot else {
                let _ = std::fs::remove_file(&path);
                continue;
            };
            slots.next = slots.next.max(slot + 1);
            let bytes = std::fs::read(&path).unwrap_or_default();
            let text = bytes.trim_ascii();
            let end = match serde_json::from_slice::<AgentReport>(text) {
                Ok(end @ AgentReport::Finished { .. }) => Some(end),
                // Blank: reserved for an attempt that had not ended (it is lost).
                _ if text.is_empty() => None,
                _ => {
                    tracing::warn!("ignoring the unreadable end record {}", path.display());
                    None
                }
            };
            match end {
                Some(end) => {
                    slots.taken.insert(AgentReport::attempt(&end), slot);
                    ends.push(end);
                }
                None if bytes.len() == RECORD_BYTES && text.is_empty() => slots.free.push(slot),
                None if blank(&path).is_ok() => slots.free.push(slot),
                None => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        ends.sort_by_key(AgentReport::attempt);
        let records = EndRecords {
            dir,
            slots: Mutex::new(slots),
        };
        Ok((records, ends))
    }

    fn path(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("slot-{slot}.end"))
    }

    /// The slot of `attempt`, taking one (a blank one, or a new one) when it has none;
    /// `true` when it was taken now.
    fn slot_of(&self, attempt: AttemptRef) -> (u32, bool) {
        let mut slots = self.slots.lock().unwrap();
        if let Some(slot) = slots.taken.get(&attempt) {
            return (*slot, false);
        }
        let slot = slots.free.pop().unwrap_or_else(|| {
            slots.next += 1;
            slots.next - 1
        });
        slots.taken.insert(attempt, slot);
        (slot, true)
    }

    /// Take the room for the end of `attempt`, which starts now.
    pub(crate) fn reserve(&self, attempt: AttemptRef) {
        let (slot, _) = self.slot_of(attempt);
        let path = self.path(slot);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == RECORD_BYTES as u64) {
            return;
        }
        if let Err(e) = blank(&path) {
            tracing::warn!(
                "cannot reserve room for the end of task {} attempt {} in {} ({e}); it is \
                 recorded when the attempt ends, if there is room then",
                attempt.task,
                attempt.attempt,
                self.dir.display()
            );
        }
    }

    /// Keep `end` (a `finished` report) until [`EndRecords::delivered`], in the room
    /// reserved for it where there is some. A record that cannot be written leaves the
    /// end in memory only: it is still delivered unless the agent stops first, and the
    /// log says so.
    pub(crate) fn record(&self, end: &AgentReport) {
        let attempt = AgentReport::attempt(end);
        let (slot, _) = self.slot_of(attempt);
        let path = self.path(slot);
        let written = serde_json::to_vec(end)
            .map_err(std::io::Error::other)
            .and_then(|mut bytes| {
                bytes.resize(bytes.len().max(RECORD_BYTES), b' ');
                open_slot(&path)?.write_all_at(&bytes, 0)
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

    /// The server has answered for the end of `attempt`: its slot is blanked for reuse.
    pub(crate) fn delivered(&self, attempt: AttemptRef) {
        let Some(slot) = self.slots.lock().unwrap().taken.remove(&attempt) else {
            return;
        };
        let path = self.path(slot);
        if blank(&path).is_ok() {
            self.slots.lock().unwrap().free.push(slot);
        } else {
            // Never reused: the next life reads it, and the server rejects the repeat.
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn open_slot(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        // Kept: its blocks are the room an end is written into on a full disk.
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// Make the slot at `path` exactly [`RECORD_BYTES`] of blanks (its room, allocated).
fn blank(path: &Path) -> std::io::Result<()> {
    let file = open_slot(path)?;
    file.write_all_at(&BLANK, 0)?;
    file.set_len(RECORD_BYTES as u64)
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
    fn ends_outlive_the_agent_until_delivered_and_slots_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let ends = dir.path().join("ends");
        let (records, found) = EndRecords::open(ends.clone()).unwrap();
        assert!(found.is_empty());
        records.reserve(AgentReport::attempt(&end(1)));
        records.record(&end(1));
        records.record(&end(2));
        records.delivered(AgentReport::attempt(&end(1)));
        // An attempt that started and had not ended takes the blanked slot again.
        records.reserve(AgentReport::attempt(&end(5)));
        std::fs::write(ends.join("stray.partial"), b"{").unwrap();
        std::fs::write(ends.join("slot-7.end"), b"not json").unwrap();
        // The next life of the agent.
        let (next, found) = EndRecords::open(ends.clone()).unwrap();
        assert_eq!(found, [end(2)]);
        let mut left: Vec<_> = std::fs::read_dir(&ends)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["slot-0.end", "slot-1.end", "slot-7.end"]);
        // Blank slots are reused before a new one is made.
        next.reserve(AgentReport::attempt(&end(8)));
        next.reserve(AgentReport::attempt(&end(9)));
        next.reserve(AgentReport::attempt(&end(10)));
        assert_eq!(std::fs::read_dir(&ends).unwrap().count(), 4);
        for entry in std::fs::read_dir(&ends).unwrap() {
            assert_eq!(entry.unwrap().metadata().unwrap().len(), 4096);
        }
    }
}

#[cfg(test)]
mod full_disk_tests {
    use super::*;
    use std::io::Write as _;

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
