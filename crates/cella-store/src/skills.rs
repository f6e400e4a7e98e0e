//! The Agent Skills registry: per tenant, named skills with numbered versions, each version's
//! zip archive, its checksum and the metadata read from its SKILL.md. Owns the `skills` and
//! `skill_versions` tables. Knows nothing about zip files or SKILL.md: the caller validates the
//! archive and hands over what it found; the store keeps it and numbers the versions.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::db::with_db;
use crate::error::{Result, StoreError, is_foreign_key_violation, query_error};
use crate::sandboxes::Page;
use crate::{Store, from_millis, now, to_millis};

/// Largest page [`Store::list_skills`] returns.
pub const MAX_SKILL_PAGE_LIMIT: u32 = 1000;

/// Columns of a version without its archive (lists and metadata reads never load the bytes).
const VERSION_COLUMNS: &str = "v.tenant_id, v.name, v.version, v.sha256, v.size, v.description, \
     v.frontmatter, v.files, v.created_by, v.created_at";

/// One file of a skill, as listed in its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillFile {
    /// Relative to the skill's root, with `/` separators.
    pub path: String,
    /// Bytes (for a symlink, the length of its target).
    pub size: u64,
    pub executable: bool,
    /// The link's target when the entry is a symlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink: Option<String>,
}

/// What the caller found in an uploaded archive; [`Store::insert_skill_version`] numbers it.
#[derive(Debug, Clone)]
pub struct NewSkillVersion {
    pub tenant_id: String,
    pub name: String,
    /// Lowercase hex SHA-256 of `archive`.
    pub sha256: String,
    pub description: String,
    /// The SKILL.md frontmatter properties as a JSON object.
    pub frontmatter: serde_json::Value,
    pub files: Vec<SkillFile>,
    /// The zip archive as uploaded.
    pub archive: Vec<u8>,
    /// An API key id, or `anonymous`.
    pub created_by: String,
}

/// One stored version of a skill (without its archive bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillVersionRecord {
    pub tenant_id: String,
    pub name: String,
    /// 1 for the first upload of `name`, then 2, 3, …
    pub version: u32,
    pub sha256: String,
    /// Archive size in bytes.
    pub size: u64,
    pub description: String,
    pub frontmatter: serde_json::Value,
    pub files: Vec<SkillFile>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct VersionRow {
    tenant_id: String,
    name: String,
    version: i64,
    sha256: String,
    size: i64,
    description: String,
    frontmatter: String,
    files: String,
    created_by: String,
    created_at: i64,
}

impl VersionRow {
    fn into_record(self) -> Result<SkillVersionRecord> {
        let what = format!("skill {} version {}", self.name, self.version);
        let corrupt = |field: &str, e: &dyn std::fmt::Display| StoreError::Corrupt {
            what: format!("{what}: {field}: {e}"),
        };
        Ok(SkillVersionRecord {
            version: u32::try_from(self.version).map_err(|e| corrupt("version", &e))?,
            size: u64::try_from(self.size).map_err(|e| corrupt("size", &e))?,
            frontmatter: serde_json::from_str(&self.frontmatter)
                .map_err(|e| corrupt("frontmatter", &e))?,
            files: serde_json::from_str(&self.files).map_err(|e| corrupt("files", &e))?,
            created_at: from_millis(self.created_at, "skill_versions.created_at")?,
            tenant_id: self.tenant_id,
            name: self.name,
            sha256: self.sha256,
            description: self.description,
            created_by: self.created_by,
        })
    }
}

fn records(rows: Vec<VersionRow>) -> Result<Vec<SkillVersionRecord>> {
    rows.into_iter().map(VersionRow::into_record).collect()
}

fn decode_cursor(cursor: &str) -> Result<String> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .ok_or_else(|| StoreError::Invalid {
            what: "page cursor",
            reason: "not a cursor this store returned".into(),
        })
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(StoreError::Invalid {
            what: "skill name",
            reason: "empty".into(),
        });
    }
    Ok(())
}

