//! The SQLite file's integrity, checked when the store opens: a file with damaged pages
//! (a failing disk, a bad copy, bytes written into it) opens and answers `/v1/health`
//! like a sound one, and then fails requests one by one with "database disk image is
//! malformed". The server must refuse to start on it instead, saying which file and how
//! to get a sound one back.
//!
//! `PRAGMA quick_check` reads every page (O(file size): about a second per GiB on an SSD)
//! but skips the index-versus-table cross-check of `integrity_check`. Its time is bounded
//! by [`CHECK_BUDGET`]: a progress handler interrupts it past the budget, and the store
//! opens with a warning that the check did not finish (what it read was sound).

use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};

use crate::StoreError;

/// How long the check at open may take.
pub(crate) const CHECK_BUDGET: Duration = Duration::from_secs(10);
/// Virtual-machine steps between two looks at the clock.
const STEPS_PER_LOOK: i32 = 10_000;
/// Problems `quick_check` reports at most (the first few say enough).
const PROBLEMS_SHOWN: u32 = 5;

/// What the check found, when it did not find damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    Sound,
    /// The budget ran out before the check read the whole file.
    Unfinished,
}

/// SQLite's result codes for a damaged file (`SQLITE_CORRUPT`, `SQLITE_NOTADB`).
pub(crate) fn is_damage(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| {
            let primary = code.parse::<i32>().map(|c| c & 0xff);
            matches!(primary, Ok(11) | Ok(26))
        })
}

/// The error that refuses a damaged file, naming it and the way back.
pub(crate) fn damaged(path: &Path, detail: String) -> StoreError {
    StoreError::Damaged {
        path: path.display().to_string(),
        detail,
    }
}

/// Run `quick_check` on the file behind `options` within `budget`.
pub(crate) async fn check(
    options: &SqliteConnectOptions,
    path: &Path,
    budget: Duration,
) -> Result<Checked, StoreError> {
    let open = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
        hint: "check the directory exists and is writable",
    };
    let mut conn = match options.connect().await {
        Ok(conn) => conn,
        Err(e) if is_damage(&e) => return Err(damaged(path, e.to_string())),
        Err(e) => return Err(open(e)),
    };
    let deadline = Instant::now() + budget;
    conn.lock_handle()
        .await
        .map_err(open)?
        .set_progress_handler(STEPS_PER_LOOK, move || Instant::now() < deadline);
    let rows = sqlx::query(&format!("PRAGMA quick_check({PROBLEMS_SHOWN})"))
        .fetch_all(&mut conn)
        .await;
    let _ = conn.close().await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) if is_damage(&e) => return Err(damaged(path, e.to_string())),
        // SQLITE_INTERRUPT: the progress handler stopped it at the deadline.
        Err(e) if Instant::now() >= deadline => {
            tracing::debug!("the integrity check was interrupted: {e}");
            return Ok(Checked::Unfinished);
        }
        Err(e) => return Err(StoreError::from(e)),
    };
    let problems: Vec<String> = rows
        .iter()
        .filter_map(|row| row.try_get::<String, _>(0).ok())
        .filter(|line| line != "ok")
        .collect();
    if problems.is_empty() {
        Ok(Checked::Sound)
    } else {
        Err(damaged(path, problems.join("; ")))
    }
}
