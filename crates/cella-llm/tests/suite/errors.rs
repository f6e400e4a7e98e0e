//! Error statuses carry the provider's own message and are typed by status.

use cella_llm::testing::{FakeProvider, Reply};
use cella_llm::{AnthropicClient, LlmError, ModelClient, OpenAiClient};

use super::request;

async fn fake() -> FakeProvider {
    FakeProvider::start().await.expect("fake provider starts")
}

#[tokio::test]
async fn unauthorized_carries_the_provider_message_for_both_formats() {
    let fake = fake().await;
    fake.push(Reply::openai_error(
        401,
        "Incorrect API key provided: sk-wrong. You can find your API key at https://platform.openai.com/account/api-keys.",
    ));
    fake.push(Reply::anthropic_error(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));

    let openai =
        OpenAiClient::new(fake.openai_config("m").with_api_key("sk-wrong")).expect("client");
    let error = openai.stream(&request("hi")).await.expect_err("401");
    assert!(
        matches!(&error, LlmError::Unauthorized { status: 401, message, .. } if message.starts_with("Incorrect API key provided")),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("openai-compatible refused the api key (401): Incorrect API key")
    );
    assert_eq!(error.status(), Some(401));
    assert!(!error.is_transient());

    let anthropic = AnthropicClient::new(fake.anthropic_config("claude-test")).expect("client");
    let error = anthropic.complete(&request("hi")).await.expect_err("401");
    assert_eq!(
        error.to_string(),
        "anthropic refused the api key (401): invalid x-api-key"
    );
    assert_eq!(fake.requests().len(), 2, "401 is never retried");
}

#[tokio::test]
async fn not_found_names_the_url_and_the_message() {
    let fake = fake().await;
    fake.push(Reply::json(
        404,
        &serde_json::json!({"error": "model \"qwen9:1b\" not found, try pulling it first"}),
    ));
    let client = OpenAiClient::new(fake.openai_config("qwen9:1b")).expect("client");
    let error = client.complete(&request("hi")).await.expect_err("404");
    let message = error.to_string();
    assert!(matches!(error, LlmError::NotFound { .. }), "{message}");
    assert!(
        message.contains(&format!("{}/v1/chat/completions", fake.url())),
        "{message}"
    );
    assert!(
        message.contains("model \"qwen9:1b\" not found"),
        "{message}"
    );
}

#[tokio::test]
async fn bad_request_and_non_json_error_bodies() {
    let fake = fake().await;
    fake.push(Reply::anthropic_error(
        400,
        "invalid_request_error",
        "messages.1.content.0.tool_use_id: unexpected",
    ));
    fake.push(Reply::status(418, "<html>I'm a teapot</html>"));
    let client = AnthropicClient::new(fake.anthropic_config("claude-test")).expect("client");
    let error = client.complete(&request("hi")).await.expect_err("400");
    assert_eq!(
        error.to_string(),
        "anthropic rejected the request (400): messages.1.content.0.tool_use_id: unexpected"
    );
    let error = client.complete(&request("hi")).await.expect_err("418");
    assert_eq!(
        error.to_string(),
        "anthropic answered with status 418: <html>I'm a teapot</html>"
    );
}

#[tokio::test]
async fn a_malformed_whole_response_is_an_error() {
    let fake = fake().await;
    fake.push(Reply::status(200, "{\"choices\": [").header("content-type", "application/json"));
    let client = OpenAiClient::new(fake.openai_config("m")).expect("client");
    let error = client.complete(&request("hi")).await.expect_err("bad json");
    assert!(matches!(error, LlmError::Malformed { .. }), "{error}");
    assert!(
        error.to_string().contains("invalid json in response body"),
        "{error}"
    );
}
