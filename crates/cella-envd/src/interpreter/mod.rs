//! The code interpreter: E2B's port-49999 API (`GET /health`, `POST /execute` streaming NDJSON,
//! `/contexts` create/list/restart/delete), served by envd on TCP `127.0.0.1:49999` inside the
//! sandbox; the host reaches it through port forwarding like any other port.
//!
//! Each context is a long-lived driver process (`driver.rs`, scripts in `drivers/`): Python
//! runs a real Jupyter kernel when ipykernel and jupyter_client are importable, a built-in
//! notebook-style REPL otherwise (`CELLA_PYTHON_KERNEL=builtin|jupyter` forces one);
//! JavaScript runs in node `vm` contexts; bash is a persistent shell. The protocol to the client
//! is the same whichever runs. Default contexts (one per language) start on first use.
//!
//! This module knows nothing of gateways, tokens or tenants: whoever reaches the port may use it
//! (the gateway checks access before forwarding).

pub mod context;
mod driver;
pub mod output;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::Envd;
use context::Context;

/// The languages a context can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    Python,
    JavaScript,
    Bash,
}

impl Language {
    /// Parses a language name the SDKs send (`python`, `js`/`javascript`, `bash`, …).
    pub fn parse(name: Option<&str>) -> Result<Language, String> {
        let Some(name) = name.map(|n| n.trim().to_ascii_lowercase()) else {
            return Ok(Language::Python);
        };
        match name.as_str() {
            "" | "python" | "python3" | "py" => Ok(Language::Python),
            "javascript" | "js" | "node" | "nodejs" => Ok(Language::JavaScript),
            "bash" | "sh" | "shell" => Ok(Language::Bash),
            other => Err(format!(
                "unsupported language {other:?}: cella's code interpreter runs python, javascript (js) and bash"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::Bash => "bash",
        }
    }
}

struct Inner {
    envd: Envd,
    contexts: Mutex<HashMap<String, Arc<Context>>>,
    /// The default context of each language (created on first use).
    defaults: tokio::sync::Mutex<HashMap<Language, String>>,
}

/// The interpreter's state; cheap to clone into handlers.
#[derive(Clone)]
pub struct Interpreter(Arc<Inner>);

impl Interpreter {
    pub fn new(envd: Envd) -> Self {
        Interpreter(Arc::new(Inner {
            envd,
            contexts: Mutex::new(HashMap::new()),
            defaults: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/health", get(health))
            .route("/execute", post(execute))
            .route("/contexts", post(create).get(list))
            .route("/contexts/{id}/restart", post(restart))
            .route("/contexts/{id}", delete(remove))
            .with_state(self.clone())
    }

    fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.0
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Creates and starts a context.
    async fn create(&self, language: Language, cwd: Option<&str>) -> Result<Arc<Context>, Error> {
        let envd = &self.0.envd;
        let user = envd
            .users
            .resolve(None)
            .map_err(|e| Error::internal(e.message))?;
        let cwd = crate::process::spawn::resolve_cwd(envd, &user, cwd)
            .map_err(|e| Error::bad_request(e.message))?;
        let id = cella_proto::ids::random_hex(16);
        let ctx = Arc::new(Context::new(envd.clone(), id.clone(), language, cwd, user));
        ctx.ensure_started().await.map_err(|e| {
            Error::internal(format!("starting the {} context: {e}", language.name()))
        })?;
        self.0
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, ctx.clone());
        Ok(ctx)
    }

    async fn default_for(&self, language: Language) -> Result<Arc<Context>, Error> {
        let mut defaults = self.0.defaults.lock().await;
        if let Some(ctx) = defaults.get(&language).and_then(|id| self.get(id)) {
            return Ok(ctx);
        }
        let ctx = self.create(language, None).await?;
        defaults.insert(language, ctx.id.clone());
        Ok(ctx)
    }
}

/// Serves the interpreter on `127.0.0.1:{port}` in the background. A port that cannot be bound
/// (e.g. already taken inside the sandbox) is logged; envd keeps working without it.
pub async fn listen(envd: &Envd, port: u16) {
    match tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).await {
        Ok(listener) => {
            let router = Interpreter::new(envd.clone()).router();
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, router).await {
                    tracing::warn!("code interpreter server stopped: {e}");
                }
            });
        }
        Err(e) => tracing::warn!("code interpreter unavailable: binding 127.0.0.1:{port}: {e}"),
    }
}

