//! The native backend's side of network policies: a sandbox's proxy socket lives in
//! `<sandbox dir>/egress/` on the host (bound read-only into the sandbox), and the shared
//! [`EgressProxy`] serves it with the sandbox's policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::backend::SandboxError;
use crate::network::{Bridge, EgressProxy, NetworkPolicy, Peers, SOCKET_NAME};

/// The host directory of a sandbox's proxy socket.
pub fn host_dir(sandbox_dir: &Path) -> PathBuf {
    sandbox_dir.join("egress")
}

/// Host uids allowed to use the socket: the sandbox's ids (root) or only ours (rootless).
fn peers(id_base: u32, rootless: bool) -> Peers {
    if rootless {
        Peers { uids: 0..0 }
    } else {
        Peers {
            uids: id_base..id_base.saturating_add(65536),
        }
    }
}

/// Serves `id`'s socket in `sandbox_dir` with `policy`; returns the directory to bind.
pub fn attach(
    proxy: &EgressProxy,
    id: &str,
    sandbox_dir: &Path,
    policy: &NetworkPolicy,
    id_base: u32,
    rootless: bool,
) -> Result<PathBuf, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = host_dir(sandbox_dir);
    let io = |what: String| move |source| SandboxError::Io { what, source };
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io(format!("setting permissions of {}", dir.display())))?;
    proxy
        .attach(
            id,
            policy.clone(),
            &dir.join(SOCKET_NAME),
            peers(id_base, rootless),
        )
        .map_err(io("starting the sandbox's egress proxy".into()))?;
    Ok(dir)
}

/// The sandbox's default environment: the proxy variables, then the caller's (which win).
pub fn guest_envs(user: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut envs: BTreeMap<String, String> = Bridge::standard().proxy_env().into_iter().collect();
    envs.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
    envs
}

/// Applies `policy` to a running sandbox, re-serving its socket if this process does not yet
/// (after a restart).
pub fn set_network(
    proxy: Option<&EgressProxy>,
    id: &str,
    sandbox_dir: &Path,
    policy: &NetworkPolicy,
    id_base: u32,
    rootless: bool,
) -> Result<(), SandboxError> {
    let Some(proxy) = proxy else {
        return Err(SandboxError::Unsupported(
            "network policies need the egress proxy, which this process did not start".into(),
        ));
    };
    if proxy.set_policy(id, policy.clone()) {
        return Ok(());
    }
    if !host_dir(sandbox_dir).is_dir() {
        return Err(SandboxError::Unsupported(format!(
            "sandbox {id} was created without the egress proxy bridge: create a new sandbox to give it network access"
        )));
    }
    attach(proxy, id, sandbox_dir, policy, id_base, rootless).map(|_| ())
}
