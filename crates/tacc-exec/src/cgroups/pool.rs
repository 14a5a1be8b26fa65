//! Emptied execution cgroups kept for the next execution instead of removed: making and
//! removing a cgroup is the largest cost of a trivial task's isolation on cgroup v1 (one
//! directory per controller, each created with its dozens of files by the kernel).
//!
//! What reuse must never do, and how it is prevented:
//!
//! - carry another execution's processes: a cgroup is given back only by its
//!   execution's end, once the kill found it empty; it is reused only after it is read
//!   empty again (and thawed) at the moment of reuse, else removed. Every handle of the
//!   ended execution (its usage reader, its resizer, its `tcloud exec` entry) is a
//!   [`Lease`] that is dead from the give-back on: it joins nothing (a late `exec` into
//!   the ended task fails instead of landing in the next task's cgroup), reads nothing,
//!   kills and resizes nothing.
//! - carry its limits: every limit is rewritten at reuse, "none" included
//!   ([`Cgroup::renew`]).
//! - charge or show its usage: the memory it left charged is reclaimed
//!   (`memory.force_empty`; a cgroup still charged more than
//!   [`super::REUSE_MEMORY_RESIDUE`] after it is removed instead), the resettable
//!   counters are reset, and the others (OOM kills, throttling) are read from the reuse
//!   on as deltas — so a task is never failed as `out_of_memory` for an earlier task's OOM.
//!
//! Hierarchies whose cgroups cannot be renewed (v2 here: one directory, cheap to make)
//! pass through: their cgroups are removed at the end as before.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Cgroup, CgroupUsage, Cgroups, KillReport, Limits};
use crate::ExecError;

/// How many emptied cgroups an agent keeps at most: more than the executions a node
/// runs at once is never needed; past it they are removed.
pub const DEFAULT_POOL_SIZE: usize = 64;

/// A [`Cgroups`] that reuses its emptied execution cgroups.
#[derive(Debug)]
pub struct CgroupPool {
    inner: Arc<dyn Cgroups>,
    idle: Arc<Idle>,
}

#[derive(Debug)]
struct Idle {
    cgroups: Mutex<Vec<Arc<dyn Cgroup>>>,
    size: usize,
}

impl CgroupPool {
    /// `inner`'s cgroups, at most `size` of them kept emptied for reuse.
    pub fn new(inner: Arc<dyn Cgroups>, size: usize) -> CgroupPool {
        CgroupPool {
            inner,
            idle: Arc::new(Idle {
                cgroups: Mutex::new(Vec::new()),
                size,
            }),
        }
    }

    /// How many emptied cgroups wait for reuse now.
    pub fn idle(&self) -> usize {
        self.idle.cgroups.lock().expect("pool lock").len()
    }

    fn lease(&self, cgroup: Arc<dyn Cgroup>) -> Box<dyn Cgroup> {
        Box::new(Lease {
            cgroup,
            ended: Mutex::new(false),
            idle: self.idle.clone(),
        })
    }
}

impl Cgroups for CgroupPool {
    fn version(&self) -> &'static str {
        self.inner.version()
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Option<Box<dyn Cgroup>>, ExecError> {
        loop {
            let next = self.idle.cgroups.lock().expect("pool lock").pop();
            let Some(cgroup) = next else { break };
            match cgroup.renew(limits) {
                Ok(fresh) => return Ok(Some(self.lease(Arc::from(fresh)))),
                Err(why) => {
                    tracing::debug!("not reused, removed: {why}");
                    if let Err(error) = cgroup.remove() {
                        tracing::warn!("cannot remove a cgroup that was not reused: {error}");
                    }
                }
            }
        }
        Ok(self
            .inner
            .create(name, limits)?
            .map(|cgroup| self.lease(Arc::from(cgroup))))
    }

    fn existing(&self) -> Vec<String> {
        self.inner.existing()
    }

    fn open(&self, name: &str) -> Option<Box<dyn Cgroup>> {
        self.inner.open(name)
    }

