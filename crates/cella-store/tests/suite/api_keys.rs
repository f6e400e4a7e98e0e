//! API keys: E2B's shape, hashed storage, authentication per tenant, revocation.

use cella_store::{API_KEY_PREFIX, StoreError};
use sqlx::{Connection as _, Row as _};

use super::{TestDb, store_test};

fn is_e2b_key(key: &str) -> bool {
    key.len() == 44
        && key.starts_with("e2b_")
        && key[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

store_test!(keys_have_e2b_shape_and_authenticate_their_tenant);
async fn keys_have_e2b_shape_and_authenticate_their_tenant(db: &TestDb) {
    let s = &db.store;
    let acme = s.create_tenant("acme").await.expect("tenant a");
    let beta = s.create_tenant("beta").await.expect("tenant b");
    let ka = s.create_api_key(&acme.id, "ci").await.expect("key a");
    let kb = s.create_api_key(&beta.id, "laptop").await.expect("key b");

    assert!(is_e2b_key(&ka.plaintext), "{}", ka.plaintext);
    assert_eq!(API_KEY_PREFIX, "e2b_");
    assert_ne!(ka.plaintext, kb.plaintext);
    assert_eq!(ka.record.display_prefix, ka.plaintext[..8]);
    assert_eq!(ka.record.masked(), format!("{}…", &ka.plaintext[..8]));
    assert_eq!(ka.record.tenant_id, acme.id);
    assert_eq!(ka.record.label, "ci");
    assert!(!format!("{ka:?}").contains(&ka.plaintext[4..]));

    let (key, tenant) = s
        .authenticate(&ka.plaintext)
        .await
        .expect("authenticate a")
        .expect("key a is valid");
    assert_eq!(key.id, ka.record.id);
    assert_eq!(tenant, acme);
    assert!(key.last_used_at.is_some());

    let (key, tenant) = s
        .authenticate(&kb.plaintext)
        .await
        .expect("authenticate b")
        .expect("key b is valid");
    assert_eq!(key.id, kb.record.id);
    assert_eq!(tenant, beta);

    let listed = s.list_api_keys(&acme.id).await.expect("list a");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, ka.record.id);
    assert!(listed[0].last_used_at.is_some(), "use was recorded");
    assert_eq!(
        s.get_api_key(&kb.record.id)
            .await
            .expect("get")
            .map(|k| k.tenant_id),
        Some(beta.id)
    );
}

store_test!(unknown_and_malformed_keys_fail);
async fn unknown_and_malformed_keys_fail(db: &TestDb) {
    let s = &db.store;
    let acme = s.create_tenant("acme").await.expect("tenant");
    let k = s.create_api_key(&acme.id, "").await.expect("key");
    let mut other = k.plaintext.clone();
    let last = if other.ends_with('0') { "1" } else { "0" };
    other.replace_range(43.., last);
    for bad in [
        other.as_str(),
        &k.plaintext.to_uppercase(),
        &k.plaintext[..43],
        &format!("{} ", k.plaintext),
        "",
        "e2b_",
        &k.record.display_prefix,
    ] {
        assert!(
            s.authenticate(bad).await.expect("authenticate").is_none(),
            "{bad:?}"
        );
    }
}

store_test!(revoked_keys_fail);
async fn revoked_keys_fail(db: &TestDb) {
    let s = &db.store;
    let acme = s.create_tenant("acme").await.expect("tenant a");
    let beta = s.create_tenant("beta").await.expect("tenant b");
    let k1 = s.create_api_key(&acme.id, "one").await.expect("key 1");
    let k2 = s.create_api_key(&acme.id, "two").await.expect("key 2");

    // Another tenant cannot revoke it.
    let err = s
        .revoke_api_key(&beta.id, &k1.record.id)
        .await
        .expect_err("cross-tenant revoke");
    assert!(
        matches!(&err, StoreError::ApiKeyNotFound(id) if *id == k1.record.id),
        "{err:?}"
    );
    assert!(s.authenticate(&k1.plaintext).await.expect("auth").is_some());

    let revoked = s
        .revoke_api_key(&acme.id, &k1.record.id)
        .await
        .expect("revoke");
    assert!(revoked.is_revoked());
    assert!(s.authenticate(&k1.plaintext).await.expect("auth").is_none());
    assert!(
        s.authenticate(&k2.plaintext).await.expect("auth").is_some(),
        "other key unaffected"
    );

    // Idempotent, keeps the first revocation time.
    let again = s
        .revoke_api_key(&acme.id, &k1.record.id)
        .await
        .expect("revoke again");
    assert_eq!(again.revoked_at, revoked.revoked_at);

    let listed = s.list_api_keys(&acme.id).await.expect("list");
    let mut labels: Vec<(&str, bool)> = listed
        .iter()
        .map(|k| (k.label.as_str(), k.is_revoked()))
        .collect();
    // Keys made in the same millisecond have no defined order between them.
    labels.sort();
    assert_eq!(labels, [("one", true), ("two", false)]);
    assert!(s.list_api_keys(&beta.id).await.expect("list b").is_empty());

    let err = s
        .revoke_api_key(&acme.id, "key_missing")
        .await
        .expect_err("missing");
    assert_eq!(err.to_string(), "api key key_missing not found");
}

store_test!(keys_need_an_existing_tenant);
async fn keys_need_an_existing_tenant(db: &TestDb) {
    let err = db
        .store
        .create_api_key("tnt_missing", "x")
        .await
        .expect_err("no tenant");
    assert!(
        matches!(&err, StoreError::TenantNotFound(t) if t == "tnt_missing"),
        "{err:?}"
    );
}

store_test!(last_used_is_recorded_at_most_once_a_minute);
async fn last_used_is_recorded_at_most_once_a_minute(db: &TestDb) {
    let s = &db.store;
    let acme = s.create_tenant("acme").await.expect("tenant");
    let k = s.create_api_key(&acme.id, "").await.expect("key");
    let (first, _) = s
        .authenticate(&k.plaintext)
        .await
        .expect("auth")
        .expect("valid");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let (second, _) = s
        .authenticate(&k.plaintext)
        .await
        .expect("auth")
        .expect("valid");
    assert_eq!(first.last_used_at, second.last_used_at);
    let stored = s
        .get_api_key(&k.record.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(stored.last_used_at, first.last_used_at);
}

store_test!(plaintext_keys_are_never_stored);
async fn plaintext_keys_are_never_stored(db: &TestDb) {
    let s = &db.store;
    let acme = s.create_tenant("acme").await.expect("tenant");
    let k = s.create_api_key(&acme.id, "label").await.expect("key");
    let secret = &k.plaintext[8..];
    let sql = "SELECT id, tenant_id, label, key_hash, display_prefix FROM api_keys";
    let cells: Vec<String> = if db.url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        let rows = sqlx::query(sql).fetch_all(&mut c).await.expect("select");
        rows.iter()
            .flat_map(|r| (0..5).map(|i| r.get::<String, _>(i)).collect::<Vec<_>>())
            .collect()
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url)
            .await
            .expect("connect");
        let rows = sqlx::query(sql).fetch_all(&mut c).await.expect("select");
        rows.iter()
            .flat_map(|r| (0..5).map(|i| r.get::<String, _>(i)).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(cells.len(), 5);
    for cell in &cells {
        assert!(!cell.contains(secret), "plaintext found in {cell:?}");
    }
    assert!(
        cells.iter().any(|c| c.len() == 64),
        "a sha-256 hex hash is stored: {cells:?}"
    );
}
