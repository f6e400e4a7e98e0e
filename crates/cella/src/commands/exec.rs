//! `cella exec`: one command in a fresh sandbox. Output streams live; the exit code is the
//! command's (124 when `--timeout` killed it, 137 when the memory limit did); the sandbox is
//! destroyed afterwards whatever happens.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use cella_proto::Code;
use cella_proto::process::{
    ProcessConfig, ProcessEvent, ProcessInput, ProcessOutput, ProcessSelector, SendInputRequest,
    SendSignalRequest, Signal, StartRequest,
};
use cella_sandbox::backend::Backend;
use cella_sandbox::spec::{self, Limits, Network, SandboxSpec, WORKSPACE};
use cella_sandbox::{ClientError, EnvdClient};

/// Resource and isolation options shared by the commands that create local sandboxes.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxOptions {
    /// Template the sandbox's root filesystem comes from (`cella template ls` lists them).
    #[arg(long, default_value = "base")]
    pub template: String,
    /// Memory limit (e.g. 512M, 2G) [default: the template's, else 512M].
    #[arg(long, value_parser = spec::parse_size)]
    pub memory: Option<u64>,
    /// CPU limit in cores (e.g. 1, 0.5, 2) [default: the template's, else 1].
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads [default: the template's, else 256].
    #[arg(long)]
    pub pids: Option<u32>,
    /// Size of the writable layer (root, home and /tmp together) [default: the template's,
    /// else 1G].
    #[arg(long, value_parser = spec::parse_size)]
    pub disk: Option<u64>,
    /// Network access through the host's egress proxy: `none`, `internet` (public addresses),
    /// `allow:LIST` and `deny:LIST` (LIST: example.com, *.example.com, 10.0.0.0/8, 1.2.3.4),
    /// combined with `;` (e.g. `internet;deny:*.example.com`). Private, loopback and link-local
    /// addresses need an explicit CIDR in allow.
    #[arg(long, default_value = "none")]
    pub network: Network,
    /// Environment variable for the command, K=V (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Host directory bound read-write at /workspace and used as the working directory.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Run as root inside the sandbox (root only in the sandbox's user namespace).
    #[arg(long)]
    pub root: bool,
}

impl SandboxOptions {
    pub fn spec(&self) -> anyhow::Result<SandboxSpec> {
        if let Some(cpus) = self.cpus
            && !(cpus > 0.0 && cpus <= 1024.0)
        {
            bail!("--cpus must be a positive number of cores, got {cpus}");
        }
        if self.pids == Some(0) {
            bail!("--pids must be at least 1");
        }
        if let Some(w) = &self.workdir
            && !w.is_dir()
        {
            bail!("--workdir {} is not a directory on this host", w.display());
        }
        Ok(SandboxSpec {
            template: self.template.clone(),
            limits: cella_sandbox::template::effective_limits(
                &Limits {
                    memory_bytes: self.memory,
                    cpus: self.cpus,
                    pids: self.pids,
                    disk_bytes: self.disk,
                },
                &super::template::default_limits(&self.template)?,
            ),
            network: self.network.clone(),
            envs: BTreeMap::new(),
            workdir: self.workdir.clone(),
            skills: BTreeMap::new(),
            default_user: "user".into(),
            lifetime: None,
            metadata: BTreeMap::new(),
        })
    }
}

pub(crate) fn parse_env(s: &str) -> Result<(String, String), String> {
    key_value(s, "--env", "NAME=VALUE")
}

/// Splits a `KEY=VALUE` flag value (the key must not be empty).
pub(crate) fn key_value(s: &str, flag: &str, shape: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("invalid {flag} {s:?}: expected {shape}")),
    }
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: the command's own; 124 if --timeout killed it; 137 if the memory limit did; 127 if the command was not found; 125 if the sandbox could not be created."
)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxOptions,
    /// Kill the command (and its sandbox) after this long, e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = spec::parse_duration)]
    pub timeout: Option<Duration>,
    /// Print the sandbox's warnings (limits this host cannot enforce) and timings.
    #[arg(long, short)]
    pub verbose: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let spec = args.sandbox.spec()?;
    let backend = super::local::one_sandbox_backend(&spec)?;
    let rt = super::local::runtime()?;
    let code = rt.block_on(exec(args, spec, backend))?;
    Ok(ExitCode::from(code))
}

