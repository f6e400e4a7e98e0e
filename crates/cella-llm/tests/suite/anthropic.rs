//! The Anthropic Messages client against the fake provider: headers, request shape, `event:`
//! framing, `tool_use` input split across chunks, ping, error events, cut streams.

use std::time::Duration;

use cella_llm::testing::{AnthropicSse, FakeProvider, Reply};
use cella_llm::{
    AnthropicClient, ChatResponse, FinishReason, LlmError, Message, ModelClient, StreamEvent,
    ToolCall, Usage,
};
use serde_json::json;

use super::{drain, request};

async fn fake() -> FakeProvider {
    FakeProvider::start().await.expect("fake provider starts")
}

fn client(fake: &FakeProvider) -> AnthropicClient {
    AnthropicClient::new(fake.anthropic_config("claude-test")).expect("client")
}

/// A text block, a ping, then two tool_use blocks whose input arrives in pieces.
fn rich_stream() -> AnthropicSse {
    AnthropicSse::new("claude-test-2025")
        .input_tokens(321)
        .text("I'll run ")
        .ping()
        .text("both — ✓")
        .tool_use(
            "toolu_01",
            "bash",
            &["", "{\"cmd\": ", "\"python3 main.py\"", "}"],
        )
        .tool_use("toolu_02", "read_file", &["{\"path\":\"out.txt\"}"])
        .stop("tool_use", 42)
}

fn assert_rich(response: &ChatResponse) {
    assert_eq!(response.content, "I'll run both — ✓");
    assert_eq!(response.model, "claude-test-2025");
    assert_eq!(response.id.as_deref(), Some("msg_fake"));
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_01".into(),
                name: "bash".into(),
                arguments: "{\"cmd\": \"python3 main.py\"}".into()
            },
            ToolCall {
                id: "toolu_02".into(),
                name: "read_file".into(),
                arguments: "{\"path\":\"out.txt\"}".into()
            },
        ]
    );
    assert_eq!(response.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 321,
            output_tokens: 42,
            cached_input_tokens: 0
        }
    );
}

#[tokio::test]
async fn streams_content_blocks_and_sends_a_messages_request() {
    let fake = fake().await;
    fake.push(Reply::sse(rich_stream().build()));
    let stream = client(&fake)
        .stream(&request("run it"))
        .await
        .expect("stream");
    let (events, error, stream) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert_rich(&stream.into_response());
    assert!(events.contains(&StreamEvent::ToolCallStart {
        index: 1,
        id: "toolu_02".into(),
        name: "read_file".into()
    }));

    let req = &fake.requests()[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(req.header("x-api-key"), Some("test-key"));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(req.header("authorization"), None);
    let body = req.json();
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 8192);
    assert_eq!(body["system"], "you are a test");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "run it"}]}])
    );
    assert_eq!(body["tools"][0]["name"], "bash");
    assert_eq!(body["tools"][0]["input_schema"]["required"], json!(["cmd"]));
}

#[tokio::test]
async fn event_lines_split_across_writes_with_crlf_endings() {
    let fake = fake().await;
    let lf = rich_stream().build();
    let crlf: Vec<String> = lf.iter().map(|e| e.replace('\n', "\r\n")).collect();
    let sizes = [1, 3, 11, 100];
    for size in sizes {
        fake.push(Reply::sse_split(&lf, size));
        fake.push(Reply::sse_split(&crlf, size));
    }
    // Everything in one write, and pieces with real pauses between writes.
    fake.push(Reply::sse(vec![crlf.concat()]));
    fake.push(Reply::sse_split(&crlf, 7).gap(Duration::from_millis(1)));
    let client = client(&fake);
    for attempt in 0..sizes.len() * 2 + 2 {
        let response = client
            .stream(&request("run it"))
            .await
            .expect("stream")
            .collect_response()
            .await
            .unwrap_or_else(|e| panic!("reply {attempt}: {e}"));
        assert_rich(&response);
    }
}

