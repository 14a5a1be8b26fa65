//! `resources.disk`: while an attempt runs, its working directory is measured now and
//! then — the space its files take on disk, links not followed — and the attempt is
//! stopped once that passes its limit (reason `disk_limit`). The cost stays bounded: a
//! walk stops as soon as the limit is passed, and the next one waits at least
//! [`EVERY`] and ten times as long as the last took, so measuring a huge tree takes no
//! more than a tenth of one core.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// The shortest time between two measurements.
pub(crate) const EVERY: Duration = Duration::from_secs(1);

/// What was found when the limit was passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub used: u64,
    pub limit: u64,
}

/// A running watch of one working directory; it ends when dropped.
#[derive(Debug)]
pub(crate) struct DiskWatch {
    exceeded: Arc<OnceLock<Exceeded>>,
    task: tokio::task::JoinHandle<()>,
}

impl DiskWatch {
    /// Watch `workdir` against `limit` bytes; past it, `stop` is cancelled.
    pub(crate) fn start(workdir: PathBuf, limit: u64, stop: CancellationToken) -> DiskWatch {
        let exceeded = Arc::new(OnceLock::new());
        let found = exceeded.clone();
        let task = tokio::spawn(async move {
            let mut wait = EVERY;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                let dir = workdir.clone();
                let began = Instant::now();
                let Ok(used) = tokio::task::spawn_blocking(move || usage(&dir, limit)).await else {
                    return;
                };
                wait = EVERY.max(began.elapsed() * 10);
                if used > limit {
                    let _ = found.set(Exceeded { used, limit });
                    stop.cancel();
                    return;
                }
            }
        });
        DiskWatch { exceeded, task }
    }

    /// Whether the limit was passed (and the attempt stopped for it).
    pub(crate) fn exceeded(&self) -> Option<Exceeded> {
        self.exceeded.get().copied()
    }
}

impl Drop for DiskWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bytes the files under `dir` take on disk (allocated blocks, so a sparse file
/// counts what it really holds), links not followed; the walk stops once past `limit`.
pub(crate) fn usage(dir: &Path, limit: u64) -> u64 {
    let mut used = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        used = used.saturating_add(meta.blocks() * 512);
        if used > limit {
            return used;
        }
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            pending.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_what_files_take_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![1u8; 1 << 20]).unwrap();
        // A sparse file holds almost nothing; a link is not followed.
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        let used = usage(dir.path(), u64::MAX);
        assert!((1 << 20..2 << 20).contains(&used), "{used}");
        // Past the limit the walk ends at once.
        assert!(usage(dir.path(), 1000) > 1000);
    }

    #[tokio::test]
    async fn a_working_directory_past_its_limit_stops_the_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let watch = DiskWatch::start(dir.path().to_path_buf(), 512 << 10, stop.clone());
        std::fs::write(dir.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        tokio::time::timeout(Duration::from_secs(30), stop.cancelled())
            .await
            .expect("the watch stops the attempt");
        let exceeded = watch.exceeded().unwrap();
        assert_eq!(exceeded.limit, 512 << 10);
        assert!(exceeded.used > 512 << 10);
    }
}
