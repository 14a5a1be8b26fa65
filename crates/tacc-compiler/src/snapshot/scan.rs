//! Reading a code directory into a manifest: walk, filter, chunk, hash.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, FileType};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use fastcdc::v2020::FastCDC;
use ignore::WalkBuilder;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use tacc_core::ByteSize;

use super::manifest::{limits, validate_relative_path, validate_symlink_target};
use super::{ChunkHash, ChunkRef, ChunkSource, ChunkerParams, Entry, EntryKind, Manifest};
use crate::CompilerError;

/// The ignore file with `.gitignore` syntax that only TACC reads.
pub const TACC_IGNORE_FILE_NAME: &str = ".taccignore";

/// A scanned code directory: its manifest, plus where each chunk came from so the bytes
/// can be read back for upload without holding the whole tree in memory.
pub struct ScannedTree {
    pub manifest: Manifest,
    root: PathBuf,
    chunk_locations: BTreeMap<ChunkHash, ChunkLocation>,
}

/// Where in the user's files a chunk's bytes were found at scan time.
#[derive(Debug, Clone)]
struct ChunkLocation {
    file: PathBuf,
    offset: u64,
    size: u32,
}

impl fmt::Debug for ScannedTree {
    // Listing every chunk location would bury the useful part in a debug print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScannedTree")
            .field("root", &self.root)
            .field("entries", &self.manifest.entries.len())
            .field("unique_chunks", &self.chunk_locations.len())
            .field("total_bytes", &self.total_bytes())
            .finish()
    }
}

impl ScannedTree {
    /// The directory that was scanned (canonicalised).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The sum of all file sizes in the snapshot.
    pub fn total_bytes(&self) -> ByteSize {
        self.manifest.total_bytes()
    }

    /// Reads a chunk back from the file it was found in and checks it still hashes the
    /// same, so a file edited between scan and upload is caught instead of shipped.
    pub fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        let location = self
            .chunk_locations
            .get(hash)
            .ok_or(CompilerError::ChunkNotFound { hash: *hash })?;
        let changed = || CompilerError::SourceChangedSinceScan {
            hash: *hash,
            path: location.file.clone(),
        };
        let mut file = match File::open(&location.file) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(changed()),
            Err(source) => {
                return Err(CompilerError::Unreadable {
                    path: location.file.clone(),
                    source,
                });
            }
        };
        let mut bytes = vec![0u8; location.size as usize];
        let read = file
            .seek(SeekFrom::Start(location.offset))
            .and_then(|_| file.read_exact(&mut bytes));
        match read {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Err(changed()),
            Err(source) => {
                return Err(CompilerError::Unreadable {
                    path: location.file.clone(),
                    source,
                });
            }
        }
        if ChunkHash::of(&bytes) != *hash {
            return Err(changed());
        }
        Ok(bytes)
    }
}

impl ChunkSource for ScannedTree {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        ScannedTree::read_chunk(self, hash)
    }
}

/// A regular file found by the walk, waiting to be chunked.
struct FileToChunk {
    relative_path: String,
    absolute_path: PathBuf,
    executable: bool,
}

