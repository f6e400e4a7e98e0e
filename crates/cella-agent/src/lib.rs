//! cella-agent: an AI agent working inside a cella sandbox.
//!
//! - [`Agent`] runs a task with a [`ModelClient`](cella_llm::ModelClient) and a
//!   [`SandboxSession`] by a [`Strategy`]: the tool-calling loop (model turn → tool calls run in
//!   order → results appended → repeat until an answer without tool calls) or reflexion
//!   (generate → execute → critique → retry). [`Limits`] on steps, tokens, wall time and cost
//!   stop a run with a [`StopReason`]; a `CancellationToken` stops it from outside.
//! - Every step is an [`AgentEvent`] handed to an [`EventSink`] (JSON-serializable: one JSON
//!   line each with [`JsonLines`]).
//! - [`tools`]: `bash`, `run_code`, `read_file`, `write_file`, `edit_file`, `list_files`,
//!   `activate_skill` — all acting inside the sandbox through envd, never on the host; output
//!   capped head + tail with a line saying what was cut ([`output`]).
//! - [`context`]: every prompt fits the model's context window — token counting, a budget per
//!   model, old tool outputs elided, older turns summarised, the `recall` tool over the whole
//!   history and the workspace.
//! - [`bench`]: the per-step overhead benchmark (`cella bench agent`).
//!
//! Architecture invariant: no HTTP routes, tenants, stores or terminal output. A job runner (or
//! `cella run`) creates the sandbox, builds the model client, supplies the sink and the
//! cancellation token, and decides what to do with the report.

pub mod agent;
pub mod bench;
pub mod context;
pub mod event;
pub mod output;
pub mod reflexion;
pub mod sandbox;
pub mod skills;
pub mod tools;

pub use agent::{Agent, AgentOptions, Limits, Outcome, RunReport, StopReason, Strategy};
pub use context::{
    ContextOptions, HistoryEntry, Hit, HitSource, MemoryRecall, Recall, RecallError,
};
pub use event::{AgentEvent, Discard, EventSink, JsonLines, Recorder, TurnPurpose};
pub use reflexion::ReflexionOptions;
pub use sandbox::{ProcessResult, SandboxOpError, SandboxSession};
pub use skills::AttachedSkill;
pub use tokio_util::sync::CancellationToken;
pub use tools::{Language, Tool, ToolOptions, ToolOutput, Toolbox};
