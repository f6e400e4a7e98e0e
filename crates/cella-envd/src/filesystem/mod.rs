//! `filesystem.Filesystem`: stat, list, make, move, remove and watch the sandbox's files.
//!
//! Every operation runs on a blocking thread in the requesting user's filesystem identity
//! (`users::as_user`), so the kernel does the permission checks and new files belong to that
//! user. Paths resolve against the user's home (`path`), entries are described by `entry`
//! (with `metadata` from xattrs), watches live in `watch`. This module knows nothing about
//! HTTP file transfer (`files`), which borrows its path, entry and directory helpers.
//!
//! Differences from envd worth knowing: `Remove` of a missing path succeeds (envd uses
//! `os.RemoveAll`), `Remove` refuses `/`, `MakeDir` answers with the full entry, and `ListDir`
//! skips subdirectories it may not read instead of failing the whole listing.

pub mod entry;
pub mod metadata;
pub mod path;
pub mod watch;

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use cella_proto::filesystem::{
    EntryInfo, EntryResponse, FilesystemEvent, GetWatcherEventsResponse, ListDirRequest,
    ListDirResponse, MoveRequest, PathRequest, WatchDirEvent, WatchDirResponse, WatchRequest,
    WatcherIdMessage,
};
use cella_proto::process::Empty;
use cella_proto::{Code, RpcError};
use tokio::sync::mpsc;

use crate::Envd;
use crate::rpc::{self, RpcResult, StreamRequest, StreamWriter, Unary};
use crate::users::{User, as_user};
use entry::{entry_from_metadata, entry_info};
use path::io_error;
use watch::{PollBuffer, Sink, Watch, WatchSpec};

/// Watchers created with `CreateWatcher`, polled with `GetWatcherEvents`, removed with
/// `RemoveWatcher`. Each buffers at most [`watch::POLL_BUFFER_EVENTS`] events between polls.
#[derive(Default)]
pub struct WatcherTable {
    watchers: Mutex<HashMap<String, Arc<PollWatcher>>>,
}

struct PollWatcher {
    buffer: Arc<Mutex<PollBuffer>>,
    /// Keeps the watch running; dropping it stops the watch.
    _watch: Watch,
}

impl WatcherTable {
    fn insert(&self, id: String, watcher: PollWatcher) {
        self.lock().insert(id, Arc::new(watcher));
    }

    fn get(&self, id: &str) -> Result<Arc<PollWatcher>, RpcError> {
        self.lock()
            .get(id)
            .cloned()
            .ok_or_else(|| unknown_watcher(id))
    }

    fn remove(&self, id: &str) -> Result<(), RpcError> {
        self.lock()
            .remove(id)
            .map(drop)
            .ok_or_else(|| unknown_watcher(id))
    }

    /// How many poll watchers exist.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PollWatcher>>> {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn unknown_watcher(id: &str) -> RpcError {
    RpcError::not_found(format!(
        "watcher {id:?} not found: it was never created or was already removed"
    ))
}

pub fn routes() -> Router<Envd> {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
}

/// The user a Connect request runs as (Basic auth, else the default user).
fn request_user(envd: &Envd, headers: &HeaderMap) -> Result<User, RpcError> {
    envd.users.resolve(rpc::request_user(headers)?.as_deref())
}

/// Runs `f` on a blocking thread as `user`.
pub(crate) async fn run_as<T: Send + 'static>(
    envd: &Envd,
    user: User,
    f: impl FnOnce(&Envd) -> Result<T, RpcError> + Send + 'static,
) -> Result<T, RpcError> {
    let envd = envd.clone();
    tokio::task::spawn_blocking(move || as_user(&envd.users, &user, || f(&envd)))
        .await
        .map_err(|e| RpcError::internal(format!("filesystem operation failed: {e}")))?
}

