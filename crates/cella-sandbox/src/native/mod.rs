//! The native backend (the default on Linux): sandboxes built from kernel primitives —
//! namespaces, a pivoted root, seccomp, Landlock, dropped capabilities and cgroups — by a
//! helper process forked from a spawner that runs the `cella` binary, with envd as PID 1
//! inside.

pub mod cgroup;
pub mod egress;
pub mod init;
pub mod landlock;
pub mod rootfs;
pub mod seccomp;
pub mod spawner;
pub mod sys;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::watch;

use crate::backend::{Backend, BoxFuture, Instance, SandboxError, Transport, Usage};
use crate::spec::{SandboxSpec, WORKSPACE};
use cgroup::CgroupPaths;
use init::{GuestConfig, InitReport, InitRequest};
pub use spawner::{SPAWNER_SUBCOMMAND, Spawner};

use crate::template::{Catalog, CatalogError, Resolved};

/// Where the native backend keeps things.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// The `cella` binary (re-run as the [`Spawner`] of sandbox helpers).
    pub helper: PathBuf,
    /// Runtime files: one directory per sandbox (sockets, logs, mount points).
    pub run_dir: PathBuf,
    /// Persistent data: prepared templates.
    pub data_dir: PathBuf,
    /// First host id of the range sandboxes map to when cella runs as root.
    pub id_base: u32,
    /// The egress proxy serving sandboxes' network policies; without it sandboxes have no
    /// way out of their network namespace at all.
    pub egress: Option<crate::network::EgressProxy>,
}

impl NativeConfig {
    /// Defaults: `/run/cella` and `/var/lib/cella` as root, per-user directories otherwise.
    pub fn with_helper(helper: PathBuf) -> Self {
        let root = sys::geteuid() == 0;
        let run_dir = std::env::var_os("CELLA_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                if root {
                    PathBuf::from("/run/cella")
                } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
                    PathBuf::from(x).join("cella")
                } else {
                    PathBuf::from(format!("/tmp/cella-{}", sys::geteuid()))
                }
            });
        let data_dir = std::env::var_os("CELLA_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                if root {
                    PathBuf::from("/var/lib/cella")
                } else {
                    std::env::var_os("HOME")
                        .map(|h| PathBuf::from(h).join(".local/share/cella"))
                        .unwrap_or_else(|| PathBuf::from("/tmp/cella-data"))
                }
            });
        NativeConfig {
            helper,
            run_dir,
            data_dir,
            id_base: 1_000_000,
            egress: None,
        }
    }
}

/// What the native backend records about a sandbox to find it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NativeState {
    pub helper_pid: i32,
    pub init_pid: i32,
    pub dir: PathBuf,
    pub cgroup: CgroupPaths,
    pub rootless: bool,
}

pub struct NativeBackend {
    config: NativeConfig,
    etc: PathBuf,
    catalog: Catalog,
    spawner: Spawner,
}

impl NativeBackend {
    /// Prepares the base template's `/etc` (once per data directory) and the run directory,
    /// and starts the helper spawner from `config.helper`.
    pub fn new(config: NativeConfig) -> Result<Self, SandboxError> {
        let spawner = Spawner::start(&config.helper).map_err(|source| SandboxError::Io {
            what: "starting the sandbox helper spawner".into(),
            source,
        })?;
        Self::with_spawner(config, spawner)
    }

    /// Like [`NativeBackend::new`], with a spawner the caller started (e.g. forked early with
    /// [`Spawner::fork_helper`]).
    pub fn with_spawner(config: NativeConfig, spawner: Spawner) -> Result<Self, SandboxError> {
        let etc = config.data_dir.join("templates/base/etc");
        rootfs::prepare_etc(&etc).map_err(|source| SandboxError::Io {
            what: format!("preparing the base template in {}", etc.display()),
            source,
        })?;
        std::fs::create_dir_all(&config.run_dir).map_err(|source| SandboxError::Io {
            what: format!("creating {}", config.run_dir.display()),
            source,
        })?;
        sweep_ended(&config.run_dir);
        let catalog = Catalog::new(&config.data_dir, config.id_base);
        Ok(NativeBackend {
            config,
            etc,
            catalog,
            spawner,
        })
    }

