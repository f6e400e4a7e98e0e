//! Resource limits through cgroups: v2 where the memory and pids controllers are delegated to
//! us, v1 otherwise (one directory per controller). Also the freezer (pause/resume), OOM
//! detection and usage for metrics.
//!
//! A sandbox's cgroup is `<our cgroup>/cella/<sandbox id>` in each hierarchy, so sandboxes nest
//! under whatever cgroup runs cella and inherit its limits too.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::Limits;

/// CFS period used for CPU quotas (100 ms).
const CPU_PERIOD_US: u64 = 100_000;

/// A sandbox's cgroup, as directories the host can find again after a restart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupPaths {
    /// cgroup v2 directory, when v2 is used.
    pub v2: Option<PathBuf>,
    /// cgroup v1 directories by controller name (memory, pids, cpu, cpuacct, freezer).
    pub v1: Vec<(String, PathBuf)>,
}

/// Which cgroup setup the host offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupSupport {
    pub v2_root: Option<PathBuf>,
    pub v2_controllers: Vec<String>,
    pub v1_controllers: Vec<(String, PathBuf)>,
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// Our own cgroup path in each hierarchy (`/proc/self/cgroup`): (controllers, path).
fn own_cgroups() -> Vec<(Vec<String>, String)> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let ctrls = parts.next()?;
            let path = parts.next()?;
            Some((
                ctrls
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect(),
                path.to_string(),
            ))
        })
        .collect()
}

/// Where this process puts sandbox cgroups: the hierarchies and its own cgroup in each,
/// read once per process: helpers are forked from a spawner that read it ([`prepare`]).
struct Placement {
    support: CgroupSupport,
    own: Vec<(Vec<String>, String)>,
}

impl Placement {
    fn get() -> &'static Placement {
        static PLACEMENT: std::sync::OnceLock<Placement> = std::sync::OnceLock::new();
        PLACEMENT.get_or_init(|| Placement {
            support: CgroupSupport::detect(),
            own: own_cgroups(),
        })
    }
}

/// Reads the [`Placement`] now, so processes forked from this one do not read it again.
pub fn prepare() {
    Placement::get();
}

impl CgroupSupport {
    /// Reads what this host offers.
    pub fn detect() -> Self {
        let mut v2_root = None;
        let mut v1 = Vec::new();
        for line in mountinfo().lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = pre.split_whitespace().nth(4).unwrap_or("");
            let mut post = post.split_whitespace();
            let fstype = post.next().unwrap_or("");
            let _source = post.next();
            let opts = post.next().unwrap_or("");
            match fstype {
                "cgroup2" => v2_root = Some(PathBuf::from(mount_point)),
                "cgroup" => {
                    for c in opts.split(',') {
                        if ["memory", "pids", "cpu", "cpuacct", "freezer"].contains(&c) {
                            v1.push((c.to_string(), PathBuf::from(mount_point)));
                        }
                    }
                }
                _ => {}
            }
        }
        let v2_controllers = v2_root
            .as_ref()
            .and_then(|r| std::fs::read_to_string(r.join("cgroup.controllers")).ok())
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default();
        CgroupSupport {
            v2_root,
            v2_controllers,
            v1_controllers: v1,
        }
    }

    /// Whether v2 has the controllers sandboxes need.
    pub fn v2_usable(&self) -> bool {
        self.v2_root.is_some()
            && ["memory", "pids"]
                .iter()
                .all(|c| self.v2_controllers.iter().any(|x| x == c))
    }

    /// One line for `cella doctor`.
    pub fn describe(&self) -> String {
        if self.v2_usable() {
            format!("cgroup v2 ({})", self.v2_controllers.join(" "))
        } else if !self.v1_controllers.is_empty() {
            let names: Vec<&str> = self
                .v1_controllers
                .iter()
                .map(|(c, _)| c.as_str())
                .collect();
            let v2 = if self.v2_controllers.is_empty() {
                "none".to_string()
            } else {
                self.v2_controllers.join(" ")
            };
            format!("cgroup v1 ({}); v2 controllers: {v2}", names.join(" "))
        } else {
            "no usable cgroup controllers".to_string()
        }
    }
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    std::fs::write(dir.join(file), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", dir.join(file).display()),
        )
    })
}

