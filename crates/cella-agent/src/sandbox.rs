//! The agent's view of one sandbox: run a process and collect its (capped) output, read, write
//! and list files — all through the sandbox's envd (`EnvdClient`), never on the host.
//!
//! Owns path resolution against the agent's working directory and the timeout of a process.
//! Must not know about models, tools' schemas or jobs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cella_proto::filesystem::{EntryInfo, ListDirRequest, ListDirResponse};
use cella_proto::process::{
    ProcessConfig, ProcessEvent, ProcessOutput, ProcessSelector, SendSignalRequest, Signal,
    StartRequest,
};
use cella_proto::query::percent_encode;
use cella_sandbox::{ClientError, EnvdClient};
use http_body_util::{BodyExt, Full};

use crate::output::Capture;

/// Failure of a sandbox operation, worded for the model (it sees these as tool errors).
#[derive(Debug, thiserror::Error)]
pub enum SandboxOpError {
    #[error("{what}: {source}")]
    Envd { what: String, source: ClientError },
    #[error("{what}: {message}")]
    Refused { what: String, message: String },
    #[error("{what}: the file is larger than {limit} bytes")]
    TooLarge { what: String, limit: usize },
}

/// What became of a process.
#[derive(Debug, Clone)]
pub struct ProcessResult {
    /// The shell-style exit code (128 + signal when killed); `None` when it timed out.
    pub exit_code: Option<i32>,
    pub stdout: Capture,
    pub stderr: Capture,
    pub timed_out: bool,
    pub duration: Duration,
}

