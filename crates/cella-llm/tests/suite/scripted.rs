//! The in-process scripted client behaves like a real one.

use std::sync::Arc;

use cella_llm::testing::{ScriptedClient, ScriptedTurn};
use cella_llm::{FinishReason, LlmError, ModelClient, ModelConfig, Price, Provider};

use super::request;

#[tokio::test]
async fn answers_in_order_records_requests_and_prices_usage() {
    let scripted = ScriptedClient::new([
        ScriptedTurn::tool_calls(&[("c1", "bash", r#"{"cmd":"ls"}"#)]),
        ScriptedTurn::text("done"),
    ])
    .with_config(
        ModelConfig::new(Provider::OpenAiCompatible, "scripted").with_price(
            "scripted",
            Price {
                input: 1_000_000.0,
                output: 0.0,
            },
        ),
    );
    let client: Arc<dyn ModelClient> = Arc::new(scripted.clone());

    let first = client
        .stream(&request("one"))
        .await
        .expect("stream")
        .collect_response()
        .await
        .expect("first");
    assert_eq!(first.tool_calls[0].name, "bash");
    assert_eq!(first.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(first.cost_usd, Some(10.0));

    let second = client.complete(&request("two")).await.expect("second");
    assert_eq!(second.content, "done");

    let error = client
        .complete(&request("three"))
        .await
        .expect_err("exhausted");
    assert!(matches!(error, LlmError::Provider { ref kind, .. } if kind == "script_exhausted"));
    assert_eq!(scripted.requests().len(), 3);
    assert_eq!(scripted.remaining(), 0);
}
