#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

mod suite;
