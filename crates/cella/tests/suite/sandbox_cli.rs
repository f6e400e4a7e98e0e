//! `cella sandbox …` against a real `cella serve` (started by the helper of e2b_sdk.rs on a
//! free loopback port with a fresh data directory): the whole lifecycle, streaming exec, file
//! copies both ways, pause/resume, and the messages of the failures a user meets first.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::e2b_sdk::{free_port, start_server};
use super::support::text;
use crate::require_root;

/// `cella sandbox ARGS` with the server's URL and key in the environment.
fn sandbox_cmd(url: &str, key: Option<&str>, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cella"));
    c.arg("sandbox")
        .args(args)
        .env("CELLA_URL", url)
        .env_remove("CELLA_API_KEY")
        .env_remove("CELLA_DATA_DIR")
        .stdin(Stdio::null());
    if let Some(k) = key {
        c.env("CELLA_API_KEY", k);
    }
    c
}

fn run(url: &str, key: Option<&str>, args: &[&str]) -> Output {
    sandbox_cmd(url, key, args)
        .output()
        .expect("running cella sandbox")
}

/// Runs and requires success; returns stdout.
fn ok(url: &str, key: &str, args: &[&str]) -> String {
    let out = run(url, Some(key), args);
    assert!(
        out.status.success(),
        "cella sandbox {args:?} failed ({:?}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn json(url: &str, key: &str, args: &[&str]) -> Value {
    let out = ok(url, key, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {out}"))
}

/// Deterministic, incompressible-looking bytes.
fn test_bytes(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn sandbox_cli_lifecycle_against_cella_serve() {
    require_root!();
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (_server, key) = start_server(data.path(), port);
    let url = format!("http://127.0.0.1:{port}");
    let url = url.as_str();
    let key = key.as_str();

    // create, with metadata and an environment variable; plain output is just the id.
    let id = ok(
        url,
        key,
        &[
            "create",
            "--timeout",
            "5m",
            "--metadata",
            "suite=cli",
            "--env",
            "GREETING=hi",
        ],
    )
    .trim()
    .to_string();
    assert!(cella_proto::ids::is_valid_sandbox_id(&id), "{id:?}");
    let other = json(url, key, &["create", "--json", "--metadata", "suite=other"]);
    let other_id = other["sandboxID"].as_str().expect("sandboxID").to_string();
    assert_eq!(other["templateID"], "base");
    assert!(other["envdAccessToken"].is_string(), "{other}");

    // ls: JSON parsed, the metadata filter, the table.
    let all = json(url, key, &["ls", "--json"]);
    let ids: Vec<&str> = all
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["sandboxID"].as_str())
        .collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&other_id.as_str()),
        "{all}"
    );
    let filtered = json(url, key, &["ls", "--json", "--metadata", "suite=cli"]);
    let filtered = filtered.as_array().expect("array");
    assert_eq!(filtered.len(), 1, "{filtered:?}");
    assert_eq!(filtered[0]["sandboxID"], id.as_str());
    assert_eq!(filtered[0]["state"], "running");
    assert_eq!(filtered[0]["metadata"]["suite"], "cli");
    let table = ok(url, key, &["ls"]);
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("running") && l.contains("suite=cli")),
        "{table}"
    );
    // Without a key, the admin key is read from the server's data directory.
    let by_file = sandbox_cmd(url, None, &["ls", "--json"])
        .env("CELLA_DATA_DIR", data.path())
        .output()
        .expect("ls");
    assert!(by_file.status.success(), "{}", text(&by_file.stderr));
    let detail = json(url, key, &["inspect", &id, "--json"]);
    assert_eq!(detail["state"], "running");

    // exec: stdout and stderr apart, the exit code, envs from create and from exec, cwd, user.
    let out = run(
        url,
        Some(key),
        &[
            "exec",
            &id,
            "--env",
            "WHO=cli",
            "--cwd",
            "/tmp",
            "--",
            "bash",
            "-c",
            "echo \"$GREETING $WHO $(pwd) $(id -un)\"; echo oops >&2; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi cli /tmp user\n");
    assert_eq!(text(&out.stderr), "oops\n");
    let root = ok(url, key, &["exec", &id, "--user", "root", "--", "id", "-u"]);
    assert_eq!(root.trim(), "0");
    // stdin is piped when it is not a terminal.
    let mut child = sandbox_cmd(url, Some(key), &["exec", &id, "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"piped through\n")
        .expect("write");
    let piped = child.wait_with_output().expect("wait");
    assert!(piped.status.success());
    assert_eq!(text(&piped.stdout), "PIPED THROUGH\n");
    // Output streams live: the first line arrives while the command still runs.
    let started = Instant::now();
    let mut child = sandbox_cmd(
        url,
        Some(key),
        &[
            "exec",
            &id,
            "--",
            "bash",
            "-c",
            "echo first; sleep 2; echo second; exit 7",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("a line").expect("utf8"), "first");
    let first_at = started.elapsed();
    assert_eq!(lines.next().expect("a line").expect("utf8"), "second");
    let status = child.wait().expect("wait");
    let total = started.elapsed();
    assert_eq!(status.code(), Some(7));
    assert!(
        total >= Duration::from_secs(2) && first_at + Duration::from_millis(1500) <= total,
        "first line after {first_at:?}, end after {total:?}: output was not streamed"
    );
    // --json: one event per line, ending with the exit code.
    let events = run(
        url,
        Some(key),
        &[
            "exec",
            &id,
            "--json",
            "--",
            "bash",
            "-c",
            "echo a; echo b >&2; exit 4",
        ],
    );
    assert_eq!(events.status.code(), Some(4));
    let events: Vec<Value> = text(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(events[0]["type"], "start");
    assert!(
        events.contains(&serde_json::json!({"type": "stdout", "text": "a\n"})),
        "{events:?}"
    );
    assert!(
        events.contains(&serde_json::json!({"type": "stderr", "text": "b\n"})),
        "{events:?}"
    );
    assert_eq!(
        events.last().expect("events"),
        &serde_json::json!({"type": "end", "exitCode": 4})
    );
    let missing = run(url, Some(key), &["exec", &id, "--", "no-such-command-xyz"]);
    assert_eq!(
        missing.status.code(),
        Some(127),
        "{}",
        text(&missing.stderr)
    );

    // cp both ways with a multi-MB file, byte-compared; into a directory keeps the name.
    let host = tempfile::tempdir().expect("tempdir");
    let big = test_bytes(12 * 1024 * 1024 + 7);
    let src = host.path().join("big.bin");
    std::fs::write(&src, &big).expect("write");
    let src_s = src.to_str().expect("utf8");
    let up = json(
        url,
        key,
        &["cp", "--json", src_s, &format!("{id}:/home/user/big.bin")],
    );
    assert_eq!(up["bytes"], big.len());
    let size = ok(
        url,
        key,
        &["exec", &id, "--", "stat", "-c", "%s", "/home/user/big.bin"],
    );
    assert_eq!(size.trim(), big.len().to_string());
    ok(url, key, &["cp", src_s, &format!("{id}:/tmp/")]);
    let back = host.path().join("back.bin");
    ok(
        url,
        key,
        &[
            "cp",
            &format!("{id}:/tmp/big.bin"),
            back.to_str().expect("utf8"),
        ],
    );
    assert!(
        std::fs::read(&back).expect("read back") == big,
        "the copy differs"
    );
    let dir = host.path().join("into");
    std::fs::create_dir(&dir).expect("mkdir");
    ok(
        url,
        key,
        &[
            "cp",
            &format!("{id}:/home/user/big.bin"),
            dir.to_str().expect("utf8"),
        ],
    );
    assert!(
        std::fs::read(dir.join("big.bin")).expect("read") == big,
        "the copy differs"
    );
    // A missing file: a message, an exit code, and no partial file left behind.
    let gone = run(
        url,
        Some(key),
        &[
            "cp",
            &format!("{id}:/nope/x"),
            host.path().join("x").to_str().expect("utf8"),
        ],
    );
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        text(&gone.stderr).contains("/nope/x"),
        "{}",
        text(&gone.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(host.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");

    // pause: exec is refused (as E2B's gateway refuses a paused sandbox) with the way out.
    assert_eq!(ok(url, key, &["pause", &id]).trim(), id);
    let paused = json(url, key, &["ls", "--json", "--state", "paused"]);
    assert_eq!(paused.as_array().expect("array").len(), 1, "{paused}");
    assert_eq!(paused[0]["sandboxID"], id.as_str());
    let refused = run(url, Some(key), &["exec", &id, "--", "true"]);
    assert_eq!(refused.status.code(), Some(125));
    let msg = text(&refused.stderr);
    assert!(
        msg.contains("is paused") && msg.contains(&format!("cella sandbox resume {id}")),
        "{msg}"
    );
    let again = run(url, Some(key), &["pause", &id]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("already paused"),
        "{}",
        text(&again.stderr)
    );

    // resume: files kept, exec works again.
    let resumed = json(url, key, &["resume", &id, "--json"]);
    assert_eq!(resumed["resumed"], true);
    let size = ok(
        url,
        key,
        &["exec", &id, "--", "stat", "-c", "%s", "/home/user/big.bin"],
    );
    assert_eq!(size.trim(), big.len().to_string());
    assert!(ok(url, key, &["logs", &id]).contains("paused"));

    // rm both; ls is empty.
    let removed = ok(url, key, &["rm", &id, &other_id]);
    assert_eq!(removed, format!("{id}\n{other_id}\n"));
    assert_eq!(json(url, key, &["ls", "--json"]), serde_json::json!([]));
}

#[test]
fn sandbox_cli_errors_say_what_to_do() {
    require_root!();
    // No server: the URL and `cella serve` are named.
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = run(&url, Some("e2b_0"), &["ls"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out.stderr);
    assert!(msg.contains(&url) && msg.contains("cella serve"), "{msg}");
    let out = run(&url, Some("e2b_0"), &["exec", "abc", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));

    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (_server, key) = start_server(data.path(), port);
    let url = format!("http://127.0.0.1:{port}");
    // A wrong key and a missing one: 401, said so, with how to get a key.
    let wrong = run(
        &url,
        Some("e2b_0123456789abcdef0123456789abcdef01234567"),
        &["ls"],
    );
    assert_eq!(wrong.status.code(), Some(1));
    let msg = text(&wrong.stderr);
    assert!(
        msg.contains("refused the API key") && msg.contains("cella keys create"),
        "{msg}"
    );
    let empty = tempfile::tempdir().expect("tempdir");
    let none = sandbox_cmd(&url, None, &["create"])
        .env("CELLA_DATA_DIR", empty.path())
        .output()
        .expect("create");
    assert_eq!(none.status.code(), Some(1));
    let msg = text(&none.stderr);
    assert!(
        msg.contains("No API key was given") && msg.contains("admin.key"),
        "{msg}"
    );
    // Unknown ids.
    for (args, code) in [
        (vec!["exec", "zzz999", "--", "true"], 125),
        (vec!["rm", "zzz999"], 1),
        (vec!["pause", "zzz999"], 1),
        (vec!["resume", "zzz999"], 1),
        (vec!["inspect", "zzz999"], 1),
        (vec!["cp", "zzz999:/x", "/tmp/x"], 1),
    ] {
        let out = run(&url, Some(&key), &args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let msg = text(&out.stderr);
        assert!(msg.contains("sandbox zzz999 not found"), "{args:?}: {msg}");
    }
    let bad = run(&url, Some(&key), &["inspect", "../etc"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("not found"),
        "{}",
        text(&bad.stderr)
    );
}
