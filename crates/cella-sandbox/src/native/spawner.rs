//! The helper spawner: a small single-threaded process, started once per backend by re-running
//! the `cella` binary, that forks one sandbox helper ([`super::init::run_helper`]) per request.
//!
//! A command that makes a single sandbox right away (`cella exec`) instead forks one helper
//! from itself at start ([`Spawner::fork_helper`]) and starts no spawner at all.
//!
//! Why: loading the 140 MB `cella` binary costs ~1.5 ms per process (page faults of a large
//! position-independent binary), far more than a fork of a small idle process (~0.1 ms). What
//! every helper would otherwise work out again — where the cgroup hierarchies are, the seccomp
//! program, the kernel's last capability — is worked out once here ([`prepare`]) and
//! inherited. The host still never forks from its multi-threaded runtime: it only sends
//! messages to this process.
//!
//! Protocol: the control socket is a `SOCK_SEQPACKET` pair. A request is one message, the byte
//! [`HELPER`] carrying two descriptors: the read end of the helper's request pipe (its stdin)
//! and the write end of its report pipe (its stdout). The spawner answers nothing: a helper that
//! could not be forked shows as end of file on the report pipe. End of file on the control
//! socket (the host went away) ends the spawner; helpers it forked live on, as the parents of
//! their sandboxes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::init::{self, GuestConfig};
use super::{cgroup, seccomp, sys};

/// Hidden subcommand of the `cella` binary that runs [`run`].
pub const SPAWNER_SUBCOMMAND: &str = "__sandbox-spawner";

/// Message tag of a helper request.
const HELPER: u8 = b'h';

/// What the sandbox's init becomes once it is set up (envd, from the binary crate).
pub type Guest = fn(UnixListener, GuestConfig) -> !;

/// The host's handle on its spawner process.
pub struct Spawner {
    /// The `cella` binary, run as the spawner when one is needed.
    binary: PathBuf,
    /// A helper forked ahead of time, waiting for its request ([`Spawner::fork_helper`]).
    spare: Mutex<Option<HelperPipes>>,
    /// The spawner process, once started.
    running: Mutex<Option<Running>>,
}

struct Running {
    control: OwnedFd,
    pid: libc::pid_t,
}

/// The two pipe ends the host keeps for one helper.
pub struct HelperPipes {
    /// Write the [`init::InitRequest`] here, then close it.
    pub request: OwnedFd,
    /// The helper's report line, then [`init::ENDED_LINE`].
    pub report: OwnedFd,
}

impl Spawner {
    /// Starts a spawner by running `binary __sandbox-spawner` with an empty environment.
    pub fn start(binary: &Path) -> io::Result<Spawner> {
        Ok(Spawner {
            binary: binary.to_path_buf(),
            spare: Mutex::new(None),
            running: Mutex::new(Some(exec_spawner(binary)?)),
        })
    }

    /// Forks one helper from this process right away, for a command that makes one sandbox
    /// (`cella exec`): no spawner is started unless a second sandbox is asked for, and the
    /// helper does its preparation while the caller goes on. Call it before any thread
    /// starts; a process that already has threads gets a started spawner instead.
    pub fn fork_helper(binary: &Path, guest: Guest) -> io::Result<Spawner> {
        if sys::thread_count() != Some(1) {
            return Spawner::start(binary);
        }
        let (request_r, request_w) = sys::pipe()?;
        let (report_r, report_w) = sys::pipe()?;
        // SAFETY: this process is single-threaded (checked above).
        let pid = unsafe { sys::fork() }?;
        if pid == 0 {
            // Like a fresh process: its own session (no terminal signals), no inherited
            // descriptors, no environment.
            sys::setsid();
            drop(request_w);
            drop(report_r);
            if sys::stdio_to_null().is_err() {
                sys::exit_now(1);
            }
            // SAFETY: single-threaded (the forked copy of a single-threaded process), so no
            // other thread reads the environment concurrently.
            unsafe { libc::clearenv() };
            prepare();
            become_helper(request_r, report_w, guest);
        }
        Ok(Spawner {
            binary: binary.to_path_buf(),
            spare: Mutex::new(Some(HelperPipes {
                request: request_w,
                report: report_r,
            })),
            running: Mutex::new(None),
        })
    }

