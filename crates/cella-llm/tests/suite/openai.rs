//! The OpenAI-compatible client against the fake provider: request shape, SSE framing edge
//! cases, tool-call assembly, non-streaming and broken streams.

use bytes::Bytes;
use cella_llm::testing::{FakeProvider, OpenAiSse, Reply};
use cella_llm::{
    ChatResponse, FinishReason, LlmError, ModelClient, OpenAiClient, Price, StreamEvent, Usage,
    build_client,
};
use serde_json::json;

use super::{drain, request};

async fn fake() -> FakeProvider {
    FakeProvider::start().await.expect("fake provider starts")
}

fn client(fake: &FakeProvider) -> OpenAiClient {
    OpenAiClient::new(fake.openai_config("test-model")).expect("client")
}

/// Text with a multi-byte character, then two parallel tool calls whose arguments are split
/// across chunks and interleaved.
fn rich_stream() -> OpenAiSse {
    rich(OpenAiSse::new("test-model"))
}

fn rich(sse: OpenAiSse) -> OpenAiSse {
    sse.text("Checking ")
        .text("the files… ✓")
        .tool_call(0, "call_a", "bash", "{\"cmd\":")
        .tool_call(1, "call_b", "read_file", "")
        .tool_args(1, "{\"path\":\"/work/")
        .tool_args(0, "\"ls -la\"")
        .tool_args(1, "main.py\"}")
        .tool_args(0, "}")
        .finish("tool_calls")
        .usage(120, 30)
}

fn assert_rich(response: &ChatResponse) {
    assert_eq!(response.content, "Checking the files… ✓");
    assert_eq!(response.tool_calls.len(), 2, "{response:?}");
    let a = &response.tool_calls[0];
    assert_eq!((a.id.as_str(), a.name.as_str()), ("call_a", "bash"));
    assert_eq!(a.arguments_json().expect("json"), json!({"cmd": "ls -la"}));
    let b = &response.tool_calls[1];
    assert_eq!((b.id.as_str(), b.name.as_str()), ("call_b", "read_file"));
    assert_eq!(
        b.arguments_json().expect("json"),
        json!({"path": "/work/main.py"})
    );
    assert_eq!(response.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 120,
            output_tokens: 30,
            cached_input_tokens: 0
        }
    );
}

#[tokio::test]
async fn streams_text_usage_and_cost_and_sends_a_chat_completions_request() {
    let fake = fake().await;
    fake.push(Reply::sse(
        OpenAiSse::new("test-model-2025")
            .text("Hel")
            .text("lo")
            .finish("stop")
            .usage(1_000_000, 500_000)
            .build(),
    ));
    let config = fake
        .openai_config("test-model")
        .with_api_key("sk-test")
        .with_header("HTTP-Referer", "https://cella.example")
        .with_price(
            "test-model",
            Price {
                input: 2.0,
                output: 8.0,
            },
        );
    let client = build_client(config).expect("client");
    let stream = client.stream(&request("say hello")).await.expect("stream");
    let (events, error, stream) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    let response = stream.into_response();

    assert_eq!(
        events.first(),
        Some(&StreamEvent::Started {
            id: Some("chatcmpl-fake".into()),
            model: Some("test-model-2025".into())
        })
    );
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["Hel", "lo"], "deltas arrive one by one");
    assert_eq!(response.content, "Hello");
    assert_eq!(response.model, "test-model-2025");
    assert_eq!(response.finish_reason, Some(FinishReason::Stop));
    assert_eq!(response.usage.total_tokens(), 1_500_000);
    assert_eq!(response.cost_usd, Some(6.0));

    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let req = &requests[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(req.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(req.header("http-referer"), Some("https://cella.example"));
    assert_eq!(req.header("content-type"), Some("application/json"));
    let body = req.json();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "you are a test"})
    );
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": "say hello"})
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "bash");
    assert_eq!(
        body["tools"][0]["function"]["parameters"]["required"],
        json!(["cmd"])
    );
}

#[tokio::test]
async fn parallel_tool_calls_split_across_chunks_are_assembled_by_index() {
    let fake = fake().await;
    fake.push(Reply::sse(rich_stream().build()));
    let stream = client(&fake).stream(&request("go")).await.expect("stream");
    let (events, error, stream) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert_rich(&stream.into_response());

    // Each call starts exactly once, before any of its argument deltas.
    for index in 0..2 {
        let start = events
            .iter()
            .position(|e| matches!(e, StreamEvent::ToolCallStart { index: i, .. } if *i == index));
        let first_delta = events.iter().position(
            |e| matches!(e, StreamEvent::ToolCallArgumentsDelta { index: i, .. } if *i == index),
        );
        let starts = events
            .iter()
            .filter(|e| matches!(e, StreamEvent::ToolCallStart { index: i, .. } if *i == index))
            .count();
        assert_eq!(starts, 1);
        assert!(start < first_delta, "call {index}: {events:?}");
    }
}

#[tokio::test]
async fn events_split_across_tcp_writes_at_any_point() {
    let fake = fake().await;
    let events = rich_stream().build();
    // 1 byte per write splits every line, JSON value, `\n\n` and the 3-byte `…` and `✓`.
    for size in [1, 2, 5, 17, 64] {
        fake.push(Reply::sse_split(&events, size));
    }
    let client = client(&fake);
    for size in [1, 2, 5, 17, 64] {
        let response = client
            .stream(&request("go"))
            .await
            .expect("stream")
            .collect_response()
            .await
            .unwrap_or_else(|e| panic!("pieces of {size}: {e}"));
        assert_rich(&response);
    }
}

