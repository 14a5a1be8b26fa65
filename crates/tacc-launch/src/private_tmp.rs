//! The private `/tmp` and `/dev/shm` of an execution: a mount namespace of its own with
//! the execution's directories bound on both (the launcher's step 2; `tacc_exec`'s
//! `private-tmp` helper runs the same function).

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::mount::MsFlags;

/// The mode of the directories made in the new `/tmp` on the way to `keep`: searchable by
/// the task.
const KEEP_PATH_MODE: u32 = 0o755;

/// The namespace and its binds, in this process (the helper's and the launcher's step).
pub fn namespace(tmp: &Path, shm: &Path, keep: Option<&Path>) -> std::io::Result<()> {
    let context =
        |what: String| move |e: nix::errno::Errno| std::io::Error::other(format!("{what}: {e}"));
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(context("cannot make a mount namespace".into()))?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(context("cannot make / a slave mount".into()))?;
    // Held open while /tmp is covered: the way back to it (opened in the new namespace,
    // whose mounts alone may be bound here).
    let kept = keep
        .map(|dir| {
            std::fs::File::open(dir)
                .map_err(|e| std::io::Error::other(format!("cannot open {}: {e}", dir.display())))
        })
        .transpose()?;
    // /dev/shm first: a source under /tmp (a test's data directory) is still found.
    for (source, target) in [(shm, "/dev/shm"), (tmp, "/tmp")] {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(context(format!(
            "cannot bind {} on {target}",
            source.display()
        )))?;
    }
    if let (Some(dir), Some(kept)) = (keep, kept) {
        std::fs::create_dir_all(dir)?;
        for made in dir.ancestors().take_while(|p| *p != Path::new("/tmp")) {
            std::fs::set_permissions(made, std::fs::Permissions::from_mode(KEEP_PATH_MODE))?;
        }
        let source = format!("/proc/self/fd/{}", kept.as_raw_fd());
        nix::mount::mount(
            Some(source.as_str()),
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(context(format!("cannot bind {} back", dir.display())))?;
    }
    Ok(())
}
