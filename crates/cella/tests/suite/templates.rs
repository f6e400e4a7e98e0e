//! Templates end to end: `cella template build` of a tiny Debian template (bookworm, essential
//! variant + `hello`) into a fresh data directory, sandboxes on it (its own os-release and
//! binaries, writes in a per-sandbox overlay that never reach the shared root, the template's
//! env; its resources as the server reports them), a rebuild that is a cache hit, and template selection through
//! `cella exec --template` and E2B's `templateID`.
//!
//! The build downloads from Debian's mirror (deb.debian.org), so this needs root, mmdebstrap
//! and the network; it builds once and checks everything in one test.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use super::support::{all_output, cella, text};
use crate::require_root;

const TINY: &str = r#"description = "bookworm essential + hello (test)"
start = "echo started-$GREETING > /tmp/started; exec sleep 1000"

[debian]
suite = "bookworm"
variant = "essential"
packages = ["hello"]

[env]
GREETING = "from-the-template"

[resources]
memory = "200M"
pids = 77
"#;

fn exec_in(data: &Path, template: &str, script: &str) -> Output {
    cella()
        .args([
            "exec",
            "--root",
            "--template",
            template,
            "--",
            "bash",
            "-c",
            script,
        ])
        .env("CELLA_DATA_DIR", data)
        .output()
        .expect("running cella exec")
}

fn build(data: &Path, name: &str) -> (Output, Duration) {
    let started = Instant::now();
    let o = cella()
        .args(["template", "build", name, "--json", "--data-dir"])
        .arg(data)
        .output()
        .expect("running cella template build");
    (o, started.elapsed())
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", all_output(o)))
}

