//! The `/v1/jobs` HTTP API and the original design's `/schedule` + `/status/{id}`: submit,
//! inspect, list, cancel. Every handler is tenant-scoped: another tenant's job is a 404.
//! Validation happens here, before anything is queued; running is the runner's.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cella_store::{JobRecord, JobStatus, NewJob};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::control::rfc3339;
use crate::error::{ApiError, json_rejection};
use crate::state::AppState;

/// Longest task accepted.
const MAX_TASK_BYTES: usize = 256 * 1024;
/// How long a cancel request waits for a running job to stop before answering.
const CANCEL_WAIT: Duration = Duration::from_secs(15);

/// Budgets of a job; each is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobLimits {
    /// Most model calls (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Most tokens, input + output over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most USD (needs a configured price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Wall-clock limit in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

/// `POST /v1/jobs` (and `/schedule`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    pub task: String,
    #[serde(default)]
    pub strategy: Option<String>,
    /// `provider/model`; the server's configured model when absent.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub template: Option<String>,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub limits: JobLimits,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Higher runs first (default 0).
    #[serde(default)]
    pub priority: i64,
}

/// The JSON of a job, as `GET /v1/jobs/{id}` returns it.
pub fn job_json(job: &JobRecord) -> Value {
    json!({
        "id": job.id,
        "status": job.status.as_str(),
        "task": job.task,
        "strategy": job.strategy,
        "model": job.model,
        "template": job.template,
        "skills": job.skills,
        "limits": job.limits,
        "metadata": job.metadata,
        "priority": job.priority,
        "attempts": job.attempts,
        "created_at": rfc3339(job.created_at),
        "started_at": job.started_at.map(rfc3339),
        "finished_at": job.finished_at.map(rfc3339),
        "last_event_at": job.last_event_at.map(rfc3339),
        "usage": job.usage,
        "final_answer": job.final_answer,
        "error": job.error,
        "sandbox_id": job.sandbox_id,
        "events": job.last_seq,
    })
}

/// The caller's job `id`; 404 for a missing or another tenant's job.
pub async fn job_of(state: &AppState, caller: &Caller, id: &str) -> Result<JobRecord, ApiError> {
    state
        .store
        .get_job_for_tenant(&caller.tenant.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))
}

/// A new job id: `job_` and 24 hex digits.
fn new_job_id() -> String {
    format!("job_{}", &cella_proto::ids::random_hex(12))
}

/// Checks a submission and turns it into the record to queue.
async fn validate(state: &AppState, caller: &Caller, req: SubmitJob) -> Result<NewJob, ApiError> {
    if req.task.trim().is_empty() {
        return Err(ApiError::bad_request(
            "task is required: say what the agent should do",
        ));
    }
    if req.task.len() > MAX_TASK_BYTES {
        return Err(ApiError::bad_request(format!(
            "task is {} bytes; the limit is {MAX_TASK_BYTES}",
            req.task.len()
        )));
    }
    let strategy = req.strategy.unwrap_or_else(|| "loop".to_owned());
    strategy
        .parse::<cella_agent::Strategy>()
        .map_err(ApiError::bad_request)?;
    let template = req.template.unwrap_or_else(|| "base".to_owned());
    let known = state.manager.backend().templates();
    if !known.contains(&template) {
        return Err(ApiError::bad_request(format!(
            "unknown template {template:?}: known templates are {}",
            known.join(", ")
        )));
    }
    // The model must resolve now, not fail later in the queue.
    super::runner::model_config(state, req.model.as_deref())
        .map_err(|e| ApiError::bad_request(format!("model: {e}")))?;
    super::runner::find_skills(state, caller, &req.skills)
        .await
        .map_err(ApiError::bad_request)?;
    let limits = &req.limits;
    if limits.max_steps == Some(0) {
        return Err(ApiError::bad_request("limits.max_steps must be at least 1"));
    }
    if let Some(t) = limits.timeout_secs {
        let max = state.config.jobs.max_timeout.as_secs();
        if t == 0 || t > max {
            return Err(ApiError::bad_request(format!(
                "limits.timeout_secs must be between 1 and {max}, got {t}"
            )));
        }
    }
    if limits
        .max_cost_usd
        .is_some_and(|c| !(c > 0.0 && c.is_finite()))
    {
        return Err(ApiError::bad_request(
            "limits.max_cost_usd must be a positive number",
        ));
    }
    Ok(NewJob {
        id: new_job_id(),
        tenant_id: caller.tenant.id.clone(),
        task: req.task,
        strategy,
        model: req.model.filter(|m| !m.trim().is_empty()),
        template,
        skills: req.skills,
        limits: serde_json::to_value(&req.limits).unwrap_or(Value::Null),
        metadata: req.metadata,
        priority: req.priority,
    })
}

