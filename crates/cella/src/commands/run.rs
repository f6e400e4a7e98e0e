//! `cella run "TASK"`: an agent does the task in a fresh local sandbox. Live progress on stderr
//! (model text as it streams, each tool call and a one-line summary of its result), the final
//! answer on stdout; `--json` prints the event stream as JSON lines instead. Exit status 0 when
//! the agent answered, 1 when a limit stopped it or it failed, 2 on bad usage (no model…), 130
//! when interrupted (Ctrl-C cancels the run, then the sandbox is destroyed unless `--keep`).
//!
//! The sandbox is destroyed at the end unless `--keep`; then its helper keeps it alive after
//! cella exits and its id, socket and pid are printed. Known limit: the native backend's helper
//! inherits cella's stderr and keeps it open while the kept sandbox lives, so a pipe reading
//! `cella run --keep`'s stderr sees no end of file until the sandbox is killed (redirect stderr
//! to a file instead).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use cella_agent::{
    Agent, AgentEvent, AgentOptions, AttachedSkill, CancellationToken, ContextOptions, EventSink,
    JsonLines, Language, Limits, Outcome, ReflexionOptions, SandboxSession, Strategy,
};
use cella_llm::{ModelConfig, ModelSettings, build_client};
use cella_sandbox::backend::Backend;
use cella_sandbox::spec::{self, WORKSPACE};
use cella_sandbox::{EnvdClient, Transport};
use cella_skills::discovery::{self, Limits as DiscoveryLimits};

use super::exec::SandboxOptions;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The model comes from --model / --base-url, else CELLA_MODEL / CELLA_BASE_URL, else the [model] table of ./cella.toml (e.g. CELLA_MODEL=anthropic/claude-sonnet-4-5 with ANTHROPIC_API_KEY, or CELLA_MODEL=ollama/qwen3:8b).\n\nExit status: 0 when the agent answered; 1 when a limit stopped it or it failed; 2 on bad usage; 130 when interrupted."
)]
pub struct RunArgs {
    /// What the agent should do.
    #[arg(value_name = "TASK")]
    pub task: String,
    /// The model as provider/model, e.g. openai/gpt-4.1, anthropic/claude-sonnet-4-5.
    #[arg(long)]
    pub model: Option<String>,
    /// The provider's endpoint (for local or compatible servers).
    #[arg(long)]
    pub base_url: Option<String>,
    /// `loop` (tool calls until an answer) or `reflexion` (write a program, run it, critique,
    /// retry).
    #[arg(long, default_value = "loop", value_parser = |s: &str| s.parse::<Strategy>())]
    pub strategy: Strategy,
    /// Agent Skills to attach, by name (comma-separated), found in .cella/skills,
    /// .agents/skills, .claude/skills, $CELLA_SKILLS_PATH, ~/.cella/skills, ~/.agents/skills.
    #[arg(long, value_delimiter = ',')]
    pub skills: Vec<String>,
    /// Most model calls.
    #[arg(long, default_value_t = 50)]
    pub max_steps: u32,
    /// Most tokens (input + output over the whole run).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Most USD to spend (needs a price for the model in cella.toml).
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// The model's context window in tokens (default: known for common models, else 32768).
    /// Prompts are compacted to fit it: old tool outputs elided (the `recall` tool shows them
    /// again), then older turns summarised.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1024..))]
    pub context_window: Option<u32>,
    /// Tokens of the context window kept free for each answer (default: the configured
    /// max_tokens, else 8192; at most a quarter of the window).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub answer_reserve: Option<u32>,
    /// Wall-clock limit of the run, e.g. 10m, 90s.
    #[arg(long, value_parser = spec::parse_duration)]
    pub timeout: Option<Duration>,
    /// Reflexion: most attempts.
    #[arg(long, default_value_t = 3)]
    pub attempts: u32,
    /// Reflexion: the program's stdout must contain this.
    #[arg(long)]
    pub expect: Option<String>,
    /// Reflexion: a bash command that must exit 0 after the program ran.
    #[arg(long)]
    pub test_cmd: Option<String>,
    /// Reflexion: the language of the program (python, javascript, bash).
    #[arg(long, default_value = "python", value_parser = parse_language)]
    pub language: Language,
    /// Leave the sandbox running afterwards and print its id, envd socket and pid (its helper
    /// holds on to cella's stderr while it lives: redirect stderr to a file, not a pipe).
    #[arg(long)]
    pub keep: bool,
    /// Print the event stream as JSON lines on stdout (nothing else on stdout).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxOptions,
}

