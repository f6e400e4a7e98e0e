//! Retries, backoff, `Retry-After` and timeouts, against the fake provider.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cella_llm::testing::{AnthropicSse, FakeProvider, OpenAiSse, Reply};
use cella_llm::{AnthropicClient, LlmError, ModelClient, ModelConfig, OpenAiClient, Provider};

use super::{drain, request};

async fn fake() -> FakeProvider {
    FakeProvider::start().await.expect("fake provider starts")
}

/// The time between the arrival of request `a` and request `b`.
fn gap(fake: &FakeProvider, a: usize, b: usize) -> Duration {
    let requests = fake.requests();
    requests[b].received_at - requests[a].received_at
}

#[tokio::test]
async fn rate_limit_with_retry_after_seconds_is_waited_out_then_succeeds() {
    let fake = fake().await;
    fake.push(
        Reply::openai_error(429, "Rate limit reached for requests").header("retry-after", "1"),
    );
    fake.push(Reply::openai_text("after the wait"));
    // Backoff alone would wait ~10 ms; only Retry-After makes it a second.
    let client = OpenAiClient::new(fake.openai_config("m")).expect("client");
    let response = client
        .stream(&request("hi"))
        .await
        .expect("retried")
        .collect_response()
        .await
        .expect("response");
    assert_eq!(response.content, "after the wait");
    assert_eq!(fake.requests().len(), 2);
    let waited = gap(&fake, 0, 1);
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(3),
        "waited {waited:?}"
    );
}

#[tokio::test]
async fn retry_after_ms_and_http_date_are_honoured() {
    let fake = fake().await;
    fake.push(Reply::openai_error(429, "slow down").header("retry-after-ms", "400"));
    let soon = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3));
    fake.push(Reply::openai_error(503, "busy").header("retry-after", &soon));
    fake.push(Reply::openai_text("ok"));
    let client = OpenAiClient::new(fake.openai_config("m")).expect("client");
    let response = client.complete(&request("hi")).await;
    // `complete` got a streamed reply (`Reply::openai_text`), which the client still reads.
    assert_eq!(response.expect("third attempt").content, "ok");
    assert!(
        gap(&fake, 0, 1) >= Duration::from_millis(400),
        "{:?}",
        gap(&fake, 0, 1)
    );
    // An HTTP date has one-second resolution and was written before the first request: of the
    // 3 s, at least 3 - 1 - 0.4 s remain when the 503 arrives.
    assert!(
        gap(&fake, 1, 2) >= Duration::from_millis(1200),
        "{:?}",
        gap(&fake, 1, 2)
    );
}

#[tokio::test]
async fn server_error_then_success() {
    let fake = fake().await;
    fake.push(Reply::anthropic_error(
        500,
        "api_error",
        "Internal server error",
    ));
    fake.push(Reply::anthropic_text("recovered"));
    let client = AnthropicClient::new(fake.anthropic_config("claude-test")).expect("client");
    let response = client
        .stream(&request("hi"))
        .await
        .expect("retried")
        .collect_response()
        .await
        .expect("response");
    assert_eq!(response.content, "recovered");
    assert_eq!(fake.requests().len(), 2);
    // Both attempts sent the same body.
    assert_eq!(fake.requests()[0].body, fake.requests()[1].body);
}