async fn submit(state: &AppState, caller: &Caller, req: SubmitJob) -> Result<JobRecord, ApiError> {
    let new = validate(state, caller, req).await?;
    let job = state.store.insert_job(&new).await?;
    if let Err(e) = state
        .store
        .record_audit(
            &caller.tenant.id,
            &caller.actor,
            "job.submit",
            &job.id,
            &json!({ "strategy": job.strategy, "template": job.template }),
        )
        .await
    {
        tracing::warn!("writing audit record: {e}");
    }
    tracing::info!(job = %job.id, tenant = %caller.tenant.name, "job submitted");
    state.jobs.wake.notify_one();
    Ok(job)
}

/// `POST /v1/jobs` → 201 `{id, status}`.
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    payload: Result<Json<SubmitJob>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = payload.map_err(json_rejection)?;
    let job = submit(&state, &caller, req).await?;
    let body = json!({ "id": job.id, "status": job.status.as_str() });
    Ok((
        StatusCode::CREATED,
        [("location", format!("/v1/jobs/{}", job.id))],
        Json(body),
    )
        .into_response())
}

/// `GET /v1/jobs/{id}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(job_json(&job_of(&state, &caller, &id).await?)))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// `GET /v1/jobs?status=&limit=&cursor=` → `{jobs, next_cursor}`, newest first.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = q
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<JobStatus>)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > cella_store::MAX_PAGE_LIMIT {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {}",
            cella_store::MAX_PAGE_LIMIT
        )));
    }
    let page = state
        .store
        .list_jobs(&caller.tenant.id, status, limit, q.cursor.as_deref())
        .await
        .map_err(|e| match e {
            cella_store::StoreError::Invalid { .. } => ApiError::bad_request(e.to_string()),
            other => other.into(),
        })?;
    Ok(Json(json!({
        "jobs": page.items.iter().map(job_json).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

/// `POST /v1/jobs/{id}/cancel`: a pending job is cancelled at once; a running one is stopped
/// (its sandbox killed) and the answer waits for that, up to 15 s. Returns the job.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    job_of(&state, &caller, &id).await?;
    let reason = "cancelled by request";
    let job = state
        .store
        .request_job_cancel(&caller.tenant.id, &id, reason)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    if job.status.is_final() {
        state.jobs.hub.close(&id);
        return Ok(Json(job_json(&job)));
    }
    state.jobs.cancel_local(&id, reason);
    let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
    let mut job = job;
    while !job.status.is_final() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        job = job_of(&state, &caller, &id).await?;
    }
    Ok(Json(job_json(&job)))
}

/// `POST /schedule` (the original design): the `/v1/jobs` body → 201 `{job_id}`.
pub async fn schedule(
    State(state): State<AppState>,
    caller: Caller,
    payload: Result<Json<SubmitJob>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = payload.map_err(json_rejection)?;
    let job = submit(&state, &caller, req).await?;
    Ok((StatusCode::CREATED, Json(json!({ "job_id": job.id }))).into_response())
}

/// `GET /status/{id}` (the original design) → `{status, download_url}`.
pub async fn status(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let job = job_of(&state, &caller, &id).await?;
    let path = format!("/v1/jobs/{}/artifacts.zip", job.id);
    let download_url = match headers.get("host").and_then(|h| h.to_str().ok()) {
        Some(host) => format!("http://{host}{path}"),
        None => path,
    };
    Ok(Json(json!({
        "job_id": job.id,
        "status": job.status.as_str(),
        "download_url": download_url,
        "final_answer": job.final_answer,
        "error": job.error,
    })))
}

/// `GET /v1/openapi.json`: the OpenAPI 3.1 description of `/v1`.
pub async fn openapi() -> Response {
    ([("content-type", "application/json")], super::OPENAPI_JSON).into_response()
}
