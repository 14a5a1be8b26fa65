//! The agent's data directory: what is private to the agent, what tasks may reach, and
//! the ownership changes that hand a directory to a task or take one back.
//!
//! Modes, for an agent running as root with tasks under other uids:
//!
//! ```text
//! DATA/                 0711 root   tasks may pass through, not list
//!   run/ chunks/ files/ 0700 root   the agent's alone: process records, every user's code
//!   scratch/            0700 root   attempts' private /tmp and /dev/shm (tmpfs, bound
//!                                   into each attempt's own mount namespace)
//!   node.token          0600 root
//!   work/ users/        0711 root   tasks reach their own directory by name ...
//!     <attempt>/ <user>/ 0700 task  ... which only their uid may enter
//!   envs/ datasets/     0711 root   the caches tasks read through known paths ...
//!     <key>/            0755 root   ... sealed: root-owned, nobody else may write
//! ```
//!
//! `DATA` cannot be 0700: a task must traverse it to reach its working directory and the
//! caches its environment names; 0711 lets it do so without listing anything, and every
//! private entry below it carries its own 0700/0600. For the same reason every directory
//! from `/` down to `DATA` must be searchable by other users: where one is not, the agent
//! grants search (o+x, never read) on it and says so in its log.

use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tacc_exec::RunAs;

/// Directories only the agent uses.
const PRIVATE_DIRS: &[&str] = &["run", "chunks", "files", crate::private_tmp::SCRATCH_DIR];
/// Files only the agent reads (the node credential; the uid table of older versions).
const PRIVATE_FILES: &[&str] = &["node.token", crate::identity::OLD_UID_TABLE_FILE];
/// Directories tasks pass through to reach what is theirs or shared.
const TRAVERSED_DIRS: &[&str] = &["work", "users", "envs", "datasets"];

pub(crate) const PRIVATE_DIR_MODE: u32 = 0o700;
pub(crate) const TRAVERSE_ONLY_MODE: u32 = 0o711;

/// Creates the data directory and its subdirectories with the modes above (fixing the
/// modes of ones an earlier version created). `tasks_switch`: tasks run as other uids,
/// so the path down to the data directory must be searchable by them.
pub(crate) fn prepare(data_dir: &Path, tasks_switch: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    set_mode(data_dir, TRAVERSE_ONLY_MODE)?;
    for dir in PRIVATE_DIRS {
        let path = data_dir.join(dir);
        std::fs::create_dir_all(&path)?;
        set_mode(&path, PRIVATE_DIR_MODE)?;
    }
    for dir in TRAVERSED_DIRS {
        let path = data_dir.join(dir);
        std::fs::create_dir_all(&path)?;
        set_mode(&path, TRAVERSE_ONLY_MODE)?;
    }
    for file in PRIVATE_FILES {
        let path = data_dir.join(file);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            set_mode(&path, 0o600)?;
        }
    }
    if tasks_switch {
        grant_search_above(data_dir)?;
    }
    Ok(())
}

/// Creates the operator's `--work-dir` (working directories on a volume of their own)
/// with the mode of `DATA/work`: tasks reach their own directory by name, list nothing.
pub(crate) fn prepare_work_dir(work_dir: &Path, tasks_switch: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(work_dir)?;
    set_mode(work_dir, TRAVERSE_ONLY_MODE)?;
    if tasks_switch {
        grant_search_above(work_dir)?;
    }
    Ok(())
}

