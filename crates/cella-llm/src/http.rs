//! The HTTP transport shared by both wire formats: the reqwest client (rustls with the `ring`
//! provider), POST with retries (exponential backoff with jitter, `Retry-After`), timeouts, the
//! mapping of error statuses to `LlmError`, and turning a response body into SSE events.
//!
//! Owns everything about attempts and waiting. Must not know any provider's JSON: wire decoders
//! live in `openai.rs` and `anthropic.rs`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::config::ModelConfig;
use crate::error::{LlmError, provider_message};
use crate::event::{ChatStream, EventStream, ResponseAssembler, StreamEvent};
use crate::sse::{SseDecoder, SseEvent};

/// The longest connect timeout, whatever the request timeout.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends requests of one configured client.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    client: reqwest::Client,
    /// Provider name for error messages.
    pub(crate) provider: &'static str,
    headers: HeaderMap,
    timeout: Duration,
    max_retries: u32,
    backoff: Duration,
    max_wait: Duration,
}

impl Transport {
    /// `auth` are the provider's own headers (key, API version); the configured extra headers
    /// are applied after them and may override them.
    pub(crate) fn new(
        config: &ModelConfig,
        auth: Vec<(&'static str, String)>,
    ) -> Result<Self, LlmError> {
        let provider = config.provider.as_str();
        let client_error = |detail: String| LlmError::Client { provider, detail };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let configured = config
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone()));
        for (name, value) in auth.into_iter().chain(configured) {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| client_error(format!("invalid header name {name:?}: {e}")))?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|e| client_error(format!("invalid value for header {name:?}: {e}")))?;
            // Keys and any configured header (a proxy token, say) stay out of debug output.
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config().map_err(client_error)?)
            .connect_timeout(config.timeout.min(MAX_CONNECT_TIMEOUT))
            .user_agent(concat!("cella/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| client_error(error_chain(&e)))?;
        Ok(Self {
            client,
            provider,
            headers,
            timeout: config.timeout,
            max_retries: config.max_retries,
            backoff: config.retry_backoff,
            max_wait: config.max_retry_wait,
        })
    }

    /// POSTs `body` to `url` until a 2xx response arrives, retrying 408/409/429/5xx, timeouts
    /// and connection errors up to `max_retries` times.
    pub(crate) async fn post(&self, url: &str, body: Bytes) -> Result<reqwest::Response, LlmError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let request = self
                .client
                .post(url)
                .headers(self.headers.clone())
                .body(body.clone())
                .send();
            let failure = match tokio::time::timeout(self.timeout, request).await {
                Err(_) => Failure::Timeout,
                Ok(Err(e)) if e.is_builder() => {
                    return Err(LlmError::Client {
                        provider: self.provider,
                        detail: format!("invalid request to {url}: {}", error_chain(&e)),
                    });
                }
                Ok(Err(e)) => Failure::Connect(error_chain(&e)),
                Ok(Ok(response)) if response.status().is_success() => return Ok(response),
                Ok(Ok(response)) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers(), SystemTime::now());
                    let body =
                        tokio::time::timeout(self.timeout, read_capped(response, MAX_ERROR_BODY))
                            .await
                            .ok()
                            .and_then(Result::ok)
                            .unwrap_or_default();
                    let message = provider_message(status.as_u16(), &body);
                    if !is_retryable_status(status) {
                        return Err(self.status_error(status, message, url, attempts, None));
                    }
                    Failure::Status {
                        status,
                        message,
                        retry_after,
                    }
                }
            };
            let retry_after = match &failure {
                Failure::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            if attempts > self.max_retries {
                return Err(self.failure_error(failure, url, attempts));
            }
            let delay = match retry_after {
                Some(wait) if wait > self.max_wait => {
                    return Err(self.failure_error(failure, url, attempts));
                }
                Some(wait) => wait,
                None => backoff_delay(self.backoff, attempts, self.max_wait),
            };
            tracing::warn!(
                provider = self.provider,
                attempt = attempts,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "model request failed, retrying: {}",
                failure.describe()
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// The whole body of a non-streamed response, within the timeout.
    pub(crate) async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, LlmError> {
        match tokio::time::timeout(self.timeout, read_capped(response, MAX_BODY)).await {
            Err(_) => Err(LlmError::Timeout {
                provider: self.provider,
                waiting_for: "response body",
                timeout: self.timeout,
            }),
            Ok(Err(detail)) => Err(LlmError::Malformed {
                provider: self.provider,
                detail,
            }),
            Ok(Ok(body)) => Ok(body),
        }
    }

    /// How the provider answered: an SSE stream (by its content type, or by the look of a body
    /// sent without one) or one JSON body.
    pub(crate) async fn answer(&self, response: reqwest::Response) -> Result<Answer, LlmError> {
        if is_event_stream(&response) {
            return Ok(Answer::Sse(self.sse_events(response).boxed()));
        }
        let body = self.read_body(response).await?;
        if looks_like_sse(&body) {
            let body = futures::stream::once(async move { Ok(body) }).boxed();
            return Ok(Answer::Sse(
                sse_events(body, self.provider, self.timeout).boxed(),
            ));
        }
        Ok(Answer::Json(body))
    }

    /// The SSE events of a streamed response; each gap between chunks is bounded by the timeout.
    pub(crate) fn sse_events(
        &self,
        response: reqwest::Response,
    ) -> impl Stream<Item = Result<SseEvent, LlmError>> + Send + 'static {
        sse_events(
            response
                .bytes_stream()
                .map(|r| r.map_err(|e| error_chain(&e)))
                .boxed(),
            self.provider,
            self.timeout,
        )
    }

    fn status_error(
        &self,
        status: StatusCode,
        message: String,
        url: &str,
        attempts: u32,
        retry_after: Option<Duration>,
    ) -> LlmError {
        let provider = self.provider;
        let code = status.as_u16();
        match code {
            400 | 413 | 422 => LlmError::BadRequest {
                provider,
                status: code,
                message,
            },
            401 | 403 => LlmError::Unauthorized {
                provider,
                status: code,
                message,
            },
            404 => LlmError::NotFound {
                provider,
                url: url.to_owned(),
                message,
            },
            429 => LlmError::RateLimited {
                provider,
                message,
                retry_after,
                attempts,
            },
            500..=599 => LlmError::Server {
                provider,
                status: code,
                message,
                attempts,
            },
            _ => LlmError::Status {
                provider,
                status: code,
                message,
            },
        }
    }

    fn failure_error(&self, failure: Failure, url: &str, attempts: u32) -> LlmError {
        match failure {
            Failure::Timeout => LlmError::Timeout {
                provider: self.provider,
                waiting_for: "response headers",
                timeout: self.timeout,
            },
            Failure::Connect(message) => LlmError::Connect {
                provider: self.provider,
                url: url.to_owned(),
                message,
                attempts,
            },
            Failure::Status {
                status,
                message,
                retry_after,
            } => self.status_error(status, message, url, attempts, retry_after),
        }
    }
}

