//! Who is calling: an API key (`X-API-Key`, or `Authorization: Bearer`) resolves to its tenant.
//! With auth disabled (loopback development only) every caller is the `default` tenant.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: cella_store::TenantRecord,
    /// API key id, or `system`/`anonymous`.
    pub actor: String,
}

fn presented_key(parts: &Parts) -> Option<String> {
    if let Some(k) = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.trim().to_string());
    }
    parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(|k| k.trim().to_string())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if !state.config.auth {
            let tenant = state.store.ensure_tenant("default").await?;
            return Ok(Caller {
                tenant,
                actor: "anonymous".into(),
            });
        }
        let Some(key) = presented_key(parts) else {
            return Err(ApiError::unauthorized(
                "missing API key: send it in the X-API-Key header (create one with `cella keys create --tenant NAME`)",
            ));
        };
        match state.store.authenticate(&key).await? {
            Some((k, tenant)) => Ok(Caller {
                tenant,
                actor: k.id,
            }),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}