/// Makes every directory above `dir` searchable by others (adds o+x where it is missing).
fn grant_search_above(dir: &Path) -> std::io::Result<()> {
    let dir = std::fs::canonicalize(dir)?;
    for ancestor in dir.ancestors().skip(1) {
        let mode = std::fs::metadata(ancestor)?.permissions().mode();
        if mode & 0o001 == 0 {
            set_mode(ancestor, (mode & 0o7777) | 0o001)?;
            tracing::warn!(
                "granted search permission (o+x, not read) on {} so that task accounts can \
                 reach their working directories under {}; to leave it as it was, keep the \
                 agent's data directory under a path every user may traverse (e.g. /var/lib)",
                ancestor.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates `dir` (its parent must exist) private to `owner`: mode 0700, and the whole
/// tree handed to `owner` when it belongs to someone else (a directory from before task
/// accounts, or from a uid the node no longer uses). `None` keeps the agent's ownership.
pub(crate) fn private_dir(dir: &Path, owner: Option<RunAs>) -> std::io::Result<()> {
    match std::fs::DirBuilder::new()
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if let Some(owner) = owner {
        if meta.uid() != owner.uid || meta.gid() != owner.gid {
            give_tree(dir, owner)?;
        }
    }
    set_mode(dir, PRIVATE_DIR_MODE)
}

/// Hands a tree the agent built (no task can reach it yet) to `owner`, without following
/// symbolic links.
pub(crate) fn give_tree(root: &Path, owner: RunAs) -> std::io::Result<()> {
    let give = |path: &Path| std::os::unix::fs::lchown(path, Some(owner.uid), Some(owner.gid));
    give(root)?;
    if !std::fs::symlink_metadata(root)?.is_dir() {
        return Ok(());
    }
    // Each entry's type from its directory listing: no `stat` per entry (every task's
    // working directory is handed over this way).
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            give(&path)?;
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            }
        }
    }
    Ok(())
}

/// The modes a sealed tree gets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SealModes {
    pub top: u32,
    pub dir: u32,
    pub file: u32,
    pub executable: u32,
}

/// Shared caches tasks read and run: root-owned, writable by nobody else.
pub(crate) const SHARED: SealModes = SealModes {
    top: 0o755,
    dir: 0o755,
    file: 0o644,
    executable: 0o755,
};

/// Why a tree could not be sealed.
#[derive(Debug)]
pub(crate) enum SealError {
    /// Something that is neither a file, a directory nor a symbolic link.
    Special(PathBuf),
    /// An entry the builder did not create (say a hard link to another user's file).
    ForeignOwner {
        path: PathBuf,
        uid: u32,
    },
    Io(PathBuf, std::io::Error),
}

impl std::fmt::Display for SealError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SealError::Special(path) => write!(
                f,
                "{} is not a file, directory or symbolic link",
                path.display()
            ),
            SealError::ForeignOwner { path, uid } => write!(
                f,
                "{} belongs to uid {uid}, not to the account that built the tree; refusing it",
                path.display()
            ),
            SealError::Io(path, e) => write!(f, "{}: {e}", path.display()),
        }
    }
}

/// Takes a tree another identity (`builder`, the uid that wrote it) built and makes it the
/// agent's, read-only to everyone else: every directory is locked (owned by the agent)
/// before its entries are looked at, so the builder cannot swap an entry while the walk
/// runs; files are changed through a descriptor opened without following links, so no
/// other inode is touched; only entries the builder owns are accepted (a hard link to
/// someone else's file is refused, never chmod-ed); set-id bits are dropped.
pub(crate) fn seal(root: &Path, builder: u32, modes: SealModes) -> Result<u64, SealError> {
    seal_entry(root, builder, modes, modes.top)
}

fn seal_entry(
    path: &Path,
    builder: u32,
    modes: SealModes,
    dir_mode: u32,
) -> Result<u64, SealError> {
    let io = |e| SealError::Io(path.to_path_buf(), e);
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if meta.file_type().is_symlink() {
        check_owner(path, &meta, builder, me.0)?;
        std::os::unix::fs::lchown(path, Some(me.0), Some(me.1)).map_err(io)?;
        return Ok(0);
    }
    if !meta.is_dir() && !meta.is_file() {
        return Err(SealError::Special(path.to_path_buf()));
    }
    let file = open_no_follow(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    check_owner(path, &meta, builder, me.0)?;
    if meta.is_dir() {
        lock(&file, me, dir_mode).map_err(io)?;
        let mut total = 0;
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            entries.push(entry.map_err(io)?.path());
        }
        for entry in entries {
            total += seal_entry(&entry, builder, modes, modes.dir)?;
        }
        Ok(total)
    } else if meta.is_file() {
        let mode = if meta.mode() & 0o111 != 0 {
            modes.executable
        } else {
            modes.file
        };
        lock(&file, me, mode).map_err(io)?;
        Ok(meta.len())
    } else {
        Err(SealError::Special(path.to_path_buf()))
    }
}

fn check_owner(
    path: &Path,
    meta: &std::fs::Metadata,
    builder: u32,
    me: u32,
) -> Result<(), SealError> {
    if meta.uid() == builder || meta.uid() == me {
        Ok(())
    } else {
        Err(SealError::ForeignOwner {
            path: path.to_path_buf(),
            uid: meta.uid(),
        })
    }
}

