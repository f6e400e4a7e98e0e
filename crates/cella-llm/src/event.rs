//! The provider-neutral stream of one model call (`StreamEvent`), the assembler that folds the
//! events into a `ChatResponse`, and `ChatStream`, the stream handed to callers.
//!
//! Owns the invariants every wire decoder must uphold: a tool call's `ToolCallStart` comes
//! before its argument deltas, indices are dense from 0 in call order, `Usage` is cumulative.
//! Must not know any wire format.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::LlmError;
use crate::message::{ChatResponse, FinishReason, ToolCall};
use crate::usage::{Price, Usage};

/// One increment of a streamed model answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// The provider's response id and model name, when known (first event, at most once).
    Started {
        id: Option<String>,
        model: Option<String>,
    },
    /// A piece of the answer text.
    TextDelta { text: String },
    /// The model began tool call number `index` (0, 1, … in call order).
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A piece of the JSON arguments of tool call `index`.
    ToolCallArgumentsDelta { index: usize, delta: String },
    /// Token counts so far for this response; a later `Usage` replaces an earlier one.
    Usage { usage: Usage },
    /// Why the model stopped; the stream ends soon after.
    Finish { reason: FinishReason },
}

/// Folds `StreamEvent`s into a `ChatResponse`.
#[derive(Debug, Clone, Default)]
pub struct ResponseAssembler {
    response: ChatResponse,
    price: Option<Price>,
}

impl ResponseAssembler {
    /// `model` is the configured model (used when the provider names none); `price` gives
    /// `cost_usd`.
    pub fn new(model: impl Into<String>, price: Option<Price>) -> Self {
        Self {
            response: ChatResponse {
                model: model.into(),
                cost_usd: price.map(|p| p.cost(&Usage::default())),
                ..ChatResponse::default()
            },
            price,
        }
    }

    pub fn push(&mut self, event: &StreamEvent) {
        let r = &mut self.response;
        match event {
            StreamEvent::Started { id, model } => {
                if id.is_some() {
                    r.id.clone_from(id);
                }
                if let Some(model) = model.as_ref().filter(|m| !m.is_empty()) {
                    r.model.clone_from(model);
                }
            }
            StreamEvent::TextDelta { text } => r.content.push_str(text),
            StreamEvent::ToolCallStart { index, id, name } => {
                let call = slot(&mut r.tool_calls, *index);
                call.id.clone_from(id);
                call.name.clone_from(name);
            }
            StreamEvent::ToolCallArgumentsDelta { index, delta } => {
                slot(&mut r.tool_calls, *index).arguments.push_str(delta);
            }
            StreamEvent::Usage { usage } => {
                r.usage = *usage;
                r.cost_usd = self.price.map(|p| p.cost(usage));
            }
            StreamEvent::Finish { reason } => r.finish_reason = Some(reason.clone()),
        }
    }

    /// The response assembled so far.
    pub fn response(&self) -> &ChatResponse {
        &self.response
    }

    pub fn finish(self) -> ChatResponse {
        self.response
    }
}

/// The tool call at `index`, creating empty ones up to it (decoders keep indices dense; this
/// keeps a buggy provider from causing a panic).
fn slot(calls: &mut Vec<ToolCall>, index: usize) -> &mut ToolCall {
    // Indices come from our decoders, which number calls densely; cap the gap anyway.
    let index = index.min(calls.len());
    if index == calls.len() {
        calls.push(ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        });
    }
    &mut calls[index]
}

/// The boxed event stream a wire decoder produces.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// The stream of one model call. Yields events as they arrive and assembles the response on
/// the side:
///
/// ```no_run
/// # async fn demo(client: &dyn cella_llm::ModelClient, request: cella_llm::ChatRequest)
/// # -> Result<(), cella_llm::LlmError> {
/// use futures::StreamExt;
/// let mut stream = client.stream(&request).await?;
/// while let Some(event) = stream.next().await {
///     if let cella_llm::StreamEvent::TextDelta { text } = event? {
///         print!("{text}");
///     }
/// }
/// let response = stream.into_response(); // text, tool calls, usage, cost
/// # Ok(()) }
/// ```
///
/// After an `Err` item the stream ends.
pub struct ChatStream {
    inner: EventStream,
    assembler: ResponseAssembler,
    done: bool,
}

impl ChatStream {
    pub fn new(inner: EventStream, assembler: ResponseAssembler) -> Self {
        Self {
            inner,
            assembler,
            done: false,
        }
    }

    /// A stream that yields the given events (for non-streaming calls and test doubles).
    pub fn from_events(
        events: Vec<Result<StreamEvent, LlmError>>,
        assembler: ResponseAssembler,
    ) -> Self {
        Self::new(Box::pin(futures::stream::iter(events)), assembler)
    }

    /// The response assembled from the events seen so far.
    pub fn response(&self) -> &ChatResponse {
        self.assembler.response()
    }

    /// The response assembled from the events seen so far (all of them once the stream ended).
    pub fn into_response(self) -> ChatResponse {
        self.assembler.finish()
    }

    /// Reads the rest of the stream and returns the whole response, or the first error.
    pub async fn collect_response(mut self) -> Result<ChatResponse, LlmError> {
        while let Some(event) = self.next().await {
            event?;
        }
        Ok(self.into_response())
    }
}

impl Stream for ChatStream {
    type Item = Result<StreamEvent, LlmError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.inner.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(event))) => self.assembler.push(event),
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => self.done = true,
            Poll::Pending => {}
        }
        polled
    }
}

impl std::fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatStream")
            .field("response", self.assembler.response())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembles_text_tool_calls_usage_and_cost() {
        let price = Price {
            input: 1.0,
            output: 2.0,
        };
        let mut a = ResponseAssembler::new("configured", Some(price));
        let events = [
            StreamEvent::Started {
                id: Some("r1".into()),
                model: Some("served".into()),
            },
            StreamEvent::TextDelta { text: "Hel".into() },
            StreamEvent::TextDelta { text: "lo".into() },
            StreamEvent::ToolCallStart {
                index: 0,
                id: "a".into(),
                name: "bash".into(),
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: "b".into(),
                name: "read_file".into(),
            },
            StreamEvent::ToolCallArgumentsDelta {
                index: 0,
                delta: "{\"cmd\":".into(),
            },
            StreamEvent::ToolCallArgumentsDelta {
                index: 1,
                delta: "{}".into(),
            },
            StreamEvent::ToolCallArgumentsDelta {
                index: 0,
                delta: "\"ls\"}".into(),
            },
            StreamEvent::Usage {
                usage: Usage {
                    input_tokens: 1_000_000,
                    output_tokens: 500_000,
                    cached_input_tokens: 0,
                },
            },
            StreamEvent::Finish {
                reason: FinishReason::ToolCalls,
            },
        ];
        for e in &events {
            a.push(e);
        }
        let r = a.finish();
        assert_eq!(r.id.as_deref(), Some("r1"));
        assert_eq!(r.model, "served");
        assert_eq!(r.content, "Hello");
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].arguments, "{\"cmd\":\"ls\"}");
        assert_eq!(r.tool_calls[1].name, "read_file");
        assert_eq!(r.finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(r.cost_usd, Some(2.0));
    }

    #[test]
    fn out_of_range_index_does_not_panic() {
        let mut a = ResponseAssembler::new("m", None);
        a.push(&StreamEvent::ToolCallArgumentsDelta {
            index: 99,
            delta: "{}".into(),
        });
        assert_eq!(a.response().tool_calls.len(), 1);
        assert_eq!(a.finish().cost_usd, None);
    }
}
