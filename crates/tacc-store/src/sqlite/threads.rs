//! The threads that own the SQLite store's connections: one writer, a few readers. A store
//! call is one job (a closure over the connection, running every statement of the call),
//! sent to a thread over a queue and answered over a oneshot: one hand-off per call
//! whatever number of statements it runs. sqlx ran each statement, and streamed each row,
//! through its own worker thread, two context switches a round trip; those hand-offs were
//! about 40 % of the server's CPU on a trivial array (docs/BENCHMARKS.md).
//!
//! A job runs to its end even when its caller stopped waiting (the caller's answer is
//! then dropped), so nothing is left half-done on the connection, and no job waits on
//! anything but SQLite: nothing holds the writer across an `.await`.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use super::run::Conn;
use crate::{Result, StoreError};

type Job = Box<dyn FnOnce(&Conn) + Send>;

/// Opens a fresh connection for a thread (the writer replaces a broken one with it).
pub(crate) type Open =
    std::sync::Arc<dyn Fn() -> rusqlite::Result<rusqlite::Connection> + Send + Sync>;

/// Connection threads sharing one job queue.
#[derive(Debug)]
pub(crate) struct Threads {
    jobs: Option<flume::Sender<Job>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Jobs sent so far: the hand-offs the store's calls cost (tests check one a call).
    sent: AtomicU64,
}

impl Threads {
    /// One thread per connection, each named `name`. The writer (`writer: true`) checks
    /// after every job that no transaction is left open on its connection.
    pub(crate) fn start(
        name: &str,
        connections: Vec<rusqlite::Connection>,
        writer: bool,
        open: Open,
    ) -> std::io::Result<Threads> {
        let (jobs, queue) = flume::unbounded::<Job>();
        let mut handles = Vec::new();
        for connection in connections {
            let queue = queue.clone();
            let open = open.clone();
            let conn = Conn::new(connection);
            handles.push(
                std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn(move || serve(&conn, &queue, writer, &*open))?,
            );
        }
        Ok(Threads {
            jobs: Some(jobs),
            handles: Mutex::new(handles),
            sent: AtomicU64::new(0),
        })
    }

    /// Run `job` on one of the threads and return its answer.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // The caller may have stopped waiting: its answer is dropped.
            let _ = answer.send(job(conn));
        });
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or(StoreError::Unavailable(sqlx::Error::PoolClosed))?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        answered
            .await
            // The job panicked (the thread logged it and goes on with the next job).
            .unwrap_or(Err(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))
    }
}

impl Threads {
    /// How many jobs were sent to these threads.
    #[cfg(test)]
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Once the store is dropped, its threads finish the jobs queued, close their connections
/// and end; the drop returns when they have, so the file is closed by then (a reopen or a
/// checkpoint after the drop finds none of this store's connections).
impl Drop for Threads {
    fn drop(&mut self) {
        drop(self.jobs.take());
        let handles = std::mem::take(
            &mut *self
                .handles
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        let me = std::thread::current().id();
        for handle in handles {
            // Never join oneself (a job that held the last handle of the store).
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

fn serve(
    conn: &Conn,
    queue: &flume::Receiver<Job>,
    writer: bool,
    open: &(dyn Fn() -> rusqlite::Result<rusqlite::Connection> + Send + Sync),
) {
    while let Ok(job) = queue.recv() {
        if std::panic::catch_unwind(AssertUnwindSafe(|| job(conn))).is_err() {
            tracing::error!("a job of the SQLite store panicked; its caller gets an error");
        }
        if writer {
            no_transaction_left_open(conn, open);
        }
    }
}

/// Whether the writer connection may be used again: no transaction is left open on it.
///
/// A write that fails for space can leave one open: SQLite may keep the transaction when
/// `COMMIT` or `ROLLBACK` fails with `SQLITE_FULL` or an I/O error. Every later write would
/// then run inside that transaction and never commit: acknowledged, yet invisible and
/// lost on restart. A rollback is tried first; if the transaction is still open, the
/// connection is closed (SQLite rolls back whatever it held) and a fresh one opened.
fn no_transaction_left_open(
    conn: &Conn,
    open: &(dyn Fn() -> rusqlite::Result<rusqlite::Connection> + Send + Sync),
) {
    if conn.lock().is_autocommit() {
        return;
    }
    tracing::warn!("a failed write left a transaction open on the database connection");
    let _ = conn.lock().execute_batch("ROLLBACK");
    if conn.lock().is_autocommit() {
        return;
    }
    match open() {
        Ok(fresh) => {
            tracing::warn!("the rollback failed too; closing the connection, opening a fresh one");
            conn.replace(fresh);
        }
        Err(e) => tracing::error!(
            "the rollback failed and no fresh database connection could be opened ({e}); \
             writes will fail until one can"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn writer(path: &std::path::Path) -> Threads {
        let owned = path.to_path_buf();
        let open: Open = Arc::new(move || super::super::connect::connect(&owned));
        let conn = open().unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
        Threads::start("test-writer", vec![conn], true, open).unwrap()
    }

    fn values(path: &std::path::Path) -> Vec<i64> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn.prepare("SELECT v FROM t ORDER BY v").unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_thread_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let threads = writer(&dir.path().join("t.db"));
        let crashed = threads
            .run(|_| -> Result<()> { panic!("a bug in a job") })
            .await
            .unwrap_err();
        assert_eq!(
            crashed.storage_fault(),
            Some(crate::StorageFault::Unavailable),
            "{crashed}"
        );
        let answer = threads.run(|_| Ok(42)).await.unwrap();
        assert_eq!(answer, 42);
        assert_eq!(threads.sent(), 2);
    }

    /// A job that leaves a transaction open (as a COMMIT failing for space can) would
    /// swallow every later write into it: the writer rolls it back before the next job.
    #[tokio::test]
    async fn a_transaction_left_open_is_rolled_back_before_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let threads = writer(&path);
        threads
            .run(|conn| {
                conn.lock()
                    .execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1)")
                    .unwrap();
                Ok(())
            })
            .await
            .unwrap();
        threads
            .run(|conn| {
                conn.no_open_transaction()?;
                conn.lock()
                    .execute_batch("INSERT INTO t VALUES (2)")
                    .unwrap();
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            values(&path),
            vec![2],
            "the second write committed on its own"
        );
        drop(threads);
        assert_eq!(values(&path), vec![2], "and the first was never committed");
    }
}
