//! From configuration layers to a working client: the provider picks the wire format, the
//! endpoint and the key header.

use std::collections::HashMap;

use cella_llm::testing::{FakeProvider, Reply};
use cella_llm::{ModelConfig, ModelSettings, Provider, build_client};

use super::request;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |key| vars.get(key).cloned()
}

#[tokio::test]
async fn ollama_via_ollama_host_speaks_chat_completions_without_a_key() {
    let fake = FakeProvider::start().await.expect("fake");
    fake.push(Reply::openai_text("hello from ollama"));
    let host = fake.url().trim_start_matches("http://").to_owned();
    let config = ModelConfig::resolve(
        ModelSettings::default(),
        &env(&[("CELLA_MODEL", "ollama/qwen3:8b"), ("OLLAMA_HOST", &host)]),
        ModelSettings::default(),
    )
    .expect("config");
    assert_eq!(config.provider, Provider::Ollama);
    let client = build_client(config).expect("client");
    let response = client.complete(&request("hi")).await.expect("response");
    assert_eq!(response.content, "hello from ollama");
    let req = &fake.requests()[0];
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.header("authorization"), None);
    assert_eq!(req.json()["model"], "qwen3:8b");
}

#[tokio::test]
async fn anthropic_shorthand_with_base_url_and_key_from_env() {
    let fake = FakeProvider::start().await.expect("fake");
    fake.push(Reply::anthropic_text("hello from claude"));
    // A base URL given with `/v1` (as the other providers take it) still reaches /v1/messages.
    let base = format!("{}/v1/", fake.url());
    let config = ModelConfig::resolve(
        ModelSettings::default(),
        &env(&[
            ("CELLA_MODEL", "anthropic/claude-sonnet-4-5"),
            ("CELLA_BASE_URL", &base),
            ("ANTHROPIC_API_KEY", "sk-ant-env"),
        ]),
        ModelSettings::default(),
    )
    .expect("config");
    let client = build_client(config).expect("client");
    assert_eq!(client.config().model, "claude-sonnet-4-5");
    let response = client.complete(&request("hi")).await.expect("response");
    assert_eq!(response.content, "hello from claude");
    let req = &fake.requests()[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some("sk-ant-env"));
    assert_eq!(req.json()["model"], "claude-sonnet-4-5");
}
