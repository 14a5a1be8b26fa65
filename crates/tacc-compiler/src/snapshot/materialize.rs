//! Turning a manifest back into a directory on a node.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::manifest::file_content_key;
use super::{ChunkRef, ChunkSource, EntryKind, Manifest};
use crate::CompilerError;

/// What a materialisation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaterializeStats {
    /// Regular files placed in the destination.
    pub files: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Empty directories created from `Dir` entries (parents of files are not counted).
    pub empty_dirs: u64,
    /// Chunk bytes read from the source and written out (to the destination or the cache).
    pub bytes_fetched: u64,
    /// Files whose content was already in the file cache, so no chunk was read for them.
    pub files_reused_from_cache: u64,
    /// Files placed by hard link from the file cache.
    pub files_hard_linked: u64,
    /// Files copied from the file cache because a hard link was not possible (for
    /// example, the cache and the destination are on different file systems).
    pub files_copied_from_cache: u64,
}

/// Writes the snapshot `manifest` into `dest`, reading chunk bytes from `source`.
///
/// The manifest is validated first; `dest` must not exist or be an empty directory. Every
/// chunk is checked against its hash before it is written. Files get mode 0o755 if
/// executable, else 0o644. Nothing is ever written outside `dest`: on top of validation,
/// files are created with `O_EXCL` (never through an existing link), every parent is
/// checked to be a real directory, and symlinks are created last, after all files.
pub fn materialize(
    manifest: &Manifest,
    source: &dyn ChunkSource,
    dest: &Path,
) -> Result<MaterializeStats, CompilerError> {
    Materializer::new(manifest, source, dest, None)?.run()
}

/// Like [`materialize`], but keeps each file whole in `file_cache_dir` (a per-node cache,
/// keyed by a hash of the file's chunk list and executable bit) and hard-links it into
/// `dest`, so a second working directory from the same snapshot costs almost nothing. If
/// hard-linking fails (the cache is on another file system), the file is copied.
///
/// Files placed this way are read-only (0o444, or 0o555 if executable), and tasks see
/// their code files read-only: this is intended, a snapshot is immutable, and a file shared
/// by hard link must not be changed through one working directory under the others. A
/// task that wants to change a file must write a new one (or delete and recreate it,
/// which the writable directories allow). The mode guards against accidents, not
/// malice: a task running as root, or as the cache's owner who may `chmod`, could still
/// write through the link, so agents should run tasks as a different user than the one
/// that owns the cache, or use [`materialize`] where that is not possible. A cached file
/// whose size no longer matches is detected and rebuilt; cheaper than re-hashing it.
pub fn materialize_cached(
    manifest: &Manifest,
    source: &dyn ChunkSource,
    file_cache_dir: &Path,
    dest: &Path,
) -> Result<MaterializeStats, CompilerError> {
    Materializer::new(manifest, source, dest, Some(file_cache_dir))?.run()
}

const WRITABLE_FILE_MODE: u32 = 0o644;
const WRITABLE_EXECUTABLE_MODE: u32 = 0o755;
const CACHED_FILE_MODE: u32 = 0o444;
const CACHED_EXECUTABLE_MODE: u32 = 0o555;

/// Makes temporary file names in the cache unique within this process.
static CACHE_TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

struct Materializer<'a> {
    manifest: &'a Manifest,
    source: &'a dyn ChunkSource,
    dest: PathBuf,
    file_cache_dir: Option<&'a Path>,
    /// Directories under `dest` already created or checked, to skip repeat syscalls.
    known_real_dirs: BTreeSet<PathBuf>,
    stats: MaterializeStats,
}

impl<'a> Materializer<'a> {
    fn new(
        manifest: &'a Manifest,
        source: &'a dyn ChunkSource,
        dest: &Path,
        file_cache_dir: Option<&'a Path>,
    ) -> Result<Self, CompilerError> {
        manifest.validate()?;
        prepare_empty_destination(dest)?;
        Ok(Materializer {
            manifest,
            source,
            dest: dest.to_path_buf(),
            file_cache_dir,
            known_real_dirs: BTreeSet::from([dest.to_path_buf()]),
            stats: MaterializeStats::default(),
        })
    }

