//! Sandboxes: round trips, tenant isolation, state machine, listing with filters and paging,
//! restart bookkeeping, concurrent writers.

use std::collections::BTreeSet;

use cella_store::{PageRequest, SandboxFilter, SandboxRecord, SandboxState, SortOrder, StoreError};

use super::{TestDb, at, sandbox, store_test};

fn ids(records: &[SandboxRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.clone()).collect()
}

store_test!(sandboxes_round_trip_exactly);
async fn sandboxes_round_trip_exactly(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    let mut full = sandbox("sbxfull", &t.id, 0);
    full.alias = Some("python".into());
    full.metadata = [("user", "ana"), ("env", "dev"), ("quote", "it's \"x\"")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    full.envd_access_token = Some("envd-secret".into());
    full.traffic_access_token = Some("traffic-secret".into());
    full.cpu_count = 8;
    full.memory_mb = 65_536;
    full.disk_mb = u32::MAX;
    s.insert_sandbox(&full).await.expect("insert");
    assert_eq!(
        s.get_sandbox("sbxfull").await.expect("get"),
        Some(full.clone())
    );
    assert!(
        !format!("{full:?}").contains("secret"),
        "tokens are redacted in Debug"
    );

    let bare = sandbox("sbxbare", &t.id, 1);
    s.insert_sandbox(&bare).await.expect("insert bare");
    assert_eq!(s.get_sandbox("sbxbare").await.expect("get"), Some(bare));
    assert_eq!(s.get_sandbox("sbxnone").await.expect("get"), None);
}

store_test!(sandbox_ids_are_unique_and_need_a_tenant);
async fn sandbox_ids_are_unique_and_need_a_tenant(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    let mut first = sandbox("sbx1", &t.id, 0);
    first.metadata.insert("k".into(), "v".into());
    s.insert_sandbox(&first).await.expect("insert");
    let mut dup = sandbox("sbx1", &t.id, 5);
    dup.metadata.insert("other".into(), "x".into());
    let err = s.insert_sandbox(&dup).await.expect_err("duplicate");
    assert!(
        matches!(&err, StoreError::SandboxExists(id) if id == "sbx1"),
        "{err:?}"
    );
    assert_eq!(
        s.get_sandbox("sbx1").await.expect("get"),
        Some(first.clone())
    );
    // The failed insert left no metadata behind.
    let page = s
        .list_sandboxes(
            &t.id,
            &SandboxFilter {
                metadata: vec![("other".into(), "x".into())],
                ..Default::default()
            },
            &PageRequest::default(),
        )
        .await
        .expect("list");
    assert!(page.items.is_empty());

    let err = s
        .insert_sandbox(&sandbox("sbx2", "tnt_missing", 0))
        .await
        .expect_err("no tenant");
    assert!(
        matches!(&err, StoreError::TenantNotFound(t) if t == "tnt_missing"),
        "{err:?}"
    );
    assert_eq!(s.get_sandbox("sbx2").await.expect("get"), None);
}

store_test!(tenants_never_see_each_others_sandboxes);
async fn tenants_never_see_each_others_sandboxes(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    let mut sa = sandbox("sbxa", &a.id, 0);
    sa.metadata.insert("team".into(), "x".into());
    s.insert_sandbox(&sa).await.expect("insert a");
    s.insert_sandbox(&sandbox("sbxb", &b.id, 1))
        .await
        .expect("insert b");

    assert_eq!(
        s.get_sandbox_for_tenant(&a.id, "sbxa")
            .await
            .expect("get")
            .map(|r| r.id),
        Some("sbxa".into())
    );
    assert_eq!(
        s.get_sandbox_for_tenant(&b.id, "sbxa").await.expect("get"),
        None
    );
    assert_eq!(
        s.get_sandbox_for_tenant(&a.id, "sbxb").await.expect("get"),
        None
    );

    let all = PageRequest::default();
    let none = SandboxFilter::default();
    assert_eq!(
        ids(&s
            .list_sandboxes(&a.id, &none, &all)
            .await
            .expect("list a")
            .items),
        ["sbxa"]
    );
    assert_eq!(
        ids(&s
            .list_sandboxes(&b.id, &none, &all)
            .await
            .expect("list b")
            .items),
        ["sbxb"]
    );
    let by_meta = SandboxFilter {
        metadata: vec![("team".into(), "x".into())],
        ..Default::default()
    };
    assert!(
        s.list_sandboxes(&b.id, &by_meta, &all)
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_eq!(s.count_running_sandboxes(&a.id).await.expect("count"), 1);
    assert_eq!(s.count_running_sandboxes(&b.id).await.expect("count"), 1);
    assert_eq!(
        s.count_running_sandboxes("tnt_missing")
            .await
            .expect("count"),
        0
    );
}

store_test!(states_move_until_killed);
async fn states_move_until_killed(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    s.insert_sandbox(&sandbox("sbx1", &t.id, 0))
        .await
        .expect("insert");

    let paused = s
        .update_sandbox_state("sbx1", SandboxState::Paused, None)
        .await
        .expect("pause");
    assert_eq!(paused.state, SandboxState::Paused);
    assert_eq!(paused.ended_at, None);
    assert_eq!(s.count_running_sandboxes(&t.id).await.expect("count"), 0);

    let resumed = s
        .update_sandbox_state("sbx1", SandboxState::Running, None)
        .await
        .expect("resume");
    assert_eq!(resumed.state, SandboxState::Running);

    let extended = s
        .set_sandbox_end_at("sbx1", at(900_000))
        .await
        .expect("extend");
    assert_eq!(extended.end_at, at(900_000));

    let moved = s
        .set_sandbox_backend_state("sbx1", &serde_json::json!({"pid": 7}))
        .await
        .expect("backend state");
    assert_eq!(moved.backend_state, serde_json::json!({"pid": 7}));

    let respecced = s
        .set_sandbox_spec(
            "sbx1",
            &serde_json::json!({"network": {"allow": ["a.test"]}}),
        )
        .await
        .expect("spec");
    assert_eq!(respecced.spec["network"]["allow"][0], "a.test");
    assert_eq!(
        s.get_sandbox("sbx1")
            .await
            .expect("get")
            .expect("some")
            .spec,
        respecced.spec
    );

    let before = cella_store::now();
    let killed = s
        .update_sandbox_state("sbx1", SandboxState::Killed, Some("timeout"))
        .await
        .expect("kill");
    assert_eq!(killed.state, SandboxState::Killed);
    assert_eq!(killed.end_reason.as_deref(), Some("timeout"));
    let ended = killed.ended_at.expect("ended_at set");
    assert!(ended >= before && ended <= cella_store::now(), "{ended}");
    assert_eq!(
        s.get_sandbox("sbx1").await.expect("get"),
        Some(killed.clone())
    );

    for wanted in [
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Killed,
    ] {
        let err = s
            .update_sandbox_state("sbx1", wanted, None)
            .await
            .expect_err("killed is final");
        assert!(matches!(err, StoreError::SandboxEnded { .. }), "{err:?}");
    }
    let err = s
        .set_sandbox_spec("sbx1", &serde_json::json!({}))
        .await
        .expect_err("killed is final");
    assert!(matches!(err, StoreError::SandboxEnded { .. }), "{err:?}");
    let err = s
        .set_sandbox_end_at("sbx1", at(1))
        .await
        .expect_err("final");
    assert_eq!(
        err.to_string(),
        "sandbox sbx1 has ended and cannot become extended"
    );
    let err = s
        .mark_sandbox_ended("sbx1", "again", at(2))
        .await
        .expect_err("final");
    assert!(matches!(err, StoreError::SandboxEnded { .. }), "{err:?}");
    assert_eq!(s.get_sandbox("sbx1").await.expect("get"), Some(killed));

    let err = s
        .update_sandbox_state("nope", SandboxState::Paused, None)
        .await
        .expect_err("missing");
    assert!(
        matches!(&err, StoreError::SandboxNotFound(id) if id == "nope"),
        "{err:?}"
    );
    let err = s
        .set_sandbox_end_at("nope", at(0))
        .await
        .expect_err("missing");
    assert_eq!(err.to_string(), "sandbox nope not found");
}

store_test!(mark_ended_records_time_and_reason);
async fn mark_ended_records_time_and_reason(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    s.insert_sandbox(&sandbox("sbx1", &t.id, 0))
        .await
        .expect("insert");
    let ended = s
        .mark_sandbox_ended("sbx1", "lost", at(5_000))
        .await
        .expect("end");
    assert_eq!(ended.state, SandboxState::Killed);
    assert_eq!(ended.ended_at, Some(at(5_000)));
    assert_eq!(ended.end_reason.as_deref(), Some("lost"));
}

/// 25 sandboxes: started at 0..=11 s, every instant used by two (ties broken by id), one more.
async fn seed_for_paging(db: &TestDb, tenant: &str) -> Vec<SandboxRecord> {
    let mut all = Vec::new();
    for i in 0..25i64 {
        // Insert in a scrambled order so insertion order cannot fake the sort.
        let n = (i * 7) % 25;
        let mut r = sandbox(&format!("sbx{n:02}"), tenant, (n / 2) * 1000);
        r.template_id = if n % 3 == 0 {
            "python".into()
        } else {
            "base".into()
        };
        r.metadata.insert(
            "parity".into(),
            if n % 2 == 0 { "even" } else { "odd" }.into(),
        );
        r.metadata
            .insert("tier".into(), if n < 10 { "low" } else { "high" }.into());
        if n % 5 == 0 {
            r.state = SandboxState::Paused;
        }
        db.store.insert_sandbox(&r).await.expect("insert");
        all.push(r);
    }
    all.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
    all
}

async fn collect_pages(
    db: &TestDb,
    tenant: &str,
    filter: &SandboxFilter,
    order: SortOrder,
    limit: u32,
) -> (Vec<String>, Vec<usize>) {
    let mut cursor = None;
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page = db
            .store
            .list_sandboxes(
                tenant,
                filter,
                &PageRequest {
                    order,
                    limit,
                    cursor: cursor.clone(),
                },
            )
            .await
            .expect("list page");
        sizes.push(page.items.len());
        seen.extend(ids(&page.items));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
        assert!(sizes.len() < 100, "paging does not terminate");
    }
    (seen, sizes)
}

store_test!(listing_pages_stably_in_both_orders);
async fn listing_pages_stably_in_both_orders(db: &TestDb) {
    let t = db.store.create_tenant("acme").await.expect("tenant");
    let all = seed_for_paging(db, &t.id).await;
    let asc: Vec<String> = ids(&all);
    let desc: Vec<String> = asc.iter().rev().cloned().collect();
    assert_eq!(&asc[..4], ["sbx00", "sbx01", "sbx02", "sbx03"]);

    let none = SandboxFilter::default();
    let (seen, sizes) = collect_pages(db, &t.id, &none, SortOrder::Desc, 10).await;
    assert_eq!(sizes, [10, 10, 5]);
    assert_eq!(seen, desc);
    let (seen, sizes) = collect_pages(db, &t.id, &none, SortOrder::Asc, 10).await;
    assert_eq!(sizes, [10, 10, 5]);
    assert_eq!(seen, asc);
    // An exact multiple ends without an empty page.
    let (seen, sizes) = collect_pages(db, &t.id, &none, SortOrder::Asc, 5).await;
    assert_eq!(sizes, [5, 5, 5, 5, 5]);
    assert_eq!(seen, asc);
    // A page boundary between two sandboxes started at the same millisecond.
    let (seen, sizes) = collect_pages(db, &t.id, &none, SortOrder::Desc, 3).await;
    assert_eq!(sizes.len(), 9);
    assert_eq!(seen, desc);

    // A page's cursor still works after a newer sandbox arrives (newest-first paging).
    let first = db
        .store
        .list_sandboxes(
            &t.id,
            &none,
            &PageRequest {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .expect("first page");
    db.store
        .insert_sandbox(&sandbox("sbxnew", &t.id, 60_000))
        .await
        .expect("insert newer");
    let second = db
        .store
        .list_sandboxes(
            &t.id,
            &none,
            &PageRequest {
                limit: 10,
                cursor: first.next_cursor.clone(),
                ..Default::default()
            },
        )
        .await
        .expect("second page");
    assert_eq!(ids(&second.items), desc[10..20]);

    // Limits are clamped, not refused.
    let zero = db
        .store
        .list_sandboxes(
            &t.id,
            &none,
            &PageRequest {
                limit: 0,
                ..Default::default()
            },
        )
        .await
        .expect("limit 0");
    assert_eq!(zero.items.len(), 1);
}

store_test!(listing_filters_by_state_metadata_template_and_time);
async fn listing_filters_by_state_metadata_template_and_time(db: &TestDb) {
    let t = db.store.create_tenant("acme").await.expect("tenant");
    let all = seed_for_paging(db, &t.id).await;
    let expect = |pred: &dyn Fn(&SandboxRecord) -> bool| -> Vec<String> {
        all.iter()
            .filter(|r| pred(r))
            .map(|r| r.id.clone())
            .collect()
    };
    let tenant = t.id.as_str();
    let list = |filter: SandboxFilter| async move {
        collect_pages(db, tenant, &filter, SortOrder::Asc, 4)
            .await
            .0
    };

    let paused = list(SandboxFilter {
        states: vec![SandboxState::Paused],
        ..Default::default()
    })
    .await;
    assert_eq!(paused, ["sbx00", "sbx05", "sbx10", "sbx15", "sbx20"]);
    let both = list(SandboxFilter {
        states: vec![SandboxState::Running, SandboxState::Paused],
        ..Default::default()
    })
    .await;
    assert_eq!(both.len(), 25);

    let even = list(SandboxFilter {
        metadata: vec![("parity".into(), "even".into())],
        ..Default::default()
    })
    .await;
    assert_eq!(even, expect(&|r| r.metadata["parity"] == "even"));
    assert_eq!(even.len(), 13);

    let even_high = list(SandboxFilter {
        metadata: vec![
            ("parity".into(), "even".into()),
            ("tier".into(), "high".into()),
        ],
        ..Default::default()
    })
    .await;
    assert_eq!(
        even_high,
        [
            "sbx10", "sbx12", "sbx14", "sbx16", "sbx18", "sbx20", "sbx22", "sbx24"
        ]
    );

    let contradiction = list(SandboxFilter {
        metadata: vec![
            ("parity".into(), "even".into()),
            ("parity".into(), "odd".into()),
        ],
        ..Default::default()
    })
    .await;
    assert!(contradiction.is_empty());
    let unknown_key = list(SandboxFilter {
        metadata: vec![("nope".into(), "even".into())],
        ..Default::default()
    })
    .await;
    assert!(unknown_key.is_empty());
    let value_is_exact = list(SandboxFilter {
        metadata: vec![("parity".into(), "Even".into())],
        ..Default::default()
    })
    .await;
    assert!(value_is_exact.is_empty());

    let python = list(SandboxFilter {
        template_id: Some("python".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(python, expect(&|r| r.template_id == "python"));
    assert_eq!(python.len(), 9);

    let late = list(SandboxFilter {
        started_after: Some(at(10_000)),
        ..Default::default()
    })
    .await;
    assert_eq!(late, ["sbx22", "sbx23", "sbx24"]);

    let everything = list(SandboxFilter {
        states: vec![SandboxState::Running],
        metadata: vec![("tier".into(), "high".into())],
        template_id: Some("python".into()),
        started_after: Some(at(5_000)),
    })
    .await;
    assert_eq!(everything, ["sbx12", "sbx18", "sbx21", "sbx24"]);
}

store_test!(bad_cursors_are_refused);
async fn bad_cursors_are_refused(db: &TestDb) {
    let t = db.store.create_tenant("acme").await.expect("tenant");
    for cursor in ["not a cursor", "MTIz", ""] {
        let err = db
            .store
            .list_sandboxes(
                &t.id,
                &SandboxFilter::default(),
                &PageRequest {
                    cursor: Some(cursor.into()),
                    ..Default::default()
                },
            )
            .await
            .expect_err(cursor);
        assert!(
            matches!(
                err,
                StoreError::Invalid {
                    what: "page cursor",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

store_test!(live_sandboxes_and_counts_span_tenants);
async fn live_sandboxes_and_counts_span_tenants(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    s.insert_sandbox(&sandbox("sbx3", &a.id, 3))
        .await
        .expect("insert");
    s.insert_sandbox(&sandbox("sbx1", &b.id, 1))
        .await
        .expect("insert");
    s.insert_sandbox(&sandbox("sbx2", &a.id, 2))
        .await
        .expect("insert");
    s.insert_sandbox(&sandbox("sbx4", &b.id, 4))
        .await
        .expect("insert");
    s.update_sandbox_state("sbx2", SandboxState::Paused, None)
        .await
        .expect("pause");
    s.update_sandbox_state("sbx4", SandboxState::Killed, None)
        .await
        .expect("kill");

    let live = s.list_live_sandboxes().await.expect("live");
    assert_eq!(ids(&live), ["sbx1", "sbx2", "sbx3"]);
    let counts = s.count_sandboxes_by_state().await.expect("counts");
    let counts: Vec<(SandboxState, u64)> = counts.into_iter().collect();
    assert_eq!(
        counts,
        [
            (SandboxState::Running, 2),
            (SandboxState::Paused, 1),
            (SandboxState::Killed, 1)
        ]
    );
    assert_eq!(s.count_running_sandboxes(&a.id).await.expect("count"), 1);
    assert_eq!(s.count_running_sandboxes(&b.id).await.expect("count"), 1);
}

store_test!(purging_removes_only_long_ended_sandboxes);
async fn purging_removes_only_long_ended_sandboxes(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    for id in ["old", "recent", "alive"] {
        s.insert_sandbox(&sandbox(id, &t.id, 0))
            .await
            .expect("insert");
    }
    s.append_sandbox_log(
        "old",
        &super::logs::line(cella_store::LogLevel::Info, "bye", 1),
    )
    .await
    .expect("log");
    s.mark_sandbox_ended("old", "killed", at(1_000))
        .await
        .expect("end");
    s.mark_sandbox_ended("recent", "killed", at(9_000))
        .await
        .expect("end");
    assert_eq!(s.purge_ended_sandboxes(at(5_000)).await.expect("purge"), 1);
    assert_eq!(s.get_sandbox("old").await.expect("get"), None);
    assert!(s.get_sandbox("recent").await.expect("get").is_some());
    assert!(s.get_sandbox("alive").await.expect("get").is_some());
    let logs = s
        .list_sandbox_logs("old", &Default::default())
        .await
        .expect("logs");
    assert!(logs.is_empty());
}

store_test!(concurrent_writers_do_not_fail);
async fn concurrent_writers_do_not_fail(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    let mut tasks = Vec::new();
    for task in 0..8 {
        let s = s.clone();
        let tenant = t.id.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let id = format!("sbx{task}x{i:02}");
                let mut r = sandbox(&id, &tenant, i64::from(task * 100 + i));
                r.metadata.insert("task".into(), task.to_string());
                s.insert_sandbox(&r).await?;
                if i % 4 == 0 {
                    s.update_sandbox_state(&id, SandboxState::Paused, None)
                        .await?;
                }
                s.append_sandbox_log(
                    &id,
                    &super::logs::line(cella_store::LogLevel::Info, "up", 0),
                )
                .await?;
                s.record_audit(
                    &tenant,
                    "system",
                    "sandbox.create",
                    &id,
                    &serde_json::json!({}),
                )
                .await?;
            }
            Ok::<_, StoreError>(())
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("concurrent writes succeed");
    }
    let (seen, _) = collect_pages(db, &t.id, &SandboxFilter::default(), SortOrder::Asc, 1000).await;
    assert_eq!(seen.len(), 160);
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), 160);
    assert_eq!(s.count_running_sandboxes(&t.id).await.expect("count"), 120);
    assert_eq!(s.list_audit(&t.id, 1000).await.expect("audit").len(), 160);
}