    fn close(&self) {
        let idle = std::mem::take(&mut *self.idle.cgroups.lock().expect("pool lock"));
        for cgroup in idle {
            let _ = cgroup.remove();
        }
        self.inner.close();
    }
}

/// One execution's hold on a cgroup of the pool: live until the execution gives it back
/// ([`Cgroup::remove`]), dead after, whoever still holds a copy.
#[derive(Debug)]
struct Lease {
    cgroup: Arc<dyn Cgroup>,
    /// Set by the give-back; held while joining, resizing, so neither races it.
    ended: Mutex<bool>,
    idle: Arc<Idle>,
}

impl Lease {
    fn live(&self) -> bool {
        !*self.ended.lock().expect("lease lock")
    }

    fn ended_error(&self, action: &'static str) -> ExecError {
        ExecError::Cgroup {
            action,
            path: self.cgroup.path().display().to_string(),
            detail: "the execution has ended; its cgroup is no longer its own".into(),
        }
    }
}

impl Cgroup for Lease {
    fn path(&self) -> &Path {
        self.cgroup.path()
    }

    fn join_files(&self) -> Vec<PathBuf> {
        if self.live() {
            self.cgroup.join_files()
        } else {
            Vec::new()
        }
    }

    fn join(&self, pid: u32) -> Result<(), ExecError> {
        let ended = self.ended.lock().expect("lease lock");
        if *ended {
            return Err(self.ended_error("join"));
        }
        self.cgroup.join(pid)
    }

    fn procs(&self) -> Vec<u32> {
        if self.live() {
            self.cgroup.procs()
        } else {
            Vec::new()
        }
    }

    fn oom_kills(&self) -> u64 {
        if self.live() {
            self.cgroup.oom_kills()
        } else {
            0
        }
    }

    fn cpu_usage(&self) -> Option<Duration> {
        self.live().then(|| self.cgroup.cpu_usage()).flatten()
    }

    fn usage(&self) -> CgroupUsage {
        if self.live() {
            self.cgroup.usage()
        } else {
            CgroupUsage::default()
        }
    }

    fn set_limits(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        let ended = self.ended.lock().expect("lease lock");
        if *ended {
            return Err(self.ended_error("resize"));
        }
        self.cgroup.set_limits(cpu_millis, memory_bytes)
    }

    fn kill_all(&self, deadline: Duration) -> KillReport {
        if self.live() {
            self.cgroup.kill_all(deadline)
        } else {
            KillReport {
                killed: Vec::new(),
                empty: true,
            }
        }
    }

    fn signal_all(&self, signal: Signal) {
        if self.live() {
            self.cgroup.signal_all(signal);
        }
    }

