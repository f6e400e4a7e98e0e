//! Tenants: the owners of keys, sandboxes and audit events. Owns the `tenants` table; knows
//! nothing about what a tenant owns.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::db::with_db;
use crate::error::{Result, StoreError, is_unique_violation, query_error};
use crate::{Store, from_millis, now, random_hex, to_millis};

/// Longest tenant name accepted.
const MAX_NAME_LEN: usize = 128;

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantRecord {
    /// `tnt_` + 16 hex.
    pub id: String,
    /// Unique, chosen by the operator (`cella keys create --tenant NAME`).
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
pub(crate) struct TenantRow {
    id: String,
    name: String,
    created_at: i64,
}

impl TenantRow {
    pub(crate) fn into_record(self) -> Result<TenantRecord> {
        Ok(TenantRecord {
            created_at: from_millis(self.created_at, "tenants.created_at")?,
            id: self.id,
            name: self.name,
        })
    }
}

fn check_name(name: &str) -> Result<()> {
    let reason = if name.trim().is_empty() {
        "empty"
    } else if name.len() > MAX_NAME_LEN {
        "longer than 128 bytes"
    } else if name.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(StoreError::Invalid {
        what: "tenant name",
        reason: format!("{name:?} is {reason}"),
    })
}

impl Store {
    /// Creates the tenant `name`; [`StoreError::TenantExists`] if the name is taken.
    pub async fn create_tenant(&self, name: &str) -> Result<TenantRecord> {
        check_name(name)?;
        let record = TenantRecord {
            id: format!("tnt_{}", random_hex(8, "a tenant id")?),
            name: name.to_owned(),
            created_at: now(),
        };
        let inserted = with_db!(self, |pool| {
            sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
                .bind(&record.id)
                .bind(&record.name)
                .bind(to_millis(record.created_at))
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
        });
        match inserted {
            Ok(_) => Ok(record),
            Err(e) if is_unique_violation(&e) => Err(StoreError::TenantExists(name.to_owned())),
            Err(e) => Err(query_error(format!("create tenant {name:?}"))(e)),
        }
    }

    /// The tenant named `name`, creating it if it does not exist (safe against concurrent calls).
    pub async fn ensure_tenant(&self, name: &str) -> Result<TenantRecord> {
        check_name(name)?;
        let id = format!("tnt_{}", random_hex(8, "a tenant id")?);
        with_db!(self, |pool| {
            sqlx::query(
                "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(&id)
            .bind(name)
            .bind(to_millis(now()))
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(query_error(format!("ensure tenant {name:?}")))?;
        self.get_tenant_by_name(name)
            .await?
            .ok_or_else(|| StoreError::TenantNotFound(name.to_owned()))
    }

    /// The tenant with id `id`.
    pub async fn get_tenant(&self, id: &str) -> Result<Option<TenantRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await
        })
        .map_err(query_error(format!("read tenant {id}")))?;
        row.map(TenantRow::into_record).transpose()
    }

    /// The tenant named `name`.
    pub async fn get_tenant_by_name(&self, name: &str) -> Result<Option<TenantRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, TenantRow>(
                "SELECT id, name, created_at FROM tenants WHERE name = $1",
            )
            .bind(name)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("read tenant {name:?}")))?;
        row.map(TenantRow::into_record).transpose()
    }

    /// Every tenant, by name.
    pub async fn list_tenants(&self) -> Result<Vec<TenantRecord>> {
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, TenantRow>(
                "SELECT id, name, created_at FROM tenants ORDER BY name, id",
            )
            .fetch_all(pool)
            .await
        })
        .map_err(query_error("list tenants"))?;
        rows.into_iter().map(TenantRow::into_record).collect()
    }
}
