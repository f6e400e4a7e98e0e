//! The envd gateway: requests addressed to a sandbox (by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers, or a `<port>-<id>.<domain>` Host) are passed to that sandbox's
//! envd, streaming in both directions without buffering. Access is checked per sandbox: the
//! envd access token (`X-Access-Token`) or a signed file URL (`v1_` signatures with expiry);
//! envd's internal routes are refused. Other ports are served by `ports`.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

/// envd routes only the orchestrator may call (E2B's `x-internal`).
const INTERNAL_ROUTES: &[&str] = &[
    "/init",
    "/freeze",
    "/unfreeze",
    "/fsfreeze",
    "/fsthaw",
    "/collapse",
    "/upgrade",
];

/// Where a request is addressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u16,
}

/// Finds the sandbox a request is for, if it is a gateway request at all.
pub fn target(headers: &HeaderMap, domain: Option<&str>) -> Result<Option<Target>, ApiError> {
    let id = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok());
    let port = headers
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok());
    match (id, port) {
        (Some(id), Some(port)) => {
            let port = port
                .trim()
                .parse::<u16>()
                .map_err(|_| ApiError::bad_request(format!("invalid E2b-Sandbox-Port {port:?}")))?;
            return Ok(Some(Target {
                sandbox_id: id.trim().to_string(),
                port,
            }));
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "E2b-Sandbox-Id and E2b-Sandbox-Port must be sent together",
            ));
        }
        (None, None) => {}
    }
    let (Some(domain), Some(host)) = (domain, headers.get("host").and_then(|v| v.to_str().ok()))
    else {
        return Ok(None);
    };
    let host = host.split(':').next().unwrap_or(host);
    let Some(label) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')) else {
        return Ok(None);
    };
    let Some((port, id)) = label.split_once('-') else {
        return Ok(None);
    };
    match port.parse::<u16>() {
        Ok(port) if cella_proto::ids::is_valid_sandbox_id(id) => Ok(Some(Target {
            sandbox_id: id.to_string(),
            port,
        })),
        _ => Ok(None),
    }
}

/// A signed file URL carries no sandbox id when the SDK builds it from `E2B_SANDBOX_URL`: find
/// the sandbox whose access token produced the signature (cheap: one SHA-256 per live secured
/// sandbox, and a signature cannot be forged without the token).
pub fn target_by_signature(
    state: &AppState,
    req: &Request<Body>,
) -> Result<Option<Target>, ApiError> {
    if req.uri().path() != "/files" || !req.uri().query().unwrap_or("").contains("signature=") {
        return Ok(None);
    }
    find_signed(state, req).map(Some).ok_or_else(|| {
        ApiError::unauthorized("invalid file URL signature: it matches no running sandbox")
    })
}

fn find_signed(state: &AppState, req: &Request<Body>) -> Option<Target> {
    let signed = SignedFile::from_request(req)?;
    let id = state.find_sandbox(|token| signed.signed_with(token))?;
    Some(Target {
        sandbox_id: id,
        port: cella_proto::ENVD_PORT,
    })
}

/// The signature parameters of a `/files` request (a signed file URL).
struct SignedFile {
    signature: String,
    /// `read` for downloads, `write` for uploads.
    operation: &'static str,
    path: String,
    user: String,
    expiration: Option<i64>,
}

impl SignedFile {
    /// `None` unless the request is to `/files` and carries a `signature` parameter.
    fn from_request(req: &Request<Body>) -> Option<SignedFile> {
        if req.uri().path() != "/files" {
            return None;
        }
        let params = query_params(req.uri().query());
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Some(SignedFile {
            signature: get("signature")?,
            operation: if req.method() == axum::http::Method::GET {
                "read"
            } else {
                "write"
            },
            path: get("path").unwrap_or_default(),
            user: get("username").unwrap_or_default(),
            expiration: get("signature_expiration").and_then(|e| e.parse::<i64>().ok()),
        })
    }

    fn signed_with(&self, token: &str) -> bool {
        self.signature
            == file_signature(
                &self.path,
                self.operation,
                &self.user,
                token,
                self.expiration,
            )
    }

    fn expired(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        self.expiration.is_some_and(|exp| now > exp)
    }
}

