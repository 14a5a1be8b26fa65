//! The control files of a reused cgroup, kept open between executions.
//!
//! A trivial task's cgroup on v1 is joined in five controllers and its counters read and
//! reset at every reuse: a dozen opens of cgroupfs files per task, each a walk down a
//! six-level path and a kernfs open, which were a tenth of the agent's CPU (profile of
//! 2026-11-28 in docs/BENCHMARKS.md). Opened once, each is then one `pread`/`pwrite`:
//! cgroupfs regenerates a file's text for a read at offset 0, and a write is one
//! operation whatever the offset.
//!
//! Kept only on cgroupfs (checked once per file with `fstatfs`): a plain file — the
//! tests' fake hierarchies — is opened for each use, as before, since a write at offset 0
//! would not truncate it. Never kept: `cgroup.procs` for reading (cgroup v1 keeps the
//! pid list an open file has read for a second and may hand the same list back to the
//! next read of that file — a stale answer to "is it empty?"), and anything not read or
//! written through here. At most [`BUDGET`] are kept by the whole agent (a node running
//! many executions at once keeps the files of the first ones, and opens the others'
//! for each use): tasks inherit the agent's open-file limit, which it does not raise.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How many control files the agent keeps open at most, all cgroups together: about
/// twenty executions' worth, well inside the common soft limit of 1,024 descriptors.
pub(crate) const BUDGET: usize = 256;

/// Control files kept open now, all cgroups together.
static KEPT: AtomicUsize = AtomicUsize::new(0);

/// `CGROUP_SUPER_MAGIC` and `CGROUP2_SUPER_MAGIC` (`linux/magic.h`).
const CGROUP_MAGICS: [i64; 2] = [0x0027_e0eb, 0x6367_7270];

/// How a kept file was opened: one handle per way it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    Read,
    Write,
}

/// What a read or write goes through.
enum Handle {
    /// Not on cgroupfs: by path, as any file.
    Plain,
    /// Kept open for the next use.
    Kept(Arc<File>),
    /// Over the budget: this use only.
    Once(File),
}

/// Open control files of one cgroup's directories, shared by every handle of the
/// cgroup across its reuses; closed by [`KeptFiles::close_all`] before the cgroup is
/// removed.
#[derive(Debug, Default)]
pub(crate) struct KeptFiles {
    open: Mutex<HashMap<(PathBuf, Mode), Arc<File>>>,
}

