//! Connection pools, URL parsing, SQLite pragmas and migrations; the one place that knows both
//! dialects exist. Knows nothing about tenants, keys or sandboxes beyond running their migrations.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::{Result, StoreError};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long a SQLite writer waits for another writer before failing with `SQLITE_BUSY`.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(15);
const SQLITE_MAX_CONNECTIONS: u32 = 8;
const POSTGRES_MAX_CONNECTIONS: u32 = 16;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// The open pool, one variant per dialect.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Which database a [`crate::Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The dialect's name, as used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// The statement that opens a transaction which will write. SQLite takes the write lock up
    /// front so two writers queue on `busy_timeout` instead of failing on a lock upgrade.
    pub(crate) fn begin_write(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }
}

/// Runs `$body` with `$pool` bound to the SQLite or the Postgres pool, and the type alias `$db`
/// naming the driver. The body is compiled once per dialect, so it must be valid SQL for both
/// (SQLite accepts `$1` placeholders) or choose its text by `Store::dialect`.
macro_rules! with_db {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.db {
            $crate::db::Db::Sqlite($pool) => $body,
            $crate::db::Db::Postgres($pool) => $body,
        }
    };
    ($store:expr, |$pool:ident : $db:ident| $body:expr) => {
        match &$store.db {
            $crate::db::Db::Sqlite($pool) => {
                #[allow(clippy::upper_case_acronyms)]
                type $db = ::sqlx::Sqlite;
                $body
            }
            $crate::db::Db::Postgres($pool) => {
                #[allow(clippy::upper_case_acronyms)]
                type $db = ::sqlx::Postgres;
                $body
            }
        }
    };
}
pub(crate) use with_db;

/// What a database URL designates.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    SqliteFile(PathBuf),
    SqliteUrl(String),
    Postgres(String),
}

/// Classifies `url`: `postgres://…`/`postgresql://…`, `sqlite:…`, or a plain file path.
pub(crate) fn parse_target(url: &str) -> Result<Target> {
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: String::new(),
            reason: "empty".into(),
        });
    }
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        return Ok(Target::Postgres(trimmed.to_owned()));
    }
    if trimmed.starts_with("sqlite:") {
        return Ok(Target::SqliteUrl(trimmed.to_owned()));
    }
    if let Some((scheme, _)) = trimmed.split_once("://") {
        return Err(StoreError::InvalidUrl {
            url: redact(trimmed),
            reason: format!(
                "unsupported scheme {scheme:?} (use sqlite:///path, a file path or postgres://)"
            ),
        });
    }
    Ok(Target::SqliteFile(PathBuf::from(trimmed)))
}

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

pub(crate) async fn open(url: &str) -> Result<Db> {
    match parse_target(url)? {
        Target::Postgres(url) => open_postgres(&url).await,
        Target::SqliteUrl(url) => {
            let options =
                SqliteConnectOptions::from_str(&url).map_err(|source| StoreError::Connect {
                    url: redact(&url),
                    source,
                })?;
            open_sqlite(options, &url).await
        }
        Target::SqliteFile(path) => {
            let shown = path.display().to_string();
            open_sqlite(SqliteConnectOptions::new().filename(&path), &shown).await
        }
    }
}

async fn open_postgres(url: &str) -> Result<Db> {
    let connect_error = |source| StoreError::Connect {
        url: redact(url),
        source,
    };
    let options = PgConnectOptions::from_str(url).map_err(connect_error)?;
    // One direct connection first: the pool would retry until its timeout and then report only
    // that it timed out, hiding "connection refused" or "password authentication failed".
    PgConnection::connect_with(&options)
        .await
        .map_err(connect_error)?
        .close()
        .await
        .map_err(connect_error)?;
    let pool = PgPoolOptions::new()
        .max_connections(POSTGRES_MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connect_error)?;
    POSTGRES_MIGRATIONS
        .run(&pool)
        .await
        .map_err(|source| StoreError::Migrate {
            backend: "postgres",
            source,
        })?;
    Ok(Db::Postgres(pool))
}

fn with_sqlite_pragmas(options: SqliteConnectOptions) -> SqliteConnectOptions {
    options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .foreign_keys(true)
}

async fn open_sqlite(options: SqliteConnectOptions, shown: &str) -> Result<Db> {
    let options = with_sqlite_pragmas(options);
    let file = options.get_filename();
    let in_memory = file == Path::new(":memory:")
        || shown.contains(":memory:")
        || shown.contains("mode=memory");
    if !in_memory && let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    let pool_options = if in_memory {
        // Every connection to `:memory:` is its own database: keep exactly one, forever.
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        SqlitePoolOptions::new().max_connections(SQLITE_MAX_CONNECTIONS)
    };
    let pool = pool_options
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|source| StoreError::Connect {
            url: shown.to_owned(),
            source,
        })?;
    SQLITE_MIGRATIONS
        .run(&pool)
        .await
        .map_err(|source| StoreError::Migrate {
            backend: "sqlite",
            source,
        })?;
    Ok(Db::Sqlite(pool))
}

pub(crate) async fn open_in_memory() -> Result<Db> {
    let url = "sqlite::memory:";
    let options = SqliteConnectOptions::from_str(url).map_err(|source| StoreError::Connect {
        url: url.to_owned(),
        source,
    })?;
    open_sqlite(options, url).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_urls() {
        assert_eq!(
            parse_target("postgres://u@h/db").ok(),
            Some(Target::Postgres("postgres://u@h/db".into()))
        );
        assert_eq!(
            parse_target("sqlite:///var/lib/cella/cella.db").ok(),
            Some(Target::SqliteUrl("sqlite:///var/lib/cella/cella.db".into()))
        );
        assert_eq!(
            parse_target("/var/lib/cella/cella.db").ok(),
            Some(Target::SqliteFile("/var/lib/cella/cella.db".into()))
        );
        assert!(matches!(
            parse_target("mysql://h/db"),
            Err(StoreError::InvalidUrl { .. })
        ));
        assert!(matches!(
            parse_target("  "),
            Err(StoreError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://cella:hunter2@db:5432/cella?sslmode=disable"),
            "postgres://cella:***@db:5432/cella?sslmode=disable"
        );
        assert_eq!(
            redact("postgres://cella@db/cella"),
            "postgres://cella@db/cella"
        );
        assert_eq!(redact("/a/b.db"), "/a/b.db");
    }
}