    pub fn config(&self) -> &NativeConfig {
        &self.config
    }

    /// The templates of this backend's data directory.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn resolve_template(&self, name: &str) -> Result<Resolved, SandboxError> {
        self.catalog.resolve(name).map_err(|e| match e {
            CatalogError::Unknown { name, known } => SandboxError::UnknownTemplate { name, known },
            other => SandboxError::TemplateUnavailable(other.to_string()),
        })
    }

    fn state(instance: &Instance) -> Result<NativeState, SandboxError> {
        serde_json::from_value(instance.state.clone())
            .map_err(|e| SandboxError::Create(format!("corrupt native sandbox state: {e}")))
    }

    async fn spawn_helper(&self, req: &InitRequest) -> Result<(Helper, InitReport), SandboxError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| SandboxError::Io { what, source }
        };
        let payload = serde_json::to_vec(req).map_err(|e| SandboxError::Create(e.to_string()))?;
        // A request the spawner never picked up (it died with the message queued) shows as a
        // broken request pipe or a report pipe closed without a word while the spawner is
        // gone: then no helper exists, and asking once more starts a new spawner.
        let mut retried = false;
        let (helper, line) = loop {
            let pipes = self
                .spawner
                .spawn_helper()
                .map_err(io("starting a sandbox helper"))?;
            let mut request = pipe::Sender::from_owned_fd(pipes.request)
                .map_err(io("sending the sandbox request"))?;
            match request.write_all(&payload).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe && !retried => {
                    retried = true;
                    self.spawner.forget_if_dead();
                    continue;
                }
                Err(e) => return Err(io("sending the sandbox request")(e)),
            }
            drop(request);
            let report = pipe::Receiver::from_owned_fd(pipes.report)
                .map_err(io("reading the helper's report"))?;
            let mut helper = Helper {
                report: BufReader::new(report),
            };
            let mut line = String::new();
            helper
                .report
                .read_line(&mut line)
                .await
                .map_err(io("reading the helper's report"))?;
            if line.is_empty() && !retried && self.spawner.forget_if_dead() {
                retried = true;
                continue;
            }
            break (helper, line);
        };
        let report: InitReport = serde_json::from_str(&line).map_err(|_| {
            SandboxError::Create(format!(
                "the sandbox helper failed without a report (is {} a cella binary?)",
                self.config.helper.display()
            ))
        })?;
        Ok((helper, report))
    }
}

/// A running helper's report pipe: its report, then [`init::ENDED_LINE`], then end of file
/// when it exits.
struct Helper {
    report: BufReader<pipe::Receiver>,
}

