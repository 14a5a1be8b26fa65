//! rusqlite's errors as the `sqlx::Error`s the rest of the crate reads: a failure SQLite
//! reported becomes `sqlx::Error::Database` carrying its extended result code, so unique-
//! and foreign-key violations ([`crate::sql::refuse_duplicate`], `sql::tasks::unknown_task`),
//! damage ([`super::integrity::is_damage`]) and storage faults
//! ([`crate::StoreError::storage_fault`]) are told apart exactly as they were when sqlx
//! ran the statements (the codes and messages are SQLite's in both cases).

use std::borrow::Cow;

use rusqlite::ffi;
use sqlx::error::{DatabaseError, ErrorKind};

/// An error SQLite returned: its extended result code and its message.
#[derive(Debug)]
pub(crate) struct SqliteFault {
    code: i32,
    message: String,
}

impl std::fmt::Display for SqliteFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As sqlx-sqlite writes its errors, so messages read the same as before.
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for SqliteFault {}

impl DatabaseError for SqliteFault {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// rusqlite's error as sqlx's: SQLite's failures as database errors with their codes,
/// anything else (a value rusqlite could not convert) as a decode error.
pub(crate) fn from_rusqlite(error: rusqlite::Error) -> sqlx::Error {
    match error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            sqlx::Error::Database(Box::new(SqliteFault {
                code: failure.extended_code,
                message: message.unwrap_or_else(|| failure.to_string()),
            }))
        }
        rusqlite::Error::QueryReturnedNoRows => sqlx::Error::RowNotFound,
        other => sqlx::Error::Decode(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(sql: &str) -> sqlx::Error {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "PRAGMA foreign_keys = ON; \
             CREATE TABLE p (id INTEGER PRIMARY KEY, name TEXT UNIQUE); \
             CREATE TABLE c (p INTEGER REFERENCES p (id)); \
             INSERT INTO p VALUES (1, 'a');",
        )
        .unwrap();
        from_rusqlite(conn.execute_batch(sql).unwrap_err())
    }

    #[test]
    fn violations_keep_their_kind_and_code() {
        let unique = fault("INSERT INTO p VALUES (2, 'a')");
        assert!(unique.as_database_error().unwrap().is_unique_violation());
        assert_eq!(
            unique.as_database_error().unwrap().code().as_deref(),
            Some("2067")
        );
        let key = fault("INSERT INTO p VALUES (1, 'b')");
        assert!(key.as_database_error().unwrap().is_unique_violation());
        let foreign = fault("INSERT INTO c VALUES (9)");
        assert!(
            foreign
                .as_database_error()
                .unwrap()
                .is_foreign_key_violation()
        );
        let syntax = fault("SELEC 1");
        assert_eq!(syntax.as_database_error().unwrap().kind(), ErrorKind::Other);
        assert!(syntax.to_string().contains("syntax error"), "{syntax}");
    }

    #[test]
    fn a_full_disk_is_a_storage_fault() {
        let full = from_rusqlite(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        ));
        assert_eq!(
            crate::StoreError::from(full).storage_fault(),
            Some(crate::StorageFault::Full)
        );
    }
}
