//! A process told apart from a later one that reuses its pid: its pid with the kernel's
//! start time. What records of processes that may outlive their writer keep (the
//! agent's process groups, the embedded cluster's agent and server).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMark {
    pub pid: u32,
    /// Clock ticks since boot when the process started (`/proc/PID/stat`, field 22).
    pub started: u64,
}

impl ProcessMark {
    /// The process `pid` as it is now, if it exists.
    pub fn of(pid: u32) -> Option<ProcessMark> {
        Some(ProcessMark {
            pid,
            started: start_time(pid)?,
        })
    }

    /// This process.
    pub fn current() -> ProcessMark {
        ProcessMark::of(std::process::id()).unwrap_or(ProcessMark {
            pid: std::process::id(),
            started: 0,
        })
    }

    /// Whether the process still runs: the same pid, started at the same time, and not a
    /// zombie waiting for its parent.
    pub fn is_alive(&self) -> bool {
        stat_fields(self.pid)
            .is_some_and(|(state, started)| state != 'Z' && started == self.started)
    }
}

/// The kernel's start time of a process, in clock ticks since boot.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|(_, started)| started)
}

/// A process's state letter and start time.
fn stat_fields(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: count after its last ')'.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 was the state; the start time is field 22.
    let started = fields.nth(18)?.parse().ok()?;
    Some((state, started))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not_it() {
        let me = ProcessMark::current();
        assert!(me.started > 0);
        assert!(me.is_alive());
        let earlier = ProcessMark {
            started: me.started - 1,
            ..me
        };
        assert!(!earlier.is_alive(), "another start time is another process");
    }

    #[test]
    fn an_ended_process_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let mark = ProcessMark::of(child.id());
        child.wait().unwrap();
        if let Some(mark) = mark {
            assert!(!mark.is_alive());
        }
        let zombie = std::process::Command::new("true").spawn().unwrap();
        let mark = ProcessMark::of(zombie.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mark.is_some_and(|m| stat_fields(m.pid).is_some_and(|(state, _)| state != 'Z')) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never ended"
            );
            std::thread::yield_now();
        }
        if let Some(mark) = mark {
            assert!(!mark.is_alive(), "a zombie has ended");
        }
        drop(zombie);
    }
}
