//! Jobs: the persistent queue of agent runs and each run's numbered events. Owns the `jobs`,
//! `job_events` and full-text (`job_events_fts` / `job_events.search`) tables.
//!
//! A job is `pending` until a node's runner claims it (`running`, with a lease the runner
//! renews), then ends `complete`, `error` or `cancelled`; an ended job never changes again.
//! Claiming honours priorities and per-node and per-tenant concurrency, atomically: SQLite
//! under `BEGIN IMMEDIATE`, Postgres with `FOR UPDATE SKIP LOCKED` and the tenant's row locked.
//! Knows nothing about agents, sandboxes or HTTP: the task, limits, usage and event payloads
//! are opaque JSON here.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::QueryBuilder;

use crate::db::with_db;
use crate::error::{
    Result, StoreError, is_foreign_key_violation, is_unique_violation, query_error,
};
use crate::sandboxes::{decode_cursor, encode_cursor};
use crate::{Dialect, MAX_PAGE_LIMIT, Page, Store, from_millis, to_millis};

const JOB_COLUMNS: &str = "id, tenant_id, status, task, strategy, model, template, skills, \
     limits, metadata, priority, attempts, created_at, started_at, finished_at, last_event_at, \
     usage, final_answer, error, sandbox_id, node, lease_expires_at, last_seq, cancel_reason";

/// Most events one read returns.
pub const MAX_EVENT_LIMIT: u32 = 1000;

/// The type of the last event of every job, written with its final status.
pub const JOB_FINISHED_EVENT: &str = "job_finished";

/// The error of a job that was running when its server died.
pub const INTERRUPTED_BY_RESTART: &str = "interrupted by restart";

/// Where a job is in its life. `Complete`, `Error` and `Cancelled` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Pending,
    Running,
    Complete,
    Error,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Complete,
        JobStatus::Error,
        JobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Complete => "complete",
            JobStatus::Error => "error",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Complete, error or cancelled: nothing changes it any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobStatus::Complete | JobStatus::Error | JobStatus::Cancelled
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self> {
        JobStatus::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| StoreError::Invalid {
                what: "job status",
                reason: format!("{s:?} is not pending, running, complete, error or cancelled"),
            })
    }
}

/// A job to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub id: String,
    pub tenant_id: String,
    pub task: String,
    pub strategy: String,
    pub model: Option<String>,
    pub template: String,
    pub skills: Vec<String>,
    pub limits: serde_json::Value,
    pub metadata: BTreeMap<String, String>,
    /// Higher runs first; ties run oldest first.
    pub priority: i64,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub id: String,
    pub tenant_id: String,
    pub status: JobStatus,
    pub task: String,
    pub strategy: String,
    pub model: Option<String>,
    pub template: String,
    pub skills: Vec<String>,
    pub limits: serde_json::Value,
    pub metadata: BTreeMap<String, String>,
    pub priority: i64,
    /// How many times a runner claimed it.
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    /// First claim.
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_event_at: Option<DateTime<Utc>>,
    pub usage: Option<serde_json::Value>,
    pub final_answer: Option<String>,
    pub error: Option<String>,
    pub sandbox_id: Option<String>,
    /// The node whose runner holds (or last held) it.
    pub node: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The seq of its newest event (0: none yet).
    pub last_seq: i64,
    /// Why a cancel was requested, once one was.
    pub cancel_reason: Option<String>,
}

/// One stored event of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobEvent {
    pub job_id: String,
    /// 1, 2, 3… per job.
    pub seq: i64,
    /// The event's type (`tool_result`, `job_finished`, …).
    pub kind: String,
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    /// Complete, error or cancelled.
    pub status: JobStatus,
    pub final_answer: Option<String>,
    pub error: Option<String>,
    pub usage: Option<serde_json::Value>,
}

