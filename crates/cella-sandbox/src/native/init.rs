//! The sandbox-init helper: the `cella __sandbox-init` process that builds one sandbox and then
//! stays as its parent (like conmon): it reaps the sandbox's init and removes its cgroups and
//! files when the sandbox ends.
//!
//! The host never forks from its multi-threaded runtime: it starts this helper as a fresh
//! process, writes an [`InitRequest`] on its stdin and reads one [`InitReport`] line from its
//! stdout. The helper is single-threaded, so it may `clone` into new namespaces safely.
//!
//! Sequence: cgroups → listening socket → (idmapped work directory) → clone(user, mount, pid,
//! net, ipc, uts, cgroup) → parent writes the id maps → child: identity, root filesystem,
//! hostname, loopback, pivot_root, descriptors, Landlock, capabilities, no_new_privs, seccomp →
//! child reports ready and becomes the guest agent (envd) as PID 1.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupPaths;
use super::rootfs::{self, Workspace};
use super::{landlock, seccomp, sys};
use crate::spec::Limits;

/// Capabilities envd keeps inside the sandbox's user namespace (never host capabilities): to
/// run processes as other users, act on files for them, and signal their processes. Processes
/// it starts get none (the bounding set is empty).
const ENVD_CAPS: &[u32] = &[
    0, // CAP_CHOWN
    1, // CAP_DAC_OVERRIDE
    2, // CAP_DAC_READ_SEARCH
    3, // CAP_FOWNER
    5, // CAP_KILL
    6, // CAP_SETGID
    7, // CAP_SETUID
];

/// The uid/gid of `user` inside every sandbox.
pub const USER_ID: u32 = 1000;

/// Configuration of the agent inside the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestConfig {
    pub default_user: String,
    pub default_workdir: Option<String>,
    pub envs: BTreeMap<String, String>,
    /// Bridge the host's egress proxy into the sandbox's loopback.
    #[serde(default)]
    pub egress: Option<crate::network::Bridge>,
}

/// What the host asks the helper to build.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitRequest {
    pub id: String,
    /// Per-sandbox host directory: socket, log and the root mount point.
    pub dir: PathBuf,
    /// The template's prepared, read-only `/etc`.
    pub etc: PathBuf,
    /// A built template's root, the shared read-only lower layer of the sandbox's overlay.
    #[serde(default)]
    pub template_root: Option<PathBuf>,
    pub limits: Limits,
    pub workdir: Option<PathBuf>,
    #[serde(default)]
    pub skills: BTreeMap<String, PathBuf>,
    pub guest: GuestConfig,
    /// Host directory holding the egress proxy socket, bound read-only at
    /// [`crate::network::GUEST_DIR`].
    #[serde(default)]
    pub egress_dir: Option<PathBuf>,
    /// First host uid/gid of the sandbox's 65536 ids when cella runs as root.
    pub id_base: u32,
}

/// The helper's answer, one JSON line on stdout.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InitReport {
    pub ok: bool,
    pub error: Option<String>,
    /// Host pid of the sandbox's init (envd).
    pub pid: i32,
    pub socket: PathBuf,
    pub cgroup: CgroupPaths,
    pub warnings: Vec<String>,
    pub rootless: bool,
}

/// The line a helper writes on stdout, after its report, once the sandbox's init has been
/// reaped: the sandbox is gone; only removing its host files and cgroups follows.
pub const ENDED_LINE: &str = "ended";

/// Runs the helper. `guest` becomes PID 1 of the sandbox with the listening socket.
pub fn run_helper(guest: fn(UnixListener, GuestConfig) -> !) -> ! {
    sys::setsid();
    let mut input = String::new();
    let report = match std::io::stdin().read_to_string(&mut input) {
        Err(e) => fail(format!("reading the sandbox request: {e}")),
        Ok(_) => match serde_json::from_str::<InitRequest>(&input) {
            Err(e) => fail(format!("malformed sandbox request: {e}")),
            Ok(req) => build(&req, guest),
        },
    };
    let (report, child, cgroup, dir) = match report {
        Ok(parts) => parts,
        Err(error) => {
            emit(&InitReport {
                ok: false,
                error: Some(error),
                ..Default::default()
            });
            sys::exit_now(1);
        }
    };
    emit(&report);
    // Stay as the sandbox's parent: reap it, then clean up after it. The host learns the
    // sandbox is gone from the `ended` line. Its directory is first moved aside under a
    // `.ended-` name (cheap), so it is gone from its place when the host hears; removing it
    // follows off the host's path (removing the root mount point waits for the kernel to
    // release the sandbox's mounts, ~0.3 ms), and then the cgroups.
    let status = sys::wait_child(child).unwrap_or(0);
    let leftover = ended_dir(&dir);
    let leftover = match std::fs::rename(&dir, &leftover) {
        Ok(()) => leftover,
        Err(_) => dir,
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(format!("{ENDED_LINE}\n").as_bytes());
        let _ = out.flush();
    }
    let _ = std::fs::remove_dir_all(&leftover);
    cgroup.leave_current();
    cgroup.remove();
    sys::exit_now(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    });
}

