//! Sandbox lifecycle as the server runs it: the manager does the work, the store remembers it
//! (so sandboxes survive a restart of the server), the gateway cache and metrics follow, and
//! every change is audited and logged per sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cella_sandbox::{Sandbox, SandboxSpec};
use cella_store::{SandboxRecord, SandboxState};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::{AppState, GatewayEntry};

#[derive(Default)]
pub struct CreateRequest {
    pub template: String,
    pub timeout: Duration,
    pub secure: bool,
    pub metadata: BTreeMap<String, String>,
    pub envs: BTreeMap<String, String>,
    /// A host directory bound at `/workspace` (jobs keep their workspace on the host).
    pub workdir: Option<std::path::PathBuf>,
    /// Skill mounts (name → extracted directory), resolved by `skills_api`.
    pub skills: BTreeMap<String, std::path::PathBuf>,
    /// E2B's `network.allowPublicTraffic` (default true); false mints a traffic access token.
    pub public_traffic: bool,
    pub network: cella_sandbox::network::NetworkPolicy,
}

fn to_utc(t: SystemTime) -> DateTime<Utc> {
    cella_store::truncate_to_millis(DateTime::<Utc>::from(t))
}

/// What a sandbox of `template` is built from before a request adds its own settings: the
/// template's default resources over the standard ones (E2B's create carries none). Warm pools
/// are filled from this, so a plain create matches them. An unknown or unbuilt template is an
/// error naming the known ones (a 400).
pub fn template_spec(
    backend: &dyn cella_sandbox::Backend,
    template: &str,
) -> Result<SandboxSpec, cella_sandbox::SandboxError> {
    let limits = backend.template_limits(template)?;
    Ok(SandboxSpec {
        template: template.to_string(),
        limits: cella_sandbox::template::effective_limits(&Default::default(), &limits),
        ..SandboxSpec::default()
    })
}

pub(crate) async fn log(state: &AppState, id: &str, level: cella_store::LogLevel, message: String) {
    let entry = cella_store::NewSandboxLog {
        level,
        message,
        fields: BTreeMap::new(),
        at: cella_store::now(),
    };
    if let Err(e) = state.store.append_sandbox_log(id, &entry).await {
        tracing::warn!(sandbox = id, "writing sandbox log: {e}");
    }
}

pub(crate) async fn audit(
    state: &AppState,
    caller: &Caller,
    action: &str,
    target: &str,
    detail: Value,
) {
    if let Err(e) = state
        .store
        .record_audit(&caller.tenant.id, &caller.actor, action, target, &detail)
        .await
    {
        tracing::warn!("writing audit record: {e}");
    }
}

/// Keeps the store and the gateway cache true when a sandbox ends on its own (end time, crash).
pub fn watch_end(state: &AppState, sb: &Arc<Sandbox>) {
    let state = state.clone();
    let id = sb.id.clone();
    let mut ended = sb.instance.ended.clone();
    tokio::spawn(async move {
        let _ = ended.wait_for(|e| *e).await;
        // A kill by request forgets the sandbox first and records the end itself.
        let killed_by_request = state
            .gateway
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .is_none();
        state.forget(&id);
        if killed_by_request {
            return;
        }
        if let Ok(Some(r)) = state.store.get_sandbox(&id).await
            && r.state != SandboxState::Killed
        {
            let reason = if r.end_at <= cella_store::now() {
                "end time reached"
            } else {
                "sandbox exited"
            };
            let _ = state
                .store
                .update_sandbox_state(&id, SandboxState::Killed, Some(reason))
                .await;
            log(
                &state,
                &id,
                cella_store::LogLevel::Info,
                format!("sandbox ended: {reason}"),
            )
            .await;
        }
    });
}

fn remember(state: &AppState, sb: &Arc<Sandbox>, record: &SandboxRecord, paused: bool) {
    state.remember(
        &sb.id,
        GatewayEntry {
            tenant_id: record.tenant_id.clone(),
            envd: sb.envd.clone(),
            envd_access_token: record.envd_access_token.clone(),
            traffic_access_token: record.traffic_access_token.clone(),
            paused,
        },
    );
}