    fn run(mut self) -> Result<MaterializeStats, CompilerError> {
        let manifest = self.manifest;
        for entry in &manifest.entries {
            match &entry.kind {
                EntryKind::Dir => {
                    let path = self.dest_path(&entry.path)?;
                    self.ensure_real_dir(&path)?;
                    self.stats.empty_dirs += 1;
                }
                EntryKind::File {
                    executable, chunks, ..
                } => {
                    let path = self.dest_path(&entry.path)?;
                    self.ensure_parent_dir(&path)?;
                    match self.file_cache_dir {
                        None => {
                            let mode = if *executable {
                                WRITABLE_EXECUTABLE_MODE
                            } else {
                                WRITABLE_FILE_MODE
                            };
                            self.write_from_chunks(&path, &entry.path, chunks, mode)?;
                        }
                        Some(cache_dir) => {
                            let cached =
                                self.cached_file(cache_dir, &entry.path, *executable, chunks)?;
                            self.link_or_copy_from_cache(&cached, &path)?;
                        }
                    }
                    self.stats.files += 1;
                }
                EntryKind::Symlink { .. } => {}
            }
        }
        // Last, so no file above could have been written through one of them.
        for entry in &manifest.entries {
            if let EntryKind::Symlink { target } = &entry.kind {
                let path = self.dest_path(&entry.path)?;
                self.ensure_parent_dir(&path)?;
                std::os::unix::fs::symlink(target, &path).map_err(|source| {
                    CompilerError::WriteFailed {
                        path: path.clone(),
                        source,
                    }
                })?;
                self.stats.symlinks += 1;
            }
        }
        Ok(self.stats)
    }

    /// `dest` joined with a manifest path, refusing anything but plain names even though
    /// the manifest was validated: this is the last line before the file system.
    fn dest_path(&self, relative: &str) -> Result<PathBuf, CompilerError> {
        let mut path = self.dest.clone();
        for component in relative.split('/') {
            let mut parsed = Path::new(component).components();
            match (parsed.next(), parsed.next()) {
                (Some(Component::Normal(name)), None) if name == component => path.push(name),
                _ => {
                    return Err(CompilerError::OutsideDestination {
                        path: self.dest.join(relative),
                        why: format!("`{component}` is not a plain file name"),
                    });
                }
            }
        }
        Ok(path)
    }

    fn ensure_parent_dir(&mut self, path: &Path) -> Result<(), CompilerError> {
        match path.parent() {
            Some(parent) => self.ensure_real_dir(parent),
            None => Ok(()),
        }
    }

