//! The [`Agent`]: drives one run of a strategy over a model and a sandbox — the tool-calling
//! loop here, reflexion in `reflexion.rs` — with limits (steps, tokens, wall time, cost) and
//! cancellation, reporting every step as an [`AgentEvent`].
//!
//! Owns turns, budgets and stop reasons. Must not know HTTP routes, tenants, stores or how
//! events are shown: a job runner supplies the sink and the cancellation token.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cella_llm::{ChatRequest, ChatResponse, Message, ModelClient, StreamEvent, ToolSpec, Usage};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::context::{
    self, Compactor, ContextOptions, HistoryEntry, MemoryRecall, Plan, Recall, RecallTool,
};
use crate::event::{AgentEvent, EventSink, TurnPurpose};
use crate::reflexion::{self, ReflexionOptions};
use crate::sandbox::SandboxSession;
use crate::skills::{self, AttachedSkill};
use crate::tools::{ToolOptions, Toolbox};

/// How the agent works on a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Model turns with tool calls until the model answers without any (the default).
    #[default]
    Loop,
    /// Generate a program → run it → on failure a critic analyses it → retry (bounded).
    Reflexion,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loop => "loop",
            Self::Reflexion => "reflexion",
        }
    }
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "loop" => Ok(Self::Loop),
            "reflexion" => Ok(Self::Reflexion),
            other => Err(format!("unknown strategy {other:?}: use loop or reflexion")),
        }
    }
}

/// Budgets of one run; each stops the run with a stated reason when exceeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Most model calls.
    pub max_steps: u32,
    /// Most tokens (input + output, summed over calls).
    pub max_tokens: Option<u64>,
    /// Longest wall-clock time.
    pub max_duration: Option<Duration>,
    /// Most USD spent (needs a price for the model).
    pub max_cost_usd: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 50,
            max_tokens: None,
            max_duration: None,
            max_cost_usd: None,
        }
    }
}

/// Why a run stopped before an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopReason {
    MaxSteps { limit: u32 },
    MaxTokens { limit: u64, used: u64 },
    WallTime { limit_ms: u64 },
    MaxCost { limit_usd: f64, spent_usd: f64 },
    AttemptsExhausted { attempts: u32 },
    Cancelled,
}

impl StopReason {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MaxSteps { .. } => "max_steps",
            Self::MaxTokens { .. } => "max_tokens",
            Self::WallTime { .. } => "wall_time",
            Self::MaxCost { .. } => "max_cost",
            Self::AttemptsExhausted { .. } => "attempts_exhausted",
            Self::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MaxSteps { limit } => write!(
                f,
                "step limit reached: {limit} model calls without a final answer"
            ),
            Self::MaxTokens { limit, used } => {
                write!(f, "token limit reached: used {used} of {limit} tokens")
            }
            Self::WallTime { limit_ms } => write!(
                f,
                "time limit reached: the run took longer than {:.1} s",
                *limit_ms as f64 / 1000.0
            ),
            Self::MaxCost {
                limit_usd,
                spent_usd,
            } => write!(
                f,
                "cost limit reached: spent ${spent_usd:.4} of ${limit_usd:.4}"
            ),
            Self::AttemptsExhausted { attempts } => {
                write!(f, "all {attempts} attempts failed")
            }
            Self::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Answered { answer: String },
    Stopped { reason: StopReason },
    Failed { message: String },
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Self::Answered { .. } => "answered",
            Self::Stopped { .. } => "stopped",
            Self::Failed { .. } => "failed",
        }
    }
}

/// The result of [`Agent::run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub outcome: Outcome,
    /// Model calls made.
    pub steps: u32,
    pub usage: Usage,
    /// `None` when the model has no configured price.
    pub cost_usd: Option<f64>,
    pub duration: Duration,
}

impl RunReport {
    pub fn answer(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Answered { answer } => Some(answer),
            _ => None,
        }
    }
}

