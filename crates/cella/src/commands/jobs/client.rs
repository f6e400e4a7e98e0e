//! A small HTTP/1.1 client of `cella serve` for the `cella jobs` commands: the server from
//! `--url`/`CELLA_URL`, the key from `--api-key`/`CELLA_API_KEY`, one connection per request,
//! JSON in and out, bodies streamed for event streams and downloads. Plain `http://` only
//! (put TLS in front of the server with a proxy and talk to it locally).

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Where the server is and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// The server, e.g. http://127.0.0.1:3000.
    #[arg(
        long = "url",
        env = "CELLA_URL",
        default_value = "http://127.0.0.1:3000",
        global = true
    )]
    pub url: String,
    /// An API key of the server (`cella keys create`, or <data-dir>/admin.key).
    #[arg(
        long = "api-key",
        env = "CELLA_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub api_key: Option<String>,
}

pub struct Client {
    host: String,
    port: u16,
    api_key: Option<String>,
    shown: String,
}

impl Client {
    pub fn new(args: &ServerArgs) -> anyhow::Result<Client> {
        let url = args.url.trim().trim_end_matches('/');
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("unsupported server url {url:?}: use http://HOST:PORT (set --url or CELLA_URL)");
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse::<u16>()
                    .with_context(|| format!("invalid port in server url {url:?}"))?,
            ),
            None => (authority.to_owned(), 80),
        };
        if host.is_empty() {
            bail!("no host in server url {url:?}: use http://HOST:PORT");
        }
        Ok(Client {
            host,
            port,
            api_key: args.api_key.clone().filter(|k| !k.trim().is_empty()),
            shown: url.to_owned(),
        })
    }

    /// Sends a request and returns the response with its body unread.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> anyhow::Result<Response<Incoming>> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| {
                format!(
                    "cannot reach the server at {}: is `cella serve` running there? (set --url or CELLA_URL)",
                    self.shown
                )
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("talking to {}", self.shown))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("{}:{}", self.host, self.port));
        if let Some(key) = &self.api_key {
            req = req.header("x-api-key", key);
        }
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let bytes = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(bytes)).context("building the request")?;
        sender
            .send_request(req)
            .await
            .with_context(|| format!("request to {} failed", self.shown))
    }

    /// A JSON request; a non-2xx answer becomes an error with the server's message.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let resp = self.send(method, path, body, &[]).await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("reading the server's answer")?
            .to_bytes();
        if !status.is_success() {
            bail!("{}", failure(status, &bytes));
        }
        serde_json::from_slice(&bytes).context("the server's answer is not JSON")
    }
}

/// The message of an error answer, with what to do next for the common ones.
pub fn failure(status: StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    match status {
        StatusCode::UNAUTHORIZED => {
            format!("{message} (the server wants an API key: set --api-key or CELLA_API_KEY)")
        }
        _ => format!("{message} (HTTP {})", status.as_u16()),
    }
}
