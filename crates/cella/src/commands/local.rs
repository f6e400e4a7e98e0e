//! Sandboxes on this machine for the local commands (exec, shell, run, bench): the native
//! backend with this binary as its helper.

use anyhow::Context;
use cella_sandbox::native::{NativeBackend, NativeConfig, Spawner};
use cella_sandbox::network::{EgressConfig, EgressProxy};
use cella_sandbox::spec::SandboxSpec;

/// The native backend, using this very binary as the sandbox helper, with the egress proxy
/// that enforces sandboxes' network policies.
pub fn native_backend() -> anyhow::Result<NativeBackend> {
    native_backend_in(None)
}

/// The native backend keeping its templates under `data_dir` (the environment's or the
/// per-user default when `None`).
pub fn native_backend_in(data_dir: Option<&std::path::Path>) -> anyhow::Result<NativeBackend> {
    let mut config = config()?;
    if let Some(dir) = data_dir {
        config.data_dir = dir.to_path_buf();
    }
    config.egress = Some(egress_proxy()?);
    NativeBackend::new(config).context("preparing the native sandbox backend")
}

/// A native backend for one sandbox of `spec` made right away (`cella exec`, `cella shell`).
/// Call it first, while this process is still single-threaded: the sandbox's helper is forked
/// from it right away (no spawner process, no second load of the binary) and does its
/// preparation while the caller goes on. The egress proxy is started only when the spec's network policy lets anything
/// out (the policy of a local sandbox never changes afterwards).
pub fn one_sandbox_backend(spec: &SandboxSpec) -> anyhow::Result<NativeBackend> {
    let mut config = config()?;
    let spawner = Spawner::fork_helper(&config.helper, super::guest::run_in_sandbox)
        .context("starting the sandbox helper")?;
    if !spec.network.is_deny_all() {
        config.egress = Some(egress_proxy()?);
    }
    NativeBackend::with_spawner(config, spawner).context("preparing the native sandbox backend")
}

fn config() -> anyhow::Result<NativeConfig> {
    let exe =
        std::env::current_exe().context("finding the cella binary to use as the sandbox helper")?;
    Ok(NativeConfig::with_helper(exe))
}

fn egress_proxy() -> anyhow::Result<EgressProxy> {
    let egress = EgressConfig::from_env()
        .map_err(anyhow::Error::msg)
        .context("configuring the egress proxy (CELLA_EGRESS_HOSTS)")?;
    Ok(EgressProxy::new(egress))
}

/// A single-threaded runtime: the local commands drive one sandbox at a time.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
