//! The host side of the envd protocol: Connect JSON calls over HTTP/1.1 to a sandbox's agent,
//! on whatever transport its backend provides (a Unix socket for the native backend).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use cella_proto::process::{ProcessEvent, ProcessEventMessage, StartRequest};
use cella_proto::{Code, EnvelopeDecoder, RpcError};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Failure talking to envd.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the sandbox agent at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("http exchange with the sandbox agent failed: {0}")]
    Http(String),
    #[error("{0}")]
    Rpc(#[from] RpcError),
}

impl ClientError {
    /// The Connect code of this error (transport failures are `unavailable`).
    pub fn code(&self) -> Code {
        match self {
            ClientError::Rpc(e) => e.code,
            _ => Code::Unavailable,
        }
    }
}

/// A client for one sandbox's envd.
#[derive(Debug, Clone)]
pub struct EnvdClient {
    socket: PathBuf,
}

impl EnvdClient {
    pub fn unix(socket: impl Into<PathBuf>) -> Self {
        EnvdClient {
            socket: socket.into(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one HTTP request on a fresh connection and returns the streaming response.
    pub async fn send<B>(&self, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Http(e.to_string()))
    }

    fn request(
        path: &str,
        content_type: &str,
        user: Option<&str>,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut b = Request::post(path)
            .header("host", "envd")
            .header("content-type", content_type)
            .header("connect-protocol-version", "1");
        if let Some(u) = user {
            b = b.header(
                "authorization",
                format!(
                    "Basic {}",
                    cella_proto::b64::encode(format!("{u}:").as_bytes())
                ),
            );
        }
        b.body(Full::new(body))
            .map_err(|e| ClientError::Http(e.to_string()))
    }

    /// A unary Connect call, e.g. `("/process.Process/List", &ListRequest{})`.
    pub async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        req: &Req,
        user: Option<&str>,
    ) -> Result<Resp, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = self
            .send(Self::request(
                path,
                cella_proto::CONTENT_TYPE_UNARY,
                user,
                body.into(),
            )?)
            .await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            let err = serde_json::from_slice::<RpcError>(&bytes).unwrap_or_else(|_| {
                RpcError::new(
                    Code::from_http_status(status.as_u16()),
                    String::from_utf8_lossy(&bytes).into_owned(),
                )
            });
            return Err(err.into());
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| RpcError::internal(format!("malformed response from envd: {e}")).into())
    }

    /// A server-streaming Connect call.
    pub async fn stream<Req: Serialize>(
        &self,
        path: &str,
        req: &Req,
        user: Option<&str>,
        keepalive_secs: Option<u64>,
    ) -> Result<MessageStream, ClientError> {
        let json = serde_json::to_vec(req).map_err(|e| ClientError::Http(e.to_string()))?;
        let mut request = Self::request(
            path,
            cella_proto::CONTENT_TYPE_STREAM,
            user,
            cella_proto::Envelope::encode(0, &json),
        )?;
        if let Some(k) = keepalive_secs
            && let Ok(v) = k.to_string().parse()
        {
            request.headers_mut().insert("keepalive-ping-interval", v);
        }
        let resp = self.send(request).await?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ClientError::Http(e.to_string()))?
                .to_bytes();
            let err = serde_json::from_slice::<RpcError>(&bytes).unwrap_or_else(|_| {
                RpcError::new(
                    Code::from_http_status(status.as_u16()),
                    String::from_utf8_lossy(&bytes).into_owned(),
                )
            });
            return Err(err.into());
        }
        Ok(MessageStream {
            body: resp.into_body(),
            decoder: EnvelopeDecoder::new(),
            ended: false,
        })
    }

    /// Starts a process and returns its event stream (the first event is `start`).
    pub async fn start(
        &self,
        req: &StartRequest,
        user: Option<&str>,
    ) -> Result<ProcessStream, ClientError> {
        let mut inner = self
            .stream("/process.Process/Start", req, user, None)
            .await?;
        // A failure to start arrives as the stream's only (end) message.
        match inner.next::<ProcessEventMessage>().await {
            Some(Ok(first)) => Ok(ProcessStream {
                inner,
                first: Some(first.event),
            }),
            Some(Err(e)) => Err(e),
            None => Err(RpcError::new(
                Code::Unavailable,
                "the process stream ended before it started",
            )
            .into()),
        }
    }

    /// `GET path` and its JSON answer (envd's `/metrics`, `/envs`).
    /// Adds sandbox-wide environment variables (envd's internal `/init`), as when a ready
    /// sandbox from a warm pool is handed to a caller who asked for `envVars`.
    pub async fn set_envs(
        &self,
        envs: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), ClientError> {
        let body = serde_json::json!({ "envVars": envs }).to_string();
        let req = Request::post("/init")
            .header("host", "envd")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = self.send(req).await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        Err(RpcError::invalid_argument(format!(
            "envd refused the environment ({status}): {}",
            String::from_utf8_lossy(&bytes)
        ))
        .into())
    }

    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ClientError> {
        let req = Request::get(path)
            .header("host", "envd")
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = self.send(req).await?;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        serde_json::from_slice(&bytes)
            .map_err(|e| RpcError::internal(format!("malformed JSON from envd {path}: {e}")).into())
    }

    /// Whether the agent answers `/health`.
    pub async fn healthy(&self) -> bool {
        let Ok(req) = Request::get("/health")
            .header("host", "envd")
            .body(Full::new(Bytes::new()))
        else {
            return false;
        };
        matches!(self.send(req).await, Ok(r) if r.status().as_u16() == 204)
    }
}

/// Messages of a server-streaming response.
pub struct MessageStream {
    body: Incoming,
    decoder: EnvelopeDecoder,
    ended: bool,
}

impl MessageStream {
    /// The next message; `None` after a clean end of stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Option<Result<T, ClientError>> {
        loop {
            if self.ended {
                return None;
            }
            match self.decoder.next_envelope() {
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e.into()));
                }
                Ok(Some(env)) if env.is_end_stream() => {
                    self.ended = true;
                    return env.end_stream_error().map(|e| Err(e.into()));
                }
                Ok(Some(env)) => {
                    return Some(serde_json::from_slice(&env.data).map_err(|e| {
                        RpcError::internal(format!("malformed message from envd: {e}")).into()
                    }));
                }
                Ok(None) => {}
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(ClientError::Http(e.to_string())));
                }
                None => {
                    self.ended = true;
                    return Some(Err(RpcError::new(Code::Unavailable, "stream ended without an end-of-stream message (the sandbox may have been killed)").into()));
                }
            }
        }
    }
}

/// Events of one process.
pub struct ProcessStream {
    inner: MessageStream,
    first: Option<ProcessEvent>,
}

impl ProcessStream {
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        self.inner
            .next::<ProcessEventMessage>()
            .await
            .map(|r| r.map(|m| m.event))
    }
}
