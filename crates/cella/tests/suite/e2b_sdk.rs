//! The unmodified `e2b` Python SDK (pinned in tests/python/requirements.txt) against a real
//! `cella serve`: starts the server on a free loopback port with a fresh data directory, makes
//! a second tenant's key, and runs tests/python with pytest.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::support::{ServeProcess, sandbox_init_pid, sdk_python, serve_command};
use crate::require_root;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// `cella serve` on `port` with `data` as its data directory.
fn spawn_server(data: &std::path::Path, port: u16, stderr: Stdio) -> ServeProcess {
    let child = serve_command(data, port)
        .stderr(stderr)
        .spawn()
        .expect("start cella serve");
    ServeProcess::new(child, data)
}

/// Starts `cella serve` and waits until it answers; returns the server and its admin key.
pub fn start_server(data: &std::path::Path, port: u16) -> (ServeProcess, String) {
    let mut server = spawn_server(data, port, Stdio::piped());
    let stderr = server.child().stderr.take().expect("stderr");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Read the server's output on a thread for its whole life, so a chatty server never blocks
    // on a full pipe; hand the admin key over once it is printed.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if let Some(k) = line.strip_prefix("export E2B_API_KEY=") {
                let _ = tx.send(k.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let key = rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok();
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
    let Some(python) = sdk_python() else {
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
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&tests)
        // Run by its own test (suite/code_interpreter.rs).
        .arg("--ignore")
        .arg(tests.join("test_code_interpreter.py"))
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

/// SIGKILL the server while 20 sandboxes are live, start it again: all 20 are still usable
/// through the SDK (files and processes intact), and a sandbox killed while the server was down
/// is reported as gone.
#[test]
fn sandboxes_survive_a_server_sigkill() {
    require_root!();
    let Some(python) = sdk_python() else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (server, key) = start_server(data.path(), port);
    let run_py = |script: &str| {
        // os._exit: skip interpreter teardown, where the SDK's native threads can abort.
        let script = format!("{script}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n");
        let out = Command::new(&python)
            .args(["-c", &script])
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", &key)
            .output()
            .expect("python");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let ids = run_py(
        "from e2b import Sandbox\n\
         for i in range(20):\n\
         \x20   sb = Sandbox.create(timeout=300, metadata={'n': str(i)})\n\
         \x20   sb.files.write('/home/user/id.txt', sb.sandbox_id)\n\
         \x20   sb.commands.run('sleep 600', background=True)\n\
         \x20   print(sb.sandbox_id)\n",
    );
    let ids: Vec<&str> = ids.split_whitespace().collect();
    assert_eq!(ids.len(), 20);
    // SIGKILL: no graceful shutdown at all.
    server.kill_server_only();
    // One sandbox dies while the server is down.
    let victim = ids[0];
    let victim_pid = find_init_pid(data.path(), victim);
    // SAFETY: kill sends a signal to the sandbox's init only.
    unsafe { libc::kill(victim_pid, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(300));
    let (_server2, _) = restart_server(data.path(), port);
    let checked = run_py(&format!(
        "from e2b import Sandbox\n\
         from e2b.exceptions import NotFoundException\n\
         ids = {ids:?}\n\
         ok = 0\n\
         for i in ids[1:]:\n\
         \x20   sb = Sandbox.connect(i)\n\
         \x20   assert sb.files.read('/home/user/id.txt') == i\n\
         \x20   assert any('sleep 600' in ' '.join([p.cmd] + p.args) for p in sb.commands.list())\n\
         \x20   assert sb.commands.run('echo alive').stdout == 'alive\\n'\n\
         \x20   ok += 1\n\
         try:\n\
         \x20   Sandbox.connect(ids[0])\n\
         \x20   print('victim still there')\n\
         except NotFoundException:\n\
         \x20   pass\n\
         print('ok', ok)\n\
         for i in ids[1:]:\n\
         \x20   Sandbox.kill(i)\n"
    ));
    assert!(checked.contains("ok 19"), "{checked}");
    assert!(!checked.contains("victim still there"), "{checked}");
}

/// The host pid of a sandbox's init, from its helper's socket directory.
pub fn find_init_pid(data: &std::path::Path, id: &str) -> i32 {
    let sock = data.join("run").join(id).join("envd.sock");
    assert!(sock.exists(), "{} missing", sock.display());
    sandbox_init_pid(data, id).unwrap_or_else(|| panic!("no init process found for sandbox {id}"))
}

/// Starts the server again on an existing data directory (no new admin key is printed).
fn restart_server(data: &std::path::Path, port: u16) -> (ServeProcess, ()) {
    let server = spawn_server(data, port, Stdio::null());
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "cella serve did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, ())
}

/// `cella bench e2b` end to end on a small sample: the SDK drives a server with a warm pool,
/// the raw backend runs in the same process, and the report adds up.
#[test]
fn bench_e2b_reports_sdk_and_raw_series_with_pool_hits() {
    require_root!();
    let Some(python) = sdk_python() else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_cella"))
        .args(["bench", "e2b", "--runs", "4", "--concurrency", "1,2"])
        .args(["--warm-pool", "2", "--rounds", "2", "--json", "--python"])
        .arg(&python)
        .output()
        .expect("cella bench e2b");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let levels = report["levels"].as_array().expect("levels");
    assert_eq!(levels.len(), 2, "{report}");
    for (level, c) in levels.iter().zip([1, 2]) {
        assert_eq!(level["concurrency"], c);
        for side in ["server", "raw"] {
            assert_eq!(level[side]["runs"], 4, "{report}");
            let p50 = level[side]["p50_ms"].as_f64().unwrap();
            assert!(p50 > 0.0 && p50 <= level[side]["p99_ms"].as_f64().unwrap());
        }
        let served =
            level["warm_pool_hits"].as_u64().unwrap() + level["warm_pool_misses"].as_u64().unwrap();
        assert_eq!(served, 4, "every SDK create asked the pool: {report}");
        assert!(level["warm_pool_hits"].as_u64().unwrap() >= 2, "{report}");
    }
    assert!(report["target_met"].is_boolean());
}

/// A configuration file with a typo, or a pool for a template that does not exist, stops the
/// server at start with a message naming the problem.
#[test]
fn serve_refuses_bad_configuration() {
    let data = tempfile::tempdir().expect("tempdir");
    let conf = data.path().join("cella.toml");
    // Starts the server on `config`; it must fail at once. Returns what it said.
    let refused = |config: &str| {
        std::fs::write(&conf, config).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_cella"))
            .arg("serve")
            .arg("--config")
            .arg(&conf)
            .arg("--data-dir")
            .arg(data.path())
            .env("CELLA_RUN_DIR", data.path().join("run"))
            .output()
            .expect("cella serve");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused("listen = \"127.0.0.1:0\"\nwarm_pool = 3\n");
    assert!(
        err.contains("warm_pool") && err.contains("cella.toml"),
        "{err}"
    );
    let err = refused("listen = \"127.0.0.1:0\"\n[warm_pools]\nnosuch = 2\n");
    assert!(
        err.contains("\"nosuch\"") && err.contains("known templates are"),
        "{err}"
    );
}
