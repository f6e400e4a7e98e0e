//! The skill registry: versions numbered per tenant and name, archives kept byte for byte,
//! latest-version listing with paging, deletion of every version, tenant isolation.

use cella_store::{NewSkillVersion, SkillFile, StoreError};
use serde_json::json;

use super::{TestDb, store_test};

fn upload(tenant_id: &str, name: &str, archive: &[u8]) -> NewSkillVersion {
    NewSkillVersion {
        tenant_id: tenant_id.to_owned(),
        name: name.to_owned(),
        sha256: format!("{:064x}", archive.len()),
        description: format!("{name} does things"),
        frontmatter: json!({"name": name, "description": format!("{name} does things")}),
        files: vec![
            SkillFile {
                path: "SKILL.md".into(),
                size: 40,
                executable: false,
                symlink: None,
            },
            SkillFile {
                path: "scripts/run.sh".into(),
                size: 12,
                executable: true,
                symlink: None,
            },
        ],
        archive: archive.to_vec(),
        created_by: "key_1".into(),
    }
}

store_test!(skill_versions_are_numbered_and_kept);
async fn skill_versions_are_numbered_and_kept(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    // Every byte value, so a BLOB/BYTEA round trip that mangles anything shows.
    let v1_bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let v1 = s
        .insert_skill_version(&upload(&a.id, "pdf", &v1_bytes))
        .await
        .expect("v1");
    assert_eq!(v1.version, 1);
    assert_eq!(v1.size, 1000);
    let v2 = s
        .insert_skill_version(&upload(&a.id, "pdf", b"second"))
        .await
        .expect("v2");
    assert_eq!(v2.version, 2);

    let latest = s
        .get_skill_version(&a.id, "pdf", None)
        .await
        .expect("read")
        .expect("latest exists");
    assert_eq!(latest, v2);
    let first = s
        .get_skill_version(&a.id, "pdf", Some(1))
        .await
        .expect("read")
        .expect("v1 exists");
    assert_eq!(first, v1);
    assert_eq!(first.files[1].path, "scripts/run.sh");
    assert!(first.files[1].executable);
    assert_eq!(first.frontmatter["name"], "pdf");
    assert_eq!(
        s.get_skill_version(&a.id, "pdf", Some(3))
            .await
            .expect("read"),
        None
    );
    assert_eq!(
        s.read_skill_archive(&a.id, "pdf", 1)
            .await
            .expect("archive"),
        Some(v1_bytes)
    );
    assert_eq!(
        s.read_skill_archive(&a.id, "pdf", 2)
            .await
            .expect("archive"),
        Some(b"second".to_vec())
    );
    let versions = s.list_skill_versions(&a.id, "pdf").await.expect("versions");
    assert_eq!(versions, vec![v1, v2]);
}

