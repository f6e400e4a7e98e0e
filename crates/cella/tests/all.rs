//! Integration tests of the `cella` binary (one test binary for the crate).

mod suite;
