//! The real E2B Python SDK against cella-envd (served on loopback TCP for it): files,
//! directories, errors and both watch APIs. Needs the SDK in a virtualenv: `E2B_PYTHON` names
//! its interpreter (default `/tmp/e2bvenv/bin/python`); skipped with a note when it is missing.

use std::path::PathBuf;
use std::time::Duration;

use super::support::Harness;

fn sdk_python() -> Option<PathBuf> {
    let python = std::env::var_os("E2B_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/e2bvenv/bin/python"));
    python.exists().then_some(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_python_sdk_drives_the_filesystem_needs_e2b_sdk() {
    let Some(python) = sdk_python() else {
        eprintln!(
            "skipped: the e2b Python SDK is not installed (set E2B_PYTHON to its interpreter)"
        );
        return;
    };
    let h = Harness::start().await;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}", tcp.local_addr().expect("addr"));
    let router = h.envd.router();
    let server = tokio::spawn(async move {
        let _ = axum::serve(tcp, router).await;
    });
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/suite/e2b_sdk_filesystem.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&url)
        .arg(h.path(""))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("sdk script in time")
        .expect("run python");
    server.abort();
    assert!(
        out.status.success(),
        "sdk script failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
