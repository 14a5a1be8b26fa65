//! `--database`: which store the control plane keeps its state in, decoded once from the
//! command line. Left out, it is the embedded SQLite file DATA_DIR/tacc.db; a
//! `postgres://` (or `postgresql://`) URL selects a PostgreSQL server instead. Logs,
//! chunks and outputs stay in the data directory either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use tacc_store::{PostgresStore, SqliteStore, Store};

/// The environment variable `--database` is read from when not given: the way to pass a
/// URL that carries a password.
pub(crate) const DATABASE_ENV: &str = "TACC_DATABASE";

/// Warn when this process's command line carries a database password: every process on
/// the machine reads command lines (`ps -eo args`), tasks included.
pub(crate) fn warn_of_password_on_command_line() {
    let args: Vec<String> = std::env::args().collect();
    let given = args.iter().enumerate().filter_map(|(at, arg)| {
        if arg == "--database" {
            args.get(at + 1).cloned()
        } else {
            arg.strip_prefix("--database=").map(str::to_string)
        }
    });
    let with_password = given
        .filter_map(|url| url::Url::parse(&url).ok())
        .any(|url| url.password().is_some());
    if with_password {
        tracing::warn!(
            "the --database URL on this command line carries a password, which every process \
             on this machine can read (`ps -eo args`), tasks included: set {DATABASE_ENV} in \
             the daemon's environment instead (e.g. systemd's EnvironmentFile=, mode 0600)"
        );
    }
}

/// Where the state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Database {
    /// The embedded SQLite file at this path.
    Sqlite(PathBuf),
    /// A PostgreSQL database at this URL.
    Postgres(String),
}

impl Database {
    /// What `--database` names (`None`: the embedded file in the data directory). Parsed
    /// here rather than by clap, whose error would echo the value, password included.
    pub(crate) fn choose(arg: Option<&str>, data_dir: &Path) -> Result<Database, String> {
        let Some(text) = arg.map(str::trim) else {
            return Ok(Database::Sqlite(data_dir.join("tacc.db")));
        };
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Database::Postgres(text.to_string()));
        }
        if let Some(path) = text.strip_prefix("sqlite://") {
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        if text.is_empty() || text.contains("://") {
            return Err(format!(
                "--database `{}` is not a database: give postgres://USER:PASSWORD@HOST:PORT/DATABASE \
                 for PostgreSQL, or a file path (or sqlite://PATH) for SQLite",
                tacc_store::redacted(text)
            ));
        }
        Ok(Database::Sqlite(PathBuf::from(text)))
    }

    /// Open the store, bringing its schema up to date.
    pub(crate) async fn open(&self) -> Result<Arc<dyn Store>> {
        Ok(match self {
            Database::Sqlite(path) => Arc::new(SqliteStore::open(path).await?),
            Database::Postgres(url) => {
                Arc::new(PostgresStore::open(url).await.with_context(|| {
                    format!(
                        "cannot use the PostgreSQL database {} (check --database: the server \
                         must be reachable and the database must exist)",
                        tacc_store::redacted(url)
                    )
                })?)
            }
        })
    }
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "SQLite {}", path.display()),
            Database::Postgres(url) => write!(f, "PostgreSQL {}", tacc_store::redacted(url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::Database;

    fn chosen(text: Option<&str>) -> Result<Database, String> {
        Database::choose(text, Path::new("/data"))
    }

    #[test]
    fn left_out_it_is_the_embedded_file() {
        assert_eq!(
            chosen(None),
            Ok(Database::Sqlite(PathBuf::from("/data/tacc.db")))
        );
    }

    #[test]
    fn a_postgres_url_selects_postgres() {
        for url in ["postgres://u:p@h:5432/tacc", "postgresql://h/tacc"] {
            assert_eq!(chosen(Some(url)), Ok(Database::Postgres(url.into())));
        }
    }

    #[test]
    fn a_path_or_sqlite_url_selects_that_file() {
        let file = Ok(Database::Sqlite(PathBuf::from("/srv/t.db")));
        assert_eq!(chosen(Some("/srv/t.db")), file);
        assert_eq!(chosen(Some("sqlite:///srv/t.db")), file);
    }

    #[test]
    fn another_scheme_is_refused_without_its_password() {
        let err = chosen(Some("mysql://u:hunter2@h/tacc")).unwrap_err();
        assert!(err.contains("postgres://"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
