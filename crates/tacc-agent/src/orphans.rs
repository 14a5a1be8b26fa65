//! Process groups of attempts are recorded on disk while they run, so that an agent
//! restarted after a crash can kill what its previous life left behind: nothing must run
//! twice at once, and the server will have marked those attempts lost.
//!
//! Records live in reusable slot files (`slot-N.pgid`) that are emptied when their group
//! ends, never deleted: creating and deleting a file per attempt made ext4 search for a
//! free inode past the recently deleted ones on every attempt, a tenth of the agent's CPU
//! at 150 attempts a second (see docs/BENCHMARKS.md). An empty slot records nothing.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::process_mark::start_time;

/// Each record directory's free slots and the next slot number never used.
static SLOTS: Mutex<BTreeMap<PathBuf, (Vec<u32>, u32)>> = Mutex::new(BTreeMap::new());

fn slot_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("slot-{slot}.pgid"))
}

/// Replace a slot file's content without creating a new file where it exists.
fn fill(path: &Path, content: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(content.as_bytes())
}

/// The size a record is padded to (with blanks), so that filling and emptying a slot
/// overwrites its block in place: truncating it made ext4 free the block and allocate one
/// again on every attempt (`ext4_truncate`, `ext4_free_blocks`: 5 % of the agent's CPU at
/// 150 attempts a second). A longer record is written whole and emptied by truncation.
const RECORD_SIZE: usize = 128;

/// `content` padded with blanks to [`RECORD_SIZE`], where it fits.
fn padded(content: &str) -> Option<String> {
    (content.len() <= RECORD_SIZE).then(|| format!("{content:<RECORD_SIZE$}"))
}

/// Overwrite a slot file's first [`RECORD_SIZE`] bytes, without truncating it.
fn overwrite(path: &Path, record: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.write_all(record.as_bytes())
}

/// A record of one running process group; its slot is emptied (made blank) when dropped.
#[derive(Debug)]
pub(crate) struct GroupRecord {
    dir: PathBuf,
    slot: u32,
    /// Written longer than [`RECORD_SIZE`]: emptied by truncation.
    long: bool,
}

impl GroupRecord {
    pub fn write(dir: &Path, name: &str, pgid: u32) -> std::io::Result<GroupRecord> {
        let slot = {
            let mut slots = SLOTS.lock().unwrap();
            let (free, next) = slots.entry(dir.to_path_buf()).or_default();
            free.pop().unwrap_or_else(|| {
                *next += 1;
                *next - 1
            })
        };
        let started = start_time(pgid).unwrap_or(0);
        let content = format!("{pgid} {started} {name}\n");
        let path = slot_path(dir, slot);
        let long = match padded(&content) {
            Some(record) => {
                overwrite(&path, &record)?;
                false
            }
            None => {
                fill(&path, &content)?;
                true
            }
        };
        Ok(GroupRecord {
            dir: dir.to_path_buf(),
            slot,
            long,
        })
    }
}

impl Drop for GroupRecord {
    fn drop(&mut self) {
        let path = slot_path(&self.dir, self.slot);
        // Blank, not truncated, where the record was padded (see `RECORD_SIZE`); a
        // record is its first two numbers, so a blank slot records nothing.
        let emptied = if self.long {
            fill(&path, "").is_ok()
        } else {
            overwrite(&path, &" ".repeat(RECORD_SIZE)).is_ok()
        };
        let mut slots = SLOTS.lock().unwrap();
        let (free, _) = slots.entry(self.dir.clone()).or_default();
        if emptied {
            free.push(self.slot);
        }
    }
}

/// What a slot holds once the watchdog killed its group (see [`fence_recorded`]).
const FENCED: &str = "fenced\n";

impl GroupRecord {
    /// Whether the agent's watchdog killed this group (the agent was gone or silent).
    pub fn fenced(&self) -> bool {
        std::fs::read_to_string(slot_path(&self.dir, self.slot)).is_ok_and(|t| t == FENCED)
    }
}