pub async fn create(
    state: &AppState,
    caller: &Caller,
    req: CreateRequest,
) -> Result<SandboxRecord, ApiError> {
    let template = req.template;
    let base_spec = template_spec(state.manager.backend().as_ref(), &template)?;
    let running = state
        .store
        .count_running_sandboxes(&caller.tenant.id)
        .await?;
    if running >= state.config.max_sandboxes_per_tenant {
        return Err(ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            format!(
                "tenant {} already has {running} live sandboxes (the limit is {}): kill some first",
                caller.tenant.name, state.config.max_sandboxes_per_tenant
            ),
        ));
    }
    for k in req.envs.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "invalid environment variable name {k:?}"
            )));
        }
    }
    let spec = SandboxSpec {
        envs: req.envs,
        lifetime: Some(req.timeout),
        metadata: req.metadata.clone(),
        workdir: req.workdir,
        skills: req.skills,
        network: req.network,
        ..base_spec
    };
    let started = Instant::now();
    let sb = match state.manager.create(spec.clone()).await {
        Ok(sb) => sb,
        Err(e) => {
            state
                .metrics
                .create_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(e.into());
        }
    };
    state
        .metrics
        .observe_create(started.elapsed().as_secs_f64());
    let token = req.secure.then(|| cella_proto::ids::random_hex(32));
    let now = to_utc(sb.started_at);
    let record = SandboxRecord {
        id: sb.id.clone(),
        tenant_id: caller.tenant.id.clone(),
        template_id: template,
        alias: None,
        state: SandboxState::Running,
        backend: state.manager.backend().name().to_string(),
        backend_state: sb.instance.state.clone(),
        spec: serde_json::to_value(&spec).unwrap_or_default(),
        metadata: req.metadata,
        envd_access_token: token,
        traffic_access_token: (!req.public_traffic).then(|| cella_proto::ids::random_hex(32)),
        cpu_count: spec.limits.cpus.map(|c| c.ceil() as u32).unwrap_or(1),
        memory_mb: spec
            .limits
            .memory_bytes
            .map(|m| (m >> 20) as u32)
            .unwrap_or(0),
        disk_mb: spec
            .limits
            .disk_bytes
            .map(|d| (d >> 20) as u32)
            .unwrap_or(0),
        started_at: now,
        end_at: to_utc(sb.end_at().unwrap_or_else(SystemTime::now)),
        ended_at: None,
        end_reason: None,
    };
    if let Err(e) = state.store.insert_sandbox(&record).await {
        let _ = state.manager.kill(&sb.id).await;
        return Err(e.into());
    }
    remember(state, &sb, &record, false);
    watch_end(state, &sb);
    for w in &sb.instance.warnings {
        log(state, &sb.id, cella_store::LogLevel::Warn, w.clone()).await;
    }
    tracing::info!(sandbox = %sb.id, tenant = %caller.tenant.name, template = %record.template_id,
        warm = sb.from_pool, ms = started.elapsed().as_millis() as u64, "sandbox created");
    log(
        state,
        &sb.id,
        cella_store::LogLevel::Info,
        format!("sandbox created from template {}", record.template_id),
    )
    .await;
    audit(
        state,
        caller,
        "sandbox.create",
        &sb.id,
        json!({ "template": record.template_id }),
    )
    .await;
    Ok(record)
}

