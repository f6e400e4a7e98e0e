//! cella-envd integration tests, one module per service.

mod files;
mod filesystem;
mod sdk;
mod support;
