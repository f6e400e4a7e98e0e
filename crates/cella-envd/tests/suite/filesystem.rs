//! `filesystem.Filesystem` over a real socket: every RPC's answers and error codes, entry
//! fields, listing depth, and watches (streamed and polled).

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::support::{Harness, WAIT, empty, eventually, is_root};

const STAT: &str = "filesystem.Filesystem/Stat";
const LIST: &str = "filesystem.Filesystem/ListDir";
const MKDIR: &str = "filesystem.Filesystem/MakeDir";
const MOVE: &str = "filesystem.Filesystem/Move";
const REMOVE: &str = "filesystem.Filesystem/Remove";
const WATCH: &str = "filesystem.Filesystem/WatchDir";
const CREATE_WATCHER: &str = "filesystem.Filesystem/CreateWatcher";
const GET_EVENTS: &str = "filesystem.Filesystem/GetWatcherEvents";
const REMOVE_WATCHER: &str = "filesystem.Filesystem/RemoveWatcher";

/// Asserts a unary Connect error: HTTP status, code and a message naming `needle`.
fn assert_error(got: &(StatusCode, Value), status: u16, code: &str, needle: &str) {
    assert_eq!(got.0.as_u16(), status, "unexpected answer {}", got.1);
    assert_eq!(got.1["code"], code, "unexpected error {}", got.1);
    let message = got.1["message"].as_str().expect("message is a string");
    assert!(
        message.contains(needle),
        "message {message:?} should mention {needle:?}"
    );
    assert!(
        !message.ends_with('.'),
        "messages end without a period: {message:?}"
    );
}

fn entry(got: &(StatusCode, Value)) -> &Value {
    assert_eq!(got.0, StatusCode::OK, "unexpected answer {}", got.1);
    &got.1["entry"]
}

#[tokio::test]
async fn stat_describes_files_directories_and_symlinks() {
    let h = Harness::start().await;
    let file = h.path("a.txt");
    std::fs::write(&file, "hello").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    std::fs::create_dir(h.path("dir")).expect("mkdir");
    std::os::unix::fs::symlink(&file, h.path("link")).expect("symlink");
    std::os::unix::fs::symlink(h.path("dir"), h.path("dirlink")).expect("symlink");
    std::os::unix::fs::symlink(h.path("nowhere"), h.path("dangling")).expect("symlink");
    let meta = std::fs::metadata(&file).expect("stat");

    let got = h.unary(STAT, json!({ "path": h.p("a.txt") })).await;
    let e = entry(&got);
    assert_eq!(e["name"], "a.txt");
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["path"], h.p("a.txt"));
    assert_eq!(e["size"], "5", "int64 travels as a string");
    assert_eq!(e["mode"], 0o640);
    assert_eq!(e["permissions"], "-rw-r-----");
    assert_eq!(e["owner"], h.user);
    assert_eq!(e["group"], h.envd.users.gid_name(meta.gid()));
    let mtime = e["modifiedTime"].as_str().expect("modifiedTime");
    assert_eq!(
        mtime,
        cella_envd::filesystem::entry::rfc3339(meta.mtime(), meta.mtime_nsec())
    );
    assert!(
        mtime.ends_with('Z') && mtime.len() >= 20,
        "RFC 3339 UTC: {mtime}"
    );
    assert_eq!(e["isSymlink"], false);
    assert!(
        e.get("symlinkTarget").is_none(),
        "no target for a plain file: {e}"
    );

    let got = h.unary(STAT, json!({ "path": h.p("dir") })).await;
    let e = entry(&got);
    assert_eq!(e["type"], "FILE_TYPE_DIRECTORY");
    assert!(e["permissions"].as_str().expect("perms").starts_with('d'));

    // A symlink reports its target's type and bits, and itself as a symlink.
    let got = h.unary(STAT, json!({ "path": h.p("link") })).await;
    let e = entry(&got);
    assert_eq!(e["name"], "link");
    assert_eq!(e["path"], h.p("link"));
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["isSymlink"], true);
    assert_eq!(e["mode"], 0o640);
    assert_eq!(
        e["symlinkTarget"],
        std::fs::canonicalize(&file)
            .expect("canon")
            .to_string_lossy()
            .as_ref()
    );
    assert!(e["permissions"].as_str().expect("perms").starts_with('L'));

    let got = h.unary(STAT, json!({ "path": h.p("dirlink") })).await;
    assert_eq!(entry(&got)["type"], "FILE_TYPE_DIRECTORY");

    let got = h.unary(STAT, json!({ "path": h.p("dangling") })).await;
    let e = entry(&got);
    assert_eq!(e["type"], "FILE_TYPE_SYMLINK");
    assert_eq!(e["isSymlink"], true);
    assert_eq!(e["symlinkTarget"], h.p("nowhere"));
}

