//! The fake provider: a hyper HTTP/1.1 server on loopback answering with scripted replies and
//! recording requests.
//!
//! Owns only transport-level scripting (status, headers, delays, chunked writes, cut
//! connections); the provider formats come from `wire.rs`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::{ModelConfig, Provider};

/// What the fake provider answers to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    /// Wait before sending the status line and headers.
    delay: Duration,
    body: ReplyBody,
}

#[derive(Debug, Clone)]
enum ReplyBody {
    /// Close the connection without answering.
    HangUp,
    Full(Bytes),
    /// Each chunk is written (and flushed) after its pause; `abort` cuts the connection after
    /// the last one instead of ending the body properly.
    Chunks {
        chunks: Vec<(Duration, Bytes)>,
        abort: bool,
    },
}

/// The default pause between SSE chunks: long enough that each chunk is its own TCP write and,
/// in practice, its own read on the client.
const CHUNK_GAP: Duration = Duration::from_millis(3);

impl Reply {
    /// A response with `status` and a raw body.
    pub fn status(status: u16, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: ReplyBody::Full(body.into()),
        }
    }

    /// A JSON response.
    pub fn json(status: u16, body: &Value) -> Self {
        Self::status(status, body.to_string()).header("content-type", "application/json")
    }

    /// An OpenAI-style error body: `{"error":{"message":…,"type":…}}`.
    pub fn openai_error(status: u16, message: &str) -> Self {
        Self::json(
            status,
            &serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "code": null}}),
        )
    }

    /// An Anthropic-style error body: `{"type":"error","error":{"type":…,"message":…}}`.
    pub fn anthropic_error(status: u16, kind: &str, message: &str) -> Self {
        Self::json(
            status,
            &serde_json::json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }

    /// A 200 `text/event-stream` response; each item is written as its own chunk, 3 ms apart.
    pub fn sse<I, C>(chunks: I) -> Self
    where
        I: IntoIterator<Item = C>,
        C: Into<Bytes>,
    {
        Self::sse_timed(chunks.into_iter().map(|c| (CHUNK_GAP, c.into())))
    }

    /// Like [`Reply::sse`], each chunk written after its own pause.
    pub fn sse_timed(chunks: impl IntoIterator<Item = (Duration, Bytes)>) -> Self {
        Self {
            status: 200,
            headers: vec![
                ("content-type".into(), "text/event-stream".into()),
                ("cache-control".into(), "no-cache".into()),
            ],
            delay: Duration::ZERO,
            body: ReplyBody::Chunks {
                chunks: chunks.into_iter().collect(),
                abort: false,
            },
        }
    }

    /// The SSE body split into pieces of `size` bytes (events cut mid-line, mid-JSON and
    /// mid-UTF-8 character), each its own write with no pause (the server yields between
    /// writes; use [`Reply::gap`] for real pauses).
    pub fn sse_split(events: &[String], size: usize) -> Self {
        let all: Vec<u8> = events.concat().into_bytes();
        Self::sse(
            all.chunks(size.max(1))
                .map(Bytes::copy_from_slice)
                .collect::<Vec<_>>(),
        )
        .gap(Duration::ZERO)
    }

    /// Sets the pause before every chunk of a chunked body (zero: just yield to the writer).
    pub fn gap(mut self, pause: Duration) -> Self {
        if let ReplyBody::Chunks { chunks, .. } = &mut self.body {
            for (gap, _) in chunks {
                *gap = pause;
            }
        }
        self
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Waits this long before answering at all.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Closes the connection without sending any response (after the delay, if any).
    pub fn hang_up() -> Self {
        Self {
            status: 0,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: ReplyBody::HangUp,
        }
    }

    /// Cuts the connection after the last chunk instead of ending the body.
    pub fn abort_after_chunks(mut self) -> Self {
        if let ReplyBody::Chunks { abort, .. } = &mut self.body {
            *abort = true;
        }
        self
    }
}

/// One request the fake provider received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names lower-case.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// When the request arrived (its headers and body were read).
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Computes the reply to a request from the request itself (many concurrent conversations).
pub type Responder = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    requests: Vec<RecordedRequest>,
    responder: Option<Responder>,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script")
            .field("replies", &self.replies)
            .field("requests", &self.requests.len())
            .field("responder", &self.responder.is_some())
            .finish()
    }
}

