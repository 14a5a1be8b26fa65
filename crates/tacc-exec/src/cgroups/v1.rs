//! cgroup v1: one hierarchy per controller (`<mount>/memory`, `<mount>/cpu`, …). An
//! execution's cgroup is a directory of the same name in each controller it uses, and a
//! process joins by writing its pid to `cgroup.procs` in each.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::kept_files::KeptFiles;
use super::usage::number;
use super::{
    CPU_PERIOD_US, Cgroup, CgroupUsage, Cgroups, KillReport, Limits, check_memory_floor,
    cpu_quota_us, file_error, keyed_in, kill_loop, make_dir, read_pids, remove_dir, subdirs,
    write_file,
};

/// v1 reports "no memory limit" as a page-rounded `i64::MAX`; anything this large is none.
const NO_LIMIT_ABOVE: u64 = 1 << 60;
use crate::ExecError;

/// The controllers used, in the order their directories are created.
const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

/// One agent's root in each mounted v1 controller.
#[derive(Debug, Clone)]
pub struct V1Cgroups {
    /// `(controller, <mount>/<controller>/<agent root>)`; co-mounted controllers
    /// (`cpu,cpuacct`) share a directory.
    roots: Vec<(&'static str, PathBuf)>,
    /// Whether the kernel accounts swap (`memory.memsw.*`): the same in every cgroup of
    /// the hierarchy, so looked up once, at the agent's root.
    memsw: bool,
}

impl V1Cgroups {
    /// The agent root `name` (e.g. `tacc/agent-1f2e`) under the v1 controllers mounted
    /// in `base`, created if missing. The memory controller is required.
    pub fn open(base: &Path, name: &str) -> Result<V1Cgroups, ExecError> {
        let mut roots = Vec::new();
        for controller in CONTROLLERS {
            let mount = base.join(controller);
            if !mount.join("cgroup.procs").is_file() {
                continue;
            }
            // `cpu` and `cpuacct` are often links to one `cpu,cpuacct` mount.
            let mount = mount.canonicalize().unwrap_or(mount);
            let root = mount.join(name);
            make_dir(&root)?;
            roots.push((controller, root));
        }
        let Some((_, memory)) = roots.iter().find(|(c, _)| *c == "memory") else {
            return Err(ExecError::Cgroup {
                action: "find",
                path: base.join("memory").display().to_string(),
                detail: "the v1 memory controller is not mounted".into(),
            });
        };
        let memsw = memory.join(MEMSW_LIMIT).is_file();
        Ok(V1Cgroups { roots, memsw })
    }

    fn root(&self, controller: &str) -> Option<&Path> {
        self.roots
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, root)| root.as_path())
    }

    fn cgroup(&self, name: &str) -> V1Cgroup {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for (_, root) in &self.roots {
            let dir = root.join(name);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        let at = |controller| self.root(controller).map(|root| root.join(name));
        V1Cgroup {
            memory: at("memory").unwrap_or_default(),
            cpu: at("cpu"),
            cpuacct: at("cpuacct"),
            pids: at("pids"),
            freezer: at("freezer"),
            dirs,
            memsw: self.memsw,
            base: Base::default(),
            in_force: Arc::default(),
            files: Arc::default(),
        }
    }
}

impl Cgroups for V1Cgroups {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Option<Box<dyn Cgroup>>, ExecError> {
        let cgroup = self.cgroup(name);
        let made = cgroup.apply(limits);
        if let Err(error) = made {
            let _ = cgroup.remove();
            return Err(error);
        }
        Ok(Some(Box::new(cgroup)))
    }

    fn close(&self) {
        for (_, root) in &self.roots {
            let _ = std::fs::remove_dir(root);
        }
    }

    fn existing(&self) -> Vec<String> {
        self.root("memory").map(subdirs).unwrap_or_default()
    }

    fn open(&self, name: &str) -> Option<Box<dyn Cgroup>> {
        let cgroup = self.cgroup(name);
        cgroup
            .memory
            .is_dir()
            .then(|| Box::new(cgroup) as Box<dyn Cgroup>)
    }
}

