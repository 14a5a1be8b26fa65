//! [`Run`] for the PostgreSQL store's pools: a shared [`Statement`]'s `?` placeholders
//! numbered (`$1`, `$2`, …, see [`numbered`]), then bound and run.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Transaction};

use super::numbered;
use crate::statement::{Run, Statement, Transact, Value};

fn query<'q>(sql: &'q str, values: &'q [Value]) -> Query<'q, Postgres, PgArguments> {
    values
        .iter()
        .fold(sqlx::query(sql), |query, value| match value {
            Value::Int(v) => query.bind(*v),
            Value::OptionalInt(v) => query.bind(*v),
            Value::Int32(v) => query.bind(*v),
            Value::OptionalInt32(v) => query.bind(*v),
            Value::Text(v) => query.bind(v.as_str()),
            Value::OptionalText(v) => query.bind(v.as_deref()),
            Value::Bytes(v) => query.bind(v.as_slice()),
        })
}

impl Run for PgPool {
    type Row = PgRow;

    const GREATEST: &'static str = "GREATEST";

    async fn fetch_all(&self, statement: Statement) -> Result<Vec<PgRow>, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values).fetch_all(self).await
    }

    async fn fetch_optional(&self, statement: Statement) -> Result<Option<PgRow>, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values).fetch_optional(self).await
    }

    async fn fetch_one(&self, statement: Statement) -> Result<PgRow, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values).fetch_one(self).await
    }

    async fn execute(&self, statement: Statement) -> Result<u64, sqlx::Error> {
        let sql = numbered(&statement.sql);
        Ok(query(&sql, &statement.values)
            .execute(self)
            .await?
            .rows_affected())
    }

    async fn execute_all(&self, statements: Vec<Statement>) -> Result<(), sqlx::Error> {
        let mut tx = super::begin::begin(self).await?;
        for statement in &statements {
            let sql = numbered(&statement.sql);
            query(&sql, &statement.values).execute(&mut *tx).await?;
        }
        tx.commit().await
    }
}

impl Transact for Transaction<'_, Postgres> {
    type Row = PgRow;

    async fn fetch_all(&mut self, statement: Statement) -> Result<Vec<PgRow>, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values).fetch_all(&mut **self).await
    }

    async fn fetch_optional(&mut self, statement: Statement) -> Result<Option<PgRow>, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values)
            .fetch_optional(&mut **self)
            .await
    }

    async fn fetch_one(&mut self, statement: Statement) -> Result<PgRow, sqlx::Error> {
        let sql = numbered(&statement.sql);
        query(&sql, &statement.values).fetch_one(&mut **self).await
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64, sqlx::Error> {
        let sql = numbered(&statement.sql);
        Ok(query(&sql, &statement.values)
            .execute(&mut **self)
            .await?
            .rows_affected())
    }
}