/// What a runner may take: its node's name and the concurrency it allows.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub node: String,
    /// Most jobs running on this node at once.
    pub node_limit: u32,
    /// Most jobs of one tenant running at once, across nodes.
    pub tenant_limit: u32,
    /// How long the claim holds without a renewal.
    pub lease: Duration,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: String,
    tenant_id: String,
    status: String,
    task: String,
    strategy: String,
    model: Option<String>,
    template: String,
    skills: String,
    limits: String,
    metadata: String,
    priority: i64,
    attempts: i64,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    last_event_at: Option<i64>,
    usage: Option<String>,
    final_answer: Option<String>,
    error: Option<String>,
    sandbox_id: Option<String>,
    node: Option<String>,
    lease_expires_at: Option<i64>,
    last_seq: i64,
    cancel_reason: Option<String>,
}

impl JobRow {
    fn into_record(self) -> Result<JobRecord> {
        let id = self.id;
        let corrupt = |what: &str, e: &dyn fmt::Display| StoreError::Corrupt {
            what: format!("job {id}: {what}: {e}"),
        };
        let time = |t: Option<i64>, what: &str| t.map(|t| from_millis(t, what)).transpose();
        Ok(JobRecord {
            status: self.status.parse().map_err(|e| corrupt("status", &e))?,
            skills: serde_json::from_str(&self.skills).map_err(|e| corrupt("skills", &e))?,
            limits: serde_json::from_str(&self.limits).map_err(|e| corrupt("limits", &e))?,
            metadata: serde_json::from_str(&self.metadata).map_err(|e| corrupt("metadata", &e))?,
            usage: self
                .usage
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .map_err(|e| corrupt("usage", &e))?,
            attempts: u32::try_from(self.attempts).map_err(|e| corrupt("attempts", &e))?,
            created_at: from_millis(self.created_at, "jobs.created_at")?,
            started_at: time(self.started_at, "jobs.started_at")?,
            finished_at: time(self.finished_at, "jobs.finished_at")?,
            last_event_at: time(self.last_event_at, "jobs.last_event_at")?,
            lease_expires_at: time(self.lease_expires_at, "jobs.lease_expires_at")?,
            tenant_id: self.tenant_id,
            task: self.task,
            strategy: self.strategy,
            model: self.model,
            template: self.template,
            priority: self.priority,
            final_answer: self.final_answer,
            error: self.error,
            sandbox_id: self.sandbox_id,
            node: self.node,
            last_seq: self.last_seq,
            cancel_reason: self.cancel_reason,
            id,
        })
    }
}

#[derive(sqlx::FromRow)]
struct EventRow {
    job_id: String,
    seq: i64,
    #[sqlx(rename = "type")]
    kind: String,
    payload: String,
    created_at: i64,
}

impl EventRow {
    fn into_event(self) -> Result<JobEvent> {
        Ok(JobEvent {
            payload: serde_json::from_str(&self.payload).map_err(|e| StoreError::Corrupt {
                what: format!("event {} of job {}: {e}", self.seq, self.job_id),
            })?,
            created_at: from_millis(self.created_at, "job_events.created_at")?,
            job_id: self.job_id,
            seq: self.seq,
            kind: self.kind,
        })
    }
}