    /// The give-back: from here on this lease (and every copy of it) is dead; the cgroup
    /// waits in the pool, where it is checked again before any reuse, or is removed when
    /// the pool is full.
    fn remove(&self) -> Result<(), ExecError> {
        {
            let mut ended = self.ended.lock().expect("lease lock");
            if *ended {
                return Ok(());
            }
            *ended = true;
        }
        let mut idle = self.idle.cgroups.lock().expect("pool lock");
        if idle.len() < self.idle.size {
            idle.push(self.cgroup.clone());
            return Ok(());
        }
        drop(idle);
        self.cgroup.remove()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::tests::limits;

    /// A fake v1 mount: a directory per controller with the files reuse reads.
    fn fake() -> tempfile::TempDir {
        let base = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
            std::fs::create_dir(base.path().join(c)).unwrap();
            std::fs::write(base.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        base
    }

    fn pool(base: &Path, size: usize) -> CgroupPool {
        let inner = crate::cgroups::detect_at(base, "tacc/a").unwrap();
        CgroupPool::new(Arc::from(inner), size)
    }

    /// Files a real kernel provides in a new cgroup, for the fake.
    fn kernel_files(base: &Path, name: &str) {
        let at = |c: &str, f: &str| base.join(c).join("tacc/a").join(name).join(f);
        for (c, f, v) in [
            ("memory", "memory.usage_in_bytes", "0"),
            ("memory", "memory.oom_control", "oom_kill 0\n"),
            ("freezer", "freezer.state", "THAWED\n"),
            ("cpuacct", "cpuacct.usage", "0"),
        ] {
            std::fs::write(at(c, f), v).unwrap();
        }
    }

    #[test]
    fn a_given_back_cgroup_is_reused_with_new_limits_and_counters_from_zero() {
        let base = fake();
        let pool = pool(base.path(), 4);
        let first = pool.create("t1", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t1");
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/a/t1").join(f);
        // The first execution was OOM-killed once and used 3 s of CPU.
        std::fs::write(at("memory", "memory.oom_control"), "oom_kill 1\n").unwrap();
        std::fs::write(at("cpuacct", "cpuacct.usage"), "3000000000").unwrap();
        assert_eq!(first.oom_kills(), 1);
        first.remove().unwrap();
        assert_eq!(pool.idle(), 1);
        let none = Limits {
            cpu_millis: 0,
            memory_bytes: 0,
            pids_max: 0,
        };
        let second = pool.create("t2", &none).unwrap().unwrap();
        assert_eq!(pool.idle(), 0);
        assert_eq!(second.path(), first.path(), "the same directory, reused");
        assert!(!base.path().join("memory/tacc/a/t2").exists());
        assert_eq!(
            second.oom_kills(),
            0,
            "an earlier execution's OOM is not its own"
        );
        assert_eq!(second.cpu_usage(), Some(Duration::ZERO));
        let read = |c: &str, f: &str| std::fs::read_to_string(at(c, f)).unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes"), "-1");
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "-1");
        assert_eq!(read("pids", "pids.max"), "max");
        assert_eq!(read("memory", "memory.force_empty"), "0");
    }

    #[test]
    fn an_ended_lease_joins_reads_and_resizes_nothing() {
        let base = fake();
        let pool = pool(base.path(), 4);
        let lease = pool.create("t1", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t1");
        lease.remove().unwrap();
        let error = lease.join(12345).unwrap_err().to_string();
        assert!(error.contains("has ended"), "{error}");
        assert!(lease.join_files().is_empty());
        assert!(lease.set_limits(1000, 0).is_err());
        assert_eq!(lease.usage(), CgroupUsage::default());
        // Given back once: a second give-back changes nothing.
        lease.remove().unwrap();
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn a_cgroup_that_is_not_empty_or_still_charged_is_removed_not_reused() {
        let base = fake();
        let pool = pool(base.path(), 4);
        let lease = pool.create("t1", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t1");
        lease.remove().unwrap();
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/a/t1").join(f);
        std::fs::write(at("memory", "cgroup.procs"), "4242\n").unwrap();
        let next = pool.create("t2", &limits()).unwrap().unwrap();
        assert!(next.path().ends_with("t2"), "{}", next.path().display());
        assert_eq!(pool.idle(), 0);

        next.remove().unwrap();
        kernel_files(base.path(), "t2");
        let t2 = |f: &str| base.path().join("memory/tacc/a/t2").join(f);
        std::fs::write(t2("memory.usage_in_bytes"), (2u64 << 20).to_string()).unwrap();
        let third = pool.create("t3", &limits()).unwrap().unwrap();
        assert!(third.path().ends_with("t3"), "{}", third.path().display());
    }

    #[test]
    fn past_its_size_the_pool_removes() {
        let base = fake();
        let pool = pool(base.path(), 1);
        let a = pool.create("a", &limits()).unwrap().unwrap();
        let b = pool.create("b", &limits()).unwrap().unwrap();
        a.remove().unwrap();
        // The fake's directories hold files, so a real removal fails: that is the proof
        // the pool tried to remove `b` rather than keep it.
        assert!(b.remove().is_err());
        assert_eq!(pool.idle(), 1);
    }
}
