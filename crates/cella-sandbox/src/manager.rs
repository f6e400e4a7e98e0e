//! `SandboxManager`: the lifecycle of sandboxes on one host, independent of the backend —
//! create (from a warm pool when one matches), look up, list, pause, resume, kill, end times
//! (reaped at their deadline), and adopting sandboxes that outlived a restart of the process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime};

use crate::backend::{Backend, Instance, SandboxError, Usage};
use crate::client::EnvdClient;
use crate::pool::{PoolJournal, PoolStats, Ready, WarmPool};
use crate::spec::SandboxSpec;

/// One live sandbox.
pub struct Sandbox {
    pub id: String,
    pub spec: SandboxSpec,
    pub instance: Instance,
    pub envd: EnvdClient,
    pub started_at: SystemTime,
    /// Served from a warm pool rather than built for this request.
    pub from_pool: bool,
    end_at: Mutex<Option<SystemTime>>,
    paused: Mutex<bool>,
}

impl Sandbox {
    pub fn end_at(&self) -> Option<SystemTime> {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_paused(&self) -> bool {
        *self.paused.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn has_ended(&self) -> bool {
        *self.instance.ended.borrow()
    }
}

/// Owns every sandbox of this process.
pub struct SandboxManager {
    backend: Arc<dyn Backend>,
    sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    /// Warm pools by template name.
    pools: RwLock<HashMap<String, Arc<WarmPool>>>,
    journal: Mutex<Option<PoolJournal>>,
    /// Set at shutdown: pools stop refilling.
    closing: AtomicBool,
}

impl SandboxManager {
    /// Creates the manager and starts its deadline reaper (call inside a tokio runtime).
    pub fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        let mgr = Arc::new(SandboxManager {
            backend,
            sandboxes: RwLock::new(HashMap::new()),
            pools: RwLock::new(HashMap::new()),
            journal: Mutex::new(None),
            closing: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&mgr);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let Some(mgr) = weak.upgrade() else { return };
                mgr.reap().await;
            }
        });
        mgr
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.read().unwrap_or_else(|p| p.into_inner())
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills sandboxes past their end time and forgets ended ones.
    async fn reap(&self) {
        let now = SystemTime::now();
        let due: Vec<Arc<Sandbox>> = self
            .map()
            .values()
            .filter(|s| s.end_at().is_some_and(|e| e <= now) || s.has_ended())
            .cloned()
            .collect();
        for sb in due {
            if !sb.has_ended() {
                tracing::info!(sandbox = %sb.id, "end time reached: killing sandbox");
                let _ = self.backend.kill(&sb.instance).await;
            }
            self.map_mut().remove(&sb.id);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn register(
        &self,
        id: String,
        spec: SandboxSpec,
        instance: Instance,
        started_at: SystemTime,
        end_at: Option<SystemTime>,
        paused: bool,
        from_pool: bool,
    ) -> Arc<Sandbox> {
        let envd = EnvdClient::for_transport(&instance.transport);
        let sb = Arc::new(Sandbox {
            id: id.clone(),
            spec,
            instance,
            envd,
            started_at,
            from_pool,
            end_at: Mutex::new(end_at),
            paused: Mutex::new(paused),
        });
        self.map_mut().insert(id, sb.clone());
        sb
    }

    /// Creates a sandbox: a ready one from the template's warm pool when the spec matches the
    /// pool's, else a new one.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Arc<Sandbox>, SandboxError> {
        if let Some(sb) = self.claim_warm(&spec).await {
            return Ok(sb);
        }
        self.create_with_id(cella_proto::ids::new_sandbox_id(), spec)
            .await
    }

    fn journal(&self) -> Option<PoolJournal> {
        self.journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Destroys a pooled sandbox that will not be handed out.
    async fn discard(&self, ready: Ready) {
        let _ = self.backend.kill(&ready.instance).await;
        if let Some(j) = self.journal() {
            j.forget(&ready.id);
        }
    }

    /// Gives a pooled sandbox what a claim sets beyond the pool's spec: environment variables
    /// and (pooled sandboxes start with none) the network policy.
    async fn hand_over(&self, instance: &Instance, spec: &SandboxSpec) -> Result<(), String> {
        if !spec.envs.is_empty() {
            EnvdClient::for_transport(&instance.transport)
                .set_envs(&spec.envs)
                .await
                .map_err(|e| e.to_string())?;
        }
        if spec.network != crate::network::NetworkPolicy::default() {
            self.backend
                .set_network(instance, &spec.network)
                .map_err(|e| format!("network policy: {e}"))?;
        }
        Ok(())
    }

    async fn claim_warm(&self, spec: &SandboxSpec) -> Option<Arc<Sandbox>> {
        let pool = self
            .pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&spec.template)
            .filter(|p| p.matches(spec))
            .cloned()?;
        let (ready, dead) = pool.take();
        for d in dead {
            self.discard(d).await;
        }
        let ready = ready?;
        if let Some(j) = self.journal() {
            j.forget(&ready.id);
        }
        if let Err(e) = self.hand_over(&ready.instance, spec).await {
            tracing::warn!(sandbox = %ready.id, "handing over a pooled sandbox: {e}; building one instead");
            let _ = self.backend.kill(&ready.instance).await;
            return None;
        }
        let now = SystemTime::now();
        let end = spec.lifetime.map(|l| now + l);
        Some(self.register(
            ready.id,
            spec.clone(),
            ready.instance,
            now,
            end,
            false,
            true,
        ))
    }

    /// Starts warm pools: `(spec, size)` per template. Sandboxes a previous process left in its
    /// pools (recorded in `journal`) are destroyed first; returns how many.
    pub async fn start_pools(
        self: &Arc<Self>,
        journal: PoolJournal,
        pools: Vec<(SandboxSpec, usize)>,
    ) -> usize {
        let mut swept = 0;
        for (id, state) in journal.leftovers() {
            if let Some(instance) = self.backend.reattach(&id, &state) {
                let _ = self.backend.kill(&instance).await;
                swept += 1;
            }
            journal.forget(&id);
        }
        *self.journal.lock().unwrap_or_else(|p| p.into_inner()) = Some(journal);
        for (spec, size) in pools {
            if size == 0 {
                continue;
            }
            let pool = Arc::new(WarmPool::new(spec, size));
            self.pools
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(pool.spec.template.clone(), pool.clone());
            tokio::spawn(refill(Arc::downgrade(self), pool));
        }
        swept
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        let mut v: Vec<PoolStats> = self
            .pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|p| p.stats())
            .collect();
        v.sort_by(|a, b| a.template.cmp(&b.template));
        v
    }

