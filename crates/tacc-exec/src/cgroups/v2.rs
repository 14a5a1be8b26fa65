//! cgroup v2: one unified hierarchy. The agent's root (`<mount>/tacc/<agent>`) has the
//! `cpu`, `memory` and `pids` controllers enabled down to it, and holds no process
//! itself; each execution is a leaf below it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::usage::{number, psi_some_avg10};
use super::{
    CPU_PERIOD_US, Cgroup, CgroupUsage, Cgroups, KillReport, Limits, check_memory_floor,
    cpu_quota_us, keyed_value, kill_loop, make_dir, read_pids, remove_dir, subdirs, wait_empty,
    write_file,
};
use crate::ExecError;

const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// One agent's root in the unified hierarchy.
#[derive(Debug, Clone)]
pub struct V2Cgroups {
    root: PathBuf,
}

impl V2Cgroups {
    /// The agent root `name` under the unified hierarchy mounted at `base`, created with
    /// the controllers enabled on the way down. The memory controller is required.
    pub fn open(base: &Path, name: &str) -> Result<V2Cgroups, ExecError> {
        let available = std::fs::read_to_string(base.join("cgroup.controllers"))
            .map_err(|e| super::file_error("read", &base.join("cgroup.controllers"), e))?;
        let available: Vec<&str> = available.split_whitespace().collect();
        if !available.contains(&"memory") {
            return Err(ExecError::Cgroup {
                action: "find",
                path: base.display().to_string(),
                detail: "the v2 hierarchy has no memory controller".into(),
            });
        }
        let enable: Vec<&str> = CONTROLLERS
            .into_iter()
            .filter(|c| available.contains(c))
            .collect();
        let mut dir = base.to_path_buf();
        for part in Path::new(name).components() {
            // One controller per write: a write naming one the parent lacks fails whole.
            for controller in &enable {
                write_file(
                    &dir.join("cgroup.subtree_control"),
                    &format!("+{controller}"),
                )?;
            }
            dir.push(part);
            make_dir(&dir)?;
        }
        for controller in &enable {
            write_file(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            )?;
        }
        Ok(V2Cgroups { root: dir })
    }
}

impl Cgroups for V2Cgroups {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Option<Box<dyn Cgroup>>, ExecError> {
        let cgroup = V2Cgroup {
            dir: self.root.join(name),
        };
        if let Err(error) = cgroup.apply(limits) {
            let _ = cgroup.remove();
            return Err(error);
        }
        Ok(Some(Box::new(cgroup)))
    }

    fn close(&self) {
        let _ = std::fs::remove_dir(&self.root);
    }

    fn existing(&self) -> Vec<String> {
        subdirs(&self.root)
    }

    fn open(&self, name: &str) -> Option<Box<dyn Cgroup>> {
        let dir = self.root.join(name);
        dir.is_dir()
            .then(|| Box::new(V2Cgroup { dir }) as Box<dyn Cgroup>)
    }
}

/// One execution's leaf in the unified hierarchy.
#[derive(Debug, Clone)]
pub struct V2Cgroup {
    dir: PathBuf,
}

impl V2Cgroup {
    fn apply(&self, limits: &Limits) -> Result<(), ExecError> {
        make_dir(&self.dir)?;
        if limits.memory_bytes > 0 {
            write_file(
                &self.dir.join("memory.max"),
                &limits.memory_bytes.to_string(),
            )?;
            // Off swap where the kernel accounts it; on OOM the whole cgroup goes, as a
            // container's would (files absent on kernels without them).
            for (file, value) in [("memory.swap.max", "0"), ("memory.oom.group", "1")] {
                let path = self.dir.join(file);
                if path.is_file() {
                    write_file(&path, value)?;
                }
            }
        }
        if limits.cpu_millis > 0 {
            write_file(
                &self.dir.join("cpu.max"),
                &format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.cpu_millis)),
            )?;
        }
        if limits.pids_max > 0 {
            write_file(&self.dir.join("pids.max"), &limits.pids_max.to_string())?;
        }
        Ok(())
    }
}