/// Scans the directory `root` into a snapshot.
///
/// What is left out: anything matched by a `.gitignore` or `.taccignore` inside `root`
/// (both in `.gitignore` syntax, honoured whether or not `root` is in a git repository),
/// anything matched by `exclude` (`.gitignore` syntax, relative to `root`), and every
/// `.git` directory or file. Ignore files above `root`, the global git excludes and
/// `.git/info/exclude` are deliberately not read: the snapshot of a directory should not
/// depend on the machine it is scanned on.
///
/// Regular files are chunked with FastCDC ([`ChunkerParams::default`]) and hashed with
/// BLAKE3; only their executable bit is kept (set if any execute bit is set). Symlinks are
/// kept as links and must stay inside the tree. Directories with nothing kept under them
/// become [`EntryKind::Dir`] entries. Device files, sockets and FIFOs are errors, as is any
/// file that cannot be read: the caller must stop before uploading anything.
pub fn scan(root: &Path, exclude: &[String]) -> Result<ScannedTree, CompilerError> {
    let chunker = ChunkerParams::default();
    chunker.validate()?;
    let root = fs::canonicalize(root).map_err(|error| CompilerError::BadSnapshotRoot {
        root: root.to_path_buf(),
        why: error.to_string(),
    })?;
    if !root.is_dir() {
        return Err(CompilerError::BadSnapshotRoot {
            root,
            why: "it is not a directory".into(),
        });
    }
    let exclude_matcher = build_exclude_matcher(&root, exclude)?;

    let mut files: Vec<FileToChunk> = Vec::new();
    let mut other_entries: Vec<Entry> = Vec::new();
    let mut directories: Vec<String> = Vec::new();
    let mut size_on_disk: u64 = 0;

    let walker = WalkBuilder::new(&root)
        .standard_filters(false)
        .git_ignore(true)
        .require_git(false)
        .add_custom_ignore_filename(TACC_IGNORE_FILE_NAME)
        .follow_links(false)
        .filter_entry(move |entry| {
            let is_dir = entry.file_type().is_some_and(|kind| kind.is_dir());
            entry.file_name() != ".git"
                && (entry.depth() == 0
                    || !exclude_matcher.matched(entry.path(), is_dir).is_ignore())
        })
        .build();

    for walked in walker {
        let entry = walked.map_err(|error| CompilerError::WalkFailed {
            root: root.clone(),
            why: error.to_string(),
        })?;
        if entry.depth() == 0 {
            continue;
        }
        let absolute_path = entry.path().to_path_buf();
        let relative_path = relative_utf8_path(&root, &absolute_path)?;
        validate_relative_path(&relative_path)?;
        let Some(file_type) = entry.file_type() else {
            continue; // only stdin has no file type, and we never walk stdin
        };
        if file_type.is_dir() {
            directories.push(relative_path);
        } else if file_type.is_symlink() {
            let target =
                fs::read_link(&absolute_path).map_err(|source| CompilerError::Unreadable {
                    path: absolute_path.clone(),
                    source,
                })?;
            let target = target
                .to_str()
                .ok_or_else(|| CompilerError::NonUtf8Path {
                    path: absolute_path.clone(),
                })?
                .to_string();
            validate_symlink_target(&relative_path, &target)?;
            other_entries.push(Entry {
                path: relative_path,
                kind: EntryKind::Symlink { target },
            });
        } else if file_type.is_file() {
            let metadata = fs::symlink_metadata(&absolute_path).map_err(|source| {
                CompilerError::Unreadable {
                    path: absolute_path.clone(),
                    source,
                }
            })?;
            // Checked before reading so a forgotten 500 GiB checkpoint fails in
            // milliseconds, not after minutes of hashing.
            size_on_disk = size_on_disk.saturating_add(metadata.len());
            if size_on_disk > limits::MAX_TOTAL_BYTES {
                return Err(CompilerError::SnapshotTooLarge {
                    what: "the total size of all files",
                    actual: size_on_disk,
                    limit: limits::MAX_TOTAL_BYTES,
                });
            }
            files.push(FileToChunk {
                relative_path,
                absolute_path,
                executable: metadata.permissions().mode() & 0o111 != 0,
            });
        } else {
            return Err(CompilerError::SpecialFile {
                path: absolute_path,
                kind: special_file_kind(&file_type),
            });
        }
        let entry_count = (files.len() + other_entries.len() + directories.len()) as u64;
        if entry_count > limits::MAX_ENTRIES {
            return Err(CompilerError::SnapshotTooLarge {
                what: "the number of entries",
                actual: entry_count,
                limit: limits::MAX_ENTRIES,
            });
        }
    }

    let chunked = chunk_files_in_parallel(&files, &chunker)?;
    let mut chunk_locations: BTreeMap<ChunkHash, ChunkLocation> = BTreeMap::new();
    let mut entries = other_entries;
    for (file, chunks) in files.into_iter().zip(chunked) {
        let mut offset: u64 = 0;
        for chunk in &chunks {
            chunk_locations
                .entry(chunk.hash)
                .or_insert_with(|| ChunkLocation {
                    file: file.absolute_path.clone(),
                    offset,
                    size: chunk.size,
                });
            offset += u64::from(chunk.size);
        }
        entries.push(Entry {
            path: file.relative_path,
            kind: EntryKind::File {
                executable: file.executable,
                size: offset,
                chunks,
            },
        });
    }

    // Only directories that would otherwise vanish get an entry; the rest are implied by
    // the paths under them, which keeps manifests (and ids) free of redundant entries.
    let kept_paths: BTreeSet<&str> = entries
        .iter()
        .map(|entry| entry.path.as_str())
        .chain(directories.iter().map(String::as_str))
        .collect();
    let empty_directories: Vec<String> = directories
        .iter()
        .filter(|dir| {
            let prefix = format!("{dir}/");
            !kept_paths
                .range(prefix.as_str()..)
                .next()
                .is_some_and(|next| next.starts_with(&prefix))
        })
        .cloned()
        .collect();
    entries.extend(empty_directories.into_iter().map(|path| Entry {
        path,
        kind: EntryKind::Dir,
    }));

    let manifest = Manifest::new(chunker, entries);
    manifest.validate()?;
    Ok(ScannedTree {
        manifest,
        root,
        chunk_locations,
    })
}

fn build_exclude_matcher(root: &Path, exclude: &[String]) -> Result<Gitignore, CompilerError> {
    let mut builder = GitignoreBuilder::new(root);
    for pattern in exclude {
        builder
            .add_line(None, pattern)
            .map_err(|error| CompilerError::InvalidExcludePattern {
                pattern: pattern.clone(),
                why: error.to_string(),
            })?;
    }
    builder
        .build()
        .map_err(|error| CompilerError::InvalidExcludePattern {
            pattern: exclude.join(", "),
            why: error.to_string(),
        })
}