/// One execution's directories in the v1 controllers.
#[derive(Debug, Clone)]
pub struct V1Cgroup {
    /// Every distinct directory, memory's first.
    dirs: Vec<PathBuf>,
    memory: PathBuf,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    pids: Option<PathBuf>,
    freezer: Option<PathBuf>,
    /// Whether the kernel accounts swap here (see [`V1Cgroups`]).
    memsw: bool,
    /// What the counters held when this execution got the cgroup (zero for a new one; a
    /// reused one's counters that the kernel cannot reset are read from here on).
    base: Base,
    /// The limits in force, as this agent last wrote them (shared by every handle of the
    /// directory, across reuses; see [`InForce`]).
    in_force: Arc<Mutex<InForce>>,
    /// Its control files kept open across reads, writes and reuses (see `kept_files.rs`),
    /// shared like `in_force`.
    files: Arc<KeptFiles>,
}

/// The file that limits memory + swap, where the kernel accounts swap.
const MEMSW_LIMIT: &str = "memory.memsw.limit_in_bytes";

/// The limits a cgroup's files hold, known because this agent wrote every one of them
/// and nothing else can (the files are root's; a task never is): at reuse, a limit file
/// that already holds what the next execution needs is not written again — for a run of
/// equal tasks, none is. `None` (unknown) after a failed write, and for a cgroup this
/// agent did not make: then every limit is written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct InForce(Option<Limits>);

/// The values of a reused cgroup's counters at its reuse: subtracted from every reading,
/// so an execution never sees (or is judged on) what an earlier one used.
#[derive(Debug, Clone, Copy, Default)]
struct Base {
    oom_kills: u64,
    cpu_ns: u64,
    throttled_ns: u64,
    periods: (u64, u64),
    /// Memory still charged after `memory.force_empty` (kernel objects; at most
    /// [`REUSE_MEMORY_RESIDUE`]).
    memory_bytes: u64,
}

/// The most memory an emptied cgroup may still be charged after `memory.force_empty`
/// to be reused; more and it is removed instead. What stays is kernel memory of the
/// processes just killed that the kernel frees a moment later (measured: ≈ 300 KiB right
/// after an OOM kill, ≈ 20 KiB a second later). The next execution's readings exclude
/// it; its limit counts it until it is freed.
pub const REUSE_MEMORY_RESIDUE: u64 = 1 << 20;

impl V1Cgroup {
    /// Ready this emptied cgroup for another execution (see `pool.rs`, which gives back
    /// only a cgroup its execution's kill found empty with joins already refused): the
    /// memory it is still charged reclaimed where it is more than a residue, every limit
    /// rewritten, its resettable counters reset and the others read as the new zero.
    fn renewed(&self, limits: &Limits) -> Result<V1Cgroup, ExecError> {
        let refuse = |detail: String| ExecError::Cgroup {
            action: "reuse",
            path: self.memory.display().to_string(),
            detail,
        };
        let usage = self.memory.join("memory.usage_in_bytes");
        let mut residue = self.number(&usage).unwrap_or(u64::MAX);
        if residue > REUSE_MEMORY_RESIDUE {
            // Page cache and kernel memory the last execution left charged, reclaimed
            // (costly: only where there is more than the residue).
            write_file(&self.memory.join("memory.force_empty"), "0")?;
            residue = self.number(&usage).unwrap_or(u64::MAX);
        }
        if residue > REUSE_MEMORY_RESIDUE {
            return Err(refuse(format!(
                "{residue} bytes of memory stay charged to it after force_empty"
            )));
        }
        let known = *self.in_force.lock().expect("limits lock") == InForce(Some(*limits));
        if !known {
            self.apply_all(limits)?;
        }
        let _ = self.write(&self.memory.join("memory.max_usage_in_bytes"), "0");
        let _ = self.write(&self.memory.join("memory.failcnt"), "0");
        // Read once for both of its counters.
        let cpu_stat = self
            .cpu
            .as_ref()
            .and_then(|cpu| self.files.read(&cpu.join("cpu.stat")).ok());
        let base = Base {
            oom_kills: self
                .keyed(&self.memory.join("memory.oom_control"), "oom_kill")
                .unwrap_or(0),
            cpu_ns: self
                .cpuacct
                .as_ref()
                .and_then(|c| self.number(&c.join("cpuacct.usage")))
                .unwrap_or(0),
            throttled_ns: cpu_stat
                .as_deref()
                .and_then(|s| keyed_in(s, "throttled_time"))
                .unwrap_or(0),
            periods: cpu_stat
                .as_deref()
                .and_then(|s| Some((keyed_in(s, "nr_periods")?, keyed_in(s, "nr_throttled")?)))
                .unwrap_or((0, 0)),
            memory_bytes: residue,
        };
        Ok(V1Cgroup {
            base,
            ..self.clone()
        })
    }

