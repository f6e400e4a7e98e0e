//! API keys in E2B's shape (`e2b_` + 40 lowercase hex). Owns the `api_keys` table: keys are
//! stored only as a SHA-256 hash plus a short display prefix, and are never logged. Knows
//! nothing about HTTP headers or what a key may do.

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::db::with_db;
use crate::error::{Result, StoreError, is_foreign_key_violation, query_error};
use crate::tenants::TenantRecord;
use crate::{Store, from_millis, hex, now, random_hex, to_millis};

/// What every key starts with.
pub const API_KEY_PREFIX: &str = "e2b_";
/// Random bytes in a key (40 hex digits).
const KEY_RANDOM_BYTES: usize = 20;
/// Characters of the key kept for display: `e2b_` + 4 hex.
const DISPLAY_PREFIX_LEN: usize = API_KEY_PREFIX.len() + 4;
/// `last_used_at` is refreshed at most this often per key, so authentication stays a read.
const LAST_USED_GRANULARITY: TimeDelta = TimeDelta::seconds(60);
const MAX_LABEL_LEN: usize = 256;

/// An API key as stored: everything but the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiKeyRecord {
    /// `key_` + 16 hex; what audit events name as the actor.
    pub id: String,
    pub tenant_id: String,
    pub label: String,
    /// The key's first characters, e.g. `e2b_1a2b`.
    pub display_prefix: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ApiKeyRecord {
    /// The key as shown in listings: `e2b_1a2b…`.
    pub fn masked(&self) -> String {
        format!("{}…", self.display_prefix)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }
}

/// A freshly created key: the plaintext exists only here, once. `Debug` does not show it.
pub struct NewApiKey {
    /// `e2b_` + 40 lowercase hex; show it to the user once and drop it.
    pub plaintext: String,
    pub record: ApiKeyRecord,
}

impl std::fmt::Debug for NewApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewApiKey")
            .field("plaintext", &"<redacted>")
            .field("record", &self.record)
            .finish()
    }
}