impl Store {
    /// Stores `new` as the next version of its skill (1 when the tenant has no skill of that
    /// name), in one transaction; concurrent uploads of one name get distinct numbers.
    /// [`StoreError::TenantNotFound`] if the tenant does not exist.
    pub async fn insert_skill_version(&self, new: &NewSkillVersion) -> Result<SkillVersionRecord> {
        check_name(&new.name)?;
        let size = i64::try_from(new.archive.len()).map_err(|_| StoreError::Invalid {
            what: "skill archive",
            reason: "larger than the store can record".into(),
        })?;
        let frontmatter =
            serde_json::to_string(&new.frontmatter).map_err(|e| StoreError::Invalid {
                what: "skill frontmatter",
                reason: e.to_string(),
            })?;
        let files = serde_json::to_string(&new.files).map_err(|e| StoreError::Invalid {
            what: "skill files",
            reason: e.to_string(),
        })?;
        let at = now();
        let begin = self.dialect().begin_write();
        let result: std::result::Result<i64, sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                let version: i64 = sqlx::query_scalar(
                    "INSERT INTO skills (tenant_id, name, latest_version, created_at, updated_at) \
                     VALUES ($1, $2, 1, $3, $3) ON CONFLICT (tenant_id, name) DO UPDATE \
                     SET latest_version = skills.latest_version + 1, \
                     updated_at = excluded.updated_at RETURNING latest_version",
                )
                .bind(&new.tenant_id)
                .bind(&new.name)
                .bind(to_millis(at))
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO skill_versions (tenant_id, name, version, sha256, size, \
                     description, frontmatter, files, archive, created_by, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(&new.tenant_id)
                .bind(&new.name)
                .bind(version)
                .bind(&new.sha256)
                .bind(size)
                .bind(&new.description)
                .bind(&frontmatter)
                .bind(&files)
                .bind(new.archive.as_slice())
                .bind(&new.created_by)
                .bind(to_millis(at))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(version)
            }
            .await
        });
        let version = match result {
            Ok(v) => v,
            Err(e) if is_foreign_key_violation(&e) => {
                return Err(StoreError::TenantNotFound(new.tenant_id.clone()));
            }
            Err(e) => {
                return Err(query_error(format!(
                    "insert a version of skill {}",
                    new.name
                ))(e));
            }
        };
        Ok(SkillVersionRecord {
            tenant_id: new.tenant_id.clone(),
            name: new.name.clone(),
            version: u32::try_from(version).map_err(|e| StoreError::Corrupt {
                what: format!("skill {}: version {version}: {e}", new.name),
            })?,
            sha256: new.sha256.clone(),
            size: new.archive.len() as u64,
            description: new.description.clone(),
            frontmatter: new.frontmatter.clone(),
            files: new.files.clone(),
            created_by: new.created_by.clone(),
            created_at: at,
        })
    }

    /// Version `version` of `tenant_id`'s skill `name`, or its latest version when `version` is
    /// `None`. `None` when the skill or that version does not exist (or is another tenant's).
    pub async fn get_skill_version(
        &self,
        tenant_id: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<SkillVersionRecord>> {
        let row = with_db!(self, |pool| {
            match version {
                Some(n) => {
                    sqlx::query_as::<_, VersionRow>(sqlx::AssertSqlSafe(format!(
                        "SELECT {VERSION_COLUMNS} FROM skill_versions v \
                         WHERE v.tenant_id = $1 AND v.name = $2 AND v.version = $3"
                    )))
                    .bind(tenant_id)
                    .bind(name)
                    .bind(i64::from(n))
                    .fetch_optional(pool)
                    .await
                }
                None => {
                    sqlx::query_as::<_, VersionRow>(sqlx::AssertSqlSafe(format!(
                        "SELECT {VERSION_COLUMNS} FROM skills s JOIN skill_versions v \
                         ON v.tenant_id = s.tenant_id AND v.name = s.name \
                         AND v.version = s.latest_version \
                         WHERE s.tenant_id = $1 AND s.name = $2"
                    )))
                    .bind(tenant_id)
                    .bind(name)
                    .fetch_optional(pool)
                    .await
                }
            }
        })
        .map_err(query_error(format!("read skill {name}")))?;
        row.map(VersionRow::into_record).transpose()
    }

    /// Every version of `tenant_id`'s skill `name`, oldest first; empty when there is no such
    /// skill.
    pub async fn list_skill_versions(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Vec<SkillVersionRecord>> {
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, VersionRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {VERSION_COLUMNS} FROM skill_versions v \
                 WHERE v.tenant_id = $1 AND v.name = $2 ORDER BY v.version"
            )))
            .bind(tenant_id)
            .bind(name)
            .fetch_all(pool)
            .await
        })
        .map_err(query_error(format!("list the versions of skill {name}")))?;
        records(rows)
    }

    /// One page of `tenant_id`'s skills by name, each as its latest version: at most `limit`
    /// (clamped to 1..=[`MAX_SKILL_PAGE_LIMIT`]) after `cursor`, a previous page's
    /// `next_cursor`.
    pub async fn list_skills(
        &self,
        tenant_id: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<SkillVersionRecord>> {
        let after = cursor.map(decode_cursor).transpose()?;
        let limit = limit.clamp(1, MAX_SKILL_PAGE_LIMIT);
        let rows = with_db!(self, |pool| {
            sqlx::query_as::<_, VersionRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {VERSION_COLUMNS} FROM skills s JOIN skill_versions v \
                 ON v.tenant_id = s.tenant_id AND v.name = s.name \
                 AND v.version = s.latest_version \
                 WHERE s.tenant_id = $1 AND ($2 IS NULL OR s.name > $2) \
                 ORDER BY s.name LIMIT $3"
            )))
            .bind(tenant_id)
            .bind(after.as_deref())
            .bind(i64::from(limit) + 1)
            .fetch_all(pool)
            .await
        })
        .map_err(query_error(format!("list skills of tenant {tenant_id}")))?;
        Ok(Page::from_overfetch(records(rows)?, limit, |last| {
            URL_SAFE_NO_PAD.encode(&last.name)
        }))
    }

    /// The archive bytes of version `version` of `tenant_id`'s skill `name`.
    pub async fn read_skill_archive(
        &self,
        tenant_id: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<Vec<u8>>> {
        with_db!(self, |pool| {
            sqlx::query_scalar::<_, Vec<u8>>(
                "SELECT archive FROM skill_versions \
                 WHERE tenant_id = $1 AND name = $2 AND version = $3",
            )
            .bind(tenant_id)
            .bind(name)
            .bind(i64::from(version))
            .fetch_optional(pool)
            .await
        })
        .map_err(query_error(format!(
            "read the archive of skill {name} version {version}"
        )))
    }

    /// Deletes `tenant_id`'s skill `name` with every version; returns how many versions it had
    /// (0: there was no such skill).
    pub async fn delete_skill(&self, tenant_id: &str, name: &str) -> Result<u64> {
        let begin = self.dialect().begin_write();
        let result: std::result::Result<u64, sqlx::Error> = with_db!(self, |pool| {
            async {
                let mut tx = pool.begin_with(begin).await?;
                let versions =
                    sqlx::query("DELETE FROM skill_versions WHERE tenant_id = $1 AND name = $2")
                        .bind(tenant_id)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                sqlx::query("DELETE FROM skills WHERE tenant_id = $1 AND name = $2")
                    .bind(tenant_id)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(versions)
            }
            .await
        });
        result.map_err(query_error(format!("delete skill {name}")))
    }
}