/// The largest whole response body read (a model answer is far smaller).
const MAX_BODY: usize = 64 * 1024 * 1024;
/// The most of an error body read for its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The body of `response`, at most `limit` bytes: an error past that (for whole bodies) — but
/// for error bodies, whose message is all that matters, simply cut.
async fn read_capped(mut response: reqwest::Response, limit: usize) -> Result<Bytes, String> {
    let cut_silently = !response.status().is_success();
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > limit {
                    if cut_silently {
                        let room = limit - body.len();
                        body.extend_from_slice(&chunk[..room]);
                        return Ok(body.into());
                    }
                    return Err(format!("response body larger than {limit} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body.into()),
            Err(e) => {
                return Err(format!(
                    "connection lost while reading the body: {}",
                    error_chain(&e)
                ));
            }
        }
    }
}

/// A successful response, by kind.
pub(crate) enum Answer {
    Sse(BoxStream<'static, Result<SseEvent, LlmError>>),
    Json(Bytes),
}

/// Whether a body is SSE: JSON never starts with an SSE field name or a comment.
fn looks_like_sse(body: &[u8]) -> bool {
    let text = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    let text = &text[start..];
    [b"data:".as_slice(), b"event:", b":", b"id:", b"retry:"]
        .iter()
        .any(|field| text.starts_with(field))
}

/// Whether the response is an SSE stream (as opposed to one JSON body from a server that ignored
/// `stream: true`, or answered an error with status 200).
fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

enum Failure {
    Timeout,
    Connect(String),
    Status {
        status: StatusCode,
        message: String,
        retry_after: Option<Duration>,
    },
}

impl Failure {
    fn describe(&self) -> String {
        match self {
            Self::Timeout => "timed out waiting for response headers".to_owned(),
            Self::Connect(message) => format!("connection error: {message}"),
            Self::Status {
                status, message, ..
            } => format!("status {}: {message}", status.as_u16()),
        }
    }
}

fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
}

/// No wait is longer than a day, whatever the configuration says (and `mul_f64` below cannot
/// overflow).
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// `base * 2^(attempt-1)`, capped at `max`, scaled by a random factor in [0.5, 1.0].
pub(crate) fn backoff_delay(base: Duration, attempt: u32, max: Duration) -> Duration {
    let exponent = attempt.saturating_sub(1).min(20);
    let full = base
        .saturating_mul(1u32 << exponent)
        .min(max)
        .min(LONGEST_WAIT);
    full.mul_f64(0.5 + fastrand::f64() * 0.5)
}

/// The wait a 429/503 response asks for: `retry-after-ms` (OpenAI), else `retry-after` as
/// seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e12) / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The message of an error and all its sources, joined with `: ` (reqwest's own message alone
/// hides the cause, e.g. `connection refused`).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn tls_config() -> Result<rustls::ClientConfig, String> {
    let crypto = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(crypto.clone())
        .map_err(|e| format!("tls certificate verifier: {e}"))?;
    let config = rustls::ClientConfig::builder_with_provider(crypto)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls protocol versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(config)
}