#[test]
fn unknown_template_is_refused_with_the_known_names() {
    let data = tempfile::tempdir().expect("tempdir");
    let o = cella()
        .args(["exec", "--template", "nope", "--", "true"])
        .env("CELLA_DATA_DIR", data.path())
        .output()
        .expect("run");
    assert_ne!(o.status.code(), Some(0));
    let out = all_output(&o);
    assert!(
        out.contains("unknown template \"nope\": known templates are base, code-interpreter"),
        "{out}"
    );
    let o = cella()
        .args(["template", "build", "nope", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("run");
    assert!(!o.status.success(), "{}", all_output(&o));
    assert!(all_output(&o).contains("known templates are base"));
    // base needs no build.
    let o = cella()
        .args(["template", "build", "base", "--json", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("run");
    assert_eq!(json(&o)["status"], "nothing-to-build");
}

#[test]
fn invalid_user_template_is_reported_with_its_key() {
    let data = tempfile::tempdir().expect("tempdir");
    let dir = data.path().join("templates/broken");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("template.toml"),
        "description = \"x\"\n[resources]\nmemory = \"lots\"\n",
    )
    .expect("write");
    let o = cella()
        .args(["template", "build", "broken", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("run");
    assert!(!o.status.success());
    let out = all_output(&o);
    assert!(
        out.contains("resources.memory: invalid size \"lots\""),
        "{out}"
    );
    let o = cella()
        .args(["template", "ls", "--json", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("run");
    let list = json(&o);
    let broken = list["templates"]
        .as_array()
        .expect("array")
        .iter()
        .find(|t| t["name"] == "broken")
        .expect("listed")
        .clone();
    assert_eq!(broken["status"], "invalid");
}

#[test]
fn tiny_template_builds_once_and_runs_on_a_private_overlay_needs_root() {
    require_root!();
    if !Path::new("/usr/bin/mmdebstrap").exists() {
        panic!("mmdebstrap is missing: scripts/test installs it (apt-get install mmdebstrap)");
    }
    let data = tempfile::tempdir().expect("tempdir");
    // Sandboxes reach the template root as an unprivileged host uid.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = data.path().join("templates/tiny");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("template.toml"), TINY).expect("write");

    // Unbuilt: exec says how to build it.
    let o = exec_in(data.path(), "tiny", "true");
    assert_ne!(o.status.code(), Some(0));
    assert!(
        all_output(&o).contains("run `cella template build tiny`"),
        "{}",
        all_output(&o)
    );

    let (o, first) = build(data.path(), "tiny");
    assert_eq!(o.status.code(), Some(0), "{}", all_output(&o));
    let built = json(&o);
    assert_eq!(built["status"], "built");
    let stderr = text(&o.stderr);
    assert!(
        stderr.contains("[1/2] debian: mmdebstrap bookworm"),
        "{stderr}"
    );
    assert!(stderr.contains("finish done in"), "{stderr}");
    let hash = built["hash"].as_str().expect("hash").to_string();
    let rootfs = data
        .path()
        .join("templates/tiny")
        .join(&hash)
        .join("rootfs");
    assert_eq!(Path::new(built["rootfs"].as_str().expect("rootfs")), rootfs);
    // Nothing temporary is left beside the build.
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .expect("read")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".build-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let (o, second) = build(data.path(), "tiny");
    let cached = json(&o);
    assert_eq!(cached["status"], "cached");
    assert_eq!(cached["hash"], hash.as_str());
    assert!(second < Duration::from_secs(2), "cache hit took {second:?}");
    eprintln!("tiny template: first build {first:?}, rebuild (cache hit) {second:?}");

    let o = cella()
        .args(["template", "ls", "--json", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("ls");
    let list = json(&o);
    let tiny = list["templates"]
        .as_array()
        .expect("array")
        .iter()
        .find(|t| t["name"] == "tiny")
        .expect("tiny listed")
        .clone();
    assert_eq!(tiny["status"], "built");
    assert!(tiny["size_bytes"].as_u64().expect("size") > 1 << 20);

    // A sandbox on it: bookworm's os-release, the package's binary, the template's env and
    // resources, writes anywhere (as root) that stay in the sandbox.
    let o = exec_in(
        data.path(),
        "tiny",
        "grep VERSION_CODENAME /etc/os-release; hello; echo \"$GREETING\"; \
         echo mine > /etc/sandbox-a && rm /usr/bin/hello && echo changed; \
         test -e /usr/bin/hello || echo hello-gone; id -un; stat -c %U /etc/passwd",
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", all_output(&o));
    assert_eq!(
        out,
        "VERSION_CODENAME=bookworm\nHello, world!\nfrom-the-template\nchanged\nhello-gone\nroot\nroot\n",
        "{}",
        all_output(&o)
    );
    // The shared root is untouched.
    assert!(rootfs.join("usr/bin/hello").is_file());
    assert!(!rootfs.join("etc/sandbox-a").exists());
    // A second sandbox sees the template as built, not the first one's writes.
    let o = exec_in(
        data.path(),
        "tiny",
        "test -e /etc/sandbox-a && echo leaked; hello; echo x > /home/user/f; stat -c %U /home/user; \
         for i in $(seq 50); do test -e /tmp/started && break; sleep 0.1; done; cat /tmp/started; \
         for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep 1000 ' ] && echo alive; done",
    );
    // The template's start command ran in the background (with the template's env) and lives on.
    assert_eq!(
        text(&o.stdout),
        "Hello, world!\nuser\nstarted-from-the-template\nalive\n",
        "{}",
        all_output(&o)
    );
    // Start time next to base's.
    let ready = |template: &str| -> f64 {
        let o = cella()
            .args(["exec", "-v", "--template", template, "--", "true"])
            .env("CELLA_DATA_DIR", data.path())
            .output()
            .expect("exec");
        let err = text(&o.stderr);
        err.lines()
            .find_map(|l| l.split(" ready in ").nth(1))
            .and_then(|ms| ms.trim_end_matches(" ms").parse().ok())
            .unwrap_or_else(|| panic!("no ready time: {err}"))
    };
    let mut base: Vec<f64> = (0..5).map(|_| ready("base")).collect();
    let mut tiny: Vec<f64> = (0..5).map(|_| ready("tiny")).collect();
    base.sort_by(f64::total_cmp);
    tiny.sort_by(f64::total_cmp);
    eprintln!(
        "sandbox ready, median of 5: base {:.1} ms, tiny template {:.1} ms",
        base[2], tiny[2]
    );

    server_selects_templates(data.path());
}

/// E2B's `templateID` on `POST /sandboxes`: a built template works, an unknown or unbuilt one
/// is a 400 naming the known templates.
fn server_selects_templates(data: &Path) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let (_server, key) = super::e2b_sdk::start_server(data, port);
    let call = |method: &str, path: &str, body: Option<String>| -> (u16, serde_json::Value) {
        let mut c = std::process::Command::new("curl");
        c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
            .args(["-H", &format!("X-API-Key: {key}")])
            .args(["-H", "Content-Type: application/json"]);
        if let Some(b) = body {
            c.args(["-d", &b]);
        }
        let o = c
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .expect("curl");
        let out = text(&o.stdout);
        let (body, code) = out.rsplit_once('\n').expect("status line");
        (
            code.parse().expect("status"),
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    };
    let post = |template: &str| {
        call(
            "POST",
            "/sandboxes",
            Some(format!(r#"{{"templateID":"{template}","timeout":30}}"#)),
        )
    };
    let (code, body) = post("nope");
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "unknown template \"nope\": known templates are base, code-interpreter, tiny"
    );
    // `code-interpreter-v1` (the e2b-code-interpreter SDK's default) is cella's code-interpreter.
    for name in ["code-interpreter", "code-interpreter-v1"] {
        let (code, body) = post(name);
        if code == 201 {
            assert_eq!(body["templateID"], "code-interpreter", "{body}");
            let id = body["sandboxID"].as_str().expect("id");
            call("DELETE", &format!("/sandboxes/{id}"), None);
            continue;
        }
        assert_eq!(code, 400, "{body}");
        let msg = body["message"].as_str().expect("message");
        assert!(
            msg.contains("run `cella template build code-interpreter`"),
            "{msg}"
        );
    }
    let (code, body) = post("tiny");
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["templateID"], "tiny");
    let id = body["sandboxID"].as_str().expect("id").to_string();
    // The template's resources are what the sandbox got.
    let (code, detail) = call("GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(code, 200, "{detail}");
    assert_eq!(detail["memoryMB"], 200, "{detail}");
    let (code, _) = call("DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(code, 204);
}