impl KeptFiles {
    /// The whole text of `path`.
    pub(crate) fn read(&self, path: &Path) -> std::io::Result<String> {
        let file = match self.handle(path, Mode::Read)? {
            Handle::Plain => return std::fs::read_to_string(path),
            Handle::Kept(file) => file,
            Handle::Once(file) => Arc::new(file),
        };
        let mut text = Vec::with_capacity(256);
        let mut chunk = [0u8; 4096];
        loop {
            match file.read_at(&mut chunk, text.len() as u64) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.forget(path, Mode::Read);
                    return Err(e);
                }
            }
        }
        String::from_utf8(text).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
    }

    /// Write `value` to `path` in one operation.
    pub(crate) fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        let file = match self.handle(path, Mode::Write)? {
            Handle::Plain => return std::fs::write(path, value),
            Handle::Kept(file) => file,
            Handle::Once(file) => Arc::new(file),
        };
        match file.write_at(value.as_bytes(), 0) {
            Ok(n) if n == value.len() => Ok(()),
            Ok(n) => Err(std::io::Error::new(
                ErrorKind::WriteZero,
                format!("wrote {n} of {} bytes", value.len()),
            )),
            Err(e) => {
                // A failed write (EINVAL for a value out of range, ENODEV once the
                // cgroup is gone) says nothing good about the handle: open it again.
                self.forget(path, Mode::Write);
                Err(e)
            }
        }
    }

    /// Close every kept file (the cgroup is about to be removed).
    pub(crate) fn close_all(&self) {
        let closed = std::mem::take(&mut *self.open.lock().expect("kept files lock"));
        KEPT.fetch_sub(closed.len(), Ordering::Relaxed);
    }

    fn forget(&self, path: &Path, mode: Mode) {
        let removed = self
            .open
            .lock()
            .expect("kept files lock")
            .remove(&(path.to_path_buf(), mode));
        if removed.is_some() {
            KEPT.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The handle of `path` for `mode`: the kept one, opened (and kept, within the
    /// budget) now if there is none yet.
    fn handle(&self, path: &Path, mode: Mode) -> std::io::Result<Handle> {
        let key = (path.to_path_buf(), mode);
        if let Some(file) = self.open.lock().expect("kept files lock").get(&key) {
            return Ok(Handle::Kept(file.clone()));
        }
        let file = match mode {
            Mode::Read => File::open(path)?,
            Mode::Write => OpenOptions::new().write(true).open(path)?,
        };
        // `f_type`'s width differs between targets (`i64` here, `u32` elsewhere).
        #[allow(clippy::unnecessary_cast)]
        let on_cgroupfs = nix::sys::statfs::fstatfs(&file)
            .is_ok_and(|fs| CGROUP_MAGICS.contains(&(fs.filesystem_type().0 as i64)));
        if !on_cgroupfs {
            return Ok(Handle::Plain);
        }
        if KEPT.fetch_add(1, Ordering::Relaxed) >= BUDGET {
            KEPT.fetch_sub(1, Ordering::Relaxed);
            return Ok(Handle::Once(file));
        }
        let file = Arc::new(file);
        let replaced = self
            .open
            .lock()
            .expect("kept files lock")
            .insert(key, file.clone());
        if replaced.is_some() {
            // Another thread kept one meanwhile: counted once.
            KEPT.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(Handle::Kept(file))
    }

    #[cfg(test)]
    fn kept_count(&self) -> usize {
        self.open.lock().unwrap().len()
    }
}

impl Drop for KeptFiles {
    fn drop(&mut self) {
        self.close_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_files_are_read_and_written_whole_and_never_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memory.failcnt");
        std::fs::write(&file, "3000000000").unwrap();
        let kept = KeptFiles::default();
        assert_eq!(kept.read(&file).unwrap(), "3000000000");
        kept.write(&file, "12").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "12", "truncated");
        assert_eq!(kept.read(&file).unwrap(), "12");
        assert_eq!(kept.kept_count(), 0);
        assert!(kept.read(&dir.path().join("missing")).is_err());
    }

    /// On the machine's cgroupfs (root; skipped elsewhere, except in CI): a control file
    /// is kept after its first use, and each read sees what the last write set — the
    /// kernel's value now, not the text of an earlier read.
    #[test]
    fn a_cgroupfs_file_is_kept_and_each_read_sees_the_kernels_value_now() {
        let test = "a_cgroupfs_file_is_kept_and_each_read_sees_the_kernels_value_now";
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (parent, file, values) = if v1.join("cgroup.procs").is_file() {
            (v1, "memory.limit_in_bytes", ["1073741824", "2147483648"])
        } else {
            (
                Path::new("/sys/fs/cgroup"),
                "cgroup.max.descendants",
                ["5", "7"],
            )
        };
        let dir = parent.join(format!("tacc-kept-files-test-{}", std::process::id()));
        // One an earlier run of this process id left (killed before its clean-up).
        let _ = std::fs::remove_dir(&dir);
        if !nix::unistd::geteuid().is_root() || std::fs::create_dir(&dir).is_err() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: needs root and a writable cgroup hierarchy in CI");
            }
            eprintln!("\n######## SKIPPED {test}: no writable cgroup hierarchy here.\n");
            return;
        }
        /// Removes the test's cgroup, pass or fail (after `kept` closed its files).
        struct Removed(PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let _removed = Removed(dir.clone());
        let path = dir.join(file);
        let kept = KeptFiles::default();
        for value in values.iter().chain(values.iter()) {
            kept.write(&path, value).unwrap();
            assert_eq!(kept.read(&path).unwrap().trim(), *value);
            assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), *value);
        }
        assert_eq!(kept.kept_count(), 2, "one handle to write, one to read");
        assert!(kept.write(&path, "not a number").is_err());
        assert_eq!(kept.kept_count(), 1, "a failed write's handle is not kept");
        kept.close_all();
        assert_eq!(kept.kept_count(), 0);
    }
}
