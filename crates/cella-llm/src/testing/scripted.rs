//! `ScriptedClient`: an in-process `ModelClient` answering each call with the next scripted turn,
//! with no HTTP and no delay.
//!
//! Owns nothing but a queue of turns and the log of requests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::{BoxFuture, ModelClient};
use crate::config::{ModelConfig, Provider};
use crate::error::LlmError;
use crate::event::{ChatStream, ResponseAssembler, StreamEvent};
use crate::message::{ChatRequest, ChatResponse, FinishReason};
use crate::usage::Usage;

/// One scripted model answer: the events to stream, or the error the call fails with.
#[derive(Debug)]
pub enum ScriptedTurn {
    Events(Vec<StreamEvent>),
    Fail(LlmError),
}

impl ScriptedTurn {
    /// Text, `stop`, usage 10 in / 5 out.
    pub fn text(text: &str) -> Self {
        Self::Events(vec![
            StreamEvent::TextDelta {
                text: text.to_owned(),
            },
            usage(),
            StreamEvent::Finish {
                reason: FinishReason::Stop,
            },
        ])
    }

    /// These `(id, name, arguments JSON)` tool calls, `tool_calls`, usage 10 in / 5 out.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Self {
        let mut events = Vec::new();
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            events.push(StreamEvent::ToolCallStart {
                index,
                id: (*id).to_owned(),
                name: (*name).to_owned(),
            });
            events.push(StreamEvent::ToolCallArgumentsDelta {
                index,
                delta: (*arguments).to_owned(),
            });
        }
        events.push(usage());
        events.push(StreamEvent::Finish {
            reason: FinishReason::ToolCalls,
        });
        Self::Events(events)
    }
}

fn usage() -> StreamEvent {
    StreamEvent::Usage {
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            cached_input_tokens: 0,
        },
    }
}

#[derive(Debug, Default)]
struct State {
    turns: VecDeque<ScriptedTurn>,
    requests: Vec<ChatRequest>,
}

/// A model that answers from a script. Clones share the script.
///
/// A call with no turn left fails with `LlmError::Provider` (kind `script_exhausted`).
#[derive(Debug, Clone)]
pub struct ScriptedClient {
    config: ModelConfig,
    state: Arc<Mutex<State>>,
}

impl ScriptedClient {
    /// Provider `openai-compatible`, model `scripted`; prices and other settings can be changed
    /// through [`ScriptedClient::with_config`].
    pub fn new(turns: impl IntoIterator<Item = ScriptedTurn>) -> Self {
        Self {
            config: ModelConfig::new(Provider::OpenAiCompatible, "scripted"),
            state: Arc::new(Mutex::new(State {
                turns: turns.into_iter().collect(),
                requests: Vec::new(),
            })),
        }
    }

    pub fn with_config(mut self, config: ModelConfig) -> Self {
        self.config = config;
        self
    }

    /// Queues another turn.
    pub fn push(&self, turn: ScriptedTurn) {
        self.lock().turns.push_back(turn);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.lock().requests.clone()
    }

    /// Turns not yet used.
    pub fn remaining(&self) -> usize {
        self.lock().turns.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn next(&self, request: &ChatRequest) -> Result<ChatStream, LlmError> {
        let turn = {
            let mut state = self.lock();
            state.requests.push(request.clone());
            state.turns.pop_front()
        };
        let assembler = ResponseAssembler::new(self.config.model.clone(), self.config.price());
        match turn {
            Some(ScriptedTurn::Events(events)) => Ok(ChatStream::from_events(
                events.into_iter().map(Ok).collect(),
                assembler,
            )),
            Some(ScriptedTurn::Fail(error)) => Err(error),
            None => Err(LlmError::Provider {
                provider: "scripted",
                kind: "script_exhausted".to_owned(),
                message: "no scripted turn left".to_owned(),
            }),
        }
    }
}

impl ModelClient for ScriptedClient {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>> {
        Box::pin(async move { self.next(request) })
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move { self.next(request)?.collect_response().await })
    }
}