/// The caller's live (running or paused) sandbox record; 404 otherwise.
pub async fn live_record(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SandboxRecord, ApiError> {
    let r = any_record(state, caller, id).await?;
    if r.state == SandboxState::Killed || state.manager.get(id).is_err() {
        return Err(ApiError::sandbox_not_found(id));
    }
    Ok(r)
}

/// The caller's sandbox record in any state (for logs); 404 for other tenants'.
pub async fn any_record(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SandboxRecord, ApiError> {
    if !cella_proto::ids::is_valid_sandbox_id(id) {
        return Err(ApiError::sandbox_not_found(id));
    }
    state
        .store
        .get_sandbox_for_tenant(&caller.tenant.id, id)
        .await?
        .ok_or_else(|| ApiError::sandbox_not_found(id))
}

pub async fn kill(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    live_record(state, caller, id).await?;
    state.forget(id);
    state.manager.kill(id).await?;
    state
        .store
        .update_sandbox_state(id, SandboxState::Killed, Some("killed by request"))
        .await?;
    state
        .metrics
        .kills
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    log(
        state,
        id,
        cella_store::LogLevel::Info,
        "sandbox killed by request".into(),
    )
    .await;
    audit(state, caller, "sandbox.kill", id, json!({})).await;
    Ok(())
}

pub async fn set_end(
    state: &AppState,
    caller: &Caller,
    id: &str,
    end: SystemTime,
) -> Result<(), ApiError> {
    live_record(state, caller, id).await?;
    state.manager.set_end(id, Some(end))?;
    state.store.set_sandbox_end_at(id, to_utc(end)).await?;
    audit(
        state,
        caller,
        "sandbox.timeout",
        id,
        json!({ "end_at": crate::control::rfc3339(to_utc(end)) }),
    )
    .await;
    Ok(())
}

pub async fn pause(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    live_record(state, caller, id).await?;
    match state.manager.pause(id) {
        Ok(()) => {}
        Err(cella_sandbox::SandboxError::Paused(_)) => {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is already paused"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    state.set_paused(id, true);
    state
        .store
        .update_sandbox_state(id, SandboxState::Paused, None)
        .await?;
    log(
        state,
        id,
        cella_store::LogLevel::Info,
        "sandbox paused".into(),
    )
    .await;
    audit(state, caller, "sandbox.pause", id, json!({})).await;
    Ok(())
}

pub struct Resumed {
    pub record: SandboxRecord,
    pub resumed: bool,
}

/// Resumes a paused sandbox (or, for `connect`, accepts a running one) and extends its end time.
pub async fn resume(
    state: &AppState,
    caller: &Caller,
    id: &str,
    timeout: Option<Duration>,
    connect: bool,
) -> Result<Resumed, ApiError> {
    let r = live_record(state, caller, id).await?;
    let resumed = match state.manager.resume(id) {
        Ok(()) => true,
        Err(cella_sandbox::SandboxError::NotPaused(_)) if connect => false,
        Err(cella_sandbox::SandboxError::NotPaused(_)) => {
            return Err(ApiError::conflict(format!("sandbox {id} is not paused")));
        }
        Err(e) => return Err(e.into()),
    };
    if resumed {
        state.set_paused(id, false);
        state
            .store
            .update_sandbox_state(id, SandboxState::Running, None)
            .await?;
        log(
            state,
            id,
            cella_store::LogLevel::Info,
            "sandbox resumed".into(),
        )
        .await;
        audit(
            state,
            caller,
            if connect {
                "sandbox.connect"
            } else {
                "sandbox.resume"
            },
            id,
            json!({}),
        )
        .await;
    }
    if let Some(t) = timeout {
        let new_end = SystemTime::now() + t;
        let current = state.manager.get(id).ok().and_then(|s| s.end_at());
        if resumed || current.is_none_or(|c| new_end > c) {
            state.manager.set_end(id, Some(new_end))?;
            state.store.set_sandbox_end_at(id, to_utc(new_end)).await?;
        }
    }
    let record = state.store.get_sandbox(id).await?.unwrap_or(r);
    Ok(Resumed { record, resumed })
}

/// One `SandboxMetric` sample: CPU over a short window and memory from the sandbox's cgroup,
/// disk from envd.
pub async fn sample_metrics(state: &AppState, r: &SandboxRecord) -> Result<Value, ApiError> {
    let u1 = state.manager.usage(&r.id)?;
    let t1 = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let u2 = state.manager.usage(&r.id)?;
    let elapsed = t1.elapsed().as_nanos().max(1) as f64;
    let cpus = f64::from(r.cpu_count.max(1));
    let cpu_pct =
        ((u2.cpu_ns.saturating_sub(u1.cpu_ns)) as f64 / elapsed / cpus * 100.0).clamp(0.0, 100.0);
    let sb = state.manager.get(&r.id)?;
    let envd: Value = sb.envd.get_json("/metrics").await.unwrap_or(Value::Null);
    let now = cella_store::now();
    Ok(json!({
        "timestamp": crate::control::rfc3339(now),
        "timestampUnix": now.timestamp(),
        "cpuCount": r.cpu_count,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": u2.memory_bytes,
        "memTotal": u64::from(r.memory_mb) << 20,
        "memCache": envd["mem_cache"].as_u64().unwrap_or(0),
        "diskUsed": envd["disk_used"].as_u64().unwrap_or(0),
        "diskTotal": envd["disk_total"].as_u64().unwrap_or(u64::from(r.disk_mb) << 20),
    }))
}

/// After a restart: adopt every sandbox the store says is live; mark the vanished ones killed.
pub async fn restore(state: &AppState) -> Result<(usize, usize), ApiError> {
    let (mut adopted, mut lost) = (0, 0);
    for r in state.store.list_live_sandboxes().await? {
        let spec: SandboxSpec = serde_json::from_value(r.spec.clone()).unwrap_or_default();
        let backend_state = r.backend_state.clone();
        let paused = r.state == SandboxState::Paused;
        let end = SystemTime::from(r.end_at);
        match state.manager.adopt(
            &r.id,
            spec,
            &backend_state,
            SystemTime::from(r.started_at),
            Some(end),
            paused,
        ) {
            Some(sb) => {
                remember(state, &sb, &r, paused);
                watch_end(state, &sb);
                log(
                    state,
                    &r.id,
                    cella_store::LogLevel::Info,
                    "reattached after a server restart".into(),
                )
                .await;
                adopted += 1;
            }
            None => {
                state
                    .store
                    .update_sandbox_state(
                        &r.id,
                        SandboxState::Killed,
                        Some("sandbox ended while the server was down"),
                    )
                    .await?;
                lost += 1;
            }
        }
    }
    Ok((adopted, lost))
}
