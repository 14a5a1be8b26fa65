//! What an execution's cgroup has used, read from the controller files while it runs
//! (the agent samples it periodically for `tcloud top`), and the narrow handle through
//! which the agent reads it: a reader can look, never kill or remove.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use super::Cgroup;

/// One reading of a cgroup's counters; `None` where the hierarchy does not account it
/// (v1 without `cpuacct`, a v2 kernel without `memory.peak`, …).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupUsage {
    /// CPU time used by every process of the cgroup since it was created.
    pub cpu: Option<Duration>,
    /// Memory charged to the cgroup now (page cache included, as the limit counts it).
    pub memory_bytes: Option<u64>,
    /// The most memory charged to it at any moment since it was created.
    pub memory_peak_bytes: Option<u64>,
    /// Time its processes were held back by the CPU quota so far.
    pub throttled: Option<Duration>,
    /// CFS periods elapsed with the cgroup runnable, and how many of them the quota
    /// throttled (`cpu.stat` `nr_periods`, `nr_throttled`): their ratio over an interval is
    /// the share of the time the quota held it back.
    pub cpu_periods: Option<(u64, u64)>,
    /// The CPU quota in force now, in thousandths of a CPU (`None`: no quota).
    pub cpu_quota_millis: Option<u64>,
    /// The memory limit in force now (`None`: no limit).
    pub memory_limit_bytes: Option<u64>,
    /// Percent of the last 10 s some of its tasks stalled on memory (v2 `memory.pressure`,
    /// PSI `some avg10`).
    pub memory_pressure_percent: Option<f64>,
    /// How many times its memory use hit the limit so far (v1 `memory.failcnt`).
    pub memory_failcnt: Option<u64>,
    /// Percent of the last 10 s some of its tasks waited for I/O (v2 `io.pressure`).
    pub io_pressure_percent: Option<f64>,
}

/// Reads the usage of one running execution's cgroup ([`crate::ExecutionHandle::usage_reader`]).
/// Cheap to clone; reading a cgroup that is gone gives an empty [`CgroupUsage`].
#[derive(Debug, Clone)]
pub struct UsageReader {
    cgroup: Arc<dyn Cgroup>,
}

impl UsageReader {
    pub(crate) fn new(cgroup: Arc<dyn Cgroup>) -> Self {
        UsageReader { cgroup }
    }

    /// Read the counters now (a few small file reads).
    pub fn read(&self) -> CgroupUsage {
        self.cgroup.usage()
    }
}

/// `(nr_periods, nr_throttled)` of a `cpu.stat`.
pub(crate) fn cpu_periods(path: &std::path::Path) -> Option<(u64, u64)> {
    Some((
        super::keyed_value(path, "nr_periods")?,
        super::keyed_value(path, "nr_throttled")?,
    ))
}

/// The `avg10` of the `some` line of a PSI file (`memory.pressure`, `io.pressure`):
/// `some avg10=1.23 avg60=… total=…`.
pub(crate) fn psi_some_avg10(path: &std::path::Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

/// The first number of a file holding one (`memory.current`, `cpuacct.usage`, …).
pub(crate) fn number(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