impl ProcessResult {
    pub fn truncated(&self) -> bool {
        self.stdout.truncated() || self.stderr.truncated()
    }

    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }

    /// The text a model sees: exit status, stdout, stderr.
    pub fn render(&self, timeout: Duration) -> String {
        let mut out = String::new();
        match self.exit_code {
            Some(code) => out.push_str(&format!("exit code: {code}\n")),
            None => out.push_str(&format!(
                "timed out after {} s: the process was killed\n",
                timeout.as_secs_f64()
            )),
        }
        if !self.stdout.is_empty() {
            out.push_str("stdout:\n");
            out.push_str(&self.stdout.render());
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        if !self.stderr.is_empty() {
            out.push_str("stderr:\n");
            out.push_str(&self.stderr.render());
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        if self.stdout.is_empty() && self.stderr.is_empty() {
            out.push_str("(no output)\n");
        }
        out
    }
}

/// The sandbox an agent works in.
#[derive(Debug, Clone)]
pub struct SandboxSession {
    envd: EnvdClient,
    /// The user processes and file operations run as (`None`: the sandbox's default user).
    user: Option<String>,
    /// Working directory of processes; relative paths resolve against it.
    workdir: String,
    envs: BTreeMap<String, String>,
    /// Bytes kept of each of stdout and stderr (default 8 KiB: half head, half tail).
    output_limit: usize,
    /// Largest file `read` accepts.
    read_limit: usize,
}

impl SandboxSession {
    /// A session working in `/home/user` as the default user.
    pub fn new(envd: EnvdClient) -> Self {
        Self {
            envd,
            user: None,
            workdir: "/home/user".to_owned(),
            envs: BTreeMap::new(),
            output_limit: 8 * 1024,
            read_limit: 8 << 20,
        }
    }

    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    pub fn with_workdir(mut self, workdir: impl Into<String>) -> Self {
        self.workdir = workdir.into();
        self
    }

    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(name.into(), value.into());
        self
    }

    /// Bytes kept of each of a process's stdout and stderr (head + tail).
    pub fn with_output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes.max(64);
        self
    }

    pub fn output_limit(&self) -> usize {
        self.output_limit
    }

    pub fn workdir(&self) -> &str {
        &self.workdir
    }

    pub fn envd(&self) -> &EnvdClient {
        &self.envd
    }

    /// `path` made absolute against the working directory (`~` is left to envd).
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') || path.starts_with('~') {
            path.to_owned()
        } else if path.is_empty() || path == "." {
            self.workdir.clone()
        } else {
            format!("{}/{}", self.workdir.trim_end_matches('/'), path)
        }
    }

    /// Runs `cmd args…` in the working directory, waiting at most `timeout` (then SIGKILL).
    pub async fn run(
        &self,
        cmd: &str,
        args: &[String],
        timeout: Duration,
    ) -> Result<ProcessResult, SandboxOpError> {
        let started = Instant::now();
        let req = StartRequest {
            process: Some(ProcessConfig {
                cmd: cmd.to_owned(),
                args: args.to_vec(),
                envs: self.envs.clone(),
                cwd: Some(self.workdir.clone()),
            }),
            pty: None,
            tag: None,
            stdin: Some(false),
        };
        let what = || format!("starting {cmd} in the sandbox");
        let mut stream = self
            .envd
            .start(&req, self.user.as_deref())
            .await
            .map_err(|source| SandboxOpError::Envd {
                what: what(),
                source,
            })?;
        let mut stdout = Capture::new(self.output_limit);
        let mut stderr = Capture::new(self.output_limit);
        let mut pid = None;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let event = match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(event) => event,
                Err(_) => {
                    if let Some(pid) = pid {
                        self.kill(pid).await;
                    }
                    return Ok(ProcessResult {
                        exit_code: None,
                        stdout,
                        stderr,
                        timed_out: true,
                        duration: started.elapsed(),
                    });
                }
            };
            match event {
                Some(Ok(ProcessEvent::Start { pid: p })) => pid = Some(p),
                Some(Ok(ProcessEvent::Data(ProcessOutput::Stdout(b) | ProcessOutput::Pty(b)))) => {
                    stdout.push(&b);
                }
                Some(Ok(ProcessEvent::Data(ProcessOutput::Stderr(b)))) => stderr.push(&b),
                Some(Ok(ProcessEvent::Keepalive {})) => {}
                Some(Ok(ProcessEvent::End(end))) => {
                    return Ok(ProcessResult {
                        exit_code: Some(end.shell_code()),
                        stdout,
                        stderr,
                        timed_out: false,
                        duration: started.elapsed(),
                    });
                }
                Some(Err(source)) => {
                    return Err(SandboxOpError::Envd {
                        what: format!("reading the output of {cmd}"),
                        source,
                    });
                }
                None => {
                    return Err(SandboxOpError::Refused {
                        what: format!("reading the output of {cmd}"),
                        message: "the sandbox ended the stream without an exit status".into(),
                    });
                }
            }
        }
    }

    /// `/bin/bash -l -c script`.
    pub async fn bash(
        &self,
        script: &str,
        timeout: Duration,
    ) -> Result<ProcessResult, SandboxOpError> {
        self.run(
            "/bin/bash",
            &["-l".to_owned(), "-c".to_owned(), script.to_owned()],
            timeout,
        )
        .await
    }

    async fn kill(&self, pid: u32) {
        let req = SendSignalRequest {
            process: Some(ProcessSelector::Pid(pid)),
            signal: Signal::Sigkill,
        };
        let _ = self
            .envd
            .unary::<_, serde_json::Value>(
                "/process.Process/SendSignal",
                &req,
                self.user.as_deref(),
            )
            .await;
    }

    fn files_uri(&self, path: &str) -> String {
        let mut uri = format!("/files?path={}", percent_encode(path));
        if let Some(user) = &self.user {
            uri.push_str("&username=");
            uri.push_str(&percent_encode(user));
        }
        uri
    }

    /// The bytes of a file (at most the read limit).
    pub async fn read(&self, path: &str) -> Result<Vec<u8>, SandboxOpError> {
        let path = self.resolve(path);
        let what = format!("reading {path}");
        let req = hyper::Request::get(self.files_uri(&path))
            .header("host", "envd")
            .body(Full::new(Bytes::new()))
            .map_err(|e| SandboxOpError::Refused {
                what: what.clone(),
                message: e.to_string(),
            })?;
        let resp = self
            .envd
            .send(req)
            .await
            .map_err(|source| SandboxOpError::Envd {
                what: what.clone(),
                source,
            })?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut data = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| SandboxOpError::Refused {
                what: what.clone(),
                message: e.to_string(),
            })?;
            if let Ok(chunk) = frame.into_data() {
                data.extend_from_slice(&chunk);
                if data.len() > self.read_limit {
                    return Err(SandboxOpError::TooLarge {
                        what,
                        limit: self.read_limit,
                    });
                }
            }
        }
        if !status.is_success() {
            return Err(SandboxOpError::Refused {
                what,
                message: error_message(&data),
            });
        }
        Ok(data)
    }

    /// Writes a whole file, creating its parent directories.
    pub async fn write(&self, path: &str, content: &[u8]) -> Result<(), SandboxOpError> {
        let path = self.resolve(path);
        let what = format!("writing {path}");
        let req = hyper::Request::post(self.files_uri(&path))
            .header("host", "envd")
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::copy_from_slice(content)))
            .map_err(|e| SandboxOpError::Refused {
                what: what.clone(),
                message: e.to_string(),
            })?;
        let resp = self
            .envd
            .send(req)
            .await
            .map_err(|source| SandboxOpError::Envd {
                what: what.clone(),
                source,
            })?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(SandboxOpError::Refused {
                what,
                message: error_message(&body),
            })
        }
    }

    /// Entries under `path`, `depth` levels deep (1 = the directory's own entries).
    pub async fn list(&self, path: &str, depth: u32) -> Result<Vec<EntryInfo>, SandboxOpError> {
        let path = self.resolve(path);
        let req = ListDirRequest {
            path: path.clone(),
            depth,
        };
        let resp: ListDirResponse = self
            .envd
            .unary("/filesystem.Filesystem/ListDir", &req, self.user.as_deref())
            .await
            .map_err(|source| SandboxOpError::Envd {
                what: format!("listing {path}"),
                source,
            })?;
        Ok(resp.entries)
    }
}

/// The `message` of an envd error body, else the body itself.
fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_workdir() {
        let s = SandboxSession::new(EnvdClient::unix("/nonexistent")).with_workdir("/workspace/");
        assert_eq!(s.resolve("a/b.py"), "/workspace/a/b.py");
        assert_eq!(s.resolve("/etc/x"), "/etc/x");
        assert_eq!(s.resolve("~/x"), "~/x");
        assert_eq!(s.resolve("."), "/workspace/");
    }
}
