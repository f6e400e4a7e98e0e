//! The Anthropic Messages wire format (`POST {base}/v1/messages`, `anthropic-version:
//! 2023-06-01`, `x-api-key`).
//!
//! Owns request encoding (system prompt hoisted, tool results as `tool_result` blocks of a user
//! turn, consecutive same-role turns merged) and decoding of the stream events `message_start`,
//! `content_block_start/delta/stop`, `message_delta`, `message_stop`, `ping` and `error` — and of
//! a whole JSON response — into `StreamEvent`s. Must not know about retries or OpenAI.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::client::{BoxFuture, ModelClient};
use crate::config::ModelConfig;
use crate::error::{LlmError, kind_and_message, shorten};
use crate::event::{ChatStream, StreamEvent};
use crate::http::{Transport, WireDecoder};
use crate::message::{ChatRequest, ChatResponse, FinishReason, Message, ToolChoice};
use crate::sse::SseEvent;
use crate::usage::Usage;

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A client for the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    config: ModelConfig,
    transport: Transport,
    url: String,
}

impl AnthropicClient {
    pub fn new(config: ModelConfig) -> Result<Self, LlmError> {
        let mut auth = vec![("anthropic-version", ANTHROPIC_VERSION.to_owned())];
        if let Some(key) = &config.api_key {
            auth.push(("x-api-key", key.expose().to_owned()));
        }
        let transport = Transport::new(&config, auth)?;
        // `{base}/v1/messages`; a base that already ends in `/v1` is taken as meant.
        let base = config.base_url.trim_end_matches('/');
        let url = format!("{}/v1/messages", base.strip_suffix("/v1").unwrap_or(base));
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
                EventDecoder::new,
                decode_response,
            )
            .await
    }
}

impl ModelClient for AnthropicClient {
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

/// The JSON body of a Messages request.
pub(crate) fn encode_request(config: &ModelConfig, request: &ChatRequest, stream: bool) -> Value {
    let mut system = Vec::new();
    // (role, content blocks); consecutive turns of one role are merged, which also puts the
    // results of parallel tool calls into the one user turn Anthropic requires.
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::System { content } => {
                if !content.is_empty() {
                    system.push(content.as_str());
                }
                continue;
            }
            Message::User { content } => ("user", text_block(content)),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut blocks = text_block(content);
                blocks.extend(tool_calls.iter().map(|call| {
                    json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": input_object(&call.arguments),
                    })
                }));
                ("assistant", blocks)
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": tool_call_id,
                    "content": content,
                });
                if *is_error && let Some(obj) = block.as_object_mut() {
                    obj.insert("is_error".into(), Value::Bool(true));
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let max_tokens = request
        .max_tokens
        .or(config.max_tokens)
        .unwrap_or(ModelConfig::DEFAULT_ANTHROPIC_MAX_TOKENS);
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &request.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!({"type": "none"})),
            ToolChoice::Required => Some(json!({"type": "any"})),
            ToolChoice::Tool(name) => Some(json!({"type": "tool", "name": name})),
        };
        if let Some(choice) = choice {
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if !request.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop));
    }
    if stream {
        body.insert("stream".into(), Value::Bool(true));
    }
    Value::Object(body)
}

/// Anthropic rejects empty text blocks, so empty text gives no block.
fn text_block(text: &str) -> Vec<Value> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// `tool_use.input` must be an object: the model's arguments parsed, `{}` when they are empty
/// or not an object (the model already saw its own text; the tool result explains the error).
fn input_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => Value::Object(Map::new()),
    }
}

// ---- wire types ----

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    content: Vec<Value>,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: Value,
    },
    ContentBlockDelta {
        index: u64,
        delta: Value,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: Value,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: Value,
    },
    #[serde(other)]
    Unknown,
}

pub(crate) fn stop_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

#[derive(Debug, Clone, Copy)]
enum Block {
    Text,
    /// Tool call number `index`; `args` says whether any argument text was sent.
    Tool {
        index: usize,
        args: bool,
    },
    /// Thinking and any block kinds added later: not part of the answer.
    Other,
}