fn parse_language(s: &str) -> Result<Language, String> {
    Language::parse(s)
        .ok_or_else(|| format!("unknown language {s:?}: use python, javascript or bash"))
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Everything that can be wrong with the invocation fails before a sandbox exists.
    let settings = ModelSettings {
        model: args.model.clone(),
        base_url: args.base_url.clone(),
        ..ModelSettings::default()
    };
    let toml = PathBuf::from("cella.toml");
    let config = ModelConfig::load(toml.is_file().then_some(toml.as_path()), settings)?;
    let model = build_client(config).context("setting up the model client")?;
    let skills = find_skills(&args.skills)?;
    let mut spec = args.sandbox.spec()?;
    spec.envs = args.sandbox.env.iter().cloned().collect();
    spec.skills = skills
        .iter()
        .map(|s| (s.skill.name.clone(), s.skill.dir.clone()))
        .collect();
    let options = AgentOptions {
        strategy: args.strategy,
        limits: Limits {
            max_steps: args.max_steps,
            max_tokens: args.max_tokens,
            max_duration: args.timeout,
            max_cost_usd: args.max_cost,
        },
        reflexion: ReflexionOptions {
            max_attempts: args.attempts,
            language: args.language,
            expected_output: args.expect.clone(),
            test_command: args.test_cmd.clone(),
            ..ReflexionOptions::default()
        },
        context: ContextOptions {
            window: args.context_window,
            reserve: args.answer_reserve,
            ..ContextOptions::default()
        },
        ..AgentOptions::default()
    };
    let rt = super::local::runtime()?;
    rt.block_on(async move {
        let backend = super::local::native_backend()?;
        let id = cella_proto::ids::new_sandbox_id();
        let instance = backend
            .create(&id, &spec)
            .await
            .with_context(|| format!("creating the sandbox for the agent (template {})", spec.template))?;
        for w in &instance.warnings {
            if !w.starts_with("rootless") {
                eprintln!("cella: warning: {w}");
            }
        }
        let Transport::Unix(socket) = &instance.transport;
        let mut session = SandboxSession::new(EnvdClient::unix(socket.clone()));
        if args.sandbox.root {
            session = session.with_user("root").with_workdir("/root");
        }
        if spec.workdir.is_some() {
            session = session.with_workdir(WORKSPACE);
        }
        let agent = Agent::new(model, session, options).with_skills(skills);
        let cancel = CancellationToken::new();
        let on_ctrl_c = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_ctrl_c.cancel();
            }
        });
        let sink: Box<dyn EventSink> = if args.json {
            Box::new(JsonLines::new(std::io::stdout()))
        } else {
            Box::new(Progress::new())
        };
        let report = agent.run(&args.task, sink.as_ref(), &cancel).await;
        if args.keep {
            let pid = instance
                .state
                .get("init_pid")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(-1);
            eprintln!(
                "cella: kept sandbox {id} (envd socket {}, init pid {pid}); stop it with `kill -KILL {pid}`",
                socket.display()
            );
        } else {
            let _ = backend.kill(&instance).await;
        }
        if !args.json
            && let Outcome::Answered { answer } = &report.outcome
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", answer.trim_end());
        }
        Ok(ExitCode::from(match report.outcome {
            Outcome::Answered { .. } => 0,
            Outcome::Stopped {
                reason: cella_agent::StopReason::Cancelled,
            } => 130,
            _ => 1,
        }))
    })
}

