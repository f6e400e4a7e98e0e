//! `cella run` end to end: the real binary, a real sandbox (root) and a fake model provider
//! speaking the real OpenAI and Anthropic wire formats. Assertions are on what happened inside
//! the sandbox (files, exit codes, output the model was sent) and on the reported usage.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use cella_llm::testing::{FakeProvider, Reply};
use cella_proto::process::{ProcessConfig, ProcessEvent, ProcessOutput, StartRequest};
use cella_sandbox::EnvdClient;
use serde_json::{Value, json};

use super::support::{cella, text};
use crate::require_root;

/// A fake provider on a background runtime and a scratch project directory.
struct Harness {
    rt: tokio::runtime::Runtime,
    fake: FakeProvider,
    dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = rt.block_on(FakeProvider::start()).expect("fake provider");
        Self {
            rt,
            fake,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// `cella run` with the given arguments against the fake provider in `format`, stderr
    /// captured through a file (a kept sandbox's helper holds on to cella's stderr).
    fn run(&self, format: &str, args: &[&str]) -> Output {
        self.run_model(format, "fake-model", args)
    }

    /// Like [`Harness::run`], with another model name (which picks the tokenizer and window).
    fn run_model(&self, format: &str, model: &str, args: &[&str]) -> Output {
        let (model, base) = match format {
            "openai" => (
                format!("openai-compatible/{model}"),
                format!("{}/v1", self.fake.url()),
            ),
            _ => (format!("anthropic/{model}"), self.fake.url().to_owned()),
        };
        let err_path = self.dir.path().join("stderr.txt");
        let err = std::fs::File::create(&err_path).expect("stderr file");
        let mut c = cella();
        c.arg("run")
            .args(args)
            .args(["--model", &model, "--base-url", &base])
            .current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env_remove("CELLA_MODEL")
            .env_remove("CELLA_BASE_URL")
            .env_remove("CELLA_MODEL_API_KEY")
            .env_remove("CELLA_SKILLS_PATH")
            .env("ANTHROPIC_API_KEY", "test-key")
            .stdout(Stdio::piped())
            .stderr(err);
        let mut out = c.output().expect("running cella run");
        out.stderr = std::fs::read(&err_path).expect("stderr");
        out
    }
}

fn call(id: &str, name: &str, args: Value) -> (String, String, String) {
    (id.to_owned(), name.to_owned(), args.to_string())
}

fn openai_calls(calls: &[(String, String, String)]) -> Reply {
    let refs: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    Reply::openai_tool_calls(&refs)
}

fn anthropic_calls(calls: &[(String, String, String)]) -> Reply {
    let refs: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    Reply::anthropic_tool_calls(&refs)
}

fn events(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn debug(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The kept sandbox's envd socket and init pid, from cella's stderr.
fn kept(stderr: &str) -> (PathBuf, i32) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("cella: kept sandbox "))
        .unwrap_or_else(|| panic!("no kept line in: {stderr}"));
    let socket = line
        .split("envd socket ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .expect("socket");
    let pid = line
        .split("init pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .expect("pid");
    (PathBuf::from(socket), pid)
}

async fn exec(envd: &EnvdClient, cmd: &str, args: &[&str]) -> (i32, String) {
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: cmd.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            cwd: Some("/home/user".into()),
            ..ProcessConfig::default()
        }),
        ..StartRequest::default()
    };
    let mut stream = envd.start(&req, None).await.expect("start");
    let mut out = String::new();
    while let Some(ev) = stream.next().await {
        match ev.expect("event") {
            ProcessEvent::Data(ProcessOutput::Stdout(b)) => {
                out.push_str(&String::from_utf8_lossy(&b))
            }
            ProcessEvent::End(end) => return (end.shell_code(), out),
            _ => {}
        }
    }
    panic!("no end event");
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

const BROKEN: &str =
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10)\n";
const FIXED: &str =
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))\n";

