//! The OpenAI-compatible chat completions wire format (`POST {base}/chat/completions`), spoken by
//! OpenAI, Groq, OpenRouter, Gemini's compatible endpoint, Ollama, vLLM, llama.cpp and LM Studio.
//!
//! Owns request encoding and the decoding of both the SSE stream and a whole JSON response into
//! `StreamEvent`s, including the assembly of tool-call deltas (parallel calls by `index`,
//! arguments split across chunks, ids and names sent once). Must not know about retries
//! (`http.rs`) or about Anthropic.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::client::{BoxFuture, ModelClient};
use crate::config::{ModelConfig, Provider};
use crate::error::{LlmError, kind_and_message, shorten};
use crate::event::{ChatStream, StreamEvent};
use crate::http::{Transport, WireDecoder};
use crate::message::{ChatRequest, ChatResponse, FinishReason, Message, ToolChoice};
use crate::sse::SseEvent;
use crate::usage::Usage;

/// A client for any OpenAI-compatible chat completions endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    config: ModelConfig,
    transport: Transport,
    url: String,
}

impl OpenAiClient {
    /// Sends `Authorization: Bearer <key>` when a key is configured.
    pub fn new(config: ModelConfig) -> Result<Self, LlmError> {
        let auth = config
            .api_key
            .as_ref()
            .map(|key| ("authorization", format!("Bearer {}", key.expose())))
            .into_iter()
            .collect();
        let transport = Transport::new(&config, auth)?;
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Ok(Self {
            config,
            transport,
            url,
        })
    }

    async fn start(&self, request: &ChatRequest, stream: bool) -> Result<ChatStream, LlmError> {
        let body = encode_request(&self.config, request, stream);
        self.transport
            .chat(
                &self.config,
                &self.url,
                &body,
                ChunkDecoder::new,
                decode_response,
            )
            .await
    }
}

impl ModelClient for OpenAiClient {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatStream, LlmError>> {
        Box::pin(self.start(request, true))
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move { self.start(request, false).await?.collect_response().await })
    }
}

/// The JSON body of a chat completions request.
pub(crate) fn encode_request(config: &ModelConfig, request: &ChatRequest, stream: bool) -> Value {
    let messages: Vec<Value> = request.messages.iter().map(encode_message).collect();
    let mut obj = Map::new();
    obj.insert("model".into(), json!(config.model));
    obj.insert("messages".into(), Value::Array(messages));
    obj.insert("stream".into(), Value::Bool(stream));
    if stream {
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect();
        obj.insert("tools".into(), Value::Array(tools));
        let choice = match &request.tool_choice {
            // Left out: the default everywhere, and some servers reject the field.
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!("none")),
            ToolChoice::Required => Some(json!("required")),
            ToolChoice::Tool(name) => Some(json!({"type": "function", "function": {"name": name}})),
        };
        if let Some(choice) = choice {
            obj.insert("tool_choice".into(), choice);
        }
    }
    if let Some(max) = request.max_tokens.or(config.max_tokens) {
        // OpenAI's reasoning models refuse `max_tokens`; the other servers know only it.
        let key = if config.provider == Provider::OpenAi {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        obj.insert(key.into(), json!(max));
    }
    if let Some(t) = request.temperature {
        obj.insert("temperature".into(), json!(t));
    }
    if !request.stop.is_empty() {
        obj.insert("stop".into(), json!(request.stop));
    }
    Value::Object(obj)
}

fn encode_message(message: &Message) -> Value {
    match message {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            if tool_calls.is_empty() {
                return json!({"role": "assistant", "content": content});
            }
            let calls: Vec<Value> = tool_calls
                .iter()
                .map(|c| {
                    let arguments = if c.arguments.trim().is_empty() {
                        "{}"
                    } else {
                        c.arguments.as_str()
                    };
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments},
                    })
                })
                .collect();
            let content = if content.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
    }
}

// ---- wire types (lenient: every field optional, unknown fields ignored) ----

#[derive(Debug, Deserialize)]
struct Chunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
    /// Groq's older place for the usage of a stream.
    x_groq: Option<XGroq>,
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct XGroq {
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: u64,
    /// Streamed responses.
    delta: Option<WireMessage>,
    /// Whole responses.
    message: Option<WireMessage>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Value,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    index: Option<u64>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    name: Option<String>,
    #[serde(default)]
    arguments: Value,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        }
    }
}

