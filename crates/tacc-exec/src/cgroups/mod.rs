//! Control groups for the process runtime: every execution runs in a cgroup of its own,
//! with the task's CPU quota, memory limit and a pids limit, and cancel, the time limit
//! and the end of the main process kill the whole cgroup — a process that left the
//! process group with `setsid` cannot leave its cgroup.
//!
//! [`Cgroups`] is one agent's part of the hierarchy (`<mount>/tacc/<agent-id>`);
//! [`detect`] probes `/sys/fs/cgroup` and picks [`v2`] (the unified hierarchy) or [`v1`]
//! (one mount per controller), else [`NoCgroups`], which isolates nothing (today's
//! process-group behaviour; said once in the log). The file-writing logic of both takes
//! a base directory, so the unit tests run it against a fake hierarchy in a temp dir.

mod kept_files;
mod pool;
mod usage;
mod v1;
mod v2;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ExecError;

pub use pool::{CgroupPool, DEFAULT_POOL_SIZE};
pub use usage::{CgroupUsage, UsageReader};
pub use v1::{REUSE_MEMORY_RESIDUE, V1Cgroups};
pub use v2::V2Cgroups;

/// Where cgroup file systems are mounted on Linux.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The pids limit of an execution unless configured otherwise: a fork bomb stops here.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

/// How long [`Cgroup::kill_all`] keeps killing before it gives up on an empty cgroup.
pub const KILL_DEADLINE: Duration = Duration::from_secs(5);

/// The limits of one execution's cgroup; 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Thousandths of a CPU (`cpus: 0.5` is 500).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids_max: u64,
}

/// The CFS period used for CPU quotas (the kernel's default, 100 ms).
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// The quota per [`CPU_PERIOD_US`] for `cpu_millis` (at least the kernel's minimum, 1 ms).
pub(crate) fn cpu_quota_us(cpu_millis: u64) -> u64 {
    (cpu_millis * CPU_PERIOD_US / 1000).max(1000)
}

/// One agent's part of a cgroup hierarchy.
pub trait Cgroups: Send + Sync + Debug {
    /// `v1`, `v2` or `none`.
    fn version(&self) -> &'static str;

    /// Create the cgroup of one execution, named `name` (unique under this agent), with
    /// `limits` applied. `None` where this hierarchy isolates nothing.
    fn create(&self, name: &str, limits: &Limits) -> Result<Option<Box<dyn Cgroup>>, ExecError>;

    /// Names of the execution cgroups that exist under this agent's root.
    fn existing(&self) -> Vec<String>;

    /// An existing execution cgroup, to kill and remove it.
    fn open(&self, name: &str) -> Option<Box<dyn Cgroup>>;

    /// Remove this agent's (empty) root, when the agent stops.
    fn close(&self) {}

    /// Kill and remove every execution cgroup a previous life of the agent left behind
    /// (call before the agent runs anything); returns how many processes it killed.
    fn remove_stale(&self) -> usize {
        let mut killed = 0;
        for name in self.existing() {
            if let Some(cgroup) = self.open(&name) {
                let report = cgroup.kill_all(KILL_DEADLINE);
                killed += report.killed.len();
                if let Err(error) = cgroup.remove() {
                    tracing::warn!("cannot remove stale cgroup {name}: {error}");
                }
            }
        }
        killed
    }
}

/// The cgroup of one execution.
pub trait Cgroup: Send + Sync + Debug {
    /// The cgroup's directory (v1: the memory controller's), for messages.
    fn path(&self) -> &Path;

    /// The files a process writes its pid to, to join the cgroup (v2: one; v1: one per
    /// controller).
    fn join_files(&self) -> Vec<PathBuf>;

    /// Move process `pid` into the cgroup (every controller's).
    fn join(&self, pid: u32) -> Result<(), ExecError> {
        for file in self.join_files() {
            write_file(&file, &pid.to_string())?;
        }
        Ok(())
    }

    /// Processes in the cgroup now.
    fn procs(&self) -> Vec<u32>;

    /// How many times the kernel's OOM killer killed a process of this cgroup.
    fn oom_kills(&self) -> u64;

    /// CPU time used by the cgroup's processes so far, where the hierarchy accounts it.
    fn cpu_usage(&self) -> Option<Duration>;

    /// What the cgroup uses now: CPU time so far, memory now and at its peak, time
    /// throttled by the CPU quota; each where the hierarchy accounts it.
    fn usage(&self) -> CgroupUsage {
        CgroupUsage {
            cpu: self.cpu_usage(),
            ..CgroupUsage::default()
        }
    }

