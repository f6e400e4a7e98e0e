//! The harness: every behaviour in these modules is an `async fn(&TestDb)` instantiated by
//! [`store_test!`] as `<name>::sqlite` and `<name>::postgres`. The Postgres variant runs in a
//! fresh database of the server `CELLA_TEST_POSTGRES_URL` points at, and prints why it skips
//! when the variable is unset.

use std::str::FromStr as _;

use cella_store::{SandboxRecord, SandboxState, Store};
use chrono::{DateTime, TimeDelta, Utc};
use sqlx::Connection as _;

mod api_keys;
mod audit;
mod jobs;
mod logs;
mod open;
mod sandboxes;
mod skills;
mod tenants;

/// A store for one test, and how to reach its database directly.
pub struct TestDb {
    pub store: Store,
    /// The URL the store was opened with.
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    /// (server URL, database) to drop at the end.
    drop_database: Option<(String, String)>,
}

impl TestDb {
    pub async fn finish(self) {
        self.store.close().await;
        if let Some((server, name)) = &self.drop_database {
            let mut conn = sqlx::PgConnection::connect(server)
                .await
                .expect("connect to the test postgres server");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await
            .expect("drop the test database");
        }
    }
}

pub async fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nested").join("cella.db");
    let url = format!("sqlite://{}", path.display());
    let store = Store::open(&url).await.expect("open the sqlite store");
    TestDb {
        store,
        url,
        _dir: Some(dir),
        drop_database: None,
    }
}

pub const POSTGRES_ENV: &str = "CELLA_TEST_POSTGRES_URL";

/// A fresh database on the test Postgres server, or `None` (with the reason printed) when
/// `CELLA_TEST_POSTGRES_URL` is unset. A set but unreachable server fails the test.
pub async fn postgres_db() -> Option<TestDb> {
    let Some(server) = std::env::var(POSTGRES_ENV).ok().filter(|v| !v.is_empty()) else {
        eprintln!(
            "skipping the postgres variant: {POSTGRES_ENV} is not set \
             (./scripts/test starts a throwaway postgres and sets it)"
        );
        return None;
    };
    let name = format!(
        "cella_test_{}_{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    );
    let mut conn = sqlx::PgConnection::connect(&server)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV} is set but postgres is unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create the test database");
    conn.close().await.ok();
    let url = with_database(&server, &name);
    let store = Store::open(&url).await.expect("open the postgres store");
    Some(TestDb {
        store,
        url,
        _dir: None,
        drop_database: Some((server, name)),
    })
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let (scheme, rest) = base.split_once("://").expect("postgres url has a scheme");
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    let mut out = format!("{scheme}://{authority}/{name}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Instantiates the behaviour `$name(&TestDb)` once per backend.
macro_rules! store_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let db = crate::suite::sqlite_db().await;
                super::$name(&db).await;
                db.finish().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let Some(db) = crate::suite::postgres_db().await else {
                    return;
                };
                super::$name(&db).await;
                db.finish().await;
            }
        }
    };
}
pub(crate) use store_test;

/// A fixed instant with a millisecond part, plus `offset_ms`.
pub fn at(offset_ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_str("2026-03-01T12:00:00.123Z").expect("timestamp")
        + TimeDelta::milliseconds(offset_ms)
}

/// A running sandbox of `tenant_id` started at `at(started_ms)`.
pub fn sandbox(id: &str, tenant_id: &str, started_ms: i64) -> SandboxRecord {
    SandboxRecord {
        id: id.to_owned(),
        tenant_id: tenant_id.to_owned(),
        template_id: "base".to_owned(),
        alias: None,
        state: SandboxState::Running,
        backend: "native".to_owned(),
        backend_state: serde_json::json!({"socket": format!("/run/cella/{id}.sock"), "pid": 42}),
        spec: serde_json::json!({"timeout": 300, "envs": {"A": "1"}}),
        metadata: Default::default(),
        envd_access_token: None,
        traffic_access_token: None,
        cpu_count: 2,
        memory_mb: 512,
        disk_mb: 1024,
        started_at: at(started_ms),
        end_at: at(started_ms + 300_000),
        ended_at: None,
        end_reason: None,
    }
}