/// Whether this process's stdin has anything for the command: not when it is a terminal (an
/// interactive session is `cella shell`), nor `/dev/null` or closed (the command's stdin is
/// then `/dev/null` in the sandbox, and no forwarding round trips are made).
fn forwards_stdin() -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if std::io::stdin().is_terminal() {
        return false;
    }
    let Ok(stdin) = std::fs::metadata("/proc/self/fd/0") else {
        return false;
    };
    let is_null = stdin.file_type().is_char_device()
        && std::fs::metadata("/dev/null").is_ok_and(|null| null.rdev() == stdin.rdev());
    !is_null
}

async fn exec(
    args: ExecArgs,
    spec: SandboxSpec,
    backend: cella_sandbox::native::NativeBackend,
) -> anyhow::Result<u8> {
    let id = cella_proto::ids::new_sandbox_id();
    let started = std::time::Instant::now();
    let instance = match backend.create(&id, &spec).await {
        Ok(i) => i,
        Err(e) => {
            eprintln!("cella: {e}");
            return Ok(125);
        }
    };
    for w in &instance.warnings {
        if args.verbose || !w.starts_with("rootless") {
            eprintln!("cella: warning: {w}");
        }
    }
    if args.verbose {
        eprintln!(
            "cella: sandbox {id} ready in {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    let denials = backend.network_denials().map(|mut rx| {
        tokio::spawn(async move {
            while let Ok(d) = rx.recv().await {
                eprintln!("cella: network: denied {} ({})", d.destination, d.rule);
            }
        })
    });
    let client = EnvdClient::for_transport(&instance.transport);
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: args.command[0].clone(),
            args: args.command[1..].to_vec(),
            envs: args.sandbox.env.iter().cloned().collect(),
            cwd: spec.workdir.as_ref().map(|_| WORKSPACE.to_string()),
        }),
        pty: None,
        tag: None,
        stdin: Some(forwards_stdin()),
    };
    let user = if args.sandbox.root {
        Some("root")
    } else {
        None
    };
    let result = run_process(&client, &req, user, args.timeout, Attach::Terminal).await;
    let oom = backend.oom_kills(&instance) > 0;
    let _ = backend.kill(&instance).await;
    if let Some(task) = denials {
        task.abort();
    }
    let outcome = result?;
    Ok(match outcome {
        Outcome::Exited(code) => {
            if code == 137 && oom {
                eprintln!(
                    "cella: killed: the command ran out of memory (limit {} MiB)",
                    spec.limits.memory_bytes.unwrap_or(0) >> 20
                );
            }
            u8::try_from(code.clamp(0, 255)).unwrap_or(1)
        }
        Outcome::TimedOut(t) => {
            eprintln!(
                "cella: timed out after {}: the sandbox was killed",
                humantime(t)
            );
            124
        }
        Outcome::Interrupted => 130,
        Outcome::NotStarted(code, msg) => {
            eprintln!("cella: {msg}");
            code
        }
    })
}

fn humantime(d: Duration) -> String {
    if d.as_millis() < 1000 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Where [`run_process`] puts a process's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attach {
    /// Its stdout to our stdout, its stderr to our stderr, byte for byte.
    Terminal,
    /// One JSON object per line on our stdout: `{"type":"start","pid"}`,
    /// `{"type":"stdout"|"stderr","text"}` (each chunk decoded as UTF-8, lossily) and
    /// `{"type":"end","exitCode"}`.
    JsonLines,
}

impl Attach {
    fn output(self, stream: &str, bytes: &[u8]) {
        match (self, stream) {
            (Attach::Terminal, "stderr") => {
                let mut err = std::io::stderr();
                let _ = err.write_all(bytes);
                let _ = err.flush();
            }
            (Attach::Terminal, _) => {
                let mut out = std::io::stdout();
                let _ = out.write_all(bytes);
                let _ = out.flush();
            }
            (Attach::JsonLines, _) => self.event(serde_json::json!({
                "type": stream,
                "text": String::from_utf8_lossy(bytes),
            })),
        }
    }

