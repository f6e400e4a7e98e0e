//! Integration tests of the `cella` binary (one test binary for the crate).

#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

mod suite;