/// Everything a run can be configured with besides the model and the sandbox.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub strategy: Strategy,
    pub limits: Limits,
    /// Replaces the default instructions at the top of the system prompt (the skills catalog
    /// is still appended).
    pub instructions: Option<String>,
    pub tools: ToolOptions,
    pub reflexion: ReflexionOptions,
    /// Transient model errors (rate limits, overload, a stream cut short) tolerated per call
    /// before the run fails; the whole call is repeated.
    pub model_retries: u32,
    /// The context window and how prompts are compacted to fit it.
    pub context: ContextOptions,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            strategy: Strategy::default(),
            limits: Limits::default(),
            instructions: None,
            tools: ToolOptions::default(),
            reflexion: ReflexionOptions::default(),
            model_retries: 2,
            context: ContextOptions::default(),
        }
    }
}

/// An agent: a model, a sandbox, attached skills and options. One `Agent` can run many tasks.
///
/// ```no_run
/// # async fn demo(model: std::sync::Arc<dyn cella_llm::ModelClient>, envd: cella_sandbox::EnvdClient) {
/// use cella_agent::{Agent, AgentOptions, JsonLines, SandboxSession};
/// let agent = Agent::new(model, SandboxSession::new(envd), AgentOptions::default());
/// let cancel = tokio_util::sync::CancellationToken::new();
/// let report = agent.run("print 6*7", &JsonLines::new(std::io::stdout()), &cancel).await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Agent {
    model: Arc<dyn ModelClient>,
    sandbox: SandboxSession,
    skills: Vec<AttachedSkill>,
    options: AgentOptions,
    toolbox: Option<Toolbox>,
    recall: Option<Arc<dyn Recall>>,
}

impl Agent {
    pub fn new(
        model: Arc<dyn ModelClient>,
        sandbox: SandboxSession,
        options: AgentOptions,
    ) -> Self {
        Self {
            model,
            sandbox,
            skills: Vec::new(),
            options,
            toolbox: None,
            recall: None,
        }
    }

    /// Where runs remember their history and the `recall` tool searches (a job store's
    /// full-text index). Default: a fresh [`MemoryRecall`] per run over the run's history and
    /// the sandbox's working directory.
    pub fn with_recall(mut self, recall: Arc<dyn Recall>) -> Self {
        self.recall = Some(recall);
        self
    }

    /// Skills the sandbox mounts at `/skills/<name>`: catalog in the prompt, `activate_skill`.
    pub fn with_skills(mut self, skills: Vec<AttachedSkill>) -> Self {
        self.skills = skills;
        self
    }

    /// Replaces the built-in tools (embedding callers with their own tools; benchmarks).
    pub fn with_toolbox(mut self, toolbox: Toolbox) -> Self {
        self.toolbox = Some(toolbox);
        self
    }

    pub fn options(&self) -> &AgentOptions {
        &self.options
    }

    pub fn sandbox(&self) -> &SandboxSession {
        &self.sandbox
    }

    /// The built-in tools (or those of [`Agent::with_toolbox`]); a run of the built-in tools
    /// adds `recall`.
    pub fn toolbox(&self) -> Toolbox {
        self.toolbox.clone().unwrap_or_else(|| {
            Toolbox::builtin(
                self.sandbox.clone(),
                &self.skills,
                self.options.tools.clone(),
            )
        })
    }

    /// The system prompt of the tool-calling loop.
    pub fn system_prompt(&self) -> String {
        let mut prompt = self.options.instructions.clone().unwrap_or_else(|| {
            format!(
                "You are an agent working inside an isolated Linux sandbox (no network access). \
                 You act only through the tools you are given; they run in the sandbox. Your \
                 working directory is {}; relative paths are relative to it. Work step by step: \
                 inspect, change, then run what you wrote to check that it works. When the task \
                 is done, reply with a short final answer and no tool calls.",
                self.sandbox.workdir()
            )
        });
        let catalog = skills::catalog(&self.skills);
        if !catalog.is_empty() {
            prompt.push_str(
                "\n\nThe following skills provide specialized instructions for specific tasks. \
                 When a task matches a skill's description, call the activate_skill tool with \
                 the skill's name to load its full instructions.\n\n",
            );
            prompt.push_str(&catalog);
        }
        prompt
    }

