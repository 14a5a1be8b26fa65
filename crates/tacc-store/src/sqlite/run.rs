//! [`Run`] and [`Transact`] for the SQLite store's own connections: a shared [`Statement`]
//! bound and run as written (its `?` placeholders are SQLite's own), on the thread that
//! owns the connection ([`threads`](super::threads)).
//!
//! Nothing here waits: every future these impls return is ready when first polled, so a
//! job drives a shared `async` path of [`crate::sql`] to its end on its own thread with
//! [`block`], with no runtime and no hand-off per statement.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use rusqlite::types::{ToSqlOutput, Value as Sql, ValueRef};

use super::fault::from_rusqlite;
use crate::rows::{Columns, corrupt};
use crate::statement::{Run, Statement, Transact, Value};
use crate::{Result, StoreError};

/// Prepared statements kept per connection: the shared SQL has about a hundred distinct
/// texts, most of them on the hot path of one transition.
const CACHED_STATEMENTS: usize = 256;

/// Drive a future of the shared SQL to completion on this thread. Statements on a
/// [`Conn`] complete synchronously, so it is ready at the first poll.
///
/// # Panics
/// When it is not: the shared path awaited something other than a statement (a timer,
/// a lock), which a job on a connection thread must never do.
pub(crate) fn block<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!(
            "a shared SQL path pended on a SQLite connection thread: its statements complete at \
             once, so it awaited something else (a timer or a lock), which a store job must not"
        ),
    }
}

/// One connection, owned by one thread. The mutex is never contended (only its thread
/// uses it); it makes the connection `Sync`, as [`Run`] requires of a pool.
#[derive(Debug)]
pub(crate) struct Conn(Mutex<rusqlite::Connection>);

impl Conn {
    pub(crate) fn new(connection: rusqlite::Connection) -> Conn {
        connection.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
        Conn(Mutex::new(connection))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, rusqlite::Connection> {
        // A job that panicked poisoned nothing we rely on: the thread checks the
        // connection's transaction state after every job.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Replace the connection (closing the old one, which rolls back what it held).
    pub(crate) fn replace(&self, connection: rusqlite::Connection) {
        connection.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
        *self.lock() = connection;
    }

    fn fetch(&self, statement: &Statement, first_only: bool) -> Result<Vec<Row>, sqlx::Error> {
        let conn = self.lock();
        let mut prepared = conn.prepare_cached(&statement.sql).map_err(from_rusqlite)?;
        let columns: Arc<[String]> = prepared
            .column_names()
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut rows = prepared
            .query(rusqlite::params_from_iter(
                statement.values.iter().map(Bind),
            ))
            .map_err(from_rusqlite)?;
        let mut fetched = Vec::new();
        while let Some(row) = rows.next().map_err(from_rusqlite)? {
            let values = (0..columns.len())
                .map(|i| row.get_ref(i).map(Sql::from))
                .collect::<rusqlite::Result<Vec<Sql>>>()
                .map_err(from_rusqlite)?;
            fetched.push(Row {
                columns: columns.clone(),
                values,
            });
            if first_only {
                break;
            }
        }
        Ok(fetched)
    }

    /// Run a statement to its end; the rows it changed. Rows it returns are stepped
    /// through and dropped, as sqlx's `execute` does.
    fn run(&self, statement: &Statement) -> Result<u64, sqlx::Error> {
        let conn = self.lock();
        let mut prepared = conn.prepare_cached(&statement.sql).map_err(from_rusqlite)?;
        let mut rows = prepared
            .query(rusqlite::params_from_iter(
                statement.values.iter().map(Bind),
            ))
            .map_err(from_rusqlite)?;
        while rows.next().map_err(from_rusqlite)?.is_some() {}
        drop(rows);
        Ok(conn.changes())
    }

    /// Refuse to write on a connection with a transaction still open: a write would run
    /// inside it and never commit (see `threads::no_transaction_left_open`, which closes
    /// such a connection; this is the guard for when it could not open a fresh one).
    pub(crate) fn no_open_transaction(&self) -> Result<()> {
        if self.lock().is_autocommit() {
            return Ok(());
        }
        Err(StoreError::Unavailable(sqlx::Error::Io(
            std::io::Error::other(
                "a failed write left a transaction open on the database connection and it could \
             not be rolled back; check the disk holding the database, then restart taccd",
            ),
        )))
    }

    /// Begin a transaction: `IMMEDIATE` takes the write lock at once (the writer);
    /// deferred reads one snapshot (a reader).
    pub(crate) fn begin(&self, write: bool) -> Result<Tx<'_>, sqlx::Error> {
        let begin = if write { "BEGIN IMMEDIATE" } else { "BEGIN" };
        self.lock().execute_batch(begin).map_err(from_rusqlite)?;
        Ok(Tx { conn: self })
    }
}

/// A statement's value as SQLite binds it, borrowed rather than copied.
struct Bind<'v>(&'v Value);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        let value = match self.0 {
            Value::Int(v) => ValueRef::Integer(*v),
            Value::OptionalInt(v) => v.map_or(ValueRef::Null, ValueRef::Integer),
            Value::Int32(v) => ValueRef::Integer(i64::from(*v)),
            Value::OptionalInt32(v) => v.map_or(ValueRef::Null, |v| ValueRef::Integer(v.into())),
            Value::Text(v) => ValueRef::Text(v.as_bytes()),
            Value::OptionalText(v) => v
                .as_deref()
                .map_or(ValueRef::Null, |v| ValueRef::Text(v.as_bytes())),
            Value::Bytes(v) => ValueRef::Blob(v),
        };
        Ok(ToSqlOutput::Borrowed(value))
    }
}