#[tokio::test]
async fn a_connection_closed_before_the_answer_is_retried() {
    let fake = fake().await;
    fake.push(Reply::hang_up());
    fake.push(Reply::openai_text("second try"));
    let client = OpenAiClient::new(fake.openai_config("m")).expect("client");
    let response = client.complete(&request("hi")).await.expect("retried");
    assert_eq!(response.content, "second try");
    assert_eq!(fake.requests().len(), 2);

    // With no retries left the error says what happened.
    fake.push(Reply::hang_up());
    let config = fake.openai_config("m").with_retries(0, Duration::ZERO);
    let client = OpenAiClient::new(config).expect("client");
    let error = client.complete(&request("hi")).await.expect_err("hung up");
    assert!(
        matches!(error, LlmError::Connect { attempts: 1, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn persistent_overload_fails_after_max_retries_with_the_provider_message() {
    let fake = fake().await;
    for _ in 0..3 {
        fake.push(Reply::anthropic_error(
            529,
            "overloaded_error",
            "Overloaded",
        ));
    }
    fake.push(Reply::anthropic_text("never reached"));
    let config = fake
        .anthropic_config("claude-test")
        .with_retries(2, Duration::from_millis(50));
    let client = AnthropicClient::new(config).expect("client");
    let started = Instant::now();
    let error = client.complete(&request("hi")).await.expect_err("gives up");
    match &error {
        LlmError::Server {
            status,
            message,
            attempts,
            ..
        } => assert_eq!(
            (*status, message.as_str(), *attempts),
            (529, "Overloaded", 3)
        ),
        other => panic!("unexpected {other}"),
    }
    assert_eq!(
        error.to_string(),
        "anthropic server error (529) after 3 attempt(s): Overloaded"
    );
    assert!(error.is_transient());
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(fake.remaining(), 1);
    // Backoff 50 ms then 100 ms, each jittered down to half at most.
    assert!(
        started.elapsed() >= Duration::from_millis(75),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn retry_after_beyond_the_maximum_wait_fails_at_once() {
    let fake = fake().await;
    fake.push(Reply::openai_error(429, "quota exceeded").header("retry-after", "3600"));
    let config = fake
        .openai_config("m")
        .with_max_retry_wait(Duration::from_secs(5));
    let client = OpenAiClient::new(config).expect("client");
    let started = Instant::now();
    let error = client.complete(&request("hi")).await.expect_err("no wait");
    assert!(started.elapsed() < Duration::from_secs(2));
    match error {
        LlmError::RateLimited {
            retry_after,
            message,
            attempts,
            ..
        } => {
            assert_eq!(retry_after, Some(Duration::from_secs(3600)));
            assert_eq!(message, "quota exceeded");
            assert_eq!(attempts, 1);
        }
        other => panic!("unexpected {other}"),
    }
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    // A port that was just free: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let config = ModelConfig::new(Provider::Ollama, "qwen3:8b")
        .with_base_url(format!("http://127.0.0.1:{port}/v1"))
        .with_retries(2, Duration::from_millis(40));
    let client = OpenAiClient::new(config).expect("client");
    let started = Instant::now();
    let error = client.complete(&request("hi")).await.expect_err("refused");
    let elapsed = started.elapsed();
    match &error {
        LlmError::Connect { attempts, url, .. } => {
            assert_eq!(*attempts, 3);
            assert!(url.ends_with("/v1/chat/completions"), "{url}");
        }
        other => panic!("unexpected {other}"),
    }
    assert!(
        error
            .to_string()
            .starts_with("could not reach ollama at http://127.0.0.1:"),
        "{error}"
    );
    assert!(
        elapsed >= Duration::from_millis(60),
        "two backoffs: {elapsed:?}"
    );
}

#[tokio::test]
async fn no_response_headers_within_the_timeout() {
    let fake = fake().await;
    fake.push(Reply::openai_text("too late").delay(Duration::from_secs(3)));
    let config = fake
        .openai_config("m")
        .with_timeout(Duration::from_millis(300))
        .with_retries(0, Duration::from_millis(10));
    let client = OpenAiClient::new(config).expect("client");
    let started = Instant::now();
    let error = client.stream(&request("hi")).await.expect_err("timeout");
    let elapsed = started.elapsed();
    assert!(
        matches!(
            error,
            LlmError::Timeout {
                waiting_for: "response headers",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "openai-compatible sent no response headers within 300ms"
    );
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn a_stream_that_stalls_times_out() {
    let fake = fake().await;
    let events = AnthropicSse::new("claude-test").text("first words").build();
    let mut chunks: Vec<(Duration, Bytes)> = events
        .into_iter()
        .map(|e| (Duration::from_millis(2), Bytes::from(e)))
        .collect();
    // The stream goes silent after `message_start` and the first text delta.
    chunks[3].0 = Duration::from_secs(3);
    fake.push(Reply::sse_timed(chunks));
    let config = fake
        .anthropic_config("claude-test")
        .with_timeout(Duration::from_millis(300));
    let client = AnthropicClient::new(config).expect("client");
    let (events, error, stream) = drain(client.stream(&request("hi")).await.expect("stream")).await;
    assert!(!events.is_empty());
    assert_eq!(stream.response().content, "first words");
    let error = error.expect("stalled");
    assert!(
        matches!(
            error,
            LlmError::Timeout {
                waiting_for: "stream data",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        fake.requests().len(),
        1,
        "a started stream is never retried"
    );
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let fake = fake().await;
    fake.push(Reply::openai_error(400, "messages: too long"));
    fake.push(Reply::sse(
        OpenAiSse::new("m").text("x").finish("stop").build(),
    ));
    let client = OpenAiClient::new(fake.openai_config("m")).expect("client");
    let error = client.complete(&request("hi")).await.expect_err("400");
    assert!(
        matches!(error, LlmError::BadRequest { status: 400, .. }),
        "{error}"
    );
    assert_eq!(fake.requests().len(), 1);
}
