//! Beginning a transaction so that a caller dropped half-way cannot leave the pooled
//! connection inside it.
//!
//! sqlx 0.8's PostgreSQL `begin` sends `BEGIN` and counts the transaction as open only
//! once the server has answered. A caller dropped in between (a request whose client went
//! away, a loop aborted because its server stopped leading) returns the connection to the
//! pool inside a transaction that nothing will ever end: every later statement on it runs
//! in that transaction, and its locks are held. On the writer's single connection that
//! meant the lease row stayed locked by the election's upsert, a replica that could not
//! renew lost the lease, and the writes made in the leaked transaction could be rolled
//! back when the server ended the idle session (`tests/ha.rs`, CI of 2026-11-28). So the
//! `BEGIN` is sent from a task of its own, which lives until the answer arrives; when the
//! caller is gone by then, the transaction is dropped there and rolled back as usual.

use sqlx::{PgPool, Postgres, Transaction};

/// A transaction on a connection of `pool`, begun whether or not the caller waits for it.
pub(crate) async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin().await })
        .await
        .map_err(|e| {
            sqlx::Error::Io(std::io::Error::other(format!(
                "beginning a transaction: {e}"
            )))
        })?
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Waker};

    use sqlx::postgres::PgPoolOptions;

    use super::*;
    use crate::test_database::TestDatabase;

    /// Whether the backend `pid` is inside a transaction, asked on another connection.
    async fn in_transaction(observer: &PgPool, pid: i32) -> bool {
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(observer)
                .await
                .unwrap();
        state.is_some_and(|s| s.starts_with("idle in transaction"))
    }

    /// Poll `begin` `polls` times, letting the runtime run between polls, then drop it:
    /// a request cancelled at some moment of its begin. Whether that left the connection
    /// in a transaction once the pool has it back (whatever was spawned has ended).
    async fn dropped_after<F: Future>(
        pool: &PgPool,
        observer: &PgPool,
        polls: usize,
        begin: F,
    ) -> bool {
        let mut begin = Box::pin(begin);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..polls {
            if begin.as_mut().poll(&mut cx).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(begin);
        // The pool's only connection, once it is back (the pool may have replaced it).
        let mut conn = pool.acquire().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        let left = in_transaction(observer, pid).await;
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        left
    }

    #[tokio::test]
    async fn a_begin_whose_caller_is_dropped_leaves_no_transaction_open() {
        let test = "a_begin_whose_caller_is_dropped_leaves_no_transaction_open";
        let Some(database) = TestDatabase::create(test).await else {
            return;
        };
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database.url)
            .await
            .unwrap();
        let observer = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database.url)
            .await
            .unwrap();
        // Dropped at every point from before its first poll to after its end: the
        // property holds at each, so the test cannot pass or fail by timing.
        for polls in 0..40 {
            assert!(
                !dropped_after(&pool, &observer, polls, begin(&pool)).await,
                "a `begin` dropped after {polls} polls left its connection in a transaction"
            );
        }
        // And the pool is usable: a transaction begun now is its own, and ends.
        let mut tx = begin(&pool).await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert!(!in_transaction(&observer, pid).await);
        pool.close().await;
        observer.close().await;
    }
}
