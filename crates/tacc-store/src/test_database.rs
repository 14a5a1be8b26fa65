//! Throw-away PostgreSQL databases for tests of [`PostgresStore`](crate::PostgresStore):
//! one new, empty database per test on the server named by `TACC_TEST_POSTGRES_URL`
//! (`scripts/ci/setup-postgres.sh` starts one and prints its URL), dropped when the
//! [`TestDatabase`] is. Without that variable a test is skipped, loudly, except in CI
//! (`CI=true`), where a missing server is a failure.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};

/// The variable naming the server (a URL of a database the role may connect to, such as
/// `postgres://tacc:tacc@127.0.0.1:5432/postgres`; the role needs `CREATEDB`).
pub const URL_VARIABLE: &str = "TACC_TEST_POSTGRES_URL";

/// A database created for one test, dropped (with whatever is still connected to it)
/// when this is.
#[derive(Debug)]
pub struct TestDatabase {
    /// The URL of the new database.
    pub url: String,
    admin_url: String,
    name: String,
}

impl TestDatabase {
    /// A new, empty database for `test`, or `None` when no server is configured outside
    /// CI (after saying so on stderr). Panics in CI without a server, and anywhere when
    /// the configured server cannot create the database.
    pub async fn create(test: &str) -> Option<TestDatabase> {
        let admin_url = match std::env::var(URL_VARIABLE) {
            Ok(url) if !url.is_empty() => url,
            _ => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!(
                        "{test}: PostgreSQL is required in CI but {URL_VARIABLE} is not set; \
                         run scripts/ci/setup-postgres.sh and export the URL it prints"
                    );
                }
                // Straight to the terminal: the test harness swallows eprintln! of
                // passing tests.
                use std::io::Write;
                let _ = write!(
                    std::io::stderr(),
                    "\n######## SKIPPED {test}: no PostgreSQL server ({URL_VARIABLE} is not set).\n\
                     ######## Run `sudo scripts/ci/setup-postgres.sh` and export {URL_VARIABLE}=<the URL it prints> to test against real PostgreSQL.\n"
                );
                return None;
            }
        };
        let name = unique_name();
        let mut admin = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!(
                "{test}: cannot connect to {} ({URL_VARIABLE}): {e}; is the server running \
                 (scripts/ci/setup-postgres.sh)?",
                crate::redacted(&admin_url)
            )
        });
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| {
                panic!("{test}: cannot create database {name} (does the role have CREATEDB?): {e}")
            });
        let _ = admin.close().await;
        let url = with_database(&admin_url, &name);
        Some(TestDatabase {
            url,
            admin_url,
            name,
        })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on: the database is
        // dropped from a thread of its own, and waited for, so none is left behind.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = admin.close().await;
                Ok::<_, String>(())
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("warning: could not drop test database {}: {e}", self.name);
        }
    }
}

/// `tacc_test_<pid>_<counter>_<nanos>`: unique across the tests of one process and across
/// processes, and a plain identifier (no quoting needed).
fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "tacc_test_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `url` with its database (the path) replaced by `name`, its query string kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced() {
        assert_eq!(
            with_database("postgres://tacc:tacc@127.0.0.1:5432/postgres", "t1"),
            "postgres://tacc:tacc@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgres://h:5432?sslmode=disable", "t1"),
            "postgres://h:5432/t1?sslmode=disable"
        );
    }
}
