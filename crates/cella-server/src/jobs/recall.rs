//! A job's own history as the agent's `recall` tool searches it: full-text search over the
//! job's stored events (SQLite FTS5 / Postgres tsvector), scoped to the job and its tenant.
//!
//! This is the storage side of the context manager's recall; cella-agent owns the tool and the
//! trait it calls. Until that trait exists this type is the seam the runner hands over.

use cella_store::{JobEvent, Store};

/// Search over one job's events.
#[derive(Clone)]
pub struct JobHistory {
    store: Store,
    tenant_id: String,
    job_id: String,
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
    pub async fn search(
        &self,
        query: &str,
        limit: u32,
    ) -> Result<Vec<JobEvent>, cella_store::StoreError> {
        self.store
            .search_job_history(&self.tenant_id, &self.job_id, query, limit)
            .await
    }
}