    fn event(self, event: serde_json::Value) {
        if self == Attach::JsonLines {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{event}");
            let _ = out.flush();
        }
    }
}

/// How a command run by [`run_process`] ended.
pub(crate) enum Outcome {
    Exited(i32),
    TimedOut(Duration),
    Interrupted,
    NotStarted(u8, String),
}

/// Starts `req` through `client` and attaches this terminal to it: output streams here live,
/// our stdin goes to the process when `req.stdin` is set, until it ends, `timeout` passes or
/// Ctrl-C (which kills the process).
pub(crate) async fn run_process(
    client: &EnvdClient,
    req: &StartRequest,
    user: Option<&str>,
    timeout: Option<Duration>,
    attach: Attach,
) -> anyhow::Result<Outcome> {
    let pipe_stdin = req.stdin == Some(true);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut stream = match client.start(req, user).await {
        Ok(s) => s,
        Err(ClientError::Rpc(e)) if e.code == Code::NotFound => {
            return Ok(Outcome::NotStarted(
                127,
                format!("command not found in the sandbox: {}", e.message),
            ));
        }
        Err(ClientError::Rpc(e)) if e.code == Code::PermissionDenied => {
            return Ok(Outcome::NotStarted(126, e.message));
        }
        Err(e) => return Err(e).context("starting the command in the sandbox"),
    };
    let mut stdin_task = None;
    let mut started = None;
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(ProcessEvent::Start { pid })) => {
                    started = Some(pid);
                    attach.event(serde_json::json!({ "type": "start", "pid": pid }));
                    if pipe_stdin {
                        stdin_task = Some(tokio::spawn(feed_stdin(client.clone(), pid, user.map(String::from))));
                    }
                }
                Some(Ok(ProcessEvent::Data(out))) => match out {
                    ProcessOutput::Stdout(b) | ProcessOutput::Pty(b) => attach.output("stdout", &b),
                    ProcessOutput::Stderr(b) => attach.output("stderr", &b),
                },
                Some(Ok(ProcessEvent::End(end))) => {
                    if let Some(t) = stdin_task { t.abort(); }
                    attach.event(serde_json::json!({ "type": "end", "exitCode": end.shell_code() }));
                    return Ok(Outcome::Exited(end.shell_code()));
                }
                Some(Ok(ProcessEvent::Keepalive {})) => {}
                Some(Err(e)) => return Err(e).context("reading the command's output"),
                None => bail!("the sandbox ended the command's stream without an exit status"),
            },
            _ = &mut sleep => return Ok(Outcome::TimedOut(timeout.unwrap_or_default())),
            _ = &mut ctrl_c => {
                if let Some(pid) = started {
                    let kill = SendSignalRequest {
                        process: Some(ProcessSelector::Pid(pid)),
                        signal: Signal::Sigkill,
                    };
                    let _ = client
                        .unary::<_, serde_json::Value>("/process.Process/SendSignal", &kill, user)
                        .await;
                }
                return Ok(Outcome::Interrupted);
            }
        }
    }
}

/// Copies our stdin to the command, then closes its stdin.
async fn feed_stdin(client: EnvdClient, pid: u32, user: Option<String>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    while let Some(chunk) = rx.recv().await {
        let req = SendInputRequest {
            process: Some(ProcessSelector::Pid(pid)),
            input: Some(ProcessInput::Stdin(chunk.into())),
        };
        if client
            .unary::<_, serde_json::Value>("/process.Process/SendInput", &req, user.as_deref())
            .await
            .is_err()
        {
            return;
        }
    }
    let close = cella_proto::process::CloseStdinRequest {
        process: Some(ProcessSelector::Pid(pid)),
    };
    let _ = client
        .unary::<_, serde_json::Value>("/process.Process/CloseStdin", &close, user.as_deref())
        .await;
}
