//! Port forwarding: the host reaches a TCP port listening inside the sandbox's network namespace
//! through envd's socket. `GET /__cella/forward/{port}` with `Upgrade: cella-forward` connects to
//! `127.0.0.1:{port}` (then `[::1]:{port}`) and, once connected, answers `101` and splices the
//! upgraded connection to it byte for byte. Nothing listening is a `502` that says so.
//!
//! The route is internal: gateways refuse every `/__cella/` path, so only the host side (which
//! holds the socket) can open a forward. This module knows nothing about HTTP beyond the upgrade:
//! what flows through the splice is the caller's business.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::Envd;

/// How long connecting to a port inside the sandbox may take (it is loopback: a listener
/// answers at once, so this bounds only a full accept backlog).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub fn routes() -> axum::Router<Envd> {
    axum::Router::new().route(
        &format!("{}{{port}}", cella_proto::FORWARD_PATH),
        get(forward),
    )
}

fn plain(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn forward(Path(port): Path<String>, mut req: Request) -> Response {
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("invalid port {port:?}: use 1 to 65535"),
            );
        }
    };
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok());
    if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case(cella_proto::FORWARD_UPGRADE)) {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "a forward must be requested with Upgrade: {}",
                cella_proto::FORWARD_UPGRADE
            ),
        );
    }
    let tcp = match connect(port).await {
        Ok(s) => s,
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                format!("nothing accepts connections on port {port} inside the sandbox: {e}"),
            );
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => splice(TokioIo::new(upgraded), tcp).await,
            Err(e) => tracing::debug!(port, "forward upgrade failed: {e}"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut().insert(
        header::UPGRADE,
        HeaderValue::from_static(cella_proto::FORWARD_UPGRADE),
    );
    resp
}

/// Connects to the port on IPv4 loopback, then IPv6 loopback.
async fn connect(port: u16) -> std::io::Result<TcpStream> {
    let mut last = None;
    for ip in [Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()] {
        let addr = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                last = Some(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no loopback address")))
}

/// Copies both ways until either side finishes, then closes both: the host side never
/// half-closes, so its end means the client has gone, and the inside server must see that at
/// once (the code interpreter interrupts a cell whose client left).
pub async fn splice<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
    }
}