async fn stat(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<EntryResponse> {
    let user = request_user(&envd, &headers)?;
    let path = path::resolve(&req.path, &user.home)?;
    let entry = run_as(&envd, user, move |envd| {
        entry_info(&envd.users, &path).map_err(|e| io_error("stat", &path, &e))
    })
    .await?;
    Ok(Unary(EntryResponse { entry: Some(entry) }))
}

async fn list_dir(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<ListDirRequest>,
) -> RpcResult<ListDirResponse> {
    let user = request_user(&envd, &headers)?;
    let path = path::resolve(&req.path, &user.home)?;
    let depth = req.depth.max(1);
    let entries = run_as(&envd, user, move |envd| list(envd, &path, depth)).await?;
    Ok(Unary(ListDirResponse { entries }))
}

/// Lists `dir` (following it if it is a symlink) down to `depth` levels, depth-first in name
/// order, each directory before its contents. Paths are reported under `dir` as requested.
fn list(envd: &Envd, dir: &Path, depth: u32) -> Result<Vec<EntryInfo>, RpcError> {
    let meta = std::fs::metadata(dir).map_err(|e| io_error("list", dir, &e))?;
    if !meta.is_dir() {
        return Err(RpcError::invalid_argument(format!(
            "list {}: not a directory",
            dir.display()
        )));
    }
    let mut entries = Vec::new();
    let top = read_sorted(dir).map_err(|e| io_error("list", dir, &e))?;
    // Stack of (children still to visit in reverse order, level of those children).
    let mut stack: Vec<(Vec<PathBuf>, u32)> = vec![(top.into_iter().rev().collect(), 1)];
    while let Some((children, level)) = stack.last_mut() {
        let level = *level;
        let Some(child) = children.pop() else {
            stack.pop();
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(&child) else {
            continue; // vanished while listing
        };
        let info = entry_from_metadata(&envd.users, &child, &meta);
        entries.push(info);
        if level < depth && meta.is_dir() {
            // Unreadable subdirectories are listed but not descended into.
            if let Ok(grandchildren) = read_sorted(&child) {
                stack.push((grandchildren.into_iter().rev().collect(), level + 1));
            }
        }
    }
    Ok(entries)
}

fn read_sorted(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

async fn make_dir(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<EntryResponse> {
    let user = request_user(&envd, &headers)?;
    let path = path::resolve(&req.path, &user.home)?;
    let entry = run_as(&envd, user, move |envd| {
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!(
                        "make directory {}: directory already exists",
                        path.display()
                    ),
                ));
            }
            Ok(_) => {
                return Err(RpcError::invalid_argument(format!(
                    "make directory {}: path already exists and is not a directory",
                    path.display()
                )));
            }
            Err(_) => {}
        }
        ensure_dirs(&path)?;
        entry_info(&envd.users, &path).map_err(|e| io_error("stat", &path, &e))
    })
    .await?;
    Ok(Unary(EntryResponse { entry: Some(entry) }))
}

/// Creates `dir` and its missing parents with mode 0755 (in the caller's identity, so they
/// belong to the user), like envd's `EnsureDirs`.
pub(crate) fn ensure_dirs(dir: &Path) -> Result<(), RpcError> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(libc::EEXIST)
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            // Some component exists and is not a directory: name it.
            let blocker = dir
                .ancestors()
                .find(|p| std::fs::metadata(p).map(|m| !m.is_dir()).unwrap_or(false))
                .unwrap_or(dir);
            Err(RpcError::invalid_argument(format!(
                "make directory {}: {} exists and is not a directory",
                dir.display(),
                blocker.display()
            )))
        }
        Err(e) => Err(io_error("make directory", dir, &e)),
    }
}

async fn move_entry(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<MoveRequest>,
) -> RpcResult<EntryResponse> {
    let user = request_user(&envd, &headers)?;
    let source = path::resolve(&req.source, &user.home)
        .map_err(|e| RpcError::new(e.code, format!("source: {}", e.message)))?;
    let destination = path::resolve(&req.destination, &user.home)
        .map_err(|e| RpcError::new(e.code, format!("destination: {}", e.message)))?;
    let entry = run_as(&envd, user, move |envd| {
        std::fs::symlink_metadata(&source).map_err(|e| io_error("move", &source, &e))?;
        if let Some(parent) = destination.parent() {
            ensure_dirs(parent)?;
        }
        std::fs::rename(&source, &destination).map_err(|e| {
            let mut err = io_error("move", &source, &e);
            err.message = format!(
                "move {} to {}: {}",
                source.display(),
                destination.display(),
                path::reason(&e)
            );
            if e.raw_os_error() == Some(libc::EXDEV) {
                err.message
                    .push_str(" (source and destination are on different filesystems)");
            }
            err
        })?;
        entry_info(&envd.users, &destination).map_err(|e| io_error("stat", &destination, &e))
    })
    .await?;
    Ok(Unary(EntryResponse { entry: Some(entry) }))
}

