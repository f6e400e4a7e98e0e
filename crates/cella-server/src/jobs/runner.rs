//! The runner: this node's scheduler loop and the life of one job on it.
//!
//! The scheduler claims jobs from the store (priorities, per-node and per-tenant concurrency
//! are the store's claim) whenever it is woken (a submission, a job ending) or every poll
//! interval. Each claimed job gets a fresh workspace on the host (`<data-dir>/jobs/<id>/
//! workspace`, bound at `/workspace`, so its files outlive the sandbox for `artifacts.zip`), a
//! sandbox created like any other (tenant-owned, audited), a model client and a cella-agent
//! run. Every event is stored before it is announced to readers. A supervisor renews the lease,
//! applies cancel requests, the watchdog (no event for the configured time) and the hard
//! timeout. A run failing on a transient model error is queued again while attempts remain.
//!
//! Restart safety: at start, jobs this node was running (its previous process died) and jobs
//! whose lease expired end as `error` "interrupted by restart" and their sandboxes are killed;
//! none stays running.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cella_agent::{
    Agent, AgentEvent, AgentOptions, AttachedSkill, CancellationToken, EventSink, Limits, Outcome,
    RunReport, SandboxSession, StopReason, Strategy,
};
use cella_llm::{ConfigError, ModelConfig, ModelSettings};
use cella_sandbox::spec::WORKSPACE;
use cella_store::{ClaimRequest, INTERRUPTED_BY_RESTART, JobOutcome, JobRecord, JobStatus};
use serde_json::{Value, json};

use super::api::JobLimits;
use crate::auth::Caller;
use crate::lifecycle;
use crate::state::AppState;

/// Extra life a job's sandbox gets past the job's own time limit (the runner kills it sooner).
const SANDBOX_GRACE: Duration = Duration::from_secs(120);
/// Time a run gets past its limit to stop by itself before the supervisor cancels it.
const TIMEOUT_GRACE: Duration = Duration::from_secs(30);

/// The model for a job: `model` (`provider/model`) or the server's `CELLA_MODEL`, with the
/// endpoint and keys of the server's environment and `<data-dir>/cella.toml`.
pub fn model_config(state: &AppState, model: Option<&str>) -> Result<ModelConfig, ConfigError> {
    let toml = state.config.data_dir.join("cella.toml");
    ModelConfig::load(
        toml.is_file().then_some(toml.as_path()),
        ModelSettings {
            model: model.map(str::to_owned).filter(|m| !m.trim().is_empty()),
            ..ModelSettings::default()
        },
    )
}

/// The job's skills from the tenant's skill registry (`/v1/skills`, `name` or `name@version`),
/// resolved like a sandbox create's: mounts (name → extracted directory) and the skills as the
/// agent attaches them.
pub async fn find_skills(
    state: &AppState,
    caller: &Caller,
    names: &[String],
) -> Result<(BTreeMap<String, PathBuf>, Vec<AttachedSkill>), String> {
    if names.is_empty() {
        return Ok((BTreeMap::new(), Vec::new()));
    }
    let mounts = crate::skills_api::mounts_for_create(state, caller, Some(names), None)
        .await
        .map_err(|e| e.message)?;
    let mut attached = Vec::new();
    for (name, dir) in &mounts {
        let (skill, _) = cella_skills::validate::load_lenient(dir)
            .map_err(|_| format!("skill {name:?} in {} cannot be read", dir.display()))?;
        attached.push(AttachedSkill::new(skill));
    }
    Ok((mounts, attached))
}

/// Where job `id`'s workspace lives on the host.
pub fn workspace_dir(state: &AppState, id: &str) -> PathBuf {
    state
        .config
        .data_dir
        .join("jobs")
        .join(id)
        .join("workspace")
}

/// Ends the jobs a previous process of this node left running, then starts the scheduler.
/// Returns how many jobs were interrupted.
pub async fn start(state: &AppState) -> Result<usize, cella_store::StoreError> {
    let interrupted = recover(state, true).await?;
    let state = state.clone();
    tokio::spawn(async move { scheduler(state).await });
    Ok(interrupted)
}

