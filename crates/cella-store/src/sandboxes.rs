//! Sandbox records: who owns a sandbox, its state, its deadline, and the backend's opaque state
//! needed to reconnect to it after a restart. Owns the `sandboxes` and `sandbox_metadata` tables.
//! Knows nothing about how a backend runs a sandbox or what its JSON means; killed is final.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::QueryBuilder;

use crate::db::with_db;
use crate::error::{
    Result, StoreError, is_foreign_key_violation, is_unique_violation, query_error,
};
use crate::{Store, from_millis, to_millis};

/// Largest page a list returns.
pub const MAX_PAGE_LIMIT: u32 = 1000;

const SANDBOX_COLUMNS: &str = "id, tenant_id, template_id, alias, state, backend, backend_state, \
     spec, metadata, envd_access_token, traffic_access_token, cpu_count, memory_mb, disk_mb, \
     started_at, end_at, ended_at, end_reason";

/// Where a sandbox is in its life. `Killed` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
    Killed,
}

impl SandboxState {
    pub const ALL: [SandboxState; 3] = [
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Killed,
    ];

    /// The stored (and E2B) spelling: `running`, `paused`, `killed`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Killed => "killed",
        }
    }

    /// Running or paused: the server must keep track of it.
    pub fn is_live(self) -> bool {
        self != SandboxState::Killed
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxState {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self> {
        SandboxState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| StoreError::Invalid {
                what: "sandbox state",
                reason: format!("{s:?} is not running, paused or killed"),
            })
    }
}

/// A sandbox as stored. Timestamps are kept to the millisecond.
#[derive(Clone, PartialEq)]
pub struct SandboxRecord {
    /// Chosen by the caller (`cella_proto::ids::new_sandbox_id`).
    pub id: String,
    pub tenant_id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub state: SandboxState,
    /// Which backend runs it (`native`, …).
    pub backend: String,
    /// The backend's own state (socket paths, pids, …), opaque to the store.
    pub backend_state: serde_json::Value,
    /// What was asked for at creation (envs, timeout, …), opaque to the store.
    pub spec: serde_json::Value,
    /// User metadata; filterable with [`SandboxFilter::metadata`].
    pub metadata: BTreeMap<String, String>,
    pub envd_access_token: Option<String>,
    pub traffic_access_token: Option<String>,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
    pub started_at: DateTime<Utc>,
    /// When it is to be killed.
    pub end_at: DateTime<Utc>,
    /// When it was killed.
    pub ended_at: Option<DateTime<Utc>>,
    /// Why it was killed (`killed`, `timeout`, `lost`, …).
    pub end_reason: Option<String>,
}

/// Access tokens are secrets: `Debug` shows only whether they are set.
impl fmt::Debug for SandboxRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = |t: &Option<String>| t.as_ref().map(|_| "<redacted>");
        f.debug_struct("SandboxRecord")
            .field("id", &self.id)
            .field("tenant_id", &self.tenant_id)
            .field("template_id", &self.template_id)
            .field("alias", &self.alias)
            .field("state", &self.state)
            .field("backend", &self.backend)
            .field("backend_state", &self.backend_state)
            .field("spec", &self.spec)
            .field("metadata", &self.metadata)
            .field("envd_access_token", &token(&self.envd_access_token))
            .field("traffic_access_token", &token(&self.traffic_access_token))
            .field("cpu_count", &self.cpu_count)
            .field("memory_mb", &self.memory_mb)
            .field("disk_mb", &self.disk_mb)
            .field("started_at", &self.started_at)
            .field("end_at", &self.end_at)
            .field("ended_at", &self.ended_at)
            .field("end_reason", &self.end_reason)
            .finish()
    }
}

/// Which sandboxes a list returns; every given condition must hold.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    /// Any of these states; empty means all states.
    pub states: Vec<SandboxState>,
    /// Every pair must be in the sandbox's metadata.
    pub metadata: Vec<(String, String)>,
    pub template_id: Option<String>,
    /// Started strictly after this instant.
    pub started_after: Option<DateTime<Utc>>,
}

