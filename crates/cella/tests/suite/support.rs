//! Helpers shared by the integration tests: running the real `cella` binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub fn cella() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cella"));
    c.stdin(Stdio::null());
    c
}

/// `cella exec [opts] -- bash -c script`.
pub fn sh(opts: &[&str], script: &str) -> Output {
    let mut c = cella();
    c.arg("exec").args(opts).args(["--", "bash", "-c", script]);
    c.output().expect("running cella exec")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Stdout + stderr, for assertions on messages that may go to either.
pub fn all_output(o: &Output) -> String {
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

/// Whether the tests run as root (the full suite needs it; CI runs as root).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Skips (with a printed reason) a test that needs root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::suite::support::is_root() {
            eprintln!("SKIP: this test needs root (cgroup limits, id-mapped sandboxes); run the suite as root");
            return;
        }
    };
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// The Python of the virtualenv with the pinned SDKs (`CELLA_TEST_VENV`, which ./scripts/test
/// creates and sets), or `None` after saying why the calling test skips.
pub fn sdk_python() -> Option<PathBuf> {
    match std::env::var_os("CELLA_TEST_VENV") {
        Some(venv) => Some(Path::new(&venv).join("bin/python")),
        None => {
            eprintln!(
                "SKIP: CELLA_TEST_VENV is not set (./scripts/test creates the virtualenv with the pinned SDKs)"
            );
            None
        }
    }
}

/// `cella serve` on 127.0.0.1:`port` with `data` as its data directory and `<data>/run` as its
/// run directory (where [`ServeProcess`] finds the sandboxes it leaves). Stdio is null; callers
/// add flags, environment and stderr.
pub fn serve_command(data: &Path, port: u16) -> Command {
    let mut c = cella();
    c.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(data)
    .env("CELLA_RUN_DIR", data.join("run"))
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

/// `cella` run by an unprivileged host user (uid 65534, no groups, a reset environment plus
/// `envs`), keeping its run and data directories under `dir` (made world-writable for it).
pub fn rootless_cella(dir: &Path, envs: &[&str]) -> Command {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--reset-env",
        "env",
    ])
    .arg(format!("CELLA_RUN_DIR={}/run", dir.display()))
    .arg(format!("CELLA_DATA_DIR={}/data", dir.display()))
    .args(envs)
    .arg(env!("CARGO_BIN_EXE_cella"))
    .stdin(Stdio::null());
    c
}

/// A test's `cella serve` process. Dropping it kills the server, then the sandboxes it left
/// under `<data>/run`: sandboxes outlive their server by design (a restarted server adopts them
/// again), but a test's server is not restarted once dropped.
pub struct ServeProcess {
    child: Child,
    /// The data directory whose sandboxes are ended on drop (`None`: leave them).
    data: Option<PathBuf>,
}

impl ServeProcess {
    pub fn new(child: Child, data: &Path) -> ServeProcess {
        ServeProcess {
            child,
            data: Some(data.to_path_buf()),
        }
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// SIGKILLs the server only, leaving its sandboxes running for a restarted server.
    pub fn kill_server_only(mut self) {
        self.kill();
        self.data = None;
    }

    /// SIGKILLs the server, then puts the one `start` starts (on the same data directory and
    /// port) in its place; the sandboxes stay for it.
    pub fn restart(&mut self, start: impl FnOnce() -> Child) {
        self.kill();
        self.child = start();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
        let Some(data) = &self.data else { return };
        let Ok(entries) = std::fs::read_dir(data.join("run")) else {
            return;
        };
        for entry in entries.flatten() {
            if let Some(pid) = sandbox_init_pid(data, &entry.file_name().to_string_lossy()) {
                // SAFETY: kill sends a signal to that sandbox's init only; its helper then
                // removes its cgroups and files.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// The running init of sandbox `id` of the server on `data` (what an operator would see, not
/// the server's store): the process whose cgroup is named after the sandbox and which is PID 1
/// of its namespace.
pub fn sandbox_init_pid(data: &Path, id: &str) -> Option<i32> {
    if !data.join("run").join(id).join("envd.sock").exists() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let in_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|cg| {
            cg.lines()
                .any(|l| l.contains("pids:") && l.ends_with(&format!("/cella/{id}")))
        });
        let is_init = in_cgroup
            && std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1"))
            });
        if is_init {
            return Some(pid);
        }
    }
    None
}
