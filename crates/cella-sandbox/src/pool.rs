//! Warm pools: sandboxes built ahead of demand, per template, so that a create whose spec
//! matches is served by handing over a ready sandbox while the pool refills in the background.
//!
//! A pooled sandbox has no owner, no end time and no per-caller environment yet; claiming it
//! sets those (environment variables through envd's `/init`). Anything else a request asks for
//! (limits, network, skills, working directory, …) must equal the pool's spec, or the request
//! is built cold. Pooled sandboxes are journalled in a directory so that ones left behind by a
//! crashed process are destroyed at the next start instead of leaking.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use crate::backend::Instance;
use crate::spec::SandboxSpec;

/// Counters of one pool (exported as metrics by the server).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PoolStats {
    pub template: String,
    pub target: usize,
    pub ready: usize,
    /// Creates served from the pool.
    pub hits: u64,
    /// Creates that matched the pool's template but found it empty.
    pub misses: u64,
    /// Sandboxes the pool failed to build.
    pub failures: u64,
}

/// The part of a spec a pooled sandbox is built from: everything except what a claim sets.
pub fn pool_shape(spec: &SandboxSpec) -> SandboxSpec {
    let mut shape = spec.clone();
    shape.envs.clear();
    shape.metadata.clear();
    shape.lifetime = None;
    // A claim applies the request's network policy to the pooled sandbox.
    shape.network = Default::default();
    shape
}

/// One ready sandbox.
pub(crate) struct Ready {
    pub id: String,
    pub instance: Instance,
}

/// Ready sandboxes of one template.
pub struct WarmPool {
    pub(crate) spec: SandboxSpec,
    pub(crate) target: usize,
    ready: Mutex<VecDeque<Ready>>,
    /// Wakes the refill task (a claim happened, or shutdown).
    pub(crate) wake: Notify,
    hits: AtomicU64,
    misses: AtomicU64,
    failures: AtomicU64,
}

impl WarmPool {
    pub(crate) fn new(spec: SandboxSpec, target: usize) -> Self {
        WarmPool {
            spec: pool_shape(&spec),
            target,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Ready>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn matches(&self, spec: &SandboxSpec) -> bool {
        pool_shape(spec) == self.spec
    }

    pub(crate) fn len(&self) -> usize {
        self.queue().len()
    }

    pub(crate) fn push(&self, ready: Ready) {
        self.queue().push_back(ready);
    }

    /// The oldest ready sandbox that is still alive; dead ones are handed back for cleanup.
    pub(crate) fn take(&self) -> (Option<Ready>, Vec<Ready>) {
        let mut dead = Vec::new();
        let mut q = self.queue();
        while let Some(r) = q.pop_front() {
            if *r.instance.ended.borrow() {
                dead.push(r);
                continue;
            }
            drop(q);
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_one();
            return (Some(r), dead);
        }
        drop(q);
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        (None, dead)
    }

    pub(crate) fn drain(&self) -> Vec<Ready> {
        self.queue().drain(..).collect()
    }

    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            template: self.spec.template.clone(),
            target: self.target,
            ready: self.len(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

/// Pause between failed builds, so a broken template does not spin.
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// Files recording pooled sandboxes: `<dir>/<id>.json` holds the backend state needed to
/// destroy the sandbox after a crash.
#[derive(Debug, Clone)]
pub struct PoolJournal {
    dir: PathBuf,
}

impl PoolJournal {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PoolJournal { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub(crate) fn record(&self, id: &str, state: &serde_json::Value) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{id}.tmp"));
        std::fs::write(&tmp, state.to_string())?;
        std::fs::rename(tmp, self.path(id))
    }

    pub(crate) fn forget(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Sandboxes a previous process left in its pools: (id, backend state).
    pub(crate) fn leftovers(&self) -> Vec<(String, serde_json::Value)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            let state = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(serde_json::Value::Null);
            out.push((id.to_string(), state));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_ignores_what_a_claim_sets_and_nothing_else() {
        let pool = WarmPool::new(SandboxSpec::default(), 2);
        let mut req = SandboxSpec::default();
        req.envs.insert("A".into(), "1".into());
        req.metadata.insert("k".into(), "v".into());
        req.lifetime = Some(Duration::from_secs(60));
        req.network = crate::network::NetworkPolicy::internet();
        assert!(pool.matches(&req));
        let mut other = req.clone();
        other.template = "other".into();
        assert!(!pool.matches(&other));
        let mut limits = req.clone();
        limits.limits.memory_bytes = Some(1 << 20);
        assert!(!pool.matches(&limits));
        let mut wd = req;
        wd.workdir = Some("/srv".into());
        assert!(!pool.matches(&wd));
    }

    #[test]
    fn journal_round_trips_and_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let j = PoolJournal::new(dir.path().join("pool"));
        assert!(j.leftovers().is_empty());
        j.record("abc", &serde_json::json!({"x": 1})).unwrap();
        j.record("def", &serde_json::json!({"y": 2})).unwrap();
        let mut left = j.leftovers();
        left.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(left[0], ("abc".into(), serde_json::json!({"x": 1})));
        assert_eq!(left.len(), 2);
        j.forget("abc");
        assert_eq!(j.leftovers().len(), 1);
    }
}
