//! Group commit for the SQLite store: commits are atomic at once and durable at the next
//! barrier, and one `fsync` makes every commit before it durable.
//!
//! The database runs in WAL mode with `synchronous=NORMAL`: a commit appends its frames to
//! the write-ahead log with `write()` and returns without an `fsync`. It survives a crash of
//! the process at once (the frames are in the kernel's page cache), and a power loss only
//! once the log file has been synced. [`Durability::barrier`] does that sync: every caller
//! that must not answer before its change survives a power loss waits on a barrier, and
//! callers that arrive while one `fsync` runs share the next one — many requests per
//! `fsync` instead of one `fsync` per commit (SQLite's `synchronous=FULL`).
//!
//! Why a sync of our own file descriptor is enough: `fsync` flushes the inode's dirty
//! pages whichever descriptor wrote them. Checkpoints, which copy the log into the database
//! file, sync both files themselves under `synchronous=NORMAL` before the log is reused
//! (every 10,000 pages of log: `wal_autocheckpoint`, set where the store opens).
//!
//! A failed `fsync` poisons the barrier for good: after one, Linux may have dropped the
//! dirty pages and marked them clean, so a later `fsync` that succeeds proves nothing
//! (PostgreSQL's "fsyncgate"). The server then answers every request with a storage fault
//! until it is restarted and reads back what really reached the disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::{Result, StoreError};

/// How the log file is made durable: the real `fsync`, or a counting fake in tests.
pub(crate) trait SyncFile: Send + Sync + std::fmt::Debug {
    /// Make the write-ahead log `wal` (or, when it is gone, the database `db`) durable.
    fn sync(&self, wal: &Path, db: &Path) -> std::io::Result<()>;
}

/// The real sync: `fdatasync` of the log file; of the database file when the log is gone
/// (every connection closed and checkpointed it away).
#[derive(Debug, Default)]
pub(crate) struct Fsync;

impl SyncFile for Fsync {
    fn sync(&self, wal: &Path, db: &Path) -> std::io::Result<()> {
        match std::fs::File::open(wal) {
            Ok(file) => file.sync_data(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::File::open(db)?.sync_data()
            }
            Err(e) => Err(e),
        }
    }
}

/// See [`Durability::writing`].
pub(crate) struct Writing<'a>(&'a AtomicU64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// The commits made so far and the commits known durable, and the one sync in flight.
#[derive(Debug)]
pub(crate) struct Durability {
    /// Bumped when a write of the store ends, before its method returns (its commit, if
    /// any, is in the log by then; see [`Durability::writing`]).
    written: AtomicU64,
    /// Every write counted up to this value has been synced.
    durable: AtomicU64,
    /// One sync at a time; callers that wait here share the next one.
    syncing: tokio::sync::Mutex<()>,
    poisoned: AtomicBool,
    wal: PathBuf,
    db: PathBuf,
    file: Arc<dyn SyncFile>,
    syncs: AtomicU64,
}

impl Durability {
    pub(crate) fn new(db: &Path, file: Arc<dyn SyncFile>) -> Durability {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        Durability {
            written: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            syncing: tokio::sync::Mutex::new(()),
            poisoned: AtomicBool::new(false),
            wal: PathBuf::from(wal),
            db: db.to_path_buf(),
            file,
            syncs: AtomicU64::new(0),
        }
    }