impl Helper {
    /// Waits for the helper to exit (end of its report pipe).
    async fn exited(mut self) {
        let mut rest = Vec::new();
        let _ = self.report.read_to_end(&mut rest).await;
    }
}

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn templates(&self) -> Vec<String> {
        self.catalog.names()
    }

    fn template_limits(&self, name: &str) -> Result<crate::spec::Limits, SandboxError> {
        self.resolve_template(name).map(|t| t.template.limits)
    }

    fn create<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
    ) -> BoxFuture<'a, Result<Instance, SandboxError>> {
        Box::pin(async move {
            let template = self.resolve_template(&spec.template)?;
            let workdir = match &spec.workdir {
                Some(w) => Some(std::fs::canonicalize(w).map_err(|source| SandboxError::Io {
                    what: format!("work directory {}", w.display()),
                    source,
                })?),
                None => None,
            };
            for (name, host) in &spec.skills {
                crate::spec::validate_skill_mount_name(name).map_err(SandboxError::Create)?;
                if !host.join("SKILL.md").is_file() && !host.join("skill.md").is_file() {
                    return Err(SandboxError::Create(format!(
                        "skill {name:?} at {} has no SKILL.md",
                        host.display()
                    )));
                }
            }
            let dir = self.config.run_dir.join(id);
            let rootless = sys::geteuid() != 0;
            let egress_dir = match &self.config.egress {
                Some(proxy) => Some(egress::attach(
                    proxy,
                    id,
                    &dir,
                    &spec.network,
                    self.config.id_base,
                    rootless,
                )?),
                None if !spec.network.is_deny_all() => {
                    return Err(SandboxError::Unsupported(
                        "network access needs the egress proxy, which this process did not start"
                            .into(),
                    ));
                }
                None => None,
            };
            // The request's variables win over the template's.
            let mut envs = template.template.env.clone();
            envs.extend(spec.envs.clone());
            let envs = match egress_dir {
                Some(_) => egress::guest_envs(&envs),
                None => envs,
            };
            let req = InitRequest {
                id: id.to_string(),
                dir: dir.clone(),
                etc: self.etc.clone(),
                template_root: template.root.clone(),
                limits: spec.limits.clone(),
                guest: GuestConfig {
                    default_user: spec.default_user.clone(),
                    default_workdir: match &workdir {
                        Some(_) => Some(WORKSPACE.to_string()),
                        None => template.template.workdir.clone(),
                    },
                    envs,
                    egress: egress_dir
                        .as_ref()
                        .map(|_| crate::network::Bridge::standard()),
                },
                egress_dir,
                workdir,
                skills: spec.skills.clone(),
                id_base: self.config.id_base,
            };
            let forget = || {
                if let Some(proxy) = &self.config.egress {
                    proxy.detach(id);
                }
            };
            let (mut helper, report) = match self.spawn_helper(&req).await {
                Ok(r) => r,
                Err(e) => {
                    forget();
                    return Err(e);
                }
            };
            if !report.ok {
                forget();
                helper.exited().await;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(SandboxError::Create(
                    report.error.unwrap_or_else(|| "unknown failure".into()),
                ));
            }
            let (tx, rx) = watch::channel(false);
            let proxy = self.config.egress.clone();
            let sandbox = id.to_string();
            tokio::spawn(async move {
                // `ended` once the sandbox's init is reaped (end of file if the helper died);
                // the helper removes the cgroups after that and exits.
                let mut line = String::new();
                let _ = helper.report.read_line(&mut line).await;
                if let Some(p) = proxy {
                    p.detach(&sandbox);
                }
                let _ = tx.send(true);
            });
            let mut warnings = report.warnings;
            if let Some(start) = &template.template.start
                && let Err(e) = start_command(&report.socket, start).await
            {
                warnings.push(format!("the template's start command failed to start: {e}"));
            }
            let state = NativeState {
                helper_pid: -1,
                init_pid: report.pid,
                dir,
                cgroup: report.cgroup,
                rootless: report.rootless,
            };
            Ok(Instance {
                id: id.to_string(),
                transport: Transport::Unix(report.socket),
                state: serde_json::to_value(&state).unwrap_or_default(),
                warnings,
                ended: rx,
            })
        })
    }

    fn kill<'a>(&'a self, instance: &'a Instance) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            let state = Self::state(instance)?;
            // A frozen cgroup would hold the kill until thawed.
            let _ = state.cgroup.set_frozen(false);
            // Killing PID 1 of the sandbox ends every process in its PID namespace.
            let _ = sys::kill(state.init_pid, libc::SIGKILL);
            let mut ended = instance.ended.clone();
            let _ = ended.wait_for(|e| *e).await;
            Ok(())
        })
    }

    fn pause(&self, instance: &Instance) -> Result<(), SandboxError> {
        let state = Self::state(instance)?;
        if !state.cgroup.can_freeze() {
            return Err(SandboxError::Unsupported("pause needs the cgroup freezer, which this host does not offer to cella (run as root)".into()));
        }
        state
            .cgroup
            .set_frozen(true)
            .map_err(|source| SandboxError::Io {
                what: "freezing the sandbox".into(),
                source,
            })
    }

    fn resume(&self, instance: &Instance) -> Result<(), SandboxError> {
        let state = Self::state(instance)?;
        state
            .cgroup
            .set_frozen(false)
            .map_err(|source| SandboxError::Io {
                what: "thawing the sandbox".into(),
                source,
            })
    }

    fn usage(&self, instance: &Instance) -> Usage {
        Self::state(instance)
            .map(|s| s.cgroup.usage())
            .map(|(cpu_ns, memory_bytes)| Usage {
                cpu_ns,
                memory_bytes,
            })
            .unwrap_or_default()
    }

    fn oom_kills(&self, instance: &Instance) -> u64 {
        Self::state(instance)
            .map(|s| s.cgroup.oom_kills())
            .unwrap_or(0)
    }

    fn set_network(
        &self,
        instance: &Instance,
        policy: &crate::network::NetworkPolicy,
    ) -> Result<(), SandboxError> {
        let state = Self::state(instance)?;
        egress::set_network(
            self.config.egress.as_ref(),
            &instance.id,
            &state.dir,
            policy,
            self.config.id_base,
            state.rootless,
        )
    }

    fn network_denials(&self) -> Option<tokio::sync::broadcast::Receiver<crate::network::Denial>> {
        self.config.egress.as_ref().map(|p| p.subscribe())
    }

    fn reattach(&self, id: &str, state: &serde_json::Value) -> Option<Instance> {
        let st: NativeState = serde_json::from_value(state.clone()).ok()?;
        let socket = st.dir.join("envd.sock");
        if !pid_alive(st.init_pid) || !socket.exists() {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        let pid = st.init_pid;
        let proxy = self.config.egress.clone();
        let sandbox = id.to_string();
        tokio::spawn(async move {
            while pid_alive(pid) {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            if let Some(p) = proxy {
                p.detach(&sandbox);
            }
            let _ = tx.send(true);
        });
        Some(Instance {
            id: id.to_string(),
            transport: Transport::Unix(socket),
            state: state.clone(),
            warnings: vec![],
            ended: rx,
        })
    }
}

/// Starts a template's start command in the background through envd (as E2B does), tagged
/// `start` so it can be found with the process list; it keeps running when this returns.
async fn start_command(socket: &Path, command: &str) -> Result<(), crate::ClientError> {
    let client = crate::EnvdClient::unix(socket.to_path_buf());
    let req = cella_proto::process::StartRequest {
        process: Some(cella_proto::process::ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), command.to_string()],
            envs: Default::default(),
            cwd: None,
        }),
        pty: None,
        tag: Some("start".into()),
        stdin: Some(false),
    };
    client.start(&req, None).await.map(drop)
}

/// Removes directories of ended sandboxes whose helpers died before removing them.
fn sweep_ended(run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(init::ENDED_PREFIX)
        {
            // A helper may be removing it right now; whoever is second finds less to do.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    // Signal 0 probes existence; a zombie (exited, not reaped) does not count as alive.
    sys::kill(pid, 0).is_ok()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// Whether `path` looks like a usable helper binary.
pub fn helper_exists(path: &Path) -> bool {
    path.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_only_ended_sandbox_directories() {
        let run = std::env::temp_dir().join(format!("cella-sweep-{}", std::process::id()));
        let ended = run.join(format!("{}abc", init::ENDED_PREFIX));
        std::fs::create_dir_all(ended.join("root")).unwrap();
        std::fs::write(ended.join("envd.log"), "x").unwrap();
        std::fs::create_dir_all(run.join("abc")).unwrap();
        sweep_ended(&run);
        assert!(!ended.exists());
        assert!(run.join("abc").exists(), "a live sandbox's directory stays");
        std::fs::remove_dir_all(&run).unwrap();
    }
}
