//! The job queue: records, events numbered per job, claims honouring priority and per-node and
//! per-tenant concurrency (also under concurrent claimers), cancellation, retries, orphans
//! after a restart, and full-text search over a job's history.

use std::collections::BTreeSet;
use std::time::Duration;

use cella_store::{
    ClaimRequest, JOB_FINISHED_EVENT, JobOutcome, JobStatus, NewJob, Store, StoreError,
};
use serde_json::json;

use super::{TestDb, store_test};

fn job(id: &str, tenant_id: &str, priority: i64) -> NewJob {
    NewJob {
        id: id.to_owned(),
        tenant_id: tenant_id.to_owned(),
        task: format!("task of {id}"),
        strategy: "loop".to_owned(),
        model: Some("openai/gpt-4.1".to_owned()),
        template: "base".to_owned(),
        skills: vec!["pdf".to_owned()],
        limits: json!({"max_steps": 5}),
        metadata: [("team".to_owned(), "a".to_owned())].into(),
        priority,
    }
}

fn claim(node: &str, node_limit: u32, tenant_limit: u32) -> ClaimRequest {
    ClaimRequest {
        node: node.to_owned(),
        node_limit,
        tenant_limit,
        lease: Duration::from_secs(30),
    }
}

async fn claimed_id(s: &Store, req: &ClaimRequest) -> Option<String> {
    s.claim_job(req).await.expect("claim").map(|j| j.id)
}

fn complete(answer: &str) -> JobOutcome {
    JobOutcome {
        status: JobStatus::Complete,
        final_answer: Some(answer.to_owned()),
        error: None,
        usage: Some(json!({"input_tokens": 10, "output_tokens": 5})),
    }
}

