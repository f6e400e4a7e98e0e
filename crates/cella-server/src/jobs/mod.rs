//! Jobs: agent runs submitted over HTTP, queued in the store, run by this node's runner in a
//! sandbox of the submitting tenant, and watched live.
//!
//! - [`api`] — `/v1/jobs` (submit, get, list, cancel), `/schedule` + `/status/{id}`, the
//!   OpenAPI document.
//! - [`events`] — `/v1/jobs/{id}/events` as SSE or WebSocket; the [`events::Hub`] that wakes
//!   readers when the runner has stored an event.
//! - [`artifacts`] — the workspace as a streamed zip.
//! - [`runner`] — the scheduler loop, one job's run (sandbox, agent, supervisor), restart
//!   recovery.
//! - [`recall`] — full-text search over a job's history, for the agent's `recall` tool.
//!
//! Owns job routes and the runner. Must not know SQL (the store's) or how the agent works
//! (cella-agent's); sandboxes are created and killed through [`crate::lifecycle`] like any other.

pub mod api;
pub mod artifacts;
pub mod config;
pub mod events;
pub mod recall;
pub mod runner;

use std::collections::HashMap;
use std::sync::Mutex;

use axum::Router;
use axum::routing::{get, post};

pub use config::JobsConfig;

use crate::state::AppState;

/// The OpenAPI 3.1 description of the `/v1` jobs API.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// This node's live part of the jobs system.
#[derive(Default)]
pub struct JobsState {
    pub hub: events::Hub,
    /// Wakes the scheduler (a job was submitted or ended).
    pub wake: tokio::sync::Notify,
    running: Mutex<HashMap<String, runner::RunControl>>,
}

impl JobsState {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, runner::RunControl>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(&self, id: &str, control: runner::RunControl) {
        self.running().insert(id.to_owned(), control);
    }

    pub(crate) fn unregister(&self, id: &str) {
        self.running().remove(id);
    }

    /// Stops job `id` now if it runs on this node (others see the request at their next
    /// lease renewal).
    pub fn cancel_local(&self, id: &str, reason: &str) {
        if let Some(control) = self.running().get(id) {
            control.cancel(reason);
        }
    }
}

/// The job routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/jobs", post(api::create).get(api::list))
        .route("/v1/jobs/{id}", get(api::get))
        .route("/v1/jobs/{id}/events", get(events::events))
        .route("/v1/jobs/{id}/cancel", post(api::cancel))
        .route("/v1/jobs/{id}/artifacts.zip", get(artifacts::download))
        .route("/v1/openapi.json", get(api::openapi))
        .route("/schedule", post(api::schedule))
        .route("/status/{id}", get(api::status))
}