#[tokio::test]
async fn tool_results_go_back_as_tool_result_blocks_of_one_user_turn() {
    let fake = fake().await;
    fake.push(Reply::anthropic_tool_calls(&[
        ("toolu_a", "bash", r#"{"cmd":"ls"}"#),
        ("toolu_b", "bash", r#"{"cmd":"pwd"}"#),
    ]));
    fake.push(Reply::anthropic_text("Two files in /work."));
    let client = client(&fake);
    let mut conversation = request("look around");
    let first = client
        .stream(&conversation)
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("first turn");
    assert_eq!(first.tool_calls.len(), 2);
    conversation.messages.push(first.to_message());
    conversation
        .messages
        .push(Message::tool_result("toolu_a", "a.py b.py"));
    conversation
        .messages
        .push(Message::tool_error("toolu_b", "permission denied"));
    let second = client
        .stream(&conversation)
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("second turn");
    assert_eq!(second.content, "Two files in /work.");
    assert_eq!(second.usage.input_tokens, 10);

    let body = fake.requests()[1].json();
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "bash", "input": {"cmd": "ls"}},
            {"type": "tool_use", "id": "toolu_b", "name": "bash", "input": {"cmd": "pwd"}},
        ]})
    );
    assert_eq!(
        body["messages"][2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a.py b.py"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "permission denied", "is_error": true},
        ]})
    );
}

#[tokio::test]
async fn complete_sends_a_non_streaming_request() {
    let fake = fake().await;
    fake.push(Reply::json(
        200,
        &json!({
            "id": "msg_9", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": "Done."}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 3,
                      "cache_creation_input_tokens": 100, "cache_read_input_tokens": 200}
        }),
    ));
    let response = client(&fake)
        .complete(&request("finish"))
        .await
        .expect("response");
    assert_eq!(response.content, "Done.");
    assert_eq!(response.finish_reason, Some(FinishReason::Stop));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 312,
            output_tokens: 3,
            cached_input_tokens: 200
        }
    );
    assert!(fake.requests()[0].json().get("stream").is_none());
}

#[tokio::test]
async fn error_event_mid_stream_is_a_transient_provider_error() {
    let fake = fake().await;
    fake.push(Reply::sse(
        AnthropicSse::new("claude-test")
            .text("Start")
            .error("overloaded_error", "Overloaded")
            .build(),
    ));
    let (events, error, _) =
        drain(client(&fake).stream(&request("x")).await.expect("stream")).await;
    assert!(events.contains(&StreamEvent::TextDelta {
        text: "Start".into()
    }));
    let error = error.expect("error event");
    assert!(
        matches!(&error, LlmError::Provider { kind, message, .. } if kind == "overloaded_error" && message == "Overloaded"),
        "{error}"
    );
    assert!(error.is_transient());
    assert_eq!(
        error.to_string(),
        "anthropic reported an error mid-stream (overloaded_error): Overloaded"
    );
}

#[tokio::test]
async fn malformed_event_json_and_missing_message_stop_are_errors() {
    let fake = fake().await;
    let mut broken = AnthropicSse::new("claude-test").text("ok").build();
    broken.insert(
        2,
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_del\n\n"
            .into(),
    );
    fake.push(Reply::sse(broken));
    fake.push(Reply::sse(
        AnthropicSse::new("claude-test")
            .text("cut")
            .build_without_stop(),
    ));
    let client = client(&fake);

    let (_, error, _) = drain(client.stream(&request("a")).await.expect("stream")).await;
    let error = error.expect("bad json");
    assert!(matches!(error, LlmError::Malformed { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("invalid json in content_block_delta event"),
        "{error}"
    );

    let (events, error, _) = drain(client.stream(&request("b")).await.expect("stream")).await;
    assert!(events.contains(&StreamEvent::TextDelta { text: "cut".into() }));
    let error = error.expect("no message_stop");
    assert!(error.to_string().contains("before message_stop"), "{error}");
}

#[tokio::test]
async fn a_stream_ending_after_the_stop_reason_without_message_stop_is_accepted() {
    let fake = fake().await;
    fake.push(Reply::sse(rich_stream().build_without_stop()));
    let response = client(&fake)
        .stream(&request("run it"))
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("accepted");
    assert_rich(&response);
}