    /// Change the CPU quota and memory limit of the running cgroup (0: no limit), for
    /// adaptive re-allocation. A memory limit below what the cgroup uses now is refused
    /// (the kernel would reclaim, then kill): the error says how much it uses.
    fn set_limits(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        let _ = (cpu_millis, memory_bytes);
        Err(ExecError::Cgroup {
            action: "resize",
            path: self.path().display().to_string(),
            detail: "this hierarchy cannot change a running cgroup's limits".into(),
        })
    }

    /// SIGKILL every process until the cgroup is empty or `deadline` passes (v2:
    /// `cgroup.kill`; v1: freeze, kill each, thaw, again). Says what it killed. With a
    /// zero deadline it looks once and never sleeps: `empty` only where that look found
    /// no process (what the process runtime tries on a worker before a blocking kill).
    fn kill_all(&self, deadline: Duration) -> KillReport;

    /// Remove the (empty) cgroup.
    fn remove(&self) -> Result<(), ExecError>;

    /// This emptied cgroup made ready for another execution with `limits` (see
    /// `pool.rs`): a handle that reads its counters from zero. `Err` where it cannot be
    /// reused (not verifiably empty, memory still charged, or a hierarchy that does not
    /// reuse): then it is removed instead.
    fn renew(&self, limits: &Limits) -> Result<Box<dyn Cgroup>, ExecError> {
        let _ = limits;
        Err(ExecError::Cgroup {
            action: "reuse",
            path: self.path().display().to_string(),
            detail: "this hierarchy does not reuse cgroups".into(),
        })
    }

    /// Send `signal` to every process in the cgroup once (SIGTERM before the grace).
    fn signal_all(&self, signal: Signal) {
        for pid in self.procs() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }
}

/// What [`Cgroup::kill_all`] had to kill, and whether the cgroup ended up empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillReport {
    /// `(pid, command name)` of each process that was still there.
    pub killed: Vec<(u32, String)>,
    pub empty: bool,
}

impl KillReport {
    /// `2 processes: 123 (sleep), 124 (python3)`.
    pub fn describe(&self) -> String {
        let list: Vec<String> = self
            .killed
            .iter()
            .map(|(pid, name)| format!("{pid} ({name})"))
            .collect();
        let count = self.killed.len();
        let noun = if count == 1 { "process" } else { "processes" };
        format!("{count} {noun}: {}", list.join(", "))
    }
}

/// A hierarchy that isolates nothing: where no cgroup controller is writable.
#[derive(Debug, Default, Clone)]
pub struct NoCgroups;

impl Cgroups for NoCgroups {
    fn version(&self) -> &'static str {
        "none"
    }
    fn create(&self, _: &str, _: &Limits) -> Result<Option<Box<dyn Cgroup>>, ExecError> {
        Ok(None)
    }
    fn existing(&self) -> Vec<String> {
        Vec::new()
    }
    fn open(&self, _: &str) -> Option<Box<dyn Cgroup>> {
        None
    }
}

/// The hierarchy of this machine for the agent root `name` (e.g. `tacc/agent-1f2e`):
/// v2 where `/sys/fs/cgroup` is the unified hierarchy, v1 where controllers are mounted
/// under it one by one, and [`NoCgroups`] where neither can be written (not root, or no
/// cgroup file system): logged once.
pub fn detect(name: &str) -> Box<dyn Cgroups> {
    match detect_at(Path::new(CGROUP_MOUNT), name) {
        Ok(cgroups) => cgroups,
        Err(error) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "tasks run without cgroups (no CPU, memory or pids limits; cancel reaches only the process group): {error}"
                );
            });
            Box::new(NoCgroups)
        }
    }
}

/// [`detect`] under `base` instead of `/sys/fs/cgroup`; the error says why neither
/// version is usable.
pub fn detect_at(base: &Path, name: &str) -> Result<Box<dyn Cgroups>, ExecError> {
    if base.join("cgroup.controllers").is_file() {
        return Ok(Box::new(V2Cgroups::open(base, name)?));
    }
    if base.join("memory").join("cgroup.procs").is_file() {
        return Ok(Box::new(V1Cgroups::open(base, name)?));
    }
    Err(ExecError::Cgroup {
        action: "find",
        path: base.display().to_string(),
        detail: "neither a cgroup v2 hierarchy nor a v1 memory controller is mounted here".into(),
    })
}