/// The named skills, discovered in the project and user roots.
fn find_skills(names: &[String]) -> anyhow::Result<Vec<AttachedSkill>> {
    let names: Vec<&str> = names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let project = std::env::current_dir().context("finding the current directory")?;
    let configured: Vec<PathBuf> = std::env::var_os("CELLA_SKILLS_PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let roots = discovery::default_roots(&project, &configured, home.as_deref());
    let found = discovery::discover(&roots, DiscoveryLimits::default());
    let mut skills = Vec::new();
    for name in names {
        match found.get(name) {
            Some(d) => skills.push(AttachedSkill::new(d.skill.clone())),
            None => {
                let known: Vec<&str> = found.skills.iter().map(|d| d.skill.name.as_str()).collect();
                bail!(
                    "no skill named {name:?} was found (looked in .cella/skills, .agents/skills, .claude/skills, $CELLA_SKILLS_PATH, ~/.cella/skills, ~/.agents/skills); found: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                );
            }
        }
    }
    Ok(skills)
}

/// Human progress on stderr (also `cella jobs watch`).
pub(crate) struct Progress {
    /// Whether the cursor is at the start of a line.
    at_line_start: Mutex<bool>,
    color: bool,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            at_line_start: Mutex::new(true),
            color: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn dim(&self, s: &str) -> String {
        if self.color {
            format!("\x1b[2m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }

    fn line(&self, text: &str) {
        let mut start = self
            .at_line_start
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut err = std::io::stderr().lock();
        if !*start {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "{text}");
        *start = true;
    }
}

/// The interesting part of a tool call's arguments, on one line.
fn call_summary(name: &str, arguments: &str) -> String {
    let args: serde_json::Value = serde_json::from_str(arguments).unwrap_or_default();
    let field = |k: &str| {
        args.get(k)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let text = match name {
        "bash" => field("command"),
        "run_code" => field("code").map(|c| {
            let n = c.lines().count();
            let lines = if n == 1 { "line" } else { "lines" };
            format!("{} ({n} {lines})", field("language").unwrap_or_default())
        }),
        "write_file" => field("path")
            .map(|p| format!("{p} ({} bytes)", field("content").map_or(0, |c| c.len()))),
        "read_file" | "edit_file" | "list_files" => field("path"),
        "activate_skill" => field("name"),
        _ => None,
    }
    .unwrap_or_else(|| arguments.to_owned());
    let one_line = text.replace('\n', " ⏎ ");
    let mut out: String = one_line.chars().take(120).collect();
    if one_line.chars().count() > 120 {
        out.push('…');
    }
    out
}

impl EventSink for Progress {
    fn emit(&self, event: &AgentEvent) {
        match event {
            AgentEvent::TextDelta { text } => {
                let mut start = self
                    .at_line_start
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(text.as_bytes());
                let _ = err.flush();
                if !text.is_empty() {
                    *start = text.ends_with('\n');
                }
            }
            AgentEvent::RunStarted {
                model,
                strategy,
                skills,
                ..
            } => {
                let skills = if skills.is_empty() {
                    String::new()
                } else {
                    format!(" · skills {}", skills.join(", "))
                };
                self.line(&self.dim(&format!("cella: {strategy} with {model}{skills}")));
            }
            AgentEvent::Warning { message } => self.line(&format!("cella: warning: {message}")),
            AgentEvent::ToolCallStarted {
                name, arguments, ..
            } => {
                self.line(&format!("→ {name}: {}", call_summary(name, arguments)));
            }
            AgentEvent::ToolResult {
                is_error,
                exit_code,
                summary,
                truncated,
                ..
            } => {
                let ok = !is_error && exit_code.is_none_or(|c| c == 0);
                let cut = if *truncated { " (output cut)" } else { "" };
                self.line(&self.dim(&format!("  {} {summary}{cut}", if ok { "✓" } else { "✗" })));
            }
            AgentEvent::AttemptStarted {
                attempt,
                max_attempts,
            } => {
                self.line(&format!("── attempt {attempt}/{max_attempts} ──"));
            }
            AgentEvent::ModelTurn {
                purpose: cella_agent::TurnPurpose::Critique,
                ..
            } => {
                self.line(&self.dim("critique:"));
            }
            AgentEvent::CodeGenerated {
                path,
                language,
                code,
                ..
            } => {
                let n = code.lines().count();
                let lines = if n == 1 { "line" } else { "lines" };
                self.line(&format!("→ wrote {path} ({n} {lines} of {language})"));
            }
            AgentEvent::Execution {
                command,
                exit_code,
                summary,
                ..
            } => {
                let ok = *exit_code == Some(0);
                self.line(&format!("→ {command}"));
                self.line(&self.dim(&format!("  {} {summary}", if ok { "✓" } else { "✗" })));
            }
            AgentEvent::Check {
                check,
                passed,
                detail,
                ..
            } => {
                self.line(&self.dim(&format!(
                    "  check {check}: {} ({detail})",
                    if *passed { "passed" } else { "failed" }
                )));
            }
            AgentEvent::ContextCompacted {
                tokens_before,
                tokens_after,
                limit,
                elided,
                summarized,
                shortened,
                ..
            } => {
                let mut what = Vec::new();
                if *elided > 0 {
                    what.push(format!("{elided} old outputs elided"));
                }
                if *summarized > 0 {
                    what.push(format!("{summarized} messages summarised"));
                }
                if *shortened > 0 {
                    what.push(format!("{shortened} outputs shortened"));
                }
                self.line(&self.dim(&format!(
                    "cella: context compacted {tokens_before} → {tokens_after} tokens (budget {limit}): {}",
                    what.join(", ")
                )));
            }
            AgentEvent::Stopped { reason, .. } => self.line(&format!("cella: stopped: {reason}")),
            AgentEvent::Error { message } => self.line(&format!("cella: error: {message}")),
            AgentEvent::RunFinished {
                status,
                steps,
                usage,
                cost_usd,
                duration_ms,
            } => {
                let cost = cost_usd.map(|c| format!(" · ${c:.4}")).unwrap_or_default();
                self.line(&self.dim(&format!(
                    "cella: {status} · {steps} model calls · {} in / {} out tokens{cost} · {:.1} s",
                    usage.input_tokens,
                    usage.output_tokens,
                    *duration_ms as f64 / 1000.0
                )));
            }
            _ => {}
        }
    }
}
