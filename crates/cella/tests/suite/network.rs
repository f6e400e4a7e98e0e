//! Network policies end to end: real sandboxes (`cella exec`, `cella serve`) reaching test
//! servers through the host's egress proxy.
//!
//! Each test runs in a "lab": a thread in a fresh network namespace whose loopback also
//! carries 198.51.100.10 (a public address as far as policies go) and 10.20.30.40 (private).
//! Test HTTP servers listen there; the `cella` processes the thread starts inherit the
//! namespace. Names resolve through `CELLA_EGRESS_HOSTS`, the proxy's hosts map, which feeds
//! the same checks real lookups do (so `rebind.test` → 127.0.0.1 exercises rebinding).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::require_root;
use crate::suite::support::{ServeProcess, all_output, cella, serve_command, text};

const PUBLIC: &str = "198.51.100.10";
const PRIVATE: &str = "10.20.30.40";
const HOSTS: &str =
    "198.51.100.10 allowed.test other.test\n127.0.0.1 rebind.test\n10.20.30.40 private.test\n";

/// The first bytes of every connection a test server accepted.
type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

/// A server that records what it receives and answers `reached <addr>` over HTTP.
fn serve(addr: &str, port: u16) -> Seen {
    let l = TcpListener::bind((addr, port)).unwrap_or_else(|e| panic!("bind {addr}:{port}: {e}"));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let addr = addr.to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            buf.truncate(n);
            log.lock().expect("lock").push(buf);
            let body = format!("reached {addr}\n");
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    seen
}

struct Lab {
    dir: tempfile::TempDir,
    public: Seen,
    tls: Seen,
    private: Seen,
    loopback: Seen,
}

impl Lab {
    fn hosts(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// `cella exec --network POLICY -- bash -c SCRIPT` in the lab.
    fn exec(&self, policy: &str, script: &str) -> Output {
        cella()
            .args([
                "exec",
                "--network",
                policy,
                "--timeout",
                "60s",
                "--",
                "bash",
                "-c",
                script,
            ])
            .env("CELLA_EGRESS_HOSTS", self.hosts())
            .output()
            .expect("running cella exec")
    }
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(o.status.success(), "ip {args:?}: {}", all_output(&o));
}

/// Runs `f` on a thread in a fresh network namespace set up as the module describes.
fn in_lab(f: impl FnOnce(&Lab) + Send + 'static) {
    std::thread::spawn(move || {
        // SAFETY: unsharing the network namespace changes only this thread's namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        ip(&["link", "set", "lo", "up"]);
        ip(&["addr", "add", &format!("{PUBLIC}/32"), "dev", "lo"]);
        ip(&["addr", "add", &format!("{PRIVATE}/32"), "dev", "lo"]);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("hosts"), HOSTS).expect("hosts");
        let lab = Lab {
            dir,
            public: serve(PUBLIC, 80),
            tls: serve(PUBLIC, 443),
            private: serve(PRIVATE, 80),
            loopback: serve("127.0.0.1", 80),
        };
        f(&lab)
    })
    .join()
    .expect("lab thread");
}

fn requests(seen: &Seen) -> String {
    let all = seen.lock().expect("lock");
    all.iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[test]
fn allowed_domain_reachable_others_refused() {
    require_root!();
    in_lab(|lab| {
        let o = lab.exec(
            "allow:allowed.test",
            "curl -sSf http://allowed.test/plain; echo \"rc=$?\"\n\
             curl -sSf -p http://allowed.test/tunnel; echo \"rc=$?\"\n\
             curl -sSf --proxy socks5h://127.0.0.1:3128 http://allowed.test/socks; echo \"rc=$?\"\n\
             python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://allowed.test/py\").read().decode().strip())'\n\
             curl -sSf http://other.test/; echo \"rc=$?\"",
        );
        let out = text(&o.stdout);
        let err = text(&o.stderr);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            vec![
                "reached 198.51.100.10",
                "rc=0",
                "reached 198.51.100.10",
                "rc=0",
                "reached 198.51.100.10",
                "rc=0",
                "reached 198.51.100.10",
                "rc=22",
            ],
            "{}",
            all_output(&o)
        );
        assert!(
            err.contains("cella: network: denied other.test:80 (not in the allow-list"),
            "{err}"
        );
        let seen = requests(&lab.public);
        for path in ["/plain", "/tunnel", "/socks", "/py"] {
            assert!(
                seen.contains(&format!("GET {path} HTTP/1.1")),
                "{path}: {seen}"
            );
        }
        assert!(!seen.to_ascii_lowercase().contains("other.test"), "{seen}");
    });
}

