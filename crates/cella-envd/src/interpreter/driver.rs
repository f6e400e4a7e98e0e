//! One context's driver process: a long-lived interpreter (python3, node or bash running an
//! embedded driver script) started as the context's user in its own session. Commands go to it on
//! fd 4, structured events come back on fd 3, and the cell's own output on fds 1 and 2, each
//! closed by a per-driver marker so envd knows when a cell's output is complete.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::Language;
use crate::Envd;
use crate::init::Reaper;
use crate::users::User;

const PYTHON: &str = include_str!("drivers/python.py");
const JAVASCRIPT: &str = include_str!("drivers/javascript.js");
const BASH: &str = include_str!("drivers/bash.sh");

/// How long a driver may take to become ready (a Jupyter kernel starts in seconds; a loaded
/// machine is slower).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What a driver reports.
#[derive(Debug)]
pub enum Event {
    /// Text the cell wrote to its stdout or stderr.
    Output(Stream, String),
    /// The end-of-cell marker on that stream: everything written before it has been seen.
    Marker(Stream),
    /// A structured event from fd 3.
    Control(serde_json::Value),
    /// The driver process ended.
    Exited,
}

pub struct Driver {
    pub pid: u32,
    /// `jupyter`, `builtin`, `node` or `bash`, as the driver reported when it became ready.
    pub kernel: String,
    commands: pipe::Sender,
    events: mpsc::Receiver<Event>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = crate::process::signal_group(self.pid, libc::SIGKILL);
    }
}

fn program(language: Language) -> (&'static str, Vec<&'static str>) {
    match language {
        Language::Python => ("python3", vec!["-c", PYTHON]),
        Language::JavaScript => ("node", vec!["-e", JAVASCRIPT]),
        Language::Bash => ("bash", vec!["--noprofile", "--norc", "-c", BASH]),
    }
}

/// Makes the child's fd 3 a copy of `ev` and its fd 4 a copy of `co` (between fork and exec).
fn install_fds(cmd: &mut Command, ev: RawFd, co: RawFd) {
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (setsid, fcntl, dup2). It first copies both descriptors above 10 so neither dup2 can
    // overwrite the other's source; the copies are close-on-exec, the targets are not.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ev_high = libc::fcntl(ev, libc::F_DUPFD_CLOEXEC, 10);
            let co_high = libc::fcntl(co, libc::F_DUPFD_CLOEXEC, 10);
            if ev_high < 0
                || co_high < 0
                || libc::dup2(ev_high, 3) < 0
                || libc::dup2(co_high, 4) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Driver {
    /// Starts the driver for `language` in `cwd` as `user` and waits until it is ready. The
    /// error says what failed, with what the driver printed.
    pub async fn start(
        envd: &Envd,
        language: Language,
        cwd: &Path,
        user: &User,
    ) -> Result<Driver, String> {
        let marker = format!("\u{1}cella-end-{}\u{1}", cella_proto::ids::random_hex(8));
        let mut env =
            crate::process::spawn::environment(envd, user, cwd, &Default::default(), false);
        env.insert("CELLA_INTERP_MARKER".into(), marker.clone());
        let (prog, args) = program(language);
        let (events_rx, events_tx) =
            std::io::pipe().map_err(|e| format!("creating the driver's pipes: {e}"))?;
        let (commands_rx, commands_tx) =
            std::io::pipe().map_err(|e| format!("creating the driver's pipes: {e}"))?;
        let (events_tx, commands_rx) = (OwnedFd::from(events_tx), OwnedFd::from(commands_rx));

        let mut cmd = Command::new(prog);
        cmd.args(&args)
            .env_clear()
            .envs(&env)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if envd.users.can_switch() && user.uid != crate::process::spawn::current_uid() {
            cmd.uid(user.uid).gid(user.gid);
        }
        install_fds(&mut cmd, events_tx.as_raw_fd(), commands_rx.as_raw_fd());
        let spawned = {
            let mut reaper = Reaper::global().lock();
            cmd.spawn().map(|child| {
                let exit = reaper.watch(child.id() as i32);
                (child, exit)
            })
        };
        // The child has its own copies now (or was never created).
        drop((events_tx, commands_rx));
        let (mut child, exit) = spawned.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{prog} is not installed in this sandbox: the {} context needs it",
                language.name()
            ),
            _ => format!("starting {prog}: {e}"),
        })?;
        let pid = child.id();
        let io_err = |e: std::io::Error| format!("setting up the driver's pipes: {e}");
        let stdout = child
            .stdout
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose()
            .map_err(io_err)?;
        let stderr = child
            .stderr
            .take()
            .map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)))
            .transpose()
            .map_err(io_err)?;
        drop(child);
        let control = pipe::Receiver::from_owned_fd(OwnedFd::from(events_rx)).map_err(io_err)?;
        let commands = pipe::Sender::from_owned_fd(OwnedFd::from(commands_tx)).map_err(io_err)?;

        let (tx, events) = mpsc::channel(256);
        if let Some(out) = stdout {
            tokio::spawn(read_output(out, Stream::Stdout, marker.clone(), tx.clone()));
        }
        if let Some(err) = stderr {
            tokio::spawn(read_output(err, Stream::Stderr, marker, tx.clone()));
        }
        tokio::spawn(read_control(control, tx.clone()));
        tokio::spawn(async move {
            let _ = exit.await;
            let _ = tx.send(Event::Exited).await;
        });
        let mut driver = Driver {
            pid,
            kernel: String::new(),
            commands,
            events,
        };
        driver.wait_ready(prog).await?;
        Ok(driver)
    }

    async fn wait_ready(&mut self, prog: &str) -> Result<(), String> {
        let mut said = String::new();
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let ev = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| {
                    format!(
                        "{prog} did not become ready within {} s{}",
                        READY_TIMEOUT.as_secs(),
                        tail(&said)
                    )
                })?;
            match ev {
                Some(Event::Control(v)) if v["type"] == "ready" => {
                    self.kernel = v["kernel"].as_str().unwrap_or_default().to_string();
                    return Ok(());
                }
                Some(Event::Output(_, text)) => said.push_str(&text),
                Some(Event::Exited) | None => {
                    // Let the last output arrive.
                    while let Ok(Some(Event::Output(_, text))) =
                        tokio::time::timeout(Duration::from_millis(200), self.events.recv()).await
                    {
                        said.push_str(&text);
                    }
                    return Err(format!("{prog} exited before it was ready{}", tail(&said)));
                }
                Some(_) => {}
            }
        }
    }

    /// Sends one command line.
    pub async fn send(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.commands.write_all(line).await?;
        self.commands.write_all(b"\n").await
    }

    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Interrupts the running cell (SIGINT to the driver's whole session).
    pub fn interrupt(&self) {
        let _ = crate::process::signal_group(self.pid, libc::SIGINT);
    }
}

