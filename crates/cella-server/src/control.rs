//! The E2B control plane (`/sandboxes`, `/v2/sandboxes`, …) as the official SDKs call it:
//! create, inspect, list, kill, timeouts, pause/resume/connect, metrics and logs. Every handler
//! is tenant-scoped: another tenant's sandbox is a 404.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::{ApiError, json_rejection};
use crate::gateway::percent_decode;
use crate::lifecycle;
use crate::state::AppState;

/// `NewSandbox` as the SDK sends it; unknown fields are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    pub timeout: Option<i64>,
    #[serde(default)]
    pub secure: bool,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        rename = "allow_internet_access",
        alias = "allowInternetAccess"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub network: Option<Value>,
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// cella extension: skills to mount at `/skills/<name>` (`name` or `name@VERSION`).
    #[serde(default)]
    pub skills: Option<Vec<String>>,
}

fn body<T>(payload: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    payload.map(|Json(v)| v).map_err(json_rejection)
}

/// Optional JSON bodies (`pause`, `connect`): empty means defaults.
fn optional_body<T: for<'de> Deserialize<'de> + Default>(raw: &[u8]) -> Result<T, ApiError> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(raw)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn timeout_secs(state: &AppState, requested: Option<i64>) -> Result<u64, ApiError> {
    match requested {
        None => Ok(state.config.default_timeout_secs),
        Some(t) if t < 0 => Err(ApiError::bad_request(format!(
            "timeout must be a non-negative number of seconds, got {t}"
        ))),
        Some(t) if t as u64 > state.config.max_timeout_secs => Err(ApiError::bad_request(format!(
            "timeout {t} s exceeds the maximum of {} s",
            state.config.max_timeout_secs
        ))),
        Some(0) => Ok(state.config.default_timeout_secs),
        Some(t) => Ok(t as u64),
    }
}

/// `POST /v2/sandboxes` (SDK ≥ 2.50): the same request, always secured with an access token.
pub async fn create_v2(
    state: State<AppState>,
    caller: Caller,
    payload: Result<Json<NewSandbox>, JsonRejection>,
) -> Result<Response, ApiError> {
    let mut req = body(payload)?;
    req.secure = true;
    create_from(state, caller, req).await
}

pub async fn create(
    state: State<AppState>,
    caller: Caller,
    payload: Result<Json<NewSandbox>, JsonRejection>,
) -> Result<Response, ApiError> {
    create_from(state, caller, body(payload)?).await
}

/// E2B's names for templates cella ships under its own: the code-interpreter SDK creates
/// `code-interpreter-v1` by default.
fn template_alias(name: &str) -> &str {
    match name {
        "code-interpreter-v1" => "code-interpreter",
        other => other,
    }
}

async fn create_from(
    State(state): State<AppState>,
    caller: Caller,
    req: NewSandbox,
) -> Result<Response, ApiError> {
    let template = req
        .template_id
        .filter(|t| !t.trim().is_empty())
        .map(|t| template_alias(&t).to_string())
        .ok_or_else(|| ApiError::bad_request("templateID is required"))?;
    let timeout = timeout_secs(&state, req.timeout)?;
    let network =
        crate::network::policy_for_create(req.allow_internet_access, req.network.as_ref())?;
    let skills = crate::skills_api::mounts_for_create(
        &state,
        &caller,
        req.skills.as_deref(),
        req.metadata.as_ref(),
    )
    .await?;
    let created = lifecycle::create(
        &state,
        &caller,
        lifecycle::CreateRequest {
            template,
            timeout: Duration::from_secs(timeout),
            secure: req.secure,
            metadata: req.metadata.unwrap_or_default(),
            envs: req.env_vars.unwrap_or_default(),
            skills,
            network: network.policy,
            public_traffic: network.public_traffic,
            ..Default::default()
        },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&created))).into_response())
}

