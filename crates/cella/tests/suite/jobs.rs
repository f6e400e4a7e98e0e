//! Jobs end to end through HTTP: a real `cella serve` (real sandboxes, SQLite in its data
//! directory) whose model is a fake OpenAI-compatible provider speaking the real wire format.
//! The fake answers each request from the conversation it carries (the task says what to do,
//! the tool results so far say how far along it is), so any number of jobs can run at once.
//!
//! Covered: submit → events live over SSE and WebSocket → complete, resuming with
//! Last-Event-ID, the files the agent wrote in artifacts.zip, cancel mid-run (sandbox killed),
//! the watchdog, tenant scoping, the legacy routes, the OpenAPI document against the routes,
//! SIGKILL of the server with 10 jobs in flight, and 200 jobs under concurrency limits.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cella_llm::testing::{FakeProvider, RecordedRequest, Reply};
use serde_json::{Value, json};

use super::support::{ServeProcess, serve_command};
use crate::require_root;

/// What the fake model does, chosen by a word in the task.
fn respond(req: &RecordedRequest) -> Reply {
    let body = req.json();
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let task = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned();
    let step = messages.iter().filter(|m| m["role"] == "tool").count();
    let call = |name: &str, args: Value| {
        Reply::openai_tool_calls(&[(&format!("call_{step}"), name, &args.to_string())])
    };
    // The provider is overloaded for the first three calls of a FLAKY job.
    static FLAKY_FAILURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if task.contains("FLAKY")
        && FLAKY_FAILURES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3
    {
        return Reply::openai_error(503, "the fake provider is overloaded");
    }
    if task.contains("SKILL") {
        return match step {
            0 => call("activate_skill", json!({"name": "greeter"})),
            1 => call("bash", json!({"command": "cat /skills/greeter/notes.txt"})),
            _ => Reply::openai_text("greeted"),
        };
    }
    if task.contains("WRITE") {
        match step {
            0 => call(
                "write_file",
                json!({"path": "out/result.txt", "content": "hello from the job\n"}),
            ),
            1 => call(
                "bash",
                json!({"command": "cat out/result.txt; echo written > out/second.txt"}),
            ),
            // The answer comes late, so a watcher sees the run before it ends.
            _ => Reply::openai_text("the file says hello from the job").delay(
                Duration::from_millis(if task.contains("SLOW") { 1500 } else { 0 }),
            ),
        }
    } else if task.contains("SLEEP") {
        match step {
            0 => call(
                "bash",
                json!({"command": "echo started > marker.txt; sleep 600", "timeout": 900}),
            ),
            _ => Reply::openai_text("slept"),
        }
    } else if task.contains("SILENT") {
        // No answer for a long time: nothing happens, the watchdog must notice.
        Reply::openai_text("too late").delay(Duration::from_secs(30))
    } else {
        match step {
            0 => call("bash", json!({"command": "echo fast > fast.txt"})),
            _ => Reply::openai_text("fast done"),
        }
    }
}

/// The fake provider on its own runtime.
struct Model {
    _rt: tokio::runtime::Runtime,
    fake: FakeProvider,
}