/// Ends orphaned running jobs as `error` "interrupted by restart" and kills their sandboxes.
/// `at_start`: this node's own running jobs are orphans too (the process that ran them died).
async fn recover(state: &AppState, at_start: bool) -> Result<usize, cella_store::StoreError> {
    let node = &state.config.jobs.node;
    let mut ended = 0;
    for job in state.store.list_orphaned_jobs(node).await? {
        if !at_start && job.node.as_deref() == Some(node.as_str()) {
            continue;
        }
        if let Some(sandbox) = &job.sandbox_id
            && state.manager.get(sandbox).is_ok()
            && let Ok(Some(tenant)) = state.store.get_tenant(&job.tenant_id).await
        {
            let caller = Caller {
                tenant,
                actor: format!("job:{}", job.id),
            };
            if let Err(e) = lifecycle::kill(state, &caller, sandbox).await {
                tracing::warn!(job = %job.id, sandbox, "killing an interrupted job's sandbox: {}", e.message);
            }
        }
        let outcome = JobOutcome {
            status: JobStatus::Error,
            final_answer: None,
            error: Some(INTERRUPTED_BY_RESTART.to_owned()),
            usage: None,
        };
        if state
            .store
            .finish_job(&job.id, None, &outcome)
            .await?
            .is_some()
        {
            tracing::warn!(job = %job.id, node = ?job.node, "job interrupted by a restart");
            ended += 1;
        }
    }
    Ok(ended)
}

async fn scheduler(state: AppState) {
    let cfg = &state.config.jobs;
    let req = ClaimRequest {
        node: cfg.node.clone(),
        node_limit: cfg.max_running,
        tenant_limit: cfg.max_running_per_tenant,
        lease: cfg.lease,
    };
    let mut last_sweep = Instant::now();
    loop {
        loop {
            match state.store.claim_job(&req).await {
                Ok(Some(job)) => {
                    let state = state.clone();
                    tokio::spawn(async move { run_job(state, job).await });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("claiming a job: {e}");
                    break;
                }
            }
        }
        if last_sweep.elapsed() >= cfg.lease {
            last_sweep = Instant::now();
            if let Err(e) = recover(&state, false).await {
                tracing::warn!("ending jobs of nodes that stopped: {e}");
            }
        }
        tokio::select! {
            () = state.jobs.wake.notified() => {}
            () = tokio::time::sleep(cfg.poll_interval) => {}
        }
    }
}

/// Forwards the agent's events to the writer task (the agent's sink must not block).
struct ChannelSink(tokio::sync::mpsc::UnboundedSender<(String, Value)>);

impl EventSink for ChannelSink {
    fn emit(&self, event: &AgentEvent) {
        let value = serde_json::to_value(event).unwrap_or_else(
            |e| json!({"type": "error", "message": format!("unserializable event: {e}")}),
        );
        let kind = value["type"].as_str().unwrap_or("event").to_owned();
        let _ = self.0.send((kind, value));
    }
}

impl ChannelSink {
    fn job_event(&self, kind: &str, payload: Value) {
        let _ = self.0.send((kind.to_owned(), payload));
    }
}

/// What the run of a job came to.
enum Ending {
    Finished(JobOutcome),
    Retry(String),
}

fn error(message: impl Into<String>) -> Ending {
    Ending::Finished(JobOutcome {
        status: JobStatus::Error,
        final_answer: None,
        error: Some(message.into()),
        usage: None,
    })
}

/// The cancellation of one run and why it was cancelled.
#[derive(Clone, Default)]
pub struct RunControl {
    pub cancel: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl RunControl {
    /// Cancels the run; the first reason given is kept.
    pub fn cancel(&self, reason: &str) {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| reason.to_owned());
        self.cancel.cancel();
    }

    fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn run_job(state: AppState, job: JobRecord) {
    let id = job.id.clone();
    let control = RunControl::default();
    state.jobs.register(&id, control.clone());
    state.jobs.hub.open(&id, job.last_seq);
    tracing::info!(job = %id, attempt = job.attempts, "job started");
    let ending = execute(&state, &job, &control).await;
    let node = &state.config.jobs.node;
    match ending {
        Ending::Retry(reason) => {
            tracing::warn!(job = %id, "job queued again: {reason}");
            match state.store.requeue_job(&id, node, &reason).await {
                Ok(true) => {}
                Ok(false) => finish(&state, &id, error(reason)).await,
                Err(e) => tracing::error!(job = %id, "queueing a job again: {e}"),
            }
        }
        ending => finish(&state, &id, ending).await,
    }
    state.jobs.hub.close(&id);
    state.jobs.unregister(&id);
    state.jobs.wake.notify_one();
}

async fn finish(state: &AppState, id: &str, ending: Ending) {
    let Ending::Finished(outcome) = ending else {
        return;
    };
    match state
        .store
        .finish_job(id, Some(&state.config.jobs.node), &outcome)
        .await
    {
        Ok(Some((job, last))) => {
            state.jobs.hub.stored(id, last.seq);
            tracing::info!(job = %id, status = %job.status, "job finished");
        }
        Ok(None) => tracing::warn!(job = %id, "job had already ended elsewhere"),
        Err(e) => tracing::error!(job = %id, "recording the end of a job: {e}"),
    }
}

/// Runs one claimed job to its ending; never panics, always cleans up its sandbox.
async fn execute(state: &AppState, job: &JobRecord, control: &RunControl) -> Ending {
    let cfg = &state.config.jobs;
    let limits: JobLimits = serde_json::from_value(job.limits.clone()).unwrap_or_default();
    let timeout = limits
        .timeout_secs
        .map_or(cfg.default_timeout, Duration::from_secs)
        .min(cfg.max_timeout);
    let strategy = job.strategy.parse::<Strategy>().unwrap_or_default();
    let tenant = match state.store.get_tenant(&job.tenant_id).await {
        Ok(Some(t)) => t,
        Ok(None) => return error(format!("tenant {} no longer exists", job.tenant_id)),
        Err(e) => return error(format!("reading the job's tenant: {e}")),
    };
    let caller = Caller {
        tenant,
        actor: format!("job:{}", job.id),
    };

    // Events: stored in order by one writer, announced after they are stored.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Value)>();
    let sink = ChannelSink(tx);
    let clock = Instant::now();
    let last_event = Arc::new(AtomicU64::new(0));
    let writer = {
        let state = state.clone();
        let id = job.id.clone();
        let last_event = last_event.clone();
        tokio::spawn(async move {
            while let Some((kind, payload)) = rx.recv().await {
                match state.store.append_job_event(&id, &kind, &payload).await {
                    Ok(e) => {
                        last_event.store(clock.elapsed().as_millis() as u64, Ordering::Relaxed);
                        state.jobs.hub.stored(&id, e.seq);
                    }
                    Err(err) => tracing::error!(job = %id, "storing a job event: {err}"),
                }
            }
        })
    };
    sink.job_event(
        "job_started",
        json!({ "attempt": job.attempts, "node": cfg.node }),
    );

    let ending = run_in_sandbox(
        state,
        job,
        &caller,
        &sink,
        control,
        timeout,
        strategy,
        &limits,
        clock,
        &last_event,
    )
    .await;
    drop(sink);
    let _ = writer.await;
    ending
}

#[allow(clippy::too_many_arguments)]
async fn run_in_sandbox(
    state: &AppState,
    job: &JobRecord,
    caller: &Caller,
    sink: &ChannelSink,
    control: &RunControl,
    timeout: Duration,
    strategy: Strategy,
    limits: &JobLimits,
    clock: Instant,
    last_event: &Arc<AtomicU64>,
) -> Ending {
    let cfg = &state.config.jobs;
    let model = match model_config(state, job.model.as_deref()) {
        Ok(config) => match cella_llm::build_client(config) {
            Ok(m) => m,
            Err(e) => return error(format!("setting up the model client: {e}")),
        },
        Err(e) => return error(format!("model: {e}")),
    };
    let (mounts, skills) = match find_skills(state, caller, &job.skills).await {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let workspace = workspace_dir(state, &job.id);
    if workspace.exists() {
        // A retry starts from a clean workspace, like the first run.
        let _ = std::fs::remove_dir_all(&workspace);
    }
    if let Err(e) = std::fs::create_dir_all(&workspace) {
        return error(format!(
            "creating the workspace {}: {e}",
            workspace.display()
        ));
    }
    let created = lifecycle::create(
        state,
        caller,
        lifecycle::CreateRequest {
            template: job.template.clone(),
            timeout: timeout + SANDBOX_GRACE,
            metadata: [("cella.job".to_owned(), job.id.clone())].into(),
            workdir: Some(workspace),
            skills: mounts,
            ..Default::default()
        },
    )
    .await;
    let record = match created {
        Ok(r) => r,
        Err(e) => return error(format!("creating the job's sandbox: {}", e.message)),
    };
    let sandbox_id = record.id.clone();
    if let Err(e) = state.store.set_job_sandbox(&job.id, &sandbox_id).await {
        tracing::warn!(job = %job.id, "recording the job's sandbox: {e}");
    }
    sink.job_event("sandbox_created", json!({ "sandbox_id": sandbox_id }));
    let envd = match state.manager.get(&sandbox_id) {
        Ok(sb) => sb.envd.clone(),
        Err(e) => return error(format!("the job's sandbox ended at once: {e}")),
    };

    let options = AgentOptions {
        strategy,
        limits: Limits {
            max_steps: limits.max_steps.unwrap_or(Limits::default().max_steps),
            max_tokens: limits.max_tokens,
            max_duration: Some(timeout),
            max_cost_usd: limits.max_cost_usd,
        },
        ..AgentOptions::default()
    };
    let session = SandboxSession::new(envd).with_workdir(WORKSPACE);
    // `recall` searches the job's stored history (full text, tenant- and job-scoped).
    let history = super::recall::JobHistory::new(state.store.clone(), &job.tenant_id, &job.id);
    let agent = Agent::new(model, session, options)
        .with_skills(skills)
        .with_recall(std::sync::Arc::new(history));

    let supervisor = supervise(state, job, control, timeout, clock, last_event.clone());
    let report = agent.run(&job.task, sink, &control.cancel).await;
    supervisor.abort();
    // The sandbox goes first: "cancelled" means its processes are gone.
    if let Err(e) = lifecycle::kill(state, caller, &sandbox_id).await {
        tracing::debug!(job = %job.id, sandbox = %sandbox_id, "killing the job's sandbox: {}", e.message);
    }
    ending_of(&report, control, job.attempts, cfg.max_attempts)
}

/// Renews the lease and stops the run on a cancel request, the watchdog or the hard timeout.
fn supervise(
    state: &AppState,
    job: &JobRecord,
    control: &RunControl,
    timeout: Duration,
    clock: Instant,
    last_event: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let state = state.clone();
    let id = job.id.clone();
    let control = control.clone();
    tokio::spawn(async move {
        let cfg = &state.config.jobs;
        let tick = (cfg.lease / 3)
            .min(cfg.watchdog / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(tick).await;
            if renewed.elapsed() >= cfg.lease / 3 {
                renewed = Instant::now();
                match state.store.renew_job_lease(&id, &cfg.node, cfg.lease).await {
                    Ok(Some(job)) => {
                        if let Some(reason) = job.cancel_reason {
                            control.cancel(&reason);
                        }
                    }
                    Ok(None) => control.cancel("the job is no longer held by this node"),
                    Err(e) => tracing::warn!(job = %id, "renewing the job's lease: {e}"),
                }
            }
            let now = clock.elapsed();
            let quiet =
                now.saturating_sub(Duration::from_millis(last_event.load(Ordering::Relaxed)));
            if quiet >= cfg.watchdog {
                control.cancel(&format!(
                    "watchdog: no event for {} s",
                    cfg.watchdog.as_secs_f64()
                ));
            }
            if now >= timeout + TIMEOUT_GRACE {
                control.cancel(&format!(
                    "timed out: the job ran longer than {} s",
                    timeout.as_secs()
                ));
            }
        }
    })
}

fn usage_json(report: &RunReport) -> Value {
    json!({
        "input_tokens": report.usage.input_tokens,
        "output_tokens": report.usage.output_tokens,
        "cached_input_tokens": report.usage.cached_input_tokens,
        "cost_usd": report.cost_usd,
        "steps": report.steps,
        "duration_ms": u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
    })
}

fn ending_of(report: &RunReport, control: &RunControl, attempts: u32, max_attempts: u32) -> Ending {
    let usage = Some(usage_json(report));
    let outcome = |status, final_answer, error| {
        Ending::Finished(JobOutcome {
            status,
            final_answer,
            error,
            usage: usage.clone(),
        })
    };
    match &report.outcome {
        Outcome::Answered { answer } => outcome(JobStatus::Complete, Some(answer.clone()), None),
        Outcome::Stopped {
            reason: StopReason::Cancelled,
        } => outcome(
            JobStatus::Cancelled,
            None,
            Some(control.reason().unwrap_or_else(|| "cancelled".to_owned())),
        ),
        Outcome::Stopped { reason } => outcome(JobStatus::Error, None, Some(reason.to_string())),
        // The agent already repeated the call; a later run may find the provider back.
        Outcome::Failed { message }
            if message.starts_with("model call failed") && attempts < max_attempts =>
        {
            Ending::Retry(message.clone())
        }
        Outcome::Failed { message } => outcome(JobStatus::Error, None, Some(message.clone())),
    }
}