    /// Has a helper forked (or hands over the one forked ahead); the spawner is started, or
    /// restarted once if it died, as needed.
    pub fn spawn_helper(&self) -> io::Result<HelperPipes> {
        if let Some(pipes) = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Ok(pipes);
        }
        let (request_r, request_w) = sys::pipe()?;
        let (report_r, report_w) = sys::pipe()?;
        let fds = [request_r.as_raw_fd(), report_w.as_raw_fd()];
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let sent = match running.as_ref() {
            Some(r) => sys::send_fds(&r.control, HELPER, &fds),
            None => Err(io::Error::from_raw_os_error(libc::ENOTCONN)),
        };
        if let Err(e) = sent {
            if !matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::NotConnected
            ) {
                return Err(e);
            }
            if let Some(dead) = running.take() {
                tracing::warn!("the sandbox helper spawner died; starting a new one");
                dead.stop();
            }
            let fresh = running.insert(exec_spawner(&self.binary)?);
            sys::send_fds(&fresh.control, HELPER, &fds)?;
        }
        Ok(HelperPipes {
            request: request_w,
            report: report_r,
        })
    }

    /// If the spawner process has died, forgets it (the next request starts a new one) and
    /// says so. Called after a failure, it allows the spawner a few milliseconds to finish
    /// dying (its descriptors close before it can be collected).
    pub fn forget_if_dead(&self) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let dead = running.as_ref().is_some_and(|r| {
            (0..10).any(|attempt| {
                if attempt > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                !matches!(sys::try_wait_child(r.pid), Ok(None))
            })
        });
        if dead {
            running.take();
        }
        dead
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // An unused spare helper reads end of file instead of a request and exits.
        if let Some(running) = self.running.get_mut().unwrap_or_else(|p| p.into_inner()) {
            running.stop();
        }
    }
}

impl Running {
    /// Shuts the control socket, so the spawner exits, and collects it if it already has
    /// (not waiting: an exiting process's unreaped child is reaped by init after it).
    fn stop(&self) {
        sys::shutdown(&self.control);
        let _ = sys::try_wait_child(self.pid);
    }
}

fn exec_spawner(binary: &Path) -> io::Result<Running> {
    let (host, spawner) = sys::seqpacket_pair()?;
    let child = Command::new(binary)
        .arg(SPAWNER_SUBCOMMAND)
        .env_clear()
        .stdin(Stdio::from(spawner))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "starting the sandbox helper spawner {}: {e}",
                    binary.display()
                ),
            )
        })?;
    Ok(Running {
        control: host,
        pid: child.id() as libc::pid_t,
    })
}

/// Everything helpers would each work out again, worked out once before they are forked.
pub fn prepare() {
    cgroup::prepare();
    seccomp::prepare();
    sys::last_cap();
}

/// Runs the spawner of `cella __sandbox-spawner`: the control socket is its stdin.
pub fn run(guest: Guest) -> ! {
    const CONTROL: RawFd = 0;
    sys::setsid();
    sys::set_process_name("cella-spawner");
    prepare();
    // Helpers are not waited for here: ignoring SIGCHLD has the kernel reap them.
    sys::set_signal(libc::SIGCHLD, true);
    loop {
        let (tag, fds) = match sys::recv_fds(CONTROL) {
            Ok(Some(message)) => message,
            Ok(None) => sys::exit_now(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => sys::exit_now(1),
        };
        let Ok([request, report]) = <[OwnedFd; 2]>::try_from(fds) else {
            continue;
        };
        if tag != HELPER {
            continue;
        }
        // SAFETY: the spawner never starts a thread.
        if let Ok(0) = unsafe { sys::fork() } {
            become_helper(request, report, guest);
        }
        // The parent's copies close here; if the fork failed, that is the host's end of file
        // on the report pipe.
    }
}

fn become_helper(request: OwnedFd, report: OwnedFd, guest: Guest) -> ! {
    sys::set_signal(libc::SIGCHLD, false);
    sys::set_process_name("cella-helper");
    // The sandbox's init is a fork of this process: its command line and environment
    // (/proc/1/cmdline inside) must not be those of whatever process forked it.
    sys::scrub_cmdline_and_environ("cella-sandbox");
    if sys::move_fd(request, 0).is_err() || sys::move_fd(report, 1).is_err() {
        sys::exit_now(1);
    }
    sys::close_fds_except(&[]);
    init::run_helper(guest)
}
