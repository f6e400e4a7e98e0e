//! Integration tests of cella-skills (one binary; the modules live in `suite/`).

mod suite;