#[tokio::test]
async fn stat_errors_and_path_resolution() {
    let h = Harness::start().await;
    let missing = h.p("missing");
    assert_error(
        &h.unary(STAT, json!({ "path": missing })).await,
        404,
        "not_found",
        &missing,
    );
    assert_error(
        &h.unary(STAT, json!({ "path": "" })).await,
        400,
        "invalid_argument",
        "path is empty",
    );
    assert_error(
        &h.unary(STAT, json!({ "path": "~nobody/x" })).await,
        400,
        "invalid_argument",
        "~nobody",
    );
    // A path below a file does not exist.
    std::fs::write(h.path("f"), "x").expect("write");
    let below = h.p("f/x");
    assert_error(
        &h.unary(STAT, json!({ "path": below })).await,
        404,
        "not_found",
        &below,
    );
    // `~` and relative paths resolve against the user's home; `..` is folded.
    let got = h.unary(STAT, json!({ "path": "~" })).await;
    assert_eq!(entry(&got)["path"], h.home.to_string_lossy().as_ref());
    let got = h.unary(STAT, json!({ "path": "." })).await;
    assert_eq!(entry(&got)["path"], h.home.to_string_lossy().as_ref());
    let got = h
        .unary(STAT, json!({ "path": format!("{}/../work/./f", h.p("")) }))
        .await;
    assert_eq!(entry(&got)["path"], h.p("f"));
    // Unknown users are unauthenticated.
    let got = h
        .unary_as(Some("no-such-user-here"), STAT, json!({ "path": h.p("f") }))
        .await;
    assert_error(&got, 401, "unauthenticated", "no-such-user-here");
}

