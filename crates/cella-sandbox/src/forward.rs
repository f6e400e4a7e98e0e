//! The host side of port forwarding: a connection to a TCP port listening inside a sandbox,
//! opened through its envd socket (`GET /__cella/forward/{port}` with an HTTP upgrade; see
//! `cella_envd::forward`). What flows over the connection is the caller's business.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;

/// Why a forward could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot reach the sandbox agent at {path}: {source}")]
    Agent {
        path: PathBuf,
        source: std::io::Error,
    },
    /// envd answered, but could not connect to the port (its message says why).
    #[error("{0}")]
    Refused(String),
    #[error("port forwarding handshake with the sandbox agent failed: {0}")]
    Handshake(String),
}

/// Longest error text read from envd when it refuses a forward.
const MAX_REFUSAL: usize = 4096;

/// Opens a byte stream to `127.0.0.1:{port}` inside the sandbox whose envd listens on `socket`.
pub async fn open(socket: &Path, port: u16) -> Result<Upgraded, ForwardError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| ForwardError::Agent {
            path: socket.to_path_buf(),
            source,
        })?;
    let handshake = |e: hyper::Error| ForwardError::Handshake(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(handshake)?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = Request::get(format!("{}{port}", cella_proto::FORWARD_PATH))
        .header(hyper::header::HOST, "envd")
        .header(hyper::header::CONNECTION, "upgrade")
        .header(hyper::header::UPGRADE, cella_proto::FORWARD_UPGRADE)
        .body(Empty::<Bytes>::new())
        .map_err(|e| ForwardError::Handshake(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(handshake)?;
    if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body[..body.len().min(MAX_REFUSAL)])
            .trim()
            .to_string();
        return Err(if status == hyper::StatusCode::BAD_GATEWAY {
            ForwardError::Refused(text)
        } else {
            ForwardError::Handshake(format!("envd answered {status}: {text}"))
        });
    }
    hyper::upgrade::on(resp).await.map_err(handshake)
}