    /// Runs `task` to an answer, a limit, a failure or cancellation. Never panics on model
    /// output; the last event is always `run_finished`.
    pub async fn run(
        &self,
        task: &str,
        sink: &dyn EventSink,
        cancel: &CancellationToken,
    ) -> RunReport {
        let recall: Arc<dyn Recall> = self
            .recall
            .clone()
            .unwrap_or_else(|| Arc::new(MemoryRecall::new().with_workspace(self.sandbox.clone())));
        let config = self.model.config();
        let mut compactor = context::compactor_for(config, &self.options.context, false);
        let toolbox = match &self.toolbox {
            Some(custom) => custom.clone(),
            None => self.toolbox().with_tool(Arc::new(RecallTool::new(
                Arc::clone(&recall),
                context::recall_answer_bytes(&compactor.budget()),
            ))),
        };
        if self.options.strategy == Strategy::Loop {
            compactor = compactor.with_recall(toolbox.names().iter().any(|n| n == "recall"));
        }
        sink.emit(&AgentEvent::RunStarted {
            strategy: self.options.strategy.as_str().to_owned(),
            model: format!(
                "{}/{}",
                self.model.config().provider,
                self.model.config().model
            ),
            tools: match self.options.strategy {
                Strategy::Loop => toolbox.names(),
                Strategy::Reflexion => Vec::new(),
            },
            skills: self.skills.iter().map(|s| s.name().to_owned()).collect(),
        });
        if !compactor.budget().known {
            sink.emit(&AgentEvent::Warning {
                message: format!(
                    "the context window of {} is not known: assuming {} tokens (set it with --context-window)",
                    config.model,
                    compactor.budget().window
                ),
            });
        }
        let mut run = RunState::new(self.model.as_ref(), &self.options, sink, cancel, compactor);
        if self.options.limits.max_cost_usd.is_some() && self.model.config().price().is_none() {
            sink.emit(&AgentEvent::Warning {
                message: format!(
                    "the cost limit cannot be enforced: no price is configured for {}",
                    self.model.config().model
                ),
            });
        }
        let outcome = match self.options.strategy {
            Strategy::Loop => {
                self.tool_loop(task, &toolbox, recall.as_ref(), &mut run)
                    .await
            }
            Strategy::Reflexion => {
                reflexion::run(task, &self.sandbox, &self.options.reflexion, &mut run).await
            }
        };
        let outcome = match outcome {
            Ok(answer) => {
                sink.emit(&AgentEvent::FinalAnswer {
                    text: answer.clone(),
                });
                Outcome::Answered { answer }
            }
            Err(Halt::Stop(reason)) => {
                sink.emit(&AgentEvent::Stopped {
                    kind: reason.kind().to_owned(),
                    reason: reason.to_string(),
                });
                Outcome::Stopped { reason }
            }
            Err(Halt::Fail(message)) => {
                sink.emit(&AgentEvent::Error {
                    message: message.clone(),
                });
                Outcome::Failed { message }
            }
        };
        let report = RunReport {
            outcome,
            steps: run.steps,
            usage: run.usage,
            cost_usd: run.cost,
            duration: run.started.elapsed(),
        };
        sink.emit(&AgentEvent::RunFinished {
            status: report.outcome.status().to_owned(),
            steps: report.steps,
            usage: report.usage,
            cost_usd: report.cost_usd,
            duration_ms: u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
        });
        report
    }

