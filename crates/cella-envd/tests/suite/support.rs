//! Test support shared by every suite: an envd served in-process on a temporary Unix socket
//! (as the current user, who is also the default user), and a small HTTP/1.1 client for
//! Connect unary and server-streaming calls and plain requests.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use cella_envd::{Envd, EnvdConfig};
use cella_proto::{Envelope, EnvelopeDecoder};
use futures::{Stream, StreamExt};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Request bodies the client sends.
pub type ReqBody = BoxBody<Bytes, std::io::Error>;

/// How long any single wait in a test may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(5);

/// A running envd and a scratch directory for the test.
pub struct Harness {
    pub envd: Envd,
    pub socket: PathBuf,
    /// Scratch directory; tests work under [`Harness::path`].
    pub dir: tempfile::TempDir,
    pub user: String,
    pub home: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The name and home of the user the tests run as (from `/etc/passwd`).
pub fn current_user() -> (String, PathBuf, u32) {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .expect("stat /proc/self");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 7 && f[2].parse::<u32>().ok() == Some(uid) {
            return (f[0].to_string(), PathBuf::from(f[5]), uid);
        }
    }
    (
        uid.to_string(),
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/".into()),
        uid,
    )
}

/// Whether the tests run as root (needed to act as other users).
pub fn is_root() -> bool {
    current_user().2 == 0
}

impl Harness {
    pub async fn start() -> Harness {
        let (user, home, _) = current_user();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("envd.sock");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        let envd = Envd::new(EnvdConfig {
            default_user: user.clone(),
            ..EnvdConfig::default()
        });
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind envd socket");
        let served = envd.clone();
        let server = tokio::spawn(async move {
            let _ = cella_envd::serve(listener, served).await;
        });
        Harness {
            envd,
            socket,
            dir,
            user,
            home,
            server,
        }
    }

    /// An absolute path under the test's scratch directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        let base = self.dir.path().join("work");
        if rel.is_empty() { base } else { base.join(rel) }
    }

    /// `path(rel)` as a string, for request messages.
    pub fn p(&self, rel: &str) -> String {
        self.path(rel).to_string_lossy().into_owned()
    }

    /// Sends one request on a fresh connection.
    pub async fn send(&self, req: Request<ReqBody>) -> Response<Incoming> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .expect("connect to envd");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("http handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        tokio::time::timeout(WAIT, sender.send_request(req))
            .await
            .expect("response in time")
            .expect("response")
    }

    /// Sends `method uri` with `headers` and `body`.
    pub async fn request(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: ReqBody,
    ) -> Response<Incoming> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "envd");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(body).expect("request")).await
    }

    /// A unary Connect call as the default user: (HTTP status, JSON body).
    pub async fn unary(&self, method: &str, msg: Value) -> (StatusCode, Value) {
        self.unary_as(None, method, msg).await
    }

    /// A unary Connect call, as `user` when given (Basic auth, like the SDK).
    pub async fn unary_as(
        &self,
        user: Option<&str>,
        method: &str,
        msg: Value,
    ) -> (StatusCode, Value) {
        let auth = user.map(basic_auth);
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let resp = self
            .request(
                "POST",
                &format!("/{method}"),
                &headers,
                full(msg.to_string()),
            )
            .await;
        let status = resp.status();
        if status != StatusCode::OK {
            assert_eq!(
                resp.headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok()),
                Some("application/json"),
                "connect errors are JSON"
            );
        }
        let body = body_bytes(resp).await;
        let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "{method} answered non-JSON ({e}): {:?}",
                String::from_utf8_lossy(&body)
            )
        });
        (status, json)
    }

    /// Opens a server-streaming Connect call.
    pub async fn server_stream(
        &self,
        method: &str,
        msg: Value,
        headers: &[(&str, &str)],
    ) -> ConnectStream {
        let mut all = vec![("content-type", "application/connect+json")];
        all.extend_from_slice(headers);
        let body = Envelope::encode(0, msg.to_string().as_bytes());
        let resp = self
            .request("POST", &format!("/{method}"), &all, full(body))
            .await;
        ConnectStream {
            status: resp.status(),
            body: resp.into_body(),
            decoder: EnvelopeDecoder::new(),
        }
    }
}

/// `Authorization: Basic base64("<user>:")`, which selects the user in envd.
pub fn basic_auth(user: &str) -> String {
    format!(
        "Basic {}",
        cella_proto::b64::encode(format!("{user}:").as_bytes())
    )
}

/// The messages of a server-streaming response.
pub struct ConnectStream {
    pub status: StatusCode,
    body: Incoming,
    decoder: EnvelopeDecoder,
}

impl ConnectStream {
    /// The next envelope, waiting at most `timeout`; `None` on timeout or end of body.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Envelope> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(env) = self.decoder.next_envelope().expect("well-formed envelope") {
                return Some(env);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(data) = frame.expect("stream body").into_data() {
                self.decoder.push(&data);
            }
        }
    }

    /// The next data message as JSON; fails the test on end of stream or timeout.
    pub async fn message(&mut self) -> Value {
        let env = self
            .next_within(WAIT)
            .await
            .expect("a stream message in time");
        assert!(
            !env.is_end_stream(),
            "stream ended: {}",
            String::from_utf8_lossy(&env.data)
        );
        serde_json::from_slice(&env.data).expect("JSON message")
    }

    /// The end-of-stream message's JSON; fails the test if a data message comes first.
    pub async fn end(&mut self) -> Value {
        let env = self.next_within(WAIT).await.expect("end of stream in time");
        assert!(
            env.is_end_stream(),
            "expected end of stream, got {}",
            String::from_utf8_lossy(&env.data)
        );
        serde_json::from_slice(&env.data).expect("JSON end-stream message")
    }
}

pub fn full(data: impl Into<Bytes>) -> ReqBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> ReqBody {
    full(Bytes::new())
}

/// A request body streamed from `chunks`.
pub fn stream_body<S>(chunks: S) -> ReqBody
where
    S: Stream<Item = Bytes> + Send + Sync + 'static,
{
    BodyExt::boxed(StreamBody::new(
        chunks.map(|c| Ok::<_, std::io::Error>(Frame::data(c))),
    ))
}

pub async fn body_bytes(resp: Response<Incoming>) -> Bytes {
    tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes()
}

pub async fn body_json(resp: Response<Incoming>) -> Value {
    let body = body_bytes(resp).await;
    serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("non-JSON body ({e}): {:?}", String::from_utf8_lossy(&body)))
}

/// A deterministic pseudo-random byte stream (xorshift64*), reproducible for comparison and
/// continuous across `fill` calls of any size.
pub struct Pattern {
    state: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern {
            state: seed | 1,
            word: [0; 8],
            used: 8,
        }
    }

    fn next_word(&mut self) -> [u8; 8] {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes()
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() && self.used < 8 {
            buf[i] = self.word[self.used];
            self.used += 1;
            i += 1;
        }
        let mut words = buf[i..].chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next_word());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            self.word = self.next_word();
            self.used = 0;
            for b in tail {
                *b = self.word[self.used];
                self.used += 1;
            }
        }
    }

    pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        Pattern::new(seed).fill(&mut v);
        v
    }
}

/// Polls `check` until it holds or [`WAIT`] passes.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