/// Prefix of a sandbox directory whose sandbox ended and whose helper is removing it.
pub const ENDED_PREFIX: &str = ".ended-";

/// Where an ended sandbox's directory is moved before it is removed.
fn ended_dir(dir: &Path) -> PathBuf {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    dir.with_file_name(format!("{ENDED_PREFIX}{name}"))
}

fn fail(error: String) -> Result<Built, String> {
    Err(error)
}

/// Writes the report line. Stdout stays open: the host learns that the sandbox ended from the
/// next line ([`ENDED_LINE`]) or from end of file if the helper dies; a host that went away
/// only makes that write fail (Rust ignores SIGPIPE).
fn emit(report: &InitReport) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, report);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

type Built = (InitReport, i32, CgroupPaths, PathBuf);

fn build(req: &InitRequest, guest: fn(UnixListener, GuestConfig) -> !) -> Result<Built, String> {
    let err = |e: String| e;
    let rootless = sys::geteuid() != 0;
    let mut warnings = Vec::new();
    if !cella_proto::ids::is_valid_sandbox_id(&req.id) {
        return Err(err(format!("invalid sandbox id {:?}", req.id)));
    }

    // Host files of the sandbox. The child reaches the root mount point as an unprivileged host
    // uid, so directories on the way are traversable (0711) but not listable.
    let root = req.dir.join("root");
    std::fs::create_dir_all(&root).map_err(|e| err(format!("creating {}: {e}", root.display())))?;
    for d in [
        req.dir.parent().unwrap_or(Path::new("/")),
        req.dir.as_path(),
    ] {
        let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711));
    }
    let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));

    let (cgroup, cg_warnings) = CgroupPaths::create(&req.id, &req.limits);
    warnings.extend(cg_warnings);
    // The helper joins the cgroups itself, before it clones the sandbox, so the sandbox is
    // born inside them (see `join_current` for why that is fast).
    let self_joined = match cgroup.join_current(&req.limits) {
        Ok(joined) => joined,
        Err(_) => {
            // Attaching the child below is the fallback (and warns if that fails too).
            cgroup.leave_current();
            false
        }
    };
    // Failures from here on must not leave the cgroups behind.
    let undo = |e: String| {
        cgroup.leave_current();
        cgroup.remove();
        e
    };

    let socket = req.dir.join("envd.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .map_err(|e| undo(format!("binding {}: {e}", socket.display())))?;
    let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(req.dir.join("envd.log"))
        .map_err(|e| undo(format!("creating the sandbox log: {e}")))?;

    let workspace_tree = match (&req.workdir, rootless) {
        (Some(dir), false) => {
            match idmap_workdir(dir, req.id_base) {
                Ok(tree) => Some(tree),
                Err(e) => {
                    warnings.push(format!("work directory bound without id mapping ({e}); files there keep host ownership"));
                    None
                }
            }
        }
        _ => None,
    };

    let (go_r, go_w) = sys::pipe().map_err(|e| undo(e.to_string()))?;
    let (ready_r, ready_w) = sys::pipe().map_err(|e| undo(e.to_string()))?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    // SAFETY: the helper is single-threaded (a fresh process that started no threads).
    let pid = unsafe { sys::clone_into_namespaces(flags) }.map_err(|e| undo(e.to_string()))?;
    if pid == 0 {
        drop(go_w);
        drop(ready_r);
        let ctx = ChildContext {
            req,
            rootless,
            listener: &listener,
            log: &log,
            ready: &ready_w,
            workspace: workspace_tree.as_ref(),
        };
        match child_setup(&ctx, go_r) {
            Ok(child_warnings) => {
                let msg = serde_json::json!({ "ok": true, "warnings": child_warnings }).to_string();
                let mut ready = std::fs::File::from(ready_w);
                let _ = ready.write_all(msg.as_bytes());
                drop(ready);
                guest(listener, req.guest.clone());
            }
            Err(e) => {
                let msg = serde_json::json!({ "ok": false, "error": e }).to_string();
                let mut ready = std::fs::File::from(ready_w);
                let _ = ready.write_all(msg.as_bytes());
                sys::exit_now(1);
            }
        }
    }
    drop(go_r);
    drop(ready_w);
    drop(listener);
    drop(workspace_tree);
    // The helper shares the sandbox's cgroups, so it must never be the process the OOM killer
    // picks (set after the clone: the sandbox keeps the ordinary score).
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");

    let kill_child = |e: String| {
        let _ = sys::kill(pid, libc::SIGKILL);
        let _ = sys::wait_child(pid);
        undo(e)
    };
    write_id_maps(pid, rootless, req.id_base).map_err(&kill_child)?;
    let mut go = std::fs::File::from(go_w);
    go.write_all(b"g")
        .map_err(|e| kill_child(format!("starting the sandbox: {e}")))?;
    // Where the helper could not join first (cgroup v2), the child is attached here, while it
    // builds its root filesystem; it waits for this before it runs anything of the sandbox's.
    if !self_joined && let Err(e) = cgroup.attach(pid) {
        warnings.push(format!(
            "resource limits not enforced: joining the sandbox cgroup failed: {e}"
        ));
    }
    go.write_all(b"a")
        .map_err(|e| kill_child(format!("starting the sandbox: {e}")))?;
    drop(go);

    let mut answer = String::new();
    let _ = std::fs::File::from(ready_r).read_to_string(&mut answer);
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap_or_else(|_| {
        serde_json::json!({ "ok": false, "error": "the sandbox exited during set-up without saying why" })
    });
    if answer["ok"] != serde_json::Value::Bool(true) {
        let msg = answer["error"]
            .as_str()
            .unwrap_or("unknown set-up failure")
            .to_string();
        return Err(kill_child(format!("sandbox set-up failed: {msg}")));
    }
    if let Some(ws) = answer["warnings"].as_array() {
        warnings.extend(ws.iter().filter_map(|w| w.as_str().map(String::from)));
    }
    if rootless {
        warnings.push(
            "rootless: only user \"user\" exists in the sandbox (no subordinate id range)".into(),
        );
    }
    let report = InitReport {
        ok: true,
        error: None,
        pid,
        socket,
        cgroup: cgroup.clone(),
        warnings,
        rootless,
    };
    Ok((report, pid, cgroup, req.dir.clone()))
}

