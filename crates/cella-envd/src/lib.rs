//! cella-envd: the agent that runs as PID 1 inside every sandbox and speaks the E2B envd protocol
//! (Connect RPC with the JSON codec over HTTP/1.1) on a listening socket handed to it by the
//! backend.
//!
//! It owns processes (pipes and pseudo-terminals), the sandbox filesystem as seen by its users,
//! file transfer, watchers and the sandbox's own metrics. It must not know which backend isolates
//! it, nor anything about tenants, API keys or the server's routes: the host side reaches it only
//! through the socket.

pub mod egress;
pub mod files;
pub mod filesystem;
pub mod forward;
pub mod init;
pub mod interpreter;
pub mod metrics;
pub mod process;
pub mod rpc;
pub mod users;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;

/// How envd behaves inside its sandbox.
#[derive(Debug, Clone)]
pub struct EnvdConfig {
    /// The user a request runs as when it names none (E2B's default is `user`).
    pub default_user: String,
    /// Working directory for processes that name none; the user's home when `None`.
    pub default_workdir: Option<PathBuf>,
    /// Sandbox-wide environment variables, added to every process (E2B `envVars`).
    pub envs: BTreeMap<String, String>,
}

impl Default for EnvdConfig {
    fn default() -> Self {
        Self {
            default_user: "user".into(),
            default_workdir: None,
            envs: BTreeMap::new(),
        }
    }
}

/// Shared state of one envd instance.
pub struct EnvdState {
    pub config: EnvdConfig,
    /// Sandbox-wide environment: `config.envs`, then whatever the host set through `/init`.
    envs: std::sync::RwLock<BTreeMap<String, String>>,
    pub users: users::Users,
    pub processes: process::ProcessTable,
    pub watchers: filesystem::WatcherTable,
    pub started: std::time::Instant,
}

/// Handle to a running envd's state; cheap to clone into handlers.
#[derive(Clone)]
pub struct Envd(pub Arc<EnvdState>);

impl std::ops::Deref for Envd {
    type Target = EnvdState;
    fn deref(&self) -> &EnvdState {
        &self.0
    }
}

impl Envd {
    pub fn new(config: EnvdConfig) -> Self {
        let users = users::Users::load(&config.default_user);
        Envd(Arc::new(EnvdState {
            envs: std::sync::RwLock::new(config.envs.clone()),
            config,
            users,
            processes: process::ProcessTable::default(),
            watchers: filesystem::WatcherTable::default(),
            started: std::time::Instant::now(),
        }))
    }

    /// Every envd route: Connect services, file transfer, health, metrics, envs and the host's
    /// port forwarding.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(process::routes())
            .merge(filesystem::routes())
            .merge(files::routes())
            .merge(forward::routes())
            .route("/health", get(health).head(health))
            .route("/metrics", get(metrics::handler))
            .route("/envs", get(envs))
            .route("/init", axum::routing::post(init_route))
            .with_state(self.clone())
    }

    /// The sandbox-wide environment every process starts with.
    pub fn envs(&self) -> BTreeMap<String, String> {
        self.envs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Body of `POST /init` (E2B's internal route; the host calls it when it hands a ready
/// sandbox to a caller). Unknown fields (E2B also sends tokens and timestamps) are ignored.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitRequest {
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
}

/// Adds sandbox-wide environment variables (the gateway refuses this route; only the host's
/// side of the socket reaches it).
async fn init_route(
    axum::extract::State(envd): axum::extract::State<Envd>,
    body: axum::body::Bytes,
) -> Result<axum::http::StatusCode, (axum::http::StatusCode, String)> {
    let bad = |m: String| (axum::http::StatusCode::BAD_REQUEST, m);
    let req: InitRequest =
        serde_json::from_slice(&body).map_err(|e| bad(format!("malformed /init body: {e}")))?;
    process::spawn::validate_envs(&req.env_vars).map_err(|e| bad(e.message))?;
    envd.envs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .extend(req.env_vars);
    Ok(axum::http::StatusCode::NO_CONTENT)
}

async fn health() -> axum::http::StatusCode {
    axum::http::StatusCode::NO_CONTENT
}

async fn envs(
    axum::extract::State(envd): axum::extract::State<Envd>,
) -> axum::Json<BTreeMap<String, String>> {
    axum::Json(envd.envs())
}

/// Serves envd on an already-listening Unix socket until the listener fails.
pub async fn serve(listener: tokio::net::UnixListener, envd: Envd) -> std::io::Result<()> {
    axum::serve(listener, envd.router()).await
}
