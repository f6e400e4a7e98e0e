//! One execution context: a language, a working directory and the driver process that holds its
//! state. Cells run one at a time. A cell whose client goes away (the SDK's `timeout`) is
//! interrupted; a driver that does not stop is killed, and the next cell starts a fresh one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

use super::driver::{Driver, Event, Stream};
use super::{Language, output};
use crate::Envd;
use crate::users::User;

/// How long an interrupted cell may take to stop before its driver is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How often the interrupt is repeated meanwhile: one that lands just before the cell starts
/// running (a kernel ignores SIGINT between cells) must not cost the context its state.
const INTERRUPT_REPEAT: Duration = Duration::from_millis(500);
/// After a driver exits, how long its last output may take to arrive.
const EXIT_DRAIN: Duration = Duration::from_millis(200);

pub struct Context {
    pub id: String,
    pub language: Language,
    pub cwd: PathBuf,
    user: User,
    envd: Envd,
    driver: Mutex<Option<Driver>>,
    /// The running driver's pid (0: none), readable without waiting for a running cell.
    pid: AtomicU32,
}

impl Context {
    pub fn new(envd: Envd, id: String, language: Language, cwd: PathBuf, user: User) -> Self {
        Context {
            id,
            language,
            cwd,
            user,
            envd,
            driver: Mutex::new(None),
            pid: AtomicU32::new(0),
        }
    }

    /// The context as E2B describes it (`{id, language, cwd}`).
    pub fn info(&self) -> Value {
        json!({ "id": self.id, "language": self.language.name(), "cwd": self.cwd.display().to_string() })
    }

    /// Starts the driver if none runs.
    pub async fn ensure_started(&self) -> Result<(), String> {
        let mut guard = self.driver.lock().await;
        self.start_locked(&mut guard).await
    }

    async fn start_locked(&self, slot: &mut Option<Driver>) -> Result<(), String> {
        if slot.is_none() {
            let d = Driver::start(&self.envd, self.language, &self.cwd, &self.user).await?;
            tracing::debug!(context = %self.id, kernel = %d.kernel, pid = d.pid, "interpreter driver started");
            self.pid.store(d.pid, Ordering::SeqCst);
            *slot = Some(d);
        }
        Ok(())
    }