/// The quota of a `cpu.max` (`QUOTA PERIOD`, or `max PERIOD` without one), in
/// thousandths of a CPU.
fn cpu_max_millis(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut fields = text.split_whitespace();
    let quota: u64 = fields.next()?.parse().ok()?;
    let period: u64 = fields.next()?.parse().ok()?;
    (period > 0).then(|| quota * 1000 / period)
}

impl Cgroup for V2Cgroup {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn join_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("cgroup.procs")]
    }

    fn procs(&self) -> Vec<u32> {
        read_pids(&self.dir.join("cgroup.procs"))
    }

    fn oom_kills(&self) -> u64 {
        keyed_value(&self.dir.join("memory.events"), "oom_kill").unwrap_or(0)
    }

    fn cpu_usage(&self) -> Option<Duration> {
        keyed_value(&self.dir.join("cpu.stat"), "usage_usec").map(Duration::from_micros)
    }

    fn usage(&self) -> CgroupUsage {
        CgroupUsage {
            cpu: self.cpu_usage(),
            memory_bytes: number(&self.dir.join("memory.current")),
            // `memory.peak` exists from Linux 5.19 on.
            memory_peak_bytes: number(&self.dir.join("memory.peak")),
            throttled: keyed_value(&self.dir.join("cpu.stat"), "throttled_usec")
                .map(Duration::from_micros),
            cpu_periods: super::usage::cpu_periods(&self.dir.join("cpu.stat")),
            cpu_quota_millis: cpu_max_millis(&self.dir.join("cpu.max")),
            // `max` (no limit) does not parse as a number.
            memory_limit_bytes: number(&self.dir.join("memory.max")),
            memory_pressure_percent: psi_some_avg10(&self.dir.join("memory.pressure")),
            memory_failcnt: None,
            io_pressure_percent: psi_some_avg10(&self.dir.join("io.pressure")),
        }
    }

    fn set_limits(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        check_memory_floor(
            &self.dir,
            memory_bytes,
            number(&self.dir.join("memory.current")),
        )?;
        let memory = if memory_bytes == 0 {
            "max".to_string()
        } else {
            memory_bytes.to_string()
        };
        write_file(&self.dir.join("memory.max"), &memory)?;
        let cpu = if cpu_millis == 0 {
            format!("max {CPU_PERIOD_US}")
        } else {
            format!("{} {CPU_PERIOD_US}", cpu_quota_us(cpu_millis))
        };
        write_file(&self.dir.join("cpu.max"), &cpu)
    }

    fn kill_all(&self, deadline: Duration) -> KillReport {
        let kill_file = self.dir.join("cgroup.kill");
        if kill_file.is_file() {
            // Linux ≥ 5.14: the kernel kills every process, forks included, at once.
            let mut report = KillReport::default();
            let pids = self.procs();
            if pids.is_empty() {
                report.empty = true;
                return report;
            }
            report.killed = pids.iter().map(|&p| (p, super::command_name(p))).collect();
            let _ = write_file(&kill_file, "1");
            report.empty = wait_empty(|| self.procs(), deadline);
            return report;
        }
        let freeze = |frozen: bool| {
            let _ = write_file(
                &self.dir.join("cgroup.freeze"),
                if frozen { "1" } else { "0" },
            );
        };
        kill_loop(|| self.procs(), freeze, deadline)
    }

    fn remove(&self) -> Result<(), ExecError> {
        remove_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::tests::limits;

    fn fake(controllers: &str) -> tempfile::TempDir {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("cgroup.controllers"), controllers).unwrap();
        base
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_string()
    }

    #[test]
    fn controllers_are_enabled_down_to_the_agent_root_and_limits_written() {
        let base = fake("cpuset cpu io memory hugetlb pids rdma\n");
        let cgroups = crate::cgroups::detect_at(base.path(), "tacc/agent-1").unwrap();
        assert_eq!(cgroups.version(), "v2");
        // The fake keeps only the last write; the kernel keeps each enabled controller.
        for dir in ["", "tacc", "tacc/agent-1"] {
            assert_eq!(
                read(base.path().join(dir).join("cgroup.subtree_control")),
                "+pids"
            );
        }
        let leaf = base.path().join("tacc/agent-1/t1-a1");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("memory.oom.group"), "0").unwrap();
        let cgroup = cgroups.create("t1-a1", &limits()).unwrap().unwrap();
        assert_eq!(read(leaf.join("memory.max")), "67108864");
        assert_eq!(read(leaf.join("memory.oom.group")), "1");
        assert!(!leaf.join("memory.swap.max").exists());
        assert_eq!(read(leaf.join("cpu.max")), "50000 100000");
        assert_eq!(read(leaf.join("pids.max")), "100");
        assert_eq!(cgroup.join_files(), vec![leaf.join("cgroup.procs")]);
        assert_eq!(cgroups.existing(), vec!["t1-a1".to_string()]);
    }

    #[test]
    fn oom_kills_and_usage_are_read_from_their_files() {
        let base = fake("cpu memory pids");
        let cgroups = V2Cgroups::open(base.path(), "tacc/a").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        let leaf = base.path().join("tacc/a/x");
        std::fs::write(
            leaf.join("memory.events"),
            "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n",
        )
        .unwrap();
        std::fs::write(
            leaf.join("cpu.stat"),
            "usage_usec 1500000\nuser_usec 1000000\n",
        )
        .unwrap();
        assert_eq!(cgroup.oom_kills(), 1);
        assert_eq!(cgroup.cpu_usage(), Some(Duration::from_millis(1500)));
        std::fs::write(leaf.join("memory.current"), "65536\n").unwrap();
        std::fs::write(
            leaf.join("cpu.stat"),
            "usage_usec 1500000\nnr_throttled 3\nthrottled_usec 2500\n",
        )
        .unwrap();
        assert_eq!(
            cgroup.usage(),
            CgroupUsage {
                cpu: Some(Duration::from_millis(1500)),
                memory_bytes: Some(65536),
                // No `memory.peak` on this (fake) kernel.
                memory_peak_bytes: None,
                throttled: Some(Duration::from_micros(2500)),
                ..cgroup.usage()
            }
        );
        // An empty cgroup needs no kill.
        let report = cgroup.kill_all(Duration::from_millis(50));
        assert!(report.empty && report.killed.is_empty());
    }

    #[test]
    fn a_hierarchy_without_the_memory_controller_is_refused() {
        let base = fake("hugetlb");
        assert!(V2Cgroups::open(base.path(), "tacc/a").is_err());
    }

    #[test]
    fn limits_and_pressure_are_read_and_limits_change_live() {
        let base = fake("cpu memory pids");
        let cgroups = V2Cgroups::open(base.path(), "tacc/a").unwrap();
        let cgroup = cgroups.create("x", &limits()).unwrap().unwrap();
        let leaf = base.path().join("tacc/a/x");
        std::fs::write(
            leaf.join("memory.pressure"),
            "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=5\n",
        )
        .unwrap();
        std::fs::write(
            leaf.join("io.pressure"),
            "some avg10=0.75 avg60=0.10 avg300=0.00 total=9\n",
        )
        .unwrap();
        std::fs::write(leaf.join("memory.current"), "1000\n").unwrap();
        let usage = cgroup.usage();
        assert_eq!(usage.cpu_quota_millis, Some(500));
        assert_eq!(usage.memory_limit_bytes, Some(64 << 20));
        assert_eq!(usage.memory_pressure_percent, Some(12.5));
        assert_eq!(usage.io_pressure_percent, Some(0.75));
        cgroup.set_limits(3000, 1 << 30).unwrap();
        let read = |f: &str| std::fs::read_to_string(leaf.join(f)).unwrap();
        assert_eq!(read("cpu.max"), "300000 100000");
        assert_eq!(read("memory.max"), "1073741824");
        let error = cgroup.set_limits(3000, 999).unwrap_err().to_string();
        assert!(
            error.contains("never shrink memory below current use"),
            "{error}"
        );
        cgroup.set_limits(0, 0).unwrap();
        assert_eq!(read("cpu.max"), "max 100000");
        assert_eq!(read("memory.max"), "max");
        assert_eq!(cgroup.usage().memory_limit_bytes, None);
    }
}