/// Order of a list, by start time (ties broken by id).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortOrder {
    Asc,
    /// Newest first.
    #[default]
    Desc,
}

/// One page of a list: at most `limit` records (clamped to 1..=[`MAX_PAGE_LIMIT`]) after
/// `cursor`, which is a previous page's `next_cursor` obtained with the same order.
#[derive(Debug, Clone)]
pub struct PageRequest {
    pub order: SortOrder,
    pub limit: u32,
    pub cursor: Option<String>,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            order: SortOrder::Desc,
            limit: 100,
            cursor: None,
        }
    }
}

/// A page of records and, when more follow, the opaque cursor of the next page.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The page of a query that fetched `limit + 1` rows: the first `limit`, and the cursor of
    /// the last one when the extra row shows that more follow.
    pub(crate) fn from_overfetch(
        mut items: Vec<T>,
        limit: u32,
        cursor_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        let limit = limit as usize;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(cursor_of)
        } else {
            None
        };
        Page { items, next_cursor }
    }
}

pub(crate) fn encode_cursor(started_at: i64, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{started_at}:{id}"))
}

pub(crate) fn decode_cursor(cursor: &str) -> Result<(i64, String)> {
    let invalid = || StoreError::Invalid {
        what: "page cursor",
        reason: "not a cursor this store returned".into(),
    };
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| invalid())?;
    let text = String::from_utf8(raw).map_err(|_| invalid())?;
    let (at, id) = text.split_once(':').ok_or_else(invalid)?;
    let at = at.parse::<i64>().map_err(|_| invalid())?;
    Ok((at, id.to_owned()))
}

#[derive(sqlx::FromRow)]
struct SandboxRow {
    id: String,
    tenant_id: String,
    template_id: String,
    alias: Option<String>,
    state: String,
    backend: String,
    backend_state: String,
    spec: String,
    metadata: String,
    envd_access_token: Option<String>,
    traffic_access_token: Option<String>,
    cpu_count: i64,
    memory_mb: i64,
    disk_mb: i64,
    started_at: i64,
    end_at: i64,
    ended_at: Option<i64>,
    end_reason: Option<String>,
}

impl SandboxRow {
    fn into_record(self) -> Result<SandboxRecord> {
        let id = self.id;
        let corrupt = |what: &str, e: &dyn fmt::Display| StoreError::Corrupt {
            what: format!("sandbox {id}: {what}: {e}"),
        };
        let json = |what: &str, text: &str| {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| corrupt(what, &e))
        };
        let count = |what: &str, n: i64| u32::try_from(n).map_err(|e| corrupt(what, &e));
        Ok(SandboxRecord {
            state: self.state.parse().map_err(|e| corrupt("state", &e))?,
            backend_state: json("backend_state", &self.backend_state)?,
            spec: json("spec", &self.spec)?,
            metadata: serde_json::from_str(&self.metadata).map_err(|e| corrupt("metadata", &e))?,
            cpu_count: count("cpu_count", self.cpu_count)?,
            memory_mb: count("memory_mb", self.memory_mb)?,
            disk_mb: count("disk_mb", self.disk_mb)?,
            started_at: from_millis(self.started_at, "sandboxes.started_at")?,
            end_at: from_millis(self.end_at, "sandboxes.end_at")?,
            ended_at: self
                .ended_at
                .map(|t| from_millis(t, "sandboxes.ended_at"))
                .transpose()?,
            tenant_id: self.tenant_id,
            template_id: self.template_id,
            alias: self.alias,
            backend: self.backend,
            envd_access_token: self.envd_access_token,
            traffic_access_token: self.traffic_access_token,
            end_reason: self.end_reason,
            id,
        })
    }
}

fn records(rows: Vec<SandboxRow>) -> Result<Vec<SandboxRecord>> {
    rows.into_iter().map(SandboxRow::into_record).collect()
}

