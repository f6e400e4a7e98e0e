//! The agent-overhead benchmark behind `cella bench agent`: what one step of the tool-calling
//! loop costs besides the model and the tool — request building, stream handling, argument
//! parsing, dispatch, history, events serialized to JSON.
//!
//! A zero-latency in-process model ([`InstantModel`]) asks for a trivial in-process tool
//! (`noop`) `steps` times, then answers; a step is the time between two consecutive model
//! turns. Owns nothing else; must not know about sandboxes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use cella_llm::{
    BoxFuture, ChatRequest, ChatResponse, ChatStream, FinishReason, LlmError, ModelClient,
    ModelConfig, Provider, ResponseAssembler, StreamEvent, ToolSpec, Usage,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentOptions, Limits, Outcome};
use crate::event::{AgentEvent, EventSink};
use crate::sandbox::SandboxSession;
use crate::tools::{Tool, ToolOutput, Toolbox};

/// A model with no latency: a `noop` tool call per turn until `calls` turns were made, then a
/// text answer.
#[derive(Debug)]
pub struct InstantModel {
    config: ModelConfig,
    calls: u64,
    made: AtomicU64,
}

impl InstantModel {
    pub fn new(calls: u64) -> Self {
        Self {
            config: ModelConfig::new(Provider::OpenAiCompatible, "instant"),
            calls,
            made: AtomicU64::new(0),
        }
    }

    fn events(&self) -> Vec<Result<StreamEvent, LlmError>> {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let usage = StreamEvent::Usage {
            usage: Usage {
                input_tokens: 100,
                output_tokens: 10,
                cached_input_tokens: 0,
            },
        };
        let mut events = vec![StreamEvent::Started {
            id: Some(format!("r{n}")),
            model: None,
        }];
        if n < self.calls {
            events.extend([
                StreamEvent::ToolCallStart {
                    index: 0,
                    id: format!("call_{n}"),
                    name: "noop".into(),
                },
                StreamEvent::ToolCallArgumentsDelta {
                    index: 0,
                    delta: "{\"text\":".into(),
                },
                StreamEvent::ToolCallArgumentsDelta {
                    index: 0,
                    delta: format!("\"step {n}\"}}"),
                },
                usage,
                StreamEvent::Finish {
                    reason: FinishReason::ToolCalls,
                },
            ]);
        } else {
            events.extend([
                StreamEvent::TextDelta {
                    text: "done".into(),
                },
                usage,
                StreamEvent::Finish {
                    reason: FinishReason::Stop,
                },
            ]);
        }
        events.into_iter().map(Ok).collect()
    }
}

impl ModelClient for InstantModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn stream<'a>(
        &'a self,
        _request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>> {
        Box::pin(async move {
            Ok(ChatStream::from_events(
                self.events(),
                ResponseAssembler::new("instant", None),
            ))
        })
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move { self.stream(request).await?.collect_response().await })
    }
}

/// The trivial tool: echoes its `text` argument.
#[derive(Debug, Default)]
pub struct Noop;

impl Tool for Noop {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "noop",
            "echo the text",
            json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let text = args.get("text").and_then(Value::as_str).unwrap_or("");
            ToolOutput::ok(text, "echoed")
        })
    }
}

/// Records when each model turn started; serializes every event as a JSON line would be.
#[derive(Default)]
pub struct StepClock {
    turns: Mutex<Vec<Instant>>,
    bytes: AtomicU64,
}

impl EventSink for StepClock {
    fn emit(&self, event: &AgentEvent) {
        let now = Instant::now();
        self.bytes
            .fetch_add(event.to_json().len() as u64 + 1, Ordering::Relaxed);
        if matches!(event, AgentEvent::ModelTurn { .. }) {
            self.turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now);
        }
    }
}

impl StepClock {
    /// Durations between consecutive model turns.
    pub fn steps(&self) -> Vec<Duration> {
        let turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// Result of [`agent_overhead`], in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    pub steps: usize,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// The whole run, divided by the number of steps.
    pub wall_per_step_us: f64,
}

/// Runs the tool-calling loop for `steps` tool-calling steps over `model` (an
/// [`InstantModel`] when `None`) with the `noop` tool, and measures each step.
pub async fn agent_overhead(
    steps: usize,
    model: Option<Arc<dyn ModelClient>>,
) -> Result<OverheadReport, String> {
    let model =
        model.unwrap_or_else(|| Arc::new(InstantModel::new(steps as u64)) as Arc<dyn ModelClient>);
    let options = AgentOptions {
        limits: Limits {
            max_steps: u32::try_from(steps + 1).unwrap_or(u32::MAX),
            ..Limits::default()
        },
        ..AgentOptions::default()
    };
    // The sandbox is never reached: the toolbox holds only the in-process tool.
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent"));
    let agent =
        Agent::new(model, sandbox, options).with_toolbox(Toolbox::new(vec![Arc::new(Noop)]));
    let clock = StepClock::default();
    let started = Instant::now();
    let report = agent
        .run("benchmark", &clock, &CancellationToken::new())
        .await;
    let wall = started.elapsed();
    if !matches!(report.outcome, Outcome::Answered { .. }) {
        return Err(format!(
            "the benchmark run did not finish: {:?}",
            report.outcome
        ));
    }
    let mut us: Vec<f64> = clock
        .steps()
        .iter()
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    if us.is_empty() {
        return Err("no steps were measured".into());
    }
    us.sort_by(f64::total_cmp);
    let pct =
        |p: f64| us[(((p / 100.0) * (us.len() - 1) as f64).round() as usize).min(us.len() - 1)];
    Ok(OverheadReport {
        steps: us.len(),
        median_us: pct(50.0),
        p90_us: pct(90.0),
        p99_us: pct(99.0),
        max_us: us[us.len() - 1],
        mean_us: us.iter().sum::<f64>() / us.len() as f64,
        wall_per_step_us: wall.as_secs_f64() * 1e6 / (steps.max(1) as f64),
    })
}
