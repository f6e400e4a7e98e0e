//! Sandboxes on this machine for the local commands (exec, shell, bench): the native backend
//! with this binary as its helper.

use anyhow::Context;
use cella_sandbox::native::{NativeBackend, NativeConfig};
use cella_sandbox::network::{EgressConfig, EgressProxy};

/// The native backend, using this very binary as the sandbox helper, with the egress proxy
/// that enforces sandboxes' network policies.
pub fn native_backend() -> anyhow::Result<NativeBackend> {
    native_backend_in(None)
}

/// The native backend keeping its templates under `data_dir` (the environment's or the
/// per-user default when `None`).
pub fn native_backend_in(data_dir: Option<&std::path::Path>) -> anyhow::Result<NativeBackend> {
    let exe =
        std::env::current_exe().context("finding the cella binary to use as the sandbox helper")?;
    let mut config = NativeConfig::with_helper(exe);
    if let Some(dir) = data_dir {
        config.data_dir = dir.to_path_buf();
    }
    let egress = EgressConfig::from_env()
        .map_err(anyhow::Error::msg)
        .context("configuring the egress proxy (CELLA_EGRESS_HOSTS)")?;
    config.egress = Some(EgressProxy::new(egress));
    NativeBackend::new(config).context("preparing the native sandbox backend")
}

/// A single-threaded runtime: the local commands drive one sandbox at a time.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
