//! A job's own history as the agent's `recall` tool searches it: full-text search over the
//! job's stored events (SQLite FTS5 / Postgres tsvector), scoped to the job and its tenant, and
//! the lookup of one tool call by its id.
//!
//! This is the storage side of the context manager's recall: cella-agent owns the tool and the
//! `Recall` trait it calls; `JobHistory` implements it over the store (stored events are
//! indexed already, so `remember` is the trait's no-op).

use cella_store::{JobEvent, MAX_EVENT_LIMIT, Store, StoreError};
use serde_json::Value;

/// One remembered thing: a tool call with its output, or another event's text.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryItem {
    /// The tool call's id, or `event-<seq>` for other events.
    pub id: String,
    /// The model call it belongs to (0 when the event has none).
    pub step: u32,
    /// One line saying what it is (`step 3 · bash`).
    pub label: String,
    pub text: String,
}

/// Search over one job's events.
#[derive(Clone)]
pub struct JobHistory {
    store: Store,
    tenant_id: String,
    job_id: String,
}

fn item(e: &JobEvent) -> HistoryItem {
    let p = &e.payload;
    let step = p["step"]
        .as_u64()
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(0);
    let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match e.kind.as_str() {
        "tool_result" | "tool_call_started" => HistoryItem {
            id: text_of(&p["id"]),
            step,
            label: format!("step {step} · {}", text_of(&p["name"])),
            text: if e.kind == "tool_result" {
                text_of(&p["output"])
            } else {
                text_of(&p["arguments"])
            },
        },
        kind => HistoryItem {
            id: format!("event-{}", e.seq),
            step,
            label: kind.to_owned(),
            text: ["text", "message", "reason", "code", "output"]
                .iter()
                .find_map(|k| p[*k].as_str())
                .map_or_else(|| p.to_string(), str::to_owned),
        },
    }
}

impl JobHistory {
    pub fn new(store: Store, tenant_id: &str, job_id: &str) -> Self {
        JobHistory {
            store,
            tenant_id: tenant_id.to_owned(),
            job_id: job_id.to_owned(),
        }
    }

    /// Events whose text contains every word of `query`, best first, at most `limit`.
    pub async fn search(&self, query: &str, limit: u32) -> Result<Vec<HistoryItem>, StoreError> {
        Ok(self
            .store
            .search_job_history(&self.tenant_id, &self.job_id, query, limit)
            .await?
            .iter()
            .map(item)
            .collect())
    }

    /// The tool call with id `id`: its arguments and its whole output.
    pub async fn entry(&self, id: &str) -> Result<Option<HistoryItem>, StoreError> {
        if self
            .store
            .get_job_for_tenant(&self.tenant_id, &self.job_id)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let (mut call, mut result) = (None, None);
        let mut after = 0;
        loop {
            let events = self
                .store
                .list_job_events(&self.job_id, after, MAX_EVENT_LIMIT)
                .await?;
            let Some(last) = events.last() else { break };
            after = last.seq;
            for e in &events {
                if e.payload["id"].as_str() == Some(id) {
                    match e.kind.as_str() {
                        "tool_call_started" => call = Some(item(e)),
                        "tool_result" => result = Some(item(e)),
                        _ => {}
                    }
                }
            }
        }
        Ok(match (call, result) {
            (Some(c), Some(r)) => Some(HistoryItem {
                text: format!("arguments: {}\noutput:\n{}", c.text, r.text),
                ..r
            }),
            (c, r) => r.or(c),
        })
    }
}

/// Lines of an entry shown in a search hit (the agent fetches the rest with `recall {"id"}`).
const EXCERPT_LINES: usize = 40;
/// Characters of an entry shown in a search hit.
const EXCERPT_CHARS: usize = 4000;

