//! In-process tools and helpers shared by the suite.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cella_agent::{Agent, AgentEvent, AgentOptions, SandboxSession, Tool, ToolOutput, Toolbox};
use cella_llm::{BoxFuture, ModelClient, ToolSpec};
use serde_json::{Value, json};

/// Records the `text` of every call, answers `ok: <text>`.
#[derive(Clone, Default)]
pub struct Memo(pub Arc<Mutex<Vec<String>>>);

impl Tool for Memo {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "memo",
            "remember a text",
            json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        )
    }
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let Some(text) = args.get("text").and_then(Value::as_str) else {
                return ToolOutput::error("memo: missing required argument \"text\"");
            };
            self.0.lock().expect("lock").push(text.to_owned());
            ToolOutput::ok(format!("ok: {text}"), "remembered")
        })
    }
}

/// Sleeps `secs` seconds.
pub struct Sleep;

impl Tool for Sleep {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("sleep", "sleep", json!({"type": "object"}))
    }
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let secs = args.get("secs").and_then(Value::as_f64).unwrap_or(1.0);
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            ToolOutput::ok("slept", "slept")
        })
    }
}

/// An agent whose only tools are `memo` and `sleep` (the sandbox is never reached).
pub fn agent(model: Arc<dyn ModelClient>, options: AgentOptions, memo: &Memo) -> Agent {
    let sandbox = SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent/envd.sock"));
    Agent::new(model, sandbox, options)
        .with_toolbox(Toolbox::new(vec![Arc::new(memo.clone()), Arc::new(Sleep)]))
}

pub fn types(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            serde_json::to_value(e).expect("serializes")["type"]
                .as_str()
                .expect("type")
                .to_owned()
        })
        .collect()
}