    /// Every limit written, "none" included: a reused cgroup keeps nothing of the last
    /// execution's limits. Recorded as in force only once all are written.
    fn apply_all(&self, limits: &Limits) -> Result<(), ExecError> {
        *self.in_force.lock().expect("limits lock") = InForce(None);
        self.set_limits_unchecked(limits.cpu_millis, limits.memory_bytes)?;
        if !self.memsw {
            // Off swap while limited (as `apply`), else the parent's setting again.
            let swappiness = if limits.memory_bytes > 0 {
                "0".to_string()
            } else {
                self.memory
                    .parent()
                    .and_then(|parent| number(&parent.join("memory.swappiness")))
                    .unwrap_or(60)
                    .to_string()
            };
            write_file(&self.memory.join("memory.swappiness"), &swappiness)?;
        }
        if let Some(pids) = &self.pids {
            let max = if limits.pids_max > 0 {
                limits.pids_max.to_string()
            } else {
                "max".to_string()
            };
            write_file(&pids.join("pids.max"), &max)?;
        }
        *self.in_force.lock().expect("limits lock") = InForce(Some(*limits));
        Ok(())
    }

    /// A new cgroup's limits: the kernel's defaults (none; the parent's swappiness) but
    /// where `limits` sets one. Recorded as in force once all are written.
    fn apply(&self, limits: &Limits) -> Result<(), ExecError> {
        for dir in &self.dirs {
            make_dir(dir)?;
        }
        if limits.memory_bytes > 0 {
            let bytes = limits.memory_bytes.to_string();
            write_file(&self.memory.join("memory.limit_in_bytes"), &bytes)?;
            // Memory + swap, where the kernel accounts swap (it must be at least the
            // memory limit, hence second); else keep the cgroup off swap.
            if self.memsw {
                write_file(&self.memory.join(MEMSW_LIMIT), &bytes)?;
            } else {
                write_file(&self.memory.join("memory.swappiness"), "0")?;
            }
        }
        if let Some(cpu) = &self.cpu {
            if limits.cpu_millis > 0 {
                write_file(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write_file(
                    &cpu.join("cpu.cfs_quota_us"),
                    &cpu_quota_us(limits.cpu_millis).to_string(),
                )?;
            }
        }
        if let Some(pids) = &self.pids {
            if limits.pids_max > 0 {
                write_file(&pids.join("pids.max"), &limits.pids_max.to_string())?;
            }
        }
        *self.in_force.lock().expect("limits lock") = InForce(Some(*limits));
        Ok(())
    }

    /// The quota in force, in thousandths of a CPU (`cpu.cfs_quota_us` is -1 without).
    fn cpu_quota_millis(&self) -> Option<u64> {
        let cpu = self.cpu.as_ref()?;
        let quota: i64 = self
            .files
            .read(&cpu.join("cpu.cfs_quota_us"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let period = self
            .number(&cpu.join("cpu.cfs_period_us"))
            .unwrap_or(CPU_PERIOD_US);
        (quota > 0 && period > 0).then(|| quota as u64 * 1000 / period)
    }

    /// The number a control file of this cgroup holds (through its kept handle).
    fn number(&self, path: &Path) -> Option<u64> {
        self.files.read(path).ok()?.trim().parse().ok()
    }

    /// The value of `key` in a keyed control file of this cgroup.
    fn keyed(&self, path: &Path, key: &str) -> Option<u64> {
        keyed_in(&self.files.read(path).ok()?, key)
    }

    /// Write a control file of this cgroup through its kept handle.
    fn write(&self, path: &Path, value: &str) -> Result<(), ExecError> {
        self.files
            .write(path, value)
            .map_err(|e| file_error("write", path, e))
    }

    fn freeze(&self, frozen: bool) {
        let Some(freezer) = &self.freezer else {
            return;
        };
        let state = freezer.join("freezer.state");
        let wanted = if frozen { "FROZEN" } else { "THAWED" };
        if write_file(&state, wanted).is_err() {
            return;
        }
        // Freezing takes effect asynchronously; wait briefly for it.
        let until = Instant::now() + Duration::from_millis(200);
        while std::fs::read_to_string(&state).is_ok_and(|s| s.trim() != wanted)
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Cgroup for V1Cgroup {
    fn path(&self) -> &Path {
        &self.memory
    }

    fn join_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Through the kept `cgroup.procs` of each controller, memory's first.
    fn join(&self, pid: u32) -> Result<(), ExecError> {
        let pid = pid.to_string();
        for file in self.join_files() {
            self.write(&file, &pid)?;
        }
        Ok(())
    }

    /// The memory controller's list alone: a process joins it first (`join_files` is in
    /// `dirs` order, memory's first, and a join stops at its first failure), its children
    /// are born in every hierarchy their parent is in, and no task may move itself (the
    /// cgroups are root's) — so no process of the cgroup is missing from it. Reading one
    /// list instead of one per controller: four fewer opens and reads at every end.
    fn procs(&self) -> Vec<u32> {
        let mut pids = read_pids(&self.memory.join("cgroup.procs"));
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn oom_kills(&self) -> u64 {
        self.keyed(&self.memory.join("memory.oom_control"), "oom_kill")
            .unwrap_or(0)
            .saturating_sub(self.base.oom_kills)
    }

    fn cpu_usage(&self) -> Option<Duration> {
        self.number(&self.cpuacct.as_ref()?.join("cpuacct.usage"))
            .map(|ns| Duration::from_nanos(ns.saturating_sub(self.base.cpu_ns)))
    }

    fn usage(&self) -> CgroupUsage {
        // Read once for its three counters.
        let cpu_stat = self
            .cpu
            .as_ref()
            .and_then(|cpu| self.files.read(&cpu.join("cpu.stat")).ok());
        let cpu_stat = cpu_stat.as_deref();
        CgroupUsage {
            cpu: self.cpu_usage(),
            memory_bytes: self
                .number(&self.memory.join("memory.usage_in_bytes"))
                .map(|b| b.saturating_sub(self.base.memory_bytes)),
            memory_peak_bytes: self
                .number(&self.memory.join("memory.max_usage_in_bytes"))
                .map(|b| b.saturating_sub(self.base.memory_bytes)),
            // v1 `cpu.stat` counts throttled time in nanoseconds.
            throttled: cpu_stat
                .and_then(|s| keyed_in(s, "throttled_time"))
                .map(|ns| Duration::from_nanos(ns.saturating_sub(self.base.throttled_ns))),
            cpu_periods: cpu_stat
                .and_then(|s| Some((keyed_in(s, "nr_periods")?, keyed_in(s, "nr_throttled")?)))
                .map(|(periods, throttled)| {
                    (
                        periods.saturating_sub(self.base.periods.0),
                        throttled.saturating_sub(self.base.periods.1),
                    )
                }),
            cpu_quota_millis: self.cpu_quota_millis(),
            memory_limit_bytes: self
                .number(&self.memory.join("memory.limit_in_bytes"))
                .filter(|limit| *limit < NO_LIMIT_ABOVE),
            memory_pressure_percent: None,
            memory_failcnt: self.number(&self.memory.join("memory.failcnt")),
            io_pressure_percent: None,
        }
    }

    fn set_limits(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        check_memory_floor(
            &self.memory,
            memory_bytes,
            number(&self.memory.join("memory.usage_in_bytes")),
        )?;
        let mut in_force = self.in_force.lock().expect("limits lock");
        let before = in_force.0.take();
        self.set_limits_unchecked(cpu_millis, memory_bytes)?;
        // The pids limit stays as it was.
        *in_force = InForce(before.map(|limits| Limits {
            cpu_millis,
            memory_bytes,
            ..limits
        }));
        Ok(())
    }

    fn kill_all(&self, deadline: Duration) -> KillReport {
        let report = kill_loop(|| self.procs(), |frozen| self.freeze(frozen), deadline);
        // The loop thaws after each freeze; this is the safety net where it froze at all
        // (found empty at once — every trivial task's end — it never did).
        if !(report.empty && report.killed.is_empty()) {
            self.freeze(false);
        }
        report
    }

    fn remove(&self) -> Result<(), ExecError> {
        self.files.close_all();
        let mut result = Ok(());
        for dir in &self.dirs {
            if let Err(error) = remove_dir(dir) {
                result = Err(error);
            }
        }
        result
    }

    fn renew(&self, limits: &Limits) -> Result<Box<dyn Cgroup>, ExecError> {
        Ok(Box::new(self.renewed(limits)?))
    }
}

impl V1Cgroup {
    /// The CPU quota and memory (+ swap) limit written (0: none), without the floor check.
    fn set_limits_unchecked(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        let limit_file = self.memory.join("memory.limit_in_bytes");
        let value = if memory_bytes == 0 {
            "-1".to_string()
        } else {
            memory_bytes.to_string()
        };
        if self.memsw {
            let memsw = self.memory.join(MEMSW_LIMIT);
            // memory + swap must stay at least the memory limit: raise it first when
            // growing, lower it last when shrinking.
            let current = number(&limit_file).unwrap_or(u64::MAX);
            let growing = memory_bytes == 0 || memory_bytes > current;
            if growing {
                write_file(&memsw, &value)?;
                write_file(&limit_file, &value)?;
            } else {
                write_file(&limit_file, &value)?;
                write_file(&memsw, &value)?;
            }
        } else {
            write_file(&limit_file, &value)?;
        }
        if let Some(cpu) = &self.cpu {
            let quota = if cpu_millis == 0 {
                "-1".to_string()
            } else {
                cpu_quota_us(cpu_millis).to_string()
            };
            write_file(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write_file(&cpu.join("cpu.cfs_quota_us"), &quota)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::tests::limits;

    /// A fake v1 mount: a directory per controller with a `cgroup.procs`.
    fn fake(controllers: &[&str]) -> tempfile::TempDir {
        let base = tempfile::tempdir().unwrap();
        for c in controllers {
            std::fs::create_dir(base.path().join(c)).unwrap();
            std::fs::write(base.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        base
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_string()
    }

    #[test]
    fn limits_are_written_to_each_controller() {
        let base = fake(&["memory", "cpu", "cpuacct", "pids", "freezer"]);
        let cgroups = crate::cgroups::detect_at(base.path(), "tacc/agent-1").unwrap();
        assert_eq!(cgroups.version(), "v1");
        let cgroup = cgroups.create("t1-a1", &limits()).unwrap().unwrap();
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/agent-1/t1-a1").join(f);
        assert_eq!(read(at("memory", "memory.limit_in_bytes")), "67108864");
        // No memsw file in this hierarchy: swap is turned off instead.
        assert_eq!(read(at("memory", "memory.swappiness")), "0");
        assert_eq!(read(at("cpu", "cpu.cfs_period_us")), "100000");
        assert_eq!(read(at("cpu", "cpu.cfs_quota_us")), "50000");
        assert_eq!(read(at("pids", "pids.max")), "100");
        let joins = cgroup.join_files();
        assert_eq!(joins.len(), 5);
        assert!(joins.iter().all(|f| f.ends_with("t1-a1/cgroup.procs")));
        assert_eq!(cgroups.existing(), vec!["t1-a1".to_string()]);
    }

    #[test]
    fn memsw_is_limited_where_the_kernel_accounts_swap() {
        let base = fake(&["memory"]);
        let dir = base.path().join("memory/tacc/a/x");
        std::fs::create_dir_all(&dir).unwrap();
        // Looked up at the agent's root, once.
        std::fs::write(dir.with_file_name(MEMSW_LIMIT), "").unwrap();
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        std::fs::write(dir.join("memory.memsw.limit_in_bytes"), "").unwrap();
        cgroups.create("x", &limits()).unwrap().unwrap();
        assert_eq!(read(dir.join("memory.memsw.limit_in_bytes")), "67108864");
        assert!(!dir.join("memory.swappiness").exists());
    }

    #[test]
    fn no_limits_write_no_limit_files() {
        let base = fake(&["memory", "cpu", "pids"]);
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        let none = Limits {
            cpu_millis: 0,
            memory_bytes: 0,
            pids_max: 0,
        };
        cgroups.create("x", &none).unwrap().unwrap();
        let dir = base.path().join("memory/tacc/a/x");
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
    }

    #[test]
    fn oom_kills_and_usage_are_read_from_their_files() {
        let base = fake(&["memory", "cpuacct"]);
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        assert_eq!(cgroup.oom_kills(), 0);
        std::fs::write(
            base.path().join("memory/tacc/a/x/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(cgroup.oom_kills(), 1);
        std::fs::write(
            base.path().join("cpuacct/tacc/a/x/cpuacct.usage"),
            "2500000000\n",
        )
        .unwrap();
        assert_eq!(cgroup.cpu_usage(), Some(Duration::from_millis(2500)));
    }

    #[test]
    fn usage_is_read_from_the_memory_cpu_and_cpuacct_files() {
        let base = fake(&["memory", "cpu", "cpuacct"]);
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/a/x").join(f);
        let limits_only = CgroupUsage {
            cpu_quota_millis: Some(500),
            memory_limit_bytes: Some(64 << 20),
            ..CgroupUsage::default()
        };
        assert_eq!(cgroup.usage(), limits_only);
        std::fs::write(at("cpuacct", "cpuacct.usage"), "1000000000\n").unwrap();
        std::fs::write(at("memory", "memory.failcnt"), "3\n").unwrap();
        std::fs::write(at("memory", "memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(at("memory", "memory.max_usage_in_bytes"), "8192\n").unwrap();
        std::fs::write(
            at("cpu", "cpu.stat"),
            "nr_periods 10\nnr_throttled 2\nthrottled_time 30000000\n",
        )
        .unwrap();
        assert_eq!(
            cgroup.usage(),
            CgroupUsage {
                cpu: Some(Duration::from_secs(1)),
                memory_bytes: Some(4096),
                memory_peak_bytes: Some(8192),
                throttled: Some(Duration::from_millis(30)),
                memory_failcnt: Some(3),
                cpu_periods: Some((10, 2)),
                ..limits_only
            }
        );
    }

    #[test]
    fn limits_change_live_and_memory_never_below_use() {
        let base = fake(&["memory", "cpu"]);
        let dir = base.path().join("memory/tacc/a/x");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.with_file_name(MEMSW_LIMIT), "").unwrap();
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        std::fs::write(dir.join("memory.memsw.limit_in_bytes"), "").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        let at = |c: &str, f: &str| base.path().join(c).join("tacc/a/x").join(f);
        std::fs::write(at("memory", "memory.usage_in_bytes"), "100000000\n").unwrap();
        cgroup.set_limits(2500, 128 << 20).unwrap();
        assert_eq!(read(at("cpu", "cpu.cfs_quota_us")), "250000");
        assert_eq!(read(at("memory", "memory.limit_in_bytes")), "134217728");
        assert_eq!(
            read(at("memory", "memory.memsw.limit_in_bytes")),
            "134217728"
        );
        let error = cgroup.set_limits(1000, 64 << 20).unwrap_err().to_string();
        assert!(
            error.contains("below the 100000000 bytes it uses now"),
            "{error}"
        );
        assert_eq!(read(at("memory", "memory.limit_in_bytes")), "134217728");
        cgroup.set_limits(0, 0).unwrap();
        assert_eq!(read(at("cpu", "cpu.cfs_quota_us")), "-1");
        assert_eq!(read(at("memory", "memory.limit_in_bytes")), "-1");
    }

    #[test]
    fn processes_are_listed_from_the_controller_every_join_writes_first() {
        let base = fake(&["cpu", "cpuacct", "memory", "pids", "freezer"]);
        let cgroups = crate::cgroups::detect_at(base.path(), "tacc/agent-1").unwrap();
        let cgroup = cgroups.create("t1-a1", &limits()).unwrap().unwrap();
        let first = cgroup.join_files()[0].clone();
        assert_eq!(
            first,
            base.path().join("memory/tacc/agent-1/t1-a1/cgroup.procs"),
            "a join writes memory's list first"
        );
        std::fs::write(&first, "42\n7\n42\n").unwrap();
        assert_eq!(cgroup.procs(), [7, 42]);
    }

    #[test]
    fn co_mounted_controllers_share_one_directory() {
        let base = fake(&["memory", "cpu,cpuacct"]);
        std::os::unix::fs::symlink("cpu,cpuacct", base.path().join("cpu")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", base.path().join("cpuacct")).unwrap();
        let cgroups = V1Cgroups::open(base.path(), "tacc/a").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        assert_eq!(cgroup.join_files().len(), 2);
    }

    #[test]
    fn the_memory_controller_is_required() {
        let base = fake(&["cpu"]);
        assert!(V1Cgroups::open(base.path(), "tacc/a").is_err());
    }
}
