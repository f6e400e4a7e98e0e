//! Wire types shared by every party that speaks the E2B envd protocol: the in-sandbox agent
//! (`cella-envd`), the host-side client (`cella-sandbox`) and the gateway (`cella-server`).
//!
//! This crate owns the *shape* of messages (proto3 canonical JSON as the Connect JSON codec
//! carries it), the Connect streaming envelope, and Connect error codes. It knows nothing about
//! transports, processes or files.

pub mod b64;
pub mod envelope;
pub mod error;
pub mod filesystem;
pub mod ids;
pub mod process;
pub mod query;

pub use envelope::{Envelope, EnvelopeDecoder, FLAG_COMPRESSED, FLAG_END_STREAM};
pub use error::{Code, RpcError};

/// The envd version cella reports. The E2B SDK enables features by comparing against this
/// (`e2b/envd/versions.py`); 0.6.13 is what E2B's infrastructure ships and turns every gate on.
pub const ENVD_VERSION: &str = "0.6.13";

/// The port number E2B clients use to address envd through a gateway.
pub const ENVD_PORT: u16 = 49983;

/// Content type of unary Connect JSON calls.
pub const CONTENT_TYPE_UNARY: &str = "application/json";
/// Content type of streaming Connect JSON calls.
pub const CONTENT_TYPE_STREAM: &str = "application/connect+json";
