//! Emptied execution cgroups kept for the next execution instead of removed: making and
//! removing a cgroup is the largest cost of a trivial task's isolation on cgroup v1 (one
//! directory per controller, each created with its dozens of files by the kernel).
//!
//! What reuse must never do, and how it is prevented:
//!
//! - carry another execution's processes: every handle of an execution (its usage
//!   reader, its resizer, its `tcloud exec` entry) is a [`Lease`]. Its kill
//!   ([`Cgroup::kill_all`], the end of every execution) first closes it to joins, so a
//!   late `exec` into the ending task fails instead of landing in the cgroup; a cgroup is
//!   kept for reuse only when that kill found it empty at once (nothing killed, ever, in
//!   this execution: a cancelled task's or one that left processes behind is removed, as
//!   is one given back without a kill, from a failed launch). From the give-back on, the
//!   lease and all its copies are dead: they join, read, kill and resize nothing.
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
            state: Mutex::new(LeaseState::default()),
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
    /// Held while joining, resizing, killing's start and the give-back, so none races
    /// another.
    state: Mutex<LeaseState>,
    idle: Arc<Idle>,
}

#[derive(Debug, Default)]
struct LeaseState {
    /// A kill began: nothing joins any more.
    closed: bool,
    /// A kill found processes (or could not empty it): never reused.
    dirty: bool,
    /// The last kill found it empty at once, joins closed, nothing killed before.
    verified: bool,
    /// Given back: this handle is dead.
    ended: bool,
}

