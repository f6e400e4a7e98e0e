//! Starting a process: its environment, working directory, identity, session, and either pipes
//! or a pseudo-terminal; then pumping its output to subscribers until it ends.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use bytes::Bytes;
use cella_proto::process::{EndEvent, ProcessEvent, ProcessOutput, StartRequest};
use cella_proto::{Code, RpcError};
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch};

use super::pty::{self, PtyMaster};
use super::table::{Input, ProcessEntry};
use crate::Envd;
use crate::init::{ExitStatus, Reaper};
use crate::users::User;

/// PATH for processes that set none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Read size for output chunks.
const CHUNK: usize = 32 * 1024;

/// A started process, before its output pump runs.
pub struct Started {
    pub entry: Arc<ProcessEntry>,
    pumps: Pumps,
}

struct Pumps {
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    pty: Option<Arc<PtyMaster>>,
    exit: oneshot::Receiver<ExitStatus>,
}

/// The environment a process starts with: defaults for the user, the sandbox's variables, then
/// the request's.
pub(crate) fn environment(
    envd: &Envd,
    user: &User,
    cwd: &Path,
    request: &BTreeMap<String, String>,
    pty: bool,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert("HOME".to_string(), user.home.display().to_string());
    env.insert("USER".to_string(), user.name.clone());
    env.insert("LOGNAME".to_string(), user.name.clone());
    env.insert("SHELL".to_string(), user.shell.clone());
    env.insert("PWD".to_string(), cwd.display().to_string());
    env.insert("LANG".to_string(), "C.UTF-8".to_string());
    if pty {
        env.insert("TERM".to_string(), "xterm-256color".to_string());
    }
    env.extend(envd.envs());
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

pub(crate) fn resolve_cwd(
    envd: &Envd,
    user: &User,
    requested: Option<&str>,
) -> Result<PathBuf, RpcError> {
    let cwd = match requested.filter(|c| !c.is_empty()) {
        Some(c) if Path::new(c).is_absolute() => PathBuf::from(c),
        Some(c) => user.home.join(c),
        None => envd
            .config
            .default_workdir
            .clone()
            .unwrap_or_else(|| user.home.clone()),
    };
    match std::fs::metadata(&cwd) {
        Ok(m) if m.is_dir() => Ok(cwd),
        Ok(_) => Err(RpcError::invalid_argument(format!(
            "cwd {} is not a directory",
            cwd.display()
        ))),
        Err(e) => Err(RpcError::invalid_argument(format!(
            "cwd {} is not usable: {e}",
            cwd.display()
        ))),
    }
}

pub(crate) fn validate_envs(envs: &BTreeMap<String, String>) -> Result<(), RpcError> {
    for (k, v) in envs {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(RpcError::invalid_argument(format!(
                "invalid environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
            )));
        }
    }
    Ok(())
}

/// Starts the process described by `req` as `user`.
pub fn start(envd: &Envd, req: &StartRequest, user: &User) -> Result<Started, RpcError> {
    let Some(config) = req.process.clone() else {
        return Err(RpcError::invalid_argument("start request has no process"));
    };
    if config.cmd.is_empty() {
        return Err(RpcError::invalid_argument(
            "process.cmd is empty: name the program to run",
        ));
    }
    if config.cmd.contains('\0') || config.args.iter().any(|a| a.contains('\0')) {
        return Err(RpcError::invalid_argument(
            "process.cmd and args must not contain NUL bytes",
        ));
    }
    validate_envs(&config.envs)?;
    if let Some(tag) = &req.tag
        && envd.processes.tag_in_use(tag)
    {
        return Err(RpcError::new(
            Code::AlreadyExists,
            format!("a running process already has tag {tag:?}"),
        ));
    }
    let cwd = resolve_cwd(envd, user, config.cwd.as_deref())?;
    let use_pty = req.pty.is_some();
    let env = environment(envd, user, &cwd, &config.envs, use_pty);

    let mut cmd = Command::new(&config.cmd);
    cmd.args(&config.args)
        .env_clear()
        .envs(&env)
        .current_dir(&cwd);
    if envd.users.can_switch() && user.uid != current_uid() {
        cmd.uid(user.uid).gid(user.gid);
    }

    let mut pty_master = None;
    let mut stdin_sender = None;
    if let Some(p) = &req.pty {
        let size = p.size.unwrap_or_default();
        let (master, slave) = pty::open(clamp16(size.cols, 80), clamp16(size.rows, 24))
            .map_err(|e| RpcError::internal(format!("allocating a pseudo-terminal: {e}")))?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| RpcError::internal(format!("duplicating the terminal: {e}")))
        };
        cmd.stdin(Stdio::from(dup(&slave)?))
            .stdout(Stdio::from(dup(&slave)?))
            .stderr(Stdio::from(slave));
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (setsid, ioctl).
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        pty_master = Some(Arc::new(master));
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if req.stdin == Some(true) {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        // SAFETY: setsid is async-signal-safe; it makes the process a group leader so signals
        // can reach its whole group.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    // Spawn and register under the reaper's lock: the child cannot be reaped unseen.
    let (mut child, exit) = {
        let mut reaper = Reaper::global().lock();
        let child = cmd.spawn().map_err(|e| spawn_error(&config.cmd, &e))?;
        let exit = reaper.watch(child.id() as i32);
        (child, exit)
    };
    let pid = child.id();
    let mut stdout = None;
    let mut stderr = None;
    if pty_master.is_none() {
        stdout = child
            .stdout
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose()
            .map_err(io_internal)?;
        stderr = child
            .stderr
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose()
            .map_err(io_internal)?;
        stdin_sender = child
            .stdin
            .take()
            .map(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s)))
            .transpose()
            .map_err(io_internal)?;
    }
    // Drop the std handle without waiting: the reaper owns this child's exit.
    drop(child);

    let input = match (&pty_master, stdin_sender) {
        (Some(m), _) => Input::Pty(m.clone()),
        (None, Some(s)) => Input::Pipe(s),
        (None, None) => Input::None,
    };
    let entry = Arc::new(ProcessEntry::new(
        pid,
        req.tag.clone(),
        config,
        input,
        pty_master.clone(),
    ));
    Ok(Started {
        entry,
        pumps: Pumps {
            stdout,
            stderr,
            pty: pty_master,
            exit,
        },
    })
}

