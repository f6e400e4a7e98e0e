//! Builders of each provider's real streaming wire format, for scripting the fake provider.
//!
//! Owns what the providers actually send (field names, event order, `[DONE]`, `event:` lines);
//! knows nothing about the HTTP server.

use serde_json::{Value, json};

use super::server::Reply;

/// An OpenAI-compatible chat completions SSE stream, chunk by chunk.
///
/// Each builder call adds one `data:` event; [`OpenAiSse::build`] adds `data: [DONE]`.
#[derive(Debug, Clone)]
pub struct OpenAiSse {
    model: String,
    events: Vec<String>,
    crlf: bool,
}

impl OpenAiSse {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            events: Vec::new(),
            crlf: false,
        }
    }

    /// Ends lines with `\r\n` instead of `\n`.
    pub fn crlf(mut self) -> Self {
        self.crlf = true;
        self
    }

    fn chunk(mut self, choices: Value, usage: Value) -> Self {
        let chunk = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        });
        self.events.push(format!("data: {chunk}\n\n"));
        self
    }

    /// A text delta.
    pub fn text(self, text: &str) -> Self {
        self.chunk(
            json!([{"index": 0, "delta": {"content": text}, "finish_reason": null}]),
            Value::Null,
        )
    }

    /// The first delta of tool call `index`: its id, name and the start of its arguments.
    pub fn tool_call(self, index: u32, id: &str, name: &str, arguments: &str) -> Self {
        self.chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments}
            }]}, "finish_reason": null}]),
            Value::Null,
        )
    }

    /// More argument text of tool call `index` (no id, no name, as OpenAI sends it).
    pub fn tool_args(self, index: u32, arguments: &str) -> Self {
        self.chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{
                "index": index, "function": {"arguments": arguments}
            }]}, "finish_reason": null}]),
            Value::Null,
        )
    }

    /// The chunk with the finish reason (`stop`, `tool_calls`, `length`, …).
    pub fn finish(self, reason: &str) -> Self {
        self.chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": reason}]),
            Value::Null,
        )
    }

    /// The usage chunk sent for `stream_options.include_usage` (empty `choices`).
    pub fn usage(self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.chunk(
            json!([]),
            json!({
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }),
        )
    }

    /// A `:` comment line (keep-alive), as OpenRouter sends while waiting.
    pub fn keepalive(mut self) -> Self {
        self.events.push(": OPENROUTER PROCESSING\n\n".to_owned());
        self
    }

    /// Any raw text as one event (e.g. malformed JSON).
    pub fn raw(mut self, text: &str) -> Self {
        self.events.push(text.to_owned());
        self
    }

    /// The events, then `data: [DONE]`.
    pub fn build(mut self) -> Vec<String> {
        self.events.push("data: [DONE]\n\n".to_owned());
        self.build_without_done()
    }

    /// The events without the closing `[DONE]`.
    pub fn build_without_done(self) -> Vec<String> {
        if self.crlf {
            self.events
                .into_iter()
                .map(|e| e.replace('\n', "\r\n"))
                .collect()
        } else {
            self.events
        }
    }
}

