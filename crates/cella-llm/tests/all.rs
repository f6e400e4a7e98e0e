//! The integration tests of cella-llm, one binary: real clients against the fake provider
//! server on 127.0.0.1 speaking each provider's wire format (see `suite/`).

mod suite;