    async fn tool_loop(
        &self,
        task: &str,
        toolbox: &Toolbox,
        recall: &dyn Recall,
        run: &mut RunState<'_>,
    ) -> Result<String, Halt> {
        // The full history; each prompt is a compacted view of it.
        let mut history = vec![Message::system(self.system_prompt()), Message::user(task)];
        loop {
            let request = run.prompt(&history, toolbox.specs()).await?;
            let response = run.turn(&request, TurnPurpose::Act).await?;
            history.push(response.to_message());
            if !response.content.trim().is_empty() {
                recall.remember(HistoryEntry {
                    id: format!("step-{}", run.steps),
                    step: run.steps,
                    label: format!("step {} · the model's text", run.steps),
                    text: response.content.clone(),
                });
            }
            if response.tool_calls.is_empty() {
                return Ok(response.content);
            }
            run.check_budget()?;
            let step = run.steps;
            for call in &response.tool_calls {
                run.sink.emit(&AgentEvent::ToolCallStarted {
                    step,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
                let started = Instant::now();
                let out = run.guard(toolbox.call(&call.name, &call.arguments)).await?;
                tracing::debug!(
                    step,
                    tool = %call.name,
                    is_error = out.is_error,
                    exit_code = ?out.exit_code,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "tool call finished"
                );
                run.sink.emit(&AgentEvent::ToolResult {
                    step,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    is_error: out.is_error,
                    exit_code: out.exit_code,
                    summary: out.summary.clone(),
                    truncated: out.truncated,
                    output: out.content.clone(),
                    duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                });
                recall.remember(HistoryEntry {
                    id: call.id.clone(),
                    step,
                    label: format!("step {step} · {}", call.name),
                    text: format!(
                        "{} {}\n\n{}{}",
                        call.name,
                        call.arguments,
                        if out.is_error { "error: " } else { "" },
                        out.content
                    ),
                });
                history.push(if out.is_error {
                    Message::tool_error(&call.id, out.content)
                } else {
                    Message::tool_result(&call.id, out.content)
                });
            }
        }
    }
}

/// Why a strategy stopped early.
#[derive(Debug)]
pub(crate) enum Halt {
    Stop(StopReason),
    Fail(String),
}

/// Counters and budgets of one run, shared by the strategies.
pub(crate) struct RunState<'a> {
    model: &'a dyn ModelClient,
    limits: &'a Limits,
    model_retries: u32,
    pub(crate) sink: &'a dyn EventSink,
    cancel: &'a CancellationToken,
    started: Instant,
    deadline: Option<tokio::time::Instant>,
    pub(crate) steps: u32,
    usage: Usage,
    cost: Option<f64>,
    context: Compactor,
}

impl<'a> RunState<'a> {
    fn new(
        model: &'a dyn ModelClient,
        options: &'a AgentOptions,
        sink: &'a dyn EventSink,
        cancel: &'a CancellationToken,
        context: Compactor,
    ) -> Self {
        Self {
            model,
            limits: &options.limits,
            model_retries: options.model_retries,
            sink,
            cancel,
            started: Instant::now(),
            deadline: options
                .limits
                .max_duration
                .map(|d| tokio::time::Instant::now() + d),
            steps: 0,
            usage: Usage::default(),
            cost: None,
            context,
        }
    }

    /// The compactor of this run (reflexion fits its prompts with its counter and budget).
    pub(crate) fn context(&self) -> &Compactor {
        &self.context
    }

