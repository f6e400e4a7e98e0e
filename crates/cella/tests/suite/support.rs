//! Helpers shared by the integration tests: running the real `cella` binary.

use std::process::{Command, Output, Stdio};

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
