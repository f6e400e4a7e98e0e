//! The host side of the envd protocol: Connect JSON calls over HTTP/1.1 to a sandbox's agent,
//! reached either on the Unix socket its backend provides (the native backend) or through an
//! E2B-style gateway such as `cella serve` (plain HTTP over TCP, the sandbox addressed by the
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers). Every call below works the same on both.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use cella_proto::process::{ProcessEvent, ProcessEventMessage, StartRequest};
use cella_proto::{Code, EnvelopeDecoder, RpcError};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Failure talking to envd (or, through [`send_http1`], to any HTTP/1.1 server).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        source: std::io::Error,
    },
    #[error("http exchange with {target} failed: {detail}")]
    Http { target: String, detail: String },
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

/// Where an HTTP/1.1 server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dial {
    /// A Unix socket (the native backend's envd socket).
    Unix(PathBuf),
    /// `host:port` over plain TCP (no TLS).
    Tcp(String),
}

impl std::fmt::Display for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dial::Unix(p) => write!(f, "the sandbox agent at {}", p.display()),
            Dial::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

/// How long a TCP connection may take to open.
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one request on a fresh HTTP/1.1 connection and returns the streaming response.
/// Transport only: it adds no headers and knows nothing of envd or E2B.
pub async fn send_http1<B>(dial: &Dial, req: Request<B>) -> Result<Response<Incoming>, ClientError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let connect_error = |source| ClientError::Connect {
        target: dial.to_string(),
        source,
    };
    match dial {
        Dial::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect_error)?;
            exchange(dial, TokioIo::new(stream), req).await
        }
        Dial::Tcp(authority) => {
            let stream = tokio::time::timeout(
                TCP_CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect(authority.as_str()),
            )
            .await
            .map_err(|_| {
                connect_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", TCP_CONNECT_TIMEOUT.as_secs()),
                ))
            })?
            .map_err(connect_error)?;
            let _ = stream.set_nodelay(true);
            exchange(dial, TokioIo::new(stream), req).await
        }
    }
}

async fn exchange<IO, B>(
    dial: &Dial,
    io: IO,
    req: Request<B>,
) -> Result<Response<Incoming>, ClientError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let http_error = |e: hyper::Error| ClientError::Http {
        target: dial.to_string(),
        detail: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http_error)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(http_error)
}

/// A sandbox reached through an E2B-style envd gateway (`cella serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayRoute {
    /// The gateway's `host:port` (plain HTTP).
    pub authority: String,
    pub sandbox_id: String,
    /// The sandbox's `envdAccessToken`, sent as `X-Access-Token` when set.
    pub access_token: Option<String>,
}

/// How requests reach one sandbox's envd.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Direct(Dial),
    Gateway(GatewayRoute),
}

/// A client for one sandbox's envd.
#[derive(Debug, Clone)]
pub struct EnvdClient {
    route: Route,
}

impl EnvdClient {
    /// envd on its own Unix socket.
    pub fn unix(socket: impl Into<PathBuf>) -> Self {
        EnvdClient {
            route: Route::Direct(Dial::Unix(socket.into())),
        }
    }

    /// envd where a backend said it listens.
    pub fn for_transport(transport: &crate::backend::Transport) -> Self {
        match transport {
            crate::backend::Transport::Unix(socket) => Self::unix(socket.clone()),
        }
    }

    /// envd of `route.sandbox_id` through the gateway at `route.authority`.
    pub fn gateway(route: GatewayRoute) -> Self {
        EnvdClient {
            route: Route::Gateway(route),
        }
    }

    /// envd's Unix socket, when it is reached directly on one (what port forwarding opens).
    pub fn unix_socket(&self) -> Option<&std::path::Path> {
        match &self.route {
            Route::Direct(Dial::Unix(path)) => Some(path),
            _ => None,
        }
    }

    fn http_error(&self, detail: impl ToString) -> ClientError {
        let target = match &self.route {
            Route::Direct(d) => d.to_string(),
            Route::Gateway(g) => format!("sandbox {} via http://{}", g.sandbox_id, g.authority),
        };
        ClientError::Http {
            target,
            detail: detail.to_string(),
        }
    }

    /// Sends one HTTP request on a fresh connection and returns the streaming response. Through
    /// a gateway, the request is addressed to the sandbox (Host, `E2b-Sandbox-Id`,
    /// `E2b-Sandbox-Port`, `X-Access-Token`).
    pub async fn send<B>(&self, mut req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match &self.route {
            Route::Direct(dial) => send_http1(dial, req).await,
            Route::Gateway(g) => {
                let value = |v: &str| HeaderValue::from_str(v).map_err(|e| self.http_error(e));
                let headers = req.headers_mut();
                headers.insert("host", value(&g.authority)?);
                headers.insert("e2b-sandbox-id", value(&g.sandbox_id)?);
                headers.insert(
                    "e2b-sandbox-port",
                    HeaderValue::from(cella_proto::ENVD_PORT),
                );
                if let Some(token) = &g.access_token {
                    let mut token = value(token)?;
                    token.set_sensitive(true);
                    headers.insert("x-access-token", token);
                }
                send_http1(&Dial::Tcp(g.authority.clone()), req).await
            }
        }
    }

    fn request(
        &self,
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
        b.body(Full::new(body)).map_err(|e| self.http_error(e))
    }

    /// A unary Connect call, e.g. `("/process.Process/List", &ListRequest{})`.
    pub async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        req: &Req,
        user: Option<&str>,
    ) -> Result<Resp, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| self.http_error(e))?;
        let resp = self
            .send(self.request(path, cella_proto::CONTENT_TYPE_UNARY, user, body.into())?)
            .await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http_error(e))?
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
        let json = serde_json::to_vec(req).map_err(|e| self.http_error(e))?;
        let mut request = self.request(
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
                .map_err(|e| self.http_error(e))?
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
            .map_err(|e| self.http_error(e))?;
        let resp = self.send(req).await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http_error(e))?
            .to_bytes();
        Err(RpcError::invalid_argument(format!(
            "envd refused the environment ({status}): {}",
            String::from_utf8_lossy(&bytes)
        ))
        .into())
    }

    /// `GET path` and its JSON answer (envd's `/metrics`, `/envs`).
    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ClientError> {
        let req = Request::get(path)
            .header("host", "envd")
            .body(Full::new(Bytes::new()))
            .map_err(|e| self.http_error(e))?;
        let resp = self.send(req).await?;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http_error(e))?
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
                    return Some(Err(RpcError::new(
                        Code::Unavailable,
                        format!("the stream from the sandbox agent broke: {e}"),
                    )
                    .into()));
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