#[tokio::test]
async fn permission_checks_run_as_the_requesting_user_needs_root() {
    if !is_root() {
        eprintln!("skipped: acting as another user needs root");
        return;
    }
    let h = Harness::start().await;
    let private = h.path("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::write(private.join("secret"), "s").expect("write");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let secret = h.p("private/secret");
    let got = h
        .unary_as(Some("nobody"), STAT, json!({ "path": secret }))
        .await;
    assert_error(&got, 403, "permission_denied", &secret);
    let got = h
        .unary_as(Some("nobody"), LIST, json!({ "path": h.p("private") }))
        .await;
    assert_error(&got, 403, "permission_denied", &h.p("private"));
    let got = h
        .unary_as(Some("nobody"), MKDIR, json!({ "path": h.p("private/sub") }))
        .await;
    assert_error(&got, 403, "permission_denied", &h.p("private/sub"));
    let got = h
        .unary_as(Some("nobody"), REMOVE, json!({ "path": secret }))
        .await;
    assert_error(&got, 403, "permission_denied", &secret);
    assert!(private.join("secret").exists());
    // Root sees it, and directories nobody creates belong to nobody.
    assert_eq!(
        h.unary(STAT, json!({ "path": secret })).await.0,
        StatusCode::OK
    );
    std::fs::set_permissions(h.path(""), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let got = h
        .unary_as(Some("nobody"), MKDIR, json!({ "path": h.p("nb/deep") }))
        .await;
    assert_eq!(entry(&got)["owner"], "nobody");
    assert_eq!(std::fs::metadata(h.path("nb")).expect("stat").uid(), 65534);
    assert_eq!(
        std::fs::metadata(h.path("nb")).expect("stat").mode() & 0o777,
        0o755
    );
}

#[tokio::test]
async fn list_dir_honours_depth() {
    let h = Harness::start().await;
    std::fs::create_dir_all(h.path("a/b/c")).expect("mkdir");
    std::fs::write(h.path("a/b/c/deep.txt"), "d").expect("write");
    std::fs::write(h.path("a/b/c.txt"), "c").expect("write");
    std::fs::write(h.path("a/x.txt"), "x").expect("write");
    std::fs::write(h.path("top.txt"), "t").expect("write");
    std::os::unix::fs::symlink(h.path("a"), h.path("z-link")).expect("symlink");

    let names = |got: &(StatusCode, Value)| -> Vec<String> {
        assert_eq!(got.0, StatusCode::OK, "{}", got.1);
        got.1["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| {
                e["path"]
                    .as_str()
                    .expect("path")
                    .trim_start_matches(&h.p(""))
                    .to_string()
            })
            .collect()
    };
    for depth in [0, 1] {
        let got = h
            .unary(LIST, json!({ "path": h.p(""), "depth": depth }))
            .await;
        assert_eq!(names(&got), ["/a", "/top.txt", "/z-link"], "depth {depth}");
    }
    let got = h.unary(LIST, json!({ "path": h.p(""), "depth": 2 })).await;
    assert_eq!(
        names(&got),
        ["/a", "/a/b", "/a/x.txt", "/top.txt", "/z-link"]
    );
    let got = h.unary(LIST, json!({ "path": h.p(""), "depth": 10 })).await;
    assert_eq!(
        names(&got),
        [
            "/a",
            "/a/b",
            "/a/b/c",
            "/a/b/c/deep.txt",
            "/a/b/c.txt",
            "/a/x.txt",
            "/top.txt",
            "/z-link"
        ],
        "symlinked directories are not descended into"
    );
    let entries = got.1["entries"].as_array().expect("entries");
    assert_eq!(entries[0]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(entries[0]["name"], "a");
    assert_eq!(entries[3]["size"], "1");
    assert_eq!(entries[7]["isSymlink"], true);
    assert_eq!(entries[7]["type"], "FILE_TYPE_DIRECTORY");

    // Listing through a symlink lists its target, under the requested path.
    let got = h.unary(LIST, json!({ "path": h.p("z-link") })).await;
    assert_eq!(names(&got), ["/z-link/b", "/z-link/x.txt"]);

    let file = h.p("top.txt");
    assert_error(
        &h.unary(LIST, json!({ "path": file })).await,
        400,
        "invalid_argument",
        &file,
    );
    let missing = h.p("nope");
    assert_error(
        &h.unary(LIST, json!({ "path": missing })).await,
        404,
        "not_found",
        &missing,
    );
}

#[tokio::test]
async fn make_dir_creates_parents_and_reports_existing() {
    let h = Harness::start().await;
    let got = h.unary(MKDIR, json!({ "path": h.p("x/y/z") })).await;
    let e = entry(&got);
    assert_eq!(e["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(e["name"], "z");
    assert_eq!(e["path"], h.p("x/y/z"));
    assert!(h.path("x/y/z").is_dir());
    assert_eq!(
        std::fs::metadata(h.path("x/y")).expect("stat").mode() & 0o777,
        0o755
    );

    let again = h.p("x/y/z");
    assert_error(
        &h.unary(MKDIR, json!({ "path": again })).await,
        409,
        "already_exists",
        &again,
    );
    std::fs::write(h.path("file"), "f").expect("write");
    let file = h.p("file");
    assert_error(
        &h.unary(MKDIR, json!({ "path": file })).await,
        400,
        "invalid_argument",
        &file,
    );
    let under = h.p("file/sub");
    assert_error(
        &h.unary(MKDIR, json!({ "path": under })).await,
        400,
        "invalid_argument",
        &file,
    );
}

#[tokio::test]
async fn move_renames_and_creates_destination_parents() {
    let h = Harness::start().await;
    std::fs::write(h.path("src.txt"), "payload").expect("write");
    let got = h
        .unary(
            MOVE,
            json!({ "source": h.p("src.txt"), "destination": h.p("new/dir/dst.txt") }),
        )
        .await;
    let e = entry(&got);
    assert_eq!(e["path"], h.p("new/dir/dst.txt"));
    assert_eq!(e["name"], "dst.txt");
    assert_eq!(e["size"], "7");
    assert!(!h.path("src.txt").exists());
    assert_eq!(
        std::fs::read_to_string(h.path("new/dir/dst.txt")).expect("read"),
        "payload"
    );

    // Directories move too, and an existing destination file is replaced.
    std::fs::create_dir_all(h.path("d1/inner")).expect("mkdir");
    let got = h
        .unary(
            MOVE,
            json!({ "source": h.p("d1"), "destination": h.p("d2") }),
        )
        .await;
    assert_eq!(entry(&got)["type"], "FILE_TYPE_DIRECTORY");
    assert!(h.path("d2/inner").is_dir());
    std::fs::write(h.path("one"), "1").expect("write");
    std::fs::write(h.path("two"), "2").expect("write");
    let got = h
        .unary(
            MOVE,
            json!({ "source": h.p("one"), "destination": h.p("two") }),
        )
        .await;
    assert_eq!(got.0, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(h.path("two")).expect("read"), "1");

    let missing = h.p("missing");
    let got = h
        .unary(MOVE, json!({ "source": missing, "destination": h.p("x") }))
        .await;
    assert_error(&got, 404, "not_found", &missing);
    let got = h
        .unary(MOVE, json!({ "source": h.p("two"), "destination": "" }))
        .await;
    assert_error(&got, 400, "invalid_argument", "destination");
}

#[tokio::test]
async fn remove_is_recursive_and_idempotent() {
    let h = Harness::start().await;
    std::fs::create_dir_all(h.path("tree/a/b")).expect("mkdir");
    std::fs::write(h.path("tree/a/b/f"), "f").expect("write");
    std::fs::write(h.path("keep"), "k").expect("write");
    std::os::unix::fs::symlink(h.path("keep"), h.path("link")).expect("symlink");

    assert_eq!(
        h.unary(REMOVE, json!({ "path": h.p("tree") })).await.0,
        StatusCode::OK
    );
    assert!(!h.path("tree").exists());
    // Removing a symlink removes the link, not its target.
    assert_eq!(
        h.unary(REMOVE, json!({ "path": h.p("link") })).await.0,
        StatusCode::OK
    );
    assert!(h.path("keep").exists());
    assert!(std::fs::symlink_metadata(h.path("link")).is_err());
    // Missing paths are fine (envd removes with os.RemoveAll).
    assert_eq!(
        h.unary(REMOVE, json!({ "path": h.p("tree") })).await.0,
        StatusCode::OK
    );
    assert_error(
        &h.unary(REMOVE, json!({ "path": "/" })).await,
        400,
        "invalid_argument",
        "root",
    );
    assert_error(
        &h.unary(REMOVE, json!({ "path": "" })).await,
        400,
        "invalid_argument",
        "path is empty",
    );
}

#[tokio::test]
async fn connect_errors_have_the_protocol_shape() {
    let h = Harness::start().await;
    // Malformed message.
    let resp = h
        .request(
            "POST",
            &format!("/{STAT}"),
            &[("content-type", "application/json")],
            super::support::full("{not json"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body = super::support::body_json(resp).await;
    assert_eq!(body["code"], "invalid_argument");
    assert!(body["message"].is_string());
    // Wrong codec.
    let resp = h
        .request(
            "POST",
            &format!("/{STAT}"),
            &[("content-type", "application/proto")],
            empty(),
        )
        .await;
    let status = resp.status();
    let body = super::support::body_json(resp).await;
    assert_eq!(
        (status.as_u16(), body["code"].as_str()),
        (501, Some("unimplemented"))
    );
}

/// Collects `(type, name)` of filesystem events from a WatchDir stream until `done` holds.
async fn collect_until(
    stream: &mut super::support::ConnectStream,
    seen: &mut Vec<(String, String, Value)>,
    done: impl Fn(&[(String, String, Value)]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(seen) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(env) = stream.next_within(left).await else {
            panic!("timed out; events so far: {seen:?}");
        };
        assert!(
            !env.is_end_stream(),
            "stream ended: {}",
            String::from_utf8_lossy(&env.data)
        );
        let msg: Value = serde_json::from_slice(&env.data).expect("json");
        if let Some(fs) = msg.get("filesystem") {
            seen.push((
                fs["type"].as_str().unwrap_or("").to_string(),
                fs["name"].as_str().unwrap_or("").to_string(),
                fs.get("entry").cloned().unwrap_or(Value::Null),
            ));
        }
    }
}

fn has(seen: &[(String, String, Value)], kind: &str, name: &str) -> bool {
    seen.iter()
        .any(|(t, n, _)| t == &format!("EVENT_TYPE_{kind}") && n == name)
}

#[tokio::test]
async fn watch_dir_streams_start_then_events() {
    let h = Harness::start().await;
    let mut stream = h
        .server_stream(WATCH, json!({ "path": h.p(""), "includeEntry": true }), &[])
        .await;
    assert_eq!(stream.status, StatusCode::OK);
    assert_eq!(
        stream.message().await,
        json!({ "start": {} }),
        "start comes first"
    );

    let mut seen = Vec::new();
    std::fs::write(h.path("f.txt"), "one").expect("write");
    collect_until(&mut stream, &mut seen, |s| {
        has(s, "CREATE", "f.txt") && has(s, "WRITE", "f.txt")
    })
    .await;
    let (_, _, entry) = seen
        .iter()
        .find(|(t, _, _)| t == "EVENT_TYPE_CREATE")
        .expect("create");
    assert_eq!(entry["path"], h.p("f.txt"), "include_entry adds the entry");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");

    std::fs::set_permissions(h.path("f.txt"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    collect_until(&mut stream, &mut seen, |s| has(s, "CHMOD", "f.txt")).await;
    std::fs::rename(h.path("f.txt"), h.path("g.txt")).expect("rename");
    collect_until(&mut stream, &mut seen, |s| {
        has(s, "RENAME", "f.txt") && has(s, "CREATE", "g.txt")
    })
    .await;
    std::fs::remove_file(h.path("g.txt")).expect("remove");
    collect_until(&mut stream, &mut seen, |s| has(s, "REMOVE", "g.txt")).await;
    let (_, _, removed) = seen.last().expect("event");
    assert!(
        removed.is_null(),
        "a removed entry has no entry info: {removed}"
    );

    // Not recursive: changes inside subdirectories are not reported.
    std::fs::create_dir(h.path("sub")).expect("mkdir");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "sub")).await;
    std::fs::write(h.path("sub/inner"), "i").expect("write");
    std::fs::write(h.path("marker"), "m").expect("write");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "marker")).await;
    assert!(
        !seen.iter().any(|(_, n, _)| n.starts_with("sub/")),
        "{seen:?}"
    );
}

#[tokio::test]
async fn watch_dir_recursive_follows_new_subdirectories() {
    let h = Harness::start().await;
    std::fs::create_dir(h.path("old")).expect("mkdir");
    let mut stream = h
        .server_stream(WATCH, json!({ "path": h.p(""), "recursive": true }), &[])
        .await;
    assert!(stream.message().await.get("start").is_some());

    let mut seen = Vec::new();
    std::fs::write(h.path("old/a"), "a").expect("write");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "old/a")).await;
    std::fs::create_dir(h.path("new")).expect("mkdir");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "new")).await;
    std::fs::write(h.path("new/b"), "b").expect("write");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "new/b")).await;
    // A tree created in one go: entries made before the new watch existed are reported too.
    std::fs::create_dir_all(h.path("p/q/r")).expect("mkdir");
    std::fs::write(h.path("p/q/r/leaf"), "l").expect("write");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "p/q/r/leaf")).await;
    // A directory moved within the tree is watched under its new name.
    std::fs::rename(h.path("new"), h.path("renamed")).expect("rename");
    collect_until(&mut stream, &mut seen, |s| {
        has(s, "RENAME", "new") && has(s, "CREATE", "renamed")
    })
    .await;
    std::fs::write(h.path("renamed/c"), "c").expect("write");
    collect_until(&mut stream, &mut seen, |s| has(s, "CREATE", "renamed/c")).await;
    assert!(
        !seen.iter().any(|(_, n, _)| n.starts_with("new/c")),
        "{seen:?}"
    );
}