store_test!(jobs_are_stored_listed_and_scoped_to_their_tenant);
async fn jobs_are_stored_listed_and_scoped_to_their_tenant(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    let first = s.insert_job(&job("job1", &a.id, 0)).await.expect("insert");
    assert_eq!(first.status, JobStatus::Pending);
    assert_eq!(first.skills, ["pdf"]);
    assert_eq!(first.limits, json!({"max_steps": 5}));
    assert_eq!(first.metadata["team"], "a");
    assert_eq!((first.attempts, first.last_seq), (0, 0));
    assert!(first.started_at.is_none() && first.finished_at.is_none());
    for i in 2..=5 {
        s.insert_job(&job(&format!("job{i}"), &a.id, 0))
            .await
            .expect("insert");
    }
    s.insert_job(&job("other", &b.id, 0)).await.expect("insert");
    let dup = s.insert_job(&job("job1", &a.id, 0)).await;
    assert!(matches!(dup, Err(StoreError::Invalid { .. })), "{dup:?}");
    let orphan = s.insert_job(&job("x", "tnt_missing", 0)).await;
    assert!(
        matches!(orphan, Err(StoreError::TenantNotFound(_))),
        "{orphan:?}"
    );

    assert_eq!(
        s.get_job_for_tenant(&a.id, "job1").await.expect("get"),
        Some(first.clone())
    );
    assert_eq!(
        s.get_job_for_tenant(&b.id, "job1").await.expect("get"),
        None
    );

    // Pages of two, newest first, over all five of a's jobs.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .list_jobs(&a.id, None, 2, cursor.as_deref())
            .await
            .expect("page");
        seen.extend(page.items.iter().map(|j| j.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, ["job1", "job2", "job3", "job4", "job5"]);
    assert_eq!(seen.len(), 5);
    let bad = s.list_jobs(&a.id, None, 2, Some("garbage!")).await;
    assert!(matches!(bad, Err(StoreError::Invalid { .. })), "{bad:?}");

    let running = s
        .claim_job(&claim("n1", 10, 10))
        .await
        .expect("claim")
        .expect("a job");
    let only_running = s
        .list_jobs(&a.id, Some(JobStatus::Running), 10, None)
        .await
        .expect("list");
    let ids: Vec<_> = only_running.items.iter().map(|j| j.id.as_str()).collect();
    if running.tenant_id == a.id {
        assert_eq!(ids, [running.id.as_str()]);
    } else {
        assert!(ids.is_empty());
    }
}

store_test!(events_are_numbered_per_job_and_the_last_one_ends_the_job);
async fn events_are_numbered_per_job_and_the_last_one_ends_the_job(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    s.insert_job(&job("j1", &t.id, 0)).await.expect("insert");
    s.insert_job(&job("j2", &t.id, 0)).await.expect("insert");
    let e1 = s
        .append_job_event("j1", "run_started", &json!({"model": "m"}))
        .await
        .expect("append");
    let other = s
        .append_job_event("j2", "run_started", &json!({}))
        .await
        .expect("append");
    let e2 = s
        .append_job_event("j1", "text_delta", &json!({"text": "hi"}))
        .await
        .expect("append");
    assert_eq!((e1.seq, e2.seq, other.seq), (1, 2, 1));
    let missing = s.append_job_event("nope", "x", &json!({})).await;
    assert!(
        matches!(missing, Err(StoreError::Invalid { .. })),
        "{missing:?}"
    );

    let all = s.list_job_events("j1", 0, 100).await.expect("list");
    assert_eq!(all, vec![e1.clone(), e2.clone()]);
    assert_eq!(
        s.list_job_events("j1", 1, 100).await.expect("list"),
        vec![e2]
    );
    assert_eq!(s.list_job_events("j1", 0, 1).await.expect("list"), vec![e1]);

    let running = s
        .claim_job(&claim("n1", 10, 10))
        .await
        .expect("claim")
        .expect("job");
    assert_eq!(running.status, JobStatus::Running);
    assert_eq!(running.node.as_deref(), Some("n1"));
    assert_eq!(running.attempts, 1);
    assert!(running.started_at.is_some() && running.lease_expires_at.is_some());
    // Only the node that runs it may finish it that way.
    assert!(
        s.finish_job(&running.id, Some("n2"), &complete("no"))
            .await
            .expect("finish")
            .is_none()
    );
    let (done, last) = s
        .finish_job(&running.id, Some("n1"), &complete("42"))
        .await
        .expect("finish")
        .expect("finished");
    assert_eq!(done.status, JobStatus::Complete);
    assert_eq!(done.final_answer.as_deref(), Some("42"));
    assert_eq!(
        done.usage,
        Some(json!({"input_tokens": 10, "output_tokens": 5}))
    );
    assert!(done.finished_at.is_some() && done.lease_expires_at.is_none());
    assert_eq!(last.kind, JOB_FINISHED_EVENT);
    assert_eq!(last.payload["status"], "complete");
    assert_eq!(last.payload["final_answer"], "42");
    assert_eq!(done.last_seq, last.seq);
    assert_eq!(
        s.list_job_events(&running.id, 0, 100)
            .await
            .expect("list")
            .last(),
        Some(&last)
    );
    // Final is final.
    assert!(
        s.finish_job(&running.id, None, &complete("again"))
            .await
            .expect("finish")
            .is_none()
    );
    let not_final = s
        .finish_job(
            "j2",
            None,
            &JobOutcome {
                status: JobStatus::Running,
                final_answer: None,
                error: None,
                usage: None,
            },
        )
        .await;
    assert!(matches!(not_final, Err(StoreError::Invalid { .. })));
}

store_test!(claims_follow_priority_and_concurrency_limits);
async fn claims_follow_priority_and_concurrency_limits(db: &TestDb) {
    let s = &db.store;
    let a = s.create_tenant("a").await.expect("tenant a");
    let b = s.create_tenant("b").await.expect("tenant b");
    s.insert_job(&job("a-low", &a.id, 0)).await.expect("insert");
    s.insert_job(&job("a-high", &a.id, 5))
        .await
        .expect("insert");
    s.insert_job(&job("a-low2", &a.id, 0))
        .await
        .expect("insert");
    s.insert_job(&job("b-low", &b.id, 0)).await.expect("insert");

    // Tenant limit 1: a's best job, then b's (a is at its limit), then nothing.
    let req = claim("n1", 10, 1);
    assert_eq!(claimed_id(s, &req).await.as_deref(), Some("a-high"));
    assert_eq!(claimed_id(s, &req).await.as_deref(), Some("b-low"));
    assert_eq!(claimed_id(s, &req).await, None);
    // Node limit: n1 has 2 running; with a node limit of 2 it takes nothing more even when
    // tenants have room, while n2 can.
    let wide = claim("n1", 2, 10);
    assert_eq!(claimed_id(s, &wide).await, None);
    assert_eq!(s.count_running_jobs("n1").await.expect("count"), 2);
    let other_node = claim("n2", 1, 10);
    assert_eq!(claimed_id(s, &other_node).await.as_deref(), Some("a-low"));
    assert_eq!(claimed_id(s, &other_node).await, None);
    // Oldest first among equal priorities.
    assert_eq!(
        claimed_id(s, &claim("n3", 5, 10)).await.as_deref(),
        Some("a-low2")
    );
    assert_eq!(claimed_id(s, &claim("n3", 5, 10)).await, None);
}

store_test!(concurrent_claimers_never_exceed_the_tenant_limit);
async fn concurrent_claimers_never_exceed_the_tenant_limit(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("busy").await.expect("tenant");
    for i in 0..20 {
        s.insert_job(&job(&format!("j{i:02}"), &t.id, 0))
            .await
            .expect("insert");
    }
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = s.clone();
        tasks.push(tokio::spawn(async move {
            let req = claim(&format!("node{n}"), 10, 3);
            let mut got = Vec::new();
            for _ in 0..5 {
                if let Some(j) = store.claim_job(&req).await.expect("claim") {
                    got.push(j.id);
                }
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(unique.len(), all.len(), "a job was claimed twice: {all:?}");
    assert_eq!(all.len(), 3, "tenant limit 3, claimed {all:?}");
}

store_test!(cancels_retries_and_orphans);
async fn cancels_retries_and_orphans(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    let other = s.create_tenant("other").await.expect("tenant");
    s.insert_job(&job("pending", &t.id, 0))
        .await
        .expect("insert");
    // Another tenant cannot cancel it.
    assert_eq!(
        s.request_job_cancel(&other.id, "pending", "no")
            .await
            .expect("cancel"),
        None
    );
    let cancelled = s
        .request_job_cancel(&t.id, "pending", "cancelled by request")
        .await
        .expect("cancel")
        .expect("job");
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("cancelled by request"));
    let events = s.list_job_events("pending", 0, 10).await.expect("events");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload["status"], "cancelled");

    s.insert_job(&job("running", &t.id, 0))
        .await
        .expect("insert");
    let req = claim("n1", 10, 10);
    assert_eq!(claimed_id(s, &req).await.as_deref(), Some("running"));
    let renewed = s
        .renew_job_lease("running", "n1", Duration::from_secs(60))
        .await
        .expect("renew")
        .expect("still ours");
    assert_eq!(renewed.cancel_reason, None);
    assert!(
        s.renew_job_lease("running", "n2", Duration::from_secs(60))
            .await
            .expect("renew")
            .is_none()
    );
    // A retry puts it back in the queue; the next claim counts a second attempt.
    assert!(
        s.requeue_job("running", "n1", "model overloaded")
            .await
            .expect("requeue")
    );
    let again = s.claim_job(&req).await.expect("claim").expect("job");
    assert_eq!((again.id.as_str(), again.attempts), ("running", 2));
    let kinds: Vec<String> = s
        .list_job_events("running", 0, 10)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["job_retry"]);
    // A cancel of a running job is a request its runner sees when renewing.
    let still = s
        .request_job_cancel(&t.id, "running", "stop it")
        .await
        .expect("cancel")
        .expect("job");
    assert_eq!(still.status, JobStatus::Running);
    let seen = s
        .renew_job_lease("running", "n1", Duration::from_secs(60))
        .await
        .expect("renew")
        .expect("ours");
    assert_eq!(seen.cancel_reason.as_deref(), Some("stop it"));
    assert!(!s.requeue_job("running", "n1", "x").await.expect("requeue"));

    // After a restart of n1, its running jobs are orphans; n2's live lease is not.
    s.insert_job(&job("elsewhere", &t.id, 0))
        .await
        .expect("insert");
    assert_eq!(
        claimed_id(s, &claim("n2", 10, 10)).await.as_deref(),
        Some("elsewhere")
    );
    let orphans: Vec<String> = s
        .list_orphaned_jobs("n1")
        .await
        .expect("orphans")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(orphans, ["running"]);
    s.insert_job(&job("expired", &t.id, 0))
        .await
        .expect("insert");
    let mut short = claim("n3", 10, 10);
    short.lease = Duration::ZERO;
    assert_eq!(claimed_id(s, &short).await.as_deref(), Some("expired"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let orphans: BTreeSet<String> = s
        .list_orphaned_jobs("n1")
        .await
        .expect("orphans")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(orphans, ["expired".to_owned(), "running".to_owned()].into());
}

store_test!(history_search_finds_words_in_one_tenants_job);
async fn history_search_finds_words_in_one_tenants_job(db: &TestDb) {
    let s = &db.store;
    let t = s.create_tenant("acme").await.expect("tenant");
    let other = s.create_tenant("other").await.expect("tenant");
    s.insert_job(&job("j1", &t.id, 0)).await.expect("insert");
    s.insert_job(&job("j2", &t.id, 0)).await.expect("insert");
    s.append_job_event(
        "j1",
        "tool_result",
        &json!({"name": "bash", "output": "Traceback: ZeroDivisionError in compute.py", "exit_code": 1}),
    )
    .await
    .expect("append");
    s.append_job_event(
        "j1",
        "text_delta",
        &json!({"text": "the answer is forty-two"}),
    )
    .await
    .expect("append");
    s.append_job_event(
        "j1",
        "tool_call_started",
        &json!({"name": "write_file", "arguments": "{\"path\": \"compute.py\"}"}),
    )
    .await
    .expect("append");
    s.append_job_event(
        "j2",
        "text_delta",
        &json!({"text": "ZeroDivisionError elsewhere"}),
    )
    .await
    .expect("append");

    let hits = s
        .search_job_history(&t.id, "j1", "zerodivisionerror", 10)
        .await
        .expect("search");
    assert_eq!(hits.iter().map(|h| h.seq).collect::<Vec<_>>(), [1]);
    assert_eq!(hits[0].kind, "tool_result");
    // Every word must occur; order and case do not matter.
    let both = s
        .search_job_history(&t.id, "j1", "Forty answer", 10)
        .await
        .expect("search");
    assert_eq!(both.iter().map(|h| h.seq).collect::<Vec<_>>(), [2]);
    assert!(
        s.search_job_history(&t.id, "j1", "answer traceback", 10)
            .await
            .expect("search")
            .is_empty()
    );
    // JSON keys are not content; quotes and operators in the query are just words.
    assert!(
        s.search_job_history(&t.id, "j1", "exit_code", 10)
            .await
            .expect("search")
            .is_empty()
    );
    assert!(
        s.search_job_history(&t.id, "j1", "\" OR NOT (", 10)
            .await
            .expect("search")
            .is_empty()
    );
    let limited = s
        .search_job_history(&t.id, "j1", "compute", 1)
        .await
        .expect("search");
    assert_eq!(limited.len(), 1);
    assert!(
        s.search_job_history(&other.id, "j1", "zerodivisionerror", 10)
            .await
            .expect("search")
            .is_empty()
    );
}
