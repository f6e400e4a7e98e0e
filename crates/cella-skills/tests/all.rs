//! Integration tests of cella-skills (one binary; the modules live in `suite/`).

#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

mod suite;