impl Model {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = rt.block_on(FakeProvider::start()).expect("fake provider");
        fake.respond_with(respond);
        Model { _rt: rt, fake }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A `cella serve` with jobs, killed (SIGKILL) when dropped.
struct Server {
    process: ServeProcess,
    port: u16,
    data: PathBuf,
    key: String,
    model_url: String,
    args: Vec<String>,
    log: PathBuf,
}

impl Server {
    fn start(data: &Path, model: &Model, args: &[&str]) -> Server {
        let port = free_port();
        let log = data.join("serve.log");
        let mut s = Server {
            process: ServeProcess::new(spawn(data, port, model.fake.url(), args, &log), data),
            port,
            data: data.to_owned(),
            key: String::new(),
            model_url: model.fake.url().to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            log,
        };
        s.wait_ready();
        s.key = std::fs::read_to_string(data.join("admin.key"))
            .expect("admin.key")
            .trim()
            .to_owned();
        s
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.process.child().try_wait() {
                panic!("cella serve exited ({status}):\n{}", self.log_text());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.data.join("admin.key").exists()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cella serve did not start:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, then a new process on the same port and data directory.
    fn kill_and_restart(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.process
            .restart(|| spawn(&self.data, self.port, &self.model_url, &args, &self.log));
        self.wait_ready();
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn api(&self) -> Api {
        Api {
            port: self.port,
            key: self.key.clone(),
        }
    }

    /// A key of a new tenant.
    fn other_tenant_key(&self, name: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_cella"))
            .args(["keys", "create", "--tenant", name, "--data-dir"])
            .arg(&self.data)
            .output()
            .expect("cella keys create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `cella jobs ARGS` against this server.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_cella"))
            .arg("jobs")
            .args(args)
            .env("CELLA_URL", self.url())
            .env("CELLA_API_KEY", &self.key)
            .stdin(Stdio::null())
            .output()
            .expect("cella jobs")
    }
}

fn spawn(data: &Path, port: u16, model_url: &str, args: &[&str], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    serve_command(data, port)
        .args(args)
        .env("CELLA_MODEL", "openai-compatible/fake-model")
        .env("CELLA_BASE_URL", format!("{model_url}/v1"))
        .env_remove("CELLA_API_KEY")
        .env_remove("CELLA_NODE")
        .env("CELLA_LOG", "info")
        .stderr(log)
        .spawn()
        .expect("start cella serve")
}

/// A blocking HTTP/1.1 client (one connection per request, `Connection: close`).
struct Api {
    port: u16,
    key: String,
}

struct HttpResponse {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl HttpResponse {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Api {
    fn with_key(&self, key: &str) -> Api {
        Api {
            port: self.port,
            key: key.to_owned(),
        }
    }

    fn connect(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-API-Key: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.port,
            self.key,
            body.len()
        );
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).expect("write");
        s.write_all(body.as_bytes()).expect("write body");
        s
    }

    /// A request with a raw body of `content_type`.
    fn upload(&self, path: &str, content_type: &str, body: &[u8]) -> HttpResponse {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-API-Key: {}\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.port,
            self.key,
            body.len()
        );
        s.write_all(head.as_bytes()).expect("write");
        s.write_all(body).expect("write body");
        read_response(BufReader::new(s))
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> HttpResponse {
        let s = self.connect(method, path, body, &[]);
        read_response(BufReader::new(s))
    }

    fn get(&self, path: &str) -> HttpResponse {
        self.request("GET", path, None)
    }

    fn submit(&self, body: Value) -> String {
        let r = self.request("POST", "/v1/jobs", Some(&body));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["id"].as_str().expect("id").to_owned()
    }

    fn job(&self, id: &str) -> Value {
        let r = self.get(&format!("/v1/jobs/{id}"));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    /// Polls until the job has a final status.
    fn wait_final(&self, id: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let job = self.job(id);
            if matches!(
                job["status"].as_str(),
                Some("complete" | "error" | "cancelled")
            ) {
                return job;
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {job}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Opens the SSE stream; each event goes to the returned channel with its arrival time.
    fn sse(
        &self,
        id: &str,
        last_event_id: Option<i64>,
    ) -> std::sync::mpsc::Receiver<(Instant, SseEvent)> {
        let last = last_event_id.map(|n| n.to_string());
        let mut extra = vec![("Accept", "text/event-stream")];
        if let Some(l) = &last {
            extra.push(("Last-Event-ID", l.as_str()));
        }
        let s = self.connect("GET", &format!("/v1/jobs/{id}/events"), None, &extra);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(s);
            let (status, headers) = read_head(&mut r);
            assert_eq!(status, 200);
            assert!(
                headers["content-type"].starts_with("text/event-stream"),
                "{headers:?}"
            );
            let mut body = Dechunk::new(
                r,
                headers
                    .get("transfer-encoding")
                    .is_some_and(|t| t == "chunked"),
            );
            let mut ev = SseEvent::default();
            let mut line = String::new();
            loop {
                line.clear();
                if body.read_line(&mut line) == 0 {
                    return;
                }
                let l = line.trim_end_matches(['\r', '\n']);
                if l.is_empty() {
                    if !ev.data.is_empty()
                        && tx.send((Instant::now(), std::mem::take(&mut ev))).is_err()
                    {
                        return;
                    }
                    ev = SseEvent::default();
                } else if let Some(v) = l.strip_prefix("id:") {
                    ev.id = v.trim().parse().ok();
                } else if let Some(v) = l.strip_prefix("event:") {
                    ev.event = v.trim().to_owned();
                } else if let Some(v) = l.strip_prefix("data:") {
                    ev.data.push_str(v.trim_start());
                }
            }
        });
        rx
    }
}

#[derive(Debug, Default, Clone)]
struct SseEvent {
    id: Option<i64>,
    event: String,
    data: String,
}

impl SseEvent {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).expect("event data is JSON")
    }
}

fn read_head(r: &mut impl BufRead) -> (u16, BTreeMap<String, String>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    (status, headers)
}

fn read_response(mut r: impl BufRead) -> HttpResponse {
    let (status, headers) = read_head(&mut r);
    let mut body = Vec::new();
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|t| t == "chunked");
    let mut d = Dechunk::new(r, chunked);
    let mut buf = [0u8; 65536];
    loop {
        let n = d.read(&mut buf);
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// A reader of a (maybe chunked) HTTP body; a cut connection is an end.
struct Dechunk<R: BufRead> {
    inner: R,
    chunked: bool,
    left: usize,
    done: bool,
}

impl<R: BufRead> Dechunk<R> {
    fn new(inner: R, chunked: bool) -> Self {
        Dechunk {
            inner,
            chunked,
            left: 0,
            done: false,
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> usize {
        if self.done {
            return 0;
        }
        if !self.chunked {
            return self.inner.read(buf).unwrap_or(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            if self.inner.read_line(&mut size).unwrap_or(0) == 0 {
                self.done = true;
                return 0;
            }
            if size.trim().is_empty() {
                size.clear();
                if self.inner.read_line(&mut size).unwrap_or(0) == 0 {
                    self.done = true;
                    return 0;
                }
            }
            self.left = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if self.left == 0 {
                self.done = true;
                return 0;
            }
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n]).unwrap_or(0);
        if got == 0 {
            self.done = true;
        }
        self.left -= got;
        got
    }

    fn read_line(&mut self, line: &mut String) -> usize {
        let mut byte = [0u8; 1];
        let mut bytes = Vec::new();
        loop {
            if self.read(&mut byte) == 0 {
                break;
            }
            bytes.push(byte[0]);
            if byte[0] == b'\n' {
                break;
            }
        }
        line.push_str(&String::from_utf8_lossy(&bytes));
        bytes.len()
    }
}

/// Events until `job_finished` (or the stream's end), failing after `limit`.
fn collect_until_finished(
    rx: &std::sync::mpsc::Receiver<(Instant, SseEvent)>,
    limit: Duration,
) -> Vec<(Instant, SseEvent)> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(item) => {
                let last = item.1.event == "job_finished";
                out.push(item);
                if last {
                    return out;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return out,
            Err(e) => panic!(
                "no job_finished within {limit:?} ({e}); got {:?}",
                out.iter().map(|(_, e)| &e.event).collect::<Vec<_>>()
            ),
        }
    }
}

#[test]
fn a_job_runs_to_completion_and_its_events_stream_live_over_sse() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let server = Server::start(data.path(), &model, &[]);
    let api = server.api();

    let id = api.submit(json!({
        "task": "WRITE a file then answer SLOW",
        "metadata": {"ticket": "T-1"},
        "limits": {"max_steps": 10, "timeout_secs": 120},
    }));
    assert!(id.starts_with("job_"), "{id}");
    let stream = api.sse(&id, None);
    // Live: a tool result arrives while the job is still running (the answer is 1.5 s late).
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (at, ev) = stream
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("events arrive");
        let is_result = ev.event == "tool_result";
        events.push((at, ev));
        if is_result {
            break;
        }
    }
    let during = api.job(&id);
    assert_eq!(during["status"], "running", "{during}");
    assert!(
        during["sandbox_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{during}"
    );
    events.extend(collect_until_finished(&stream, Duration::from_secs(60)));

    let kinds: Vec<&str> = events.iter().map(|(_, e)| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"job_started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"job_finished"), "{kinds:?}");
    for k in [
        "sandbox_created",
        "run_started",
        "tool_call_started",
        "tool_result",
        "final_answer",
        "run_finished",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    // SSE ids are the seqs 1, 2, 3…, and each data carries its own seq and type.
    let seqs: Vec<i64> = events.iter().map(|(_, e)| e.id.expect("id")).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    for (_, e) in &events {
        let v = e.json();
        assert_eq!(v["seq"], json!(e.id));
        assert_eq!(v["type"], e.event);
    }
    let finished = events.last().expect("last").1.json();
    assert_eq!(finished["data"]["status"], "complete");
    assert_eq!(
        finished["data"]["final_answer"],
        "the file says hello from the job"
    );
    // The result of `cat` came from the sandbox.
    let cat = events
        .iter()
        .find(|(_, e)| e.event == "tool_result" && e.json()["data"]["name"] == "bash")
        .expect("bash result")
        .1
        .json();
    assert!(
        cat["data"]["output"]
            .as_str()
            .unwrap_or("")
            .contains("hello from the job"),
        "{cat}"
    );

    let job = api.job(&id);
    assert_eq!(job["status"], "complete", "{job}");
    assert_eq!(job["final_answer"], "the file says hello from the job");
    assert_eq!(job["metadata"]["ticket"], "T-1");
    assert_eq!(job["attempts"], 1);
    assert_eq!(job["usage"]["steps"], 3, "{job}");
    assert!(
        job["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0,
        "{job}"
    );
    for t in ["created_at", "started_at", "finished_at", "last_event_at"] {
        assert!(job[t].is_string(), "{t} missing: {job}");
    }
    assert_eq!(job["events"], json!(seqs.len()));
    // The job's sandbox is gone.
    let sandbox = job["sandbox_id"].as_str().expect("sandbox id");
    let sb = api.get(&format!("/sandboxes/{sandbox}"));
    assert_eq!(sb.status, 404, "{}", String::from_utf8_lossy(&sb.body));

    // Resuming with Last-Event-ID replays only what followed.
    let resumed = collect_until_finished(&api.sse(&id, Some(3)), Duration::from_secs(10));
    let resumed_seqs: Vec<i64> = resumed.iter().map(|(_, e)| e.id.expect("id")).collect();
    assert_eq!(resumed_seqs, (4..=seqs.len() as i64).collect::<Vec<_>>());
    // Past the end: an empty stream that ends.
    assert!(
        collect_until_finished(&api.sse(&id, Some(10_000)), Duration::from_secs(10)).is_empty()
    );
}

/// The job's events over a WebSocket, until the server closes it.
fn websocket_events(server: &Server, id: &str, after: i64) -> Vec<Value> {
    use futures::StreamExt as _;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let url = format!(
            "ws://127.0.0.1:{}/v1/jobs/{id}/events?after={after}",
            server.port
        );
        let mut req = url.into_client_request().expect("request");
        req.headers_mut()
            .insert("x-api-key", server.key.parse().expect("header"));
        let (mut ws, resp) = tokio_tungstenite::connect_async(req)
            .await
            .expect("websocket");
        assert_eq!(resp.status().as_u16(), 101);
        let mut out = Vec::new();
        let read = async {
            while let Some(msg) = ws.next().await {
                match msg.expect("message") {
                    Message::Text(t) => out.push(serde_json::from_str::<Value>(&t).expect("json")),
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the websocket ends after the job's last event");
        out
    })
}

fn zip_entries(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).expect("a valid zip");
    let mut out = BTreeMap::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).expect("entry");
        let mut content = Vec::new();
        f.read_to_end(&mut content).expect("read entry");
        out.insert(f.name().expect("entry name").into_owned(), content);
    }
    out
}

#[test]
fn artifacts_websocket_cli_legacy_routes_tenants_and_the_openapi_document() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let server = Server::start(data.path(), &model, &["--jobs-artifacts-max", "1K"]);
    let api = server.api();

    // The CLI: submit, watch (JSON lines until the end), get, ls, artifacts.
    let out = server.cli(&["submit", "WRITE two files", "--json", "-m", "via=cli"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = serde_json::from_slice::<Value>(&out.stdout).expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let watched = server.cli(&["watch", &id, "--json"]);
    assert!(
        watched.status.success(),
        "{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&watched.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.last().expect("events")["type"], "job_finished");
    assert_eq!(lines.last().expect("events")["data"]["status"], "complete");
    let got = server.cli(&["get", &id, "--json"]);
    let job: Value = serde_json::from_slice(&got.stdout).expect("json");
    assert_eq!(job["status"], "complete");
    assert_eq!(job["metadata"]["via"], "cli");
    let human = server.cli(&["get", &id]);
    assert!(
        String::from_utf8_lossy(&human.stdout)
            .contains("answer:   the file says hello from the job")
    );
    let listed = server.cli(&["ls", "--status", "complete", "--json"]);
    let page: Value = serde_json::from_slice(&listed.stdout).expect("json");
    assert!(
        page["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .any(|j| j["id"] == id)
    );
    let zip_path = data.path().join("artifacts.zip");
    let dl = server.cli(&["artifacts", &id, "-o", zip_path.to_str().expect("path")]);
    assert!(
        dl.status.success(),
        "{}",
        String::from_utf8_lossy(&dl.stderr)
    );
    let files = zip_entries(&std::fs::read(&zip_path).expect("zip file"));
    assert_eq!(
        files.get("out/result.txt").map(Vec::as_slice),
        Some(&b"hello from the job\n"[..]),
        "{:?}",
        files.keys()
    );
    assert_eq!(
        files.get("out/second.txt").map(Vec::as_slice),
        Some(&b"written\n"[..])
    );
    // Over HTTP too, as a zip.
    let raw = api.get(&format!("/v1/jobs/{id}/artifacts.zip"));
    assert_eq!(raw.status, 200);
    assert_eq!(raw.headers["content-type"], "application/zip");
    assert_eq!(zip_entries(&raw.body), files);

    // The same events over a WebSocket, and resumed after a seq.
    let ws = websocket_events(&server, &id, 0);
    let ws_types: Vec<&str> = ws
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    let sse_types: Vec<&str> = lines
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ws_types, sse_types);
    let tail = websocket_events(&server, &id, 5);
    assert_eq!(tail.first().expect("tail")["seq"], 6);

    // A workspace over the cap is refused with a clear error.
    let big = api.submit(json!({"task": "FAST then BIG"}));
    api.wait_final(&big, Duration::from_secs(60));
    std::fs::write(
        data.path()
            .join("jobs")
            .join(&big)
            .join("workspace")
            .join("big.bin"),
        vec![0u8; 5000],
    )
    .expect("grow the workspace");
    let refused = api.get(&format!("/v1/jobs/{big}/artifacts.zip"));
    assert_eq!(refused.status, 413);
    let msg = refused.json()["message"].as_str().unwrap_or("").to_owned();
    assert!(
        msg.contains("over the artifacts limit of 1024 bytes"),
        "{msg}"
    );

    // The original design's routes.
    let scheduled = api.request("POST", "/schedule", Some(&json!({"task": "FAST legacy"})));
    assert_eq!(scheduled.status, 201);
    let legacy = scheduled.json()["job_id"]
        .as_str()
        .expect("job_id")
        .to_owned();
    api.wait_final(&legacy, Duration::from_secs(60));
    let status = api.get(&format!("/status/{legacy}")).json();
    assert_eq!(status["status"], "complete");
    let url = status["download_url"].as_str().expect("download_url");
    let path = url
        .strip_prefix(&server.url())
        .expect("an absolute url of this server");
    let legacy_zip = zip_entries(&api.get(path).body);
    assert_eq!(
        legacy_zip.get("fast.txt").map(Vec::as_slice),
        Some(&b"fast\n"[..])
    );

    // Another tenant sees none of it.
    let other = api.with_key(&server.other_tenant_key("other"));
    for path in [
        format!("/v1/jobs/{id}"),
        format!("/v1/jobs/{id}/events"),
        format!("/v1/jobs/{id}/artifacts.zip"),
        format!("/status/{id}"),
    ] {
        assert_eq!(other.get(&path).status, 404, "{path}");
    }
    assert_eq!(
        other
            .request("POST", &format!("/v1/jobs/{id}/cancel"), None)
            .status,
        404
    );
    assert_eq!(other.get("/v1/jobs").json()["jobs"], json!([]));

    // Bad input: precise errors, nothing queued.
    let before = api.get("/v1/jobs?limit=1000").json()["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    for (body, needle) in [
        (json!({}), "task"),
        (json!({"task": " "}), "task is required"),
        (
            json!({"task": "x", "strategy": "guess"}),
            "unknown strategy",
        ),
        (json!({"task": "x", "template": "nope"}), "unknown template"),
        (
            json!({"task": "x", "limits": {"timeout_secs": 0}}),
            "timeout_secs",
        ),
        (
            json!({"task": "x", "limits": {"steps": 3}}),
            "unknown field",
        ),
        (
            json!({"task": "x", "skills": ["missing-skill"]}),
            "unknown skill",
        ),
    ] {
        let r = api.request("POST", "/v1/jobs", Some(&body));
        assert_eq!(r.status, 400, "{body}");
        let m = r.json()["message"].as_str().unwrap_or("").to_owned();
        assert!(m.contains(needle), "{body}: {m}");
    }
    assert_eq!(api.get("/v1/jobs?status=done").status, 400);
    assert_eq!(api.get("/v1/jobs?cursor=garbage!").status, 400);
    assert_eq!(api.with_key("e2b_nope").get("/v1/jobs").status, 401);
    let after = api.get("/v1/jobs?limit=1000").json()["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(before, after);

    // The OpenAPI document: 3.1, and every operation it describes is routed.
    let doc = api.get("/v1/openapi.json").json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    let described: Vec<&str> = paths.keys().map(String::as_str).collect();
    assert_eq!(
        described,
        [
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/artifacts.zip",
            "/v1/jobs/{id}/cancel",
            "/v1/jobs/{id}/events",
            "/v1/openapi.json"
        ]
    );
    for (path, ops) in paths {
        for method in ops.as_object().expect("operations").keys() {
            let concrete = path.replace("{id}", &id);
            let body =
                (method == "post" && path == "/v1/jobs").then(|| json!({"task": "FAST openapi"}));
            let r = api.request(&method.to_uppercase(), &concrete, body.as_ref());
            let declared = ops[method]["responses"].as_object().expect("responses");
            assert!(
                declared.contains_key(&r.status.to_string()),
                "{method} {path} answered {} which the document does not declare",
                r.status
            );
            assert!(r.status < 300, "{method} {path}: {}", r.status);
        }
    }
    if let Some(venv) = std::env::var_os("CELLA_TEST_VENV") {
        let python = Path::new(&venv).join("bin/python");
        let spec = data.path().join("openapi.json");
        std::fs::write(&spec, doc.to_string()).expect("write spec");
        let check = Command::new(python)
            .args(["-c", "import sys; from openapi_spec_validator import validate; from openapi_spec_validator.readers import read_from_filename; validate(read_from_filename(sys.argv[1])[0]); print('valid')"])
            .arg(&spec)
            .output()
            .expect("python");
        assert!(
            String::from_utf8_lossy(&check.stdout).contains("valid"),
            "openapi-spec-validator: {}",
            String::from_utf8_lossy(&check.stderr)
        );
    } else {
        eprintln!(
            "openapi-spec-validator not run: CELLA_TEST_VENV is not set (./scripts/test sets it)"
        );
    }
}

#[test]
fn cancel_mid_run_kills_the_sandbox() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let server = Server::start(data.path(), &model, &[]);
    let api = server.api();
    let id = api.submit(json!({"task": "SLEEP for a long time"}));
    let stream = api.sse(&id, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while stream
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("events")
        .1
        .event
        != "tool_call_started"
    {}
    let marker = data
        .path()
        .join("jobs")
        .join(&id)
        .join("workspace")
        .join("marker.txt");
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the sleep never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sandbox = api.job(&id)["sandbox_id"]
        .as_str()
        .expect("sandbox")
        .to_owned();
    let pid = super::e2b_sdk::find_init_pid(data.path(), &sandbox);
    let started = Instant::now();
    let cancelled = api.request("POST", &format!("/v1/jobs/{id}/cancel"), None);
    assert_eq!(cancelled.status, 200);
    let job = cancelled.json();
    assert_eq!(job["status"], "cancelled", "{job}");
    assert_eq!(job["error"], "cancelled by request");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The sandbox is gone: its init process and its record.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sandbox init {pid} still alive"
    );
    assert_eq!(api.get(&format!("/sandboxes/{sandbox}")).status, 404);
    let last = collect_until_finished(&stream, Duration::from_secs(10));
    let finished = last.last().expect("events").1.json();
    assert_eq!(finished["type"], "job_finished");
    assert_eq!(finished["data"]["status"], "cancelled");
    // Cancelling again changes nothing; a pending job is cancelled at once.
    assert_eq!(
        api.request("POST", &format!("/v1/jobs/{id}/cancel"), None)
            .json()["status"],
        "cancelled"
    );
}

#[test]
fn the_watchdog_cancels_a_job_that_goes_quiet() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let server = Server::start(data.path(), &model, &["--jobs-watchdog", "2s"]);
    let api = server.api();
    let id = api.submit(json!({"task": "SILENT model"}));
    let job = api.wait_final(&id, Duration::from_secs(30));
    assert_eq!(job["status"], "cancelled", "{job}");
    assert_eq!(job["error"], "watchdog: no event for 2 s", "{job}");
}

#[test]
fn no_job_is_lost_when_the_server_is_killed_with_ten_in_flight() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start(
        data.path(),
        &model,
        &["--jobs-max-running", "10", "--jobs-max-per-tenant", "10"],
    );
    let api = server.api();
    let running: Vec<String> = (0..10)
        .map(|i| api.submit(json!({"task": format!("SLEEP {i}")})))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in &running {
        let marker = data
            .path()
            .join("jobs")
            .join(id)
            .join("workspace")
            .join("marker.txt");
        while !marker.exists() {
            assert!(
                Instant::now() < deadline,
                "job {id} never got going:\n{}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Queued behind them (the node is full): these must run after the restart.
    let queued: Vec<String> = (0..3)
        .map(|i| api.submit(json!({"task": format!("FAST queued {i}")})))
        .collect();
    for id in &queued {
        assert_eq!(api.job(id)["status"], "pending");
    }
    let sandboxes: Vec<String> = running
        .iter()
        .map(|id| {
            api.job(id)["sandbox_id"]
                .as_str()
                .expect("sandbox")
                .to_owned()
        })
        .collect();

    server.kill_and_restart();
    for id in &running {
        let job = api.wait_final(id, Duration::from_secs(60));
        assert_eq!(job["status"], "error", "{job}");
        assert_eq!(job["error"], "interrupted by restart", "{job}");
    }
    for id in &queued {
        let job = api.wait_final(id, Duration::from_secs(120));
        assert_eq!(job["status"], "complete", "{job}");
    }
    for sb in &sandboxes {
        assert_eq!(
            api.get(&format!("/sandboxes/{sb}")).status,
            404,
            "sandbox {sb} survived its job"
        );
    }
    let stuck = api.get("/v1/jobs?status=running").json();
    assert_eq!(stuck["jobs"], json!([]));
    let pending = api.get("/v1/jobs?status=pending").json();
    assert_eq!(pending["jobs"], json!([]));
}

/// Largest number of the half-open intervals `[start, end)` that overlap.
fn max_overlap(intervals: &[(i64, i64)]) -> usize {
    let mut points: Vec<(i64, i32)> = Vec::new();
    for (s, e) in intervals {
        points.push((*s, 1));
        points.push((*e, -1));
    }
    // Ends before starts at the same instant.
    points.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in points {
        now += d;
        max = max.max(now);
    }
    max as usize
}

fn millis(v: &Value) -> i64 {
    chrono_like(v.as_str().expect("timestamp"))
}

/// Milliseconds of an RFC 3339 UTC timestamp with milliseconds (`…T12:00:00.123Z`).
fn chrono_like(t: &str) -> i64 {
    let (date, time) = t.trim_end_matches('Z').split_once('T').expect("T");
    let d: Vec<i64> = date.split('-').map(|x| x.parse().expect("date")).collect();
    let (hms, ms) = time.split_once('.').unwrap_or((time, "0"));
    let h: Vec<i64> = hms.split(':').map(|x| x.parse().expect("time")).collect();
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + h[0]) * 60 + h[1]) * 60_000 + h[2] * 1000 + ms.parse::<i64>().expect("ms")
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn two_hundred_jobs_complete_within_the_concurrency_limits() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let (node_limit, tenant_limit) = (6usize, 4usize);
    let server = Server::start(
        data.path(),
        &model,
        &["--jobs-max-running", "6", "--jobs-max-per-tenant", "4"],
    );
    let tenants = [
        server.api(),
        server.api().with_key(&server.other_tenant_key("second")),
    ];
    let started = Instant::now();
    // 100 jobs per tenant, submitted at once from one thread per tenant.
    let ids: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = tenants
            .iter()
            .map(|api| {
                scope.spawn(move || {
                    (0..100)
                        .map(|i| api.submit(json!({"task": format!("FAST {i}")})))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("submitter"))
            .collect()
    });
    let mut all = Vec::new();
    let mut per_tenant = Vec::new();
    for (api, ids) in tenants.iter().zip(&ids) {
        let mut intervals = Vec::new();
        for id in ids {
            let job = api.wait_final(id, Duration::from_secs(600));
            assert_eq!(job["status"], "complete", "{job}");
            assert_eq!(job["attempts"], 1, "{job}");
            let (c, s, f) = (
                millis(&job["created_at"]),
                millis(&job["started_at"]),
                millis(&job["finished_at"]),
            );
            intervals.push((s, f));
            all.push((c, s, f));
        }
        per_tenant.push(max_overlap(&intervals));
    }
    let wall = started.elapsed();
    let total = max_overlap(&all.iter().map(|(_, s, f)| (*s, *f)).collect::<Vec<_>>());
    for (i, n) in per_tenant.iter().enumerate() {
        assert!(
            *n <= tenant_limit,
            "tenant {i} had {n} jobs running at once (limit {tenant_limit})"
        );
    }
    assert!(
        total <= node_limit,
        "{total} jobs ran at once (limit {node_limit})"
    );
    // Queueing delay (created → started) and dispatch delay (a slot freed → the next job in it).
    let mut queue: Vec<i64> = all.iter().map(|(c, s, _)| s - c).collect();
    queue.sort_unstable();
    let mut finishes: Vec<i64> = all.iter().map(|(_, _, f)| *f).collect();
    finishes.sort_unstable();
    let mut dispatch: Vec<i64> = all
        .iter()
        .filter_map(|(c, s, _)| {
            let freed = finishes.iter().rev().find(|f| **f <= *s)?;
            Some(s - (*freed).max(*c))
        })
        .collect();
    dispatch.sort_unstable();
    eprintln!(
        "200 jobs in {:.1} s; max concurrent {total} (limit {node_limit}), per tenant {per_tenant:?} (limit {tenant_limit}); \
         scheduling delay created→started p50 {} ms p99 {} ms; dispatch delay slot-free→started p50 {} ms p99 {} ms",
        wall.as_secs_f64(),
        percentile(&queue, 0.5),
        percentile(&queue, 0.99),
        percentile(&dispatch, 0.5),
        percentile(&dispatch, 0.99),
    );
    assert!(
        total >= 2,
        "jobs never ran concurrently ({total}): the limits were not exercised"
    );
}

#[test]
fn a_run_failing_on_transient_model_errors_is_retried() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    // No retries inside the HTTP client: the agent repeats a call twice, then the run fails
    // and the runner queues the job again.
    std::fs::write(
        data.path().join("cella.toml"),
        "[model]\nmax_retries = 0\nretry_backoff_ms = 10\n",
    )
    .expect("cella.toml");
    let server = Server::start(data.path(), &model, &[]);
    let api = server.api();
    let id = api.submit(json!({"task": "FLAKY then FAST"}));
    let job = api.wait_final(&id, Duration::from_secs(60));
    assert_eq!(job["status"], "complete", "{job}");
    assert_eq!(job["attempts"], 2, "{job}");
    let events = collect_until_finished(&api.sse(&id, None), Duration::from_secs(10));
    let kinds: Vec<&str> = events.iter().map(|(_, e)| e.event.as_str()).collect();
    let retry = kinds
        .iter()
        .position(|k| *k == "job_retry")
        .expect("a job_retry event");
    assert_eq!(
        kinds.iter().filter(|k| **k == "job_started").count(),
        2,
        "{kinds:?}"
    );
    assert!(
        kinds[..retry].contains(&"warning"),
        "the agent repeated the call first: {kinds:?}"
    );
    let reason = events[retry].1.json()["data"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(reason.contains("overloaded"), "{reason}");
}

#[test]
fn a_job_uses_a_skill_from_the_tenants_registry() {
    require_root!();
    let model = Model::start();
    let data = tempfile::tempdir().expect("tempdir");
    let server = Server::start(data.path(), &model, &[]);
    let api = server.api();
    let skill = super::skills_registry::zip_of(&[
        (
            "greeter/SKILL.md",
            b"---\nname: greeter\ndescription: Greets people politely.\n---\nAlways greet with GREETINGS-FROM-THE-SKILL.\n",
        ),
        ("greeter/notes.txt", b"notes of the greeter skill\n"),
    ]);
    let up = api.upload("/v1/skills", "application/zip", &skill);
    assert!(
        up.status < 300,
        "{} {}",
        up.status,
        String::from_utf8_lossy(&up.body)
    );
    let id = api.submit(json!({"task": "SKILL greet me", "skills": ["greeter"]}));
    let job = api.wait_final(&id, Duration::from_secs(60));
    assert_eq!(job["status"], "complete", "{job}");
    assert_eq!(job["skills"], json!(["greeter"]));
    let events = collect_until_finished(&api.sse(&id, None), Duration::from_secs(10));
    let results: Vec<Value> = events
        .iter()
        .filter(|(_, e)| e.event == "tool_result")
        .map(|(_, e)| e.json()["data"].clone())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        results[0]["output"]
            .as_str()
            .unwrap_or("")
            .contains("GREETINGS-FROM-THE-SKILL"),
        "{}",
        results[0]
    );
    assert!(
        results[1]["output"]
            .as_str()
            .unwrap_or("")
            .contains("notes of the greeter skill"),
        "{}",
        results[1]
    );
    // Another tenant has no such skill.
    let other = api.with_key(&server.other_tenant_key("other"));
    let refused = other.request(
        "POST",
        "/v1/jobs",
        Some(&json!({"task": "x", "skills": ["greeter"]})),
    );
    assert_eq!(refused.status, 400);
}