/// Errors as E2B's server answers them: plain text with a status.
#[derive(Debug)]
pub struct Error(StatusCode, String);

impl Error {
    fn bad_request(m: impl Into<String>) -> Self {
        Error(StatusCode::BAD_REQUEST, m.into())
    }
    fn not_found(id: &str) -> Self {
        Error(StatusCode::NOT_FOUND, format!("Context {id} not found"))
    }
    fn internal(m: impl Into<String>) -> Self {
        Error(StatusCode::INTERNAL_SERVER_ERROR, m.into())
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

fn body<T>(payload: Result<Json<T>, JsonRejection>) -> Result<T, Error> {
    payload
        .map(|Json(v)| v)
        .map_err(|e| Error::bad_request(format!("invalid request body: {}", e.body_text())))
}

async fn health() -> Json<&'static str> {
    Json("OK")
}

#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(
    State(interp): State<Interpreter>,
    payload: Result<Json<ExecuteRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let req = body(payload)?;
    let ctx = match (&req.context_id, &req.language) {
        (Some(_), Some(_)) => {
            return Err(Error::bad_request(
                "Only one of context_id or language can be provided",
            ));
        }
        (Some(id), None) => interp.get(id).ok_or_else(|| Error::not_found(id))?,
        (None, lang) => {
            let language = Language::parse(lang.as_deref()).map_err(Error::bad_request)?;
            interp.default_for(language).await?
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let env_vars = req.env_vars.unwrap_or_default();
    tokio::spawn(async move { ctx.execute(&req.code, &env_vars, tx).await });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok((
        [("content-type", "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
struct CreateContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create(State(interp): State<Interpreter>, raw: Bytes) -> Result<Response, Error> {
    let req: CreateContext = if raw.iter().all(u8::is_ascii_whitespace) {
        CreateContext::default()
    } else {
        serde_json::from_slice(&raw)
            .map_err(|e| Error::bad_request(format!("invalid request body: {e}")))?
    };
    let language = Language::parse(req.language.as_deref()).map_err(Error::bad_request)?;
    let ctx = interp.create(language, req.cwd.as_deref()).await?;
    Ok(Json(ctx.info()).into_response())
}

async fn list(State(interp): State<Interpreter>) -> Json<Vec<serde_json::Value>> {
    let contexts: Vec<Arc<Context>> = interp
        .0
        .contexts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    Json(contexts.iter().map(|c| c.info()).collect())
}

async fn restart(
    State(interp): State<Interpreter>,
    Path(id): Path<String>,
) -> Result<StatusCode, Error> {
    let ctx = interp.get(&id).ok_or_else(|| Error::not_found(&id))?;
    ctx.restart()
        .await
        .map_err(|e| Error::internal(format!("restarting context {id}: {e}")))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn remove(
    State(interp): State<Interpreter>,
    Path(id): Path<String>,
) -> Result<StatusCode, Error> {
    let ctx = interp
        .0
        .contexts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id)
        .ok_or_else(|| Error::not_found(&id))?;
    ctx.kill();
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_parse_like_the_sdks_send_them() {
        assert_eq!(Language::parse(None), Ok(Language::Python));
        assert_eq!(Language::parse(Some("JS")), Ok(Language::JavaScript));
        assert_eq!(Language::parse(Some("bash")), Ok(Language::Bash));
        let err = Language::parse(Some("cobol")).expect_err("unsupported");
        assert!(err.contains("cobol") && err.contains("python"), "{err}");
    }
}
