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

/// The port of the code interpreter (E2B's `JUPYTER_PORT`); envd serves it inside the sandbox.
pub const INTERPRETER_PORT: u16 = 49999;

/// envd's internal route that turns a connection to its socket into a TCP connection to
/// `127.0.0.1:{port}` inside the sandbox (`GET {FORWARD_PATH}{port}` with `Upgrade:`
/// [`FORWARD_UPGRADE`], answered `101`). Only the host may call it: gateways refuse every path
/// under [`INTERNAL_PATH_PREFIX`].
pub const FORWARD_PATH: &str = "/__cella/forward/";
/// The `Upgrade` protocol name of a port-forwarding request.
pub const FORWARD_UPGRADE: &str = "cella-forward";
/// Paths under this prefix are envd internals, never reachable through a gateway.
pub const INTERNAL_PATH_PREFIX: &str = "/__cella/";

/// Content type of unary Connect JSON calls.
pub const CONTENT_TYPE_UNARY: &str = "application/json";
/// Content type of streaming Connect JSON calls.
pub const CONTENT_TYPE_STREAM: &str = "application/connect+json";