    /// Creates `dir` and its missing parents under `dest`, checking that each one that
    /// already exists is a real directory and not a symlink that could lead elsewhere.
    fn ensure_real_dir(&mut self, dir: &Path) -> Result<(), CompilerError> {
        if self.known_real_dirs.contains(dir) {
            return Ok(());
        }
        if !dir.starts_with(&self.dest) {
            return Err(CompilerError::OutsideDestination {
                path: dir.to_path_buf(),
                why: "it is not under the destination".into(),
            });
        }
        if let Some(parent) = dir.parent() {
            self.ensure_real_dir(parent)?;
        }
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                let is_real_dir = fs::symlink_metadata(dir)
                    .map(|metadata| metadata.file_type().is_dir())
                    .unwrap_or(false);
                if !is_real_dir {
                    return Err(CompilerError::OutsideDestination {
                        path: dir.to_path_buf(),
                        why: "it exists and is not a plain directory".into(),
                    });
                }
            }
            Err(source) => {
                return Err(CompilerError::WriteFailed {
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
        self.known_real_dirs.insert(dir.to_path_buf());
        Ok(())
    }

    /// Creates the new file `path` (never following or replacing anything already there)
    /// from verified chunks, then gives it `mode`.
    fn write_from_chunks(
        &mut self,
        path: &Path,
        manifest_path: &str,
        chunks: &[ChunkRef],
        mode: u32,
    ) -> Result<(), CompilerError> {
        let write_failed = |source| CompilerError::WriteFailed {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_failed)?;
        for chunk in chunks {
            let bytes = self.source.read_chunk(&chunk.hash)?;
            if bytes.len() != chunk.size as usize {
                return Err(CompilerError::ChunkLengthMismatch {
                    hash: chunk.hash,
                    path: manifest_path.to_string(),
                    expected: chunk.size,
                    actual: bytes.len(),
                });
            }
            super::verify_chunk(&chunk.hash, &bytes, || {
                format!("received for `{manifest_path}`")
            })?;
            file.write_all(&bytes).map_err(write_failed)?;
            self.stats.bytes_fetched += bytes.len() as u64;
        }
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(write_failed)?;
        if self.file_cache_dir.is_some() {
            // Cache entries outlive this call; make sure they are on disk before they are
            // renamed into place and shared.
            file.sync_all().map_err(write_failed)?;
        }
        Ok(())
    }

    /// The cache's copy of a file with these chunks and exec bit, built first if missing.
    fn cached_file(
        &mut self,
        cache_dir: &Path,
        manifest_path: &str,
        executable: bool,
        chunks: &[ChunkRef],
    ) -> Result<PathBuf, CompilerError> {
        let key = file_content_key(executable, chunks).to_hex();
        let cached = cache_dir.join("files").join(&key[..2]).join(&key[2..]);
        let expected_size: u64 = chunks.iter().map(|chunk| u64::from(chunk.size)).sum();
        match fs::symlink_metadata(&cached) {
            Ok(metadata) if metadata.is_file() && metadata.len() == expected_size => {
                self.stats.files_reused_from_cache += 1;
                return Ok(cached);
            }
            // A wrong-sized or odd entry is damaged: rebuild it rather than hand it out.
            Ok(_) => {
                let _ = fs::remove_file(&cached);
            }
            Err(_) => {}
        }
        let temp_dir = cache_dir.join("tmp");
        let fan_out_dir = cached.parent().unwrap_or(cache_dir).to_path_buf();
        for dir in [&temp_dir, &fan_out_dir] {
            fs::create_dir_all(dir).map_err(|source| CompilerError::WriteFailed {
                path: dir.clone(),
                source,
            })?;
        }
        let temp_path = temp_dir.join(format!(
            "{key}.{}.{}",
            std::process::id(),
            CACHE_TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mode = if executable {
            CACHED_EXECUTABLE_MODE
        } else {
            CACHED_FILE_MODE
        };
        let built = self
            .write_from_chunks(&temp_path, manifest_path, chunks, mode)
            .and_then(|()| {
                fs::rename(&temp_path, &cached).map_err(|source| CompilerError::WriteFailed {
                    path: cached.clone(),
                    source,
                })
            });
        if let Err(error) = built {
            let _ = fs::remove_file(&temp_path);
            return Err(error);
        }
        Ok(cached)
    }

    fn link_or_copy_from_cache(&mut self, cached: &Path, path: &Path) -> Result<(), CompilerError> {
        if fs::hard_link(cached, path).is_ok() {
            self.stats.files_hard_linked += 1;
            return Ok(());
        }
        // Typically EXDEV (cache on another file system) or too many links to one inode.
        let write_failed = |source| CompilerError::WriteFailed {
            path: path.to_path_buf(),
            source,
        };
        let mode = fs::metadata(cached)
            .map_err(write_failed)?
            .permissions()
            .mode();
        let mut from = File::open(cached).map_err(write_failed)?;
        let mut to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_failed)?;
        io::copy(&mut from, &mut to).map_err(write_failed)?;
        to.set_permissions(Permissions::from_mode(mode & 0o777))
            .map_err(write_failed)?;
        self.stats.files_copied_from_cache += 1;
        Ok(())
    }
}

/// Creates `dest`, or accepts it if it is an empty directory (not a symlink to one).
fn prepare_empty_destination(dest: &Path) -> Result<(), CompilerError> {
    let not_empty = || CompilerError::DestinationNotEmpty {
        dest: dest.to_path_buf(),
    };
    let write_failed = |source| CompilerError::WriteFailed {
        path: dest.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(dest) {
        Ok(metadata) if metadata.file_type().is_dir() => {
            let mut contents = fs::read_dir(dest).map_err(write_failed)?;
            if contents.next().is_some() {
                return Err(not_empty());
            }
            Ok(())
        }
        Ok(_) => Err(not_empty()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(write_failed)
        }
        Err(source) => Err(write_failed(source)),
    }
}