fn io_internal(e: std::io::Error) -> RpcError {
    RpcError::internal(format!("setting up process output: {e}"))
}

fn spawn_error(cmd: &str, e: &std::io::Error) -> RpcError {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => Code::NotFound,
        std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    };
    RpcError::new(code, format!("cannot start {cmd:?}: {e}"))
}

fn clamp16(v: u32, default: u16) -> u16 {
    if v == 0 {
        default
    } else {
        u16::try_from(v).unwrap_or(u16::MAX)
    }
}

pub(crate) fn current_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

impl Started {
    /// Registers the process and pumps its output until it ends; subscribers added before this
    /// call see every byte.
    pub fn run(self, envd: &Envd) {
        let Started { entry, pumps } = self;
        envd.processes.insert(entry.clone());
        let envd = envd.clone();
        tokio::spawn(async move {
            let (done_tx, done_rx) = watch::channel(false);
            let waiter = async move {
                let status = pumps.exit.await;
                let _ = done_tx.send(true);
                status
            };
            let (status, _, _, _) = tokio::join!(
                waiter,
                pump_pipe(pumps.stdout, &entry, ProcessOutput::Stdout, done_rx.clone()),
                pump_pipe(pumps.stderr, &entry, ProcessOutput::Stderr, done_rx.clone()),
                pump_pty(pumps.pty, &entry, done_rx),
            );
            let end = match status {
                Ok(ExitStatus::Exited(code)) => EndEvent::exited(code),
                Ok(ExitStatus::Signaled(sig)) => EndEvent::signaled(sig),
                Err(_) => EndEvent {
                    error: Some("exit status lost".into()),
                    ..EndEvent::signaled(9)
                },
            };
            envd.processes.remove(entry.pid);
            entry.finish(end).await;
        });
    }
}

async fn pump_pipe(
    rx: Option<pipe::Receiver>,
    entry: &ProcessEntry,
    wrap: fn(Bytes) -> ProcessOutput,
    mut done: watch::Receiver<bool>,
) {
    let Some(rx) = rx else { return };
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            biased;
            ready = rx.readable() => {
                if ready.is_err() { return; }
                match rx.try_read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => entry.publish(ProcessEvent::Data(wrap(Bytes::copy_from_slice(&buf[..n])))).await,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => return,
                }
            }
            _ = done.changed() => {
                // The process has exited: what it wrote is in the pipe now. Take it and stop,
                // rather than waiting on background children that inherited the pipe.
                while let Ok(n) = rx.try_read(&mut buf) {
                    if n == 0 { break; }
                    entry.publish(ProcessEvent::Data(wrap(Bytes::copy_from_slice(&buf[..n])))).await;
                }
                return;
            }
        }
    }
}

async fn pump_pty(
    master: Option<Arc<PtyMaster>>,
    entry: &ProcessEntry,
    mut done: watch::Receiver<bool>,
) {
    let Some(master) = master else { return };
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            biased;
            r = master.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => entry.publish(ProcessEvent::Data(ProcessOutput::Pty(Bytes::copy_from_slice(&buf[..n])))).await,
            },
            _ = done.changed() => {
                while let Ok(n) = master.try_read(&mut buf) {
                    if n == 0 { break; }
                    entry.publish(ProcessEvent::Data(ProcessOutput::Pty(Bytes::copy_from_slice(&buf[..n])))).await;
                }
                return;
            }
        }
    }
}
