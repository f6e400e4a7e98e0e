//! How this node runs jobs: its name, concurrency, timeouts, the watchdog, retries and the
//! artifacts cap. The model comes from the server's environment (`CELLA_MODEL`,
//! `CELLA_BASE_URL`, `CELLA_MODEL_API_KEY`, provider keys) and `<data-dir>/cella.toml`, resolved per
//! job by cella-llm.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// This node's name in the queue (leases and per-node concurrency). Two servers sharing a
    /// database need different names.
    pub node: String,
    /// Most jobs running on this node at once.
    pub max_running: u32,
    /// Most jobs of one tenant running at once (across nodes).
    pub max_running_per_tenant: u32,
    /// Wall-clock limit of a job that asks for none.
    pub default_timeout: Duration,
    /// Upper bound on any job's wall-clock limit.
    pub max_timeout: Duration,
    /// A running job without any event for this long is cancelled.
    pub watchdog: Duration,
    /// How long a claim holds without renewal (renewed every third of it).
    pub lease: Duration,
    /// Runs of a job in all: a run failing on a transient model error (after the agent's own
    /// per-call retries) is queued again until this many runs were made.
    pub max_attempts: u32,
    /// Largest workspace `artifacts.zip` serves (bytes of file content).
    pub artifacts_max_bytes: u64,
    /// How often the scheduler looks for work when nothing woke it.
    pub poll_interval: Duration,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            node: node_name(),
            max_running: 8,
            max_running_per_tenant: 4,
            default_timeout: Duration::from_secs(30 * 60),
            max_timeout: Duration::from_secs(24 * 3600),
            watchdog: Duration::from_secs(10 * 60),
            lease: Duration::from_secs(30),
            max_attempts: 3,
            artifacts_max_bytes: 256 << 20,
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// The host's name, else `local`.
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".to_owned())
}
