//! Whether a task's identity may enter its working directory: checked before a launch so
//! that a directory it may not enter fails the launch cleanly (an infrastructure error
//! naming the directory) instead of as the task's own exit. Entering it as that identity,
//! in the launcher after the switch, is what enforces it; this is only the early answer.
//!
//! Every launch asks about a directory under the same few ancestors (the agent's data
//! directory and the system's above it): each ancestor found enterable is not looked at
//! again for [`ANCESTORS_TRUSTED_FOR`] — eight `stat`s per launch became one. The working
//! directory itself is always looked at.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::RunAs;

/// How long an ancestor found enterable by an identity is taken to stay so.
pub(crate) const ANCESTORS_TRUSTED_FOR: Duration = Duration::from_secs(1);
/// Entries kept at most (all of them forgotten past it).
const REMEMBERED: usize = 4096;

static ENTERABLE: Mutex<BTreeMap<(u32, u32, PathBuf), Instant>> = Mutex::new(BTreeMap::new());

/// Whether `run_as` may enter `dir`: search permission on it and every directory above it,
/// by the mode bits (owner, group, others; the task has no supplementary groups).
pub(crate) fn identity_can_enter(dir: &Path, run_as: RunAs) -> std::io::Result<()> {
    identity_can_enter_at(dir, run_as, Instant::now())
}

fn identity_can_enter_at(dir: &Path, run_as: RunAs, now: Instant) -> std::io::Result<()> {
    let mut path = PathBuf::new();
    let mut components = dir.components().peekable();
    while let Some(component) = components.next() {
        path.push(component);
        let ancestor = components.peek().is_some();
        let key = (run_as.uid, run_as.gid, path.clone());
        if ancestor && recently_enterable(&key, now) {
            continue;
        }
        may_search(&path, run_as)?;
        if ancestor {
            let mut known = ENTERABLE.lock().unwrap_or_else(|e| e.into_inner());
            if known.len() >= REMEMBERED {
                known.clear();
            }
            known.insert(key, now);
        }
    }
    Ok(())
}

fn recently_enterable(key: &(u32, u32, PathBuf), now: Instant) -> bool {
    ENTERABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        .is_some_and(|at| now.saturating_duration_since(*at) < ANCESTORS_TRUSTED_FOR)
}

fn may_search(path: &Path, run_as: RunAs) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    let bits = if meta.uid() == run_as.uid {
        meta.mode() >> 6
    } else if meta.gid() == run_as.gid {
        meta.mode() >> 3
    } else {
        meta.mode()
    };
    if bits & 0o1 == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "Permission denied: uid {} may not enter {}",
                run_as.uid,
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// An identity that owns nothing here: the "others" bits decide.
    const STRANGER: RunAs = RunAs {
        uid: 4_000_123,
        gid: 4_000_123,
    };

    #[test]
    fn a_directory_or_an_ancestor_without_search_permission_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("parent");
        let work = parent.join("work");
        std::fs::create_dir_all(&work).unwrap();
        mode(root.path(), 0o755);
        mode(&parent, 0o755);
        mode(&work, 0o700);
        let t0 = Instant::now();
        let refused = identity_can_enter_at(&work, STRANGER, t0).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains(&work.display().to_string()));
        mode(&work, 0o711);
        identity_can_enter_at(&work, STRANGER, t0).unwrap();
        // The working directory itself is looked at every time.
        mode(&work, 0o700);
        assert!(identity_can_enter_at(&work, STRANGER, t0).is_err());
        // An ancestor found enterable is trusted for a while (the launcher enforces it
        // meanwhile), and looked at again after.
        mode(&work, 0o711);
        mode(&parent, 0o700);
        identity_can_enter_at(&work, STRANGER, t0 + ANCESTORS_TRUSTED_FOR / 2).unwrap();
        let later = t0 + ANCESTORS_TRUSTED_FOR * 2;
        let refused = identity_can_enter_at(&work, STRANGER, later).unwrap_err();
        assert!(refused.to_string().contains(&parent.display().to_string()));
        mode(&parent, 0o755);
    }

    #[test]
    fn what_one_identity_may_enter_says_nothing_of_another() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("p");
        let work = parent.join("w");
        std::fs::create_dir_all(&work).unwrap();
        mode(root.path(), 0o755);
        mode(&work, 0o711);
        let owner = RunAs {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        mode(&parent, 0o700);
        let t0 = Instant::now();
        identity_can_enter_at(&work, owner, t0).unwrap();
        assert!(identity_can_enter_at(&work, STRANGER, t0).is_err());
    }
}
