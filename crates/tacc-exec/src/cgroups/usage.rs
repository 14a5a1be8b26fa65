//! What an execution's cgroup has used, read from the controller files while it runs
//! (the agent samples it periodically for `tcloud top`), and the narrow handle through
//! which the agent reads it: a reader can look, never kill or remove.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use super::Cgroup;

/// One reading of a cgroup's counters; `None` where the hierarchy does not account it
/// (v1 without `cpuacct`, a v2 kernel without `memory.peak`, …).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// CPU time used by every process of the cgroup since it was created.
    pub cpu: Option<Duration>,
    /// Memory charged to the cgroup now (page cache included, as the limit counts it).
    pub memory_bytes: Option<u64>,
    /// The most memory charged to it at any moment since it was created.
    pub memory_peak_bytes: Option<u64>,
    /// Time its processes were held back by the CPU quota so far.
    pub throttled: Option<Duration>,
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

/// The first number of a file holding one (`memory.current`, `cpuacct.usage`, …).
pub(crate) fn number(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
