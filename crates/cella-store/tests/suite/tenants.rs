//! Tenants: creation, uniqueness, lookup, create-or-get.

use cella_store::StoreError;

use super::{TestDb, store_test};

store_test!(tenants_are_created_and_found);
async fn tenants_are_created_and_found(db: &TestDb) {
    let s = &db.store;
    let beta = s.create_tenant("beta").await.expect("create beta");
    let acme = s.create_tenant("acme").await.expect("create acme");
    assert!(
        acme.id.starts_with("tnt_") && acme.id.len() == 20,
        "{}",
        acme.id
    );
    assert_ne!(acme.id, beta.id);
    assert_eq!(acme.name, "acme");
    assert_eq!(
        s.get_tenant(&acme.id).await.expect("get"),
        Some(acme.clone())
    );
    assert_eq!(
        s.get_tenant_by_name("acme").await.expect("get by name"),
        Some(acme.clone())
    );
    assert_eq!(s.get_tenant("tnt_missing").await.expect("get"), None);
    assert_eq!(s.get_tenant_by_name("Acme").await.expect("get"), None);
    assert_eq!(s.list_tenants().await.expect("list"), vec![acme, beta]);
}

store_test!(duplicate_tenant_names_error);
async fn duplicate_tenant_names_error(db: &TestDb) {
    let s = &db.store;
    s.create_tenant("acme").await.expect("create");
    let err = s.create_tenant("acme").await.expect_err("second create");
    assert!(
        matches!(&err, StoreError::TenantExists(n) if n == "acme"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "tenant \"acme\" already exists");
    assert_eq!(s.list_tenants().await.expect("list").len(), 1);
}

store_test!(invalid_tenant_names_are_refused);
async fn invalid_tenant_names_are_refused(db: &TestDb) {
    let s = &db.store;
    for name in ["", "   ", "a\nb", &"x".repeat(129)] {
        let err = s.create_tenant(name).await.expect_err(name);
        assert!(
            matches!(
                err,
                StoreError::Invalid {
                    what: "tenant name",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert!(s.list_tenants().await.expect("list").is_empty());
}

store_test!(ensure_tenant_creates_once_even_concurrently);
async fn ensure_tenant_creates_once_even_concurrently(db: &TestDb) {
    let s = &db.store;
    let first = s.ensure_tenant("acme").await.expect("ensure");
    assert_eq!(s.ensure_tenant("acme").await.expect("ensure again"), first);

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move { s.ensure_tenant("burst").await }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("join").expect("ensure burst").id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let names: Vec<String> = s
        .list_tenants()
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["acme", "burst"]);
}
