//! The unmodified `e2b` Python SDK (pinned in tests/python/requirements.txt) against a real
//! `cella serve`: starts the server on a free loopback port with a fresh data directory, makes
//! a second tenant's key, and runs tests/python with pytest.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::require_root;

pub struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Starts `cella serve` and waits until it answers; returns the server and its admin key.
pub fn start_server(data: &std::path::Path, port: u16) -> (Serve, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_cella"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data)
        .env("CELLA_RUN_DIR", data.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cella serve");
    let mut server = Serve(child);
    let stderr = server.0.stderr.take().expect("stderr");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut key = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("read server output");
        if let Some(k) = line.strip_prefix("export E2B_API_KEY=") {
            key = Some(k.split_whitespace().next().unwrap_or("").to_string());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cella serve did not print its key"
        );
    }
    let key = key.expect("admin key printed on first start");
    assert!(key.starts_with("e2b_") && key.len() == 44, "{key}");
    assert_eq!(
        std::fs::read_to_string(data.join("admin.key"))
            .expect("admin.key")
            .trim(),
        key
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(data.join("admin.key"))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "cella serve did not start listening"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, key)
}

#[test]
fn e2b_python_sdk_against_cella_serve() {
    require_root!();
    let Some(venv) = std::env::var_os("CELLA_TEST_VENV") else {
        eprintln!(
            "SKIP: CELLA_TEST_VENV is not set (./scripts/test creates the virtualenv with the pinned e2b SDK)"
        );
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (_server, key) = start_server(data.path(), port);
    let other = Command::new(env!("CARGO_BIN_EXE_cella"))
        .args(["keys", "create", "--tenant", "other", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cella keys create");
    assert!(
        other.status.success(),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    let other_key = String::from_utf8_lossy(&other.stdout).trim().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python");
    let out = Command::new(std::path::Path::new(&venv).join("bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&tests)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .env("CELLA_OTHER_TENANT_KEY", &other_key)
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "the e2b SDK suite failed:\n{text}");
    assert!(text.contains(" passed"), "{text}");
}
