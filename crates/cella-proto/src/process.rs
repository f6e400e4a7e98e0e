//! `process.Process` messages (E2B envd `process.proto`) in proto3 canonical JSON.
//!
//! Oneofs are Rust enums serialized externally tagged, which is exactly proto3 JSON's shape:
//! `{"event": {"start": {"pid": 7}}}`.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PtySize {
    pub cols: u32,
    pub rows: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Pty {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// Which process a call addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessSelector {
    Pid(u32),
    Tag(String),
}

impl std::fmt::Display for ProcessSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessSelector::Pid(pid) => write!(f, "process with pid {pid}"),
            ProcessSelector::Tag(tag) => write!(f, "process with tag {tag:?}"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectRequest {
    pub process: Option<ProcessSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListRequest {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessInfo {
    pub config: Option<ProcessConfig>,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// Bytes for a process: stdin for pipe processes, pty for terminal ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessInput {
    #[serde(with = "crate::b64")]
    Stdin(Bytes),
    #[serde(with = "crate::b64")]
    Pty(Bytes),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SendInputRequest {
    pub process: Option<ProcessSelector>,
    pub input: Option<ProcessInput>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// `StreamInputRequest`: a client stream whose first message selects the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputRequest {
    Start {
        #[serde(default)]
        process: Option<ProcessSelector>,
    },
    Data {
        #[serde(default)]
        input: Option<ProcessInput>,
    },
    Keepalive {},
}

/// `process.Signal` enum; proto3 JSON sends names, numbers are accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Unspecified,
    Sigterm,
    Sigkill,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Unspecified => "SIGNAL_UNSPECIFIED",
            Signal::Sigterm => "SIGNAL_SIGTERM",
            Signal::Sigkill => "SIGNAL_SIGKILL",
        }
    }

    /// The Linux signal number, `None` for unspecified.
    pub fn number(self) -> Option<i32> {
        match self {
            Signal::Unspecified => None,
            Signal::Sigterm => Some(15),
            Signal::Sigkill => Some(9),
        }
    }
}

impl Serialize for Signal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => match s.as_str() {
                "SIGNAL_UNSPECIFIED" => Ok(Signal::Unspecified),
                "SIGNAL_SIGTERM" => Ok(Signal::Sigterm),
                "SIGNAL_SIGKILL" => Ok(Signal::Sigkill),
                other => Err(serde::de::Error::custom(format!(
                    "unknown signal {other:?}"
                ))),
            },
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(0) => Ok(Signal::Unspecified),
                Some(15) => Ok(Signal::Sigterm),
                Some(9) => Ok(Signal::Sigkill),
                _ => Err(serde::de::Error::custom(format!(
                    "unknown signal number {n}"
                ))),
            },
            serde_json::Value::Null => Ok(Signal::Unspecified),
            other => Err(serde::de::Error::custom(format!(
                "signal must be a name, got {other}"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SendSignalRequest {
    pub process: Option<ProcessSelector>,
    pub signal: Signal,
}

impl Default for SendSignalRequest {
    fn default() -> Self {
        Self {
            process: None,
            signal: Signal::Unspecified,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CloseStdinRequest {
    pub process: Option<ProcessSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    pub process: Option<ProcessSelector>,
    pub pty: Option<Pty>,
}

/// Output of a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessOutput {
    #[serde(with = "crate::b64")]
    Stdout(Bytes),
    #[serde(with = "crate::b64")]
    Stderr(Bytes),
    #[serde(with = "crate::b64")]
    Pty(Bytes),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One event of a process stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start { pid: u32 },
    Data(ProcessOutput),
    End(EndEvent),
    Keepalive {},
}

/// `StartResponse` and `ConnectResponse` share this shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEventMessage {
    pub event: ProcessEvent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_proto3_json_shape() {
        let start = ProcessEventMessage {
            event: ProcessEvent::Start { pid: 7 },
        };
        assert_eq!(
            serde_json::to_string(&start).expect("ser"),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        let data = ProcessEventMessage {
            event: ProcessEvent::Data(ProcessOutput::Stdout(Bytes::from_static(b"hi\n"))),
        };
        assert_eq!(
            serde_json::to_string(&data).expect("ser"),
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#
        );
        let end = ProcessEventMessage {
            event: ProcessEvent::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_string(&end).expect("ser"),
            r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#
        );
        let ka = ProcessEventMessage {
            event: ProcessEvent::Keepalive {},
        };
        assert_eq!(
            serde_json::to_string(&ka).expect("ser"),
            r#"{"event":{"keepalive":{}}}"#
        );
    }

    #[test]
    fn requests_parse_sdk_json() {
        let req: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"unknownField":1}"#,
        )
        .expect("parses");
        let p = req.process.expect("process");
        assert_eq!(p.cmd, "/bin/bash");
        assert_eq!(p.envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(req.stdin, Some(false));
        let sig: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":3},"signal":"SIGNAL_SIGKILL"}"#)
                .expect("parses");
        assert_eq!(sig.signal, Signal::Sigkill);
        assert_eq!(sig.process, Some(ProcessSelector::Pid(3)));
        let input: SendInputRequest =
            serde_json::from_str(r#"{"process":{"tag":"t"},"input":{"stdin":"aGk="}}"#)
                .expect("parses");
        assert_eq!(
            input.input,
            Some(ProcessInput::Stdin(Bytes::from_static(b"hi")))
        );
        let stream: StreamInputRequest =
            serde_json::from_str(r#"{"start":{"process":{"pid":1}}}"#).expect("parses");
        assert_eq!(
            stream,
            StreamInputRequest::Start {
                process: Some(ProcessSelector::Pid(1))
            }
        );
    }
}

/// Signal names as envd reports them in `end.status` (`"signal: killed"`), Go's wording.
const SIGNAL_NAMES: &[(i32, &str)] = &[
    (1, "hangup"),
    (2, "interrupt"),
    (3, "quit"),
    (4, "illegal instruction"),
    (5, "trace/breakpoint trap"),
    (6, "aborted"),
    (7, "bus error"),
    (8, "floating point exception"),
    (9, "killed"),
    (10, "user defined signal 1"),
    (11, "segmentation fault"),
    (12, "user defined signal 2"),
    (13, "broken pipe"),
    (14, "alarm clock"),
    (15, "terminated"),
    (24, "CPU time limit exceeded"),
    (25, "file size limit exceeded"),
];

impl EndEvent {
    /// The end of a process that exited with `code`.
    pub fn exited(code: i32) -> Self {
        EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        }
    }

    /// The end of a process killed by signal `signo` (exit code -1, as Go's envd reports).
    pub fn signaled(signo: i32) -> Self {
        let name = SIGNAL_NAMES
            .iter()
            .find(|(n, _)| *n == signo)
            .map(|(_, name)| (*name).to_string())
            .unwrap_or_else(|| format!("signal {signo}"));
        EndEvent {
            exit_code: -1,
            exited: false,
            status: format!("signal: {name}"),
            error: None,
        }
    }

    /// The signal that ended the process, when it was killed by one.
    pub fn signal(&self) -> Option<i32> {
        let name = self.status.strip_prefix("signal: ")?;
        SIGNAL_NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(signo, _)| *signo)
            .or_else(|| name.strip_prefix("signal ").and_then(|n| n.parse().ok()))
    }

    /// A shell-style exit code: the exit status, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match self.signal() {
            Some(signo) if !self.exited => 128 + signo,
            _ => self.exit_code,
        }
    }
}

#[cfg(test)]
mod end_tests {
    use super::*;

    #[test]
    fn signal_status_round_trips() {
        let e = EndEvent::signaled(9);
        assert_eq!(e.status, "signal: killed");
        assert_eq!(e.signal(), Some(9));
        assert_eq!(e.shell_code(), 137);
        assert_eq!(EndEvent::signaled(33).shell_code(), 161);
        assert_eq!(EndEvent::exited(3).shell_code(), 3);
        assert_eq!(EndEvent::exited(0).status, "exit status 0");
    }
}
