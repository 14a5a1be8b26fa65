//! The manifest: what a snapshot contains, its id, and the checks every receiver runs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tacc_core::{ByteSize, SnapshotId};

use super::{ChunkHash, ChunkerParams};
use crate::CompilerError;

/// The manifest layout this build writes and reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// Bounds past which a manifest is refused as absurd rather than processed.
///
/// They keep a hostile or mistaken manifest from making a node allocate or write without
/// end; a real code directory is far below all of them.
pub mod limits {
    /// Files, symlinks and directories together.
    pub const MAX_ENTRIES: u64 = 1_000_000;
    /// The sum of all file sizes: 64 GiB. Bigger trees are data, which belongs in datasets.
    pub const MAX_TOTAL_BYTES: u64 = 64 * 1024 * 1024 * 1024;
    /// Length of one entry's path in bytes, as on Linux (`PATH_MAX`).
    pub const MAX_PATH_BYTES: usize = 4096;
    /// Length of one symlink target in bytes.
    pub const MAX_SYMLINK_TARGET_BYTES: usize = 4096;
}

/// One chunk of a file: its hash and its length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkRef {
    pub hash: ChunkHash,
    pub size: u32,
}

/// What sits at a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EntryKind {
    /// A regular file: its bytes are the chunks in order. Only the executable bit of its
    /// mode is kept; owners, other permission bits and times are deliberately not part of
    /// a snapshot, so the same code gives the same id on every machine.
    File {
        executable: bool,
        size: u64,
        chunks: Vec<ChunkRef>,
    },
    /// A symbolic link, kept as a link. The target is relative and stays inside the tree.
    Symlink { target: String },
    /// A directory with nothing else in the snapshot under it (others are implied).
    Dir,
}

/// One path in the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Relative to the snapshot root, `/`-separated, with no `.`, `..` or empty components.
    pub path: String,
    pub kind: EntryKind,
}

/// A code snapshot: every entry, sorted by path (byte-wise), and the chunker settings
/// that cut its files. Sent as JSON; named by [`Manifest::id`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub chunker: ChunkerParams,
    pub entries: Vec<Entry>,
}

/// Domain separator at the head of the canonical encoding, so no other BLAKE3 input of
/// ours can collide with a manifest's.
const CANONICAL_ENCODING_TAG: &[u8] = b"tacc-snapshot-manifest\0";

