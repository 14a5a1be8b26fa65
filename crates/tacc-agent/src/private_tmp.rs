//! A private `/tmp` and `/dev/shm` for every attempt, where the agent runs as root: a
//! tmpfs of the attempt's own under `DATA/scratch/slot-N/` (0700 root, so no task
//! reaches it from outside), holding `tmp/` and `shm/` (1777), which the process runtime
//! binds onto `/tmp` and `/dev/shm` in each execution's own mount namespace
//! ([`tacc_exec::PrivateTmp`], mounted by the launcher, `tacc-launch`). Setup and every local rank of the attempt share them; no
//! other attempt — another user's, or the same user's — sees them, and they are gone
//! (unmounted) once the attempt's end is reported (its processes are gone by then;
//! unmounting waits out a kernel grace period, milliseconds that would otherwise sit
//! between the end and the next task's start).
//!
//! The tmpfs is bounded by the attempt's memory on this node (`resources.memory`; the
//! kernel's default, half of RAM, when it has none). Its pages count against the attempt's
//! cgroup memory limit as well, so `/tmp` and `/dev/shm` never hold more than the task
//! may use in memory.
//!
//! Where the agent cannot (not root, a runtime that does not switch identities, mount
//! namespaces refused, a data directory under `/dev/shm`), tasks share the node's `/tmp`
//! and `/dev/shm`; the agent says so once in its log at start. An agent whose data
//! directory lies under `/tmp` (tests, scratch machines) binds the top directory there
//! that holds it (`/tmp/NAME`) back into every attempt's `/tmp`, so tasks still reach
//! their working directories: what lies in `/tmp/NAME` is then shared as on the host.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::mount::{MntFlags, MsFlags};
use tacc_exec::PrivateTmp;

/// The directory under the agent's data directory that holds the attempts' tmpfs mounts.
pub(crate) const SCRATCH_DIR: &str = "scratch";

/// The mode of `tmp/` and `shm/` inside an attempt's tmpfs: like the host's, private to
/// the attempt by its namespace.
const SHARED_TMP_MODE: u32 = 0o1777;

/// Whether this agent gives attempts a private `/tmp`, and where their tmpfs mounts live.
#[derive(Debug)]
pub(crate) enum PrivateTmps {
    Enabled {
        /// The program that mounts them in each execution (this agent's own binary).
        helper: PathBuf,
        /// The top directory in `/tmp` that holds the data directory, when it lies there
        /// (bound back at its path in every attempt's `/tmp`).
        keep: Option<PathBuf>,
        mount_points: Arc<MountPoints>,
    },
    Disabled,
}

impl PrivateTmps {
    /// Decide once, at start (after the data directory's layout is prepared), saying
    /// plainly in the log when tasks share the node's `/tmp` and `/dev/shm`. Mounts a
    /// previous life of the agent left behind are removed first (their processes were
    /// killed with the rest of its orphans).
    pub fn open(data_dir: &Path, tasks_switch: bool) -> PrivateTmps {
        let shared = |why: String| {
            tracing::warn!("tasks share this node's /tmp and /dev/shm with each other: {why}");
            PrivateTmps::Disabled
        };
        if !tasks_switch {
            return shared(
                "only an agent running as root, on a runtime that switches identities, gives \
                 each attempt a private /tmp and /dev/shm"
                    .to_string(),
            );
        }
        let data_dir = match data_dir.canonicalize() {
            Ok(dir) => dir,
            Err(e) => return shared(format!("cannot resolve {}: {e}", data_dir.display())),
        };
        if data_dir.starts_with("/dev/shm") {
            return shared(format!(
                "the agent's data directory {} lies under /dev/shm; move it (e.g. to \
                 /var/lib/tacc-agent) to give tasks private ones",
                data_dir.display()
            ));
        }
        // The top directory in /tmp that holds the data directory stays visible, so
        // whatever tasks reached through it on the host (their working directories, and
        // a test's files beside the data directory) they still reach.
        let helper = match std::env::current_exe() {
            Ok(helper) => helper,
            Err(e) => return shared(format!("cannot find the agent's own program: {e}")),
        };
        let keep = data_dir
            .strip_prefix("/tmp")
            .ok()
            .and_then(|below| below.components().next())
            .map(|top| Path::new("/tmp").join(top));
        let root = data_dir.join(SCRATCH_DIR);
        remove_leftovers(&root);
        let mount_points = Arc::new(MountPoints::new(root.clone()));
        let enabled = PrivateTmps::Enabled {
            helper,
            keep,
            mount_points,
        };
        match enabled.probe() {
            Ok(()) => {
                tracing::info!(
                    "each attempt gets a private /tmp and /dev/shm (a tmpfs the size of its \
                     memory, in a mount namespace of its own)"
                );
                enabled
            }
            Err(e) => shared(format!("the agent cannot give them private ones ({e})")),
        }
    }

    /// A private `/tmp` made and used in a throwaway namespace, as an attempt's will be.
    fn probe(&self) -> Result<(), String> {
        let attempt = self
            .for_attempt(".probe", 1 << 20)?
            .ok_or_else(|| "disabled".to_string())?;
        tacc_exec::probe_private_tmp(&attempt.placement())
    }

