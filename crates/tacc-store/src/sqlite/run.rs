//! [`Run`] for the SQLite store's pools: a shared [`Statement`] bound and run as written,
//! its `?` placeholders being SQLite's own.

use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Sqlite, SqlitePool, Transaction};

use crate::statement::{Run, Statement, Transact, Value};

fn query(statement: &Statement) -> Query<'_, Sqlite, SqliteArguments<'_>> {
    statement
        .values
        .iter()
        .fold(sqlx::query(&statement.sql), |query, value| match value {
            Value::Int(v) => query.bind(*v),
            Value::OptionalInt(v) => query.bind(*v),
            Value::Int32(v) => query.bind(*v),
            Value::OptionalInt32(v) => query.bind(*v),
            Value::Text(v) => query.bind(v.as_str()),
            Value::OptionalText(v) => query.bind(v.as_deref()),
            Value::Bytes(v) => query.bind(v.as_slice()),
        })
}

impl Run for SqlitePool {
    type Row = SqliteRow;

    const GREATEST: &'static str = "MAX";

    async fn fetch_all(&self, statement: Statement) -> Result<Vec<SqliteRow>, sqlx::Error> {
        query(&statement).fetch_all(self).await
    }

    async fn fetch_optional(&self, statement: Statement) -> Result<Option<SqliteRow>, sqlx::Error> {
        query(&statement).fetch_optional(self).await
    }

    async fn fetch_one(&self, statement: Statement) -> Result<SqliteRow, sqlx::Error> {
        query(&statement).fetch_one(self).await
    }

    async fn execute(&self, statement: Statement) -> Result<u64, sqlx::Error> {
        Ok(query(&statement).execute(self).await?.rows_affected())
    }

    async fn execute_all(&self, statements: Vec<Statement>) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        for statement in &statements {
            query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await
    }
}

impl Transact for Transaction<'_, Sqlite> {
    type Row = SqliteRow;

    async fn fetch_all(&mut self, statement: Statement) -> Result<Vec<SqliteRow>, sqlx::Error> {
        query(&statement).fetch_all(&mut **self).await
    }

    async fn fetch_optional(
        &mut self,
        statement: Statement,
    ) -> Result<Option<SqliteRow>, sqlx::Error> {
        query(&statement).fetch_optional(&mut **self).await
    }

    async fn fetch_one(&mut self, statement: Statement) -> Result<SqliteRow, sqlx::Error> {
        query(&statement).fetch_one(&mut **self).await
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64, sqlx::Error> {
        Ok(query(&statement)
            .execute(&mut **self)
            .await?
            .rows_affected())
    }
}