/// Message content is a string, null, or (some servers) a list of `{type:"text", text}` parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Arguments are a JSON string per the spec; a few servers send the object itself.
fn arguments_of(arguments: &Value) -> String {
    match arguments {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(crate) fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" | "end_turn" | "eos" => FinishReason::Stop,
        "length" | "max_tokens" => FinishReason::Length,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(
    provider: &'static str,
    what: &str,
    text: &[u8],
) -> Result<T, LlmError> {
    serde_json::from_slice(text).map_err(|e| LlmError::Malformed {
        provider,
        detail: format!(
            "invalid json in {what}: {e}; got {:?}",
            shorten(&String::from_utf8_lossy(text), 200)
        ),
    })
}

fn mid_stream_error(provider: &'static str, error: &Value) -> LlmError {
    let (kind, message) = kind_and_message(&json!({ "error": error }));
    LlmError::Provider {
        provider,
        kind,
        message,
    }
}

// ---- stream decoding ----

/// One tool call being assembled from deltas.
#[derive(Debug)]
struct PendingCall {
    /// The provider's `index`, when it sent one.
    wire_index: Option<u64>,
    id: Option<String>,
    name: Option<String>,
    /// `ToolCallStart` was emitted.
    started: bool,
    /// Arguments that arrived before the name.
    held: String,
}

/// Decodes `data:` chunks of a chat completions stream.
#[derive(Debug)]
pub(crate) struct ChunkDecoder {
    provider: &'static str,
    started: bool,
    calls: Vec<PendingCall>,
    finish: Option<FinishReason>,
    done: bool,
}

impl ChunkDecoder {
    pub(crate) fn new(provider: &'static str) -> Self {
        Self {
            provider,
            started: false,
            calls: Vec::new(),
            finish: None,
            done: false,
        }
    }

    /// The position of the call a delta belongs to.
    fn call_for(&mut self, delta: &WireToolCall) -> usize {
        let found = match (delta.index, delta.id.as_deref().filter(|id| !id.is_empty())) {
            (Some(i), _) => self.calls.iter().position(|c| c.wire_index == Some(i)),
            // No index (some Gemini versions): a new id is a new call; without an id, a name
            // when the last call already has one starts a new call, anything else continues it.
            (None, Some(id)) => self.calls.iter().position(|c| c.id.as_deref() == Some(id)),
            (None, None) => {
                let names_a_call = delta
                    .function
                    .as_ref()
                    .and_then(|f| f.name.as_deref())
                    .is_some_and(|n| !n.is_empty());
                match self.calls.last() {
                    Some(last) if names_a_call && last.name.is_some() => None,
                    _ => self.calls.len().checked_sub(1),
                }
            }
        };
        found.unwrap_or_else(|| {
            self.calls.push(PendingCall {
                wire_index: delta.index,
                id: None,
                name: None,
                started: false,
                held: String::new(),
            });
            self.calls.len() - 1
        })
    }

    fn tool_delta(&mut self, delta: &WireToolCall, out: &mut Vec<StreamEvent>) {
        let index = self.call_for(delta);
        let Some(call) = self.calls.get_mut(index) else {
            return;
        };
        if call.id.is_none() {
            call.id = delta.id.clone().filter(|id| !id.is_empty());
        }
        let (name, arguments) = match &delta.function {
            Some(f) => (f.name.as_deref(), arguments_of(&f.arguments)),
            None => (None, String::new()),
        };
        if call.name.is_none() {
            call.name = name.filter(|n| !n.is_empty()).map(str::to_owned);
        }
        call.held.push_str(&arguments);
        if !call.started && call.name.is_some() {
            start_call(index, call, out);
        }
        if call.started && !call.held.is_empty() {
            out.push(StreamEvent::ToolCallArgumentsDelta {
                index,
                delta: std::mem::take(&mut call.held),
            });
        }
    }

    /// Starts calls whose name never came (so their arguments are not lost).
    fn flush(&mut self, out: &mut Vec<StreamEvent>) {
        for (index, call) in self.calls.iter_mut().enumerate() {
            if !call.started {
                start_call(index, call, out);
                if !call.held.is_empty() {
                    out.push(StreamEvent::ToolCallArgumentsDelta {
                        index,
                        delta: std::mem::take(&mut call.held),
                    });
                }
            }
        }
    }

    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        if let Some(error) = &chunk.error {
            return Err(mid_stream_error(self.provider, error));
        }
        if !self.started {
            self.started = true;
            out.push(StreamEvent::Started {
                id: chunk.id.clone(),
                model: chunk.model.clone(),
            });
        }
        // Only the first choice: cella never asks for n > 1.
        for choice in chunk.choices.iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta.as_ref().or(choice.message.as_ref()) {
                let text = text_of(&delta.content);
                if !text.is_empty() {
                    out.push(StreamEvent::TextDelta { text });
                }
                for call in &delta.tool_calls {
                    self.tool_delta(call, out);
                }
            }
            if let Some(reason) = choice.finish_reason.as_deref().filter(|r| !r.is_empty()) {
                self.flush(out);
                let reason = finish_reason(reason);
                self.finish = Some(reason.clone());
                out.push(StreamEvent::Finish { reason });
            }
        }
        let usage = chunk
            .usage
            .as_ref()
            .or(chunk.x_groq.as_ref().and_then(|x| x.usage.as_ref()));
        if let Some(usage) = usage {
            out.push(StreamEvent::Usage {
                usage: usage.usage(),
            });
        }
        Ok(())
    }
}