fn excerpt(text: &str) -> String {
    let mut out: String = text
        .lines()
        .take(EXCERPT_LINES)
        .collect::<Vec<_>>()
        .join("\n");
    if out.len() > EXCERPT_CHARS {
        let mut end = EXCERPT_CHARS;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

impl cella_agent::Recall for JobHistory {
    fn search<'a>(
        &'a self,
        query: &'a str,
        limit: usize,
    ) -> cella_llm::BoxFuture<'a, Result<Vec<cella_agent::Hit>, cella_agent::RecallError>> {
        Box::pin(async move {
            let limit = u32::try_from(limit).unwrap_or(u32::MAX);
            let items = JobHistory::search(self, query, limit)
                .await
                .map_err(|e| cella_agent::RecallError(e.to_string()))?;
            let n = items.len();
            Ok(items
                .into_iter()
                .enumerate()
                .map(|(rank, it)| cella_agent::Hit {
                    source: cella_agent::HitSource::History,
                    excerpt: excerpt(&it.text),
                    id: it.id,
                    label: it.label,
                    // The store ranks them; keep its order.
                    score: (n - rank) as f64,
                })
                .collect())
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a str,
    ) -> cella_llm::BoxFuture<'a, Result<Option<cella_agent::HistoryEntry>, cella_agent::RecallError>>
    {
        Box::pin(async move {
            Ok(self
                .entry(id)
                .await
                .map_err(|e| cella_agent::RecallError(e.to_string()))?
                .map(|it| cella_agent::HistoryEntry {
                    id: it.id,
                    step: it.step,
                    label: it.label,
                    text: it.text,
                }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn finds_tool_calls_by_words_and_by_id_within_the_tenants_job() {
        let store = Store::open_in_memory().await.expect("store");
        let t = store.create_tenant("acme").await.expect("tenant");
        let other = store.create_tenant("other").await.expect("tenant");
        store
            .insert_job(&cella_store::NewJob {
                id: "job_1".into(),
                tenant_id: t.id.clone(),
                task: "t".into(),
                strategy: "loop".into(),
                model: None,
                template: "base".into(),
                skills: vec![],
                limits: json!({}),
                metadata: Default::default(),
                priority: 0,
            })
            .await
            .expect("job");
        store
            .append_job_event(
                "job_1",
                "tool_call_started",
                &json!({"type": "tool_call_started", "step": 2, "id": "call_7", "name": "bash", "arguments": "{\"command\":\"pytest\"}"}),
            )
            .await
            .expect("event");
        store
            .append_job_event(
                "job_1",
                "tool_result",
                &json!({"type": "tool_result", "step": 2, "id": "call_7", "name": "bash", "output": "FAILED test_parser.py::test_dates - KeyError"}),
            )
            .await
            .expect("event");
        let history = JobHistory::new(store.clone(), &t.id, "job_1");
        let hits = history.search("keyerror dates", 5).await.expect("search");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].id, "call_7");
        assert_eq!(hits[0].label, "step 2 · bash");
        let entry = history
            .entry("call_7")
            .await
            .expect("entry")
            .expect("found");
        assert!(
            entry.text.contains("pytest") && entry.text.contains("KeyError"),
            "{entry:?}"
        );
        assert_eq!(history.entry("call_8").await.expect("entry"), None);
        // The same through the agent's `Recall` trait (what the `recall` tool calls).
        let recall: &dyn cella_agent::Recall = &history;
        let hits = recall.search("keyerror dates", 5).await.expect("search");
        assert_eq!(hits.len(), 1);
        assert_eq!(
            (hits[0].source, hits[0].id.as_str()),
            (cella_agent::HitSource::History, "call_7")
        );
        assert!(hits[0].excerpt.contains("KeyError"));
        let got = recall.get("call_7").await.expect("get").expect("found");
        assert_eq!((got.id.as_str(), got.step), ("call_7", 2));
        assert!(got.text.contains("pytest") && got.text.contains("KeyError"));
        let foreign = JobHistory::new(store, &other.id, "job_1");
        assert!(
            foreign
                .search("keyerror", 5)
                .await
                .expect("search")
                .is_empty()
        );
        assert_eq!(foreign.entry("call_7").await.expect("entry"), None);
    }
}