fn lock(file: &File, (uid, gid): (u32, u32), mode: u32) -> std::io::Result<()> {
    let meta = file.metadata()?;
    if meta.uid() != uid || meta.gid() != gid {
        std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
}

/// Opens a file or directory for reading without following a final symbolic link and
/// without blocking on a FIFO.
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn the_data_directory_is_traversable_and_its_private_parts_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("agent");
        prepare(&data, false).unwrap();
        assert_eq!(mode(&data), 0o711);
        for private in PRIVATE_DIRS {
            assert_eq!(mode(&data.join(private)), 0o700, "{private}");
        }
        for traversed in TRAVERSED_DIRS {
            assert_eq!(mode(&data.join(traversed)), 0o711, "{traversed}");
        }
        // An earlier version's world-readable modes are fixed on the next start.
        set_mode(&data.join("run"), 0o755).unwrap();
        prepare(&data, false).unwrap();
        assert_eq!(mode(&data.join("run")), 0o700);
    }

    #[test]
    fn search_is_granted_on_the_way_down_when_tasks_switch() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("home");
        std::fs::create_dir(&blocked).unwrap();
        set_mode(&blocked, 0o700).unwrap();
        prepare(&blocked.join("tacc").join("agent"), true).unwrap();
        assert_eq!(mode(&blocked), 0o701);
    }

    #[test]
    fn a_sealed_tree_is_the_agent_s_with_set_id_bits_and_write_bits_gone() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("env");
        std::fs::create_dir_all(tree.join("bin")).unwrap();
        std::fs::write(tree.join("bin/tool"), "#!/bin/sh\n").unwrap();
        set_mode(&tree.join("bin/tool"), 0o4777).unwrap();
        std::fs::write(tree.join("data"), "x").unwrap();
        set_mode(&tree.join("data"), 0o666).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tree.join("link")).unwrap();
        let target_mode = mode(Path::new("/etc/passwd"));
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(seal(&tree, me, SHARED).unwrap(), 11);
        assert_eq!(mode(&tree), 0o755);
        assert_eq!(mode(&tree.join("bin/tool")), 0o755);
        assert_eq!(mode(&tree.join("data")), 0o644);
        // The link's target is untouched.
        assert_eq!(mode(Path::new("/etc/passwd")), target_mode);

        std::fs::remove_file(tree.join("link")).unwrap();
        nix::unistd::mkfifo(&tree.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            seal(&tree, me, SHARED),
            Err(SealError::Special(_))
        ));
    }

    #[test]
    fn a_tree_with_someone_else_s_file_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            return; // only root can make a tree that holds another uid's file
        }
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("env");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("planted"), "x").unwrap();
        // The tree was built by uid 54321, but `planted` is root's (as a hard link to a
        // root-owned file would be): it must not be chmod-ed.
        std::os::unix::fs::lchown(&tree, Some(54_321), Some(54_321)).unwrap();
        set_mode(&tree.join("planted"), 0o600).unwrap();
        std::os::unix::fs::lchown(tree.join("planted"), Some(7), Some(7)).unwrap();
        let error = seal(&tree, 54_321, SHARED).unwrap_err();
        assert!(
            matches!(error, SealError::ForeignOwner { uid: 7, .. }),
            "{error}"
        );
        assert_eq!(mode(&tree.join("planted")), 0o600);
    }

    #[test]
    fn a_private_dir_is_handed_to_its_owner_whole() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("alice");
        std::fs::create_dir_all(user.join("cache")).unwrap();
        std::fs::write(user.join("cache/x"), "x").unwrap();
        let owner = RunAs {
            uid: 54_321,
            gid: 54_321,
        };
        private_dir(&user, Some(owner)).unwrap();
        assert_eq!(mode(&user), 0o700);
        let meta = std::fs::metadata(user.join("cache/x")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (54_321, 54_321));
    }

    #[test]
    fn a_tree_is_given_whole_and_its_links_are_not_followed() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "not the task's").unwrap();
        let root = dir.path().join("work");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/file"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/link")).unwrap();
        let owner = RunAs {
            uid: 54_322,
            gid: 54_323,
        };
        give_tree(&root, owner).unwrap();
        for path in ["", "a", "a/b", "a/b/file", "a/link"] {
            let meta = std::fs::symlink_metadata(root.join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (54_322, 54_323), "{path}");
        }
        let target = std::fs::metadata(&outside).unwrap();
        assert_eq!(target.uid(), 0, "a link's target is never given away");
    }
}
