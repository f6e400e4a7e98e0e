//! Persistence for `cella serve`: tenants, API keys, sandboxes, sandbox logs, the audit trail and
//! the Agent Skills registry and the job queue with its events, on SQLite (the embedded default,
//! WAL) or Postgres, with migrations for both.
//!
//! Owns the schema and every SQL statement. Must not know about HTTP, the E2B wire shapes,
//! backends or how a sandbox is run: records carry a backend's state as opaque JSON.
//!
//! Conventions: every write is one statement or one transaction; timestamps are UTC with
//! millisecond precision (finer parts are dropped on write, see [`now`]); ids are text.

mod api_keys;
mod audit;
mod db;
mod error;
mod jobs;
mod sandbox_logs;
mod sandboxes;
mod skills;
mod tenants;

use chrono::{DateTime, Utc};

pub use api_keys::{API_KEY_PREFIX, ApiKeyRecord, NewApiKey};
pub use audit::{AuditRecord, MAX_AUDIT_LIMIT, SYSTEM_ACTOR};
pub use db::Dialect;
pub use error::{Result, StoreError};
pub use jobs::{
    ClaimRequest, INTERRUPTED_BY_RESTART, JOB_FINISHED_EVENT, JobEvent, JobOutcome, JobRecord,
    JobStatus, MAX_EVENT_LIMIT, NewJob,
};
pub use sandbox_logs::{
    LogDirection, LogLevel, LogQuery, MAX_LOG_LIMIT, NewSandboxLog, SandboxLogRecord,
};
pub use sandboxes::{
    MAX_PAGE_LIMIT, Page, PageRequest, SandboxFilter, SandboxRecord, SandboxState, SortOrder,
};
pub use skills::{MAX_SKILL_PAGE_LIMIT, NewSkillVersion, SkillFile, SkillVersionRecord};
pub use tenants::TenantRecord;

/// The store: a pool of connections to one database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Store {
    db: db::Db,
}

impl Store {
    /// Opens (creating and migrating if needed) the database at `url`:
    /// `sqlite:///path/cella.db`, a plain file path, or `postgres://user@host/db`.
    /// SQLite files are created with their parent directories and run in WAL mode with foreign
    /// keys on and a busy timeout, so concurrent writers queue instead of failing.
    pub async fn open(url: &str) -> Result<Store> {
        Ok(Store {
            db: db::open(url).await?,
        })
    }

    /// A private in-memory SQLite database (one connection), for tests of the store's callers.
    pub async fn open_in_memory() -> Result<Store> {
        Ok(Store {
            db: db::open_in_memory().await?,
        })
    }

    /// Which database this store talks to.
    pub fn dialect(&self) -> Dialect {
        match self.db {
            db::Db::Sqlite(_) => Dialect::Sqlite,
            db::Db::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Closes every connection, waiting for running statements to finish.
    pub async fn close(&self) {
        db::with_db!(self, |pool| pool.close().await);
    }
}

/// The current time at the store's precision (whole milliseconds), so a value written and read
/// back compares equal.
pub fn now() -> DateTime<Utc> {
    truncate_to_millis(Utc::now())
}

/// `t` without its sub-millisecond part.
pub fn truncate_to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

pub(crate) fn to_millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_millis(ms: i64, what: &str) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| StoreError::Corrupt {
        what: format!("{what}: timestamp {ms} out of range"),
    })
}

/// Lowercase hex of `bytes` bytes from the kernel's random source.
pub(crate) fn random_hex(bytes: usize, what: &'static str) -> Result<String> {
    let mut raw = vec![0u8; bytes];
    getrandom::fill(&mut raw).map_err(|e| StoreError::Random {
        what,
        reason: e.to_string(),
    })?;
    Ok(hex(&raw))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}
