//! The client side of `cella serve` (the E2B control plane, `/v1` for jobs) and the door to a
//! sandbox's envd through the server's gateway. Owns where the server is, which
//! API key is sent, and turning refusals into messages that say what to do next. Knows nothing
//! of terminals or output formats.

use std::path::PathBuf;

use bytes::Bytes;
use cella_sandbox::{ClientError, Dial, EnvdClient, GatewayRoute};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Where the server is and how we authenticate, from flags, environment and the data directory.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerOptions {
    /// URL of the `cella serve` to talk to (plain http).
    #[arg(
        long,
        env = "CELLA_URL",
        default_value = "http://127.0.0.1:3000",
        global = true
    )]
    pub url: String,
    /// API key sent as X-API-Key. When neither this nor CELLA_API_KEY is set, the server's
    /// admin key is read from <data-dir>/admin.key if this user can read it.
    #[arg(long, env = "CELLA_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// The server's data directory, only used to find admin.key (default: the one `cella
    /// serve` uses: /var/lib/cella as root, ~/.local/share/cella otherwise).
    #[arg(long, env = "CELLA_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
}

/// Where the key came from, so a refusal can say which key was wrong.
#[derive(Debug, Clone)]
enum KeySource {
    Given,
    AdminFile(PathBuf),
    None { looked_at: PathBuf },
}

/// A refused or failed request, classified by what the user should do about it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "cannot reach the cella server at {url} ({detail}): is `cella serve` running? Start it with `cella serve`, or point --url / CELLA_URL at it"
    )]
    Unreachable { url: String, detail: String },
    #[error("the server at {url} refused the API key: {message}. {hint}")]
    Unauthorized {
        url: String,
        message: String,
        hint: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{message} (HTTP {status})")]
    Refused { status: StatusCode, message: String },
    #[error("unexpected answer from {url}: {detail}")]
    Protocol { url: String, detail: String },
}

/// A connection-less client of one `cella serve`.
#[derive(Debug, Clone)]
pub struct Server {
    /// `http://host:port`, for messages.
    url: String,
    authority: String,
    key: Option<String>,
    key_source: KeySource,
}

/// An answer: status, headers and the whole (small, JSON) body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json<T: DeserializeOwned>(&self, server: &Server) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body).map_err(|e| ApiError::Protocol {
            url: server.url.clone(),
            detail: format!(
                "malformed JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            ),
        })
    }
}

/// `http://host[:port][/]` → `host:port`.
fn authority_of(url: &str) -> anyhow::Result<String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid server URL {url:?}: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => anyhow::bail!(
            "invalid server URL {url:?}: https is not supported by this client yet; `cella serve` speaks plain http (reach a remote server through an SSH tunnel or a local proxy)"
        ),
        _ => anyhow::bail!("invalid server URL {url:?}: expected http://HOST:PORT"),
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        anyhow::bail!("invalid server URL {url:?}: expected http://HOST:PORT without a path");
    }
    let Some(authority) = uri.authority() else {
        anyhow::bail!("invalid server URL {url:?}: expected http://HOST:PORT");
    };
    Ok(format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    ))
}

impl Server {
    pub fn new(opts: &ServerOptions) -> anyhow::Result<Server> {
        let authority = authority_of(&opts.url)?;
        let url = format!("http://{authority}");
        let (key, key_source) = match opts.api_key.as_deref().map(str::trim) {
            Some(k) if !k.is_empty() => (Some(k.to_string()), KeySource::Given),
            _ => {
                let data_dir = opts
                    .data_dir
                    .clone()
                    .unwrap_or_else(crate::commands::serve::default_data_dir);
                let file = data_dir.join("admin.key");
                match std::fs::read_to_string(&file) {
                    Ok(k) if !k.trim().is_empty() => {
                        (Some(k.trim().to_string()), KeySource::AdminFile(file))
                    }
                    _ => (None, KeySource::None { looked_at: file }),
                }
            }
        };
        Ok(Server {
            url,
            authority,
            key,
            key_source,
        })
    }