fn write_id_maps(pid: i32, rootless: bool, base: u32) -> Result<(), String> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let write = |file: &str, content: String| {
        std::fs::write(proc_dir.join(file), &content)
            .map_err(|e| format!("writing {file} ({}) of the sandbox: {e}", content.trim()))
    };
    if rootless {
        write("uid_map", format!("{USER_ID} {} 1\n", sys::geteuid()))?;
        write("setgroups", "deny\n".into())?;
        write("gid_map", format!("{USER_ID} {} 1\n", sys::getegid()))?;
    } else {
        write("uid_map", format!("0 {base} 65536\n"))?;
        write("gid_map", format!("0 {base} 65536\n"))?;
    }
    Ok(())
}

/// An idmapped, detached mount of `dir` in which the directory's owner appears as the
/// sandbox's `user`, so it can work there read-write.
fn idmap_workdir(dir: &Path, base: u32) -> Result<OwnedFd, String> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(dir).map_err(|e| format!("work directory {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "work directory {} is not a directory",
            dir.display()
        ));
    }
    // A throwaway user namespace that maps the owner's ids to the sandbox user's host ids.
    let (go_r, go_w) = sys::pipe().map_err(|e| e.to_string())?;
    // SAFETY: the helper is single-threaded.
    let holder =
        unsafe { sys::clone_into_namespaces(libc::CLONE_NEWUSER) }.map_err(|e| e.to_string())?;
    if holder == 0 {
        drop(go_w);
        let mut b = [0u8; 1];
        let _ = std::fs::File::from(go_r).read(&mut b);
        sys::exit_now(0);
    }
    drop(go_r);
    let result = (|| {
        let proc_dir = PathBuf::from(format!("/proc/{holder}"));
        std::fs::write(
            proc_dir.join("uid_map"),
            format!("{} {} 1\n", meta.uid(), base + USER_ID),
        )
        .map_err(|e| format!("uid map: {e}"))?;
        std::fs::write(
            proc_dir.join("gid_map"),
            format!("{} {} 1\n", meta.gid(), base + USER_ID),
        )
        .map_err(|e| format!("gid map: {e}"))?;
        let ns = std::fs::File::open(proc_dir.join("ns/user"))
            .map_err(|e| format!("user namespace: {e}"))?;
        sys::idmapped_tree(dir, &OwnedFd::from(ns)).map_err(|e| e.to_string())
    })();
    drop(go_w);
    let _ = sys::wait_child(holder);
    result
}