/// A scripted model provider on `127.0.0.1:<random port>`; stops when dropped.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use cella_llm::testing::{FakeProvider, OpenAiSse, Reply};
/// let fake = FakeProvider::start().await?;
/// fake.push(Reply::sse(OpenAiSse::new("m").text("Hello").finish("stop").usage(5, 1).build()));
/// let client = cella_llm::build_client(fake.openai_config("m")).expect("client");
/// // … drive `client`, then inspect `fake.requests()`.
/// # Ok(()) }
/// ```
///
/// A request arriving when no reply is left gets a 500 whose message says so.
#[derive(Debug)]
pub struct FakeProvider {
    url: String,
    script: Arc<Mutex<Script>>,
    task: JoinHandle<()>,
}

impl FakeProvider {
    /// Binds a loopback port and starts serving.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let script = Arc::new(Mutex::new(Script::default()));
        let shared = Arc::clone(&script);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Every chunk goes out at once (no Nagle delay waiting for the client's ACK).
                let _ = stream.set_nodelay(true);
                let script = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(Arc::clone(&script), req));
                    // A client hanging up mid-reply is part of several tests.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, script, task })
    }

    /// `http://127.0.0.1:<port>` (no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Queues the reply to the next request not yet answered.
    pub fn push(&self, reply: Reply) {
        self.lock().replies.push_back(reply);
    }

    /// Queues several replies in order.
    pub fn push_all(&self, replies: impl IntoIterator<Item = Reply>) {
        self.lock().replies.extend(replies);
    }

    /// Answers requests that find no queued reply with `responder(request)` instead of a 500:
    /// for concurrent conversations, where a FIFO script cannot say which reply is whose.
    pub fn respond_with(
        &self,
        responder: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    ) {
        self.lock().responder = Some(Arc::new(responder));
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// Replies queued but not yet sent.
    pub fn remaining(&self) -> usize {
        self.lock().replies.len()
    }

    /// A config for an OpenAI-compatible client of this server (`{url}/v1`, model `model`, no
    /// key, 2 retries 10 ms apart, 10 s timeout).
    pub fn openai_config(&self, model: &str) -> ModelConfig {
        ModelConfig::new(Provider::OpenAiCompatible, model)
            .with_base_url(format!("{}/v1", self.url))
            .with_retries(2, Duration::from_millis(10))
            .with_timeout(Duration::from_secs(10))
    }

    /// A config for an Anthropic client of this server (key `test-key`, 2 retries 10 ms apart,
    /// 10 s timeout).
    pub fn anthropic_config(&self, model: &str) -> ModelConfig {
        ModelConfig::new(Provider::Anthropic, model)
            .with_base_url(self.url.clone())
            .with_api_key("test-key")
            .with_retries(2, Duration::from_millis(10))
            .with_timeout(Duration::from_secs(10))
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        lock(&self.script)
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A poisoned lock only means another test thread panicked; the script is still usable.
fn lock(script: &Mutex<Script>) -> MutexGuard<'_, Script> {
    script
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Body = BoxBody<Bytes, std::io::Error>;

async fn answer(
    script: Arc<Mutex<Script>>,
    request: Request<Incoming>,
) -> Result<Response<Body>, std::io::Error> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), ToString::to_string),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        received_at: Instant::now(),
    };
    let (queued, responder, number) = {
        let mut script = lock(&script);
        let number = script.requests.len() + 1;
        script.requests.push(recorded.clone());
        (script.replies.pop_front(), script.responder.clone(), number)
    };
    // The responder runs outside the lock (it may take its time or look at shared state).
    let reply = match (queued, responder) {
        (Some(reply), _) => reply,
        (None, Some(responder)) => responder(&recorded),
        (None, None) => Reply::openai_error(
            500,
            &format!("fake provider: no scripted reply left for request {number}"),
        ),
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let body: Body = match reply.body {
        // An error from the service makes hyper close the connection unanswered.
        ReplyBody::HangUp => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "fake provider hung up",
            ));
        }
        ReplyBody::Full(bytes) => Full::new(bytes).map_err(|never| match never {}).boxed(),
        ReplyBody::Chunks { chunks, abort } => {
            let frames =
                futures::stream::iter(chunks.into_iter().map(Some).chain(abort.then_some(None)))
                    .then(|chunk| async move {
                        match chunk {
                            Some((pause, bytes)) => {
                                if pause.is_zero() {
                                    // Pending once, so hyper writes the previous chunk alone.
                                    tokio::task::yield_now().await;
                                } else {
                                    tokio::time::sleep(pause).await;
                                }
                                Ok(Frame::data(bytes))
                            }
                            None => Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionAborted,
                                "fake provider cut the connection",
                            )),
                        }
                    });
            BodyExt::boxed(StreamBody::new(frames))
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}
