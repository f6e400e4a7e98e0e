//! The skill registry of a real `cella serve` (`/v1/skills`), over HTTP: upload, list, get,
//! versions, download, delete; tenant isolation; refusals of bad archives with nothing stored;
//! and sandboxes created with `skills: [...]` (or the metadata key `cella.skills`) seeing them
//! read-only at /skills/<name>, checked through envd behind the server's gateway.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use zip::write::SimpleFileOptions;

use super::e2b_sdk::{free_port, start_server};
use super::support::{cella, text};
use crate::require_root;

/// An HTTP answer.
struct Reply {
    status: u16,
    headers: hyper::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}), status {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn message(&self) -> String {
        self.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A client of one server, as one tenant.
struct Api {
    port: u16,
    key: String,
}

impl Api {
    async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect to cella serve");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("http handshake");
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("x-api-key", &self.key);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        let resp = sender.send_request(req).await.expect("send request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("read body")
            .to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, &[], Vec::new()).await
    }

    async fn upload_zip(&self, zip: &[u8]) -> Reply {
        self.call(
            "POST",
            "/v1/skills",
            &[("content-type", "application/zip")],
            zip.to_vec(),
        )
        .await
    }

    async fn upload_multipart(&self, zip: &[u8]) -> Reply {
        let boundary = "cellaBoundary7MA4YWxkTrZu0gW";
        let mut body = Vec::new();
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nignored\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.zip\"\r\n\
             Content-Type: application/zip\r\n\r\n"
        )
        .expect("write");
        body.extend_from_slice(zip);
        write!(body, "\r\n--{boundary}--\r\n").expect("write");
        let ct = format!("multipart/form-data; boundary={boundary}");
        self.call("POST", "/v1/skills", &[("content-type", &ct)], body)
            .await
    }

    async fn create_sandbox(&self, body: Value) -> Reply {
        self.call(
            "POST",
            "/sandboxes",
            &[("content-type", "application/json")],
            body.to_string().into_bytes(),
        )
        .await
    }

    /// Runs `script` with bash in the sandbox through the server's envd gateway (Connect
    /// `process.Process/Start`, JSON codec); returns stdout and stderr.
    async fn run_in_sandbox(&self, sandbox_id: &str, script: &str) -> (String, String) {
        let start = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}});
        let envelope = cella_proto::envelope::Envelope::message(&start);
        let port = cella_proto::ENVD_PORT.to_string();
        let reply = self
            .call(
                "POST",
                "/process.Process/Start",
                &[
                    ("content-type", "application/connect+json"),
                    ("connect-protocol-version", "1"),
                    ("e2b-sandbox-id", sandbox_id),
                    ("e2b-sandbox-port", &port),
                ],
                envelope.to_vec(),
            )
            .await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let mut decoder = cella_proto::envelope::EnvelopeDecoder::new();
        decoder.push(&reply.body);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(env) = decoder.next_envelope().expect("envelope") {
            if env.is_end_stream() {
                assert!(
                    env.end_stream_error().is_none(),
                    "{:?}",
                    env.end_stream_error()
                );
                break;
            }
            let msg: Value = serde_json::from_slice(&env.data).expect("event json");
            let data = &msg["event"]["data"];
            for (key, sink) in [("stdout", &mut out), ("stderr", &mut err)] {
                if let Some(b64) = data[key].as_str() {
                    sink.extend(cella_proto::b64::decode(b64).expect("base64"));
                }
            }
        }
        (text(&out), text(&err))
    }
}

/// A running server with an admin tenant (`a`) and a second tenant (`b`).
struct Fixture {
    _server: super::support::ServeProcess,
    data: tempfile::TempDir,
    a: Api,
    b: Api,
}