/// Decodes the events of a Messages stream.
#[derive(Debug)]
pub(crate) struct EventDecoder {
    provider: &'static str,
    blocks: HashMap<u64, Block>,
    tools: usize,
    usage: Usage,
    cache_creation: u64,
    cache_read: u64,
    raw_input: u64,
    started: bool,
    /// A `message_delta` with a stop reason arrived.
    stopped: bool,
    done: bool,
}

impl EventDecoder {
    pub(crate) fn new(provider: &'static str) -> Self {
        Self {
            provider,
            blocks: HashMap::new(),
            tools: 0,
            usage: Usage::default(),
            cache_creation: 0,
            cache_read: 0,
            raw_input: 0,
            started: false,
            stopped: false,
            done: false,
        }
    }

    fn malformed(&self, detail: String) -> LlmError {
        LlmError::Malformed {
            provider: self.provider,
            detail,
        }
    }

    /// Usage fields are cumulative; a field left out keeps its earlier value.
    fn update_usage(&mut self, usage: &WireUsage) -> StreamEvent {
        if let Some(n) = usage.input_tokens {
            self.raw_input = n;
        }
        if let Some(n) = usage.cache_creation_input_tokens {
            self.cache_creation = n;
        }
        if let Some(n) = usage.cache_read_input_tokens {
            self.cache_read = n;
        }
        if let Some(n) = usage.output_tokens {
            self.usage.output_tokens = n;
        }
        self.usage.input_tokens = self
            .raw_input
            .saturating_add(self.cache_creation)
            .saturating_add(self.cache_read);
        self.usage.cached_input_tokens = self.cache_read;
        StreamEvent::Usage { usage: self.usage }
    }