    /// Stops refilling and destroys every pooled (unclaimed) sandbox.
    pub async fn drain_pools(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let pools: Vec<Arc<WarmPool>> = self
            .pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for pool in pools {
            pool.wake.notify_one();
            for r in pool.drain() {
                self.discard(r).await;
            }
        }
    }

    pub async fn create_with_id(
        &self,
        id: String,
        spec: SandboxSpec,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let instance = self.backend.create(&id, &spec).await?;
        let now = SystemTime::now();
        let end = spec.lifetime.map(|l| now + l);
        Ok(self.register(id, spec, instance, now, end, false, false))
    }

    /// Adopts a sandbox that survived a restart, from the state its backend recorded.
    pub fn adopt(
        &self,
        id: &str,
        spec: SandboxSpec,
        state: &serde_json::Value,
        started_at: SystemTime,
        end_at: Option<SystemTime>,
        paused: bool,
    ) -> Option<Arc<Sandbox>> {
        let instance = self.backend.reattach(id, state)?;
        if let Err(e) = self.backend.set_network(&instance, &spec.network) {
            tracing::warn!(sandbox = id, "network policy not restored: {e}");
        }
        Some(self.register(
            id.to_string(),
            spec,
            instance,
            started_at,
            end_at,
            paused,
            false,
        ))
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, SandboxError> {
        self.map()
            .get(id)
            .filter(|s| !s.has_ended())
            .cloned()
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))
    }

    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut v: Vec<Arc<Sandbox>> = self
            .map()
            .values()
            .filter(|s| !s.has_ended())
            .cloned()
            .collect();
        v.sort_by_key(|s| s.started_at);
        v
    }

    /// Destroys a sandbox and waits until it is gone.
    pub async fn kill(&self, id: &str) -> Result<(), SandboxError> {
        let sb = self
            .map_mut()
            .remove(id)
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))?;
        self.backend.kill(&sb.instance).await
    }

    pub fn pause(&self, id: &str) -> Result<(), SandboxError> {
        let sb = self.get(id)?;
        let mut paused = sb.paused.lock().unwrap_or_else(|p| p.into_inner());
        if *paused {
            return Err(SandboxError::Paused(id.to_string()));
        }
        self.backend.pause(&sb.instance)?;
        *paused = true;
        Ok(())
    }

    pub fn resume(&self, id: &str) -> Result<(), SandboxError> {
        let sb = self.get(id)?;
        let mut paused = sb.paused.lock().unwrap_or_else(|p| p.into_inner());
        if !*paused {
            return Err(SandboxError::NotPaused(id.to_string()));
        }
        self.backend.resume(&sb.instance)?;
        *paused = false;
        Ok(())
    }

    /// Sets (or clears) the time at which the sandbox is killed.
    pub fn set_end(&self, id: &str, end: Option<SystemTime>) -> Result<(), SandboxError> {
        let sb = self.get(id)?;
        *sb.end_at.lock().unwrap_or_else(|p| p.into_inner()) = end;
        Ok(())
    }

    /// Replaces a running sandbox's egress policy (new connections follow it).
    pub fn set_network(
        &self,
        id: &str,
        policy: &crate::network::NetworkPolicy,
    ) -> Result<(), SandboxError> {
        let sb = self.get(id)?;
        self.backend.set_network(&sb.instance, policy)
    }

    pub fn usage(&self, id: &str) -> Result<Usage, SandboxError> {
        let sb = self.get(id)?;
        Ok(self.backend.usage(&sb.instance))
    }

    /// Kills every sandbox (shutdown), pooled ones included.
    pub async fn kill_all(&self) {
        self.drain_pools().await;
        let ids: Vec<String> = self.map().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(&id).await;
        }
    }
}

