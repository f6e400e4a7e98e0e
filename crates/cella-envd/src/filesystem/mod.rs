//! `filesystem.Filesystem`: stat, list, make, move, remove and watch the sandbox's files.

use axum::Router;

use crate::Envd;

/// Watchers created with `CreateWatcher`, polled with `GetWatcherEvents`.
#[derive(Default)]
pub struct WatcherTable {}

pub fn routes() -> Router<Envd> {
    Router::new()
}