fn start_call(index: usize, call: &mut PendingCall, out: &mut Vec<StreamEvent>) {
    call.started = true;
    out.push(StreamEvent::ToolCallStart {
        index,
        // Some local servers send no id; the tool result still needs one to refer to.
        id: call.id.clone().unwrap_or_else(|| format!("call_{index}")),
        name: call.name.clone().unwrap_or_default(),
    });
}

impl WireDecoder for ChunkDecoder {
    fn event(&mut self, event: SseEvent) -> Result<Vec<StreamEvent>, LlmError> {
        let mut out = Vec::new();
        let data = event.data.trim();
        if data == "[DONE]" {
            self.flush(&mut out);
            self.done = true;
            return Ok(out);
        }
        if data.is_empty() {
            return Ok(out);
        }
        if event.event.as_deref() == Some("error") {
            let value: Value = parse_json(self.provider, "stream error event", data.as_bytes())?;
            let (kind, message) = kind_and_message(&value);
            return Err(LlmError::Provider {
                provider: self.provider,
                kind,
                message,
            });
        }
        let chunk: Chunk = parse_json(self.provider, "stream chunk", data.as_bytes())?;
        self.chunk(chunk, &mut out)?;
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        // Servers that close without `[DONE]` are fine once they said why they stopped.
        if self.finish.is_none() {
            return Err(LlmError::Malformed {
                provider: self.provider,
                detail: "stream ended before [DONE] and without a finish_reason".to_owned(),
            });
        }
        let mut out = Vec::new();
        self.flush(&mut out);
        Ok(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

/// The events of a whole (non-streamed) chat completions response.
pub(crate) fn decode_response(
    provider: &'static str,
    body: &[u8],
) -> Vec<Result<StreamEvent, LlmError>> {
    let chunk: Chunk = match parse_json(provider, "response body", body) {
        Ok(chunk) => chunk,
        Err(e) => return vec![Err(e)],
    };
    if chunk.choices.is_empty() && chunk.error.is_none() {
        return vec![Err(LlmError::Malformed {
            provider,
            detail: format!(
                "response has no choices: {:?}",
                shorten(&String::from_utf8_lossy(body), 200)
            ),
        })];
    }
    let mut decoder = ChunkDecoder::new(provider);
    let mut out = Vec::new();
    match decoder.chunk(chunk, &mut out) {
        Ok(()) => {
            decoder.flush(&mut out);
            out.into_iter().map(Ok).collect()
        }
        Err(e) => vec![Err(e)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ResponseAssembler;
    use crate::message::{ToolCall, ToolSpec};

    fn decode(datas: &[&str]) -> Result<Vec<StreamEvent>, LlmError> {
        let mut d = ChunkDecoder::new("openai");
        let mut out = Vec::new();
        for data in datas {
            out.extend(d.event(SseEvent {
                event: None,
                data: (*data).to_owned(),
            })?);
            if d.is_done() {
                return Ok(out);
            }
        }
        out.extend(d.end()?);
        Ok(out)
    }

    fn assemble(events: &[StreamEvent]) -> ChatResponse {
        let mut a = ResponseAssembler::new("m", None);
        for e in events {
            a.push(e);
        }
        a.finish()
    }

    #[test]
    fn encodes_messages_tools_and_limits() {
        let config = ModelConfig::new(Provider::Groq, "llama").with_api_key("k");
        let request = ChatRequest {
            messages: vec![
                Message::system("be brief"),
                Message::user("list files"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "bash".into(),
                        arguments: String::new(),
                    }],
                },
                Message::tool_result("call_1", "a.txt"),
            ],
            tools: vec![ToolSpec::new("bash", "run", json!({"type": "object"}))],
            tool_choice: ToolChoice::Required,
            max_tokens: Some(100),
            temperature: Some(0.5),
            stop: vec!["END".into()],
        };
        let body = encode_request(&config, &request, true);
        assert_eq!(body["model"], "llama");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(body["messages"][3]["tool_call_id"], "call_1");
        assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
        assert_eq!(body["tool_choice"], "required");
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["stop"][0], "END");

        let openai = ModelConfig::new(Provider::OpenAi, "gpt-5");
        let body = encode_request(&openai, &request, false);
        assert_eq!(body["max_completion_tokens"], 100);
        assert!(body.get("stream_options").is_none());
    }

    #[test]
    fn parallel_tool_calls_without_index_or_name_repeats() {
        // Gemini-style: no `index`, whole calls per chunk; then a llama.cpp-style call with no id.
        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"g1","type":"function","function":{"name":"a","arguments":"{\"x\":1}"}},{"id":"g2","type":"function","function":{"name":"b","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .expect("decodes");
        let r = assemble(&events);
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (
                r.tool_calls[0].id.as_str(),
                r.tool_calls[0].arguments.as_str()
            ),
            ("g1", "{\"x\":1}")
        );
        assert_eq!(
            (r.tool_calls[1].id.as_str(), r.tool_calls[1].name.as_str()),
            ("g2", "b")
        );

        // Neither index nor id: each named delta is a call, unnamed ones continue the last.
        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"a","arguments":"{\"x\":"}},{"function":{"arguments":"1}"}},{"function":{"name":"b","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        ])
        .expect("decodes");
        let r = assemble(&events);
        assert_eq!(r.tool_calls.len(), 2, "{r:?}");
        assert_eq!(r.tool_calls[0].arguments, "{\"x\":1}");
        assert_eq!(
            (r.tool_calls[1].id.as_str(), r.tool_calls[1].name.as_str()),
            ("call_1", "b")
        );

        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"late","arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ])
        .expect("decodes without [DONE] after a finish reason");
        // The start waits for the name, then the held arguments follow it.
        assert!(
            matches!(&events[1], StreamEvent::ToolCallStart { name, id, .. } if name == "late" && id == "call_0")
        );
        let r = assemble(&events);
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":1}");
    }

    #[test]
    fn cut_stream_error_chunk_and_bad_json_are_errors() {
        let err = decode(&[r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#])
            .expect_err("no finish");
        assert!(err.to_string().contains("[DONE]"), "{err}");

        let err = decode(&[r#"{"error":{"message":"upstream overloaded","code":502}}"#])
            .expect_err("error chunk");
        assert!(
            matches!(err, LlmError::Provider { ref message, .. } if message == "upstream overloaded"),
            "{err}"
        );

        let err = decode(&[r#"{"choices":[{"delta":{"content":"#]).expect_err("bad json");
        assert!(matches!(err, LlmError::Malformed { .. }), "{err}");
        assert!(
            err.to_string().contains("invalid json in stream chunk"),
            "{err}"
        );
    }

    #[test]
    fn whole_response_decodes_and_groq_usage_counts() {
        let body = br#"{"id":"x","model":"m2","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"k":"v"}}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}"#;
        let events: Vec<StreamEvent> = decode_response("openai", body)
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("decodes");
        let r = assemble(&events);
        assert_eq!(r.model, "m2");
        assert_eq!(r.tool_calls[0].arguments, r#"{"k":"v"}"#);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 3,
                output_tokens: 4,
                cached_input_tokens: 2
            }
        );
        assert_eq!(r.finish_reason, Some(FinishReason::ToolCalls));

        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}],"x_groq":{"usage":{"prompt_tokens":9,"completion_tokens":1}}}"#,
            "[DONE]",
        ])
        .expect("decodes");
        assert_eq!(assemble(&events).usage.input_tokens, 9);

        let errs = decode_response("openai", b"{}");
        assert!(matches!(errs.as_slice(), [Err(LlmError::Malformed { .. })]));
    }
}