/// An open transaction on a [`Conn`]: committed by [`Tx::commit`], rolled back when
/// dropped without it.
#[derive(Debug)]
pub(crate) struct Tx<'c> {
    conn: &'c Conn,
}

impl Tx<'_> {
    pub(crate) fn commit(self) -> Result<(), sqlx::Error> {
        let committed = self
            .conn
            .lock()
            .execute_batch("COMMIT")
            .map_err(from_rusqlite);
        // A failed COMMIT may leave the transaction open (SQLITE_BUSY) or rolled back
        // already (SQLITE_FULL): `Drop` rolls back whatever is left.
        committed
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        let conn = self.conn.lock();
        if !conn.is_autocommit() {
            // What failed is already reported; a failed rollback is caught by the thread's
            // check after the job, which replaces the connection.
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
}

/// A fetched row, its values copied out of SQLite and its column names shared by every
/// row of one statement.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    columns: Arc<[String]>,
    values: Vec<Sql>,
}

impl Row {
    fn get(&self, column: &str) -> Result<&Sql> {
        self.columns
            .iter()
            .position(|name| name == column)
            .map(|i| &self.values[i])
            .ok_or_else(|| corrupt(format!("no column `{column}` in the row")))
    }

    fn mismatch(column: &str, wanted: &str, found: &Sql) -> StoreError {
        corrupt(format!(
            "column `{column}` holds {}, not {wanted}",
            found.data_type()
        ))
    }

    fn optional_integer(&self, column: &str) -> Result<Option<i64>> {
        match self.get(column)? {
            Sql::Null => Ok(None),
            Sql::Integer(v) => Ok(Some(*v)),
            other => Err(Self::mismatch(column, "an integer", other)),
        }
    }

    fn optional_string(&self, column: &str) -> Result<Option<String>> {
        match self.get(column)? {
            Sql::Null => Ok(None),
            Sql::Text(v) => Ok(Some(v.clone())),
            other => Err(Self::mismatch(column, "text", other)),
        }
    }
}

fn present<T>(value: Option<T>, column: &str) -> Result<T> {
    value.ok_or_else(|| corrupt(format!("column `{column}` is NULL")))
}

fn narrow(value: i64, column: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| corrupt(format!("column `{column}`: {value} exceeds 32 bits")))
}

impl Columns for Row {
    fn int(&self, column: &str) -> Result<i64> {
        present(self.optional_integer(column)?, column)
    }

    fn optional_int(&self, column: &str) -> Result<Option<i64>> {
        self.optional_integer(column)
    }

    fn int32(&self, column: &str) -> Result<i32> {
        narrow(self.int(column)?, column)
    }

    fn optional_int32(&self, column: &str) -> Result<Option<i32>> {
        self.optional_integer(column)?
            .map(|v| narrow(v, column))
            .transpose()
    }

    fn text(&self, column: &str) -> Result<String> {
        present(self.optional_string(column)?, column)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>> {
        self.optional_string(column)
    }

    fn bytes(&self, column: &str) -> Result<Vec<u8>> {
        match self.get(column)? {
            Sql::Blob(v) => Ok(v.clone()),
            Sql::Text(v) => Ok(v.clone().into_bytes()),
            other => Err(Self::mismatch(column, "bytes", other)),
        }
    }
}

impl Run for Conn {
    type Row = Row;