    /// Held by a write for its whole run (in the SQLite store, by its job on the writer
    /// thread): when it is dropped (the commit done, or the write failed) the next barrier
    /// must sync.
    pub(crate) fn writing(&self) -> Writing<'_> {
        Writing(&self.written)
    }

    /// How many syncs were made (for tests and the benchmark's figure).
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Returns once every write finished before this call is durable: at once when nothing
    /// was written since the last sync, else after one sync shared with every caller that
    /// arrives meanwhile.
    pub(crate) async fn barrier(&self) -> Result<()> {
        let target = self.written.load(Ordering::Acquire);
        self.check_poison()?;
        if self.durable.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        let _one_sync = self.syncing.lock().await;
        self.check_poison()?;
        // The sync that held the lock may have covered this caller's writes already.
        if self.durable.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        // Everything counted by now is in the log before the sync starts.
        let upto = self.written.load(Ordering::Acquire);
        let file = self.file.clone();
        let (wal, db) = (self.wal.clone(), self.db.clone());
        let synced = tokio::task::spawn_blocking(move || file.sync(&wal, &db))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match synced {
            Ok(()) => {
                self.durable.fetch_max(upto, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                tracing::error!(
                    "syncing the database's write-ahead log {} failed: {e}; no write is \
                     acknowledged from now on, restart taccd once the disk is sound",
                    self.wal.display()
                );
                Err(StoreError::Unavailable(sqlx::Error::Io(e)))
            }
        }
    }

    fn check_poison(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable(sqlx::Error::Io(
                std::io::Error::other(format!(
                    "an earlier sync of {} failed, so nothing written since can be trusted to \
                     be on disk; restart taccd once the disk is sound",
                    self.wal.display()
                )),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Counts syncs and can be made to fail, or to hold each sync until released.
    #[derive(Debug, Default)]
    struct FakeSync {
        fail: AtomicBool,
        calls: AtomicU64,
        /// Syncs begun (counted before the gate, so a test knows which writes one covers).
        entered: AtomicU64,
        gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    }

    impl SyncFile for FakeSync {
        fn sync(&self, _: &Path, _: &Path) -> std::io::Result<()> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = self.gate.lock().unwrap().as_ref() {
                let _ = gate.recv();
            }
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(5));
            }
            Ok(())
        }
    }

    fn durability(fake: &Arc<FakeSync>) -> Durability {
        Durability::new(Path::new("/nonexistent/tacc.db"), fake.clone())
    }

    #[tokio::test]
    async fn nothing_written_needs_no_sync_and_a_write_needs_one() {
        let fake = Arc::new(FakeSync::default());
        let d = durability(&fake);
        d.barrier().await.unwrap();
        assert_eq!(fake.calls.load(Ordering::SeqCst), 0);
        drop(d.writing());
        d.barrier().await.unwrap();
        d.barrier().await.unwrap();
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            1,
            "the second barrier found nothing new"
        );
        assert_eq!(d.syncs(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn callers_arriving_during_a_sync_share_the_next_one() {
        let fake = Arc::new(FakeSync::default());
        let (open, gate) = std::sync::mpsc::channel();
        *fake.gate.lock().unwrap() = Some(gate);
        let d = Arc::new(durability(&fake));
        drop(d.writing());
        let first = tokio::spawn({
            let d = d.clone();
            async move { d.barrier().await }
        });
        // While the first sync is held, 50 more writers commit and wait. Not before it has
        // begun: the barrier reads what it covers after taking the lock, so holding the
        // lock alone does not mean the first sync's share is settled.
        while fake.entered.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let mut waiting = Vec::new();
        for _ in 0..50 {
            drop(d.writing());
            let d = d.clone();
            waiting.push(tokio::spawn(async move { d.barrier().await }));
        }
        open.send(()).unwrap();
        open.send(()).unwrap();
        first.await.unwrap().unwrap();
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            2,
            "51 writers made durable by two syncs: the one in flight and one shared"
        );
    }

    #[tokio::test]
    async fn a_failed_sync_refuses_every_later_barrier() {
        let fake = Arc::new(FakeSync::default());
        let d = durability(&fake);
        drop(d.writing());
        fake.fail.store(true, Ordering::SeqCst);
        let error = d.barrier().await.unwrap_err();
        assert!(
            matches!(
                error.storage_fault(),
                Some(crate::StorageFault::Unavailable)
            ),
            "{error}"
        );
        // The disk answers again, but the dropped pages may never have been written.
        fake.fail.store(false, Ordering::SeqCst);
        let error = d.barrier().await.unwrap_err();
        assert!(error.to_string().contains("restart taccd"), "{error}");
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            1,
            "no second sync is trusted"
        );
    }
}