fn tail(said: &str) -> String {
    let said = said.trim();
    if said.is_empty() {
        return String::new();
    }
    let start = said
        .char_indices()
        .rev()
        .nth(2000)
        .map(|(i, _)| i)
        .unwrap_or(0);
    format!(": {}", &said[start..])
}

/// Reads a cell's output stream, cutting it at the marker; text is passed on as soon as it is
/// read (minus a possible marker prefix at the end, and an incomplete UTF-8 sequence).
async fn read_output(rx: pipe::Receiver, stream: Stream, marker: String, tx: mpsc::Sender<Event>) {
    let marker = marker.into_bytes();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        if rx.readable().await.is_err() {
            return;
        }
        let n = match rx.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            if let Some(at) = find(&pending, &marker) {
                let before: Vec<u8> = pending.drain(..at + marker.len()).collect();
                let text = &before[..at];
                if !text.is_empty() {
                    let _ = tx
                        .send(Event::Output(
                            stream,
                            String::from_utf8_lossy(text).into_owned(),
                        ))
                        .await;
                }
                let _ = tx.send(Event::Marker(stream)).await;
                continue;
            }
            break;
        }
        // Hold back what could be the start of a marker, and an incomplete UTF-8 sequence.
        let mut keep = held_marker_prefix(&pending, &marker);
        let emit_to = pending.len() - keep;
        let valid = match std::str::from_utf8(&pending[..emit_to]) {
            Ok(_) => emit_to,
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => emit_to,
        };
        keep = pending.len() - valid;
        if valid > 0 {
            let text: Vec<u8> = pending.drain(..valid).collect();
            let _ = tx
                .send(Event::Output(
                    stream,
                    String::from_utf8_lossy(&text).into_owned(),
                ))
                .await;
        }
        debug_assert_eq!(pending.len(), keep);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest suffix of `data` that is a proper prefix of `marker`.
fn held_marker_prefix(data: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(data.len() + 1))
        .rev()
        .find(|&k| data.ends_with(&marker[..k]))
        .unwrap_or(0)
}

async fn read_control(rx: pipe::Receiver, tx: mpsc::Sender<Event>) {
    let mut lines = BufReader::new(rx).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(v) => {
                if tx.send(Event::Control(v)).await.is_err() {
                    return;
                }
            }
            Err(e) => tracing::debug!("malformed driver event {line:?}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_prefixes_are_held_back() {
        assert_eq!(held_marker_prefix(b"abc\x01cel", b"\x01cella\x01"), 4);
        assert_eq!(held_marker_prefix(b"abc", b"\x01cella\x01"), 0);
        assert_eq!(held_marker_prefix(b"", b"\x01cella\x01"), 0);
        assert_eq!(find(b"ab\x01cella\x01cd", b"\x01cella\x01"), Some(2));
    }
}
