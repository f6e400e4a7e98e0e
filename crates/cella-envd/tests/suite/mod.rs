//! cella-envd integration tests, one module per service.

mod files;
mod filesystem;
mod interpreter;
mod sdk;
mod support;
