//! PID 1 duties: reap every child (ours and orphans re-parented to us), hand exit statuses to
//! whoever waits for a process, and forward termination to all process groups on shutdown.
//!
//! One reaper owns `waitpid(-1)`. Spawning happens under the reaper's lock so a child cannot be
//! reaped between `fork` and its registration (std's `Command::spawn` waits for a child whose
//! `exec` failed, and must find it unreaped).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Statuses of processes nobody waits for are kept this long, then dropped.
const UNCLAIMED_TTL: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct ReaperState {
    waiters: HashMap<i32, oneshot::Sender<ExitStatus>>,
    unclaimed: HashMap<i32, (ExitStatus, Instant)>,
}

impl ReaperState {
    /// Registers interest in `pid`'s exit. Call while holding the lock taken for spawning.
    pub fn watch(&mut self, pid: i32) -> oneshot::Receiver<ExitStatus> {
        let (tx, rx) = oneshot::channel();
        if let Some((status, _)) = self.unclaimed.remove(&pid) {
            let _ = tx.send(status);
        } else {
            self.waiters.insert(pid, tx);
        }
        rx
    }
}

/// The process-wide reaper.
pub struct Reaper {
    state: Mutex<ReaperState>,
}

impl Reaper {
    pub fn global() -> &'static Reaper {
        static REAPER: OnceLock<Reaper> = OnceLock::new();
        REAPER.get_or_init(|| Reaper {
            state: Mutex::new(ReaperState::default()),
        })
    }

    /// Locks the reaper; hold the guard across spawn and `watch`.
    pub fn lock(&self) -> MutexGuard<'_, ReaperState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Collects every exited child without blocking.
    pub fn reap(&self) {
        let mut state = self.lock();
        loop {
            let mut raw = 0;
            // SAFETY: waitpid with WNOHANG writes only to `raw`.
            let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            let status = if libc::WIFEXITED(raw) {
                ExitStatus::Exited(libc::WEXITSTATUS(raw))
            } else if libc::WIFSIGNALED(raw) {
                ExitStatus::Signaled(libc::WTERMSIG(raw))
            } else {
                continue;
            };
            match state.waiters.remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(status);
                }
                None => {
                    state.unclaimed.insert(pid, (status, Instant::now()));
                }
            }
        }
        let now = Instant::now();
        state
            .unclaimed
            .retain(|_, (_, at)| now.duration_since(*at) < UNCLAIMED_TTL);
    }

    /// Runs the reaper on SIGCHLD for the life of the runtime.
    pub fn start(&'static self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigchld = signal(SignalKind::child())?;
        tokio::spawn(async move {
            loop {
                // A periodic sweep as well, in case signals coalesce while the lock is held.
                let _ = tokio::time::timeout(Duration::from_secs(1), sigchld.recv()).await;
                self.reap();
            }
        });
        Ok(())
    }
}

/// When envd is PID 1: on SIGTERM/SIGINT/SIGHUP, pass SIGTERM to every process, give them a
/// moment, then exit (the kernel kills whatever is left in the PID namespace).
pub fn forward_termination() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
        // SAFETY: kill(-1, sig) signals every process we may signal; no memory is touched.
        unsafe { libc::kill(-1, libc::SIGTERM) };
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::process::exit(0);
    });
    Ok(())
}