/// Whether `key` has the shape of a key: `e2b_` + 40 lowercase hex digits.
pub(crate) fn is_well_formed(key: &str) -> bool {
    key.strip_prefix(API_KEY_PREFIX).is_some_and(|hex| {
        hex.len() == KEY_RANDOM_BYTES * 2
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn hash_key(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

const KEY_COLUMNS: &str =
    "id, tenant_id, label, display_prefix, created_at, last_used_at, revoked_at";

#[derive(sqlx::FromRow)]
struct ApiKeyRow {
    id: String,
    tenant_id: String,
    label: String,
    display_prefix: String,
    created_at: i64,
    last_used_at: Option<i64>,
    revoked_at: Option<i64>,
}

impl ApiKeyRow {
    fn into_record(self) -> Result<ApiKeyRecord> {
        Ok(ApiKeyRecord {
            created_at: from_millis(self.created_at, "api_keys.created_at")?,
            last_used_at: self
                .last_used_at
                .map(|t| from_millis(t, "api_keys.last_used_at"))
                .transpose()?,
            revoked_at: self
                .revoked_at
                .map(|t| from_millis(t, "api_keys.revoked_at"))
                .transpose()?,
            id: self.id,
            tenant_id: self.tenant_id,
            label: self.label,
            display_prefix: self.display_prefix,
        })
    }
}

#[derive(sqlx::FromRow)]
struct KeyWithTenantRow {
    #[sqlx(flatten)]
    key: ApiKeyRow,
    tenant_name: String,
    tenant_created_at: i64,
}

impl Store {
    /// Creates a key for `tenant_id`. The returned plaintext is not stored anywhere.
    pub async fn create_api_key(&self, tenant_id: &str, label: &str) -> Result<NewApiKey> {
        if label.len() > MAX_LABEL_LEN {
            return Err(StoreError::Invalid {
                what: "api key label",
                reason: format!("longer than {MAX_LABEL_LEN} bytes"),
            });
        }
        let plaintext = format!(
            "{API_KEY_PREFIX}{}",
            random_hex(KEY_RANDOM_BYTES, "an api key")?
        );
        let record = ApiKeyRecord {
            id: format!("key_{}", random_hex(8, "an api key id")?),
            tenant_id: tenant_id.to_owned(),
            label: label.to_owned(),
            display_prefix: plaintext[..DISPLAY_PREFIX_LEN].to_owned(),
            created_at: now(),
            last_used_at: None,
            revoked_at: None,
        };
        let inserted = with_db!(self, |pool| {
            sqlx::query(
                "INSERT INTO api_keys (id, tenant_id, label, key_hash, display_prefix, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&record.id)
            .bind(&record.tenant_id)
            .bind(&record.label)
            .bind(hash_key(&plaintext))
            .bind(&record.display_prefix)
            .bind(to_millis(record.created_at))
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
        });
        match inserted {
            Ok(_) => Ok(NewApiKey { plaintext, record }),
            Err(e) if is_foreign_key_violation(&e) => {
                Err(StoreError::TenantNotFound(tenant_id.to_owned()))
            }
            Err(e) => Err(query_error(format!(
                "create an api key for tenant {tenant_id}"
            ))(e)),
        }
    }

    /// The key `plaintext` designates and its tenant, if it exists and is not revoked.
    /// Malformed input is `None` without touching the database. Refreshes `last_used_at` at
    /// most once a minute per key; a failure to refresh it is logged, not returned.
    pub async fn authenticate(
        &self,
        plaintext: &str,
    ) -> Result<Option<(ApiKeyRecord, TenantRecord)>> {
        if !is_well_formed(plaintext) {
            return Ok(None);
        }
        let hash = hash_key(plaintext);
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, KeyWithTenantRow>(
                "SELECT k.id, k.tenant_id, k.label, k.display_prefix, k.created_at, \
                        k.last_used_at, k.revoked_at, \
                        t.name AS tenant_name, t.created_at AS tenant_created_at \
                 FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
                 WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
            )
            .bind(&hash)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error("look up an api key"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let tenant = TenantRecord {
            id: row.key.tenant_id.clone(),
            name: row.tenant_name,
            created_at: from_millis(row.tenant_created_at, "tenants.created_at")?,
        };
        let mut key = row.key.into_record()?;
        let at = now();
        if key
            .last_used_at
            .is_none_or(|last| at - last >= LAST_USED_GRANULARITY)
        {
            match self.touch_api_key(&key.id, at).await {
                Ok(()) => key.last_used_at = Some(at),
                Err(e) => tracing::warn!(key_id = %key.id, error = %e, "cannot record api key use"),
            }
        }
        Ok(Some((key, tenant)))
    }

    async fn touch_api_key(&self, id: &str, at: DateTime<Utc>) -> Result<()> {
        let stale_before = to_millis(at - LAST_USED_GRANULARITY);
        with_db!(self, |pool| {
            sqlx::query(
                "UPDATE api_keys SET last_used_at = $1 \
                 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at <= $3)",
            )
            .bind(to_millis(at))
            .bind(id)
            .bind(stale_before)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(query_error(format!("record use of api key {id}")))?;
        Ok(())
    }

    /// The key with id `id`, revoked or not.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, ApiKeyRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"
            )))
            .bind(id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("read api key {id}")))?;
        row.map(ApiKeyRow::into_record).transpose()
    }

    /// Revokes `tenant_id`'s key `key_id` (idempotent: the first revocation time is kept).
    /// [`StoreError::ApiKeyNotFound`] if the tenant has no such key.
    pub async fn revoke_api_key(&self, tenant_id: &str, key_id: &str) -> Result<ApiKeyRecord> {
        let row = with_db!(self, |pool| {
            sqlx::query_as::<_, ApiKeyRow>(sqlx::AssertSqlSafe(format!(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) \
                 WHERE id = $2 AND tenant_id = $3 RETURNING {KEY_COLUMNS}"
            )))
            .bind(to_millis(now()))
            .bind(key_id)
            .bind(tenant_id)
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!("revoke api key {key_id}")))?;
        row.ok_or_else(|| StoreError::ApiKeyNotFound(key_id.to_owned()))?
            .into_record()
    }

    /// `tenant_id`'s keys, revoked ones included, oldest first.
    pub async fn list_api_keys(&self, tenant_id: &str) -> Result<Vec<ApiKeyRecord>> {
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, ApiKeyRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"
            )))
            .bind(tenant_id)
            .fetch_all(pool)
            .await
        })
        .map_err(query_error(format!("list api keys of tenant {tenant_id}")))?;
        rows.into_iter().map(ApiKeyRow::into_record).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_key_shape() {
        assert!(is_well_formed(
            "e2b_0123456789abcdef0123456789abcdef01234567"
        ));
        assert!(!is_well_formed(
            "e2b_0123456789ABCDEF0123456789abcdef01234567"
        ));
        assert!(!is_well_formed(
            "e2b_0123456789abcdef0123456789abcdef0123456"
        ));
        assert!(!is_well_formed(
            "e2c_0123456789abcdef0123456789abcdef01234567"
        ));
        assert!(!is_well_formed(""));
    }

    #[test]
    fn hashes_with_sha256() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