struct ChildContext<'a> {
    req: &'a InitRequest,
    rootless: bool,
    listener: &'a UnixListener,
    log: &'a std::fs::File,
    ready: &'a OwnedFd,
    workspace: Option<&'a OwnedFd>,
}

/// Everything the sandbox's init does before it becomes envd.
fn child_setup(ctx: &ChildContext<'_>, go: OwnedFd) -> Result<Vec<String>, String> {
    let mut go = std::fs::File::from(go);
    let mut b = [0u8; 1];
    if go.read(&mut b).map_err(|e| e.to_string())? != 1 {
        return Err("the helper went away before the id maps were written".into());
    }
    if !ctx.rootless {
        sys::become_id(0, 0, true).map_err(|e| e.to_string())?;
    }
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(|e| e.to_string())?;
    let root = ctx.req.dir.join("root");
    let workspace = match (ctx.workspace, &ctx.req.workdir) {
        (Some(tree), _) => Some(Workspace::Idmapped(tree)),
        (None, Some(dir)) => Some(Workspace::Bind(dir.as_path())),
        (None, None) => None,
    };
    let plan = rootfs::Plan {
        root: &root,
        disk_bytes: ctx.req.limits.disk_bytes,
        etc: &ctx.req.etc,
        template_root: ctx.req.template_root.as_deref(),
        workspace,
        skills: &ctx.req.skills,
        egress: ctx.req.egress_dir.as_deref(),
        user_id: USER_ID,
        has_root: !ctx.rootless,
    };
    let mut warnings = rootfs::build(&plan).map_err(|e| e.to_string())?;
    sys::sethostname("cella").map_err(|e| e.to_string())?;
    sys::loopback_up().map_err(|e| e.to_string())?;
    sys::pivot_into(&root).map_err(|e| e.to_string())?;
    // Wait until the helper has moved us into the sandbox's cgroups, then root our cgroup
    // namespace there so nothing inside sees the host's cgroup paths.
    if go.read(&mut b).map_err(|e| e.to_string())? != 1 {
        return Err("the helper went away before joining the sandbox cgroups".into());
    }
    drop(go);
    sys::unshare(libc::CLONE_NEWCGROUP).map_err(|e| e.to_string())?;

    // Descriptors: only the listener, the ready pipe and the log survive; stdio goes to the log.
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("opening /dev/null: {e}"))?;
    // SAFETY: dup2 between valid descriptors we hold.
    unsafe {
        libc::dup2(null.as_raw_fd(), 0);
        libc::dup2(ctx.log.as_raw_fd(), 1);
        libc::dup2(ctx.log.as_raw_fd(), 2);
    }
    drop(null);
    sys::close_fds_except(&[ctx.listener.as_raw_fd(), ctx.ready.as_raw_fd()]);
    let _ = sys::set_rlimit(libc::RLIMIT_CORE, 0, 0);

    // On a template's overlay the whole system tree is the sandbox's own copy-on-write layer.
    let extra_writable: &[&str] = if ctx.req.template_root.is_some() {
        landlock::OVERLAY_WRITABLE
    } else {
        &[]
    };
    match landlock::restrict(extra_writable) {
        Ok(landlock::Enforcement::Full) => {}
        Ok(landlock::Enforcement::Partial) => {
            warnings.push("landlock only partially enforced by this kernel".into())
        }
        Ok(landlock::Enforcement::None) => {
            warnings.push("landlock not enforced: the kernel does not support it".into())
        }
        Err(e) => warnings.push(format!("landlock not enforced: {e}")),
    }
    sys::drop_bounding_set(sys::last_cap()).map_err(|e| e.to_string())?;
    sys::limit_capabilities(if ctx.rootless { &[] } else { ENVD_CAPS })
        .map_err(|e| e.to_string())?;
    sys::set_no_new_privs().map_err(|e| e.to_string())?;
    seccomp::install()?;
    sys::set_dumpable(false).map_err(|e| e.to_string())?;
    Ok(warnings)
}

/// Rebuilds a listener from an inherited descriptor (used by tests of the guest side).
///
/// # Safety
/// `fd` must be an open listening Unix socket owned by nobody else.
pub unsafe fn listener_from_fd(fd: i32) -> UnixListener {
    // SAFETY: guaranteed by the caller.
    unsafe { UnixListener::from_raw_fd(fd) }
}
