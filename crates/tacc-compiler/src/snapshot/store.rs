//! A content-addressed chunk store in a plain directory.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::{ChunkHash, ChunkSource, verify_chunk};
use crate::CompilerError;

/// Chunks stored as files named by their hash, fanned out by the first two hex digits
/// (`ab/cdef…`) so no directory grows past a few thousand entries per million chunks.
///
/// Writers verify the hash, write to a temporary file in the store, fsync it and rename it
/// into place, so a reader never sees a half-written chunk, even after a crash. Several
/// processes may share one store: the same hash always has the same bytes, so two racing
/// writers of one chunk both leave a correct file.
#[derive(Debug, Clone)]
pub struct DirChunkStore {
    root: PathBuf,
}

const TEMP_DIR_NAME: &str = "tmp";

/// Makes temporary file names unique within this process; the pid covers other processes.
static TEMP_FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

impl DirChunkStore {
    /// Opens the store at `dir`, creating it if needed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CompilerError> {
        let root = dir.into();
        let temp_dir = root.join(TEMP_DIR_NAME);
        fs::create_dir_all(&temp_dir).map_err(|source| CompilerError::ChunkStoreIo {
            path: temp_dir.clone(),
            source,
        })?;
        Ok(DirChunkStore { root })
    }

    /// Where the chunk `hash` lives (whether or not it is stored yet).
    pub fn path_of(&self, hash: &ChunkHash) -> PathBuf {
        let hex = hash.to_hex();
        self.root.join(&hex[..2]).join(&hex[2..])
    }

    /// Whether the chunk `hash` is stored.
    pub fn has(&self, hash: &ChunkHash) -> bool {
        self.path_of(hash).is_file()
    }

    /// Stores `bytes` under `hash` after checking they hash to it. Returns whether the
    /// chunk was newly stored (`false`: it was there already, nothing written).
    pub fn put(&self, hash: &ChunkHash, bytes: &[u8]) -> Result<bool, CompilerError> {
        verify_chunk(hash, bytes, || "refused by the chunk store".to_string())?;
        let final_path = self.path_of(hash);
        if final_path.is_file() {
            // Sent again: it is in use, so its retention period starts over.
            self.touch(hash);
            return Ok(false);
        }
        let fan_out_dir = final_path.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&fan_out_dir).map_err(|source| CompilerError::ChunkStoreIo {
            path: fan_out_dir.clone(),
            source,
        })?;
        let temp_path = self.root.join(TEMP_DIR_NAME).join(format!(
            "{hash}.{}.{}",
            std::process::id(),
            TEMP_FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = write_synced(&temp_path, bytes)
            .and_then(|()| fs::rename(&temp_path, &final_path))
            .and_then(|()| File::open(&fan_out_dir)?.sync_all());
        if let Err(source) = written {
            // Best effort: a leftover temp file is harmless, only wasted space.
            let _ = fs::remove_file(&temp_path);
            return Err(CompilerError::ChunkStoreIo {
                path: final_path,
                source,
            });
        }
        Ok(true)
    }
}

/// What one garbage-collection pass over a [`DirChunkStore`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GcStats {
    pub chunks_kept: u64,
    pub chunks_removed: u64,
    pub bytes_removed: u64,
    /// Leftover temporary files of interrupted writes that were removed.
    pub temp_files_removed: u64,
}

impl DirChunkStore {
    /// The stored size of chunk `hash`, `None` when it is not stored.
    pub fn stored_size(&self, hash: &ChunkHash) -> Option<u64> {
        fs::metadata(self.path_of(hash))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    /// Marks chunk `hash` as recently used, restarting its retention period (a client
    /// was just told it need not upload it, so it must survive until the commit).
    /// Returns whether the chunk is stored.
    pub fn touch(&self, hash: &ChunkHash) -> bool {
        File::open(self.path_of(hash))
            .and_then(|file| file.set_modified(SystemTime::now()))
            .is_ok()
    }

    /// Removes every chunk that is not in `keep` and was last written or touched before
    /// `unused_since`, and temporary files older than that. A chunk uploaded for a
    /// snapshot that is not committed yet survives as long as it is younger.
    pub fn collect_garbage(
        &self,
        keep: &BTreeSet<ChunkHash>,
        unused_since: SystemTime,
    ) -> Result<GcStats, CompilerError> {
        let io = |path: &Path, source: io::Error| CompilerError::ChunkStoreIo {
            path: path.to_path_buf(),
            source,
        };
        let mut stats = GcStats::default();
        let is_old = |meta: &fs::Metadata| meta.modified().is_ok_and(|at| at < unused_since);
        for fan_out in fs::read_dir(&self.root).map_err(|e| io(&self.root, e))? {
            let fan_out = fan_out.map_err(|e| io(&self.root, e))?;
            let prefix = fan_out.file_name().to_string_lossy().into_owned();
            let dir = fan_out.path();
            if !fan_out.file_type().map_err(|e| io(&dir, e))?.is_dir() {
                continue;
            }
            let is_temp_dir = prefix == TEMP_DIR_NAME;
            for file in fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
                let file = file.map_err(|e| io(&dir, e))?;
                let path = file.path();
                let Ok(meta) = fs::symlink_metadata(&path) else {
                    continue;
                };
                if is_temp_dir {
                    if is_old(&meta) && fs::remove_file(&path).is_ok() {
                        stats.temp_files_removed += 1;
                    }
                    continue;
                }
                let name = file.file_name().to_string_lossy().into_owned();
                let referenced = format!("{prefix}{name}")
                    .parse::<ChunkHash>()
                    .is_ok_and(|hash| keep.contains(&hash));
                if referenced || !is_old(&meta) {
                    stats.chunks_kept += 1;
                    continue;
                }
                // Look again right before deleting: an offer may have touched it meanwhile.
                let still_old = fs::symlink_metadata(&path).is_ok_and(|m| is_old(&m));
                if still_old && fs::remove_file(&path).is_ok() {
                    stats.chunks_removed += 1;
                    stats.bytes_removed += meta.len();
                } else {
                    stats.chunks_kept += 1;
                }
            }
        }
        Ok(stats)
    }
}

/// Writes `bytes` to a new file at `path` and waits until they are on disk.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

impl ChunkSource for DirChunkStore {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        let path = self.path_of(hash);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(CompilerError::ChunkNotFound { hash: *hash });
            }
            Err(source) => return Err(CompilerError::ChunkStoreIo { path, source }),
        };
        verify_chunk(hash, &bytes, || {
            format!(
                "stored at `{}`, which is corrupt: delete it so it is fetched again",
                path.display()
            )
        })?;
        Ok(bytes)
    }
}