#[tokio::test]
async fn watch_dir_sends_keepalives() {
    let h = Harness::start().await;
    let mut stream = h
        .server_stream(
            WATCH,
            json!({ "path": h.p("") }),
            &[("keepalive-ping-interval", "1")],
        )
        .await;
    assert!(stream.message().await.get("start").is_some());
    let msg = stream.message().await;
    assert_eq!(msg, json!({ "keepalive": {} }));
}

#[tokio::test]
async fn watch_dir_errors_end_the_stream() {
    let h = Harness::start().await;
    let missing = h.p("missing");
    let mut stream = h
        .server_stream(WATCH, json!({ "path": missing }), &[])
        .await;
    assert_eq!(
        stream.status,
        StatusCode::OK,
        "stream errors travel in the end-stream message"
    );
    let end = stream.end().await;
    assert_eq!(end["error"]["code"], "not_found");
    assert!(
        end["error"]["message"]
            .as_str()
            .expect("message")
            .contains(&missing)
    );

    std::fs::write(h.path("file"), "f").expect("write");
    let mut stream = h
        .server_stream(WATCH, json!({ "path": h.p("file") }), &[])
        .await;
    assert_eq!(stream.end().await["error"]["code"], "invalid_argument");
}

/// inotify watches this process holds on `path`'s inode (from `/proc/self/fdinfo`).
fn inotify_watches_on(path: &std::path::Path) -> usize {
    let inode = std::fs::metadata(path).expect("stat").ino();
    let needle = format!(" ino:{inode:x} ");
    std::fs::read_dir("/proc/self/fdinfo")
        .map(|rd| {
            rd.flatten()
                .filter_map(|f| std::fs::read_to_string(f.path()).ok())
                .map(|info| {
                    info.lines()
                        .filter(|l| l.starts_with("inotify ") && l.contains(&needle))
                        .count()
                })
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn watch_dir_stops_when_the_client_disconnects() {
    let h = Harness::start().await;
    let dir = h.path("");
    assert_eq!(inotify_watches_on(&dir), 0);
    let mut stream = h
        .server_stream(WATCH, json!({ "path": h.p("") }), &[])
        .await;
    assert!(stream.message().await.get("start").is_some());
    assert_eq!(inotify_watches_on(&dir), 1);
    drop(stream);
    eventually("the watch is released", || inotify_watches_on(&dir) == 0).await;
}

/// Polls `GetWatcherEvents` into `events` until a `kind` event for `name` arrives.
async fn poll_until(
    h: &Harness,
    id: &str,
    events: &mut Vec<(String, String)>,
    kind: &str,
    name: &str,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !events.iter().any(|(t, n)| t == kind && n == name) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {kind} {name}; events so far: {events:?}"
        );
        let got = h.unary(GET_EVENTS, json!({ "watcherId": id })).await;
        assert_eq!(got.0, StatusCode::OK, "{}", got.1);
        for e in got.1["events"].as_array().into_iter().flatten() {
            events.push((
                e["type"].as_str().unwrap_or("").into(),
                e["name"].as_str().unwrap_or("").into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn poll_watcher_buffers_events_until_drained() {
    let h = Harness::start().await;
    let got = h
        .unary(
            CREATE_WATCHER,
            json!({ "path": h.p(""), "recursive": true }),
        )
        .await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    let id = got.1["watcherId"].as_str().expect("watcherId").to_string();
    assert!(!id.is_empty());

    let mut events: Vec<(String, String)> = Vec::new();
    std::fs::create_dir(h.path("d")).expect("mkdir");
    // Changes inside `d` are seen once its watch is in place, which the CREATE of `d` tells.
    poll_until(&h, &id, &mut events, "EVENT_TYPE_CREATE", "d").await;
    std::fs::write(h.path("d/f"), "x").expect("write");
    std::fs::remove_file(h.path("d/f")).expect("rm");
    poll_until(&h, &id, &mut events, "EVENT_TYPE_REMOVE", "d/f").await;
    let kinds: BTreeSet<_> = events.iter().map(|(t, n)| format!("{t} {n}")).collect();
    for want in [
        "EVENT_TYPE_CREATE d",
        "EVENT_TYPE_CREATE d/f",
        "EVENT_TYPE_WRITE d/f",
        "EVENT_TYPE_REMOVE d/f",
    ] {
        assert!(kinds.contains(want), "missing {want} in {kinds:?}");
    }
    // Drained: nothing new.
    let got = h.unary(GET_EVENTS, json!({ "watcherId": id })).await;
    assert_eq!(
        got.1["events"].as_array().map(Vec::len).unwrap_or(0),
        0,
        "{}",
        got.1
    );

    assert_eq!(
        h.unary(REMOVE_WATCHER, json!({ "watcherId": id })).await.0,
        StatusCode::OK
    );
    assert!(h.envd.watchers.is_empty());
    eventually("the watches are released", || {
        inotify_watches_on(&h.path("")) == 0
    })
    .await;
    assert_error(
        &h.unary(GET_EVENTS, json!({ "watcherId": id })).await,
        404,
        "not_found",
        &id,
    );
    assert_error(
        &h.unary(REMOVE_WATCHER, json!({ "watcherId": id })).await,
        404,
        "not_found",
        &id,
    );

    let missing = h.p("missing");
    assert_error(
        &h.unary(CREATE_WATCHER, json!({ "path": missing })).await,
        404,
        "not_found",
        &missing,
    );
    std::fs::write(h.path("file"), "f").expect("write");
    let file = h.p("file");
    assert_error(
        &h.unary(CREATE_WATCHER, json!({ "path": file })).await,
        400,
        "invalid_argument",
        &file,
    );
}

#[tokio::test]
async fn poll_watcher_overflow_is_reported() {
    let h = Harness::start().await;
    let got = h.unary(CREATE_WATCHER, json!({ "path": h.p("") })).await;
    let id = got.1["watcherId"].as_str().expect("watcherId").to_string();
    let limit = cella_envd::filesystem::watch::POLL_BUFFER_EVENTS;
    let dir = h.path("");
    tokio::task::spawn_blocking(move || {
        for i in 0..=limit {
            std::fs::File::create(dir.join(format!("f{i}"))).expect("create");
        }
    })
    .await
    .expect("creator");
    // Let the watch take in every event before the first poll drains any.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = h.unary(GET_EVENTS, json!({ "watcherId": id })).await;
        if got.0 != StatusCode::OK {
            assert_error(&got, 429, "resource_exhausted", "lost events");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no overflow reported"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn watches_end_when_the_watched_directory_goes_away() {
    let h = Harness::start().await;
    std::fs::create_dir(h.path("streamed")).expect("mkdir");
    std::fs::create_dir(h.path("polled")).expect("mkdir");
    let mut stream = h
        .server_stream(WATCH, json!({ "path": h.p("streamed") }), &[])
        .await;
    assert!(stream.message().await.get("start").is_some());
    let got = h
        .unary(CREATE_WATCHER, json!({ "path": h.p("polled") }))
        .await;
    let id = got.1["watcherId"].as_str().expect("watcherId").to_string();

    std::fs::remove_dir(h.path("streamed")).expect("rmdir");
    std::fs::remove_dir(h.path("polled")).expect("rmdir");

    let mut seen = Vec::new();
    collect_until(&mut stream, &mut seen, |s| has(s, "REMOVE", ".")).await;
    let end = stream.end().await;
    assert_eq!(end["error"]["code"], "not_found", "{end}");
    assert!(
        end["error"]["message"]
            .as_str()
            .expect("message")
            .contains("removed")
    );

    // The poll API hands out the events first, then reports the end.
    let mut events = Vec::new();
    poll_until(&h, &id, &mut events, "EVENT_TYPE_REMOVE", ".").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = h.unary(GET_EVENTS, json!({ "watcherId": id })).await;
        if got.0 != StatusCode::OK {
            assert_error(&got, 404, "not_found", "removed");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the poll watcher never reported its end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.unary(REMOVE_WATCHER, json!({ "watcherId": id })).await.0,
        StatusCode::OK
    );
}
