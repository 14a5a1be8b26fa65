//! The crate's one error enum.

use std::io;
use std::path::PathBuf;

use crate::snapshot::ChunkHash;

/// Everything that can go wrong while snapshotting, storing or materialising code.
///
/// Each message names the file, path or chunk involved and says what to do about it,
/// because these errors end up in front of a researcher running `tcloud submit`.
#[derive(Debug, thiserror::Error)]
pub enum CompilerError {
    #[error(
        "invalid chunk hash `{input}`: {why} (expected 64 lower-case hex digits, a BLAKE3 hash)"
    )]
    InvalidChunkHash { input: String, why: String },

    #[error(
        "invalid chunker parameters (min {min_size}, avg {avg_size}, max {max_size}): {why}; \
         use `ChunkerParams::default()` unless you have a reason not to"
    )]
    InvalidChunkerParams {
        min_size: u32,
        avg_size: u32,
        max_size: u32,
        why: String,
    },

    #[error(
        "snapshot manifest format version {found} is not supported (this build reads version \
         {supported}); upgrade the component that received the manifest"
    )]
    UnsupportedFormatVersion { found: u32, supported: u32 },

    #[error("snapshot entry `{path}` has an unsafe path: {why}")]
    UnsafePath { path: String, why: String },

    #[error("snapshot entry `{path}` appears more than once; every path must be listed once")]
    DuplicatePath { path: String },

    #[error(
        "snapshot entries are not sorted: `{path}` comes after `{previous}`; build manifests \
         with `Manifest::new`, which sorts them"
    )]
    UnsortedEntries { path: String, previous: String },

    #[error(
        "snapshot entry `{path}` lies under `{parent}`, which is a file or symlink, not a \
         directory; remove one of the two"
    )]
    EntryUnderNonDirectory { path: String, parent: String },

    #[error(
        "symlink `{path}` -> `{target}` is not allowed: {why}; a snapshot may only contain \
         relative links that stay inside the code directory (copy the target in, or exclude \
         the link)"
    )]
    UnsafeSymlink {
        path: String,
        target: String,
        why: String,
    },

    #[error(
        "file `{path}` claims {declared} bytes but its chunks add up to {chunk_sum}; the \
         manifest is corrupt, re-create it by scanning the code again"
    )]
    FileSizeMismatch {
        path: String,
        declared: u64,
        chunk_sum: u64,
    },

    #[error(
        "chunk {index} of `{path}` is {size} bytes, outside the chunker's bounds \
         ({min_size}..={max_size}, only a file's last chunk may be smaller); the manifest is \
         corrupt, re-create it by scanning the code again"
    )]
    ChunkSizeOutOfBounds {
        path: String,
        index: usize,
        size: u32,
        min_size: u32,
        max_size: u32,
    },

    #[error(
        "the snapshot is too large: {what} is {actual}, the limit is {limit}; exclude large \
         files (data, checkpoints) with `code.exclude` or a `.taccignore` and ship them as \
         datasets instead"
    )]
    SnapshotTooLarge {
        what: &'static str,
        actual: u64,
        limit: u64,
    },

    #[error("cannot snapshot `{root}`: {why}; point `code.dir` at a readable directory")]
    BadSnapshotRoot { root: PathBuf, why: String },

    #[error(
        "invalid exclude pattern `{pattern}`: {why}; exclude patterns use .gitignore syntax, \
         e.g. `data/` or `*.ckpt`"
    )]
    InvalidExcludePattern { pattern: String, why: String },

    #[error(
        "error while listing `{root}`: {why}; fix the file or directory it names (or exclude \
         it) and try again"
    )]
    WalkFailed { root: PathBuf, why: String },

    #[error(
        "`{path}` is a {kind}, which a code snapshot cannot hold; delete it or add it to \
         `.taccignore`"
    )]
    SpecialFile { path: PathBuf, kind: &'static str },

    #[error(
        "`{path}` has a name that is not valid UTF-8, which a code snapshot cannot hold; \
         rename it or add it to `.taccignore`"
    )]
    NonUtf8Path { path: PathBuf },

    #[error(
        "cannot read `{path}`: {source}; fix its permissions or add it to `.taccignore` \
         (nothing has been uploaded)"
    )]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "chunk {hash} of `{path}` no longer matches: the file was changed or removed after it \
         was scanned; scan the code again"
    )]
    SourceChangedSinceScan { hash: ChunkHash, path: PathBuf },

    #[error("chunk {hash} is not available from this source; upload or fetch it first")]
    ChunkNotFound { hash: ChunkHash },

    #[error(
        "chunk data for {expected} has hash {actual} ({context}); the data is corrupt or was \
         mixed up in transit, fetch it again"
    )]
    ChunkHashMismatch {
        expected: ChunkHash,
        actual: ChunkHash,
        context: String,
    },

    #[error(
        "chunk {hash} is {actual} bytes but the manifest says {expected} (in `{path}`); the \
         manifest or the chunk store is corrupt"
    )]
    ChunkLengthMismatch {
        hash: ChunkHash,
        path: String,
        expected: u32,
        actual: usize,
    },

    #[error("chunk store I/O error at `{path}`: {source}; check the disk and its permissions")]
    ChunkStoreIo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "destination `{dest}` already exists and is not an empty directory; materialise into \
         a fresh directory"
    )]
    DestinationNotEmpty { dest: PathBuf },

    #[error(
        "refusing to write `{path}`: it would land outside the destination directory or on \
         something that is not a plain directory ({why})"
    )]
    OutsideDestination { path: PathBuf, why: String },

    #[error("dataset `{name}`: {why}")]
    InvalidDataset { name: String, why: String },

    #[error("cannot write `{path}`: {source}; check free space and permissions")]
    WriteFailed {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}
