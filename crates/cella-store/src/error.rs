//! The store's error type. Owns the wording of every failure a caller can see from the store;
//! knows nothing about HTTP statuses (the server maps variants to statuses).

use std::path::PathBuf;

/// Everything that can go wrong in the store. Messages are lower-case, name what failed and never
/// contain an API key or a database password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL is neither `sqlite:…`, `postgres://…` nor a file path.
    #[error("invalid database url {url}: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// The directory that should hold the SQLite file could not be created.
    #[error("cannot create the store directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Connecting to the database failed. `url` has its password removed.
    #[error("cannot open the store at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },

    /// Applying the schema migrations failed.
    #[error("cannot migrate the {backend} store: {source}")]
    Migrate {
        backend: &'static str,
        #[source]
        source: sqlx::migrate::MigrateError,
    },

    /// A statement failed; `what` says which operation, on what (e.g. "insert sandbox abc").
    #[error("cannot {what}: {source}")]
    Query {
        what: String,
        #[source]
        source: sqlx::Error,
    },

    /// A stored row does not decode (bad JSON, unknown state, out-of-range number).
    #[error("corrupt row in the store: {what}")]
    Corrupt { what: String },

    /// The kernel's random source failed while generating `what`.
    #[error("cannot read random bytes for {what}: {reason}")]
    Random { what: &'static str, reason: String },

    /// An argument is out of its domain (empty tenant name, bad cursor, …).
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },

    #[error("tenant {0:?} already exists")]
    TenantExists(String),

    #[error("tenant {0} not found")]
    TenantNotFound(String),

    #[error("api key {0} not found")]
    ApiKeyNotFound(String),

    #[error("sandbox {0} already exists")]
    SandboxExists(String),

    #[error("sandbox {0} not found")]
    SandboxNotFound(String),

    /// The sandbox is already killed; killed is final.
    #[error("sandbox {id} has ended and cannot become {wanted}")]
    SandboxEnded { id: String, wanted: &'static str },
}

/// Store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Wraps a driver error with the operation that failed.
pub(crate) fn query_error(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Query { what, source }
}

/// Whether `err` is a unique-constraint violation.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Whether `err` is a foreign-key violation.
pub(crate) fn is_foreign_key_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_foreign_key_violation())
}