    const GREATEST: &'static str = "MAX";

    async fn fetch_all(&self, statement: Statement) -> Result<Vec<Row>, sqlx::Error> {
        self.fetch(&statement, false)
    }

    async fn fetch_optional(&self, statement: Statement) -> Result<Option<Row>, sqlx::Error> {
        Ok(self.fetch(&statement, true)?.pop())
    }

    async fn fetch_one(&self, statement: Statement) -> Result<Row, sqlx::Error> {
        self.fetch(&statement, true)?
            .pop()
            .ok_or(sqlx::Error::RowNotFound)
    }

    async fn execute(&self, statement: Statement) -> Result<u64, sqlx::Error> {
        self.run(&statement)
    }

    async fn execute_all(&self, statements: Vec<Statement>) -> Result<(), sqlx::Error> {
        let tx = self.begin(true)?;
        for statement in &statements {
            self.run(statement)?;
        }
        tx.commit()
    }
}

impl Transact for Tx<'_> {
    type Row = Row;

    async fn fetch_all(&mut self, statement: Statement) -> Result<Vec<Row>, sqlx::Error> {
        self.conn.fetch(&statement, false)
    }

    async fn fetch_optional(&mut self, statement: Statement) -> Result<Option<Row>, sqlx::Error> {
        Ok(self.conn.fetch(&statement, true)?.pop())
    }

    async fn fetch_one(&mut self, statement: Statement) -> Result<Row, sqlx::Error> {
        self.conn
            .fetch(&statement, true)?
            .pop()
            .ok_or(sqlx::Error::RowNotFound)
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64, sqlx::Error> {
        self.conn.run(&statement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "awaited something else")]
    fn a_shared_path_that_pends_is_a_loud_bug() {
        block(std::future::pending::<()>());
    }

    #[test]
    fn rows_decode_as_the_stores_keep_them() {
        let conn = Conn::new(rusqlite::Connection::open_in_memory().unwrap());
        let row = block(
            conn.fetch_one(
                Statement::new("SELECT ? AS i, ? AS n, ? AS t, ? AS b, 4294967296 AS big")
                    .bind(7_i64)
                    .bind(None::<i64>)
                    .bind("text")
                    .bind(&vec![1_u8, 2]),
            ),
        )
        .unwrap();
        assert_eq!(row.int("i").unwrap(), 7);
        assert_eq!(row.int32("i").unwrap(), 7);
        assert_eq!(row.optional_int("n").unwrap(), None);
        assert_eq!(row.optional_text("n").unwrap(), None);
        assert_eq!(row.text("t").unwrap(), "text");
        assert_eq!(row.bytes("b").unwrap(), vec![1, 2]);
        for wrong in [row.int("n"), row.int("t"), row.int("missing")] {
            assert!(matches!(wrong, Err(StoreError::Corrupt(_))), "{wrong:?}");
        }
        assert!(matches!(row.int32("big"), Err(StoreError::Corrupt(_))));
        let none = block(conn.fetch_one(Statement::new("SELECT 1 WHERE 0")));
        assert!(matches!(none, Err(sqlx::Error::RowNotFound)), "{none:?}");
    }

    #[test]
    fn a_transaction_dropped_uncommitted_is_rolled_back() {
        let conn = Conn::new(rusqlite::Connection::open_in_memory().unwrap());
        block(conn.execute(Statement::new("CREATE TABLE t (v INTEGER)"))).unwrap();
        {
            let mut tx = conn.begin(true).unwrap();
            block(tx.execute(Statement::new("INSERT INTO t VALUES (1)"))).unwrap();
        }
        assert!(conn.lock().is_autocommit());
        let tx = conn.begin(true).unwrap();
        let mut tx = tx;
        let changed = block(tx.execute(Statement::new("INSERT INTO t VALUES (2), (3)"))).unwrap();
        assert_eq!(changed, 2);
        tx.commit().unwrap();
        let rows = block(conn.fetch_all(Statement::new("SELECT v FROM t ORDER BY v"))).unwrap();
        let values: Vec<i64> = rows.iter().map(|r| r.int("v").unwrap()).collect();
        assert_eq!(values, vec![2, 3]);
    }
}