    /// The private `/tmp` of the attempt whose working directory is `name`, sized to
    /// `memory_bytes` (0: the kernel's default); `None` where attempts get none. `Err` is
    /// the message the attempt fails with.
    pub fn for_attempt(&self, name: &str, memory_bytes: u64) -> Result<Option<AttemptTmp>, String> {
        let PrivateTmps::Enabled {
            helper,
            keep,
            mount_points,
        } = self
        else {
            return Ok(None);
        };
        let dir = mount_points.take();
        if let Err(e) = mount_tmpfs(&dir, memory_bytes) {
            mount_points.put_back(dir.clone());
            return Err(format!(
                "cannot make the private /tmp of {name} at {}: {e}",
                dir.display()
            ));
        }
        let attempt = AttemptTmp {
            helper: helper.clone(),
            dir,
            keep: keep.clone(),
            mount_points: mount_points.clone(),
        };
        for sub in ["tmp", "shm"] {
            let path = attempt.dir.join(sub);
            std::fs::create_dir(&path)
                .and_then(|()| crate::layout::set_mode(&path, SHARED_TMP_MODE))
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        }
        Ok(Some(attempt))
    }
}

/// The directories under `scratch/` the attempts' tmpfs are mounted on, kept (empty,
/// nothing mounted) for the next attempt instead of removed: creating a directory on ext4
/// right after others were deleted makes the inode allocator walk past every recently
/// freed inode, which was an eighth of a busy agent's CPU (docs/BENCHMARKS.md). Nothing is
/// ever written into them: a fresh tmpfs covers one while an attempt has it.
#[derive(Debug)]
pub(crate) struct MountPoints {
    root: PathBuf,
    free: Mutex<Vec<PathBuf>>,
    made: std::sync::atomic::AtomicU64,
}

impl MountPoints {
    fn new(root: PathBuf) -> MountPoints {
        MountPoints {
            root,
            free: Mutex::new(Vec::new()),
            made: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A free mount point, or a new name (the directory is made when it is mounted on).
    fn take(&self) -> PathBuf {
        if let Some(dir) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return dir;
        }
        let n = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.root.join(format!("slot-{n}"))
    }

    /// A mount point with nothing mounted on it any more.
    fn put_back(&self, dir: PathBuf) {
        if dir.is_dir() {
            self.free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(dir);
        }
    }
}

/// One attempt's tmpfs, unmounted (lazily: a process that outlived the attempt keeps its
/// files until it ends) when dropped; its mount point goes back to [`MountPoints`].
#[derive(Debug)]
pub(crate) struct AttemptTmp {
    helper: PathBuf,
    dir: PathBuf,
    keep: Option<PathBuf>,
    mount_points: Arc<MountPoints>,
}

impl AttemptTmp {
    /// What the runtime binds onto `/tmp` and `/dev/shm`.
    pub fn placement(&self) -> PrivateTmp {
        PrivateTmp {
            helper: self.helper.clone(),
            tmp: self.dir.join("tmp"),
            shm: self.dir.join("shm"),
            keep: self.keep.clone(),
        }
    }
}

impl Drop for AttemptTmp {
    fn drop(&mut self) {
        match unmount(&self.dir) {
            Ok(()) => self.mount_points.put_back(self.dir.clone()),
            Err(e) => tracing::warn!(
                "cannot unmount the private /tmp at {}: {e}",
                self.dir.display()
            ),
        }
    }
}

/// A fresh tmpfs at `dir` (created where missing, 0700 root), with no devices and no
/// set-id programs.
fn mount_tmpfs(dir: &Path, memory_bytes: u64) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let mut options = String::from("mode=0700");
    if memory_bytes > 0 {
        options.push_str(&format!(",size={memory_bytes}"));
    }
    let mounted = nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    );
    mounted.map_err(Into::into)
}

/// Detach what is mounted on `dir` (EINVAL: nothing is).
fn unmount(dir: &Path) -> std::io::Result<()> {
    match nix::mount::umount2(dir, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn unmount_and_remove(dir: &Path) -> std::io::Result<()> {
    unmount(dir)?;
    std::fs::remove_dir(dir)
}

/// Unmounts and removes what a previous life of the agent left under `root`.
fn remove_leftovers(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match unmount_and_remove(&path) {
            Ok(()) => tracing::info!("removed the leftover private /tmp {}", path.display()),
            Err(e) => tracing::warn!(
                "cannot remove the leftover private /tmp {}: {e}",
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_reused_and_a_missing_one_is_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let points = MountPoints::new(root.path().to_path_buf());
        let first = points.take();
        let second = points.take();
        assert_eq!(first, root.path().join("slot-0"));
        assert_eq!(second, root.path().join("slot-1"));
        std::fs::create_dir(&first).unwrap();
        points.put_back(first.clone());
        // Never made (its mount failed before): not offered again.
        points.put_back(second);
        assert_eq!(points.take(), first);
        assert_eq!(points.take(), root.path().join("slot-2"));
    }
}
