//! The integration tests of cella-llm, one binary: real clients against the fake provider
//! server on 127.0.0.1 speaking each provider's wire format (see `suite/`).

#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

mod suite;