impl Lease {
    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().expect("lease lock")
    }

    fn live(&self) -> bool {
        !self.state().ended
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
        let state = self.state();
        if state.ended || state.closed {
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
        let state = self.state();
        if state.ended {
            return Err(self.ended_error("resize"));
        }
        self.cgroup.set_limits(cpu_millis, memory_bytes)
    }

    /// Closes the cgroup to joins first, so what the kill finds is all there is.
    fn kill_all(&self, deadline: Duration) -> KillReport {
        {
            let mut state = self.state();
            if state.ended {
                return KillReport {
                    killed: Vec::new(),
                    empty: true,
                };
            }
            state.closed = true;
        }
        let report = self.cgroup.kill_all(deadline);
        let mut state = self.state();
        state.dirty |= !report.empty || !report.killed.is_empty();
        state.verified = !state.dirty;
        report
    }

    fn signal_all(&self, signal: Signal) {
        if self.live() {
            self.cgroup.signal_all(signal);
        }
    }

    /// The give-back: from here on this lease (and every copy of it) is dead; the cgroup
    /// waits in the pool when its kill verified it empty and the pool has room, else it
    /// is removed.
    fn remove(&self) -> Result<(), ExecError> {
        let reusable = {
            let mut state = self.state();
            if state.ended {
                return Ok(());
            }
            state.ended = true;
            state.verified
        };
        if reusable {
            let mut idle = self.idle.cgroups.lock().expect("pool lock");
            if idle.len() < self.idle.size {
                idle.push(self.cgroup.clone());
                return Ok(());
            }
        }
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
            ("cpuacct", "cpuacct.usage", "0"),
        ] {
            std::fs::write(at(c, f), v).unwrap();
        }
    }

    /// An execution's end: its kill (finding the fake empty), then the give-back.
    fn end(lease: &dyn Cgroup) -> Result<(), ExecError> {
        let report = lease.kill_all(Duration::from_secs(1));
        assert!(report.empty && report.killed.is_empty(), "{report:?}");
        lease.remove()
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
        end(first.as_ref()).unwrap();
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
        // Nothing charged beyond the residue: no costly reclaim.
        assert!(!at("memory", "memory.force_empty").exists());
    }

    #[test]
    fn limits_already_in_force_are_not_written_again_and_a_resize_is_undone_at_reuse() {
        let base = fake();
        let pool = pool(base.path(), 4);
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/a/t1").join(f);
        let limit_files = [
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
            ("pids", "pids.max"),
        ];
        // Removed from the fake: a write makes them again, so their absence after a
        // reuse shows that nothing was written.
        let forget = || {
            for (c, f) in limit_files {
                std::fs::remove_file(at(c, f)).unwrap();
            }
        };
        let read = |c: &str, f: &str| std::fs::read_to_string(at(c, f)).ok();
        let first = pool.create("t1", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t1");
        end(first.as_ref()).unwrap();
        forget();
        let same = pool.create("t2", &limits()).unwrap().unwrap();
        assert_eq!(same.path(), first.path(), "reused");
        for (c, f) in limit_files {
            assert_eq!(read(c, f), None, "{f} written again with what it held");
        }
        // Resized while it runs: the next execution gets its own limits back.
        same.set_limits(2000, 128 << 20).unwrap();
        assert_eq!(
            read("memory", "memory.limit_in_bytes").unwrap(),
            "134217728"
        );
        end(same.as_ref()).unwrap();
        let after_resize = pool.create("t3", &limits()).unwrap().unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes").unwrap(), "67108864");
        assert_eq!(read("cpu", "cpu.cfs_quota_us").unwrap(), "50000");
        assert_eq!(read("pids", "pids.max").unwrap(), "100");
        // Other limits: every one written.
        end(after_resize.as_ref()).unwrap();
        forget();
        let other = Limits {
            cpu_millis: 1000,
            ..limits()
        };
        let _fourth = pool.create("t4", &other).unwrap().unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes").unwrap(), "67108864");
        assert_eq!(read("cpu", "cpu.cfs_quota_us").unwrap(), "100000");
        assert_eq!(read("pids", "pids.max").unwrap(), "100");
    }

    #[test]
    fn a_killed_or_ended_lease_joins_nothing_and_an_ended_one_reads_and_resizes_nothing() {
        let base = fake();
        let pool = pool(base.path(), 4);
        let lease = pool.create("t1", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t1");
        lease.kill_all(Duration::from_secs(1));
        let error = lease.join(12345).unwrap_err().to_string();
        assert!(error.contains("has ended"), "{error}");
        lease.remove().unwrap();
        assert!(lease.join(12345).is_err());
        assert!(lease.join_files().is_empty());
        assert!(lease.set_limits(1000, 0).is_err());
        assert_eq!(lease.usage(), CgroupUsage::default());
        // Given back once: a second give-back changes nothing.
        lease.remove().unwrap();
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn a_cgroup_given_back_without_its_kill_or_still_charged_is_not_reused() {
        let base = fake();
        let pool = pool(base.path(), 4);
        // A failed launch gives back without a kill: removed (here the fake's files make
        // the removal fail, which proves it was tried), never kept.
        let unkilled = pool.create("t1", &limits()).unwrap().unwrap();
        assert!(unkilled.remove().is_err());
        assert_eq!(pool.idle(), 0);

        let charged = pool.create("t2", &limits()).unwrap().unwrap();
        kernel_files(base.path(), "t2");
        end(charged.as_ref()).unwrap();
        let t2 = |f: &str| base.path().join("memory/tacc/a/t2").join(f);
        std::fs::write(t2("memory.usage_in_bytes"), (2u64 << 20).to_string()).unwrap();
        let next = pool.create("t3", &limits()).unwrap().unwrap();
        assert!(next.path().ends_with("t3"), "{}", next.path().display());
        // It was asked to reclaim first.
        assert_eq!(
            std::fs::read_to_string(t2("memory.force_empty")).unwrap(),
            "0"
        );
    }

    #[test]
    fn past_its_size_the_pool_removes() {
        let base = fake();
        let pool = pool(base.path(), 1);
        let a = pool.create("a", &limits()).unwrap().unwrap();
        let b = pool.create("b", &limits()).unwrap().unwrap();
        end(a.as_ref()).unwrap();
        assert!(end(b.as_ref()).is_err(), "kept past the pool's size");
        assert_eq!(pool.idle(), 1);
    }
}
