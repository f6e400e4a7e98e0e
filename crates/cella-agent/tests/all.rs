//! Integration tests of cella-agent that need no sandbox: the loop, limits, events, skills and
//! the wire-level model clients, driven by scripted models and in-process tools. End-to-end
//! tests with a real sandbox live in `crates/cella/tests/suite/run.rs` (they need the `cella`
//! binary as the sandbox helper, and root).

mod suite;