    fn block_start(&mut self, index: u64, block: &Value, out: &mut Vec<StreamEvent>) {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let decoded = match kind {
            "text" => {
                let text = block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !text.is_empty() {
                    out.push(StreamEvent::TextDelta {
                        text: text.to_owned(),
                    });
                }
                Block::Text
            }
            "tool_use" => {
                let tool = self.tools;
                self.tools += 1;
                let field = |name: &str| {
                    block
                        .get(name)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                let id = field("id");
                out.push(StreamEvent::ToolCallStart {
                    index: tool,
                    id: if id.is_empty() {
                        format!("toolu_{tool}")
                    } else {
                        id
                    },
                    name: field("name"),
                });
                // A stream starts with `input: {}` and sends the JSON as deltas; a whole
                // response (or a proxy) may send the input right here.
                let preset = block
                    .get("input")
                    .and_then(Value::as_object)
                    .filter(|o| !o.is_empty());
                if let Some(input) = preset {
                    out.push(StreamEvent::ToolCallArgumentsDelta {
                        index: tool,
                        delta: Value::Object(input.clone()).to_string(),
                    });
                }
                Block::Tool {
                    index: tool,
                    args: preset.is_some(),
                }
            }
            _ => Block::Other,
        };
        self.blocks.insert(index, decoded);
    }

    fn wire_event(&mut self, event: WireEvent, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        match event {
            WireEvent::MessageStart { message } => {
                if !self.started {
                    self.started = true;
                    out.push(StreamEvent::Started {
                        id: message.id,
                        model: message.model,
                    });
                }
                if let Some(usage) = &message.usage {
                    out.push(self.update_usage(usage));
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => self.block_start(index, &content_block, out),
            WireEvent::ContentBlockDelta { index, delta } => {
                let block = self
                    .blocks
                    .get_mut(&index)
                    .ok_or_else(|| LlmError::Malformed {
                        provider: self.provider,
                        detail: format!(
                            "content_block_delta for block {index}, which never started"
                        ),
                    })?;
                let kind = delta
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let text = |field: &str| {
                    delta
                        .get(field)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                match (kind, block) {
                    ("text_delta", Block::Text) => {
                        let text = text("text");
                        if !text.is_empty() {
                            out.push(StreamEvent::TextDelta { text });
                        }
                    }
                    ("input_json_delta", Block::Tool { index, args }) => {
                        let delta = text("partial_json");
                        if !delta.is_empty() {
                            *args = true;
                            out.push(StreamEvent::ToolCallArgumentsDelta {
                                index: *index,
                                delta,
                            });
                        }
                    }
                    ("text_delta" | "input_json_delta", _) => {
                        return Err(self.malformed(format!(
                            "{kind} for block {index}, which is of another kind"
                        )));
                    }
                    // thinking_delta, signature_delta, citations_delta, …
                    _ => {}
                }
            }
            WireEvent::ContentBlockStop { index } => {
                if let Some(Block::Tool { index, args: false }) = self.blocks.get(&index) {
                    out.push(StreamEvent::ToolCallArgumentsDelta {
                        index: *index,
                        delta: "{}".to_owned(),
                    });
                }
            }
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = &usage {
                    out.push(self.update_usage(usage));
                }
                if let Some(reason) = delta.get("stop_reason").and_then(Value::as_str) {
                    self.stopped = true;
                    out.push(StreamEvent::Finish {
                        reason: stop_reason(reason),
                    });
                }
            }
            WireEvent::MessageStop => self.done = true,
            WireEvent::Ping | WireEvent::Unknown => {}
            WireEvent::Error { error } => {
                let (kind, message) = kind_and_message(&json!({ "error": error }));
                return Err(LlmError::Provider {
                    provider: self.provider,
                    kind,
                    message,
                });
            }
        }
        Ok(())
    }
}

impl WireDecoder for EventDecoder {
    fn event(&mut self, event: SseEvent) -> Result<Vec<StreamEvent>, LlmError> {
        let mut out = Vec::new();
        if event.data.trim().is_empty() {
            return Ok(out);
        }
        let mut value: Value = serde_json::from_str(&event.data).map_err(|e| {
            self.malformed(format!(
                "invalid json in {} event: {e}; got {:?}",
                event.event.as_deref().unwrap_or("stream"),
                shorten(&event.data, 200)
            ))
        })?;
        // The `type` in the data is authoritative; the `event:` line fills in when it is missing.
        if let (Some(obj), Some(name)) = (value.as_object_mut(), event.event.as_deref())
            && !obj.contains_key("type")
        {
            obj.insert("type".into(), Value::String(name.to_owned()));
        }
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("untyped")
            .to_owned();
        let wire: WireEvent = serde_json::from_value(value)
            .map_err(|e| self.malformed(format!("unexpected shape of {kind} event: {e}")))?;
        self.wire_event(wire, &mut out)?;
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<StreamEvent>, LlmError> {
        // A body that ends after the stop reason lost only the `message_stop` formality.
        if self.stopped {
            return Ok(Vec::new());
        }
        Err(self.malformed("stream ended before message_stop".to_owned()))
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

/// The events of a whole (non-streamed) Messages response.
pub(crate) fn decode_response(
    provider: &'static str,
    body: &[u8],
) -> Vec<Result<StreamEvent, LlmError>> {
    let malformed = |detail: String| vec![Err(LlmError::Malformed { provider, detail })];
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return malformed(format!(
                "invalid json in response body: {e}; got {:?}",
                shorten(&String::from_utf8_lossy(body), 200)
            ));
        }
    };
    if value.get("type").and_then(Value::as_str) == Some("error") {
        let (kind, message) = kind_and_message(&value);
        return vec![Err(LlmError::Provider {
            provider,
            kind,
            message,
        })];
    }
    let message: WireMessage = match serde_json::from_value(value) {
        Ok(m) => m,
        Err(e) => return malformed(format!("unexpected shape of response body: {e}")),
    };
    let mut decoder = EventDecoder::new(provider);
    let mut out = vec![StreamEvent::Started {
        id: message.id,
        model: message.model,
    }];
    for (i, block) in message.content.iter().enumerate() {
        let index = u64::try_from(i).unwrap_or(u64::MAX);
        decoder.block_start(index, block, &mut out);
        if let Some(Block::Tool { index, args: false }) = decoder.blocks.get(&index) {
            out.push(StreamEvent::ToolCallArgumentsDelta {
                index: *index,
                delta: "{}".to_owned(),
            });
        }
    }
    if let Some(usage) = &message.usage {
        out.push(decoder.update_usage(usage));
    }
    if let Some(reason) = &message.stop_reason {
        out.push(StreamEvent::Finish {
            reason: stop_reason(reason),
        });
    }
    out.into_iter().map(Ok).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Provider;
    use crate::event::ResponseAssembler;
    use crate::message::{ToolCall, ToolSpec};

    #[test]
    fn encodes_system_tool_results_and_merges_turns() {
        let config = ModelConfig::new(Provider::Anthropic, "claude-sonnet-4-5");
        let request = ChatRequest {
            messages: vec![
                Message::system("you are terse"),
                Message::system("use tools"),
                Message::user("do two things"),
                Message::Assistant {
                    content: "ok".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "t1".into(),
                            name: "bash".into(),
                            arguments: r#"{"cmd":"ls"}"#.into(),
                        },
                        ToolCall {
                            id: "t2".into(),
                            name: "bash".into(),
                            arguments: "not json".into(),
                        },
                    ],
                },
                Message::tool_result("t1", "a.txt"),
                Message::tool_error("t2", "bad arguments"),
                Message::user("and then?"),
            ],
            tools: vec![ToolSpec::new("bash", "run", json!({"type": "object"}))],
            tool_choice: ToolChoice::Tool("bash".into()),
            ..ChatRequest::default()
        };
        let body = encode_request(&config, &request, true);
        assert_eq!(body["system"], "you are terse\n\nuse tools");
        assert_eq!(body["max_tokens"], 8192);
        assert_eq!(body["stream"], true);
        let messages = body["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert_eq!(messages[1]["content"][1]["input"]["cmd"], "ls");
        assert_eq!(messages[1]["content"][2]["input"], json!({}));
        let results = &messages[2]["content"];
        assert_eq!(results[0]["type"], "tool_result");
        assert_eq!(results[1]["is_error"], true);
        assert_eq!(results[2]["text"], "and then?");
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
        assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "bash"}));
    }

