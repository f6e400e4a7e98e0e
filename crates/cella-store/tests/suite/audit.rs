//! The audit trail: recorded per tenant, read newest first.

use cella_store::{SYSTEM_ACTOR, StoreError};
use serde_json::json;

use super::{TestDb, store_test};

store_test!(audit_events_are_listed_newest_first_per_tenant);
async fn audit_events_are_listed_newest_first_per_tenant(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    let key = s.create_api_key(&a.id, "ci").await.expect("key");
    let first = s
        .record_audit(
            &a.id,
            &key.record.id,
            "sandbox.create",
            "sbx1",
            &json!({"template": "base"}),
        )
        .await
        .expect("record");
    s.record_audit(
        &b.id,
        SYSTEM_ACTOR,
        "sandbox.kill",
        "sbx9",
        &json!({"reason": "timeout"}),
    )
    .await
    .expect("record b");
    let last = s
        .record_audit(
            &a.id,
            SYSTEM_ACTOR,
            "sandbox.kill",
            "sbx1",
            &json!({"reason": "timeout"}),
        )
        .await
        .expect("record");
    assert!(last.id > first.id);

    let events = s.list_audit(&a.id, 10).await.expect("list");
    assert_eq!(events, vec![last.clone(), first.clone()]);
    assert_eq!(events[1].actor, key.record.id);
    assert_eq!(events[1].detail, json!({"template": "base"}));
    assert_eq!(s.list_audit(&a.id, 1).await.expect("list"), vec![last]);
    let other = s.list_audit(&b.id, 10).await.expect("list b");
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].target, "sbx9");

    let err = s
        .record_audit("tnt_missing", SYSTEM_ACTOR, "x", "y", &json!(null))
        .await
        .expect_err("no tenant");
    assert!(matches!(err, StoreError::TenantNotFound(_)), "{err:?}");
}
