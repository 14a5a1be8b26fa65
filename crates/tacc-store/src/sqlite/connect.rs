//! The SQLite store's connections as its threads open them: the settings sqlx applied
//! before, the same on the writer and the readers.

use std::path::Path;
use std::time::Duration;

/// How long a statement waits for a lock another process holds before it fails with
/// `SQLITE_BUSY` (a storage fault: the server answers 503).
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Open `path` (created by the migrations already) with the store's settings:
/// - WAL, so readers run beside the one writer;
/// - `synchronous = NORMAL`: no fsync per commit, `Store::sync` makes groups of commits
///   durable (`durability`); checkpoints still sync the files they copy between;
/// - foreign keys enforced;
/// - reads served from the page cache through a mapping, not a pread each;
/// - a checkpoint every 10,000 pages (about 40 MiB of log) instead of SQLite's 1,000: a
///   checkpoint syncs both files, so a trivial task's share of those syncs falls from
///   about 0.04 to 0.004 fsyncs (docs/BENCHMARKS.md, "Store commits per task").
pub(crate) fn connect(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; \
         PRAGMA foreign_keys = ON; \
         PRAGMA mmap_size = 268435456; \
         PRAGMA wal_autocheckpoint = 10000;",
    )?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_has_the_store_settings() {
        let dir = tempfile::tempdir().unwrap();
        let conn = connect(&dir.path().join("t.db")).unwrap();
        let pragma = |name: &str| -> String {
            conn.query_row(&format!("PRAGMA {name}"), [], |row| {
                row.get_ref(0).map(|v| match v {
                    rusqlite::types::ValueRef::Integer(i) => i.to_string(),
                    rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                    other => format!("{other:?}"),
                })
            })
            .unwrap()
        };
        assert_eq!(pragma("journal_mode"), "wal");
        assert_eq!(pragma("synchronous"), "1", "NORMAL");
        assert_eq!(pragma("foreign_keys"), "1");
        assert_eq!(pragma("mmap_size"), "268435456");
        assert_eq!(pragma("wal_autocheckpoint"), "10000");
        assert_eq!(pragma("busy_timeout"), "10000");
    }
}