#[test]
fn private_ranges_refused_unless_a_cidr_allows_them() {
    require_root!();
    in_lab(|lab| {
        let script = "curl -sSf http://private.test/; echo \"rc=$?\"\n\
                      curl -sSf http://169.254.169.254/latest/meta-data/; echo \"rc=$?\"\n\
                      curl -sSf http://allowed.test/; echo \"rc=$?\"";
        let o = lab.exec("internet", script);
        let out = text(&o.stdout);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            vec!["rc=22", "rc=22", "reached 198.51.100.10", "rc=0"],
            "{}",
            all_output(&o)
        );
        let err = text(&o.stderr);
        assert!(
            err.contains("denied private.test:80 (private range 10.0.0.0/8"),
            "{err}"
        );
        assert!(
            err.contains("denied 169.254.169.254:80 (metadata range"),
            "{err}"
        );
        assert!(requests(&lab.private).is_empty());

        let o = lab.exec("allow:10.20.30.40", "curl -sSf http://private.test/x");
        assert_eq!(
            text(&o.stdout),
            "reached 10.20.30.40\n",
            "{}",
            all_output(&o)
        );
        assert!(requests(&lab.private).contains("GET /x HTTP/1.1"));
    });
}

#[test]
fn deny_list_wins_over_allows() {
    require_root!();
    in_lab(|lab| {
        let o = lab.exec(
            "internet;allow:allowed.test,198.51.100.0/24;deny:198.51.100.10",
            "curl -sSf http://allowed.test/; echo \"rc=$?\"",
        );
        assert_eq!(text(&o.stdout), "rc=22\n", "{}", all_output(&o));
        assert!(
            text(&o.stderr).contains("denied allowed.test:80 (deny-list entry 198.51.100.10/32)"),
            "{}",
            all_output(&o)
        );
        assert!(requests(&lab.public).is_empty());
    });
}

