//! What this host offers sandboxes (for `cella doctor` and for choosing a backend): namespaces,
//! user namespaces, Landlock, seccomp, cgroups, KVM and the external runtimes.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::native::cgroup::CgroupSupport;
use crate::native::{landlock, sys};

/// One probed capability.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// Which backends can run here.
#[derive(Debug, Clone, Serialize)]
pub struct BackendStatus {
    pub name: String,
    pub usable: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub kernel: String,
    pub running_as_root: bool,
    pub checks: Vec<Check>,
    pub backends: Vec<BackendStatus>,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Probes the host. Forks a short-lived child to try creating namespaces.
pub fn probe() -> HostReport {
    let mut checks = Vec::new();
    let mut add = |name: &str, ok: bool, detail: String| {
        checks.push(Check {
            name: name.into(),
            ok,
            detail,
        })
    };

    let kernel = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into());
    let root = sys::geteuid() == 0;
    let ns_ok = try_namespaces(
        libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWCGROUP,
    );
    add(
        "namespaces",
        ns_ok.is_ok(),
        ns_ok
            .clone()
            .err()
            .unwrap_or_else(|| "user mount pid net ipc uts cgroup: all can be created".into()),
    );
    let userns_clone = read("/proc/sys/kernel/unprivileged_userns_clone");
    let max_userns = read("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    let unpriv = userns_clone.as_deref() != Some("0") && max_userns != "0";
    add(
        "unprivileged user namespaces",
        unpriv,
        format!(
            "max_user_namespaces={max_userns}{}",
            userns_clone
                .map(|v| format!(", unprivileged_userns_clone={v}"))
                .unwrap_or_default()
        ),
    );
    let ll = landlock::abi_version();
    add(
        "landlock",
        ll > 0,
        if ll > 0 {
            format!("ABI {ll}")
        } else {
            "not available".into()
        },
    );
    let seccomp = read("/proc/sys/kernel/seccomp/actions_avail");
    add(
        "seccomp",
        seccomp.is_some(),
        seccomp.unwrap_or_else(|| "not available".into()),
    );
    let cg = CgroupSupport::detect();
    add(
        "cgroups",
        cg.v2_usable() || !cg.v1_controllers.is_empty(),
        cg.describe(),
    );
    let freezer = cg.v2_usable() || cg.v1_controllers.iter().any(|(c, _)| c == "freezer");
    add(
        "cgroup freezer (pause/resume)",
        freezer,
        if freezer {
            "available".into()
        } else {
            "missing".into()
        },
    );
    let kvm = Path::new("/dev/kvm").exists();
    let hyp = read("/sys/hypervisor/type");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let nested = cpuinfo.contains(" hypervisor");
    add(
        "kvm",
        kvm,
        match (kvm, nested) {
            (true, true) => format!(
                "/dev/kvm present; this host is itself a guest{} (nested KVM: stock guest kernels may not boot)",
                hyp.map(|h| format!(" ({h})")).unwrap_or_default()
            ),
            (true, false) => "/dev/kvm present (bare metal)".into(),
            _ => "no /dev/kvm".into(),
        },
    );
    let runsc = which("runsc");
    let qemu = which("qemu-system-x86_64");
    let fc = which("firecracker");
    let bwrap = which("bwrap");
    for (n, p) in [
        ("runsc (gVisor)", &runsc),
        ("qemu-system-x86_64", &qemu),
        ("firecracker", &fc),
        ("bwrap (benchmark baseline)", &bwrap),
    ] {
        add(
            n,
            p.is_some(),
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "not installed".into()),
        );
    }
    let native_ok = ns_ok.is_ok() && (root || unpriv);
    let backends = vec![
        BackendStatus {
            name: "native".into(),
            usable: native_ok,
            detail: if native_ok {
                if root {
                    "usable (root: full id mapping, cgroup limits)".into()
                } else {
                    "usable rootless (no cgroup limits unless delegated; only user \"user\")".into()
                }
            } else {
                "needs user, mount, pid and net namespaces".into()
            },
        },
        BackendStatus {
            name: "gvisor".into(),
            usable: false,
            detail: format!(
                "not implemented in this build{}",
                if runsc.is_some() {
                    " (runsc is installed)"
                } else {
                    ""
                }
            ),
        },
        BackendStatus {
            name: "microvm".into(),
            usable: false,
            detail: format!(
                "not implemented in this build{}",
                if qemu.is_some() || fc.is_some() {
                    " (a VMM is installed)"
                } else {
                    ""
                }
            ),
        },
        BackendStatus {
            name: "remote".into(),
            usable: false,
            detail: "not implemented in this build".into(),
        },
    ];
    HostReport {
        kernel,
        running_as_root: root,
        checks,
        backends,
    }
}

/// Forks a child that tries to unshare `flags`, and reports the result.
fn try_namespaces(flags: libc::c_int) -> Result<(), String> {
    let out = std::process::Command::new("/proc/self/exe")
        .arg("--version")
        .output();
    let _ = out;
    // Use unshare(1)-like probing through a short-lived child of a fresh process would need the
    // helper; instead probe in a child created with std (fork+exec of `true` after unshare is
    // not possible without pre_exec), so do the unshare in pre_exec of a trivial command.
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/true");
    // SAFETY: the closure calls only unshare, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("probe exited with {s}")),
        Err(e) => Err(format!("cannot create namespaces: {e}")),
    }
}