/// Keeps one pool at its target size, one build at a time, until the manager closes.
async fn refill(manager: Weak<SandboxManager>, pool: Arc<WarmPool>) {
    loop {
        let Some(mgr) = manager.upgrade() else { return };
        if mgr.closing.load(Ordering::SeqCst) {
            return;
        }
        if pool.len() >= pool.target {
            drop(mgr);
            pool.wake.notified().await;
            continue;
        }
        let id = cella_proto::ids::new_sandbox_id();
        match mgr.backend.create(&id, &pool.spec).await {
            Ok(instance) => {
                let ready = Ready { id, instance };
                let recorded = match mgr.journal() {
                    Some(j) => j.record(&ready.id, &ready.instance.state),
                    None => Ok(()),
                };
                if let Err(e) = recorded {
                    tracing::warn!(sandbox = %ready.id, "recording a pooled sandbox: {e}");
                    mgr.discard(ready).await;
                    pool.failed();
                    tokio::time::sleep(crate::pool::RETRY_AFTER_FAILURE).await;
                } else if mgr.closing.load(Ordering::SeqCst) {
                    mgr.discard(ready).await;
                    return;
                } else {
                    pool.push(ready);
                }
            }
            Err(e) => {
                tracing::warn!(template = %pool.spec.template, "building a pooled sandbox: {e}");
                pool.failed();
                drop(mgr);
                tokio::time::sleep(crate::pool::RETRY_AFTER_FAILURE).await;
            }
        }
    }
}