/// Refuses a memory limit below what the cgroup uses now.
pub(crate) fn check_memory_floor(
    path: &Path,
    memory_bytes: u64,
    used: Option<u64>,
) -> Result<(), ExecError> {
    match used {
        Some(used) if memory_bytes > 0 && memory_bytes < used => Err(ExecError::Cgroup {
            action: "resize",
            path: path.display().to_string(),
            detail: format!(
                "a memory limit of {memory_bytes} bytes is below the {used} bytes it uses now; \
                 never shrink memory below current use"
            ),
        }),
        _ => Ok(()),
    }
}

/// A cgroup file error.
pub(crate) fn file_error(action: &'static str, path: &Path, error: std::io::Error) -> ExecError {
    ExecError::Cgroup {
        action,
        path: path.display().to_string(),
        detail: error.to_string(),
    }
}

pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), ExecError> {
    std::fs::write(path, value).map_err(|e| file_error("write", path, e))
}

/// Create `dir` and its parents (a cgroup directory comes with its files).
pub(crate) fn make_dir(dir: &Path) -> Result<(), ExecError> {
    std::fs::create_dir_all(dir).map_err(|e| file_error("create", dir, e))
}

/// The pids listed in a `cgroup.procs` (or `tasks`) file.
pub(crate) fn read_pids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The value of `key` in a flat keyed file (`memory.events`, `cpu.stat`,
/// `memory.oom_control`: `key value` lines).
pub(crate) fn keyed_value(path: &Path, key: &str) -> Option<u64> {
    keyed_in(&std::fs::read_to_string(path).ok()?, key)
}

/// The value of `key` in the text of a flat keyed file (read once for several keys).
pub(crate) fn keyed_in(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Names of the subdirectories of `dir`.
pub(crate) fn subdirs(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Remove a cgroup directory; the kernel refuses (EBUSY) for a moment after the last
/// process died, so try for up to a second.
pub(crate) fn remove_dir(dir: &Path) -> Result<(), ExecError> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(file_error("remove", dir, e)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The command name of a process, for reports.
pub(crate) fn command_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The kill loop for a hierarchy without `cgroup.kill`: until `procs()` is empty or the
/// deadline passes, `freeze(true)` (so nothing forks between listing and killing),
/// SIGKILL every listed process, `freeze(false)` (a frozen process dies only once
/// thawed), and look again.
pub(crate) fn kill_loop(
    procs: impl Fn() -> Vec<u32>,
    freeze: impl Fn(bool),
    deadline: Duration,
) -> KillReport {
    let until = Instant::now() + deadline;
    let mut report = KillReport::default();
    loop {
        let pids = procs();
        if pids.is_empty() {
            report.empty = true;
            return report;
        }
        if Instant::now() >= until {
            return report;
        }
        freeze(true);
        for pid in procs() {
            if !report.killed.iter().any(|(p, _)| *p == pid) {
                report.killed.push((pid, command_name(pid)));
            }
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        freeze(false);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Wait until `procs()` is empty or the deadline passes; whether it is empty.
pub(crate) fn wait_empty(procs: impl Fn() -> Vec<u32>, deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    loop {
        if procs().is_empty() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_is_a_share_of_the_period_with_the_kernel_minimum() {
        assert_eq!(cpu_quota_us(500), 50_000);
        assert_eq!(cpu_quota_us(2000), 200_000);
        assert_eq!(cpu_quota_us(1), 1000);
    }

    #[test]
    fn keyed_files_are_read_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memory.events");
        std::fs::write(&file, "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n").unwrap();
        assert_eq!(keyed_value(&file, "oom_kill"), Some(2));
        assert_eq!(keyed_value(&file, "oom"), Some(3));
        assert_eq!(keyed_value(&file, "absent"), None);
    }

    #[test]
    fn a_base_without_cgroups_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let error = detect_at(dir.path(), "tacc/a").unwrap_err();
        assert!(error.to_string().contains("neither"), "{error}");
    }

    #[test]
    fn no_cgroups_isolates_nothing() {
        let none = NoCgroups;
        assert!(none.create("x", &limits()).unwrap().is_none());
        assert_eq!(none.remove_stale(), 0);
    }

    pub(crate) fn limits() -> Limits {
        Limits {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
            pids_max: 100,
        }
    }

    #[test]
    fn a_kill_report_lists_what_it_killed() {
        let report = KillReport {
            killed: vec![(12, "sleep".into()), (13, "python3".into())],
            empty: true,
        };
        assert_eq!(report.describe(), "2 processes: 12 (sleep), 13 (python3)");
    }
}
