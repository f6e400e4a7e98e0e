//! Directory watches on raw inotify, shared by `WatchDir` (streamed) and the
//! `CreateWatcher`/`GetWatcherEvents` poll API (buffered).
//!
//! Each watch runs on its own thread in the requesting user's filesystem identity, so a user
//! can only watch directories they may read. inotify masks map to events as envd's fsnotify
//! does: `IN_CREATE`/`IN_MOVED_TO` → CREATE, `IN_MOVED_FROM`/`IN_MOVE_SELF` → RENAME,
//! `IN_ATTRIB` → CHMOD, `IN_MODIFY` → WRITE, `IN_DELETE`/`IN_DELETE_SELF` → REMOVE. Names are
//! relative to the watched directory (`.` for the directory itself). Recursive watches add
//! subdirectories as they appear, and report CREATE for entries that appeared inside a new
//! directory before its watch was in place.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cella_proto::filesystem::{EventType, FilesystemEvent};
use cella_proto::{Code, RpcError};
use tokio::sync::{mpsc, oneshot};

use super::entry::entry_info;
use super::path::io_error;
use crate::Envd;
use crate::users::{User, as_user};

/// Most events a poll watcher holds between two `GetWatcherEvents` calls. Past it the watcher
/// fails (events would be lost) and reports `resource_exhausted` until it is removed.
pub const POLL_BUFFER_EVENTS: usize = 10_000;

/// Events a stream watcher queues for a slow client before inotify's own queue takes over
/// (whose overflow ends the stream with `resource_exhausted`).
pub const STREAM_QUEUE_EVENTS: usize = 256;

/// The inotify events every watch asks for.
const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF;

/// Superblock magics of network filesystems (NFS, CIFS, SMB, SMB2, FUSE), refused unless the
/// client allows network mounts, as envd does.
const NETWORK_FS_MAGICS: [libc::__fsword_t; 5] =
    [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546];

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Absolute directory to watch.
    pub root: PathBuf,
    pub recursive: bool,
    pub include_entry: bool,
    pub allow_network_mounts: bool,
}

/// Where a watch delivers its events.
pub enum Sink {
    /// A `WatchDir` stream; the watch ends when the receiver is dropped.
    Stream(mpsc::Sender<Result<FilesystemEvent, RpcError>>),
    /// A poll watcher's buffer.
    Buffer(Arc<Mutex<PollBuffer>>),
}

/// Events a poll watcher collected since the last `GetWatcherEvents`.
#[derive(Debug, Default)]
pub struct PollBuffer {
    pub events: Vec<FilesystemEvent>,
    /// Set once the watch failed (overflow, watch limit, directory removed); reported by every
    /// poll once the events before it were taken.
    pub failure: Option<RpcError>,
}

