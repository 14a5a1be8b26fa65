//! A private `/tmp` and `/dev/shm` for a process execution: the child enters a mount
//! namespace of its own (propagation `slave`, so the host's mounts still reach it but
//! nothing it mounts leaves it) and binds the directories the caller prepared for the
//! attempt ([`PrivateTmp`]) onto `/tmp` and `/dev/shm` — as root, before the identity
//! switch, and before anything of the task runs. Every execution of one attempt (setup,
//! each local rank) binds the same directories, so they share their temporary files and
//! shared memory; no other attempt sees them.
//!
//! Like the cgroup join and the identity switch, this is done by a program the child
//! `exec`s, never by code of the agent between `fork` and `exec` (the workspace has no
//! `unsafe`): the agent's own binary, run as `HELPER private-tmp --tmp T --shm S [--keep K]
//! -- PROGRAM ARGS…`, calls [`enter_private_tmp`], which `exec`s the rest (same pid) —
//! one short-lived program per launch rather than a shell and a `mount` per directory.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The helper's subcommand (hidden in `taccd`).
pub const PRIVATE_TMP_SUBCOMMAND: &str = "private-tmp";

/// The directories an attempt's executions see as `/tmp` and `/dev/shm`, and the program
/// that mounts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateTmp {
    /// A program that runs [`enter_private_tmp`] as its [`PRIVATE_TMP_SUBCOMMAND`] (the
    /// agent's own binary, `taccd`).
    pub helper: PathBuf,
    pub tmp: PathBuf,
    pub shm: PathBuf,
    /// A directory under `/tmp` the execution must still reach at its path: the one that
    /// holds the agent's data directory, when it lies there. (One under `/dev/shm` is not
    /// supported.)
    pub keep: Option<PathBuf>,
}

impl PrivateTmp {
    /// The program the child runs before the task's own (whose argv follows).
    pub(crate) fn argv(&self) -> Vec<String> {
        let mut argv = vec![
            self.helper.display().to_string(),
            PRIVATE_TMP_SUBCOMMAND.to_string(),
            "--tmp".to_string(),
            self.tmp.display().to_string(),
            "--shm".to_string(),
            self.shm.display().to_string(),
        ];
        if let Some(keep) = &self.keep {
            argv.push("--keep".to_string());
            argv.push(keep.display().to_string());
        }
        argv.push("--".to_string());
        argv
    }
}

/// The helper's work: a new mount namespace, `shm` bound on `/dev/shm` and `tmp` on
/// `/tmp`, `keep` bound back at its path inside the new `/tmp`, then `exec` of `command`
/// (environment, working directory and descriptors as they are). Returns only on failure.
pub fn enter_private_tmp(
    tmp: &Path,
    shm: &Path,
    keep: Option<&Path>,
    command: &[OsString],
) -> std::io::Error {
    match tacc_launch::private_tmp_namespace(tmp, shm, keep) {
        Ok(()) => {}
        Err(e) => return e,
    }
    let Some((program, args)) = command.split_first() else {
        return std::io::Error::other("no program to run");
    };
    std::process::Command::new(program).args(args).exec()
}

/// Whether executions can get `private` as their `/tmp` and `/dev/shm` here: runs the
/// helper in a throwaway namespace, then checks `/tmp` is the new one and `keep` still
/// reached. `Err` says why not (a kernel or container that refuses mount namespaces, a
/// helper that is not `taccd`, a failed bind).
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
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
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
    fn the_helper_gets_both_directories_then_the_task() {
        let private = PrivateTmp {
            helper: "/usr/bin/taccd".into(),
            tmp: "/data/scratch/a/tmp".into(),
            shm: "/data/scratch/a/shm".into(),
            keep: None,
        };
        assert_eq!(
            private.argv(),
            [
                "/usr/bin/taccd",
                PRIVATE_TMP_SUBCOMMAND,
                "--tmp",
                "/data/scratch/a/tmp",
                "--shm",
                "/data/scratch/a/shm",
                "--"
            ]
        );
    }
}