fn relative_utf8_path(root: &Path, absolute_path: &Path) -> Result<String, CompilerError> {
    let non_utf8 = || CompilerError::NonUtf8Path {
        path: absolute_path.to_path_buf(),
    };
    let relative = absolute_path
        .strip_prefix(root)
        .map_err(|_| CompilerError::WalkFailed {
            root: root.to_path_buf(),
            why: format!("`{}` is not under the root", absolute_path.display()),
        })?;
    let mut components = Vec::new();
    for component in relative.components() {
        components.push(component.as_os_str().to_str().ok_or_else(non_utf8)?);
    }
    Ok(components.join("/"))
}

fn special_file_kind(file_type: &FileType) -> &'static str {
    if file_type.is_fifo() {
        "FIFO (named pipe)"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Chunks `files` on several threads; returns the chunk lists in the same order.
///
/// On failure it reports the failing file that comes first in walk order, and stops the
/// other threads early rather than hashing the rest of a tree that will not be uploaded.
fn chunk_files_in_parallel(
    files: &[FileToChunk],
    chunker: &ChunkerParams,
) -> Result<Vec<Vec<ChunkRef>>, CompilerError> {
    const MAX_THREADS: usize = 8;
    let threads = thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
        .min(files.len())
        .max(1);
    let next_file = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut results: Vec<(usize, Result<Vec<ChunkRef>, CompilerError>)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut buffer = vec![0u8; read_buffer_len(chunker)];
                    let mut done = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let index = next_file.fetch_add(1, Ordering::Relaxed);
                        let Some(file) = files.get(index) else { break };
                        let result = chunk_file(&file.absolute_path, chunker, &mut buffer);
                        if result.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        done.push((index, result));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| match worker.join() {
                Ok(done) => done,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

/// Large enough that most source files are read in one go and that every cut decision
/// sees a full `max_size` window, as FastCDC over the whole file would.
fn read_buffer_len(chunker: &ChunkerParams) -> usize {
    (4 << 20).max(2 * chunker.max_size as usize)
}

/// Cuts one file into chunks, streaming it through `buffer`.
///
/// Gives the same boundaries as running FastCDC over the whole file in memory: a cut is
/// only taken while at least `max_size` bytes are buffered (or the file has ended), and
/// FastCDC never looks further than `max_size` bytes ahead.
pub(crate) fn chunk_file(
    path: &Path,
    chunker: &ChunkerParams,
    buffer: &mut [u8],
) -> Result<Vec<ChunkRef>, CompilerError> {
    let unreadable = |source| CompilerError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(unreadable)?;
    let max_size = chunker.max_size as usize;
    let mut chunks = Vec::new();
    let mut filled = 0usize;
    let mut at_end_of_file = false;
    loop {
        while !at_end_of_file && filled < buffer.len() {
            match file.read(&mut buffer[filled..]) {
                Ok(0) => at_end_of_file = true,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(unreadable(source)),
            }
        }
        let window = &buffer[..filled];
        let cutter = FastCDC::new(window, chunker.min_size, chunker.avg_size, chunker.max_size);
        let mut start = 0usize;
        while start < filled && (at_end_of_file || filled - start >= max_size) {
            let (_, end) = cutter.cut(start, filled - start);
            let chunk = &window[start..end];
            chunks.push(ChunkRef {
                hash: ChunkHash::of(chunk),
                // A chunk is at most `max_size`, which `ChunkerParams::validate` bounds
                // far below `u32::MAX`.
                size: chunk.len() as u32,
            });
            start = end;
        }
        buffer.copy_within(start..filled, 0);
        filled -= start;
        if at_end_of_file {
            return Ok(chunks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random_bytes(len: usize, mut state: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn streaming_chunker_matches_fastcdc_over_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let bytes = pseudo_random_bytes(11 << 20, 7);
        fs::write(&path, &bytes).unwrap();
        let chunker = ChunkerParams::default();
        let mut small_buffer = vec![0u8; 2 * chunker.max_size as usize];
        let streamed = chunk_file(&path, &chunker, &mut small_buffer).unwrap();
        let whole: Vec<ChunkRef> =
            FastCDC::new(&bytes, chunker.min_size, chunker.avg_size, chunker.max_size)
                .map(|chunk| ChunkRef {
                    hash: ChunkHash::of(&bytes[chunk.offset..chunk.offset + chunk.length]),
                    size: chunk.length as u32,
                })
                .collect();
        assert_eq!(streamed, whole);
        assert!(streamed.len() > 100);
    }

    // Tests run as root, for whom `chmod 000` does not make a file unreadable. A file that
    // vanishes between listing and reading (the race a real scan can hit) fails the same
    // code path, so it stands in for the unreadable file here.
    #[test]
    fn a_file_that_cannot_be_opened_is_reported_with_its_path_and_the_os_reason() {
        let dir = tempfile::tempdir().unwrap();
        let vanished = dir.path().join("vanished.py");
        let mut buffer = vec![0u8; 1 << 20];
        let error = chunk_file(&vanished, &ChunkerParams::default(), &mut buffer).unwrap_err();
        assert!(
            matches!(error, CompilerError::Unreadable { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("vanished.py"), "{message}");
        assert!(message.contains("No such file"), "{message}");
    }
}
