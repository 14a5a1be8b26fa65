//! Process groups of attempts are recorded on disk while they run, so that an agent
//! restarted after a crash can kill what its previous life left behind: nothing must run
//! twice at once, and the server will have marked those attempts lost.

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The kernel's start time of a process (clock ticks since boot), which tells a process
/// apart from a later one that reused its pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; the command name (field 2) may contain spaces, so count after its ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A record of one running process group; removed when dropped.
#[derive(Debug)]
pub(crate) struct GroupRecord {
    path: PathBuf,
}

impl GroupRecord {
    pub fn write(dir: &Path, name: &str, pgid: u32) -> std::io::Result<GroupRecord> {
        let path = dir.join(format!("{name}.pgid"));
        let started = start_time(pgid).unwrap_or(0);
        std::fs::write(&path, format!("{pgid} {started}\n"))?;
        Ok(GroupRecord { path })
    }
}

impl Drop for GroupRecord {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Kill every recorded group that is still the same process; returns how many.
pub(crate) fn kill_leftovers(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "pgid") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
            if let (Some(Some(pgid)), Some(Some(started))) = (fields.next(), fields.next()) {
                if start_time(pgid as u32) == Some(started)
                    && killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL).is_ok()
                {
                    killed += 1;
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    #[test]
    fn leftover_groups_are_killed_and_records_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        let record = GroupRecord::write(dir.path(), "t1-1", child.id()).unwrap();
        std::mem::forget(record); // as if the agent crashed
        // A stale record of a process that no longer exists is just removed.
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
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