/// The `Sandbox` object (create/connect/resume answers).
fn sandbox_json(r: &cella_store::SandboxRecord) -> Value {
    json!({
        "templateID": r.template_id,
        "sandboxID": r.id,
        "clientID": "cella",
        "envdVersion": cella_proto::ENVD_VERSION,
        "envdAccessToken": r.envd_access_token,
        "trafficAccessToken": r.traffic_access_token,
        "domain": Value::Null,
        "alias": r.template_id,
    })
}

fn state_name(s: cella_store::SandboxState) -> &'static str {
    match s {
        cella_store::SandboxState::Paused => "paused",
        _ => "running",
    }
}

/// `ListedSandbox` (and, with tokens, `SandboxDetail`).
fn listed_json(r: &cella_store::SandboxRecord) -> Value {
    json!({
        "templateID": r.template_id,
        "alias": r.template_id,
        "sandboxID": r.id,
        "clientID": "cella",
        "startedAt": rfc3339(r.started_at),
        "endAt": rfc3339(r.end_at),
        "cpuCount": r.cpu_count,
        "memoryMB": r.memory_mb,
        "diskSizeMB": r.disk_mb,
        "metadata": r.metadata,
        "state": state_name(r.state),
        "envdVersion": cella_proto::ENVD_VERSION,
    })
}

pub async fn get_one(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let r = lifecycle::live_record(&state, &caller, &id).await?;
    let mut v = listed_json(&r);
    v["envdAccessToken"] = json!(r.envd_access_token);
    crate::network::describe(&r.spec, &mut v);
    v["domain"] = Value::Null;
    Ok(Json(v))
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
    order: Option<String>,
}

fn parse_metadata_filter(raw: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(vec![]);
    };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid metadata filter {pair:?}: expected key=value"
                ))
            })?;
            Ok((percent_decode(k), percent_decode(v)))
        })
        .collect()
}

async fn list_impl(
    state: &AppState,
    caller: &Caller,
    q: ListQuery,
    default_states: &[cella_store::SandboxState],
) -> Result<(Vec<Value>, Option<String>), ApiError> {
    let states = match q.state.as_deref().filter(|s| !s.is_empty()) {
        None => default_states.to_vec(),
        Some(s) => s
            .split(',')
            .map(|x| match x.trim() {
                "running" => Ok(cella_store::SandboxState::Running),
                "paused" => Ok(cella_store::SandboxState::Paused),
                other => Err(ApiError::bad_request(format!(
                    "invalid state {other:?}: use running or paused"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let limit = match q.limit.as_deref() {
        None | Some("") => 100,
        Some(l) => match l.parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid limit {l:?}: use 1 to 100"
                )));
            }
        },
    };
    let order = match q.order.as_deref() {
        None | Some("") | Some("desc") => cella_store::SortOrder::Desc,
        Some("asc") => cella_store::SortOrder::Asc,
        Some(o) => {
            return Err(ApiError::bad_request(format!(
                "invalid order {o:?}: use asc or desc"
            )));
        }
    };
    let filter = cella_store::SandboxFilter {
        states,
        metadata: parse_metadata_filter(q.metadata.as_deref())?,
        ..Default::default()
    };
    let page = state
        .store
        .list_sandboxes(
            &caller.tenant.id,
            &filter,
            &cella_store::PageRequest {
                order,
                limit,
                cursor: q.next_token.filter(|t| !t.is_empty()),
            },
        )
        .await
        .map_err(|e| match e {
            cella_store::StoreError::Invalid {
                what: "page cursor",
                ..
            } => {
                ApiError::bad_request("invalid nextToken: pass the X-Next-Token of a previous page")
            }
            other => other.into(),
        })?;
    Ok((
        page.items.iter().map(listed_json).collect(),
        page.next_cursor,
    ))
}

pub async fn list_v2(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (items, next) = list_impl(
        &state,
        &caller,
        q,
        &[
            cella_store::SandboxState::Running,
            cella_store::SandboxState::Paused,
        ],
    )
    .await?;
    let mut headers = HeaderMap::new();
    if let Some(n) = next
        && let Ok(v) = HeaderValue::from_str(&n)
    {
        headers.insert("x-next-token", v);
    }
    Ok((headers, Json(items)).into_response())
}

pub async fn list_legacy(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let q = ListQuery {
        limit: Some("100".into()),
        ..q
    };
    let (items, _) = list_impl(
        &state,
        &caller,
        q,
        &[
            cella_store::SandboxState::Running,
            cella_store::SandboxState::Paused,
        ],
    )
    .await?;
    Ok(Json(items))
}

pub async fn kill(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    lifecycle::kill(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, Default)]
pub struct TimeoutBody {
    timeout: Option<i64>,
}

pub async fn set_timeout(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let b: TimeoutBody = optional_body(&raw)?;
    let t = b
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout is required"))?;
    let secs = timeout_secs(&state, Some(t))?;
    lifecycle::set_end(
        &state,
        &caller,
        &id,
        SystemTime::now() + Duration::from_secs(if t == 0 { 0 } else { secs }),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, Default)]
pub struct RefreshBody {
    duration: Option<i64>,
}

pub async fn refresh(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let b: RefreshBody = optional_body(&raw)?;
    let d = b.duration.unwrap_or(60);
    if !(0..=3600).contains(&d) {
        return Err(ApiError::bad_request(format!(
            "duration must be between 0 and 3600 seconds, got {d}"
        )));
    }
    lifecycle::set_end(
        &state,
        &caller,
        &id,
        SystemTime::now() + Duration::from_secs(d as u64),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    lifecycle::pause(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let b: TimeoutBody = optional_body(&raw)?;
    let timeout = b
        .timeout
        .map(|t| timeout_secs(&state, Some(t)))
        .transpose()?;
    let r = lifecycle::resume(
        &state,
        &caller,
        &id,
        timeout.map(Duration::from_secs),
        false,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&r.record))).into_response())
}

