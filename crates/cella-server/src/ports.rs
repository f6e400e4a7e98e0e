//! Exposed ports: a request addressed to port P of a sandbox (P ≠ envd's) is passed to whatever
//! listens on `127.0.0.1:P` inside the sandbox, over a connection opened through envd's socket
//! (`cella_sandbox::forward`). HTTP/1.1 both ways with bodies streamed; `Upgrade` requests
//! (WebSocket) are answered by the inside server and then spliced byte for byte.
//!
//! Access: a sandbox created with `allowPublicTraffic: false` has a traffic access token, and
//! its ports answer only requests carrying it in `e2b-traffic-access-token`. The code
//! interpreter's `/execute` (port 49999) runs code, so on a secured sandbox it also needs the
//! envd access token, as every envd call that runs something does.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use crate::error::ApiError;
use crate::gateway::Target;
use crate::state::{AppState, GatewayEntry};

/// Headers that address or authorize the sandbox: meaningful to the gateway only.
const GATEWAY_HEADERS: &[&str] = &[
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "e2b-traffic-access-token",
    "x-access-token",
];

/// Hop-by-hop headers (RFC 9110 §7.6.1); `connection` and `upgrade` survive on upgrades.
const HOP_BY_HOP: &[&str] = &[
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

fn header_is(headers: &HeaderMap, name: &str, value: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == value)
}

/// Checks a request's right to reach a port of the sandbox.
fn authorize(req: &Request<Body>, sandbox: &GatewayEntry, target: &Target) -> Result<(), ApiError> {
    if let Some(token) = &sandbox.traffic_access_token
        && !header_is(req.headers(), "e2b-traffic-access-token", token)
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the ports of sandbox {} are private (allowPublicTraffic is false): send its \
                 trafficAccessToken in the e2b-traffic-access-token header",
                target.sandbox_id
            ),
        ));
    }
    if target.port == cella_proto::INTERPRETER_PORT
        && req.uri().path() == "/execute"
        && let Some(token) = &sandbox.envd_access_token
        && !header_is(req.headers(), "x-access-token", token)
    {
        return Err(ApiError::unauthorized(
            "missing or invalid X-Access-Token: running code needs the sandbox's envd access token",
        ));
    }
    Ok(())
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes what must not travel past this hop; an upgrade keeps `Connection: upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty() && t != "upgrade")
        .collect();
    for n in named {
        headers.remove(n.as_str());
    }
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// Passes one request to port `target.port` inside the sandbox and streams the answer back.
pub async fn proxy(
    state: &AppState,
    target: Target,
    mut req: Request<Body>,
) -> Result<Response, ApiError> {
    let sandbox = state.sandbox_for_gateway(&target.sandbox_id).await?;
    authorize(&req, &sandbox, &target)?;
    if sandbox.paused {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {} is paused: resume it with connect",
                target.sandbox_id
            ),
        ));
    }
    let (id, port) = (&target.sandbox_id, target.port);
    let Some(socket) = sandbox.envd.unix_socket() else {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "port {port} of sandbox {id} cannot be forwarded: its agent has no local socket"
            ),
        ));
    };
    let upstream = cella_sandbox::forward::open(socket, port)
        .await
        .map_err(|e| {
            let why = match e {
                cella_sandbox::forward::ForwardError::Refused(m) => m,
                other => other.to_string(),
            };
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("port {port} of sandbox {id} is not reachable: {why}"),
            )
        })?;
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(upstream)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("port {port} of sandbox {id}: {e}"),
            )
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });

    let (mut parts, body) = req.into_parts();
    for h in GATEWAY_HEADERS {
        parts.headers.remove(*h);
    }
    strip_hop_by_hop(&mut parts.headers, upgrade);
    let uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut out = Request::builder()
        .method(parts.method)
        .uri(uri)
        .body(crate::metrics::CountingBody::new(
            body,
            &state.metrics.gateway_bytes_in,
        ))
        .map_err(|e| ApiError::internal(format!("building the request for port {port}: {e}")))?;
    *out.headers_mut() = parts.headers;

    let mut resp = sender.send_request(out).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("port {port} of sandbox {id} did not answer: {e}"),
        )
    })?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("port {port} of sandbox {id} switched protocols without being asked"),
            ));
        };
        let server_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(client), Ok(server)) = tokio::join!(client_upgrade, server_upgrade) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(client),
                    &mut TokioIo::new(server),
                )
                .await;
            }
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove("keep-alive");
    parts.headers.remove(header::CONNECTION);
    let body = crate::metrics::CountingBody::new(body, &state.metrics.gateway_bytes_out);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_stripped_but_upgrades_survive() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            "keep-alive, X-Secret".parse().expect("hv"),
        );
        h.insert("x-secret", "1".parse().expect("hv"));
        h.insert("transfer-encoding", "chunked".parse().expect("hv"));
        h.insert("x-kept", "1".parse().expect("hv"));
        assert!(!is_upgrade(&h));
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("x-secret").is_none() && h.get("transfer-encoding").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h.get("x-kept").map(|v| v.as_bytes()), Some(&b"1"[..]));

        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "Upgrade".parse().expect("hv"));
        h.insert(header::UPGRADE, "websocket".parse().expect("hv"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
        assert!(h.get(header::UPGRADE).is_some());
    }
}
