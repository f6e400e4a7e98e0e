//! What a run reports while it happens: typed [`AgentEvent`]s handed to an [`EventSink`], one
//! JSON object each (JSON lines for `cella run --json`, stored events for jobs).
//!
//! Owns the event vocabulary and the sinks. Must not know where events end up (terminal,
//! store, SSE): that belongs to whoever supplies the sink.

use std::io::Write;
use std::sync::{Arc, Mutex};

use cella_llm::Usage;
use serde::{Deserialize, Serialize};

/// Why a model call was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnPurpose {
    /// A step of the tool-calling loop.
    Act,
    /// Reflexion: write the program.
    Generate,
    /// Reflexion: analyse a failed attempt.
    Critique,
    /// Summarise older turns so the prompt fits the context window.
    Summarize,
}

/// One thing that happened during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The run began.
    RunStarted {
        strategy: String,
        model: String,
        tools: Vec<String>,
        skills: Vec<String>,
    },
    /// Something the user should know that does not stop the run.
    Warning { message: String },
    /// A model call began (`step` counts model calls from 1).
    ModelTurn { step: u32, purpose: TurnPurpose },
    /// A piece of the model's text.
    TextDelta { text: String },
    /// The model asked for a tool; `arguments` is its raw JSON text.
    ToolCallStarted {
        step: u32,
        id: String,
        name: String,
        arguments: String,
    },
    /// A tool finished. `output` is exactly what the model sees (already capped).
    ToolResult {
        step: u32,
        id: String,
        name: String,
        is_error: bool,
        exit_code: Option<i32>,
        summary: String,
        truncated: bool,
        output: String,
        duration_ms: u64,
    },
    /// The prompt for model call `step` was compacted to fit the context window: old tool
    /// outputs elided (`recall` shows them again), older turns summarised, the newest outputs
    /// shortened. The full history is unchanged.
    ContextCompacted {
        step: u32,
        /// The whole history, verbatim, with the tool definitions.
        history_tokens: u32,
        /// The prompt before this compaction (earlier compactions applied).
        tokens_before: u32,
        /// The prompt sent.
        tokens_after: u32,
        /// The prompt budget (window − answer reserve − margin).
        limit: u32,
        elided: u32,
        summarized: u32,
        shortened: u32,
    },
    /// Token use of one model call and the run's totals so far.
    Usage {
        step: u32,
        usage: Usage,
        total: Usage,
        cost_usd: Option<f64>,
        total_cost_usd: Option<f64>,
    },
    /// Reflexion: attempt `attempt` of `max_attempts` began.
    AttemptStarted { attempt: u32, max_attempts: u32 },
    /// Reflexion: the program of this attempt.
    CodeGenerated {
        attempt: u32,
        language: String,
        path: String,
        code: String,
    },
    /// Reflexion: what running it (or a test command) gave.
    Execution {
        attempt: u32,
        command: String,
        exit_code: Option<i32>,
        summary: String,
        truncated: bool,
        output: String,
    },
    /// Reflexion: one success check.
    Check {
        attempt: u32,
        check: String,
        passed: bool,
        detail: String,
    },
    /// Reflexion: the critic's analysis of a failed attempt.
    Critique { attempt: u32, text: String },
    /// Reflexion: an attempt ended.
    AttemptFinished { attempt: u32, success: bool },
    /// The run's answer.
    FinalAnswer { text: String },
    /// A limit or a cancellation stopped the run.
    Stopped { kind: String, reason: String },
    /// The run failed (model error, sandbox gone…).
    Error { message: String },
    /// Last event of every run.
    RunFinished {
        status: String,
        steps: u32,
        usage: Usage,
        cost_usd: Option<f64>,
        duration_ms: u64,
    },
}

impl AgentEvent {
    /// One JSON object (no newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"type\":\"error\",\"message\":\"unserializable event: {e}\"}}")
        })
    }
}

/// Where a run's events go. Called in order, from the task driving the run; must not block for
/// long (buffer or forward to a channel).
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &AgentEvent);
}

impl<F: Fn(&AgentEvent) + Send + Sync> EventSink for F {
    fn emit(&self, event: &AgentEvent) {
        self(event)
    }
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<AgentEvent> {
    fn emit(&self, event: &AgentEvent) {
        let _ = self.send(event.clone());
    }
}

/// Drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl EventSink for Discard {
    fn emit(&self, _: &AgentEvent) {}
}

/// Keeps every event (tests, stored runs).
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    events: Arc<Mutex<Vec<AgentEvent>>>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn events(&self) -> Vec<AgentEvent> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl EventSink for Recorder {
    fn emit(&self, event: &AgentEvent) {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(event.clone());
    }
}

/// Writes each event as one JSON line and flushes.
#[derive(Debug)]
pub struct JsonLines<W: Write + Send> {
    out: Mutex<W>,
}

impl<W: Write + Send> JsonLines<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: Mutex::new(out),
        }
    }
}

impl<W: Write + Send> EventSink for JsonLines<W> {
    fn emit(&self, event: &AgentEvent) {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(out, "{}", event.to_json());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_json_lines_that_round_trip() {
        let e = AgentEvent::ToolResult {
            step: 2,
            id: "c1".into(),
            name: "bash".into(),
            is_error: false,
            exit_code: Some(0),
            summary: "exit 0".into(),
            truncated: false,
            output: "hi\n".into(),
            duration_ms: 3,
        };
        let line = e.to_json();
        assert!(line.starts_with("{\"type\":\"tool_result\""), "{line}");
        assert!(!line.contains('\n'));
        let back: AgentEvent = serde_json::from_str(&line).expect("parses");
        assert_eq!(back, e);
        let sink = JsonLines::new(Vec::new());
        sink.emit(&AgentEvent::FinalAnswer {
            text: "a\nb".into(),
        });
        let out = sink.out.into_inner().expect("lock");
        assert_eq!(out, b"{\"type\":\"final_answer\",\"text\":\"a\\nb\"}\n");
    }
}