/// The watchdog's kill: every recorded group that is still the same process is killed and
/// its slot marked fenced (the agent, should it resume, tells its attempts' end from the
/// task's own); returns how many. Slots stay where they are: the agent owns them.
pub(crate) fn fence_recorded(dir: &Path) -> usize {
    let mut killed = 0;
    for path in record_files(dir) {
        if kill_recorded(&path) {
            killed += 1;
            let _ = fill(&path, FENCED);
        }
    }
    killed
}

/// The record files (`*.pgid`) in `dir`.
fn record_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "pgid"))
        .collect()
}

/// Kill the group a record names, if it is still the same process; whether it did.
fn kill_recorded(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    matches!(
        (fields.next(), fields.next()),
        (Some(Some(pgid)), Some(Some(started)))
            if start_time(pgid as u32) == Some(started)
                && killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL).is_ok()
    )
}

/// Kill every recorded group that is still the same process; returns how many. Slots are
/// emptied and made the directory's free slots; records of the older one-file-per-group
/// layout are removed.
pub(crate) fn kill_leftovers(dir: &Path) -> usize {
    let mut killed = 0;
    let mut slots = Vec::new();
    for path in record_files(dir) {
        if kill_recorded(&path) {
            killed += 1;
        }
        let slot = path
            .file_stem()
            .and_then(|stem| stem.to_str()?.strip_prefix("slot-")?.parse::<u32>().ok());
        match slot {
            Some(slot) if fill(&path, "").is_ok() => slots.push(slot),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let next = slots.iter().max().map_or(0, |max| max + 1);
    SLOTS
        .lock()
        .unwrap()
        .insert(dir.to_path_buf(), (slots, next));
    killed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    #[test]
    fn leftover_groups_are_killed_and_slots_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        let record = GroupRecord::write(dir.path(), "t1-1", child.id()).unwrap();
        std::mem::forget(record); // as if the agent crashed
        // A stale record of a process that no longer exists (old layout) is just removed.
        std::fs::write(dir.path().join("stale.pgid"), "999999 1\n").unwrap();
        assert_eq!(kill_leftovers(dir.path()), 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "leftover process still running");
            std::thread::sleep(Duration::from_millis(10));
        }
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        assert_eq!(left, vec![String::new()], "one slot, emptied");
    }

    #[test]
    fn slots_are_reused_not_recreated() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let first = GroupRecord::write(dir.path(), "a", me).unwrap();
        let second = GroupRecord::write(dir.path(), "b", me).unwrap();
        assert_ne!(first.slot, second.slot);
        let text = std::fs::read_to_string(slot_path(dir.path(), second.slot)).unwrap();
        assert!(
            text.starts_with(&format!("{me} ")) && text.trim_end().ends_with(" b"),
            "{text}"
        );
        let freed = first.slot;
        drop(first);
        // Blanked in place: the same size, nothing recorded (kill_recorded parses no pgid).
        let blank = std::fs::read_to_string(slot_path(dir.path(), freed)).unwrap();
        assert_eq!(blank.len(), RECORD_SIZE);
        assert_eq!(blank.trim(), "");
        assert!(!kill_recorded(&slot_path(dir.path(), freed)));
        let third = GroupRecord::write(dir.path(), "c", me).unwrap();
        assert_eq!(third.slot, freed);
        drop((second, third));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_record_longer_than_the_padding_is_whole_and_emptied_by_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let name = "n".repeat(RECORD_SIZE);
        let record = GroupRecord::write(dir.path(), &name, me).unwrap();
        let path = slot_path(dir.path(), record.slot);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .ends_with(&format!("{name}\n"))
        );
        drop(record);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        // The slot's next, short record is not followed by what the long one left.
        let next = GroupRecord::write(dir.path(), "short", me).unwrap();
        assert_eq!(next.slot, 0);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim_end(), text.lines().next().unwrap());
        assert!(text.trim_end().ends_with(" short"), "{text}");
    }
}
