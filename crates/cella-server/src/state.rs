//! Shared state of the server: the store, the sandbox manager, configuration and metrics, plus
//! the per-sandbox facts the gateway needs on every request (cached in memory).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cella_sandbox::{EnvdClient, SandboxManager};
use cella_store::Store;

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// What the gateway needs to route and authorize a request to one sandbox.
#[derive(Clone)]
pub struct GatewayEntry {
    pub tenant_id: String,
    pub envd: EnvdClient,
    pub envd_access_token: Option<String>,
    /// Set when the sandbox's ports are private (`allowPublicTraffic: false`).
    pub traffic_access_token: Option<String>,
    pub paused: bool,
}

pub struct Inner {
    pub config: ServerConfig,
    pub store: Store,
    pub manager: Arc<SandboxManager>,
    pub metrics: Metrics,
    pub gateway: RwLock<HashMap<String, GatewayEntry>>,
    pub jobs: crate::jobs::JobsState,
}

#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn remember(&self, id: &str, entry: GatewayEntry) {
        self.gateway
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), entry);
    }

    pub fn forget(&self, id: &str) {
        self.gateway
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    pub fn set_paused(&self, id: &str, paused: bool) {
        if let Some(e) = self
            .gateway
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(id)
        {
            e.paused = paused;
        }
    }

    /// The id of the sandbox whose access token satisfies `matches`.
    pub fn find_sandbox(&self, matches: impl Fn(&str) -> bool) -> Option<String> {
        let map = self.gateway.read().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .find(|(_, e)| e.envd_access_token.as_deref().is_some_and(&matches))
            .map(|(id, _)| id.clone())
    }

    /// The gateway's view of a live sandbox; 502 when it does not exist (or has ended), which
    /// is what E2B's edge answers and what the SDKs read as "not running".
    pub async fn sandbox_for_gateway(&self, id: &str) -> Result<GatewayEntry, ApiError> {
        self.metrics
            .gateway_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = self
            .gateway
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        match entry {
            Some(e) if self.manager.get(id).is_ok() => Ok(e),
            _ => Err(ApiError::new(
                axum::http::StatusCode::BAD_GATEWAY,
                format!("sandbox {id} not found: it is not running"),
            )),
        }
    }
}