    /// Kills the driver now (a running cell ends with an error); the next use starts afresh.
    pub fn kill(&self) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if pid != 0 {
            let _ = crate::process::signal_group(pid, libc::SIGKILL);
        }
    }

    /// Restart: a fresh driver, all state gone.
    pub async fn restart(&self) -> Result<(), String> {
        self.kill();
        let mut guard = self.driver.lock().await;
        *guard = None;
        self.start_locked(&mut guard).await
    }

    /// The command line for one cell.
    fn command(&self, code: &str, env_vars: &BTreeMap<String, String>) -> Vec<u8> {
        match self.language {
            Language::Bash => {
                let b64 = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        base64::engine::general_purpose::STANDARD.encode(s)
                    }
                };
                let (setup, teardown) = bash_env(env_vars, &self.envd.config.envs);
                format!("{} {} {}", b64(&setup), b64(code), b64(&teardown)).into_bytes()
            }
            _ => serde_json::to_vec(&json!({ "code": code, "env_vars": env_vars }))
                .unwrap_or_default(),
        }
    }

    /// Runs one cell, sending its NDJSON lines to `out`. Returns when the cell has ended (or its
    /// driver has been killed), whether or not anyone still listens.
    pub async fn execute(
        &self,
        code: &str,
        env_vars: &BTreeMap<String, String>,
        out: mpsc::Sender<Bytes>,
    ) {
        let send = |v: Value| {
            let out = out.clone();
            async move {
                let _ = out.send(output::line(&v)).await;
            }
        };
        let mut guard = self.driver.lock().await;
        if let Err(e) = self.start_locked(&mut guard).await {
            send(output::error("ContextError", &e, "")).await;
            send(output::end()).await;
            return;
        }
        let Some(driver) = guard.as_mut() else { return };
        if let Err(e) = driver.send(&self.command(code, env_vars)).await {
            *guard = None;
            send(output::error(
                "ContextError",
                &format!("the {} context's driver is gone: {e}", self.language.name()),
                "",
            ))
            .await;
            send(output::end()).await;
            return;
        }
        let (mut out_done, mut err_done, mut ctl_done) = (false, false, false);
        let mut interrupted: Option<tokio::time::Instant> = None;
        let mut exited_at: Option<tokio::time::Instant> = None;
        let mut closed = false;
        let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        loop {
            if out_done && err_done && ctl_done {
                send(output::end()).await;
                return;
            }
            let kill_at = interrupted.map(|t| t + INTERRUPT_GRACE).unwrap_or(far);
            let repeat_at = interrupted
                .map(|t| {
                    let since = t.elapsed().as_millis() / INTERRUPT_REPEAT.as_millis() + 1;
                    t + INTERRUPT_REPEAT * since as u32
                })
                .unwrap_or(far);
            let drain_until = exited_at.map(|t| t + EXIT_DRAIN).unwrap_or(far);
            tokio::select! {
                ev = driver.next(), if !closed => match ev {
                    Some(Event::Output(stream, text)) => {
                        let kind = if stream == Stream::Stdout { "stdout" } else { "stderr" };
                        send(output::stream(kind, &text)).await;
                    }
                    Some(Event::Marker(Stream::Stdout)) => out_done = true,
                    Some(Event::Marker(Stream::Stderr)) => err_done = true,
                    Some(Event::Control(v)) => {
                        if v["type"] == "end" {
                            ctl_done = true;
                        } else if let Some(line) = output::from_driver(&v) {
                            send(line).await;
                        }
                    }
                    Some(Event::Exited) => {
                        if exited_at.is_none() {
                            exited_at = Some(tokio::time::Instant::now());
                        }
                    }
                    None => {
                        closed = true;
                        exited_at.get_or_insert_with(tokio::time::Instant::now);
                    }
                },
                _ = out.closed(), if interrupted.is_none() => {
                    tracing::debug!(context = %self.id, "client left: interrupting the cell");
                    driver.interrupt();
                    interrupted = Some(tokio::time::Instant::now());
                }
                _ = tokio::time::sleep_until(repeat_at), if repeat_at < kill_at => {
                    driver.interrupt();
                }
                _ = tokio::time::sleep_until(kill_at) => {
                    tracing::warn!(context = %self.id, "the interrupted cell did not stop: restarting the context");
                    *guard = None;
                    self.pid.store(0, Ordering::SeqCst);
                    send(output::error("ContextRestarting", "the cell did not stop when interrupted; the context was restarted and its state is lost", "")).await;
                    send(output::end()).await;
                    return;
                }
                _ = tokio::time::sleep_until(drain_until) => {
                    *guard = None;
                    self.pid.store(0, Ordering::SeqCst);
                    send(output::error(
                        "ContextRestarting",
                        &format!("the {} context's process exited (killed, restarted or crashed); its state is lost and the next cell starts afresh", self.language.name()),
                        "",
                    )).await;
                    send(json!({ "type": "unexpected_end_of_execution" })).await;
                    return;
                }
            }
        }
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn valid_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Bash statements that set a cell's variables and, afterwards, put back the sandbox's value or
/// remove them (E2B's rule).
fn bash_env(
    env_vars: &BTreeMap<String, String>,
    sandbox: &BTreeMap<String, String>,
) -> (String, String) {
    let (mut setup, mut teardown) = (String::new(), String::new());
    for (k, v) in env_vars.iter().filter(|(k, _)| valid_name(k)) {
        setup.push_str(&format!("export {k}={}\n", shell_quote(v)));
        match sandbox.get(k) {
            Some(g) => teardown.push_str(&format!("export {k}={}\n", shell_quote(g))),
            None => teardown.push_str(&format!("unset {k}\n")),
        }
    }
    (setup, teardown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_env_sets_and_restores() {
        let mut cell = BTreeMap::new();
        cell.insert("A".to_string(), "it's".to_string());
        cell.insert("B".to_string(), "x".to_string());
        cell.insert("bad name".to_string(), "x".to_string());
        let mut sandbox = BTreeMap::new();
        sandbox.insert("B".to_string(), "global".to_string());
        let (setup, teardown) = bash_env(&cell, &sandbox);
        assert_eq!(setup, "export A='it'\\''s'\nexport B='x'\n");
        assert_eq!(teardown, "unset A\nexport B='global'\n");
    }
}