pub async fn connect(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let b: TimeoutBody = optional_body(&raw)?;
    let timeout = b
        .timeout
        .map(|t| timeout_secs(&state, Some(t)))
        .transpose()?;
    let r = lifecycle::resume(&state, &caller, &id, timeout.map(Duration::from_secs), true).await?;
    let status = if r.resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(sandbox_json(&r.record))).into_response())
}

pub async fn metrics(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let r = lifecycle::live_record(&state, &caller, &id).await?;
    let sample = lifecycle::sample_metrics(&state, &r).await?;
    Ok(Json(vec![sample]))
}

#[derive(Debug, Deserialize, Default)]
pub struct LogsQuery {
    cursor: Option<i64>,
    limit: Option<u32>,
    direction: Option<String>,
    level: Option<String>,
    search: Option<String>,
}

pub async fn logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Json<Value>, ApiError> {
    let r = lifecycle::any_record(&state, &caller, &id).await?;
    let direction = match q.direction.as_deref() {
        None | Some("") | Some("forward") => cella_store::LogDirection::Forward,
        Some("backward") => cella_store::LogDirection::Backward,
        Some(d) => {
            return Err(ApiError::bad_request(format!(
                "invalid direction {d:?}: use forward or backward"
            )));
        }
    };
    let level = match q.level.as_deref() {
        None | Some("") => None,
        Some("debug") => Some(cella_store::LogLevel::Debug),
        Some("info") => Some(cella_store::LogLevel::Info),
        Some("warn") => Some(cella_store::LogLevel::Warn),
        Some("error") => Some(cella_store::LogLevel::Error),
        Some(l) => {
            return Err(ApiError::bad_request(format!(
                "invalid level {l:?}: use debug, info, warn or error"
            )));
        }
    };
    let query = cella_store::LogQuery {
        cursor: q.cursor.and_then(DateTime::<Utc>::from_timestamp_millis),
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
        direction,
        min_level: level,
        search: q.search.filter(|s| !s.is_empty()),
    };
    let logs = state.store.list_sandbox_logs(&r.id, &query).await?;
    let logs: Vec<Value> = logs
        .iter()
        .map(|l| json!({ "timestamp": rfc3339(l.at), "level": l.level.to_string(), "message": l.message, "fields": {} }))
        .collect();
    Ok(Json(json!({ "logs": logs })))
}

pub async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}