/// E2B's signed-URL signature: `v1_` + base64(sha256("path:operation:user:token[:expiration]"))
/// without padding.
pub fn file_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = expiration {
        raw.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Decodes a query-string component: `%XX` escapes and `+` for space; a malformed escape is
/// kept as written.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a request's right to reach the sandbox's envd.
fn authorize(req: &Request<Body>, token: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = token else { return Ok(()) };
    if req
        .headers()
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        == Some(token)
    {
        return Ok(());
    }
    // Signed file URLs: GET (read) and POST (write) on /files.
    if let Some(signed) = SignedFile::from_request(req) {
        if signed.expired() {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "the signed URL has expired",
            ));
        }
        if signed.signed_with(token) {
            return Ok(());
        }
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid file URL signature",
        ));
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or invalid X-Access-Token for this sandbox",
    ))
}

/// Passes one request to the sandbox's envd and streams the answer back.
pub async fn proxy(state: AppState, target: Target, req: Request<Body>) -> Response {
    match proxy_inner(&state, target, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn proxy_inner(
    state: &AppState,
    target: Target,
    req: Request<Body>,
) -> Result<Response, ApiError> {
    if target.port != cella_proto::ENVD_PORT {
        return crate::ports::proxy(state, target, req).await;
    }
    let path = req.uri().path();
    if INTERNAL_ROUTES.contains(&path) || path.starts_with(cella_proto::INTERNAL_PATH_PREFIX) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{path} is an internal envd route and is not reachable through the gateway"),
        ));
    }
    let sandbox = state.sandbox_for_gateway(&target.sandbox_id).await?;
    authorize(&req, sandbox.envd_access_token.as_deref())?;
    if sandbox.paused {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {} is paused: resume it with connect",
                target.sandbox_id
            ),
        ));
    }
    let (mut parts, body) = req.into_parts();
    for h in [
        "x-access-token",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
    ] {
        parts.headers.remove(h);
    }
    let uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut out = Request::builder().method(parts.method).uri(uri);
    if let Some(h) = out.headers_mut() {
        *h = parts.headers;
        h.insert("host", axum::http::HeaderValue::from_static("envd"));
    }
    let body = crate::metrics::CountingBody::new(body, &state.metrics.gateway_bytes_in);
    let out = out
        .body(body)
        .map_err(|e| ApiError::internal(format!("building the envd request: {e}")))?;
    let resp = sandbox.envd.send(out).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("sandbox {} is not reachable: {e}", target.sandbox_id),
        )
    })?;
    let (parts, body) = resp.into_parts();
    let body = crate::metrics::CountingBody::new(body, &state.metrics.gateway_bytes_out);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_from_headers_and_hosts() {
        let mut h = HeaderMap::new();
        assert_eq!(target(&h, Some("example.test")).expect("ok"), None);
        h.insert("e2b-sandbox-id", "abc123".parse().expect("hv"));
        assert!(target(&h, None).is_err());
        h.insert("e2b-sandbox-port", "49983".parse().expect("hv"));
        assert_eq!(
            target(&h, None).expect("ok"),
            Some(Target {
                sandbox_id: "abc123".into(),
                port: 49983
            })
        );
        let mut h = HeaderMap::new();
        h.insert(
            "host",
            "49983-abc123.example.test:3000".parse().expect("hv"),
        );
        assert_eq!(
            target(&h, Some("example.test")).expect("ok"),
            Some(Target {
                sandbox_id: "abc123".into(),
                port: 49983
            })
        );
        assert_eq!(target(&h, None).expect("ok"), None);
    }

    #[test]
    fn signatures_match_the_sdk() {
        // The same inputs through e2b/sandbox/signature.py's algorithm (e2b 2.63.0).
        let sig = file_signature("/home/user/a.txt", "read", "", "tok", Some(1700000000));
        assert_eq!(sig, "v1_xFHydXA5wOSaKG1rIbypk15/DrqiTa4AE+MfKbAW4Hs");
        assert_ne!(
            sig,
            file_signature("/home/user/a.txt", "write", "", "tok", Some(1700000000))
        );
        assert_eq!(percent_decode("%2Fhome%2Fuser+x"), "/home/user x");
    }
}
