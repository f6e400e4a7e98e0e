//! `SandboxManager`: the lifecycle of sandboxes on one host, independent of the backend —
//! create, look up, list, pause, resume, kill, end times (reaped at their deadline), and
//! adopting sandboxes that outlived a restart of the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use crate::backend::{Backend, Instance, SandboxError, Transport, Usage};
use crate::client::EnvdClient;
use crate::spec::SandboxSpec;

/// One live sandbox.
pub struct Sandbox {
    pub id: String,
    pub spec: SandboxSpec,
    pub instance: Instance,
    pub envd: EnvdClient,
    pub started_at: SystemTime,
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
}

impl SandboxManager {
    /// Creates the manager and starts its deadline reaper (call inside a tokio runtime).
    pub fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        let mgr = Arc::new(SandboxManager {
            backend,
            sandboxes: RwLock::new(HashMap::new()),
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

    fn register(
        &self,
        id: String,
        spec: SandboxSpec,
        instance: Instance,
        started_at: SystemTime,
        end_at: Option<SystemTime>,
        paused: bool,
    ) -> Arc<Sandbox> {
        let envd = match &instance.transport {
            Transport::Unix(p) => EnvdClient::unix(p.clone()),
        };
        let sb = Arc::new(Sandbox {
            id: id.clone(),
            spec,
            instance,
            envd,
            started_at,
            end_at: Mutex::new(end_at),
            paused: Mutex::new(paused),
        });
        self.map_mut().insert(id, sb.clone());
        sb
    }

    /// Creates a sandbox with a new id.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Arc<Sandbox>, SandboxError> {
        self.create_with_id(cella_proto::ids::new_sandbox_id(), spec)
            .await
    }

    pub async fn create_with_id(
        &self,
        id: String,
        spec: SandboxSpec,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let instance = self.backend.create(&id, &spec).await?;
        let now = SystemTime::now();
        let end = spec.lifetime.map(|l| now + l);
        Ok(self.register(id, spec, instance, now, end, false))
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
        Some(self.register(id.to_string(), spec, instance, started_at, end_at, paused))
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

    pub fn usage(&self, id: &str) -> Result<Usage, SandboxError> {
        let sb = self.get(id)?;
        Ok(self.backend.usage(&sb.instance))
    }

    /// Kills every sandbox (shutdown).
    pub async fn kill_all(&self) {
        let ids: Vec<String> = self.map().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(&id).await;
        }
    }
}
