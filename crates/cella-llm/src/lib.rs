//! cella-llm: model clients behind one trait.
//!
//! - [`ModelClient`] — `stream` (events as they arrive, response assembled on the side) and
//!   `complete` (the whole response); built for a [`ModelConfig`] by [`build_client`].
//! - Two wire formats: OpenAI-compatible chat completions ([`OpenAiClient`]: OpenAI, Groq,
//!   OpenRouter, Gemini, Ollama, vLLM, llama.cpp, LM Studio) and Anthropic Messages
//!   ([`AnthropicClient`]), both hand-written over reqwest + a small SSE decoder.
//! - A provider-neutral conversation model ([`Message`], [`ToolSpec`], [`ToolCall`],
//!   [`ChatRequest`], [`ChatResponse`]) and stream events ([`StreamEvent`]).
//! - Retries with backoff and `Retry-After`, timeouts, typed errors ([`LlmError`]), usage and
//!   cost ([`Usage`], [`Price`]).
//! - Configuration from `cella.toml`, the environment and flags ([`ModelConfig::load`]).
//! - With the `testing` feature: [`testing`], a fake provider HTTP server and an in-process
//!   scripted client for tests of the agent loop.
//!
//! Architecture invariant: this crate knows models and HTTP, nothing about sandboxes, tools'
//! behaviour, jobs or the agent loop. The loop owns turns and tool execution; this crate owns
//! one call.

mod anthropic;
mod client;
mod config;
mod error;
mod event;
mod http;
mod message;
mod openai;
#[cfg(test)]
mod robustness;
mod sse;
mod usage;

#[cfg(feature = "testing")]
pub mod testing;

pub use anthropic::{ANTHROPIC_VERSION, AnthropicClient};
pub use client::{BoxFuture, ModelClient, build_client};
pub use config::{ApiKey, ConfigError, ModelConfig, ModelSettings, Provider, WireFormat};
pub use error::LlmError;
pub use event::{ChatStream, EventStream, ResponseAssembler, StreamEvent};
pub use message::{
    ChatRequest, ChatResponse, FinishReason, Message, ToolCall, ToolChoice, ToolSpec,
};
pub use openai::OpenAiClient;
pub use sse::{SseDecoder, SseError, SseEvent};
pub use usage::{Price, PriceTable, Usage};
