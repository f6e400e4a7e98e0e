//! cella-server: `cella serve`, a self-hosted, E2B-compatible control plane. One port serves the
//! control plane (`/sandboxes`, `/v2/sandboxes`, …), the envd gateway (requests carrying
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port`, or a `<port>-<id>.<domain>` Host) and `/metrics`.
//!
//! This crate owns HTTP routes, tenants and API keys. It must not build sandboxes itself (that is
//! cella-sandbox's) nor speak envd beyond passing requests through.

pub mod auth;
pub mod config;
pub mod control;
pub mod error;
pub mod gateway;
pub mod jobs;
pub mod lifecycle;
pub mod metrics;
pub mod network;
pub mod ports;
pub mod skills_api;
pub mod state;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use cella_sandbox::{Backend, SandboxManager};
use cella_store::Store;

pub use config::ServerConfig;
use state::{AppState, Inner};

/// Failures starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("opening the store at {url}: {source}")]
    Store {
        url: String,
        source: cella_store::StoreError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// A running server's pieces, before it listens.
pub struct Server {
    pub state: AppState,
    /// The admin key created on first start (printed once by the binary).
    pub new_admin_key: Option<String>,
    pub restored: (usize, usize),
    /// Jobs that were running when the previous process died, now ended as errors.
    pub interrupted_jobs: usize,
}

/// Writes the first admin key to `<data-dir>/admin.key` (mode 0600).
fn write_admin_key(data_dir: &Path, key: &str) -> Result<(), ServeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("admin.key");
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| ServeError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    f.write_all(format!("{key}\n").as_bytes())
        .map_err(|source| ServeError::Io {
            what: format!("writing {}", path.display()),
            source,
        })
}

impl Server {
    /// Opens the store, creates the first admin key when there is none, and re-adopts sandboxes
    /// that outlived the previous server process.
    pub async fn start(
        config: ServerConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<Server, ServeError> {
        if !config.auth && !config.listen.ip().is_loopback() {
            return Err(ServeError::Config(format!(
                "refusing to listen on {} without API keys: remove --no-auth or listen on 127.0.0.1",
                config.listen
            )));
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServeError::Io {
            what: format!("creating {}", config.data_dir.display()),
            source,
        })?;
        let store =
            Store::open(&config.database_url)
                .await
                .map_err(|source| ServeError::Store {
                    url: config.database_url.clone(),
                    source,
                })?;
        let mut new_admin_key = None;
        let store_err = |source| ServeError::Store {
            url: config.database_url.clone(),
            source,
        };
        if config.auth && store.list_tenants().await.map_err(store_err)?.is_empty() {
            let tenant = store.ensure_tenant("admin").await.map_err(store_err)?;
            let key = store
                .create_api_key(&tenant.id, "admin")
                .await
                .map_err(store_err)?;
            write_admin_key(&config.data_dir, &key.plaintext)?;
            new_admin_key = Some(key.plaintext);
        }
        let manager = SandboxManager::new(backend);
        let mut pools = Vec::new();
        for (template, size) in &config.warm_pools {
            // Unknown or unbuilt templates are refused here, naming the known ones.
            let spec = lifecycle::template_spec(manager.backend().as_ref(), template)
                .map_err(|e| ServeError::Config(format!("warm pool: {e}")))?;
            pools.push((spec, *size));
        }
        let swept = manager
            .start_pools(
                cella_sandbox::PoolJournal::new(config.data_dir.join("warm-pool")),
                pools,
            )
            .await;
        if swept > 0 {
            tracing::info!(
                swept,
                "destroyed warm-pool sandboxes left by the previous server"
            );
        }
        let state = AppState(Arc::new(Inner {
            config,
            store,
            manager,
            metrics: Default::default(),
            gateway: RwLock::new(HashMap::new()),
            jobs: Default::default(),
        }));
        network::log_denials(&state);
        let restored = lifecycle::restore(&state)
            .await
            .map_err(|e| ServeError::Config(format!("restoring sandboxes: {}", e.message)))?;
        let interrupted_jobs = jobs::runner::start(&state)
            .await
            .map_err(|e| ServeError::Config(format!("recovering jobs: {e}")))?;
        Ok(Server {
            state,
            new_admin_key,
            restored,
            interrupted_jobs,
        })
    }

    /// Serves until `shutdown` resolves. Sandboxes keep running after the server stops (a new
    /// server adopts them).
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let listener = tokio::net::TcpListener::bind(self.state.config.listen)
            .await
            .map_err(|source| ServeError::Io {
                what: format!("listening on {}", self.state.config.listen),
                source,
            })?;
        // Streams (process output, events) are many small writes: with Nagle's algorithm each
        // one after the first waits for the client's delayed ACK (~40 ms).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY not set on a connection: {e}");
            }
        });
        let app = router(self.state.clone());
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| ServeError::Io {
                what: "serving".into(),
                source,
            });
        // Claimed sandboxes outlive the server; ready ones in pools belong to nobody.
        self.state.manager.drain_pools().await;
        served
    }
}

/// The control plane's routes.
fn control_routes() -> Router<AppState> {
    Router::new()
        .route("/health", get(control::health))
        .route("/metrics", get(prometheus))
        .route(
            "/sandboxes",
            post(control::create).get(control::list_legacy),
        )
        .route(
            "/v2/sandboxes",
            get(control::list_v2).post(control::create_v2),
        )
        .route(
            "/sandboxes/{id}",
            get(control::get_one).delete(control::kill),
        )
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/logs", get(control::logs))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .route("/v2/sandboxes/{id}/logs", get(control::logs))
        .route("/sandboxes/{id}/network", put(network::update))
        .merge(skills_api::routes())
        .merge(jobs::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(req: Request<Body>) -> error::ApiError {
    error::ApiError::not_found(format!(
        "no such endpoint: {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request<Body>) -> error::ApiError {
    error::ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn prometheus(State(state): State<AppState>) -> Response {
    let (mut running, mut paused) = (0, 0);
    for sb in state.manager.list() {
        if sb.is_paused() {
            paused += 1;
        } else {
            running += 1;
        }
    }
    let mut text = state
        .metrics
        .render(&[("running", running), ("paused", paused)]);
    text.push_str(&metrics::render_pools(&state.manager.pool_stats()));
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// Every route on one port: gateway requests are recognised first, by header or host.
pub fn router(state: AppState) -> Router {
    let control = control_routes().with_state(state.clone());
    Router::new().fallback_service(tower_fn(state, control))
}

fn tower_fn(state: AppState, control: Router) -> axum::routing::MethodRouter {
    axum::routing::any(move |req: Request<Body>| {
        let state = state.clone();
        let control = control.clone();
        async move {
            let routed = match gateway::target(req.headers(), state.config.domain.as_deref()) {
                Ok(None) => gateway::target_by_signature(&state, &req),
                other => other,
            };
            match routed {
                Ok(Some(target)) => gateway::proxy(state, target, req).await,
                Ok(None) => {
                    use tower::ServiceExt;
                    match control.oneshot(req).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    }
                }
                Err(e) => e.into_response(),
            }
        }
    })
}
