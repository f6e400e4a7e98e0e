//! The audit trail: who did what to which object, when. Owns the `audit_events` table; knows
//! nothing about the actions it records (they are strings like `sandbox.create`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::db::with_db;
use crate::error::{Result, StoreError, is_foreign_key_violation, query_error};
use crate::{Store, from_millis, now, to_millis};

/// The actor of events the server causes itself (deadlines, restarts).
pub const SYSTEM_ACTOR: &str = "system";

/// Most events one read returns.
pub const MAX_AUDIT_LIMIT: u32 = 1000;

/// One audit event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Increases with every event.
    pub id: i64,
    pub tenant_id: String,
    /// An API key id, or [`SYSTEM_ACTOR`].
    pub actor: String,
    /// Dotted verb: `sandbox.create`, `sandbox.kill`, `api_key.revoke`, …
    pub action: String,
    /// The id of the object acted on.
    pub target: String,
    pub detail: serde_json::Value,
    pub at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct AuditRow {
    id: i64,
    tenant_id: String,
    actor: String,
    action: String,
    target: String,
    detail: String,
    at: i64,
}

impl AuditRow {
    fn into_record(self) -> Result<AuditRecord> {
        Ok(AuditRecord {
            detail: serde_json::from_str(&self.detail).map_err(|e| StoreError::Corrupt {
                what: format!("audit event {}: detail: {e}", self.id),
            })?,
            at: from_millis(self.at, "audit_events.at")?,
            id: self.id,
            tenant_id: self.tenant_id,
            actor: self.actor,
            action: self.action,
            target: self.target,
        })
    }
}

impl Store {
    /// Records that `actor` did `action` to `target` in `tenant_id`, now.
    pub async fn record_audit(
        &self,
        tenant_id: &str,
        actor: &str,
        action: &str,
        target: &str,
        detail: &serde_json::Value,
    ) -> Result<AuditRecord> {
        let text = serde_json::to_string(detail).map_err(|e| StoreError::Invalid {
            what: "audit detail",
            reason: e.to_string(),
        })?;
        let at = now();
        let inserted = with_db!(self, |pool| {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO audit_events (tenant_id, actor, action, target, detail, at) \
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            )
            .bind(tenant_id)
            .bind(actor)
            .bind(action)
            .bind(target)
            .bind(&text)
            .bind(to_millis(at))
            .fetch_one(pool)
            .await
        });
        match inserted {
            Ok(id) => Ok(AuditRecord {
                id,
                tenant_id: tenant_id.to_owned(),
                actor: actor.to_owned(),
                action: action.to_owned(),
                target: target.to_owned(),
                detail: detail.clone(),
                at,
            }),
            Err(e) if is_foreign_key_violation(&e) => {
                Err(StoreError::TenantNotFound(tenant_id.to_owned()))
            }
            Err(e) => Err(query_error(format!(
                "record audit event {action} on {target}"
            ))(e)),
        }
    }

    /// `tenant_id`'s latest `limit` events (clamped to 1..=1000), newest first.
    pub async fn list_audit(&self, tenant_id: &str, limit: u32) -> Result<Vec<AuditRecord>> {
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, AuditRow>(
                "SELECT id, tenant_id, actor, action, target, detail, at FROM audit_events \
                 WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2",
            )
            .bind(tenant_id)
            .bind(i64::from(limit.clamp(1, MAX_AUDIT_LIMIT)))
            .fetch_all(pool)
            .await
        })
        .map_err(query_error(format!(
            "list audit events of tenant {tenant_id}"
        )))?;
        rows.into_iter().map(AuditRow::into_record).collect()
    }
}