#[tokio::test]
async fn many_events_in_one_write_with_crlf_and_keepalive_comments() {
    let fake = fake().await;
    let events = rich(OpenAiSse::new("test-model").keepalive())
        .keepalive()
        .crlf()
        .build();
    assert!(events.iter().all(|e| e.ends_with("\r\n\r\n")));
    // The whole stream in a single write.
    fake.push(Reply::sse(vec![Bytes::from(events.concat())]));
    let response = client(&fake)
        .stream(&request("go"))
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("response");
    assert_rich(&response);
}

#[tokio::test]
async fn complete_sends_a_non_streaming_request_and_assembles_the_answer() {
    let fake = fake().await;
    fake.push(Reply::json(
        200,
        &json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Running it.",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "bash", "arguments": "{\"cmd\":\"pytest\"}"}}]
            }}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}
        }),
    ));
    let response = client(&fake)
        .complete(&request("test it"))
        .await
        .expect("response");
    assert_eq!(response.content, "Running it.");
    assert_eq!(response.tool_calls[0].name, "bash");
    assert_eq!(response.tool_calls[0].arguments, "{\"cmd\":\"pytest\"}");
    assert_eq!(response.usage.input_tokens, 50);
    assert_eq!(response.id.as_deref(), Some("chatcmpl-1"));
    let body = fake.requests()[0].json();
    assert_eq!(body["stream"], false);
    assert!(body.get("stream_options").is_none());

    // The assistant message goes back into the conversation with its tool call.
    let mut next = request("test it");
    next.messages.push(response.to_message());
    next.messages
        .push(cella_llm::Message::tool_result("call_1", "1 passed"));
    fake.push(Reply::openai_text("All tests pass."));
    let response = client(&fake).complete(&next).await.expect("second turn");
    assert_eq!(response.content, "All tests pass.");
    let body = fake.requests()[1].json();
    assert_eq!(body["messages"][2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "1 passed"})
    );
}

#[tokio::test]
async fn a_server_ignoring_stream_true_still_streams() {
    let fake = fake().await;
    fake.push(Reply::json(
        200,
        &json!({"choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "plain json"}}]}),
    ));
    let response = client(&fake)
        .stream(&request("hi"))
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("response");
    assert_eq!(response.content, "plain json");
}

#[tokio::test]
async fn malformed_json_in_a_chunk_is_a_clear_error_after_the_good_events() {
    let fake = fake().await;
    fake.push(Reply::sse(
        OpenAiSse::new("test-model")
            .text("partial answer")
            .raw("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"oops}\n\n")
            .finish("stop")
            .build(),
    ));
    let stream = client(&fake).stream(&request("hi")).await.expect("stream");
    let (events, error, stream) = drain(stream).await;
    assert!(
        events.contains(&StreamEvent::TextDelta {
            text: "partial answer".into()
        }),
        "{events:?}"
    );
    let error = error.expect("malformed chunk fails the stream");
    assert!(matches!(error, LlmError::Malformed { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("invalid json in stream chunk") && message.contains("oops"),
        "{message}"
    );
    assert!(!error.is_transient());
    assert_eq!(
        stream.response().content,
        "partial answer",
        "what arrived is kept"
    );
}

#[tokio::test]
async fn cut_streams_and_mid_stream_errors_are_errors() {
    let fake = fake().await;
    // The connection dies mid-stream.
    fake.push(
        Reply::sse(OpenAiSse::new("m").text("half").build_without_done()).abort_after_chunks(),
    );
    // The body ends without `[DONE]` or a finish reason.
    fake.push(Reply::sse(
        OpenAiSse::new("m").text("half").build_without_done(),
    ));
    // OpenRouter-style error chunk inside a 200 stream.
    fake.push(Reply::sse(
        OpenAiSse::new("m")
            .text("half")
            .raw("data: {\"error\":{\"message\":\"provider returned error\",\"code\":502}}\n\n")
            .build(),
    ));
    let client = client(&fake);

    let (_, error, _) = drain(client.stream(&request("a")).await.expect("stream")).await;
    let error = error.expect("aborted");
    assert!(
        error.to_string().contains("connection lost mid-stream"),
        "{error}"
    );

    let (_, error, _) = drain(client.stream(&request("b")).await.expect("stream")).await;
    let error = error.expect("truncated");
    assert!(
        error.to_string().contains("stream ended before [DONE]"),
        "{error}"
    );

    let (_, error, _) = drain(client.stream(&request("c")).await.expect("stream")).await;
    match error.expect("error chunk") {
        LlmError::Provider { kind, message, .. } => {
            assert_eq!(
                (kind.as_str(), message.as_str()),
                ("502", "provider returned error")
            );
        }
        other => panic!("unexpected {other}"),
    }
}

#[tokio::test]
async fn an_sse_body_without_its_content_type_is_still_decoded() {
    let fake = fake().await;
    // Some minimal servers stream with no (or a wrong) content type.
    fake.push(Reply::status(200, rich_stream().build().concat()));
    fake.push(
        Reply::status(200, rich_stream().build().concat())
            .header("content-type", "application/json"),
    );
    let client = client(&fake);
    for _ in 0..2 {
        let response = client
            .complete(&request("go"))
            .await
            .expect("sniffed as sse");
        assert_rich(&response);
    }
}