impl Manifest {
    /// A manifest in the current format, with `entries` sorted by path.
    pub fn new(chunker: ChunkerParams, mut entries: Vec<Entry>) -> Self {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            chunker,
            entries,
        }
    }

    /// The snapshot's id: BLAKE3 over this canonical byte encoding (all integers
    /// little-endian, strings as UTF-8 prefixed by their byte length as `u64`):
    ///
    /// ```text
    /// "tacc-snapshot-manifest\0"
    /// format_version: u32, min_size: u32, avg_size: u32, max_size: u32
    /// entry count: u64
    /// per entry, in byte-wise path order:
    ///   path: string
    ///   tag: u8 = 1 file | 2 symlink | 3 dir
    ///   file:    executable: u8 (0 or 1), size: u64, chunk count: u64,
    ///            per chunk: the 32 raw hash bytes, size: u32
    ///   symlink: target: string
    /// ```
    ///
    /// It is written by hand rather than through serde so that the id cannot shift with a
    /// serialiser's field order, whitespace or number formatting, and it holds nothing
    /// about the machine (no times, owners or permission bits besides executable). Entries
    /// are hashed in sorted order even if `entries` is not sorted.
    pub fn id(&self) -> SnapshotId {
        let mut hasher = blake3::Hasher::new();
        hasher.update(CANONICAL_ENCODING_TAG);
        hasher.update(&self.format_version.to_le_bytes());
        hasher.update(&self.chunker.min_size.to_le_bytes());
        hasher.update(&self.chunker.avg_size.to_le_bytes());
        hasher.update(&self.chunker.max_size.to_le_bytes());
        hasher.update(&(self.entries.len() as u64).to_le_bytes());
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by(|a, b| a.path.cmp(&b.path));
        for entry in sorted {
            hash_string(&mut hasher, &entry.path);
            match &entry.kind {
                EntryKind::File {
                    executable,
                    size,
                    chunks,
                } => {
                    hasher.update(&[1, u8::from(*executable)]);
                    hasher.update(&size.to_le_bytes());
                    hasher.update(&(chunks.len() as u64).to_le_bytes());
                    for chunk in chunks {
                        hasher.update(chunk.hash.as_bytes());
                        hasher.update(&chunk.size.to_le_bytes());
                    }
                }
                EntryKind::Symlink { target } => {
                    hasher.update(&[2]);
                    hash_string(&mut hasher, target);
                }
                EntryKind::Dir => {
                    hasher.update(&[3]);
                }
            }
        }
        let hex = hasher.finalize().to_hex().to_string();
        SnapshotId::try_from(hex).expect("a BLAKE3 digest in lower-case hex is a valid SnapshotId")
    }

    /// The sum of all file sizes (saturating, so a hostile manifest cannot overflow it).
    pub fn total_bytes(&self) -> ByteSize {
        let total = self
            .entries
            .iter()
            .map(|entry| match &entry.kind {
                EntryKind::File { size, .. } => *size,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        ByteSize::from_bytes(total)
    }

    /// Every distinct chunk the snapshot needs: what an uploader must make sure the server
    /// has, and what a node must fetch.
    pub fn chunk_set(&self) -> BTreeSet<ChunkHash> {
        self.entries
            .iter()
            .flat_map(|entry| match &entry.kind {
                EntryKind::File { chunks, .. } => chunks.as_slice(),
                _ => &[],
            })
            .map(|chunk| chunk.hash)
            .collect()
    }

    /// Checks everything a receiver must not take on trust before writing a single file:
    /// paths stay inside the root, no path appears twice or under a file or symlink,
    /// symlinks stay inside the tree, sizes add up and fit the chunker's bounds, and the
    /// totals are sane. [`materialize`](super::materialize) calls this first.
    pub fn validate(&self) -> Result<(), CompilerError> {
        if self.format_version != MANIFEST_FORMAT_VERSION {
            return Err(CompilerError::UnsupportedFormatVersion {
                found: self.format_version,
                supported: MANIFEST_FORMAT_VERSION,
            });
        }
        self.chunker.validate()?;
        let entry_count = self.entries.len() as u64;
        if entry_count > limits::MAX_ENTRIES {
            return Err(CompilerError::SnapshotTooLarge {
                what: "the number of entries",
                actual: entry_count,
                limit: limits::MAX_ENTRIES,
            });
        }

        let mut kinds: BTreeMap<&str, &EntryKind> = BTreeMap::new();
        let mut previous: Option<&str> = None;
        let mut total_bytes: u64 = 0;
        for entry in &self.entries {
            validate_relative_path(&entry.path)?;
            if kinds.insert(&entry.path, &entry.kind).is_some() {
                return Err(CompilerError::DuplicatePath {
                    path: entry.path.clone(),
                });
            }
            if let Some(previous) = previous {
                if previous > entry.path.as_str() {
                    return Err(CompilerError::UnsortedEntries {
                        path: entry.path.clone(),
                        previous: previous.to_string(),
                    });
                }
            }
            previous = Some(&entry.path);
            match &entry.kind {
                EntryKind::File { size, chunks, .. } => {
                    validate_file_chunks(&entry.path, *size, chunks, &self.chunker)?;
                    total_bytes = total_bytes.saturating_add(*size);
                    if total_bytes > limits::MAX_TOTAL_BYTES {
                        return Err(CompilerError::SnapshotTooLarge {
                            what: "the total size of all files",
                            actual: total_bytes,
                            limit: limits::MAX_TOTAL_BYTES,
                        });
                    }
                }
                EntryKind::Symlink { target } => validate_symlink_target(&entry.path, target)?,
                EntryKind::Dir => {}
            }
        }

        // Only directories may have entries under them: a file there would be written
        // through a symlink (possibly out of the tree) or fail half-way on a node.
        for entry in &self.entries {
            for (slash, _) in entry.path.match_indices('/') {
                let parent = &entry.path[..slash];
                if let Some(EntryKind::File { .. } | EntryKind::Symlink { .. }) = kinds.get(parent)
                {
                    return Err(CompilerError::EntryUnderNonDirectory {
                        path: entry.path.clone(),
                        parent: parent.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn hash_string(hasher: &mut blake3::Hasher, text: &str) {
    hasher.update(&(text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
}

/// Checks that `path` is relative, `/`-separated and made only of plain names.
pub(crate) fn validate_relative_path(path: &str) -> Result<(), CompilerError> {
    let unsafe_path = |why: &str| CompilerError::UnsafePath {
        path: path.to_string(),
        why: why.to_string(),
    };
    if path.is_empty() {
        return Err(unsafe_path("it is empty"));
    }
    if path.len() > limits::MAX_PATH_BYTES {
        return Err(unsafe_path(&format!(
            "it is longer than {} bytes",
            limits::MAX_PATH_BYTES
        )));
    }
    if path.starts_with('/') {
        return Err(unsafe_path(
            "it is absolute; paths must be relative to the snapshot root",
        ));
    }
    if path.contains('\\') {
        return Err(unsafe_path(
            "it contains a backslash; use `/` to separate components",
        ));
    }
    if path.contains('\0') {
        return Err(unsafe_path("it contains a NUL byte"));
    }
    for component in path.split('/') {
        match component {
            "" => {
                return Err(unsafe_path(
                    "it has an empty component (`//` or a trailing `/`)",
                ));
            }
            "." => return Err(unsafe_path("it has a `.` component")),
            ".." => {
                return Err(unsafe_path(
                    "it has a `..` component, which could leave the root",
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks that a symlink at `link_path` pointing at `target` cannot lead out of the tree.
///
/// The target must be relative and of the form `../../name/name`: any `..` must come
/// first. Those leading `..` climb real directories (no entry may sit under a symlink),
/// so counting them against the link's depth is exact. A `..` after a name is refused:
/// the name could itself be a symlink (say to `.`), and then the kernel's `..` would climb
/// from somewhere else than a lexical reading suggests.
pub(crate) fn validate_symlink_target(link_path: &str, target: &str) -> Result<(), CompilerError> {
    let unsafe_link = |why: String| CompilerError::UnsafeSymlink {
        path: link_path.to_string(),
        target: target.to_string(),
        why,
    };
    if target.is_empty() {
        return Err(unsafe_link("its target is empty".into()));
    }
    if target.len() > limits::MAX_SYMLINK_TARGET_BYTES {
        return Err(unsafe_link(format!(
            "its target is longer than {} bytes",
            limits::MAX_SYMLINK_TARGET_BYTES
        )));
    }
    if target.starts_with('/') {
        return Err(unsafe_link("its target is an absolute path".into()));
    }
    if target.contains('\\') || target.contains('\0') {
        return Err(unsafe_link(
            "its target contains a backslash or NUL byte".into(),
        ));
    }
    let link_dir_depth = link_path.matches('/').count();
    let mut leading_parents = 0usize;
    let mut seen_name = false;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." if seen_name => {
                return Err(unsafe_link(
                    "`..` after a directory name could climb out through another symlink; \
                     write the target with all `..` first"
                        .into(),
                ));
            }
            ".." => {
                leading_parents += 1;
                if leading_parents > link_dir_depth {
                    return Err(unsafe_link("its target escapes the snapshot root".into()));
                }
            }
            _ => seen_name = true,
        }
    }
    Ok(())
}

fn validate_file_chunks(
    path: &str,
    declared_size: u64,
    chunks: &[ChunkRef],
    chunker: &ChunkerParams,
) -> Result<(), CompilerError> {
    let mut chunk_sum: u64 = 0;
    let last_index = chunks.len().saturating_sub(1);
    for (index, chunk) in chunks.iter().enumerate() {
        let min_size = if index == last_index {
            1
        } else {
            chunker.min_size
        };
        if chunk.size < min_size || chunk.size > chunker.max_size {
            return Err(CompilerError::ChunkSizeOutOfBounds {
                path: path.to_string(),
                index,
                size: chunk.size,
                min_size: chunker.min_size,
                max_size: chunker.max_size,
            });
        }
        chunk_sum += u64::from(chunk.size);
    }
    if chunk_sum != declared_size {
        return Err(CompilerError::FileSizeMismatch {
            path: path.to_string(),
            declared: declared_size,
            chunk_sum,
        });
    }
    Ok(())
}

/// The key under which a node caches a whole materialised file: BLAKE3 over its chunk
/// list and executable bit, which together determine the file's bytes and mode.
pub(crate) fn file_content_key(executable: bool, chunks: &[ChunkRef]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new_derive_key("tacc snapshot file-cache key v1");
    hasher.update(&[u8::from(executable)]);
    hasher.update(&(chunks.len() as u64).to_le_bytes());
    for chunk in chunks {
        hasher.update(chunk.hash.as_bytes());
        hasher.update(&chunk.size.to_le_bytes());
    }
    hasher.finalize()
}