    fn unreachable(&self, e: &ClientError) -> ApiError {
        let detail = match e {
            ClientError::Connect { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        ApiError::Unreachable {
            url: self.url.clone(),
            detail,
        }
    }

    /// What to do about a 401.
    fn key_hint(&self) -> String {
        let how = "pass --api-key or set CELLA_API_KEY to a key from `cella keys create --tenant NAME` (run on the server's host), or use the admin key the server wrote to <data-dir>/admin.key";
        match &self.key_source {
            KeySource::Given => format!("The key from --api-key / CELLA_API_KEY is wrong: {how}"),
            KeySource::AdminFile(p) => format!(
                "The admin key read from {} belongs to another server: {how}",
                p.display()
            ),
            KeySource::None { looked_at } => format!(
                "No API key was given and {} is not readable: {how}",
                looked_at.display()
            ),
        }
    }

    /// Turns a non-2xx answer into an error; E2B errors are `{"code", "message"}`.
    pub fn refusal(&self, status: StatusCode, body: &[u8]) -> ApiError {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
        match status {
            StatusCode::UNAUTHORIZED => ApiError::Unauthorized {
                url: self.url.clone(),
                message,
                hint: self.key_hint(),
            },
            StatusCode::NOT_FOUND => ApiError::NotFound(message),
            status => ApiError::Refused { status, message },
        }
    }

    /// Sends a request and returns the answer with its body unread (event streams, downloads);
    /// `headers` are added to the request.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header("host", &self.authority)
            .header("user-agent", concat!("cella/", env!("CARGO_PKG_VERSION")));
        if let Some(key) = &self.key {
            req = req.header("x-api-key", key);
        }
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let payload = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(v).unwrap_or_default())
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(payload))
            .map_err(|e| ApiError::Protocol {
                url: self.url.clone(),
                detail: format!("building the request for {path_and_query}: {e}"),
            })?;
        cella_sandbox::send_http1(&Dial::Tcp(self.authority.clone()), req)
            .await
            .map_err(|e| self.unreachable(&e))
    }

    /// One control-plane call; the answer is returned whatever its status.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ApiError> {
        let resp = self.send(method, path_and_query, body, &[]).await?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| ApiError::Protocol {
                url: self.url.clone(),
                detail: format!("reading the answer to {path_and_query}: {e}"),
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// The error for a non-2xx answer whose body is still unread (a stream that was refused).
    pub async fn refused(&self, resp: hyper::Response<hyper::body::Incoming>) -> ApiError {
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        self.refusal(status, &body)
    }

    /// A call that must succeed (2xx).
    pub async fn expect(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ApiError> {
        let answer = self.call(method, path_and_query, body).await?;
        if answer.status.is_success() {
            Ok(answer)
        } else {
            Err(self.refusal(answer.status, &answer.body))
        }
    }

    /// A JSON call that must succeed; its answer parsed.
    pub async fn json(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        self.expect(method, path_and_query, body).await?.json(self)
    }

    /// `GET /sandboxes/{id}`: the sandbox's details (including its envd access token).
    pub async fn sandbox(&self, id: &str) -> Result<Value, ApiError> {
        check_id(id)?;
        self.expect(Method::GET, &format!("/sandboxes/{id}"), None)
            .await?
            .json(self)
    }

    /// A client of the sandbox's envd through this server's gateway.
    pub fn envd(&self, detail: &Value) -> EnvdClient {
        EnvdClient::gateway(GatewayRoute {
            authority: self.authority.clone(),
            sandbox_id: detail["sandboxID"].as_str().unwrap_or_default().to_string(),
            access_token: detail["envdAccessToken"].as_str().map(str::to_owned),
        })
    }

    /// The envd client of a sandbox that must be running (a paused one is refused with the
    /// command that resumes it, as E2B's gateway refuses paused sandboxes).
    pub async fn running_envd(&self, id: &str) -> anyhow::Result<EnvdClient> {
        let detail = self.sandbox(id).await?;
        if detail["state"].as_str() == Some("paused") {
            anyhow::bail!("sandbox {id} is paused: resume it with `cella sandbox resume {id}`");
        }
        Ok(self.envd(&detail))
    }
}

/// Sandbox ids are lowercase letters and digits; anything else cannot exist and must not be
/// pasted into a URL path.
pub fn check_id(id: &str) -> Result<(), ApiError> {
    if cella_proto::ids::is_valid_sandbox_id(id) {
        Ok(())
    } else {
        Err(ApiError::NotFound(format!(
            "sandbox {id:?} not found (ids are lowercase letters and digits; see `cella sandbox ls`)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        assert_eq!(
            authority_of("http://127.0.0.1:3000").expect("ok"),
            "127.0.0.1:3000"
        );
        assert_eq!(
            authority_of("http://localhost/").expect("ok"),
            "localhost:80"
        );
        let https = authority_of("https://x:1").expect_err("https");
        assert!(
            https.to_string().contains("https is not supported"),
            "{https}"
        );
        assert!(authority_of("http://x:1/api").is_err());
        assert!(authority_of("x:1").is_err());
    }

    #[test]
    fn refusals_are_classified() {
        let server = Server {
            url: "http://h:1".into(),
            authority: "h:1".into(),
            key: None,
            key_source: KeySource::None {
                looked_at: "/d/admin.key".into(),
            },
        };
        let e = server.refusal(
            StatusCode::UNAUTHORIZED,
            br#"{"code":401,"message":"missing API key"}"#,
        );
        let text = e.to_string();
        assert!(text.contains("missing API key"), "{text}");
        assert!(text.contains("/d/admin.key is not readable"), "{text}");
        assert!(text.contains("cella keys create"), "{text}");
        assert!(matches!(
            server.refusal(StatusCode::NOT_FOUND, br#"{"code":404,"message":"sandbox x not found"}"#),
            ApiError::NotFound(m) if m == "sandbox x not found"
        ));
        assert_eq!(
            server
                .refusal(StatusCode::CONFLICT, b"already paused")
                .to_string(),
            "already paused (HTTP 409 Conflict)"
        );
    }
}