fn fixture() -> Fixture {
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (server, key) = start_server(data.path(), port);
    let other = cella()
        .args(["keys", "create", "--tenant", "other", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cella keys create");
    assert!(other.status.success(), "{}", text(&other.stderr));
    Fixture {
        _server: server,
        a: Api { port, key },
        b: Api {
            port,
            key: text(&other.stdout).trim().to_owned(),
        },
        data,
    }
}

/// Writes a skill directory `<root>/<name>` with SKILL.md and an executable script.
fn write_skill(root: &Path, name: &str, description: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("scripts")).expect("mkdir");
    std::fs::write(
        dir.join("SKILL.md"),
        format!(
            "---\nname: {name}\ndescription: {description}\nlicense: Apache-2.0\n---\n\
             Run scripts/greet.sh NAME.\n"
        ),
    )
    .expect("write SKILL.md");
    let script = dir.join("scripts/greet.sh");
    std::fs::write(&script, "#!/bin/sh\necho \"hello, $1\"\n").expect("write script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// `cella skills package DIR -o OUT`, and the archive's bytes.
fn package(dir: &Path, out: &Path) -> Vec<u8> {
    let o = cella()
        .args(["skills", "package"])
        .arg(dir)
        .arg("-o")
        .arg(out)
        .output()
        .expect("cella skills package");
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    std::fs::read(out).expect("read package")
}

pub(crate) fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        z.start_file(*name, SimpleFileOptions::default())
            .expect("zip entry");
        z.write_all(data).expect("zip data");
    }
    z.finish().expect("zip finish").into_inner()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The audit actions recorded for the admin tenant, oldest first.
async fn audit_actions(data: &Path) -> Vec<(String, String, Value)> {
    let store = cella_store::Store::open(&format!("sqlite://{}", data.join("cella.db").display()))
        .await
        .expect("open the server's store");
    let tenant = store
        .get_tenant_by_name("admin")
        .await
        .expect("read tenant")
        .expect("admin tenant");
    let mut events = store.list_audit(&tenant.id, 100).await.expect("audit");
    events.reverse();
    store.close().await;
    events
        .into_iter()
        .map(|e| (e.action, e.target, e.detail))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_registry_versions_downloads_deletes_and_isolates_tenants() {
    let f = fixture();
    let src = tempfile::tempdir().expect("tempdir");
    let dir = write_skill(
        src.path(),
        "greeter",
        "Greets people. Use when asked to greet.",
    );
    let v1_zip = package(&dir, &src.path().join("v1.zip"));

    let r = f.a.upload_zip(&v1_zip).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let v1 = r.json();
    assert_eq!(v1["name"], "greeter");
    assert_eq!(v1["version"], 1);
    assert_eq!(v1["sha256"], sha256_hex(&v1_zip));
    assert_eq!(v1["size"], v1_zip.len());
    assert_eq!(v1["frontmatter"]["license"], "Apache-2.0");
    assert_eq!(
        v1["files"],
        json!([
            {"path": "SKILL.md", "size": std::fs::metadata(dir.join("SKILL.md")).expect("meta").len(), "executable": false},
            {"path": "scripts/greet.sh", "size": std::fs::metadata(dir.join("scripts/greet.sh")).expect("meta").len(), "executable": true},
        ])
    );

    let list = f.a.get("/v1/skills").await;
    assert_eq!(list.status, 200);
    let list = list.json();
    assert_eq!(list["skills"].as_array().map(Vec::len), Some(1));
    assert_eq!(list["skills"][0]["name"], "greeter");
    assert_eq!(list["skills"][0]["version"], 1);
    assert_eq!(list["next_cursor"], Value::Null);

    let got = f.a.get("/v1/skills/greeter").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), v1);

    // A second upload of the name (as multipart this time) is version 2.
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: greeter\ndescription: Greets people warmly. Use when asked to greet.\n---\nv2\n",
    )
    .expect("rewrite");
    let v2_zip = package(&dir, &src.path().join("v2.zip"));
    let r = f.a.upload_multipart(&v2_zip).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let v2 = r.json();
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["sha256"], sha256_hex(&v2_zip));

    let latest = f.a.get("/v1/skills/greeter").await.json();
    assert_eq!(latest["version"], 2);
    assert_eq!(
        latest["description"],
        "Greets people warmly. Use when asked to greet."
    );
    let old = f.a.get("/v1/skills/greeter?version=1").await;
    assert_eq!(old.status, 200);
    assert_eq!(old.json(), v1);
    let missing = f.a.get("/v1/skills/greeter?version=3").await;
    assert_eq!(missing.status, 404);
    assert!(
        missing.message().contains("has no version 3"),
        "{}",
        missing.message()
    );
    let bad = f.a.get("/v1/skills/greeter?version=zero").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.message().contains("invalid version \"zero\""),
        "{}",
        bad.message()
    );

    let versions = f.a.get("/v1/skills/greeter/versions").await.json();
    let numbers: Vec<u64> = versions["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| v["version"].as_u64())
        .collect();
    assert_eq!(numbers, vec![1, 2]);

    // Downloads return the uploaded bytes exactly.
    let d1 = f.a.get("/v1/skills/greeter/download?version=1").await;
    assert_eq!(d1.status, 200);
    assert_eq!(d1.headers["content-type"], "application/zip");
    assert_eq!(d1.body.as_ref(), v1_zip.as_slice());
    let d2 = f.a.get("/v1/skills/greeter/download").await;
    assert_eq!(d2.body.as_ref(), v2_zip.as_slice());

    // Paging: three skills, two per page.
    for name in ["alpha", "beta"] {
        let d = write_skill(src.path(), name, "A test skill. Use in tests.");
        let z = package(&d, &src.path().join(format!("{name}.zip")));
        assert_eq!(f.a.upload_zip(&z).await.status, 201);
    }
    let p1 = f.a.get("/v1/skills?limit=2").await.json();
    let cursor = p1["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let p2 =
        f.a.get(&format!("/v1/skills?limit=2&cursor={cursor}"))
            .await
            .json();
    let names: Vec<&str> = p1["skills"]
        .as_array()
        .into_iter()
        .chain(p2["skills"].as_array())
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, vec!["alpha", "beta", "greeter"]);
    assert_eq!(p2["next_cursor"], Value::Null);

    // Tenant B sees none of it, exactly as if it did not exist.
    for path in [
        "/v1/skills/greeter",
        "/v1/skills/greeter?version=1",
        "/v1/skills/greeter/versions",
        "/v1/skills/greeter/download?version=1",
    ] {
        let r = f.b.get(path).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.message(), "skill greeter not found", "{path}");
    }
    assert_eq!(f.b.get("/v1/skills").await.json()["skills"], json!([]));
    assert_eq!(
        f.b.call("DELETE", "/v1/skills/greeter", &[], Vec::new())
            .await
            .status,
        404
    );
    let r =
        f.b.create_sandbox(json!({"templateID": "base", "skills": ["greeter"]}))
            .await;
    assert_eq!(r.status, 400);
    assert!(
        r.message().contains("unknown skill \"greeter\""),
        "{}",
        r.message()
    );
    // Without a key: 401.
    let anon = Api {
        port: f.a.port,
        key: String::new(),
    };
    assert_eq!(anon.get("/v1/skills").await.status, 401);

    // Delete removes every version.
    let del =
        f.a.call("DELETE", "/v1/skills/greeter", &[], Vec::new())
            .await;
    assert_eq!(del.status, 204);
    for path in [
        "/v1/skills/greeter",
        "/v1/skills/greeter?version=1",
        "/v1/skills/greeter/download?version=2",
        "/v1/skills/greeter/versions",
    ] {
        assert_eq!(f.a.get(path).await.status, 404, "{path}");
    }
    assert_eq!(
        f.a.call("DELETE", "/v1/skills/greeter", &[], Vec::new())
            .await
            .status,
        404
    );
    let names: Vec<Value> = f.a.get("/v1/skills").await.json()["skills"]
        .as_array()
        .expect("skills")
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("alpha"), json!("beta")]);

    let audit: Vec<(String, String, Value)> = audit_actions(f.data.path())
        .await
        .into_iter()
        .filter(|(action, _, _)| action.starts_with("skill."))
        .collect();
    let summary: Vec<(&str, &str)> = audit
        .iter()
        .map(|(a, t, _)| (a.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("skill.upload", "greeter"),
            ("skill.upload", "greeter"),
            ("skill.upload", "alpha"),
            ("skill.upload", "beta"),
            ("skill.delete", "greeter"),
        ]
    );
    assert_eq!(audit[1].2["version"], 2);
    assert_eq!(audit[4].2["versions"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_skill_uploads_are_refused_precisely_and_store_nothing() {
    let f = fixture();
    let md = |name: &str| format!("---\nname: {name}\ndescription: x\n---\nbody\n").into_bytes();
    let evil = md("evil");
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "zip-slip",
            zip_of(&[("evil/SKILL.md", &evil), ("evil/../../escaped.txt", b"x")]),
            400,
            "invalid skill archive: archive entry 'evil/../../escaped.txt' is refused: contains '..' (zip-slip)",
        ),
        (
            "absolute path",
            zip_of(&[("evil/SKILL.md", &evil), ("/etc/cron.d/evil", b"x")]),
            400,
            "archive entry '/etc/cron.d/evil' is refused: is an absolute path",
        ),
        (
            "escaping symlink",
            {
                let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
                z.start_file("evil/SKILL.md", SimpleFileOptions::default())
                    .expect("entry");
                z.write_all(&evil).expect("data");
                z.add_symlink(
                    "evil/passwd",
                    "../../../etc/passwd",
                    SimpleFileOptions::default(),
                )
                .expect("link");
                z.finish().expect("finish").into_inner()
            },
            400,
            "symlink passwd -> ../../../etc/passwd leaves the skill directory",
        ),
        (
            "uppercase name and unknown field",
            zip_of(&[(
                "Greeter/SKILL.md",
                b"---\nname: Greeter\ndescription: x\nauthor: me\n---\n",
            )]),
            400,
            "name: Skill name 'Greeter' must be lowercase (rule name.lowercase, value \"Greeter\")",
        ),
        (
            "name differs from its folder",
            zip_of(&[("folder/SKILL.md", &md("other"))]),
            400,
            "(rule name.directory",
        ),
        (
            "missing description",
            zip_of(&[("d/SKILL.md", b"---\nname: d\n---\n")]),
            400,
            "rule description.missing",
        ),
        (
            "no SKILL.md",
            zip_of(&[("a/README.md", b"x")]),
            400,
            "holds no skill (no SKILL.md at its root or in one top-level folder)",
        ),
        (
            "not a zip",
            b"hello, I am not a zip".to_vec(),
            400,
            "invalid skill archive: not a readable zip",
        ),
        ("empty", Vec::new(), 400, "empty upload"),
    ];
    for (what, body, status, wanted) in &cases {
        let r = f.a.upload_zip(body).await;
        assert_eq!(
            r.status,
            *status,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.message().contains(wanted), "{what}: {}", r.message());
    }
    // Strict-validation failures list every finding with its rule, field and value.
    let r = f.a.upload_zip(&cases[3].1).await;
    let errors = r.json()["errors"].clone();
    let rules: Vec<&str> = errors
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["rule"].as_str())
        .collect();
    assert!(
        rules.contains(&"fields.unknown") && rules.contains(&"name.lowercase"),
        "{errors}"
    );
    assert!(
        errors
            .as_array()
            .expect("errors")
            .iter()
            .any(|e| e["field"] == "name" && e["value"] == "Greeter"),
        "{errors}"
    );

    let r =
        f.a.call(
            "POST",
            "/v1/skills",
            &[("content-type", "text/plain")],
            b"x".to_vec(),
        )
        .await;
    assert_eq!(r.status, 415);
    assert!(
        r.message()
            .contains("send the skill's zip as application/zip"),
        "{}",
        r.message()
    );
    let r =
        f.a.call(
            "POST",
            "/v1/skills",
            &[("content-type", "multipart/form-data; boundary=b")],
            b"--b\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nx\r\n--b--\r\n".to_vec(),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.message().contains("multipart upload has no file"),
        "{}",
        r.message()
    );

    // Over the size cap: 413, whether or not the length is declared up front.
    let big = vec![0u8; cella_server::skills_api::MAX_ARCHIVE_BYTES + 1];
    let r = f.a.upload_zip(&big).await;
    assert_eq!(r.status, 413);
    assert!(
        r.message().contains("exceeds the limit of 33554432 bytes"),
        "{}",
        r.message()
    );

    // Traversal and malformed names are refused wherever a name is taken.
    for path in [
        "/v1/skills/..%2Fetc",
        "/v1/skills/Greeter",
        "/v1/skills/a--b/versions",
    ] {
        let r = f.a.get(path).await;
        assert_eq!(r.status, 400, "{path}");
        assert!(
            r.message().starts_with("invalid skill name"),
            "{path}: {}",
            r.message()
        );
    }
    for body in [
        json!({"templateID": "base", "skills": ["../etc"]}),
        json!({"templateID": "base", "metadata": {"cella.skills": "ok-name,../../x"}}),
        json!({"templateID": "base", "skills": ["a/b"]}),
    ] {
        let r = f.a.create_sandbox(body.clone()).await;
        assert_eq!(r.status, 400, "{body}");
        assert!(
            r.message().starts_with("invalid skill name"),
            "{body}: {}",
            r.message()
        );
    }
    let r =
        f.a.create_sandbox(json!({"templateID": "base", "skills": ["nope@2"]}))
            .await;
    assert_eq!(r.status, 400);
    assert!(
        r.message().contains("unknown skill nope@2"),
        "{}",
        r.message()
    );

    // Nothing was stored, and no scratch directory was left behind.
    assert_eq!(f.a.get("/v1/skills").await.json()["skills"], json!([]));
    let leftovers: Vec<String> = std::fs::read_dir(f.data.path().join("skills"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(!f.data.path().join("escaped.txt").exists());
    let audit = audit_actions(f.data.path()).await;
    assert!(
        audit.iter().all(|(a, _, _)| !a.starts_with("skill.")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_mount_registry_skills_read_only() {
    require_root!();
    let f = fixture();
    let src = tempfile::tempdir().expect("tempdir");
    let dir = write_skill(
        src.path(),
        "greeter",
        "First version. Use when asked to greet.",
    );
    let v1_zip = package(&dir, &src.path().join("v1.zip"));
    assert_eq!(f.a.upload_zip(&v1_zip).await.status, 201);
    let dir = write_skill(
        src.path(),
        "greeter",
        "Second version. Use when asked to greet.",
    );
    let v2_zip = package(&dir, &src.path().join("v2.zip"));
    assert_eq!(f.a.upload_zip(&v2_zip).await.status, 201);

    let script = "cat /skills/greeter/SKILL.md; sh /skills/greeter/scripts/greet.sh ada; \
                  touch /skills/greeter/new; rm /skills/greeter/SKILL.md; \
                  echo x > /skills/greeter/SKILL.md; mkdir /skills/other; ls /skills; true";
    // The cella field, pinned to version 1.
    let r =
        f.a.create_sandbox(json!({"templateID": "base", "timeout": 120, "skills": ["greeter@1"]}))
            .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id1 = r.json()["sandboxID"].as_str().expect("id").to_owned();
    let (out, err) = f.a.run_in_sandbox(&id1, script).await;
    assert!(out.contains("description: First version."), "{out}{err}");
    assert!(out.contains("hello, ada"), "{out}{err}");
    assert_eq!(out.trim_end().lines().last(), Some("greeter"), "{out}");
    // touch, rm and the redirection fail on the read-only mount; /skills itself is root's.
    assert_eq!(err.matches("Read-only file system").count(), 3, "{err}");
    assert!(
        err.contains("mkdir: cannot create directory ‘/skills/other’"),
        "{err}"
    );

    // The E2B metadata key, latest version.
    let r =
        f.a.create_sandbox(
            json!({"templateID": "base", "timeout": 120, "metadata": {"cella.skills": "greeter"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id2 = r.json()["sandboxID"].as_str().expect("id").to_owned();
    let (out, err) =
        f.a.run_in_sandbox(&id2, "cat /skills/greeter/SKILL.md")
            .await;
    assert!(out.contains("description: Second version."), "{out}{err}");

    // Each version was extracted once, read-only, under its archive's sha256.
    use std::os::unix::fs::PermissionsExt;
    for zip in [&v1_zip, &v2_zip] {
        let cached = f.data.path().join("skills").join(sha256_hex(zip));
        let mode = std::fs::metadata(&cached)
            .expect("cached skill")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o555, "{}", cached.display());
        let md_mode = std::fs::metadata(cached.join("SKILL.md"))
            .expect("SKILL.md")
            .permissions()
            .mode();
        assert_eq!(md_mode & 0o777, 0o444);
    }

    // The real e2b SDK, through the metadata key, when its virtualenv is available.
    if let Some(venv) = std::env::var_os("CELLA_TEST_VENV") {
        let url = format!("http://127.0.0.1:{}", f.a.port);
        let script = "from e2b import Sandbox\n\
             sb = Sandbox.create(timeout=120, metadata={'cella.skills': 'greeter@1'})\n\
             r = sb.commands.run('cat /skills/greeter/SKILL.md')\n\
             print(r.stdout)\n\
             sb.kill()\n\
             import os, sys\nsys.stdout.flush()\nos._exit(0)\n";
        let o = Command::new(Path::new(&venv).join("bin/python"))
            .args(["-c", script])
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", &f.a.key)
            .output()
            .expect("python");
        assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
        assert!(
            text(&o.stdout).contains("description: First version."),
            "{}",
            text(&o.stdout)
        );
    } else {
        eprintln!("SKIP (SDK part only): CELLA_TEST_VENV is not set");
    }

    for id in [id1, id2] {
        let r =
            f.a.call("DELETE", &format!("/sandboxes/{id}"), &[], Vec::new())
                .await;
        assert_eq!(r.status, 204);
    }
}
