//! cella-sandbox: sandboxes on one host. `SandboxManager` owns their lifecycle; a `Backend`
//! builds the isolation boundary and starts the guest agent (envd) inside it; `EnvdClient`
//! talks to that agent; `forward` opens connections to ports inside a sandbox.
//!
//! This crate must not know about HTTP routes, tenants or API keys (that is the server's), nor
//! implement the guest agent itself (that is cella-envd, started through a callback).

pub mod backend;
pub mod client;
pub mod forward;
pub mod host;
pub mod manager;
pub mod native;
pub mod network;
pub mod pool;
pub mod spec;
pub mod template;

pub use backend::{Backend, Instance, SandboxError, Transport, Usage};
pub use client::{ClientError, Dial, EnvdClient, GatewayRoute, ProcessStream, send_http1};
pub use manager::{Sandbox, SandboxManager};
pub use pool::{PoolJournal, PoolStats};
pub use spec::{Limits, Network, SandboxSpec};