#[test]
fn openai_agent_writes_runs_fails_fixes_and_keeps_the_sandbox() {
    require_root!();
    let h = Harness::new();
    h.fake.push_all([
        openai_calls(&[call("call_1", "write_file", json!({"path": "fib.py", "content": BROKEN}))]),
        openai_calls(&[call("call_2", "bash", json!({"command": "python3 fib.py"}))]),
        openai_calls(&[call(
            "call_3",
            "edit_file",
            json!({"path": "fib.py", "old_string": "print(fib(10)\n", "new_string": "print(fib(10))\n"}),
        )]),
        openai_calls(&[call("call_4", "bash", json!({"command": "python3 fib.py"}))]),
        Reply::openai_text("fib(10) is 55"),
    ]);
    let out = h.run(
        "openai",
        &["write fib.py printing fib(10)", "--json", "--keep"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    let events = events(&out);
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 4, "{}", debug(&out));
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[1]["exit_code"], 1, "{}", results[1]);
    assert!(
        results[1]["output"]
            .as_str()
            .is_some_and(|o| o.contains("SyntaxError")),
        "{}",
        results[1]
    );
    assert_eq!(
        results[2]["output"],
        "replaced 1 occurrence in /home/user/fib.py"
    );
    assert_eq!(results[3]["exit_code"], 0);
    assert!(
        results[3]["output"]
            .as_str()
            .is_some_and(|o| o.contains("stdout:\n55\n")),
        "{}",
        results[3]
    );
    assert_eq!(of_type(&events, "final_answer")[0]["text"], "fib(10) is 55");
    let finished = of_type(&events, "run_finished")[0];
    assert_eq!(finished["status"], "answered");
    assert_eq!(finished["steps"], 5);
    assert_eq!(finished["usage"]["input_tokens"], 50);
    assert_eq!(finished["usage"]["output_tokens"], 25);
    // The model was sent what really happened in the sandbox.
    let requests = h.fake.requests();
    assert_eq!(requests.len(), 5);
    let third = requests[2].json();
    let last = third["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .expect("messages");
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call_2");
    assert!(
        last["content"]
            .as_str()
            .is_some_and(|c| c.contains("SyntaxError")),
        "{last}"
    );
    // --keep: the sandbox outlives cella; its file is the fixed program and still runs.
    let (socket, pid) = kept(&text(&out.stderr));
    assert!(pid_alive(pid), "the kept sandbox is gone");
    let envd = EnvdClient::unix(socket);
    h.rt.block_on(async {
        assert_eq!(
            exec(&envd, "cat", &["/home/user/fib.py"]).await,
            (0, FIXED.to_owned())
        );
        assert_eq!(
            exec(&envd, "python3", &["fib.py"]).await,
            (0, "55\n".to_owned())
        );
    });
    // SAFETY: kill(2) on the pid the run reported for its kept sandbox.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn anthropic_agent_fixes_a_failing_script_with_live_progress() {
    require_root!();
    let h = Harness::new();
    h.fake.push_all([
        anthropic_calls(&[call(
            "toolu_1",
            "write_file",
            json!({"path": "app/main.py", "content": "print(greeting)\n"}),
        )]),
        anthropic_calls(&[call("toolu_2", "bash", json!({"command": "cd app && python3 main.py"}))]),
        anthropic_calls(&[call(
            "toolu_3",
            "edit_file",
            json!({"path": "app/main.py", "old_string": "print(greeting)", "new_string": "greeting = 'hello'\nprint(greeting)"}),
        )]),
        anthropic_calls(&[
            call("toolu_4", "bash", json!({"command": "cd app && python3 main.py"})),
            call("toolu_5", "read_file", json!({"path": "app/main.py"})),
        ]),
        Reply::anthropic_text("It prints hello."),
    ]);
    let out = h.run("anthropic", &["make app/main.py print hello"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    assert_eq!(text(&out.stdout), "It prints hello.\n");
    assert!(
        stderr.contains("→ write_file: app/main.py (16 bytes)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("→ bash: cd app && python3 main.py"),
        "{stderr}"
    );
    assert!(
        stderr.contains("✗ exit 1 · NameError: name 'greeting' is not defined"),
        "{stderr}"
    );
    assert!(stderr.contains("✓ exit 0 · 1 line of output"), "{stderr}");
    assert!(
        stderr.contains("It prints hello."),
        "model text streams: {stderr}"
    );
    assert!(
        stderr.contains("5 model calls · 50 in / 25 out tokens"),
        "{stderr}"
    );
    // What the sandbox answered reached the model, in Anthropic's format.
    let requests = h.fake.requests();
    let last = requests[4].json()["messages"].to_string();
    assert!(last.contains(r#""tool_use_id":"toolu_5""#), "{last}");
    assert!(
        last.contains("greeting = 'hello'\\nprint(greeting)\\n"),
        "{last}"
    );
    assert!(last.contains("stdout:\\nhello\\n"), "{last}");
}

#[test]
fn tools_report_ambiguous_edits_and_cap_long_output() {
    require_root!();
    let h = Harness::new();
    h.fake.push_all([
        openai_calls(&[
            call("c1", "write_file", json!({"path": "/tmp/x/y.txt", "content": "a\nb\na\n"})),
            call("c2", "edit_file", json!({"path": "/tmp/x/y.txt", "old_string": "a", "new_string": "z"})),
            call("c3", "edit_file", json!({"path": "/tmp/x/y.txt", "old_string": "q", "new_string": "z"})),
            call("c4", "read_file", json!({"path": "/tmp/x/y.txt", "start_line": 2, "end_line": 3})),
            call("c5", "bash", json!({"command": "seq 1 200000"})),
            call("c6", "list_files", json!({"path": "/tmp/x"})),
            call("c7", "run_code", json!({"language": "python", "code": "import sys\nprint('py', sys.version_info[0])"})),
            call("c8", "bash", json!({"command": "sleep 30", "timeout_secs": 0.5})),
            call("c9", "read_file", json!({"path": "/nope.txt"})),
        ]),
        Reply::openai_text("checked"),
    ]);
    let out = h.run("openai", &["exercise the tools", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    let events = events(&out);
    let r = of_type(&events, "tool_result");
    let output = |i: usize| r[i]["output"].as_str().unwrap_or_default().to_owned();
    assert_eq!(r.len(), 9, "{}", debug(&out));
    assert_eq!(r[1]["is_error"], true);
    assert_eq!(
        output(1),
        "edit_file /tmp/x/y.txt: old_string is not unique (2 matches): include more surrounding text, or set replace_all"
    );
    assert_eq!(r[2]["is_error"], true);
    assert!(
        output(2).contains("old_string not found (0 matches)"),
        "{}",
        output(2)
    );
    assert_eq!(output(3), "b\na\n");
    assert_eq!(r[3]["summary"], "6 bytes, 3 lines (lines 2-3 of 3)");
    assert_eq!(r[4]["truncated"], true);
    let seq = output(4);
    assert!(seq.len() < 20_000, "{}", seq.len());
    assert!(seq.contains("stdout:\n1\n2\n3\n"), "head kept");
    assert!(seq.trim_end().ends_with("200000"), "tail kept");
    assert!(
        seq.contains("lines) cut from the middle of 1288895 bytes"),
        "{seq:.300}"
    );
    assert!(
        output(5).contains("/tmp/x/y.txt  (6 bytes)"),
        "{}",
        output(5)
    );
    assert_eq!(r[6]["exit_code"], 0);
    assert!(output(6).contains("py 3"), "{}", output(6));
    assert_eq!(r[7]["exit_code"], Value::Null);
    assert!(output(7).contains("timed out after 0.5 s"), "{}", output(7));
    assert_eq!(r[8]["is_error"], true);
    assert!(
        output(8).starts_with("reading /nope.txt: "),
        "{}",
        output(8)
    );
}

#[test]
fn limits_stop_a_run_with_the_reason() {
    require_root!();
    let h = Harness::new();
    for i in 0..5 {
        h.fake.push(openai_calls(&[call(
            &format!("c{i}"),
            "bash",
            json!({"command": "true"}),
        )]));
    }
    let out = h.run("openai", &["loop forever", "--max-steps", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", debug(&out));
    assert!(text(&out.stdout).is_empty(), "{}", debug(&out));
    assert!(
        text(&out.stderr)
            .contains("cella: stopped: step limit reached: 2 model calls without a final answer"),
        "{}",
        debug(&out)
    );
    let out = h.run("openai", &["loop forever", "--json", "--max-tokens", "20"]);
    assert_eq!(out.status.code(), Some(1), "{}", debug(&out));
    let events = events(&out);
    let stopped = of_type(&events, "stopped");
    assert_eq!(stopped[0]["kind"], "max_tokens", "{}", debug(&out));
    assert_eq!(
        stopped[0]["reason"],
        "token limit reached: used 30 of 20 tokens"
    );
    assert_eq!(of_type(&events, "run_finished")[0]["status"], "stopped");
}

#[test]
fn no_model_configured_fails_at_once_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let out = cella()
        .args(["run", "say hi"])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env_remove("CELLA_MODEL")
        .output()
        .expect("run");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no model configured: set CELLA_MODEL"),
        "{stderr}"
    );
    assert!(stderr.contains("--model"), "{stderr}");
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn unknown_skill_fails_before_any_sandbox() {
    let h = Harness::new();
    let out = h.run("openai", &["t", "--skills", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", debug(&out));
    assert!(
        text(&out.stderr).contains("no skill named \"nope\" was found"),
        "{}",
        debug(&out)
    );
    assert!(h.fake.requests().is_empty());
}

#[test]
fn skills_are_mounted_cataloged_and_activated() {
    require_root!();
    let h = Harness::new();
    let skill = h.dir.path().join(".cella/skills/greeter");
    std::fs::create_dir_all(skill.join("scripts")).expect("mkdir");
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: greeter\ndescription: Greets people. Use when asked to greet.\n---\nRun scripts/greet.sh with the name.\n",
    )
    .expect("write");
    std::fs::write(
        skill.join("scripts/greet.sh"),
        "echo \"hello from the skill, $1\"\n",
    )
    .expect("write");
    h.fake.push_all([
        openai_calls(&[call("c1", "activate_skill", json!({"name": "greeter"}))]),
        openai_calls(&[call("c2", "bash", json!({"command": "bash /skills/greeter/scripts/greet.sh ada; touch /skills/greeter/x"}))]),
        Reply::openai_text("greeted"),
    ]);
    let out = h.run("openai", &["greet ada", "--skills", "greeter", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    let events = events(&out);
    let r = of_type(&events, "tool_result");
    assert!(
        r[0]["output"]
            .as_str()
            .is_some_and(|o| o.contains("Skill directory: /skills/greeter\n")),
        "{}",
        r[0]
    );
    let bash = r[1]["output"].as_str().unwrap_or_default();
    assert!(bash.contains("hello from the skill, ada"), "{bash}");
    assert!(
        bash.contains("Read-only file system"),
        "skills are mounted read-only: {bash}"
    );
    let first = h.fake.requests()[0].json();
    let system = first["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        system.contains("<location>\n/skills/greeter/SKILL.md\n</location>"),
        "{system}"
    );
    let tools = first["tools"].to_string();
    assert!(tools.contains(r#""enum":["greeter"]"#), "{tools}");
}

/// One reflexion task: the model's first program fails a check, the critic explains, the
/// second program passes.
fn reflexion_task(
    task: &str,
    extra: &[&str],
    broken: &str,
    critique: &str,
    fixed: &str,
    failure: &str,
) {
    let h = Harness::new();
    h.fake.push_all([
        Reply::openai_text(&format!("Here it is:\n```python\n{broken}```\n")),
        Reply::openai_text(critique),
        Reply::openai_text(&format!("```python\n{fixed}```")),
    ]);
    let mut args = vec![task, "--strategy", "reflexion", "--json"];
    args.extend_from_slice(extra);
    let out = h.run("openai", &args);
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    let events = events(&out);
    let attempts = of_type(&events, "attempt_started");
    assert_eq!(attempts.len(), 2, "{}", debug(&out));
    let code = of_type(&events, "code_generated");
    assert_eq!(code[0]["code"], broken);
    assert_eq!(code[1]["code"], fixed);
    assert_eq!(code[0]["path"], "/home/user/solution.py");
    let finished = of_type(&events, "attempt_finished");
    assert_eq!(
        (
            finished[0]["success"].clone(),
            finished[1]["success"].clone()
        ),
        (json!(false), json!(true))
    );
    assert_eq!(of_type(&events, "critique")[0]["text"], critique);
    let failed: Vec<_> = of_type(&events, "check")
        .into_iter()
        .filter(|c| c["passed"] == false)
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|c| c["attempt"] == 1),
        "{failed:?}"
    );
    // The critic saw the real failure from the sandbox; the retry saw the critique.
    let requests = h.fake.requests();
    let critic = requests[1].json().to_string();
    assert!(critic.contains(failure), "{critic}");
    let retry = requests[2].json().to_string();
    assert!(retry.contains(&critique[..20]), "{retry}");
    assert!(
        of_type(&events, "final_answer")[0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("attempt 2 of 3 succeeded"))
    );
    assert_eq!(of_type(&events, "run_finished")[0]["steps"], 3);
}

#[test]
fn reflexion_fixes_a_crash_after_the_critique() {
    require_root!();
    reflexion_task(
        "print the word hello reversed",
        &["--expect", "olleh"],
        "print(reverse('hello'))\n",
        "reverse is not defined in Python; use slicing: 'hello'[::-1].",
        "print('hello'[::-1])\n",
        "NameError: name 'reverse' is not defined",
    );
}

#[test]
fn reflexion_fixes_wrong_output_after_the_critique() {
    require_root!();
    reflexion_task(
        "print the sum of the squares of 1 to 10",
        &["--expect", "385"],
        "print(sum(i * i for i in range(10)))\n",
        "range(10) stops at 9 and starts at 0; use range(1, 11).",
        "print(sum(i * i for i in range(1, 11)))\n",
        "stdout does not contain \\\"385\\\"",
    );
}

#[test]
fn reflexion_runs_the_test_command() {
    require_root!();
    reflexion_task(
        "write is_prime(n) in solution.py",
        &[
            "--test-cmd",
            "python3 -c 'from solution import is_prime; assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]'",
        ],
        "def is_prime(n):\n    return n % 2 == 1\n",
        "Odd is not prime: 9 and 15 pass, 2 fails, 1 passes. Test divisors up to sqrt(n).",
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n\nprint(is_prime(7))\n",
        "AssertionError",
    );
}

#[test]
fn reflexion_gives_up_after_the_last_attempt() {
    require_root!();
    let h = Harness::new();
    h.fake.push_all([
        Reply::openai_text("```python\nraise SystemExit(3)\n```"),
        Reply::openai_text("it exits with 3"),
        Reply::openai_text("```python\nraise SystemExit(4)\n```"),
    ]);
    let out = h.run(
        "openai",
        &[
            "exit 0",
            "--strategy",
            "reflexion",
            "--attempts",
            "2",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", debug(&out));
    let events = events(&out);
    let exec = of_type(&events, "execution");
    assert_eq!(
        (exec[0]["exit_code"].clone(), exec[1]["exit_code"].clone()),
        (json!(3), json!(4))
    );
    assert_eq!(
        of_type(&events, "critique").len(),
        1,
        "no critique after the last attempt"
    );
    assert_eq!(
        of_type(&events, "stopped")[0]["reason"],
        "all 2 attempts failed"
    );
}

#[test]
fn interrupt_cancels_the_run_with_exit_130() {
    require_root!();
    let h = Harness::new();
    h.fake.push(openai_calls(&[call(
        "c1",
        "bash",
        json!({"command": "sleep 60"}),
    )]));
    let err_path = h.dir.path().join("stderr.txt");
    let child = cella()
        .args(["run", "wait", "--json", "--model", "openai-compatible/fake"])
        .args(["--base-url", &format!("{}/v1", h.fake.url())])
        .current_dir(h.dir.path())
        .env_remove("CELLA_MODEL")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.fake.requests().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("wait");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stdout));
    let events = events(&out);
    assert_eq!(of_type(&events, "stopped")[0]["kind"], "cancelled");
    assert_eq!(of_type(&events, "tool_call_started").len(), 1);
}

/// A job whose history is more than five times the model's 4096-token window, with real tool
/// runs in a real sandbox: the fake provider rejects (400 `context_length_exceeded`) any prompt
/// over the window (counted with o200k_base), without the user's task or with a tool call split
/// from its result; the run completes, and `recall` finds an elided output and a workspace file.
#[test]
fn a_long_job_fits_a_small_context_window_and_recalls_what_was_elided() {
    require_root!();
    const WINDOW: u32 = 4096;
    const PARTS: u32 = 24;
    const TASK: &str = "Produce the 24 parts of the report with bash, then tell me part 3's \
        checksum and the secret word from notes.md.";
    let h = Harness::new();
    let bpe = std::sync::Arc::new(tiktoken_rs::o200k_base().expect("o200k_base"));
    let log = std::sync::Arc::new(std::sync::Mutex::new((
        0u32,
        Vec::<String>::new(),
        Vec::<String>::new(),
    )));
    {
        let (bpe, log) = (bpe.clone(), log.clone());
        h.fake.respond_with(move |request| {
            let body = request.json();
            let count = |s: &str| bpe.encode_ordinary(s).len();
            let mut log = log.lock().expect("lock");
            if let Err((_, message)) =
                cella_llm::testing::check_openai_request(&body, WINDOW, TASK, &count)
            {
                log.1.push(message.clone());
                return Reply::openai_context_length_exceeded(&message);
            }
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            if messages[0]["content"].as_str().is_some_and(|s| s.starts_with("You compress")) {
                return Reply::openai_text("Parts so far were produced with bash; all exited 0.");
            }
            log.0 += 1;
            let act = log.0;
            let last = messages.last().map(|m| m["content"].as_str().unwrap_or("").to_owned());
            let reply = |id: String, name: &str, args: Value| openai_calls(&[call(&id, name, args)]);
            match act {
                1 => reply("call_notes".into(), "write_file", json!({"path": "notes.md", "content": "# Notes\nThe secret word is pelican.\n"})),
                n if n <= PARTS + 1 => {
                    let p = n - 1;
                    reply(format!("call_{p}"), "bash", json!({"command": format!(
                        "for i in $(seq 1 60); do echo \"part {p} row $i: sku-{p}-$i qty $((i*13%97)) status ok\"; done; echo \"part {p} checksum: CODE-{p}-$(({p}*7919%10007))\""
                    )}))
                }
                n if n == PARTS + 2 => reply("call_r1".into(), "recall", json!({"query": "part 3 checksum"})),
                n if n == PARTS + 3 => {
                    log.2.extend(last);
                    reply("call_r2".into(), "recall", json!({"query": "secret word"}))
                }
                _ => {
                    log.2.extend(last);
                    let code = log.2[0].lines().find_map(|l| l.strip_prefix("part 3 checksum: ")).unwrap_or("unknown").to_owned();
                    let word = if log.2[1].contains("The secret word is pelican") { "pelican" } else { "unknown" };
                    Reply::openai_text(&format!("part 3: {code}; word: {word}"))
                }
            }
        });
    }
    let out = h.run_model(
        "openai",
        "gpt-4o",
        &[
            TASK,
            "--json",
            "--context-window",
            "4096",
            "--answer-reserve",
            "512",
            "--max-steps",
            "60",
        ],
    );
    let (acts, violations, recalled) = log.lock().expect("lock").clone();
    assert!(violations.is_empty(), "{violations:?}\n{}", debug(&out));
    assert_eq!(out.status.code(), Some(0), "{}", debug(&out));
    let events = events(&out);
    assert_eq!(
        of_type(&events, "final_answer")[0]["text"],
        format!("part 3: CODE-3-{}; word: pelican", 3 * 7919 % 10007),
        "{recalled:?}"
    );
    assert_eq!(acts, PARTS + 4);
    let outputs: usize = of_type(&events, "tool_result")
        .iter()
        .map(|r| {
            bpe.encode_ordinary(r["output"].as_str().unwrap_or(""))
                .len()
        })
        .sum();
    assert!(
        outputs >= 5 * WINDOW as usize,
        "tool outputs: {outputs} tokens"
    );
    let compactions = of_type(&events, "context_compacted");
    assert!(
        compactions.iter().any(|c| c["elided"].as_u64() > Some(0)),
        "{compactions:?}"
    );
    assert!(
        compactions
            .iter()
            .any(|c| c["summarized"].as_u64() > Some(0)),
        "{compactions:?}"
    );
    assert!(
        recalled[1].contains("file /home/user/notes.md"),
        "{}",
        recalled[1]
    );
}
