//! Sandbox logs: lines the server records about a sandbox (lifecycle, envd, backend), read back
//! by `GET /v2/sandboxes/{id}/logs`. Owns the `sandbox_logs` table; rows go with their sandbox.
//! Knows nothing about where lines come from or how they are rendered.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::QueryBuilder;

use crate::db::with_db;
use crate::error::{Result, StoreError, is_foreign_key_violation, query_error};
use crate::{Dialect, Store, from_millis, to_millis};

/// Most lines one read returns (E2B's maximum).
pub const MAX_LOG_LIMIT: u32 = 1000;

/// Severity, ordered: `Debug < Info < Warn < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub const ALL: [LogLevel; 4] = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warn,
        LogLevel::Error,
    ];

    /// E2B's spelling: `debug`, `info`, `warn`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    fn rank(self) -> i64 {
        match self {
            LogLevel::Debug => 0,
            LogLevel::Info => 1,
            LogLevel::Warn => 2,
            LogLevel::Error => 3,
        }
    }

    fn from_rank(rank: i64) -> Option<LogLevel> {
        LogLevel::ALL.into_iter().find(|l| l.rank() == rank)
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogLevel {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self> {
        LogLevel::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| StoreError::Invalid {
                what: "log level",
                reason: format!("{s:?} is not debug, info, warn or error"),
            })
    }
}

/// Which way a log read walks in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogDirection {
    /// Oldest first, from the cursor on.
    #[default]
    Forward,
    /// Newest first, from the cursor back.
    Backward,
}

/// A line to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSandboxLog {
    pub level: LogLevel,
    pub message: String,
    /// Structured fields (E2B's `fields`).
    pub fields: BTreeMap<String, String>,
    pub at: DateTime<Utc>,
}

/// A stored line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxLogRecord {
    /// Increases with every append, across sandboxes.
    pub id: i64,
    pub sandbox_id: String,
    pub at: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// A read of one sandbox's logs, with E2B's parameters.
#[derive(Debug, Clone)]
pub struct LogQuery {
    /// E2B's `cursor`: start at this instant, inclusive (forward: at or after it; backward: at
    /// or before it). `None` starts at the beginning (forward) or the end (backward).
    pub cursor: Option<DateTime<Utc>>,
    /// Clamped to 1..=[`MAX_LOG_LIMIT`].
    pub limit: u32,
    pub direction: LogDirection,
    /// Lines below this level are left out.
    pub min_level: Option<LogLevel>,
    /// Case-sensitive substring of the message.
    pub search: Option<String>,
}

impl Default for LogQuery {
    fn default() -> Self {
        LogQuery {
            cursor: None,
            limit: MAX_LOG_LIMIT,
            direction: LogDirection::Forward,
            min_level: None,
            search: None,
        }
    }
}

#[derive(sqlx::FromRow)]
struct LogRow {
    id: i64,
    sandbox_id: String,
    at: i64,
    level: i64,
    message: String,
    fields: String,
}

impl LogRow {
    fn into_record(self) -> Result<SandboxLogRecord> {
        let corrupt = |what: String| StoreError::Corrupt {
            what: format!("sandbox log line {}: {what}", self.id),
        };
        Ok(SandboxLogRecord {
            level: LogLevel::from_rank(self.level)
                .ok_or_else(|| corrupt(format!("level {}", self.level)))?,
            fields: serde_json::from_str(&self.fields)
                .map_err(|e| corrupt(format!("fields: {e}")))?,
            at: from_millis(self.at, "sandbox_logs.at")?,
            id: self.id,
            sandbox_id: self.sandbox_id,
            message: self.message,
        })
    }
}

impl Store {
    /// Appends one line to sandbox `sandbox_id`'s logs and returns its id.
    pub async fn append_sandbox_log(&self, sandbox_id: &str, line: &NewSandboxLog) -> Result<i64> {
        let fields = serde_json::to_string(&line.fields).map_err(|e| StoreError::Invalid {
            what: "log fields",
            reason: e.to_string(),
        })?;
        let inserted = with_db!(self, |pool| {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO sandbox_logs (sandbox_id, at, level, message, fields) \
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
            )
            .bind(sandbox_id)
            .bind(to_millis(line.at))
            .bind(line.level.rank())
            .bind(&line.message)
            .bind(&fields)
            .fetch_one(pool)
            .await
        });
        inserted.map_err(|e| log_write_error(sandbox_id, e))
    }

    /// Appends lines to sandbox `sandbox_id`'s logs in one transaction (all or none).
    pub async fn append_sandbox_logs(
        &self,
        sandbox_id: &str,
        lines: &[NewSandboxLog],
    ) -> Result<()> {
        let mut encoded = Vec::with_capacity(lines.len());
        for line in lines {
            let fields = serde_json::to_string(&line.fields).map_err(|e| StoreError::Invalid {
                what: "log fields",
                reason: e.to_string(),
            })?;
            encoded.push((line, fields));
        }
        let begin = self.dialect().begin_write();
        let result: std::result::Result<(), sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                for (line, fields) in &encoded {
                    sqlx::query(
                        "INSERT INTO sandbox_logs (sandbox_id, at, level, message, fields) \
                         VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(sandbox_id)
                    .bind(to_millis(line.at))
                    .bind(line.level.rank())
                    .bind(&line.message)
                    .bind(fields)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await
            }
            .await
        });
        result.map_err(|e| log_write_error(sandbox_id, e))
    }

    /// Sandbox `sandbox_id`'s lines matching `query`, in the query's direction (ties in time
    /// keep append order).
    pub async fn list_sandbox_logs(
        &self,
        sandbox_id: &str,
        query: &LogQuery,
    ) -> Result<Vec<SandboxLogRecord>> {
        let limit = query.limit.clamp(1, MAX_LOG_LIMIT);
        let (cmp, dir) = match query.direction {
            LogDirection::Forward => (">=", "ASC"),
            LogDirection::Backward => ("<=", "DESC"),
        };
        let find = match self.dialect() {
            Dialect::Sqlite => "instr",
            Dialect::Postgres => "strpos",
        };
        let rows = with_db!(self, |pool: DB| {
            let mut q = QueryBuilder::<DB>::new(
                "SELECT id, sandbox_id, at, level, message, fields FROM sandbox_logs \
                 WHERE sandbox_id = ",
            );
            q.push_bind(sandbox_id);
            if let Some(level) = query.min_level {
                q.push(" AND level >= ");
                q.push_bind(level.rank());
            }
            if let Some(cursor) = query.cursor {
                q.push(format!(" AND at {cmp} "));
                q.push_bind(to_millis(cursor));
            }
            if let Some(search) = &query.search {
                q.push(format!(" AND {find}(message, "));
                q.push_bind(search.as_str());
                q.push(") > 0");
            }
            q.push(format!(" ORDER BY at {dir}, id {dir} LIMIT "));
            q.push_bind(i64::from(limit));
            q.build_query_as::<LogRow>().fetch_all(pool).await
        })
        .map_err(query_error(format!(
            "read the logs of sandbox {sandbox_id}"
        )))?;
        rows.into_iter().map(LogRow::into_record).collect()
    }
}

fn log_write_error(sandbox_id: &str, e: sqlx::Error) -> StoreError {
    if is_foreign_key_violation(&e) {
        StoreError::SandboxNotFound(sandbox_id.to_owned())
    } else {
        query_error(format!("append to the logs of sandbox {sandbox_id}"))(e)
    }
}