struct SseState {
    body: BoxStream<'static, Result<Bytes, String>>,
    decoder: Option<SseDecoder>,
    queue: VecDeque<SseEvent>,
    provider: &'static str,
    timeout: Duration,
}

/// SSE events from a byte stream, each wait for bytes bounded by `timeout`.
pub(crate) fn sse_events(
    body: BoxStream<'static, Result<Bytes, String>>,
    provider: &'static str,
    timeout: Duration,
) -> impl Stream<Item = Result<SseEvent, LlmError>> + Send + 'static {
    let state = SseState {
        body,
        decoder: Some(SseDecoder::new()),
        queue: VecDeque::new(),
        provider,
        timeout,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.queue.pop_front() {
                return Some((Ok(event), st));
            }
            let decoder = st.decoder.as_mut()?;
            let malformed = |detail: String| LlmError::Malformed {
                provider: st.provider,
                detail,
            };
            let error = match tokio::time::timeout(st.timeout, st.body.next()).await {
                Err(_) => LlmError::Timeout {
                    provider: st.provider,
                    waiting_for: "stream data",
                    timeout: st.timeout,
                },
                Ok(Some(Ok(chunk))) => match decoder.push(&chunk) {
                    Ok(events) => {
                        st.queue.extend(events);
                        continue;
                    }
                    Err(e) => malformed(e.to_string()),
                },
                Ok(Some(Err(e))) => malformed(format!("connection lost mid-stream: {e}")),
                Ok(None) => match st.decoder.take().map(SseDecoder::finish) {
                    Some(Ok(last)) => {
                        st.queue.extend(last);
                        continue;
                    }
                    Some(Err(e)) => malformed(e.to_string()),
                    None => return None,
                },
            };
            st.decoder = None;
            st.queue.clear();
            return Some((Err(error), st));
        }
    })
}