impl CgroupPaths {
    /// Creates the sandbox's cgroups and applies `limits`. Returns warnings for limits that
    /// cannot be enforced here (never fails just because cgroups are missing).
    pub fn create(id: &str, limits: &Limits) -> (CgroupPaths, Vec<String>) {
        let Placement { support, own } = Placement::get();
        let mut warnings = Vec::new();
        let mut paths = CgroupPaths::default();
        if support.v2_usable() {
            let base = own
                .iter()
                .find(|(c, _)| c.is_empty())
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            let root = support.v2_root.clone().unwrap_or_default();
            let dir = root
                .join(base.trim_start_matches('/'))
                .join("cella")
                .join(id);
            match std::fs::create_dir_all(&dir) {
                Ok(()) => {
                    let mut apply = |file: &str, v: String, what: &str| {
                        if let Err(e) = write(&dir, file, &v) {
                            warnings.push(format!("{what} limit not enforced: {e}"));
                        }
                    };
                    if let Some(m) = limits.memory_bytes {
                        apply("memory.max", m.to_string(), "memory");
                        apply("memory.swap.max", "0".into(), "swap");
                    }
                    if let Some(p) = limits.pids {
                        apply("pids.max", p.to_string(), "pids");
                    }
                    if let Some(c) = limits.cpus {
                        apply(
                            "cpu.max",
                            format!("{} {CPU_PERIOD_US}", (c * CPU_PERIOD_US as f64) as u64),
                            "cpu",
                        );
                    }
                    paths.v2 = Some(dir);
                }
                Err(e) => warnings.push(format!(
                    "memory, pids and cpu limits not enforced: cannot create cgroup {}: {e}",
                    dir.display()
                )),
            }
            return (paths, warnings);
        }
        for (ctrl, mount) in &support.v1_controllers {
            let base = own
                .iter()
                .find(|(c, _)| c.contains(ctrl))
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            let dir = mount
                .join(base.trim_start_matches('/'))
                .join("cella")
                .join(id);
            if let Err(e) = std::fs::create_dir_all(&dir) {
                if limit_requested(ctrl, limits) {
                    warnings.push(format!(
                        "{ctrl} limit not enforced: cannot create cgroup {}: {e}",
                        dir.display()
                    ));
                }
                continue;
            }
            let result = match ctrl.as_str() {
                "memory" => limits.memory_bytes.map_or(Ok(()), |m| {
                    write(&dir, "memory.limit_in_bytes", &m.to_string()).map(|()| {
                        // Swap accounting may be off; the limit above still holds.
                        let _ = write(&dir, "memory.memsw.limit_in_bytes", &m.to_string());
                    })
                }),
                "pids" => limits
                    .pids
                    .map_or(Ok(()), |p| write(&dir, "pids.max", &p.to_string())),
                "cpu" => limits.cpus.map_or(Ok(()), |c| {
                    write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string()).and_then(|()| {
                        write(
                            &dir,
                            "cpu.cfs_quota_us",
                            &((c * CPU_PERIOD_US as f64) as u64).to_string(),
                        )
                    })
                }),
                _ => Ok(()),
            };
            if let Err(e) = result {
                warnings.push(format!("{ctrl} limit not enforced: {e}"));
            }
            paths.v1.push((ctrl.clone(), dir));
        }
        for ctrl in ["memory", "pids", "cpu"] {
            if limit_requested(ctrl, limits)
                && !paths.v1.iter().any(|(c, _)| c == ctrl)
                && !warnings.iter().any(|w| w.starts_with(ctrl))
            {
                warnings.push(format!(
                    "{ctrl} limit not enforced: no {ctrl} cgroup controller is available"
                ));
            }
        }
        (paths, warnings)
    }

    fn dirs(&self) -> Vec<&Path> {
        self.v2
            .iter()
            .map(PathBuf::as_path)
            .chain(self.v1.iter().map(|(_, p)| p.as_path()))
            .collect()
    }

    fn v1_dir(&self, ctrl: &str) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(c, _)| c == ctrl)
            .map(|(_, p)| p.as_path())
    }

    /// The files a single-threaded process writes `0` into to join every cgroup of the
    /// sandbox the fast way (`tasks` on v1, `cgroup.procs` on v2; see `join_current`), for
    /// callers that place a process themselves, e.g. benchmark baselines.
    pub fn join_files(&self) -> Vec<PathBuf> {
        match &self.v2 {
            Some(d) => vec![d.join("cgroup.procs")],
            None => self.v1.iter().map(|(_, d)| d.join("tasks")).collect(),
        }
    }

    /// Moves process `pid` (and its threads) into every cgroup of the sandbox.
    pub fn attach(&self, pid: i32) -> io::Result<()> {
        for dir in self.dirs() {
            write(dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// Moves the calling process — which must be single-threaded — into every cgroup of the
    /// sandbox, so that children it clones are born inside them. On cgroup v1 it writes `0`
    /// (the current thread) to each `tasks` file: moving one thread skips the global
    /// thread-group lock whose write side waits for an RCU grace period (~10-15 ms) in
    /// `cgroup.procs`. Returns `false` on cgroup v2 (the caller attaches the child instead).
    ///
    /// The caller counts against the pids limit while it stays, so that limit is raised by one
    /// for it: the sandbox still gets the number of processes it asked for.
    pub fn join_current(&self, limits: &Limits) -> io::Result<bool> {
        if self.v2.is_some() || self.v1.is_empty() {
            return Ok(false);
        }
        if let (Some(p), Some(dir)) = (limits.pids, self.v1_dir("pids")) {
            write(dir, "pids.max", &(u64::from(p) + 1).to_string())?;
        }
        for (_, dir) in &self.v1 {
            write(dir, "tasks", "0")?;
        }
        Ok(true)
    }

    /// Moves the calling single-threaded process back to the cgroups it came from (the
    /// parents of `cella/`), so the sandbox's cgroups can be removed.
    pub fn leave_current(&self) {
        for (_, dir) in &self.v1 {
            if let Some(home) = dir.parent().and_then(Path::parent) {
                let _ = write(home, "tasks", "0");
            }
        }
    }

    /// Whether pause/resume can work.
    pub fn can_freeze(&self) -> bool {
        self.v2.is_some() || self.v1_dir("freezer").is_some()
    }

    /// Freezes (`true`) or thaws (`false`) every process of the sandbox.
    pub fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        if let Some(dir) = &self.v2 {
            return write(dir, "cgroup.freeze", if frozen { "1" } else { "0" });
        }
        let dir = self.v1_dir("freezer").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "no freezer cgroup controller on this host",
            )
        })?;
        write(
            dir,
            "freezer.state",
            if frozen { "FROZEN" } else { "THAWED" },
        )?;
        // FREEZING is transient; wait until the state settles.
        let want = if frozen { "FROZEN" } else { "THAWED" };
        for _ in 0..200 {
            if std::fs::read_to_string(dir.join("freezer.state"))
                .map(|s| s.trim() == want)
                .unwrap_or(false)
            {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("cgroup {} did not reach {want}", dir.display()),
        ))
    }

    /// Number of OOM kills so far.
    pub fn oom_kills(&self) -> u64 {
        let (dir, file) = match (&self.v2, self.v1_dir("memory")) {
            (Some(d), _) => (d.as_path(), "memory.events"),
            (None, Some(d)) => (d, "memory.oom_control"),
            _ => return 0,
        };
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// (CPU time used in nanoseconds, memory in use in bytes).
    pub fn usage(&self) -> (u64, u64) {
        let read_u64 = |p: PathBuf| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        if let Some(d) = &self.v2 {
            let cpu = std::fs::read_to_string(d.join("cpu.stat"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("usage_usec ")
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
                * 1000;
            return (cpu, read_u64(d.join("memory.current")).unwrap_or(0));
        }
        let cpu = self
            .v1_dir("cpuacct")
            .and_then(|d| read_u64(d.join("cpuacct.usage")))
            .unwrap_or(0);
        let mem = self
            .v1_dir("memory")
            .and_then(|d| read_u64(d.join("memory.usage_in_bytes")))
            .unwrap_or(0);
        (cpu, mem)
    }

    /// Removes the cgroups (after every process in them has exited). Retries briefly: the
    /// kernel may still be tearing tasks down.
    pub fn remove(&self) {
        for dir in self.dirs() {
            for _ in 0..100 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
                }
            }
        }
    }
}

fn limit_requested(ctrl: &str, limits: &Limits) -> bool {
    match ctrl {
        "memory" => limits.memory_bytes.is_some(),
        "pids" => limits.pids.is_some(),
        "cpu" => limits.cpus.is_some(),
        _ => false,
    }
}
