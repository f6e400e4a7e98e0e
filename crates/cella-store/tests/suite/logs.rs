//! Sandbox logs: E2B's cursor, direction, minimum level and case-sensitive search.

use cella_store::{LogDirection, LogLevel, LogQuery, NewSandboxLog, SandboxLogRecord, StoreError};

use super::{TestDb, at, sandbox, store_test};

pub fn line(level: LogLevel, message: &str, offset_ms: i64) -> NewSandboxLog {
    NewSandboxLog {
        level,
        message: message.to_owned(),
        fields: Default::default(),
        at: at(offset_ms),
    }
}

fn messages(lines: &[SandboxLogRecord]) -> Vec<&str> {
    lines.iter().map(|l| l.message.as_str()).collect()
}

async fn seed(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    s.insert_sandbox(&sandbox("sbx1", &t.id, 0))
        .await
        .expect("insert");
    s.insert_sandbox(&sandbox("sbx2", &t.id, 0))
        .await
        .expect("insert");
    let mut first = line(LogLevel::Info, "sandbox created", 0);
    first.fields.insert("template".into(), "base".into());
    s.append_sandbox_log("sbx1", &first).await.expect("append");
    s.append_sandbox_logs(
        "sbx1",
        &[
            line(LogLevel::Debug, "envd listening", 10),
            line(LogLevel::Warn, "Memory high", 20),
            line(LogLevel::Error, "process crashed: memory", 20),
            line(LogLevel::Info, "paused", 30),
            line(LogLevel::Info, "resumed", 40),
        ],
    )
    .await
    .expect("append batch");
    s.append_sandbox_log("sbx2", &line(LogLevel::Error, "other sandbox", 15))
        .await
        .expect("append other");
}

store_test!(logs_read_forward_and_backward_from_a_cursor);
async fn logs_read_forward_and_backward_from_a_cursor(db: &TestDb) {
    seed(db).await;
    let s = &db.store;
    let all = s
        .list_sandbox_logs("sbx1", &LogQuery::default())
        .await
        .expect("all");
    assert_eq!(
        messages(&all),
        [
            "sandbox created",
            "envd listening",
            "Memory high",
            "process crashed: memory",
            "paused",
            "resumed"
        ]
    );
    assert_eq!(all[0].sandbox_id, "sbx1");
    assert_eq!(all[0].at, at(0));
    assert_eq!(all[0].level, LogLevel::Info);
    assert_eq!(
        all[0].fields.get("template").map(String::as_str),
        Some("base")
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id));

    let q = |cursor: Option<i64>, direction, limit| LogQuery {
        cursor: cursor.map(at),
        direction,
        limit,
        ..Default::default()
    };
    let fwd = s
        .list_sandbox_logs("sbx1", &q(Some(20), LogDirection::Forward, 3))
        .await
        .expect("fwd");
    assert_eq!(
        messages(&fwd),
        ["Memory high", "process crashed: memory", "paused"]
    );
    let back = s
        .list_sandbox_logs("sbx1", &q(Some(20), LogDirection::Backward, 3))
        .await
        .expect("back");
    assert_eq!(
        messages(&back),
        ["process crashed: memory", "Memory high", "envd listening"]
    );
    let tail = s
        .list_sandbox_logs("sbx1", &q(None, LogDirection::Backward, 2))
        .await
        .expect("tail");
    assert_eq!(messages(&tail), ["resumed", "paused"]);
    let past_end = s
        .list_sandbox_logs("sbx1", &q(Some(41), LogDirection::Forward, 10))
        .await
        .expect("end");
    assert!(past_end.is_empty());
    assert!(
        s.list_sandbox_logs("sbx3", &LogQuery::default())
            .await
            .expect("none")
            .is_empty()
    );
}

store_test!(logs_filter_by_minimum_level_and_search);
async fn logs_filter_by_minimum_level_and_search(db: &TestDb) {
    seed(db).await;
    let s = &db.store;
    let warn = s
        .list_sandbox_logs(
            "sbx1",
            &LogQuery {
                min_level: Some(LogLevel::Warn),
                ..Default::default()
            },
        )
        .await
        .expect("warn");
    assert_eq!(messages(&warn), ["Memory high", "process crashed: memory"]);
    let info = s
        .list_sandbox_logs(
            "sbx1",
            &LogQuery {
                min_level: Some(LogLevel::Info),
                ..Default::default()
            },
        )
        .await
        .expect("info");
    assert_eq!(info.len(), 5);

    let search = |needle: &str| LogQuery {
        search: Some(needle.to_owned()),
        ..Default::default()
    };
    let memory = s
        .list_sandbox_logs("sbx1", &search("memory"))
        .await
        .expect("search");
    assert_eq!(
        messages(&memory),
        ["process crashed: memory"],
        "search is case-sensitive"
    );
    let memory = s
        .list_sandbox_logs("sbx1", &search("Memory"))
        .await
        .expect("search");
    assert_eq!(messages(&memory), ["Memory high"]);
    let wild = s
        .list_sandbox_logs("sbx1", &search("%"))
        .await
        .expect("search");
    assert!(wild.is_empty(), "no LIKE wildcards");
    let both = s
        .list_sandbox_logs(
            "sbx1",
            &LogQuery {
                search: Some("e".into()),
                min_level: Some(LogLevel::Error),
                direction: LogDirection::Backward,
                ..Default::default()
            },
        )
        .await
        .expect("both");
    assert_eq!(messages(&both), ["process crashed: memory"]);
}

store_test!(logs_need_an_existing_sandbox);
async fn logs_need_an_existing_sandbox(db: &TestDb) {
    let s = &db.store;
    let err = s
        .append_sandbox_log("nope", &line(LogLevel::Info, "x", 0))
        .await
        .expect_err("no sandbox");
    assert!(
        matches!(&err, StoreError::SandboxNotFound(id) if id == "nope"),
        "{err:?}"
    );
    let t = s.create_tenant("acme").await.expect("tenant");
    s.insert_sandbox(&sandbox("sbx1", &t.id, 0))
        .await
        .expect("insert");
    // A batch is all or nothing.
    let err = s
        .append_sandbox_logs("nope", &[line(LogLevel::Info, "x", 0)])
        .await
        .expect_err("no sandbox");
    assert!(matches!(err, StoreError::SandboxNotFound(_)), "{err:?}");
    assert!(
        s.list_sandbox_logs("sbx1", &LogQuery::default())
            .await
            .expect("list")
            .is_empty()
    );
}
