//! The error type of every model call, and extraction of the provider's own error message from an
//! error body.
//!
//! Owns how failures are named; deciding *whether* to retry lives in `http.rs`.

use std::time::Duration;

use serde_json::Value;

use crate::config::ConfigError;

/// Why a model call failed.
///
/// Every variant names the provider (`openai`, `anthropic`, `groq`, …) and carries the provider's
/// own message where it sent one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// 400 or 422: the request was wrong (bad schema, context too long, unknown parameter).
    #[error("{provider} rejected the request ({status}): {message}")]
    BadRequest {
        provider: &'static str,
        status: u16,
        message: String,
    },

    /// 401 or 403: the key is missing, wrong or lacks permission.
    #[error("{provider} refused the api key ({status}): {message}")]
    Unauthorized {
        provider: &'static str,
        status: u16,
        message: String,
    },

    /// 404: wrong model name or base URL.
    #[error("{provider} found no such model or endpoint (404 at {url}): {message}")]
    NotFound {
        provider: &'static str,
        url: String,
        message: String,
    },

    /// 429 on every attempt, or a `Retry-After` longer than the configured maximum wait.
    #[error("{provider} rate limit hit (429) after {attempts} attempt(s): {message}")]
    RateLimited {
        provider: &'static str,
        message: String,
        /// What the provider asked to wait before the next try, if it said.
        retry_after: Option<Duration>,
        attempts: u32,
    },

    /// 5xx on every attempt.
    #[error("{provider} server error ({status}) after {attempts} attempt(s): {message}")]
    Server {
        provider: &'static str,
        status: u16,
        message: String,
        attempts: u32,
    },

    /// Any other non-success status.
    #[error("{provider} answered with status {status}: {message}")]
    Status {
        provider: &'static str,
        status: u16,
        message: String,
    },

    /// The connection could not be made or broke before a response arrived, on every attempt.
    #[error("could not reach {provider} at {url} after {attempts} attempt(s): {message}")]
    Connect {
        provider: &'static str,
        url: String,
        message: String,
        attempts: u32,
    },

    /// Nothing arrived within the configured timeout.
    #[error("{provider} sent no {waiting_for} within {timeout:?}")]
    Timeout {
        provider: &'static str,
        /// `response headers`, `stream data` or `response body`.
        waiting_for: &'static str,
        timeout: Duration,
    },

    /// The response could not be understood: invalid JSON, broken SSE framing, a stream cut
    /// short, or a connection lost mid-body.
    #[error("{provider} sent a malformed response: {detail}")]
    Malformed {
        provider: &'static str,
        detail: String,
    },

    /// The provider reported an error inside a successful stream (Anthropic `error` event,
    /// OpenAI-compatible `{"error": …}` chunk).
    #[error("{provider} reported an error mid-stream ({kind}): {message}")]
    Provider {
        provider: &'static str,
        kind: String,
        message: String,
    },

    /// The HTTP client could not be set up (TLS configuration, invalid header).
    #[error("could not set up the http client for {provider}: {detail}")]
    Client {
        provider: &'static str,
        detail: String,
    },
}

impl LlmError {
    /// Whether trying the whole call again later may succeed (rate limits, overload, server
    /// errors, timeouts, lost connections, provider errors mid-stream such as `overloaded_error`).
    ///
    /// The client already retried what it could before the stream started; this is for a caller
    /// deciding whether to retry a turn whose stream failed half-way.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::RateLimited { .. }
            | Self::Server { .. }
            | Self::Connect { .. }
            | Self::Timeout { .. } => true,
            Self::Provider { kind, .. } => {
                matches!(
                    kind.as_str(),
                    "overloaded_error" | "api_error" | "rate_limit_error" | "server_error"
                )
            }
            _ => false,
        }
    }

    /// The HTTP status the provider answered with, for status errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::BadRequest { status, .. }
            | Self::Unauthorized { status, .. }
            | Self::Server { status, .. }
            | Self::Status { status, .. } => Some(*status),
            Self::NotFound { .. } => Some(404),
            Self::RateLimited { .. } => Some(429),
            _ => None,
        }
    }
}

/// The longest error body text quoted in an error message.
const MAX_QUOTED: usize = 500;

/// The human-readable message in a provider's error body.
///
/// Understands OpenAI-style `{"error":{"message":…}}`, Anthropic's
/// `{"type":"error","error":{"type":…,"message":…}}`, Ollama's `{"error":"…"}`, a top-level
/// `{"message":…}`, and Gemini's list-wrapped `[{"error":{…}}]`; otherwise quotes the body
/// (shortened), or names the status when the body is empty.
pub(crate) fn provider_message(status: u16, body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<Value>(body)
        && let Some(message) = message_in(&value)
    {
        return message;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        let reason = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no reason given");
        return format!("empty body ({})", reason.to_lowercase());
    }
    shorten(text, MAX_QUOTED)
}

/// The error kind and message of an error object (used for mid-stream errors too).
pub(crate) fn kind_and_message(value: &Value) -> (String, String) {
    let error = value.get("error").unwrap_or(value);
    let kind = error
        .get("type")
        .or_else(|| error.get("code"))
        .map(|k| match k {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "error".to_owned());
    let message = message_in(value).unwrap_or_else(|| shorten(&value.to_string(), MAX_QUOTED));
    (kind, message)
}

fn message_in(value: &Value) -> Option<String> {
    match value {
        Value::Array(items) => items.first().and_then(message_in),
        Value::Object(map) => match map.get("error") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(inner @ Value::Object(_)) => inner
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| message_in(inner)),
            _ => map
                .get("message")
                .or_else(|| map.get("detail"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        },
        _ => None,
    }
}

/// `text` cut to at most `max` bytes on a char boundary, with `…` when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_messages_of_each_provider_shape() {
        let openai = br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert_eq!(provider_message(401, openai), "Incorrect API key provided");
        let anthropic = br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        assert_eq!(provider_message(401, anthropic), "invalid x-api-key");
        let ollama = br#"{"error":"model \"qwen9\" not found, try pulling it first"}"#;
        assert_eq!(
            provider_message(404, ollama),
            "model \"qwen9\" not found, try pulling it first"
        );
        let gemini = br#"[{"error":{"code":400,"message":"API key not valid","status":"INVALID_ARGUMENT"}}]"#;
        assert_eq!(provider_message(400, gemini), "API key not valid");
        assert_eq!(
            provider_message(502, b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(
            provider_message(503, b""),
            "empty body (service unavailable)"
        );
        let long = "é".repeat(400);
        let quoted = provider_message(500, long.as_bytes());
        assert!(quoted.ends_with('…') && quoted.len() <= MAX_QUOTED + '…'.len_utf8());
    }

    #[test]
    fn kind_and_message_of_stream_errors() {
        let value: Value = serde_json::from_str(
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .expect("json");
        assert_eq!(
            kind_and_message(&value),
            ("overloaded_error".to_owned(), "Overloaded".to_owned())
        );
        let value: Value =
            serde_json::from_str(r#"{"error":{"message":"upstream died","code":502}}"#)
                .expect("json");
        assert_eq!(
            kind_and_message(&value),
            ("502".to_owned(), "upstream died".to_owned())
        );
    }
}
