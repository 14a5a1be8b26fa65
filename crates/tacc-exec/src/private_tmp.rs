//! A private `/tmp` and `/dev/shm` for a process execution: the child enters a mount
//! namespace of its own (`unshare --mount`, propagation `slave`, so the host's mounts
//! still reach it but nothing it mounts leaves it) and binds the directories the caller
//! prepared for the attempt ([`PrivateTmp`]) onto `/tmp` and `/dev/shm` — as root, before
//! the identity switch, and before anything of the task runs. Every execution of one
//! attempt (setup, each local rank) binds the same directories, so they share their
//! temporary files and shared memory; no other attempt sees them.
//!
//! Like the cgroup join and the identity switch, this is done by programs the child
//! `exec`s in turn (util-linux `unshare` and `mount`, `sh`), never by code of the agent
//! between `fork` and `exec` (the workspace has no `unsafe`).

use std::path::PathBuf;

/// util-linux: the new mount namespace.
const UNSHARE: &str = "/usr/bin/unshare";

/// Binds `$2` on `/dev/shm` and `$1` on `/tmp`, then `exec`s the rest of its arguments
/// (same pid); any failure ends it with 125 before the task runs. `/tmp` goes last, so a
/// source under `/tmp` is still found.
const BIND_SCRIPT: &str = r#"/bin/mount --bind "$2" /dev/shm && /bin/mount --bind "$1" /tmp && shift 2 && exec "$@"; exit 125"#;

/// The same, for an agent whose data directory `$3` lies under `/tmp` (a test's, a
/// scratch machine's): the shell holds on to it as its working directory while `/tmp` is
/// covered, then binds it back at its own path inside the new `/tmp` (through
/// `/proc/self/cwd`, which `mount -c` leaves for the kernel to follow), so the task still
/// reaches its working directory, its home and the caches. The directories made for it in
/// the new `/tmp` are searchable by the task (umask 022 for `mkdir` alone: the task keeps
/// the agent's).
const BIND_KEEPING_SCRIPT: &str = r#"cd "$3" && /bin/mount --bind "$2" /dev/shm && /bin/mount --bind "$1" /tmp && (umask 022 && /bin/mkdir -p "$3") && /bin/mount -c --rbind /proc/self/cwd "$3" && cd / && shift 3 && exec "$@"; exit 125"#;

/// The directories an attempt's executions see as `/tmp` and `/dev/shm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateTmp {
    pub tmp: PathBuf,
    pub shm: PathBuf,
    /// A directory under `/tmp` the execution must still reach at its path: the one that
    /// holds the agent's data directory, when it lies there. (One under `/dev/shm` is not
    /// supported.)
    pub keep: Option<PathBuf>,
}

impl PrivateTmp {
    /// The programs the child runs before the task's own (whose argv follows).
    pub(crate) fn argv(&self) -> Vec<String> {
        let mut argv: Vec<String> = [
            UNSHARE,
            "--mount",
            "--propagation",
            "slave",
            "--",
            "/bin/sh",
            "-c",
        ]
        .map(String::from)
        .to_vec();
        argv.push(
            if self.keep.is_some() {
                BIND_KEEPING_SCRIPT
            } else {
                BIND_SCRIPT
            }
            .to_string(),
        );
        argv.push("tacc-private-tmp".to_string());
        argv.push(self.tmp.display().to_string());
        argv.push(self.shm.display().to_string());
        if let Some(keep) = &self.keep {
            argv.push(keep.display().to_string());
        }
        argv
    }
}

/// Whether executions can get `private` as their `/tmp` and `/dev/shm` here: runs the
/// namespace and bind steps in a throwaway namespace, then checks `/tmp` is the new one
/// and `keep` still reached. `Err` says why not (no `unshare`, a kernel or container that
/// refuses mount namespaces, a failed bind).
pub fn probe_private_tmp(private: &PrivateTmp) -> Result<(), String> {
    let marker = "tacc-private-tmp-probe";
    std::fs::write(private.tmp.join(marker), "")
        .map_err(|e| format!("cannot write into {}: {e}", private.tmp.display()))?;
    let mut check = format!("test -e /tmp/{marker}");
    if let Some(keep) = &private.keep {
        check.push_str(&format!(" && test -d '{}'", keep.display()));
    }
    let argv = private.argv();
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .args(["/bin/sh", "-c", &check])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {UNSHARE}: {e}"))?;
    let _ = std::fs::remove_file(private.tmp.join(marker));
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "a mount namespace with a private /tmp failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_binds_both_directories_before_the_task() {
        let private = PrivateTmp {
            tmp: "/data/scratch/a/tmp".into(),
            shm: "/data/scratch/a/shm".into(),
            keep: None,
        };
        let argv = private.argv();
        assert_eq!(argv[0], UNSHARE);
        assert_eq!(
            &argv[argv.len() - 2..],
            ["/data/scratch/a/tmp", "/data/scratch/a/shm"]
        );
        assert!(argv.contains(&"slave".to_string()));
    }
}