store_test!(skills_are_invisible_to_other_tenants);
async fn skills_are_invisible_to_other_tenants(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    s.insert_skill_version(&upload(&a.id, "pdf", b"a1"))
        .await
        .expect("a's pdf");
    assert_eq!(
        s.get_skill_version(&b.id, "pdf", None).await.expect("read"),
        None
    );
    assert_eq!(
        s.get_skill_version(&b.id, "pdf", Some(1))
            .await
            .expect("read"),
        None
    );
    assert_eq!(
        s.read_skill_archive(&b.id, "pdf", 1).await.expect("read"),
        None
    );
    assert!(
        s.list_skill_versions(&b.id, "pdf")
            .await
            .expect("list")
            .is_empty()
    );
    assert!(
        s.list_skills(&b.id, 10, None)
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_eq!(s.delete_skill(&b.id, "pdf").await.expect("delete"), 0);
    // B's own upload of the same name starts its own numbering.
    let theirs = s
        .insert_skill_version(&upload(&b.id, "pdf", b"b1"))
        .await
        .expect("b's pdf");
    assert_eq!(theirs.version, 1);
    assert_eq!(
        s.read_skill_archive(&a.id, "pdf", 1).await.expect("read"),
        Some(b"a1".to_vec())
    );

    let err = s
        .insert_skill_version(&upload("tnt_missing", "pdf", b"x"))
        .await
        .expect_err("no tenant");
    assert!(matches!(err, StoreError::TenantNotFound(_)), "{err:?}");
    let err = s
        .insert_skill_version(&upload(&a.id, "", b"x"))
        .await
        .expect_err("empty name");
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
}

store_test!(skills_list_latest_versions_by_name_in_pages);
async fn skills_list_latest_versions_by_name_in_pages(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    for name in ["xlsx", "docx", "pdf", "pptx", "Zed"] {
        s.insert_skill_version(&upload(&a.id, name, b"1"))
            .await
            .expect("upload");
    }
    s.insert_skill_version(&upload(&a.id, "pdf", b"22"))
        .await
        .expect("pdf v2");

    let all = s.list_skills(&a.id, 100, None).await.expect("list");
    let names: Vec<(&str, u32)> = all
        .items
        .iter()
        .map(|v| (v.name.as_str(), v.version))
        .collect();
    // Byte order in both dialects (Postgres columns use the "C" collation).
    assert_eq!(
        names,
        vec![
            ("Zed", 1),
            ("docx", 1),
            ("pdf", 2),
            ("pptx", 1),
            ("xlsx", 1)
        ]
    );
    assert_eq!(all.next_cursor, None);

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .list_skills(&a.id, 2, cursor.as_deref())
            .await
            .expect("page");
        assert!(page.items.len() <= 2);
        seen.extend(page.items.into_iter().map(|v| v.name));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, vec!["Zed", "docx", "pdf", "pptx", "xlsx"]);

    let err = s
        .list_skills(&a.id, 2, Some("!!"))
        .await
        .expect_err("bad cursor");
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

store_test!(deleting_a_skill_removes_every_version);
async fn deleting_a_skill_removes_every_version(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    for bytes in [&b"1"[..], b"2", b"3"] {
        s.insert_skill_version(&upload(&a.id, "pdf", bytes))
            .await
            .expect("upload");
    }
    s.insert_skill_version(&upload(&a.id, "docx", b"d"))
        .await
        .expect("docx");
    assert_eq!(s.delete_skill(&a.id, "pdf").await.expect("delete"), 3);
    assert_eq!(
        s.get_skill_version(&a.id, "pdf", None).await.expect("read"),
        None
    );
    assert_eq!(
        s.get_skill_version(&a.id, "pdf", Some(2))
            .await
            .expect("read"),
        None
    );
    assert_eq!(
        s.read_skill_archive(&a.id, "pdf", 1).await.expect("read"),
        None
    );
    assert_eq!(s.delete_skill(&a.id, "pdf").await.expect("again"), 0);
    let left = s.list_skills(&a.id, 10, None).await.expect("list");
    assert_eq!(left.items.len(), 1);
    assert_eq!(left.items[0].name, "docx");
    // A new upload of a deleted name starts again at 1.
    let again = s
        .insert_skill_version(&upload(&a.id, "pdf", b"new"))
        .await
        .expect("re-upload");
    assert_eq!(again.version, 1);
}

store_test!(concurrent_uploads_get_distinct_versions);
async fn concurrent_uploads_get_distinct_versions(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let store = s.clone();
        let new = upload(&a.id, "race", &[i]);
        tasks.push(tokio::spawn(async move {
            store.insert_skill_version(&new).await
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.expect("join").expect("upload").version);
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=8).collect::<Vec<u32>>());
    let stored = s.list_skill_versions(&a.id, "race").await.expect("list");
    assert_eq!(stored.len(), 8);
    assert_eq!(
        s.get_skill_version(&a.id, "race", None)
            .await
            .expect("latest")
            .map(|v| v.version),
        Some(8)
    );
}
