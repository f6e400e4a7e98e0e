//! The `Backend` trait: the one job of an isolation technology is to build a boundary, start
//! the guest agent (envd) inside it and hand back where to reach it. Everything else (exec,
//! files, PTY, code) goes through envd the same way for every backend.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::spec::{Limits, SandboxSpec};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Failures creating or controlling sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("unknown template {name:?}: known templates are {known}")]
    UnknownTemplate { name: String, known: String },
    /// A known template that cannot be used yet (not built, or its manifest is invalid).
    #[error("{0}")]
    TemplateUnavailable(String),
    #[error("creating the sandbox failed: {0}")]
    Create(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("sandbox {0} is paused: resume it first")]
    Paused(String),
    #[error("sandbox {0} is not paused")]
    NotPaused(String),
}

/// Where the guest agent listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Unix(std::path::PathBuf),
}

/// CPU and memory use of a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub cpu_ns: u64,
    pub memory_bytes: u64,
}

/// A running sandbox as its backend sees it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub transport: Transport,
    /// Backend-specific facts needed to control the sandbox again after a restart.
    pub state: serde_json::Value,
    /// Limits or protections this host could not enforce.
    pub warnings: Vec<String>,
    /// Becomes `true` once the sandbox has ended.
    pub ended: watch::Receiver<bool>,
}

/// An isolation technology.
pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Builds a sandbox and starts envd in it.
    fn create<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
    ) -> BoxFuture<'a, Result<Instance, SandboxError>>;
    /// Destroys a sandbox and waits until it is gone.
    fn kill<'a>(&'a self, instance: &'a Instance) -> BoxFuture<'a, Result<(), SandboxError>>;
    /// Freezes every process (memory kept).
    fn pause(&self, instance: &Instance) -> Result<(), SandboxError>;
    fn resume(&self, instance: &Instance) -> Result<(), SandboxError>;
    fn usage(&self, instance: &Instance) -> Usage;
    /// Number of processes the sandbox lost to its memory limit.
    fn oom_kills(&self, instance: &Instance) -> u64;
    /// Finds a sandbox again from its recorded state (after the host process restarted);
    /// `None` when it no longer exists.
    fn reattach(&self, id: &str, state: &serde_json::Value) -> Option<Instance>;
    /// Template names this backend knows (built or not).
    fn templates(&self) -> Vec<String>;
    /// Applies an egress policy to a running (or just re-adopted) sandbox; connections opened
    /// from now on follow it.
    fn set_network(
        &self,
        instance: &Instance,
        _policy: &crate::network::NetworkPolicy,
    ) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported(format!(
            "the {} backend cannot change the network policy of sandbox {}",
            self.name(),
            instance.id
        )))
    }
    /// Every refused egress connection of this backend's sandboxes, as it happens.
    fn network_denials(&self) -> Option<tokio::sync::broadcast::Receiver<crate::network::Denial>> {
        None
    }

    /// The default resources of a template (`None` fields: the template sets none); an unknown
    /// template is an error naming the known ones.
    fn template_limits(&self, name: &str) -> Result<Limits, SandboxError> {
        if self.templates().iter().any(|t| t == name) {
            Ok(Limits::default())
        } else {
            Err(SandboxError::UnknownTemplate {
                name: name.to_string(),
                known: self.templates().join(", "),
            })
        }
    }
}