fn to_json(value: &impl Serialize, what: &'static str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Invalid {
        what,
        reason: e.to_string(),
    })
}

impl Store {
    /// Stores a new sandbox with its metadata, in one transaction.
    /// [`StoreError::SandboxExists`] if the id is taken, [`StoreError::TenantNotFound`] if the
    /// tenant does not exist.
    pub async fn insert_sandbox(&self, sandbox: &SandboxRecord) -> Result<()> {
        let backend_state = to_json(&sandbox.backend_state, "sandbox backend state")?;
        let spec = to_json(&sandbox.spec, "sandbox spec")?;
        let metadata = to_json(&sandbox.metadata, "sandbox metadata")?;
        let begin = self.dialect().begin_write();
        let result: std::result::Result<(), sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                sqlx::query(
                    "INSERT INTO sandboxes (id, tenant_id, template_id, alias, state, backend, \
                     backend_state, spec, metadata, envd_access_token, traffic_access_token, \
                     cpu_count, memory_mb, disk_mb, started_at, end_at, ended_at, end_reason) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                     $16, $17, $18)",
                )
                .bind(&sandbox.id)
                .bind(&sandbox.tenant_id)
                .bind(&sandbox.template_id)
                .bind(&sandbox.alias)
                .bind(sandbox.state.as_str())
                .bind(&sandbox.backend)
                .bind(&backend_state)
                .bind(&spec)
                .bind(&metadata)
                .bind(&sandbox.envd_access_token)
                .bind(&sandbox.traffic_access_token)
                .bind(i64::from(sandbox.cpu_count))
                .bind(i64::from(sandbox.memory_mb))
                .bind(i64::from(sandbox.disk_mb))
                .bind(to_millis(sandbox.started_at))
                .bind(to_millis(sandbox.end_at))
                .bind(sandbox.ended_at.map(to_millis))
                .bind(&sandbox.end_reason)
                .execute(&mut *tx)
                .await?;
                for (key, value) in &sandbox.metadata {
                    sqlx::query(
                        "INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES ($1, $2, $3)",
                    )
                    .bind(&sandbox.id)
                    .bind(key)
                    .bind(value)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await
            }
            .await
        });
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(StoreError::SandboxExists(sandbox.id.clone())),
            Err(e) if is_foreign_key_violation(&e) => {
                Err(StoreError::TenantNotFound(sandbox.tenant_id.clone()))
            }
            Err(e) => Err(query_error(format!("insert sandbox {}", sandbox.id))(e)),
        }
    }

    /// The sandbox `id`, whoever owns it (for the server's own bookkeeping).
    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1"
            )))
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("read sandbox {id}")))?;
        row.map(SandboxRow::into_record).transpose()
    }

    /// The sandbox `id` if `tenant_id` owns it; `None` for another tenant's sandbox.
    pub async fn get_sandbox_for_tenant(
        &self,
        tenant_id: &str,
        id: &str,
    ) -> Result<Option<SandboxRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1 AND tenant_id = $2"
            )))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("read sandbox {id}")))?;
        row.map(SandboxRow::into_record).transpose()
    }

    /// Moves sandbox `id` to `state` and returns it. Moving to `Killed` records now as its end
    /// and `reason` (default `killed`) as why, like [`Store::mark_sandbox_ended`]. A killed
    /// sandbox never changes again: [`StoreError::SandboxEnded`].
    pub async fn update_sandbox_state(
        &self,
        id: &str,
        state: SandboxState,
        reason: Option<&str>,
    ) -> Result<SandboxRecord> {
        if state == SandboxState::Killed {
            return self
                .mark_sandbox_ended(id, reason.unwrap_or("killed"), crate::now())
                .await;
        }
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE sandboxes SET state = $1 WHERE id = $2 AND state <> 'killed' \
                 RETURNING {SANDBOX_COLUMNS}"
            )))
            .bind(state.as_str())
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("set sandbox {id} {state}")))?;
        self.updated(id, row, state.as_str()).await
    }

    /// Records that sandbox `id` was killed at `at` because of `reason`.
    /// [`StoreError::SandboxEnded`] if it already was.
    pub async fn mark_sandbox_ended(
        &self,
        id: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<SandboxRecord> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE sandboxes SET state = 'killed', ended_at = $1, end_reason = $2 \
                 WHERE id = $3 AND state <> 'killed' RETURNING {SANDBOX_COLUMNS}"
            )))
            .bind(to_millis(at))
            .bind(reason)
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("mark sandbox {id} ended")))?;
        self.updated(id, row, "killed").await
    }

    /// Moves sandbox `id`'s deadline to `end_at` (timeouts and refreshes).
    pub async fn set_sandbox_end_at(
        &self,
        id: &str,
        end_at: DateTime<Utc>,
    ) -> Result<SandboxRecord> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE sandboxes SET end_at = $1 WHERE id = $2 AND state <> 'killed' \
                 RETURNING {SANDBOX_COLUMNS}"
            )))
            .bind(to_millis(end_at))
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("set the end time of sandbox {id}")))?;
        self.updated(id, row, "extended").await
    }

    /// Replaces the backend's state of sandbox `id` (after a resume or a reconnect).
    pub async fn set_sandbox_backend_state(
        &self,
        id: &str,
        backend_state: &serde_json::Value,
    ) -> Result<SandboxRecord> {
        self.set_json_column(id, "backend_state", backend_state, "backend state")
            .await
    }

    /// Replaces the spec of a live sandbox `id` (e.g. a changed network policy), so a restarted
    /// server applies the current one.
    pub async fn set_sandbox_spec(
        &self,
        id: &str,
        spec: &serde_json::Value,
    ) -> Result<SandboxRecord> {
        self.set_json_column(id, "spec", spec, "spec").await
    }

    /// Sets one JSON column (`column` is one of ours, never input) of a live sandbox.
    async fn set_json_column(
        &self,
        id: &str,
        column: &'static str,
        value: &serde_json::Value,
        what: &'static str,
    ) -> Result<SandboxRecord> {
        let text = to_json(value, what)?;
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE sandboxes SET {column} = $1 WHERE id = $2 AND state <> 'killed' \
                 RETURNING {SANDBOX_COLUMNS}"
            )))
            .bind(&text)
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("set the {what} of sandbox {id}")))?;
        self.updated(id, row, "updated").await
    }

    /// The result of a guarded update: the row, or why no row matched.
    async fn updated(
        &self,
        id: &str,
        row: Option<SandboxRow>,
        wanted: &'static str,
    ) -> Result<SandboxRecord> {
        match row {
            Some(row) => row.into_record(),
            None => match self.get_sandbox(id).await? {
                Some(_) => Err(StoreError::SandboxEnded {
                    id: id.to_owned(),
                    wanted,
                }),
                None => Err(StoreError::SandboxNotFound(id.to_owned())),
            },
        }
    }

    /// One page of `tenant_id`'s sandboxes matching `filter`, ordered by start time then id.
    pub async fn list_sandboxes(
        &self,
        tenant_id: &str,
        filter: &SandboxFilter,
        page: &PageRequest,
    ) -> Result<Page<SandboxRecord>> {
        let after = page.cursor.as_deref().map(decode_cursor).transpose()?;
        let limit = page.limit.clamp(1, MAX_PAGE_LIMIT);
        let (cmp, dir) = match page.order {
            SortOrder::Asc => (">", "ASC"),
            SortOrder::Desc => ("<", "DESC"),
        };
        let rows = with_db!(self, |pool: DB| {
            let mut q = QueryBuilder::<DB>::new(format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes s WHERE s.tenant_id = "
            ));
            q.push_bind(tenant_id);
            if !filter.states.is_empty() {
                q.push(" AND s.state IN (");
                let mut list = q.separated(", ");
                for state in &filter.states {
                    list.push_bind(state.as_str());
                }
                q.push(")");
            }
            for (key, value) in &filter.metadata {
                q.push(
                    " AND EXISTS (SELECT 1 FROM sandbox_metadata m \
                     WHERE m.sandbox_id = s.id AND m.key = ",
                );
                q.push_bind(key.as_str());
                q.push(" AND m.value = ");
                q.push_bind(value.as_str());
                q.push(")");
            }
            if let Some(template) = &filter.template_id {
                q.push(" AND s.template_id = ");
                q.push_bind(template.as_str());
            }
            if let Some(t) = filter.started_after {
                q.push(" AND s.started_at > ");
                q.push_bind(to_millis(t));
            }
            if let Some((at, id)) = &after {
                q.push(format!(" AND (s.started_at, s.id) {cmp} ("));
                q.push_bind(*at);
                q.push(", ");
                q.push_bind(id.as_str());
                q.push(")");
            }
            q.push(format!(" ORDER BY s.started_at {dir}, s.id {dir} LIMIT "));
            q.push_bind(i64::from(limit) + 1);
            q.build_query_as::<SandboxRow>().fetch_all(pool).await
        })
        .map_err(query_error(format!("list sandboxes of tenant {tenant_id}")))?;
        Ok(Page::from_overfetch(records(rows)?, limit, |last| {
            encode_cursor(to_millis(last.started_at), &last.id)
        }))
    }

    /// How many of `tenant_id`'s sandboxes are running (paused ones do not count).
    pub async fn count_running_sandboxes(&self, tenant_id: &str) -> Result<u64> {
        let n: i64 = with_db!(self, |pool| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM sandboxes WHERE tenant_id = $1 AND state = 'running'",
            )
            .bind(tenant_id)
            .fetch_one(pool)
            .await
        })
        .map_err(query_error(format!(
            "count running sandboxes of tenant {tenant_id}"
        )))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Sandboxes per state across all tenants (for metrics); every state is present.
    pub async fn count_sandboxes_by_state(&self) -> Result<BTreeMap<SandboxState, u64>> {
        let rows: Vec<(String, i64)> = with_db!(self, |pool| {
            sqlx::query_as("SELECT state, COUNT(*) FROM sandboxes GROUP BY state")
                .fetch_all(pool)
                .await
        })
        .map_err(query_error("count sandboxes by state"))?;
        let mut counts: BTreeMap<SandboxState, u64> =
            SandboxState::ALL.into_iter().map(|s| (s, 0)).collect();
        for (state, n) in rows {
            let state = state.parse::<SandboxState>()?;
            counts.insert(state, u64::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }

    /// Every running or paused sandbox of every tenant, oldest first: what a restarted server
    /// must reconnect to.
    pub async fn list_live_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, SandboxRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE state <> 'killed' \
                 ORDER BY started_at, id"
            )))
            .fetch_all(pool)
            .await
        })
        .map_err(query_error("list live sandboxes"))?;
        records(rows)
    }

    /// Deletes sandboxes killed before `before`, with their metadata and logs; returns how many.
    pub async fn purge_ended_sandboxes(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = with_db!(self, |pool| {
            sqlx::query("DELETE FROM sandboxes WHERE state = 'killed' AND ended_at < $1")
                .bind(to_millis(before))
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
        })
        .map_err(query_error("purge ended sandboxes"))?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = encode_cursor(1_700_000_000_123, "abc:def");
        assert_eq!(
            decode_cursor(&c).ok(),
            Some((1_700_000_000_123, "abc:def".to_owned()))
        );
        assert!(decode_cursor("!!").is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("x:y")).is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("123")).is_err());
    }

    #[test]
    fn states_parse() {
        for s in SandboxState::ALL {
            assert_eq!(s.as_str().parse::<SandboxState>().ok(), Some(s));
        }
        assert!("dead".parse::<SandboxState>().is_err());
    }
}
