//! `cella exec`, `cella shell` and `cella doctor` as a user runs them: output, exit codes,
//! stdin, env, work directories, bad input, and the rootless path.

use std::io::Write;
use std::process::Stdio;

use super::support::{all_output, cella, rootless_cella, sh, text};
use crate::require_root;

#[test]
fn prints_42() {
    let o = cella()
        .args(["exec", "--", "python3", "-c", "print(6*7)"])
        .output()
        .expect("run");
    assert_eq!(text(&o.stdout), "42\n", "{}", all_output(&o));
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn exit_codes_and_streams_are_the_commands() {
    let o = sh(&[], "echo out; echo err >&2; exit 7");
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(text(&o.stdout), "out\n");
    assert_eq!(text(&o.stderr), "err\n");
    let o = sh(&[], "kill -TERM $$");
    assert_eq!(o.status.code(), Some(143), "{}", all_output(&o));
}

#[test]
fn stdin_is_passed_through() {
    let mut child = cella()
        .args(["exec", "--", "bash", "-c", "tr a-z A-Z; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"hello sandbox\n")
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(text(&o.stdout), "HELLO SANDBOX\ndone\n");
}

#[test]
fn env_and_identity() {
    let o = cella()
        .args([
            "exec",
            "--env",
            "GREETING=hi there",
            "--",
            "bash",
            "-c",
            "echo \"$GREETING|$(id -un)|$HOME|$(pwd)|$(hostname)\"",
        ])
        .output()
        .expect("run");
    assert_eq!(
        text(&o.stdout),
        "hi there|user|/home/user|/home/user|cella\n",
        "{}",
        all_output(&o)
    );
    let o = cella()
        .args(["exec", "--root", "--", "id", "-un"])
        .output()
        .expect("run");
    assert_eq!(text(&o.stdout), "root\n");
}

#[test]
fn command_not_found_is_127() {
    let o = cella()
        .args(["exec", "--", "no-such-command-xyz"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(127), "{}", all_output(&o));
    assert!(
        text(&o.stderr).contains("command not found"),
        "{}",
        all_output(&o)
    );
}

#[test]
fn bad_flags_get_clear_errors() {
    for (args, needle) in [
        (
            &["exec", "--memory", "12X", "--", "true"][..],
            "invalid size unit",
        ),
        (
            &["exec", "--cpus", "0", "--", "true"][..],
            "--cpus must be a positive number",
        ),
        (
            &["exec", "--timeout", "soon", "--", "true"][..],
            "invalid duration",
        ),
        (
            &["exec", "--network", "everywhere", "--", "true"][..],
            "unknown network setting \"everywhere\"",
        ),
        (
            &["exec", "--workdir", "/nonexistent/dir", "--", "true"][..],
            "is not a directory",
        ),
        (
            &["exec", "--template", "nope", "--", "true"][..],
            "unknown template \"nope\"",
        ),
    ] {
        let o = cella().args(args).output().expect("run");
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(
            all_output(&o).contains(needle),
            "{args:?}: {}",
            all_output(&o)
        );
    }
}

#[test]
fn workdir_is_bound_read_write() {
    require_root!();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("input.txt"), "from host\n").expect("write");
    let o = cella()
        .args(["exec", "--workdir"])
        .arg(dir.path())
        .args([
            "--",
            "bash",
            "-c",
            "pwd; cat input.txt; echo from sandbox > output.txt; ls -l output.txt | cut -d' ' -f3",
        ])
        .output()
        .expect("run");
    assert_eq!(
        text(&o.stdout),
        "/workspace\nfrom host\nuser\n",
        "{}",
        all_output(&o)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("output.txt")).expect("output"),
        "from sandbox\n"
    );
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir.path().join("output.txt")).expect("meta");
    let owner = std::fs::metadata(dir.path()).expect("dir meta").uid();
    assert_eq!(
        meta.uid(),
        owner,
        "files written in the work directory belong to its owner on the host"
    );
}

#[test]
fn doctor_reports_the_host() {
    let o = cella().args(["doctor", "--json"]).output().expect("run");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let checks = v["checks"].as_array().expect("checks");
    for name in ["namespaces", "landlock", "seccomp", "cgroups", "kvm"] {
        assert!(
            checks.iter().any(|c| c["name"] == name),
            "{name} missing: {v}"
        );
    }
    assert_eq!(v["backends"][0]["name"], "native");
    assert_eq!(v["backends"][0]["usable"], true, "{v}");
    let o = cella().arg("doctor").output().expect("run");
    assert!(text(&o.stdout).contains("landlock"), "{}", all_output(&o));
}

/// The rootless path: cella run by an unprivileged user works, with only user namespaces,
/// and says which limits it cannot enforce.
#[test]
fn rootless_exec_works_and_reports_unenforced_limits() {
    require_root!();
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = rootless_cella(tmp.path(), &[])
        .args([
            "exec",
            "--verbose",
            "--",
            "bash",
            "-c",
            "python3 -c 'print(6*7)'; id -un; touch /usr/x",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("setpriv");
    let out = all_output(&o);
    assert!(text(&o.stdout).starts_with("42\nuser\n"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("memory limit not enforced"), "{out}");
    assert!(out.contains("rootless"), "{out}");
}

/// `cella shell` on a real terminal (util-linux `script` provides the PTY): the prompt comes,
/// typed commands run in the sandbox, and the shell's exit code is the command's.
#[test]
fn shell_is_an_interactive_session_on_a_terminal() {
    use std::io::Read;
    let mut child = std::process::Command::new("script")
        .args(["-q", "-e", "-c"])
        .arg(format!("{} shell", env!("CARGO_BIN_EXE_cella")))
        .arg("/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let mut wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !seen.contains(needle) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(chunk) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Err(_) => panic!("no {needle:?} from cella shell; got {seen:?}"),
            }
        }
    };
    wait_for("user@cella:~$");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"echo $((6*7)) $(id -un)\n").expect("type");
    wait_for("42 user");
    stdin.write_all(b"exit 3\n").expect("type");
    drop(stdin);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(3), "{seen}");
}