/// A running watch. Dropping it stops the watch thread and releases the inotify instance.
pub struct Watch {
    stop: Arc<OwnedFd>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: the eventfd is open for as long as `stop` lives; the buffer is 8 valid bytes.
        let _ = unsafe { libc::write(self.stop.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

/// Starts watching `spec.root` as `user`. Returns once the watch is in place, so every change
/// made after this returns is reported.
pub async fn start(
    envd: &Envd,
    user: &User,
    spec: WatchSpec,
    sink: Sink,
) -> Result<Watch, RpcError> {
    // SAFETY: eventfd takes no pointers; the result is checked before use.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!(
                "watch {}: creating a stop signal: {}",
                spec.root.display(),
                super::path::reason(&e)
            ),
        ));
    }
    // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
    let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
    let (ready_tx, ready_rx) = oneshot::channel();
    let thread_stop = Arc::clone(&stop);
    let thread_envd = envd.clone();
    let thread_user = user.clone();
    let root = spec.root.clone();
    std::thread::Builder::new()
        .name("envd-watch".into())
        .spawn(move || {
            as_user(&thread_envd.users, &thread_user, || {
                match Tree::open(&thread_envd, spec) {
                    Ok(mut tree) => {
                        let _ = ready_tx.send(Ok(()));
                        tree.run(&thread_stop, &sink);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
        })
        .map_err(|e| {
            RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "watch {}: starting the watch thread: {}",
                    root.display(),
                    super::path::reason(&e)
                ),
            )
        })?;
    let watch = Watch { stop };
    match ready_rx.await {
        Ok(Ok(())) => Ok(watch),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(RpcError::internal(format!(
            "watch {}: the watch thread ended during setup",
            root.display()
        ))),
    }
}

/// One inotify instance and the directories it watches.
struct Tree {
    envd: Envd,
    fd: OwnedFd,
    spec: WatchSpec,
    root_wd: i32,
    /// Watch descriptor → directory relative to the root (`""` for the root).
    dirs: HashMap<i32, String>,
}

impl Tree {
    fn open(envd: &Envd, spec: WatchSpec) -> Result<Tree, RpcError> {
        let root = spec.root.clone();
        let meta = std::fs::metadata(&root).map_err(|e| io_error("watch", &root, &e))?;
        if !meta.is_dir() {
            return Err(RpcError::invalid_argument(format!(
                "watch {}: not a directory",
                root.display()
            )));
        }
        if !spec.allow_network_mounts && is_network_mount(&root) {
            return Err(RpcError::invalid_argument(format!(
                "watch {}: the directory is on a network filesystem, where events are unreliable; set allow_network_mounts to watch it anyway",
                root.display()
            )));
        }
        // SAFETY: inotify_init1 takes no pointers; the result is checked before use.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "watch {}: creating an inotify instance: {} (too many watchers? see fs.inotify.max_user_instances)",
                    root.display(),
                    super::path::reason(&e)
                ),
            ));
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut tree = Tree {
            envd: envd.clone(),
            fd,
            spec,
            root_wd: -1,
            dirs: HashMap::new(),
        };
        tree.root_wd = tree
            .add_watch(&root, String::new(), true)
            .map_err(|e| watch_error(&root, &e))?;
        if tree.spec.recursive {
            let mut ignored = Vec::new();
            tree.add_subtree(&root, "", false, &mut ignored)?;
        }
        Ok(tree)
    }

    fn add_watch(&mut self, abs: &Path, rel: String, is_root: bool) -> io::Result<i32> {
        let c = CString::new(abs.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        let mut mask = WATCH_MASK | libc::IN_ONLYDIR;
        if !is_root {
            mask |= libc::IN_DONT_FOLLOW;
        }
        // SAFETY: `fd` is a live inotify descriptor and `c` a NUL-terminated string that outlives
        // the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.dirs.insert(wd, rel);
        Ok(wd)
    }

    /// Watches every directory below `abs` (relative path `rel`); with `emit`, reports CREATE
    /// for every entry found (they appeared before the watch could see them).
    fn add_subtree(
        &mut self,
        abs: &Path,
        rel: &str,
        emit: bool,
        out: &mut Vec<Result<FilesystemEvent, RpcError>>,
    ) -> Result<(), RpcError> {
        let mut pending = vec![(abs.to_path_buf(), rel.to_string())];
        while let Some((dir, dir_rel)) = pending.pop() {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue; // vanished or unreadable: nothing below it to watch
            };
            let mut children: Vec<_> = read.flatten().collect();
            children.sort_by_key(|c| c.file_name());
            for child in children {
                let child_rel = join_rel(&dir_rel, &child.file_name().to_string_lossy());
                let child_abs = dir.join(child.file_name());
                if emit {
                    out.push(Ok(self.event(&child_rel, EventType::Create)));
                }
                if child.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    match self.add_watch(&child_abs, child_rel.clone(), false) {
                        Ok(_) => pending.push((child_abs, child_rel)),
                        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                            return Err(watch_error(&child_abs, &e));
                        }
                        Err(_) => {} // vanished, unreadable or replaced by a non-directory
                    }
                }
            }
        }
        Ok(())
    }

    /// Stops watching `rel` and everything below it (it moved away).
    fn forget_subtree(&mut self, rel: &str) {
        let prefix = format!("{rel}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, r)| r.as_str() == rel || r.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            // SAFETY: `fd` is a live inotify descriptor; a stale `wd` only yields EINVAL.
            let _ = unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
        }
    }

    fn event(&self, rel: &str, event_type: EventType) -> FilesystemEvent {
        let entry = if self.spec.include_entry && event_type != EventType::Remove {
            let path = if rel == "." {
                self.spec.root.clone()
            } else {
                self.spec.root.join(rel)
            };
            entry_info(&self.envd.users, &path).ok()
        } else {
            None
        };
        FilesystemEvent {
            name: rel.to_string(),
            event_type,
            entry,
        }
    }

    fn run(&mut self, stop: &OwnedFd, sink: &Sink) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd structs for the duration of the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.deliver(sink, Err(watch_error(&self.spec.root, &e)));
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents & libc::POLLIN == 0 {
                if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                    let e = io::Error::other("inotify descriptor failed");
                    self.deliver(sink, Err(watch_error(&self.spec.root, &e)));
                    return;
                }
                continue;
            }
            // SAFETY: `buf` is valid writable memory of `buf.len()` bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) {
                    continue;
                }
                self.deliver(sink, Err(watch_error(&self.spec.root, &e)));
                return;
            }
            let len = usize::try_from(n).unwrap_or(0);
            for item in self.translate(&buf[..len]) {
                if !self.deliver(sink, item) {
                    return;
                }
            }
        }
    }

    /// Turns a buffer of raw `inotify_event`s into filesystem events.
    fn translate(&mut self, bytes: &[u8]) -> Vec<Result<FilesystemEvent, RpcError>> {
        const HEADER: usize = 16; // wd: i32, mask: u32, cookie: u32, len: u32
        let mut out = Vec::new();
        let mut at = 0;
        while at + HEADER <= bytes.len() {
            let word = |i: usize| -> [u8; 4] {
                let mut w = [0u8; 4];
                w.copy_from_slice(&bytes[at + i..at + i + 4]);
                w
            };
            let wd = i32::from_ne_bytes(word(0));
            let mask = u32::from_ne_bytes(word(4));
            let name_len = usize::try_from(u32::from_ne_bytes(word(12))).unwrap_or(usize::MAX);
            let name_end = (at + HEADER).saturating_add(name_len).min(bytes.len());
            let raw_name = &bytes[at + HEADER..name_end];
            let name_bytes = raw_name.split(|b| *b == 0).next().unwrap_or(&[]);
            let name = String::from_utf8_lossy(name_bytes).into_owned();
            at = name_end;

            if mask & libc::IN_Q_OVERFLOW != 0 {
                out.push(Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!(
                        "watch {}: the kernel's inotify queue overflowed and events were lost; watch again (or raise fs.inotify.max_queued_events)",
                        self.spec.root.display()
                    ),
                )));
                return out;
            }
            if mask & libc::IN_IGNORED != 0 {
                self.dirs.remove(&wd);
                if wd == self.root_wd {
                    // Nothing more can arrive: end the watch instead of idling forever.
                    out.push(Err(RpcError::not_found(format!(
                        "watch {}: the watched directory was removed or unmounted",
                        self.spec.root.display()
                    ))));
                    return out;
                }
                continue;
            }
            let Some(dir_rel) = self.dirs.get(&wd).cloned() else {
                continue; // a watch we already dropped
            };
            let is_root = wd == self.root_wd;
            if name.is_empty() && !is_root {
                continue; // a subdirectory's own event; its parent reported it by name
            }
            let rel = if name.is_empty() {
                ".".to_string()
            } else {
                join_rel(&dir_rel, &name)
            };
            for event_type in event_types(mask) {
                out.push(Ok(self.event(&rel, event_type)));
            }
            if self.spec.recursive && mask & libc::IN_ISDIR != 0 && !name.is_empty() {
                let abs = self.spec.root.join(&rel);
                if mask & libc::IN_MOVED_FROM != 0 {
                    self.forget_subtree(&rel);
                }
                if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                    match self.add_watch(&abs, rel.clone(), false) {
                        Ok(_) => {
                            let emit = mask & libc::IN_CREATE != 0;
                            if let Err(e) = self.add_subtree(&abs, &rel, emit, &mut out) {
                                out.push(Err(e));
                                return out;
                            }
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                            out.push(Err(watch_error(&abs, &e)));
                            return out;
                        }
                        Err(_) => {} // already gone again
                    }
                }
            }
        }
        out
    }

    /// Hands one event (or the watch's final error) to the sink; `false` when the watch should
    /// stop (the client went away, the buffer overflowed or this was an error).
    fn deliver(&self, sink: &Sink, item: Result<FilesystemEvent, RpcError>) -> bool {
        let is_error = item.is_err();
        match sink {
            Sink::Stream(tx) => tx.blocking_send(item).is_ok() && !is_error,
            Sink::Buffer(buffer) => {
                let mut buffer = buffer.lock().unwrap_or_else(|e| e.into_inner());
                if buffer.failure.is_some() {
                    return false;
                }
                match item {
                    Ok(event) if buffer.events.len() < POLL_BUFFER_EVENTS => {
                        buffer.events.push(event);
                        true
                    }
                    Ok(_) => {
                        buffer.events.clear();
                        buffer.failure = Some(RpcError::new(
                            Code::ResourceExhausted,
                            format!(
                                "watcher on {} lost events: more than {POLL_BUFFER_EVENTS} events piled up between two GetWatcherEvents calls; remove it and create a new one",
                                self.spec.root.display()
                            ),
                        ));
                        false
                    }
                    Err(e) => {
                        buffer.failure = Some(e);
                        false
                    }
                }
            }
        }
    }
}