async fn remove(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<Empty> {
    let user = request_user(&envd, &headers)?;
    let path = path::resolve(&req.path, &user.home)?;
    if path == Path::new("/") {
        return Err(
            RpcError::invalid_argument("remove /: refusing to remove the root directory").into(),
        );
    }
    run_as(&envd, user, move |_| {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("remove", &path, &e)),
        };
        let result = if meta.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove", &path, &e)),
        }
    })
    .await?;
    Ok(Unary(Empty {}))
}

/// Resolves a watch request and starts the watch.
async fn start_watch(
    envd: &Envd,
    headers: &HeaderMap,
    req: &WatchRequest,
    sink: Sink,
) -> Result<Watch, RpcError> {
    let user = request_user(envd, headers)?;
    let root = path::resolve(&req.path, &user.home)?;
    let spec = WatchSpec {
        root,
        recursive: req.recursive,
        include_entry: req.include_entry,
        allow_network_mounts: req.allow_network_mounts,
    };
    watch::start(envd, &user, spec, sink).await
}

/// `WatchDir`: `start{}` once the watch is in place, then `filesystem{}` events and keepalives
/// until the client goes away (which stops the watch) or the watch fails. Errors, including
/// those before the watch starts, end the stream with a Connect error (HTTP 200), so clients
/// see the real code (`not_found`, `invalid_argument`).
async fn watch_dir(
    State(envd): State<Envd>,
    headers: HeaderMap,
    StreamRequest(req): StreamRequest<WatchRequest>,
) -> Response {
    let (writer, response) = rpc::stream_response();
    let (tx, rx) = mpsc::channel(watch::STREAM_QUEUE_EVENTS);
    match start_watch(&envd, &headers, &req, Sink::Stream(tx)).await {
        Ok(watch) => {
            tokio::spawn(forward_watch(
                watch,
                rx,
                writer,
                rpc::keepalive_interval(&headers),
            ));
        }
        Err(e) => {
            tokio::spawn(writer.finish(Some(e)));
        }
    }
    response.into_response()
}

async fn forward_watch(
    watch: Watch,
    mut events: mpsc::Receiver<Result<FilesystemEvent, RpcError>>,
    writer: StreamWriter,
    keepalive: Option<Duration>,
) {
    let _watch = watch; // stops the watch when this task ends
    if !writer
        .send(&WatchDirResponse {
            event: WatchDirEvent::Start {},
        })
        .await
    {
        return;
    }
    let period = keepalive.unwrap_or(Duration::from_secs(3600 * 24 * 365));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Ok(event)) => {
                    if !writer.send(&WatchDirResponse { event: WatchDirEvent::Filesystem(event) }).await {
                        return;
                    }
                    ticker.reset();
                }
                Some(Err(e)) => {
                    writer.finish(Some(e)).await;
                    return;
                }
                None => {
                    writer.finish(Some(RpcError::internal("watch ended unexpectedly"))).await;
                    return;
                }
            },
            _ = ticker.tick() => {
                if !writer.send(&WatchDirResponse { event: WatchDirEvent::Keepalive {} }).await {
                    return;
                }
            }
            _ = writer.closed() => return,
        }
    }
}

async fn create_watcher(
    State(envd): State<Envd>,
    headers: HeaderMap,
    Unary(req): Unary<WatchRequest>,
) -> RpcResult<WatcherIdMessage> {
    let buffer = Arc::new(Mutex::new(PollBuffer::default()));
    let watch = start_watch(&envd, &headers, &req, Sink::Buffer(Arc::clone(&buffer))).await?;
    let watcher_id = format!("w{}", cella_proto::ids::random_hex(12));
    envd.watchers.insert(
        watcher_id.clone(),
        PollWatcher {
            buffer,
            _watch: watch,
        },
    );
    Ok(Unary(WatcherIdMessage { watcher_id }))
}

async fn get_watcher_events(
    State(envd): State<Envd>,
    Unary(req): Unary<WatcherIdMessage>,
) -> RpcResult<GetWatcherEventsResponse> {
    let watcher = envd.watchers.get(&req.watcher_id)?;
    let mut buffer = watcher.buffer.lock().unwrap_or_else(|e| e.into_inner());
    if buffer.events.is_empty()
        && let Some(failure) = &buffer.failure
    {
        return Err(failure.clone().into());
    }
    let events = std::mem::take(&mut buffer.events);
    Ok(Unary(GetWatcherEventsResponse { events }))
}

async fn remove_watcher(
    State(envd): State<Envd>,
    Unary(req): Unary<WatcherIdMessage>,
) -> RpcResult<Empty> {
    envd.watchers.remove(&req.watcher_id)?;
    Ok(Unary(Empty {}))
}