fn to_json(value: &impl Serialize, what: &'static str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Invalid {
        what,
        reason: e.to_string(),
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The words of `text`: runs of letters and digits (so `compute.py` is `compute` and `py` in
/// both databases, whatever their own tokenizers would make of it).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// What full-text search indexes of an event: the words of every string value in `payload`
/// (keys, numbers and booleans are not content).
fn search_words(payload: &serde_json::Value) -> String {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.extend(words(s).map(str::to_owned)),
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            serde_json::Value::Object(map) => map.values().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(payload, &mut out);
    out.join(" ")
}

/// `query` as an FTS5 expression: every word must occur (each quoted, so no word is read as an
/// operator). `None` when it has no word.
fn fts5_query(query: &str) -> Option<String> {
    let quoted: Vec<String> = words(query).map(|w| format!("\"{w}\"")).collect();
    (!quoted.is_empty()).then(|| quoted.join(" "))
}

/// `query` as a Postgres tsquery: every word must occur (words are letters and digits only,
/// so none is an operator). `None` when it has no word.
fn tsquery(query: &str) -> Option<String> {
    let all: Vec<&str> = words(query).collect();
    (!all.is_empty()).then(|| all.join(" & "))
}

/// Appends one event inside an open transaction `$tx`: takes the next seq from the job row
/// (which also locks it) and inserts the event. Evaluates to `Result<Option<i64>, sqlx::Error>`
/// (`None`: no such job).
macro_rules! append_in_tx {
    ($tx:expr, $job_id:expr, $kind:expr, $payload:expr, $words:expr, $now:expr) => {
        async {
            let seq: Option<i64> = sqlx::query_scalar(
                "UPDATE jobs SET last_seq = last_seq + 1, last_event_at = $1 WHERE id = $2 \
                 RETURNING last_seq",
            )
            .bind($now)
            .bind($job_id)
            .fetch_optional(&mut *$tx)
            .await?;
            if let Some(seq) = seq {
                sqlx::query(
                    "INSERT INTO job_events (job_id, seq, type, payload, words, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind($job_id)
                .bind(seq)
                .bind($kind)
                .bind($payload)
                .bind($words)
                .bind($now)
                .execute(&mut *$tx)
                .await?;
            }
            Ok::<_, sqlx::Error>(seq)
        }
    };
}

impl Store {
    /// Queues a new job. [`StoreError::Invalid`] if the id is taken,
    /// [`StoreError::TenantNotFound`] if the tenant does not exist.
    pub async fn insert_job(&self, job: &NewJob) -> Result<JobRecord> {
        let skills = to_json(&job.skills, "job skills")?;
        let limits = to_json(&job.limits, "job limits")?;
        let metadata = to_json(&job.metadata, "job metadata")?;
        let now = to_millis(crate::now());
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(format!(
                "INSERT INTO jobs (id, tenant_id, status, task, strategy, model, template, \
                 skills, limits, metadata, priority, attempts, created_at) \
                 VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $10, 0, $11) \
                 RETURNING {JOB_COLUMNS}"
            )))
            .bind(&job.id)
            .bind(&job.tenant_id)
            .bind(&job.task)
            .bind(&job.strategy)
            .bind(&job.model)
            .bind(&job.template)
            .bind(&skills)
            .bind(&limits)
            .bind(&metadata)
            .bind(job.priority)
            .bind(now)
            .fetch_one(pool)
            .await
        });
        match row {
            Ok(row) => row.into_record(),
            Err(e) if is_unique_violation(&e) => Err(StoreError::Invalid {
                what: "job id",
                reason: format!("job {} already exists", job.id),
            }),
            Err(e) if is_foreign_key_violation(&e) => {
                Err(StoreError::TenantNotFound(job.tenant_id.clone()))
            }
            Err(e) => Err(query_error(format!("insert job {}", job.id))(e)),
        }
    }

    /// The job `id`, whoever owns it (for the runner).
    pub async fn get_job(&self, id: &str) -> Result<Option<JobRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"
            )))
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("read job {id}")))?;
        row.map(JobRow::into_record).transpose()
    }

    /// The job `id` if `tenant_id` owns it; `None` for another tenant's job.
    pub async fn get_job_for_tenant(&self, tenant_id: &str, id: &str) -> Result<Option<JobRecord>> {
        Ok(self
            .get_job(id)
            .await?
            .filter(|job| job.tenant_id == tenant_id))
    }

    /// One page of `tenant_id`'s jobs, newest first, optionally only those in `status`.
    /// `cursor` is a previous page's `next_cursor`.
    pub async fn list_jobs(
        &self,
        tenant_id: &str,
        status: Option<JobStatus>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<JobRecord>> {
        let after = cursor.map(decode_cursor).transpose()?;
        let limit = limit.clamp(1, MAX_PAGE_LIMIT);
        let rows = with_db!(self, |pool: DB| {
            let mut q = QueryBuilder::<DB>::new(format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = "
            ));
            q.push_bind(tenant_id);
            if let Some(status) = status {
                q.push(" AND status = ");
                q.push_bind(status.as_str());
            }
            if let Some((at, id)) = &after {
                q.push(" AND (created_at, id) < (");
                q.push_bind(*at);
                q.push(", ");
                q.push_bind(id.as_str());
                q.push(")");
            }
            q.push(" ORDER BY created_at DESC, id DESC LIMIT ");
            q.push_bind(i64::from(limit) + 1);
            q.build_query_as::<JobRow>().fetch_all(pool).await
        })
        .map_err(query_error(format!("list jobs of tenant {tenant_id}")))?;
        let items = rows
            .into_iter()
            .map(JobRow::into_record)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(items, limit, |last| {
            encode_cursor(to_millis(last.created_at), &last.id)
        }))
    }

    /// Claims the next job for `req.node`: the highest-priority, oldest pending job whose
    /// tenant is under `tenant_limit` running jobs, if the node is under `node_limit`. The job
    /// becomes `running` on that node with a lease of `req.lease` and one more attempt.
    pub async fn claim_job(&self, req: &ClaimRequest) -> Result<Option<JobRecord>> {
        let lease = millis(req.lease);
        let node_limit = i64::from(req.node_limit);
        let tenant_limit = i64::from(req.tenant_limit);
        let dialect = self.dialect();
        let candidate_sql = format!(
            "SELECT id, tenant_id FROM jobs j WHERE status = 'pending' AND cancel_reason IS NULL \
             AND (SELECT COUNT(*) FROM jobs r WHERE r.tenant_id = j.tenant_id \
                  AND r.status = 'running') < $1 \
             ORDER BY priority DESC, created_at, id LIMIT 1{}",
            match dialect {
                Dialect::Sqlite => "",
                Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
            }
        );
        let claim_sql = format!(
            "UPDATE jobs SET status = 'running', node = $1, lease_expires_at = $2, \
             attempts = attempts + 1, started_at = COALESCE(started_at, $3), \
             last_event_at = $3 WHERE id = $4 RETURNING {JOB_COLUMNS}"
        );
        let begin = dialect.begin_write();
        let claimed: std::result::Result<Option<JobRow>, sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                let on_node: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM jobs WHERE status = 'running' AND node = $1",
                )
                .bind(&req.node)
                .fetch_one(&mut *tx)
                .await?;
                if on_node >= node_limit {
                    return Ok(None);
                }
                let candidate: Option<(String, String)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(candidate_sql.clone()))
                        .bind(tenant_limit)
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some((id, tenant_id)) = candidate else {
                    return Ok(None);
                };
                if dialect == Dialect::Postgres {
                    // Claims of one tenant's jobs queue here, so two nodes cannot both take
                    // the tenant's last free slot.
                    sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
                        .bind(&tenant_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let running: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM jobs WHERE tenant_id = $1 AND status = 'running'",
                    )
                    .bind(&tenant_id)
                    .fetch_one(&mut *tx)
                    .await?;
                    if running >= tenant_limit {
                        return Ok(None);
                    }
                }
                // Taken now that every lock is held: a claim never predates the end of the job
                // whose slot it takes (started_at/finished_at show the limits holding).
                let now = to_millis(crate::now());
                let row = sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(claim_sql.clone()))
                    .bind(&req.node)
                    .bind(now.saturating_add(lease))
                    .bind(now)
                    .bind(&id)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(Some(row))
            }
            .await
        });
        claimed
            .map_err(query_error(format!("claim a job for node {}", req.node)))?
            .map(JobRow::into_record)
            .transpose()
    }

    /// Extends the lease of running job `id` held by `node` until `now + lease`. Returns the
    /// job (its `cancel_reason` says whether someone asked to cancel it), or `None` when the
    /// job is no longer running on `node`.
    pub async fn renew_job_lease(
        &self,
        id: &str,
        node: &str,
        lease: Duration,
    ) -> Result<Option<JobRecord>> {
        let until = to_millis(crate::now()).saturating_add(millis(lease));
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE jobs SET lease_expires_at = $1 \
                 WHERE id = $2 AND node = $3 AND status = 'running' RETURNING {JOB_COLUMNS}"
            )))
            .bind(until)
            .bind(id)
            .bind(node)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("renew the lease of job {id}")))?;
        row.map(JobRow::into_record).transpose()
    }

    /// Records the sandbox job `id` runs in.
    pub async fn set_job_sandbox(&self, id: &str, sandbox_id: &str) -> Result<()> {
        with_db!(self, |pool| {
            sqlx::query("UPDATE jobs SET sandbox_id = $1 WHERE id = $2")
                .bind(sandbox_id)
                .bind(id)
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
        })
        .map_err(query_error(format!("set the sandbox of job {id}")))?;
        Ok(())
    }

    /// Appends an event of type `kind` to job `id` and returns it with its seq.
    /// [`StoreError::Invalid`] when there is no such job.
    pub async fn append_job_event(
        &self,
        id: &str,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<JobEvent> {
        let text = to_json(payload, "job event payload")?;
        let words = search_words(payload);
        let now = crate::now();
        let at = to_millis(now);
        let begin = self.dialect().begin_write();
        let seq: std::result::Result<Option<i64>, sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                let seq = append_in_tx!(tx, id, kind, &text, &words, at).await?;
                tx.commit().await?;
                Ok(seq)
            }
            .await
        });
        match seq.map_err(query_error(format!("append an event to job {id}")))? {
            Some(seq) => Ok(JobEvent {
                job_id: id.to_owned(),
                seq,
                kind: kind.to_owned(),
                payload: payload.clone(),
                created_at: now,
            }),
            None => Err(no_such_job(id)),
        }
    }

    /// Job `id`'s events with seq greater than `after_seq`, oldest first, at most `limit`.
    pub async fn list_job_events(
        &self,
        id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<JobEvent>> {
        let limit = i64::from(limit.clamp(1, MAX_EVENT_LIMIT));
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, EventRow>(
                "SELECT job_id, seq, type, payload, created_at FROM job_events \
                 WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            )
            .bind(id)
            .bind(after_seq)
            .bind(limit)
            .fetch_all(pool)
            .await
        })
        .map_err(query_error(format!("read the events of job {id}")))?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    /// Ends job `id` with `outcome` if it is still pending or running, and appends its last
    /// event (`job_finished`, payload: status, answer, error, usage) in the same transaction.
    /// `running_on`: only if it runs on that node. Returns the ended job and its last event,
    /// or `None` when the job had already ended (or moved to another node).
    pub async fn finish_job(
        &self,
        id: &str,
        running_on: Option<&str>,
        outcome: &JobOutcome,
    ) -> Result<Option<(JobRecord, JobEvent)>> {
        if !outcome.status.is_final() {
            return Err(StoreError::Invalid {
                what: "job outcome",
                reason: format!("{} is not a final status", outcome.status),
            });
        }
        let payload = serde_json::json!({
            "status": outcome.status.as_str(),
            "final_answer": outcome.final_answer,
            "error": outcome.error,
            "usage": outcome.usage,
        });
        let text = to_json(&payload, "job event payload")?;
        let words = search_words(&payload);
        let usage = outcome
            .usage
            .as_ref()
            .map(|u| to_json(u, "job usage"))
            .transpose()?;
        let now = crate::now();
        let at = to_millis(now);
        let begin = self.dialect().begin_write();
        let guard = if running_on.is_some() {
            "status = 'running' AND node = $7"
        } else {
            "status IN ('pending', 'running') AND $7 = $7"
        };
        let finish_sql = format!(
            "UPDATE jobs SET status = $1, final_answer = $2, error = $3, \
             usage = COALESCE($4, usage), finished_at = $5, lease_expires_at = NULL \
             WHERE id = $6 AND {guard}"
        );
        let node = running_on.unwrap_or("");
        let done: std::result::Result<Option<(JobRow, i64)>, sqlx::Error> =
            with_db!(self, |pool| {
                async {
                    let mut tx = pool.begin_with(begin).await?;
                    let changed = sqlx::query(sqlx::AssertSqlSafe(finish_sql.clone()))
                        .bind(outcome.status.as_str())
                        .bind(&outcome.final_answer)
                        .bind(&outcome.error)
                        .bind(&usage)
                        .bind(at)
                        .bind(id)
                        .bind(node)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    if changed == 0 {
                        return Ok(None);
                    }
                    let seq = append_in_tx!(tx, id, JOB_FINISHED_EVENT, &text, &words, at).await?;
                    let row = sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"
                    )))
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    Ok(seq.map(|seq| (row, seq)))
                }
                .await
            });
        let Some((row, seq)) = done.map_err(query_error(format!("finish job {id}")))? else {
            return Ok(None);
        };
        Ok(Some((
            row.into_record()?,
            JobEvent {
                job_id: id.to_owned(),
                seq,
                kind: JOB_FINISHED_EVENT.to_owned(),
                payload,
                created_at: now,
            },
        )))
    }

    /// Asks to cancel `tenant_id`'s job `id` because of `reason`. A pending job is cancelled
    /// at once; a running one keeps running until its runner sees the request. Returns the
    /// job as it is afterwards, or `None` when the tenant has no such job. An ended job is
    /// returned unchanged.
    pub async fn request_job_cancel(
        &self,
        tenant_id: &str,
        id: &str,
        reason: &str,
    ) -> Result<Option<JobRecord>> {
        let Some(job) = self.get_job_for_tenant(tenant_id, id).await? else {
            return Ok(None);
        };
        if job.status.is_final() {
            return Ok(Some(job));
        }
        with_db!(self, |pool| {
            sqlx::query(
                "UPDATE jobs SET cancel_reason = COALESCE(cancel_reason, $1) \
                 WHERE id = $2 AND status IN ('pending', 'running')",
            )
            .bind(reason)
            .bind(id)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(query_error(format!("cancel job {id}")))?;
        // Claims skip jobs with a cancel request, so a pending one stays pending until this.
        let pending_outcome = JobOutcome {
            status: JobStatus::Cancelled,
            final_answer: None,
            error: Some(reason.to_owned()),
            usage: None,
        };
        if job.status == JobStatus::Pending {
            self.finish_pending_job(id, &pending_outcome).await?;
        }
        self.get_job(id).await
    }

    /// Ends job `id` only if it is still pending.
    async fn finish_pending_job(&self, id: &str, outcome: &JobOutcome) -> Result<()> {
        let still_pending = self
            .get_job(id)
            .await?
            .is_some_and(|j| j.status == JobStatus::Pending);
        if still_pending {
            // A claim cannot take it meanwhile (cancel_reason is set), so "pending or running"
            // here can only match pending.
            self.finish_job(id, None, outcome).await?;
        }
        Ok(())
    }

    /// Puts running job `id` of `node` back in the queue (a retry), recording `reason` as an
    /// event of type `job_retry`. Returns whether it was requeued.
    pub async fn requeue_job(&self, id: &str, node: &str, reason: &str) -> Result<bool> {
        let payload = serde_json::json!({ "reason": reason });
        let text = to_json(&payload, "job event payload")?;
        let words = search_words(&payload);
        let at = to_millis(crate::now());
        let begin = self.dialect().begin_write();
        let done: std::result::Result<bool, sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                let changed = sqlx::query(
                    "UPDATE jobs SET status = 'pending', node = NULL, lease_expires_at = NULL, \
                     sandbox_id = NULL WHERE id = $1 AND node = $2 AND status = 'running' \
                     AND cancel_reason IS NULL",
                )
                .bind(id)
                .bind(node)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if changed == 0 {
                    return Ok(false);
                }
                append_in_tx!(tx, id, "job_retry", &text, &words, at).await?;
                tx.commit().await?;
                Ok(true)
            }
            .await
        });
        done.map_err(query_error(format!("requeue job {id}")))
    }

    /// Running jobs that no live runner holds: those of `node` (this node just started, so
    /// its previous process died) and those whose lease expired before now.
    pub async fn list_orphaned_jobs(&self, node: &str) -> Result<Vec<JobRecord>> {
        let now = to_millis(crate::now());
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'running' \
                 AND (node = $1 OR lease_expires_at IS NULL OR lease_expires_at < $2) \
                 ORDER BY created_at, id"
            )))
            .bind(node)
            .bind(now)
            .fetch_all(pool)
            .await
        })
        .map_err(query_error("list orphaned jobs"))?;
        rows.into_iter().map(JobRow::into_record).collect()
    }

    /// Jobs running on `node`.
    pub async fn count_running_jobs(&self, node: &str) -> Result<u64> {
        let n: i64 = with_db!(self, |pool| {
            sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE status = 'running' AND node = $1")
                .bind(node)
                .fetch_one(pool)
                .await
        })
        .map_err(query_error(format!("count running jobs of node {node}")))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Full-text search over the string values of `tenant_id`'s job `job_id`'s events: every
    /// word of `query` must occur (case-insensitive, whole words). Best matches first, at most
    /// `limit` (1..=100). Empty when the tenant has no such job or the query has no word.
    pub async fn search_job_history(
        &self,
        tenant_id: &str,
        job_id: &str,
        query: &str,
        limit: u32,
    ) -> Result<Vec<JobEvent>> {
        let limit = i64::from(limit.clamp(1, 100));
        let rows: std::result::Result<Vec<EventRow>, sqlx::Error> = match &self.db {
            crate::db::Db::Sqlite(pool) => {
                let Some(expr) = fts5_query(query) else {
                    return Ok(Vec::new());
                };
                sqlx::query_as::<_, EventRow>(
                    "SELECT e.job_id, e.seq, e.type, e.payload, e.created_at \
                     FROM job_events_fts f \
                     JOIN job_events e ON e.rowid = f.rowid \
                     JOIN jobs j ON j.id = e.job_id \
                     WHERE job_events_fts MATCH $1 AND e.job_id = $2 AND j.tenant_id = $3 \
                     ORDER BY f.rank, e.seq LIMIT $4",
                )
                .bind(expr)
                .bind(job_id)
                .bind(tenant_id)
                .bind(limit)
                .fetch_all(pool)
                .await
            }
            crate::db::Db::Postgres(pool) => {
                let Some(expr) = tsquery(query) else {
                    return Ok(Vec::new());
                };
                sqlx::query_as::<_, EventRow>(
                    "SELECT e.job_id, e.seq, e.type, e.payload, e.created_at \
                     FROM job_events e JOIN jobs j ON j.id = e.job_id, \
                     to_tsquery('simple', $1) q \
                     WHERE e.search @@ q AND e.job_id = $2 AND j.tenant_id = $3 \
                     ORDER BY ts_rank(e.search, q) DESC, e.seq LIMIT $4",
                )
                .bind(expr)
                .bind(job_id)
                .bind(tenant_id)
                .bind(limit)
                .fetch_all(pool)
                .await
            }
        };
        rows.map_err(query_error(format!("search the history of job {job_id}")))?
            .into_iter()
            .map(EventRow::into_event)
            .collect()
    }
}

fn no_such_job(id: &str) -> StoreError {
    StoreError::Invalid {
        what: "job",
        reason: format!("job {id} not found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_parse() {
        for s in JobStatus::ALL {
            assert_eq!(s.as_str().parse::<JobStatus>().ok(), Some(s));
        }
        assert!("done".parse::<JobStatus>().is_err());
    }

    #[test]
    fn search_sees_the_words_of_string_values() {
        let payload =
            serde_json::json!({"name": "bash", "exit_code": 1, "out": ["a.py", {"k": "ü-x"}]});
        assert_eq!(search_words(&payload), "bash a py ü x");
        assert_eq!(tsquery("a & b|c").as_deref(), Some("a & b & c"));
    }

    #[test]
    fn fts_queries_quote_every_word() {
        assert_eq!(
            fts5_query("hello.py NOT \"x\"").as_deref(),
            Some("\"hello\" \"py\" \"NOT\" \"x\"")
        );
        assert_eq!(fts5_query(" -- "), None);
    }
}
