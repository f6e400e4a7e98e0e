//! The `ModelClient` trait every model backend implements, and `build_client`, which picks the
//! implementation for a `ModelConfig`.
//!
//! Owns the contract callers rely on; must not know any wire format.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::anthropic::AnthropicClient;
use crate::config::{ModelConfig, WireFormat};
use crate::error::LlmError;
use crate::event::ChatStream;
use crate::message::{ChatRequest, ChatResponse};
use crate::openai::OpenAiClient;

/// A boxed `Send` future (keeps `ModelClient` usable as `dyn ModelClient`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A model behind some provider.
///
/// Both calls retry rate limits, server errors, timeouts and connection errors before the
/// answer starts (see `ModelConfig::max_retries`); an error inside a stream that already started
/// is yielded once and ends the stream (`LlmError::is_transient` says whether the whole call is
/// worth repeating).
///
/// Run the tool calls of a response whenever `tool_calls` is non-empty, whatever
/// `finish_reason` says: some OpenAI-compatible servers report `stop` with tool calls.
pub trait ModelClient: Send + Sync + std::fmt::Debug {
    /// The configuration the client was built from (provider, model, prices…).
    fn config(&self) -> &ModelConfig;

    /// Starts a streamed call. Resolves once the provider accepted the request (status 2xx);
    /// the events then arrive through the returned stream, which also assembles the response.
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>>;

    /// A non-streamed call: one request, the whole response.
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;
}

/// The client for `config`'s provider: Anthropic Messages for `anthropic`, OpenAI-compatible
/// chat completions for every other provider.
pub fn build_client(config: ModelConfig) -> Result<Arc<dyn ModelClient>, LlmError> {
    Ok(match config.provider.wire_format() {
        WireFormat::AnthropicMessages => Arc::new(AnthropicClient::new(config)?),
        WireFormat::ChatCompletions => Arc::new(OpenAiClient::new(config)?),
    })
}