/// The event types an inotify mask stands for, in envd's order.
fn event_types(mask: u32) -> Vec<EventType> {
    let mut types = Vec::with_capacity(1);
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        types.push(EventType::Create);
    }
    if mask & (libc::IN_MOVED_FROM | libc::IN_MOVE_SELF) != 0 {
        types.push(EventType::Rename);
    }
    if mask & libc::IN_ATTRIB != 0 {
        types.push(EventType::Chmod);
    }
    if mask & libc::IN_MODIFY != 0 {
        types.push(EventType::Write);
    }
    if mask & (libc::IN_DELETE | libc::IN_DELETE_SELF) != 0 {
        types.push(EventType::Remove);
    }
    types
}

fn join_rel(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn watch_error(path: &Path, err: &io::Error) -> RpcError {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        return RpcError::new(
            Code::ResourceExhausted,
            format!(
                "watch {}: the inotify watch limit is reached (fs.inotify.max_user_watches); watch a smaller tree",
                path.display()
            ),
        );
    }
    io_error("watch", path, err)
}

fn is_network_mount(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is valid writable memory for one statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    NETWORK_FS_MAGICS.contains(&st.f_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_map_like_fsnotify() {
        assert_eq!(
            event_types(libc::IN_CREATE | libc::IN_ISDIR),
            vec![EventType::Create]
        );
        assert_eq!(event_types(libc::IN_MOVED_TO), vec![EventType::Create]);
        assert_eq!(event_types(libc::IN_MOVED_FROM), vec![EventType::Rename]);
        assert_eq!(event_types(libc::IN_ATTRIB), vec![EventType::Chmod]);
        assert_eq!(event_types(libc::IN_MODIFY), vec![EventType::Write]);
        assert_eq!(event_types(libc::IN_DELETE_SELF), vec![EventType::Remove]);
        assert_eq!(join_rel("", "a"), "a");
        assert_eq!(join_rel("a/b", "c"), "a/b/c");
    }
}
