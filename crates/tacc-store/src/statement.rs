//! A statement either SQL store can run: SQL text in SQLite's `?` form and the values it
//! binds, built once by the shared read and write paths in [`sql`](crate::sql) and run on
//! a store's pool through [`Run`] or inside its open transaction through [`Transact`].
//! Each store implements both for its own types (the PostgreSQL store numbering the
//! placeholders first), so the shared paths need no sqlx bounds on the database type:
//! they only ask for `&impl Run` or `&mut impl Transact`.

use std::future::Future;

use crate::rows::Columns;

/// One bound value, in the types the stores bind.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Int(i64),
    OptionalInt(Option<i64>),
    /// For PostgreSQL's 32-bit `INTEGER` columns (`exit_code`, `status`).
    Int32(i32),
    OptionalInt32(Option<i32>),
    Text(String),
    OptionalText(Option<String>),
    Bytes(Vec<u8>),
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Value::Int(value)
    }
}

impl From<Option<i64>> for Value {
    fn from(value: Option<i64>) -> Self {
        Value::OptionalInt(value)
    }
}

impl From<i32> for Value {
    fn from(value: i32) -> Self {
        Value::Int32(value)
    }
}

impl From<Option<i32>> for Value {
    fn from(value: Option<i32>) -> Self {
        Value::OptionalInt32(value)
    }
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Value::Text(value.to_string())
    }
}

impl From<&String> for Value {
    fn from(value: &String) -> Self {
        Value::Text(value.clone())
    }
}

impl From<String> for Value {
    fn from(value: String) -> Self {
        Value::Text(value)
    }
}

impl From<Option<&str>> for Value {
    fn from(value: Option<&str>) -> Self {
        Value::OptionalText(value.map(str::to_string))
    }
}

impl From<Option<String>> for Value {
    fn from(value: Option<String>) -> Self {
        Value::OptionalText(value)
    }
}

impl From<&Option<String>> for Value {
    fn from(value: &Option<String>) -> Self {
        Value::OptionalText(value.clone())
    }
}

impl From<&Vec<u8>> for Value {
    fn from(value: &Vec<u8>) -> Self {
        Value::Bytes(value.clone())
    }
}

/// SQL text with `?` placeholders and the values they take, in order.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    pub(crate) sql: String,
    pub(crate) values: Vec<Value>,
}

impl Statement {
    pub(crate) fn new(sql: impl Into<String>) -> Self {
        Statement {
            sql: sql.into(),
            values: Vec::new(),
        }
    }

    pub(crate) fn bind(mut self, value: impl Into<Value>) -> Self {
        self.values.push(value.into());
        self
    }
}

/// A pool of either SQL store that runs [`Statement`]s. Errors stay sqlx's, so a caller can
/// still tell a unique-key or foreign-key violation apart before converting.
pub(crate) trait Run: Sync {
    type Row: Columns + Send;

    /// The SQL function for the larger of two values: SQLite's two-argument `MAX`,
    /// PostgreSQL's `GREATEST` (its `MAX` is only the aggregate).
    const GREATEST: &'static str;

    fn fetch_all(
        &self,
        statement: Statement,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;

    fn fetch_optional(
        &self,
        statement: Statement,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;

    fn fetch_one(
        &self,
        statement: Statement,
    ) -> impl Future<Output = Result<Self::Row, sqlx::Error>> + Send;

    /// The number of rows the statement changed.
    fn execute(
        &self,
        statement: Statement,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Every statement in one transaction, committed together or not at all.
    fn execute_all(
        &self,
        statements: Vec<Statement>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// An open transaction of either SQL store that runs [`Statement`]s. The store begins it,
/// checks its fence where it has one, and commits it; the shared paths only write in it.
pub(crate) trait Transact: Send {
    type Row: Columns + Send;

    fn fetch_all(
        &mut self,
        statement: Statement,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;

    fn fetch_optional(
        &mut self,
        statement: Statement,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;

    fn fetch_one(
        &mut self,
        statement: Statement,
    ) -> impl Future<Output = Result<Self::Row, sqlx::Error>> + Send;

    /// The number of rows the statement changed.
    fn execute(
        &mut self,
        statement: Statement,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}
