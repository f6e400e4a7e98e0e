//! The processes envd started: their identity, input, output subscribers and end.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use cella_proto::RpcError;
use cella_proto::process::{EndEvent, ProcessConfig, ProcessEvent, ProcessInfo, ProcessSelector};
use tokio::sync::mpsc;

use super::pty::PtyMaster;

/// Where a process's input goes.
pub enum Input {
    /// Stdin was not requested: input is refused.
    None,
    Pipe(tokio::net::unix::pipe::Sender),
    Pty(Arc<PtyMaster>),
}

/// Subscribers get events through bounded channels: a slow reader slows the process's output
/// rather than growing memory without bound.
pub type Subscriber = mpsc::Sender<ProcessEvent>;

/// Capacity of each subscriber's event queue.
pub const SUBSCRIBER_QUEUE: usize = 256;

pub struct ProcessEntry {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: ProcessConfig,
    pub input: tokio::sync::Mutex<Input>,
    pub pty: Option<Arc<PtyMaster>>,
    subscribers: Mutex<Vec<Subscriber>>,
    /// Kept so the process's stdin pipe stays open when stdin was not requested as a pipe.
    pub _keep: Option<OwnedFd>,
}

impl ProcessEntry {
    pub fn new(
        pid: u32,
        tag: Option<String>,
        config: ProcessConfig,
        input: Input,
        pty: Option<Arc<PtyMaster>>,
    ) -> Self {
        ProcessEntry {
            pid,
            tag,
            config,
            input: tokio::sync::Mutex::new(input),
            pty,
            subscribers: Mutex::new(Vec::new()),
            _keep: None,
        }
    }

    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: Some(self.config.clone()),
            pid: self.pid,
            tag: self.tag.clone(),
        }
    }

    /// Adds a subscriber whose first event is `start{pid}`.
    pub fn subscribe(&self) -> mpsc::Receiver<ProcessEvent> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        // The channel is new and empty, so this cannot fail for lack of room.
        let _ = tx.try_send(ProcessEvent::Start { pid: self.pid });
        self.lock_subscribers().push(tx);
        rx
    }

    fn lock_subscribers(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers an event to every live subscriber, waiting for room (back-pressure).
    pub async fn publish(&self, event: ProcessEvent) {
        let subs: Vec<Subscriber> = {
            let mut guard = self.lock_subscribers();
            guard.retain(|s| !s.is_closed());
            guard.clone()
        };
        for s in subs {
            let _ = s.send(event.clone()).await;
        }
    }

    /// Delivers the end event and drops every subscriber.
    pub async fn finish(&self, end: EndEvent) {
        self.publish(ProcessEvent::End(end)).await;
        self.lock_subscribers().clear();
    }
}

/// All live processes, by pid.
#[derive(Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<ProcessEntry>>>,
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<ProcessEntry>>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a live process already carries `tag`.
    pub fn tag_in_use(&self, tag: &str) -> bool {
        self.lock().values().any(|p| p.tag.as_deref() == Some(tag))
    }

    pub fn insert(&self, entry: Arc<ProcessEntry>) {
        self.lock().insert(entry.pid, entry);
    }

    pub fn remove(&self, pid: u32) {
        self.lock().remove(&pid);
    }

    pub fn find(&self, selector: Option<&ProcessSelector>) -> Result<Arc<ProcessEntry>, RpcError> {
        let Some(selector) = selector else {
            return Err(RpcError::invalid_argument(
                "process selector (pid or tag) is required",
            ));
        };
        let procs = self.lock();
        let found = match selector {
            ProcessSelector::Pid(pid) => procs.get(pid).cloned(),
            ProcessSelector::Tag(tag) => procs
                .values()
                .find(|p| p.tag.as_deref() == Some(tag))
                .cloned(),
        };
        found.ok_or_else(|| {
            RpcError::not_found(format!("{selector} not found (it may have exited)"))
        })
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut v: Vec<ProcessInfo> = self.lock().values().map(|p| p.info()).collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    pub fn pids(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }
}
