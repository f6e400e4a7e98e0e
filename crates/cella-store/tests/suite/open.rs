//! Opening stores: URLs and paths, SQLite settings, idempotent migrations (SQLite-only checks;
//! the Postgres variants of every other test open through a `postgres://` URL).

use cella_store::{Dialect, Store, StoreError};
use sqlx::Connection as _;

use super::{TestDb, sandbox, store_test};

#[tokio::test]
async fn plain_paths_create_parent_dirs_and_use_wal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("a").join("b").join("cella.db");
    let store = Store::open(path.to_str().expect("utf-8 path"))
        .await
        .expect("open");
    assert_eq!(store.dialect(), Dialect::Sqlite);
    let t = store.create_tenant("acme").await.expect("tenant");
    store.close().await;
    assert!(path.exists());

    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("connect");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .expect("journal mode");
    assert_eq!(mode, "wal");
    conn.close().await.ok();

    // Reopening runs no migration twice and keeps the data.
    let again = Store::open(&format!("sqlite://{}", path.display()))
        .await
        .expect("reopen");
    assert_eq!(
        again.get_tenant_by_name("acme").await.expect("get"),
        Some(t)
    );
    again.close().await;
}

#[tokio::test]
async fn in_memory_stores_work_and_are_private() {
    let one = Store::open_in_memory().await.expect("open");
    let two = Store::open_in_memory().await.expect("open");
    let t = one.create_tenant("acme").await.expect("tenant");
    one.insert_sandbox(&sandbox("sbx1", &t.id, 0))
        .await
        .expect("insert");
    assert!(one.get_sandbox("sbx1").await.expect("get").is_some());
    assert!(two.list_tenants().await.expect("list").is_empty());
}

#[tokio::test]
async fn unsupported_urls_are_refused_with_the_reason() {
    let err = Store::open("mysql://root:pw@localhost/cella")
        .await
        .expect_err("mysql");
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("invalid database url mysql://root:***@localhost/cella"),
        "{msg}"
    );
    assert!(!msg.contains("pw"), "{msg}");
}

#[tokio::test]
async fn unreachable_postgres_names_the_url_without_its_password() {
    // Port 1 on loopback refuses connections immediately.
    let err = Store::open("postgres://cella:hunter2@127.0.0.1:1/cella")
        .await
        .expect_err("unreachable");
    let msg = err.to_string();
    assert!(
        msg.starts_with("cannot open the store at postgres://cella:***@127.0.0.1:1/cella"),
        "{msg}"
    );
    assert!(!msg.contains("hunter2"), "{msg}");
}

store_test!(foreign_keys_are_enforced);
async fn foreign_keys_are_enforced(db: &TestDb) {
    // The store refuses a sandbox of a missing tenant because the database does.
    let err = db
        .store
        .insert_sandbox(&sandbox("sbx1", "tnt_missing", 0))
        .await
        .expect_err("foreign key");
    assert!(matches!(err, StoreError::TenantNotFound(_)), "{err:?}");
    let expected = if db.url.starts_with("postgres") {
        Dialect::Postgres
    } else {
        Dialect::Sqlite
    };
    assert_eq!(db.store.dialect(), expected);
}
