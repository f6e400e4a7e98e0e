//! Test groups: wire formats (`openai`, `anthropic`), retries and timeouts (`retries`), error
//! statuses (`errors`), configuration to client (`config`), and the in-process `scripted` double.

mod anthropic;
mod config;
mod errors;
mod openai;
mod retries;
mod scripted;

use cella_llm::{ChatRequest, ChatStream, LlmError, Message, StreamEvent, ToolSpec};
use futures::StreamExt;
use serde_json::json;

/// A request with one user message and a `bash` tool.
pub(crate) fn request(prompt: &str) -> ChatRequest {
    ChatRequest::new(vec![
        Message::system("you are a test"),
        Message::user(prompt),
    ])
    .with_tools(vec![ToolSpec::new(
        "bash",
        "run a shell command",
        json!({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}),
    )])
}

/// Every item of a stream: the events until the first error, and that error.
pub(crate) async fn drain(
    mut stream: ChatStream,
) -> (Vec<StreamEvent>, Option<LlmError>, ChatStream) {
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => events.push(event),
            Err(e) => return (events, Some(e), stream),
        }
    }
    (events, None, stream)
}