    /// The prompt for the next model call: `history` (and `tools`) compacted to fit the
    /// context window — old tool outputs elided, then older turns summarised by the model (one
    /// extra model call), then the newest outputs shortened. Reports a compaction as an event.
    pub(crate) async fn prompt(
        &mut self,
        history: &[Message],
        tools: &[ToolSpec],
    ) -> Result<ChatRequest, Halt> {
        let fail = |e: context::ContextError| Halt::Fail(e.to_string());
        let mut plan = self.context.plan(history, tools).map_err(fail)?;
        if let Plan::Summarize(job) = plan {
            match self.turn(&job.request, TurnPurpose::Summarize).await {
                Ok(response) => self.context.accept_summary(job, &response.content),
                Err(Halt::Fail(message)) => self.sink.emit(&AgentEvent::Warning {
                    message: format!(
                        "summarising older turns failed ({message}); shortening the newest instead"
                    ),
                }),
                Err(stop) => return Err(stop),
            }
            plan = self.context.resume(history, tools).map_err(fail)?;
        }
        let Plan::Ready(prompt) = plan else {
            return Err(Halt::Fail(
                "context compaction asked for a second summary in one prompt".to_owned(),
            ));
        };
        if let Some(c) = prompt.compaction {
            tracing::debug!(?c, "prompt compacted");
            self.sink.emit(&AgentEvent::ContextCompacted {
                step: self.steps + 1,
                history_tokens: c.history_tokens,
                tokens_before: c.tokens_before,
                tokens_after: c.tokens_after,
                limit: c.limit,
                elided: c.elided,
                summarized: c.summarized,
                shortened: c.shortened,
            });
        }
        Ok(prompt.request)
    }

    /// Runs `work` unless the run is cancelled or out of time first.
    pub(crate) async fn guard<F: Future>(&self, work: F) -> Result<F::Output, Halt> {
        let deadline = async {
            match self.deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Halt::Stop(StopReason::Cancelled)),
            () = deadline => Err(Halt::Stop(StopReason::WallTime {
                limit_ms: self.limits.max_duration.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })),
            out = work => Ok(out),
        }
    }

    /// Stops the run when its token or cost budget is spent.
    pub(crate) fn check_budget(&self) -> Result<(), Halt> {
        if let Some(limit) = self.limits.max_tokens {
            let used = self.usage.total_tokens();
            if used >= limit {
                return Err(Halt::Stop(StopReason::MaxTokens { limit, used }));
            }
        }
        if let (Some(limit_usd), Some(spent_usd)) = (self.limits.max_cost_usd, self.cost)
            && spent_usd >= limit_usd
        {
            return Err(Halt::Stop(StopReason::MaxCost {
                limit_usd,
                spent_usd,
            }));
        }
        Ok(())
    }

    /// One model call, streamed to the sink as it arrives.
    pub(crate) async fn turn(
        &mut self,
        request: &ChatRequest,
        purpose: TurnPurpose,
    ) -> Result<ChatResponse, Halt> {
        if self.steps >= self.limits.max_steps {
            return Err(Halt::Stop(StopReason::MaxSteps {
                limit: self.limits.max_steps,
            }));
        }
        self.steps += 1;
        let step = self.steps;
        self.sink.emit(&AgentEvent::ModelTurn { step, purpose });
        let mut retries = 0;
        let show_text = purpose != TurnPurpose::Summarize;
        let response = loop {
            match self.stream_once(request, show_text).await? {
                Ok(response) => break response,
                Err(e) if e.is_transient() && retries < self.model_retries => {
                    retries += 1;
                    tracing::warn!(step, retries, error = %e, "repeating a failed model call");
                    self.sink.emit(&AgentEvent::Warning {
                        message: format!("model call failed ({e}); repeating it"),
                    });
                }
                Err(e) => return Err(Halt::Fail(format!("model call failed: {e}"))),
            }
        };
        self.usage.add(&response.usage);
        if let Some(cost) = response.cost_usd {
            *self.cost.get_or_insert(0.0) += cost;
        }
        self.sink.emit(&AgentEvent::Usage {
            step,
            usage: response.usage,
            total: self.usage,
            cost_usd: response.cost_usd,
            total_cost_usd: self.cost,
        });
        Ok(response)
    }

    async fn stream_once(
        &self,
        request: &ChatRequest,
        show_text: bool,
    ) -> Result<Result<ChatResponse, cella_llm::LlmError>, Halt> {
        let mut stream = match self.guard(self.model.stream(request)).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        while let Some(event) = self.guard(stream.next()).await? {
            match event {
                Ok(StreamEvent::TextDelta { text }) if show_text => {
                    self.sink.emit(&AgentEvent::TextDelta { text });
                }
                Ok(_) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(stream.into_response()))
    }
}