#[test]
fn dns_rebinding_to_loopback_is_refused() {
    require_root!();
    in_lab(|lab| {
        // The name is allowed, but it resolves to the host's loopback.
        let o = lab.exec(
            "allow:rebind.test",
            "curl -sSf http://rebind.test/; echo \"rc=$?\"\n\
             curl -sSf -p https://rebind.test/; echo \"rc=$?\"",
        );
        let out = text(&o.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{}", all_output(&o));
        assert!(
            lines.iter().all(|l| l.starts_with("rc=") && *l != "rc=0"),
            "{}",
            all_output(&o)
        );
        let err = text(&o.stderr);
        assert!(
            err.contains("denied rebind.test:80 (loopback range 127.0.0.0/8"),
            "{err}"
        );
        assert!(
            err.contains("denied rebind.test:443 (loopback range"),
            "{err}"
        );
        assert!(requests(&lab.loopback).is_empty());
    });
}

/// A TLS ClientHello for `sni` through a CONNECT tunnel to allowed.test:443, from inside the
/// sandbox; prints what came back.
const SNI_PROBE: &str = r#"
import socket, ssl
def attempt(sni):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(inc, out, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    s.sendall(out.read())
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    print(sni, head.split(b"\r\n")[0].decode(), data.split(b"\r\n")[0].decode() or "closed")
attempt("evil.test")
attempt("allowed.test")
"#;

#[test]
fn tls_server_name_must_match_the_requested_host() {
    require_root!();
    in_lab(|lab| {
        let o = cella()
            .args([
                "exec",
                "--network",
                "allow:allowed.test",
                "--",
                "python3",
                "-c",
                SNI_PROBE,
            ])
            .env("CELLA_EGRESS_HOSTS", lab.hosts())
            .output()
            .expect("cella exec");
        assert_eq!(
            text(&o.stdout).lines().collect::<Vec<_>>(),
            vec![
                "evil.test HTTP/1.1 200 Connection established closed",
                "allowed.test HTTP/1.1 200 Connection established HTTP/1.1 200 OK",
            ],
            "{}",
            all_output(&o)
        );
        assert!(
            text(&o.stderr).contains(
                "denied allowed.test:443 (TLS server name evil.test does not match the requested host allowed.test)"
            ),
            "{}",
            all_output(&o)
        );
        // The mismatched hello never reached the server; the matching one did.
        let seen = lab.tls.lock().expect("lock").clone();
        assert!(
            seen.iter()
                .all(|r| !r.windows(9).any(|w| w == b"evil.test"))
        );
        assert!(
            seen.iter()
                .any(|r| r.first() == Some(&0x16) && r.windows(12).any(|w| w == b"allowed.test"))
        );
    });
}

#[test]
fn without_the_proxy_there_is_no_route_out() {
    require_root!();
    in_lab(|lab| {
        // The policy allows everything public, and the address is up, yet a direct socket has
        // nowhere to go: only the proxy leads out.
        let o = lab.exec(
            "internet",
            "python3 -c '\nimport socket\nfor target in [(\"198.51.100.10\", 80), (\"8.8.8.8\", 53)]:\n    try:\n        socket.create_connection(target, timeout=5)\n        print(\"CONNECTED\")\n    except OSError as e:\n        print(e.errno)\n'\n\
             env -u http_proxy -u HTTP_PROXY -u ALL_PROXY -u all_proxy curl -sS http://allowed.test/ 2>&1 | head -c 60\n\
             curl -sSf http://allowed.test/",
        );
        let out = text(&o.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..2],
            ["101", "101"],
            "ENETUNREACH: {}",
            all_output(&o)
        );
        assert!(
            lines[2].contains("Could not resolve host"),
            "{}",
            all_output(&o)
        );
        assert_eq!(lines[3], "reached 198.51.100.10", "{}", all_output(&o));
    });
}

// ---- the server: create with E2B fields, change at runtime, survive a restart ----

fn start_serve(data: &Path, hosts: &Path, port: u16) -> ServeProcess {
    let child = serve_command(data, port)
        .args(["--no-auth", "--warm-pool", "base=1"])
        .env("CELLA_EGRESS_HOSTS", hosts)
        .spawn()
        .expect("start cella serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "cella serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    ServeProcess::new(child, data)
}

/// One HTTP/1.1 request to the server; (status, body).
fn call(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: e2b_0000000000000000000000000000000000000000\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let status = resp[9..12].parse().expect("status");
    let body = resp
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

/// Through the sandbox's proxy socket (what envd's bridge splices to): GET http://NAME/.
fn via_proxy(socket: &Path, name: &str) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("proxy socket");
    write!(s, "GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\n\r\n").expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or("").to_string()
}

#[test]
fn server_policies_change_at_runtime_and_survive_a_restart() {
    require_root!();
    in_lab(|lab| {
        let data = lab.dir.path().join("data");
        let port = 3000;
        let serve = start_serve(&data, &lab.hosts(), port);
        // The sandbox comes from the warm pool (built with no network); the claim applies the
        // requested policy.
        let ready = "cella_warm_pool_ready{template=\"base\"} 1";
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, metrics) = call(port, "GET", "/metrics", None);
            if metrics.contains(ready) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the warm pool did not fill: {metrics}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let (status, body) = call(
            port,
            "POST",
            "/sandboxes",
            Some(
                r#"{"templateID":"base","timeout":120,"allow_internet_access":true,"network":{"allowOut":["allowed.test"],"denyOut":["0.0.0.0/0"]}}"#,
            ),
        );
        assert_eq!(status, 201, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let id = v["sandboxID"].as_str().expect("id").to_string();
        let socket = data.join("run").join(&id).join("egress/egress.sock");
        let metrics = call(port, "GET", "/metrics", None).1;
        assert!(
            metrics.contains("cella_warm_pool_hits_total{template=\"base\"} 1"),
            "{metrics}"
        );

        assert_eq!(via_proxy(&socket, "allowed.test"), "HTTP/1.1 200 OK");
        assert_eq!(via_proxy(&socket, "other.test"), "HTTP/1.1 403 Forbidden");

        let (status, body) = call(
            port,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(r#"{"allowOut":["other.test"],"denyOut":["0.0.0.0/0"]}"#),
        );
        assert_eq!(status, 204, "{body}");
        assert_eq!(via_proxy(&socket, "other.test"), "HTTP/1.1 200 OK");
        assert_eq!(via_proxy(&socket, "allowed.test"), "HTTP/1.1 403 Forbidden");

        let (_, detail) = call(port, "GET", &format!("/sandboxes/{id}"), None);
        let d: serde_json::Value = serde_json::from_str(&detail).expect("json");
        assert_eq!(d["allowInternetAccess"], false, "{detail}");
        assert_eq!(
            d["network"]["allowOut"],
            serde_json::json!(["other.test"]),
            "{detail}"
        );

        let (status, body) = call(
            port,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(r#"{"allowOut":["not a name"]}"#),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("network.allowOut"), "{body}");
        let (status, _) = call(
            port,
            "PUT",
            "/sandboxes/inothere0000000000000/network",
            Some("{}"),
        );
        assert_eq!(status, 404);

        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, logs) = call(port, "GET", &format!("/v2/sandboxes/{id}/logs"), None);
            if logs.contains("egress denied: allowed.test:80") {
                assert!(logs.contains("egress denied: other.test:80"), "{logs}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "denials not in the sandbox logs: {logs}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // A restarted server serves the sandbox's socket again, with the changed policy.
        serve.kill_server_only();
        let _serve = start_serve(&data, &lab.hosts(), port);
        assert_eq!(via_proxy(&socket, "other.test"), "HTTP/1.1 200 OK");
        assert_eq!(via_proxy(&socket, "allowed.test"), "HTTP/1.1 403 Forbidden");
        let (status, _) = call(port, "DELETE", &format!("/sandboxes/{id}"), None);
        assert_eq!(status, 204);
    });
}

/// After a server restart: the changed policy holds inside the sandbox.
const SDK_AFTER_RESTART: &str = r#"
import sys
from e2b import Sandbox
sbx = Sandbox.connect(sys.argv[1])
code = "curl -s -o /dev/null -w '%{http_code}' "
print(sbx.commands.run(code + "http://other.test/").stdout.strip())
print(sbx.commands.run(code + "http://allowed.test/").stdout.strip())
sbx.kill()
import os
sys.stdout.flush()
os._exit(0)
"#;

/// The unmodified e2b SDK: `network` at create, `update_network`, and commands in the sandbox
/// reaching (or not) the lab's servers through the environment's proxy.
const SDK_SCRIPT: &str = r#"
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC
sbx = Sandbox.create(timeout=120, network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
code = "curl -s -o /dev/null -w '%{http_code}' "
print(sbx.commands.run("curl -sS http://allowed.test/sdk").stdout.strip())
print(sbx.commands.run(code + "http://other.test/").stdout.strip())
sbx.update_network({"allow_out": ["other.test"], "deny_out": [ALL_TRAFFIC]})
print(sbx.commands.run(code + "http://other.test/").stdout.strip())
print(sbx.commands.run(code + "http://allowed.test/").stdout.strip())
info = sbx.get_info()
print(info.allow_internet_access)
open_sbx = Sandbox.create(timeout=120, allow_internet_access=True)
print(open_sbx.commands.run(code + "http://other.test/").stdout.strip())
print(open_sbx.commands.run(code + "http://private.test/").stdout.strip())
closed = Sandbox.create(timeout=120)
print(closed.commands.run(code + "http://allowed.test/").stdout.strip())
for s in (open_sbx, closed):
    s.kill()
print(sbx.sandbox_id)
import os, sys
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn e2b_sdk_network_options() {
    require_root!();
    let Some(venv) = std::env::var_os("CELLA_TEST_VENV") else {
        eprintln!(
            "SKIP: CELLA_TEST_VENV is not set (./scripts/test creates the virtualenv with the pinned e2b SDK)"
        );
        return;
    };
    in_lab(move |lab| {
        let data = lab.dir.path().join("data");
        let python = |args: &[&str]| {
            let o = Command::new(Path::new(&venv).join("bin/python"))
                .args(args)
                .env("E2B_API_URL", "http://127.0.0.1:3000")
                .env("E2B_SANDBOX_URL", "http://127.0.0.1:3000")
                .env(
                    "E2B_API_KEY",
                    "e2b_0000000000000000000000000000000000000000",
                )
                .output()
                .expect("python");
            assert!(o.status.success(), "{}", all_output(&o));
            text(&o.stdout)
        };
        let serve = start_serve(&data, &lab.hosts(), 3000);
        let out = python(&["-c", SDK_SCRIPT]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..8],
            [
                "reached 198.51.100.10",
                "403",
                "200",
                "403",
                "False",
                "200",
                "403",
                "403"
            ],
            "{out}"
        );
        serve.kill_server_only();
        let _serve = start_serve(&data, &lab.hosts(), 3000);
        let out = python(&["-c", SDK_AFTER_RESTART, lines[8]]);
        assert_eq!(out.lines().collect::<Vec<_>>(), ["200", "403"], "{out}");
    });
}
