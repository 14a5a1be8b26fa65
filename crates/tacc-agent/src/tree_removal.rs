//! Removing a directory tree the agent left read-only (a sealed dataset or environment
//! copy, a working directory with read-only code), in-process: no `chmod` child whose
//! complaints about a tree that is not there would land in the agent's log.

use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Remove `path` and everything below it; a path that does not exist is already removed.
/// Where the plain removal is refused (a directory without owner write), owner
/// read/write/search is added to every directory of the tree and the removal tried again.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(meta) if !meta.is_dir() => return std::fs::remove_file(path),
        Ok(_) => {}
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(_) => {
            open_directories(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

/// Owner rwx on `dir` and every directory below it (never following links): removing an
/// entry needs write and search on its directory, not on the entry itself.
fn open_directories(dir: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            open_directories(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_that_is_not_there_is_already_removed() {
        let dir = tempfile::tempdir().unwrap();
        remove_tree(&dir.path().join(".fetch-missing")).unwrap();
    }

    #[test]
    fn a_read_only_tree_is_removed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sealed");
        std::fs::create_dir_all(root.join("data/inner")).unwrap();
        std::fs::write(root.join("data/inner/file"), "x").unwrap();
        std::os::unix::fs::symlink("/nonexistent", root.join("data/link")).unwrap();
        std::fs::set_permissions(
            root.join("data/inner/file"),
            std::fs::Permissions::from_mode(0o444),
        )
        .unwrap();
        for path in ["data/inner", "data", ""] {
            std::fs::set_permissions(root.join(path), std::fs::Permissions::from_mode(0o555))
                .unwrap();
        }
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_file_is_removed_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stale");
        std::fs::write(&file, "x").unwrap();
        remove_tree(&file).unwrap();
        assert!(!file.exists());
    }
}