    #[test]
    fn whole_response_decodes() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"bash","input":{"cmd":"ls"}},{"type":"tool_use","id":"toolu_2","name":"noargs","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":7}}"#;
        let mut a = ResponseAssembler::new("m", None);
        for e in decode_response("anthropic", body) {
            a.push(&e.expect("event"));
        }
        let r = a.finish();
        assert_eq!(r.content, "Let me look.");
        assert_eq!(r.tool_calls[0].arguments, r#"{"cmd":"ls"}"#);
        assert_eq!(r.tool_calls[1].arguments, "{}");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 15,
                output_tokens: 7,
                cached_input_tokens: 5
            }
        );
        assert_eq!(r.finish_reason, Some(FinishReason::ToolCalls));

        let err = decode_response(
            "anthropic",
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert!(
            matches!(err.as_slice(), [Err(LlmError::Provider { kind, .. })] if kind == "overloaded_error")
        );
    }

    #[test]
    fn delta_for_unknown_block_is_malformed() {
        let mut d = EventDecoder::new("anthropic");
        let err = d
            .event(SseEvent {
                event: Some("content_block_delta".into()),
                data: r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#.into(),
            })
            .expect_err("unknown block");
        assert!(err.to_string().contains("block 3"), "{err}");
        // Unknown event types are skipped (forward compatibility).
        let ok = d.event(SseEvent {
            event: Some("brand_new".into()),
            data: r#"{"type":"brand_new","x":1}"#.into(),
        });
        assert!(matches!(ok.as_deref(), Ok([])));
    }
}
