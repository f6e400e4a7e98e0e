//! `GET /files` and `POST /files`: file download and upload.

use axum::Router;

use crate::Envd;

pub fn routes() -> Router<Envd> {
    Router::new()
}