/// An Anthropic Messages SSE stream: `message_start`, content blocks, `message_delta`,
/// `message_stop`, each with its `event:` line.
#[derive(Debug, Clone)]
pub struct AnthropicSse {
    model: String,
    input_tokens: u64,
    events: Vec<(String, Value)>,
    /// Index and kind of the open content block.
    open: Option<(u64, &'static str)>,
    next_index: u64,
}

impl AnthropicSse {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            input_tokens: 0,
            events: Vec::new(),
            open: None,
            next_index: 0,
        }
    }

    /// The input tokens reported in `message_start`.
    pub fn input_tokens(mut self, tokens: u64) -> Self {
        self.input_tokens = tokens;
        self
    }

    fn event(mut self, name: &str, data: Value) -> Self {
        self.events.push((name.to_owned(), data));
        self
    }

    fn close(mut self) -> Self {
        if let Some((index, _)) = self.open.take() {
            self = self.event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            );
        }
        self
    }

    fn open(mut self, kind: &'static str, block: Value) -> (Self, u64) {
        self = self.close();
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, kind));
        let s = self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        (s, index)
    }

    /// A text delta (opening a text block if none is open).
    pub fn text(self, text: &str) -> Self {
        let (s, index) = match self.open {
            Some((index, "text")) => (self, index),
            _ => self.open("text", json!({"type": "text", "text": ""})),
        };
        s.event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "text_delta", "text": text}}),
        )
    }

    /// A whole `tool_use` block whose input JSON arrives in the given pieces.
    pub fn tool_use(self, id: &str, name: &str, input_pieces: &[&str]) -> Self {
        let (mut s, index) = self.open(
            "tool_use",
            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        );
        for piece in input_pieces {
            s = s.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
        }
        s.close()
    }

    /// A `ping` event.
    pub fn ping(self) -> Self {
        self.event("ping", json!({"type": "ping"}))
    }

    /// An `error` event (e.g. `overloaded_error`).
    pub fn error(self, kind: &str, message: &str) -> Self {
        self.event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }

    /// Closes the open block and sends `message_delta` with the stop reason and output tokens.
    pub fn stop(self, reason: &str, output_tokens: u64) -> Self {
        self.close().event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": null},
                   "usage": {"output_tokens": output_tokens}}),
        )
    }

    fn render(&self, events: &[(String, Value)]) -> Vec<String> {
        let start = json!({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 1}
        }});
        std::iter::once(("message_start".to_owned(), start))
            .chain(events.iter().cloned())
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    /// The events from `message_start` to `message_stop`.
    pub fn build(self) -> Vec<String> {
        let mut events = self.events.clone();
        events.push(("message_stop".to_owned(), json!({"type": "message_stop"})));
        self.render(&events)
    }

    /// The events without `message_stop` (a stream cut short).
    pub fn build_without_stop(self) -> Vec<String> {
        self.render(&self.events)
    }
}

/// The model name the one-line replies report.
const FAKE_MODEL: &str = "fake-model";

impl Reply {
    /// A streamed OpenAI-compatible answer: `text` in two deltas, `stop`, usage 10 in / 5 out.
    pub fn openai_text(text: &str) -> Self {
        let (a, b) = split_half(text);
        Self::sse(
            OpenAiSse::new(FAKE_MODEL)
                .text(a)
                .text(b)
                .finish("stop")
                .usage(10, 5)
                .build(),
        )
    }

    /// A streamed OpenAI-compatible answer making these `(id, name, arguments JSON)` tool calls
    /// in parallel, each call's arguments split across two chunks; `tool_calls`, usage 10 / 5.
    pub fn openai_tool_calls(calls: &[(&str, &str, &str)]) -> Self {
        let mut sse = OpenAiSse::new(FAKE_MODEL);
        for (index, (id, name, arguments)) in (0u32..).zip(calls) {
            let (a, b) = split_half(arguments);
            sse = sse.tool_call(index, id, name, a).tool_args(index, b);
        }
        Self::sse(sse.finish("tool_calls").usage(10, 5).build())
    }

    /// A streamed Anthropic answer: `text` in two deltas, `end_turn`, usage 10 in / 5 out.
    pub fn anthropic_text(text: &str) -> Self {
        let (a, b) = split_half(text);
        Self::sse(
            AnthropicSse::new(FAKE_MODEL)
                .input_tokens(10)
                .text(a)
                .text(b)
                .stop("end_turn", 5)
                .build(),
        )
    }

    /// A streamed Anthropic answer making these `(id, name, arguments JSON)` tool calls, each
    /// input split in two `input_json_delta`s; `tool_use`, usage 10 / 5.
    pub fn anthropic_tool_calls(calls: &[(&str, &str, &str)]) -> Self {
        let mut sse = AnthropicSse::new(FAKE_MODEL).input_tokens(10);
        for (id, name, arguments) in calls {
            let (a, b) = split_half(arguments);
            sse = sse.tool_use(id, name, &[a, b]);
        }
        Self::sse(sse.stop("tool_use", 5).build())
    }
}

/// `text` cut in two on a char boundary near the middle.
fn split_half(text: &str) -> (&str, &str) {
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid += 1;
    }
    text.split_at(mid)
}
