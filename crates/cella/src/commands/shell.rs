//! `cella shell`: an interactive login shell on a pseudo-terminal in a fresh sandbox. The local
//! terminal is put in raw mode, resizes are forwarded, and the sandbox is destroyed on exit.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use anyhow::{Context, bail};
use cella_proto::process::{
    ProcessConfig, ProcessEvent, ProcessInput, ProcessOutput, ProcessSelector, Pty, PtySize,
    SendInputRequest, StartRequest, UpdateRequest,
};
use cella_sandbox::EnvdClient;
use cella_sandbox::backend::Backend;
use cella_sandbox::spec::WORKSPACE;

use super::exec::SandboxOptions;

#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    #[command(flatten)]
    sandbox: SandboxOptions,
    /// Shell to run.
    #[arg(long, default_value = "/bin/bash")]
    shell: String,
}

/// Restores the terminal's settings when dropped.
struct RawMode {
    fd: i32,
    saved: libc::termios,
}

impl RawMode {
    fn enter(fd: i32) -> anyhow::Result<RawMode> {
        // SAFETY: termios is plain data; tcgetattr fills it for a valid terminal fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            bail!(
                "reading terminal settings: {}",
                std::io::Error::last_os_error()
            );
        }
        let saved = t;
        // SAFETY: cfmakeraw edits the struct in place.
        unsafe { libc::cfmakeraw(&mut t) };
        // SAFETY: tcsetattr reads a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } != 0 {
            bail!("setting raw mode: {}", std::io::Error::last_os_error());
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter`.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

fn terminal_size() -> (u32, u32) {
    // SAFETY: winsize is plain data; TIOCGWINSZ fills it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on stdout with a valid winsize pointer.
    if unsafe { libc::ioctl(std::io::stdout().as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } == 0
        && ws.ws_col > 0
    {
        (u32::from(ws.ws_col), u32::from(ws.ws_row))
    } else {
        (80, 24)
    }
}

pub fn run(args: ShellArgs) -> anyhow::Result<ExitCode> {
    if !std::io::stdin().is_terminal() {
        bail!("cella shell needs a terminal on stdin; use `cella exec` for scripts");
    }
    let spec = args.sandbox.spec()?;
    let backend = super::local::one_sandbox_backend(&spec)?;
    let rt = super::local::runtime()?;
    rt.block_on(async move {
        let id = cella_proto::ids::new_sandbox_id();
        let instance = backend
            .create(&id, &spec)
            .await
            .context("creating the sandbox")?;
        for w in &instance.warnings {
            eprintln!("cella: warning: {w}");
        }
        let client = EnvdClient::for_transport(&instance.transport);
        let result = session(&client, &args, spec.workdir.is_some()).await;
        let _ = backend.kill(&instance).await;
        result
    })
}

async fn session(
    client: &EnvdClient,
    args: &ShellArgs,
    workspace: bool,
) -> anyhow::Result<ExitCode> {
    let (cols, rows) = terminal_size();
    let user = if args.sandbox.root {
        Some("root")
    } else {
        None
    };
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: args.shell.clone(),
            args: vec!["-i".into(), "-l".into()],
            envs: args.sandbox.env.iter().cloned().collect(),
            cwd: workspace.then(|| WORKSPACE.to_string()),
        }),
        pty: Some(Pty {
            size: Some(PtySize { cols, rows }),
        }),
        tag: None,
        stdin: None,
    };
    let mut stream = client
        .start(&req, user)
        .await
        .context("starting the shell")?;
    let pid = match stream.next().await {
        Some(Ok(ProcessEvent::Start { pid })) => pid,
        Some(Err(e)) => return Err(e).context("starting the shell"),
        _ => bail!("the sandbox did not start the shell"),
    };
    let _raw = RawMode::enter(std::io::stdin().as_raw_fd())?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut out = std::io::stdout();
    let selector = Some(ProcessSelector::Pid(pid));
    loop {
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(ProcessEvent::Data(ProcessOutput::Pty(b) | ProcessOutput::Stdout(b) | ProcessOutput::Stderr(b)))) => {
                    let _ = out.write_all(&b);
                    let _ = out.flush();
                }
                Some(Ok(ProcessEvent::End(end))) => return Ok(ExitCode::from(u8::try_from(end.shell_code().clamp(0, 255)).unwrap_or(1))),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the shell's output"),
                None => return Ok(ExitCode::SUCCESS),
            },
            Some(data) = rx.recv() => {
                let req = SendInputRequest { process: selector.clone(), input: Some(ProcessInput::Pty(data.into())) };
                let _ = client.unary::<_, serde_json::Value>("/process.Process/SendInput", &req, user).await;
            }
            _ = winch.recv() => {
                let (cols, rows) = terminal_size();
                let req = UpdateRequest { process: selector.clone(), pty: Some(Pty { size: Some(PtySize { cols, rows }) }) };
                let _ = client.unary::<_, serde_json::Value>("/process.Process/Update", &req, user).await;
            }
        }
    }
}