/// The events of a whole (non-streamed) response body of one wire format.
pub(crate) type ResponseDecoder = fn(&'static str, &[u8]) -> Vec<Result<StreamEvent, LlmError>>;

impl Transport {
    /// Posts one chat request (`body`, already in the wire format) to `url` and decodes the
    /// answer by what arrived, not by what was asked: a server may stream when not asked to, or
    /// ignore `stream: true`. `decoder` makes the SSE decoder for this transport's provider.
    pub(crate) async fn chat<D: WireDecoder>(
        &self,
        config: &ModelConfig,
        url: &str,
        body: &serde_json::Value,
        decoder: fn(&'static str) -> D,
        decode_response: ResponseDecoder,
    ) -> Result<ChatStream, LlmError> {
        let body = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
        let response = self.post(url, body).await?;
        let assembler = ResponseAssembler::new(config.model.clone(), config.price());
        Ok(match self.answer(response).await? {
            Answer::Sse(sse) => {
                ChatStream::new(decode_stream(sse, decoder(self.provider)), assembler)
            }
            Answer::Json(body) => {
                ChatStream::from_events(decode_response(self.provider, &body), assembler)
            }
        })
    }
}

/// Turns the SSE events of one wire format into `StreamEvent`s.
pub(crate) trait WireDecoder: Send + 'static {
    /// One SSE event; may produce any number of stream events.
    fn event(&mut self, event: SseEvent) -> Result<Vec<StreamEvent>, LlmError>;
    /// The body ended; an error if the stream was cut short.
    fn end(&mut self) -> Result<Vec<StreamEvent>, LlmError>;
    /// The terminal event arrived (`[DONE]`, `message_stop`); nothing more is read.
    fn is_done(&self) -> bool;
}

struct DecodeState<D> {
    sse: BoxStream<'static, Result<SseEvent, LlmError>>,
    decoder: D,
    queue: VecDeque<StreamEvent>,
    finished: bool,
}

/// The `StreamEvent`s of an SSE stream decoded by `decoder`. Ends after the first error.
pub(crate) fn decode_stream<D: WireDecoder>(
    sse: impl Stream<Item = Result<SseEvent, LlmError>> + Send + 'static,
    decoder: D,
) -> EventStream {
    let state = DecodeState {
        sse: sse.boxed(),
        decoder,
        queue: VecDeque::new(),
        finished: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.queue.pop_front() {
                return Some((Ok(event), st));
            }
            if st.finished {
                return None;
            }
            if st.decoder.is_done() {
                st.finished = true;
                continue;
            }
            let decoded = match st.sse.next().await {
                Some(Ok(event)) => st.decoder.event(event),
                Some(Err(e)) => Err(e),
                None => {
                    st.finished = true;
                    st.decoder.end()
                }
            };
            match decoded {
                Ok(events) => st.queue.extend(events),
                Err(e) => {
                    st.finished = true;
                    st.queue.clear();
                    return Some((Err(e), st));
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_each_form() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(2)));
        h.insert("retry-after", HeaderValue::from_static("0.5"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(500)));
        let in_30s = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert(
            "retry-after",
            HeaderValue::from_str(&in_30s).expect("header"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&past).expect("header"));
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
    }

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for _ in 0..50 {
            let first = backoff_delay(base, 1, max);
            assert!(
                first >= Duration::from_millis(50) && first <= base,
                "{first:?}"
            );
            let third = backoff_delay(base, 3, max);
            assert!(
                third >= Duration::from_millis(200) && third <= Duration::from_millis(400),
                "{third:?}"
            );
            assert!(backoff_delay(base, 30, max) <= max);
            assert!(backoff_delay(base, u32::MAX, max) <= max);
            assert!(backoff_delay(Duration::MAX, 3, Duration::MAX) <= LONGEST_WAIT);
        }
    }

    #[test]
    fn client_with_tls_builds_without_a_process_crypto_provider() {
        let config =
            ModelConfig::new(crate::Provider::OpenAi, "gpt-4.1").with_header("X-Title", "cella");
        let transport = Transport::new(&config, vec![("authorization", "Bearer k".into())]);
        assert!(transport.is_ok(), "{transport:?}");
        let bad = ModelConfig::new(crate::Provider::OpenAi, "gpt-4.1").with_header("bad name", "x");
        let err = Transport::new(&bad, vec![]).expect_err("invalid header");
        assert!(err.to_string().contains("bad name"), "{err}");
    }
}
