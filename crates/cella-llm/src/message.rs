//! The provider-neutral conversation model: messages, tool definitions, tool calls and the
//! assembled response of one model call.
//!
//! Owns what a caller (the agent loop) says to a model and what it gets back. Must not know about
//! any wire format: `openai.rs` and `anthropic.rs` translate to and from these types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::usage::Usage;

/// One message of a conversation.
///
/// The conversation is a plain list; providers that need a different shape (Anthropic: a
/// top-level system prompt, tool results inside user turns) are handled by the wire encoders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions for the model. Anthropic receives all system messages joined as its
    /// top-level `system` field.
    System { content: String },
    /// What the user said.
    User { content: String },
    /// What the model answered: text, tool calls, or both.
    Assistant {
        #[serde(default)]
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of running one tool call, answered with the id of that call.
    Tool {
        tool_call_id: String,
        content: String,
        /// The tool failed; Anthropic receives `is_error: true`, OpenAI-compatible providers only
        /// see the content.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
        }
    }

    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// A successful tool result.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed tool result (the error text is what the model sees).
    pub fn tool_error(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
            is_error: true,
        }
    }
}

/// A tool the model may call, described by a JSON Schema for its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object, e.g.
    /// `{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}`.
    pub parameters: Value,
}

impl ToolSpec {
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

/// A call of a tool made by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; the tool result must carry it back.
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not guaranteed to be valid.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments parsed as JSON; empty arguments count as `{}`.
    pub fn arguments_json(&self) -> Result<Value, serde_json::Error> {
        if self.arguments.trim().is_empty() {
            return Ok(Value::Object(serde_json::Map::new()));
        }
        serde_json::from_str(&self.arguments)
    }
}

/// Whether and which tools the model may call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool must be called.
    Tool(String),
}

/// One call of a model: the conversation so far and what the model may do.
///
/// The model name, key and endpoint belong to the client (`ModelConfig`), not to the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Cap on output tokens; `None` uses `ModelConfig::max_tokens`, which Anthropic requires
    /// (8192 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

impl ChatRequest {
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The output token limit was hit; the answer is cut.
    Length,
    /// The model wants its tool calls run.
    ToolCalls,
    /// The provider filtered or the model refused the content.
    ContentFilter,
    /// Anything else, as the provider named it.
    Other(String),
}

/// The assembled answer of one model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The provider's id of the response, when it sent one.
    pub id: Option<String>,
    /// The model that answered, as the provider named it (falls back to the configured model).
    pub model: String,
    /// All text deltas joined.
    pub content: String,
    /// Tool calls in the order the model made them.
    pub tool_calls: Vec<ToolCall>,
    /// `None` only when the provider never said (a stream cut short is an error instead).
    pub finish_reason: Option<FinishReason>,
    pub usage: Usage,
    /// USD, from the configured price table; `None` when the model has no price.
    pub cost_usd: Option<f64>,
}

impl ChatResponse {
    /// The assistant message to append to the conversation.
    pub fn to_message(&self) -> Message {
        Message::Assistant {
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
        }
    }
}
