//! Test doubles for code that talks to models (cargo feature `testing`; never in production
//! builds).
//!
//! - [`FakeProvider`]: a real HTTP server on `127.0.0.1:0` that answers each request with the
//!   next scripted [`Reply`] (status, headers, delay, a JSON body or an SSE body written chunk by
//!   chunk with pauses, optionally cut off) and records every request it got. Point a real
//!   client at it with [`FakeProvider::openai_config`] / [`FakeProvider::anthropic_config`].
//! - [`OpenAiSse`] and [`AnthropicSse`]: builders of each provider's real SSE wire format (text,
//!   parallel tool calls with arguments split across chunks, usage, finish reason), plus
//!   one-line replies such as [`Reply::openai_tool_calls`] and [`Reply::anthropic_text`] for
//!   scripting whole conversations.
//! - [`ScriptedClient`]: an in-process `ModelClient` that yields scripted events with no HTTP at
//!   all (zero model latency, for measuring the agent loop's own overhead) and records the
//!   requests.
//!
//! Use from another crate's tests:
//!
//! ```toml
//! [dev-dependencies]
//! cella-llm = { workspace = true, features = ["testing"] }   # or { path = "../cella-llm", … }
//! ```

mod scripted;
mod server;
mod wire;

pub use scripted::{ScriptedClient, ScriptedTurn};
pub use server::{FakeProvider, RecordedRequest, Reply, Responder};
pub use wire::{AnthropicSse, OpenAiSse};
