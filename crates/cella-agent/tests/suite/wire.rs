//! The loop over the real model clients talking to a fake provider at the wire level, in both
//! formats: tool calls assembled from split SSE chunks, results sent back, usage summed.

use std::sync::Arc;

use cella_agent::{AgentOptions, CancellationToken, Recorder};
use cella_llm::build_client;
use cella_llm::testing::{FakeProvider, Reply};

use super::support::{Memo, agent};

#[tokio::test]
async fn openai_format() {
    let fake = FakeProvider::start().await.expect("fake provider");
    fake.push_all([
        Reply::openai_tool_calls(&[
            ("call_1", "memo", r#"{"text":"first"}"#),
            ("call_2", "memo", r#"{"text":"second"}"#),
        ]),
        Reply::openai_text("both remembered"),
    ]);
    let model = build_client(fake.openai_config("gpt-test")).expect("client");
    let memo = Memo::default();
    let report = agent(model, AgentOptions::default(), &memo)
        .run(
            "remember two things",
            &Recorder::new(),
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(report.answer(), Some("both remembered"));
    assert_eq!(*memo.0.lock().expect("lock"), ["first", "second"]);
    assert_eq!(
        (report.usage.input_tokens, report.usage.output_tokens),
        (20, 10)
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let body = requests[1].json();
    let messages = body["messages"].as_array().expect("messages");
    let tool_msgs: Vec<_> = messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_msgs.len(), 2);
    assert_eq!(tool_msgs[0]["tool_call_id"], "call_1");
    assert_eq!(tool_msgs[0]["content"], "ok: first");
    assert_eq!(body["tools"][0]["function"]["name"], "memo");
}

#[tokio::test]
async fn anthropic_format() {
    let fake = FakeProvider::start().await.expect("fake provider");
    fake.push_all([
        Reply::anthropic_tool_calls(&[("toolu_1", "memo", r#"{"text":"x"}"#)]),
        Reply::anthropic_text("remembered"),
    ]);
    let model = build_client(fake.anthropic_config("claude-test")).expect("client");
    let memo = Memo::default();
    let report = agent(Arc::clone(&model), AgentOptions::default(), &memo)
        .run("remember x", &Recorder::new(), &CancellationToken::new())
        .await;
    assert_eq!(report.answer(), Some("remembered"));
    assert_eq!(*memo.0.lock().expect("lock"), ["x"]);
    assert_eq!(
        (report.usage.input_tokens, report.usage.output_tokens),
        (20, 10)
    );
    let body = fake.requests()[1].json();
    assert!(
        body["system"]
            .as_str()
            .is_some_and(|s| s.contains("sandbox")),
        "{body}"
    );
    let text = body["messages"].to_string();
    assert!(text.contains(r#""type":"tool_result""#), "{text}");
    assert!(text.contains(r#""tool_use_id":"toolu_1""#), "{text}");
}
