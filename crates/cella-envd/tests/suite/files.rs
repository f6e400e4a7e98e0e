//! `GET /files` and `POST /files` over a real socket: streaming 100 MB both ways, gzip in both
//! directions, multipart with several files, overwrite semantics, errors, and uploads that
//! fail half-way leaving nothing behind.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::support::{
    Harness, Pattern, WAIT, body_bytes, body_json, empty, eventually, full, is_root, names_in,
    stream_body,
};

fn query(path: &str) -> String {
    let mut q = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            q.push(char::from(b));
        } else {
            q.push_str(&format!("%{b:02X}"));
        }
    }
    q
}

fn files_uri(path: &str) -> String {
    format!("/files?path={}", query(path))
}

/// Asserts a `/files` error: status and `{"code": <status>, "message": ...}` naming `needle`.
async fn assert_http_error(
    resp: hyper::Response<hyper::body::Incoming>,
    status: u16,
    needle: &str,
) {
    assert_eq!(resp.status().as_u16(), status);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let body = body_json(resp).await;
    assert_eq!(body["code"], status, "{body}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains(needle),
        "message {message:?} should mention {needle:?}"
    );
}

/// The chunks of a pattern stream of `len` bytes.
fn pattern_chunks(
    seed: u64,
    len: usize,
    chunk: usize,
) -> impl futures::Stream<Item = Bytes> + Send + Sync {
    let mut pattern = Pattern::new(seed);
    let mut left = len;
    futures::stream::iter(std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let n = left.min(chunk);
        left -= n;
        let mut buf = vec![0u8; n];
        pattern.fill(&mut buf);
        Some(Bytes::from(buf))
    }))
}

/// Compares a reader against the pattern, chunk by chunk, without holding either whole.
fn assert_matches_pattern(mut reader: impl Read, seed: u64, len: usize) {
    let mut pattern = Pattern::new(seed);
    let mut got = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let mut filled = 0;
        while filled < got.len() {
            let n = reader.read(&mut got[filled..]).expect("read");
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        pattern.fill(&mut want[..filled]);
        assert!(
            got[..filled] == want[..filled],
            "content differs within bytes {total}..{}",
            total + filled
        );
        total += filled;
        if filled < got.len() {
            break;
        }
    }
    assert_eq!(total, len, "length");
}

fn multipart(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (filename, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

fn no_temp_files(dir: &Path) -> bool {
    !names_in(dir).iter().any(|n| n.contains(".upload-"))
}

#[tokio::test]
async fn hundred_megabytes_stream_up_and_down() {
    const LEN: usize = 100 * 1024 * 1024;
    let h = Harness::start().await;
    let dest = h.p("big/blob.bin");

    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[("content-type", "application/octet-stream")],
            stream_body(pattern_chunks(7, LEN, 256 * 1024)),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let written = body_json(resp).await;
    assert_eq!(
        written,
        json!([{ "path": dest, "name": "blob.bin", "type": "file" }])
    );
    assert_eq!(std::fs::metadata(&dest).expect("stat").len(), LEN as u64);
    assert_matches_pattern(std::fs::File::open(&dest).expect("open"), 7, LEN);
    assert!(
        no_temp_files(&h.path("big")),
        "{:?}",
        names_in(&h.path("big"))
    );

    let resp = h.request("GET", &files_uri(&dest), &[], empty()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["content-length"], LEN.to_string().as_str());
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"blob.bin\""
    );
    assert!(headers.get("content-encoding").is_none());
    // Read the body as it streams and compare on the fly.
    let mut body = resp.into_body();
    let mut pattern = Pattern::new(7);
    let mut total = 0usize;
    while let Some(frame) = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("chunk in time")
    {
        let Ok(data) = frame.expect("frame").into_data() else {
            continue;
        };
        let mut want = vec![0u8; data.len()];
        pattern.fill(&mut want);
        assert!(
            data[..] == want[..],
            "download differs within bytes {total}..{}",
            total + data.len()
        );
        total += data.len();
    }
    assert_eq!(total, LEN);
}

#[tokio::test]
async fn gzip_download_and_upload() {
    let h = Harness::start().await;
    // Half text, half noise: compressible but not trivially.
    let mut data = Vec::new();
    while data.len() < 1024 * 1024 {
        data.extend_from_slice(format!("line {} of the test file\n", data.len()).as_bytes());
    }
    data.extend_from_slice(&Pattern::bytes(3, 1024 * 1024));
    std::fs::write(h.path("data.txt"), &data).expect("write");

    let resp = h
        .request(
            "GET",
            &files_uri(&h.p("data.txt")),
            &[("accept-encoding", "gzip")],
            empty(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let compressed = body_bytes(resp).await;
    assert!(compressed.len() < data.len());
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .read_to_end(&mut plain)
        .expect("valid gzip");
    assert!(plain == data, "gzip download round-trips");

    // Identity when gzip is not offered; 406 when identity is refused and gzip not offered.
    let resp = h
        .request(
            "GET",
            &files_uri(&h.p("data.txt")),
            &[("accept-encoding", "br")],
            empty(),
        )
        .await;
    assert!(resp.headers().get("content-encoding").is_none());
    assert_eq!(body_bytes(resp).await.len(), data.len());
    let resp = h
        .request(
            "GET",
            &files_uri(&h.p("data.txt")),
            &[("accept-encoding", "identity;q=0")],
            empty(),
        )
        .await;
    assert_http_error(resp, 406, "accept-encoding").await;

    // gzip-encoded octet-stream upload.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&data).expect("gzip");
    let gz = enc.finish().expect("gzip");
    let dest = h.p("up/data.txt");
    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[
                ("content-type", "application/octet-stream"),
                ("content-encoding", "gzip"),
            ],
            full(gz.clone()),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", body_json(resp).await);
    assert!(std::fs::read(&dest).expect("read") == data);

    // A truncated gzip body is rejected and leaves neither the file nor a temp file.
    let bad = h.p("up/bad.txt");
    let resp = h
        .request(
            "POST",
            &files_uri(&bad),
            &[
                ("content-type", "application/octet-stream"),
                ("content-encoding", "gzip"),
            ],
            full(gz[..gz.len() / 2].to_vec()),
        )
        .await;
    assert_http_error(resp, 400, "gzip").await;
    assert!(!Path::new(&bad).exists());
    assert!(
        no_temp_files(&h.path("up")),
        "{:?}",
        names_in(&h.path("up"))
    );
}

#[tokio::test]
async fn multipart_uploads_several_files() {
    let h = Harness::start().await;
    let big = Pattern::bytes(11, 3 * 1024 * 1024); // above axum's default 2 MiB body limit
    let (a, b, c) = (h.p("m/a.txt"), h.p("m/deep/er/b.bin"), h.p("m/c.txt"));
    let body = multipart("XyZ-boundary", &[(&a, b"alpha"), (&b, &big), (&c, b"")]);
    let resp = h
        .request(
            "POST",
            "/files",
            &[("content-type", "multipart/form-data; boundary=XyZ-boundary")],
            full(body),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let written = body_json(resp).await;
    assert_eq!(
        written,
        json!([
            { "path": a, "name": "a.txt", "type": "file" },
            { "path": b, "name": "b.bin", "type": "file" },
            { "path": c, "name": "c.txt", "type": "file" },
        ])
    );
    assert_eq!(std::fs::read(&a).expect("a"), b"alpha");
    assert!(std::fs::read(&b).expect("b") == big);
    assert_eq!(std::fs::read(&c).expect("c").len(), 0);

    // One part with ?path=: the query names the destination (the SDK sends both).
    let q = h.p("m/from-query.txt");
    let body = multipart("b1", &[("ignored-name.txt", b"q")]);
    let resp = h
        .request(
            "POST",
            &files_uri(&q),
            &[("content-type", "multipart/form-data; boundary=b1")],
            full(body),
        )
        .await;
    assert_eq!(body_json(resp).await[0]["path"], q);
    assert_eq!(std::fs::read(&q).expect("q"), b"q");

    // The same destination twice is refused.
    let body = multipart("b2", &[(&a, b"1"), (&a, b"2")]);
    let resp = h
        .request(
            "POST",
            "/files",
            &[("content-type", "multipart/form-data; boundary=b2")],
            full(body),
        )
        .await;
    assert_http_error(resp, 400, "twice").await;
    // No part named "file".
    let body =
        b"--b3\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--b3--\r\n".to_vec();
    let resp = h
        .request(
            "POST",
            "/files",
            &[("content-type", "multipart/form-data; boundary=b3")],
            full(body),
        )
        .await;
    assert_http_error(resp, 400, "no part named").await;
}

#[tokio::test]
async fn upload_overwrites_in_place_keeping_the_mode() {
    let h = Harness::start().await;
    let script = h.path("run.sh");
    std::fs::write(&script, "old contents that are longer").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let resp = h
        .request(
            "POST",
            &files_uri(&h.p("run.sh")),
            &[("content-type", "application/octet-stream")],
            full("new"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&script).expect("read"), "new");
    assert_eq!(
        std::fs::metadata(&script).expect("stat").mode() & 0o7777,
        0o750
    );

    // Writing through a symlink replaces the file it points at.
    std::os::unix::fs::symlink(&script, h.path("alias")).expect("symlink");
    let resp = h
        .request(
            "POST",
            &files_uri(&h.p("alias")),
            &[("content-type", "application/octet-stream")],
            full("via link"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        std::fs::symlink_metadata(h.path("alias"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_to_string(&script).expect("read"), "via link");
    assert_eq!(
        names_in(&h.path("")),
        ["alias", "run.sh"],
        "no temp files left"
    );
}

#[tokio::test]
async fn transfer_errors_are_json_with_http_status() {
    let h = Harness::start().await;
    std::fs::create_dir(h.path("dir")).expect("mkdir");
    std::fs::write(h.path("file"), "f").expect("write");
    let octet = [("content-type", "application/octet-stream")];

    let missing = h.p("missing");
    assert_http_error(
        h.request("GET", &files_uri(&missing), &[], empty()).await,
        404,
        &missing,
    )
    .await;
    let dir = h.p("dir");
    assert_http_error(
        h.request("GET", &files_uri(&dir), &[], empty()).await,
        400,
        &dir,
    )
    .await;
    assert_http_error(
        h.request("GET", "/files", &[], empty()).await,
        400,
        "path is empty",
    )
    .await;
    let fifo = h.p("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let resp = tokio::time::timeout(WAIT, h.request("GET", &files_uri(&fifo), &[], empty()))
        .await
        .expect("a FIFO is refused, not waited on");
    assert_http_error(resp, 400, "not a regular file").await;
    let resp = h
        .request(
            "GET",
            &format!("{}&username=no-such-user-here", files_uri(&h.p("file"))),
            &[],
            empty(),
        )
        .await;
    assert_http_error(resp, 401, "no-such-user-here").await;

    assert_http_error(
        h.request("POST", &files_uri(&dir), &octet, full("x")).await,
        400,
        &dir,
    )
    .await;
    let under_file = h.p("file/x");
    assert_http_error(
        h.request("POST", &files_uri(&under_file), &octet, full("x"))
            .await,
        400,
        &h.p("file"),
    )
    .await;
    assert_http_error(
        h.request("POST", "/files", &octet, full("x")).await,
        400,
        "?path=",
    )
    .await;
    let resp = h
        .request(
            "POST",
            &files_uri(&h.p("t")),
            &[("content-type", "text/plain")],
            full("x"),
        )
        .await;
    assert_http_error(resp, 400, "content-type").await;
    let resp = h
        .request(
            "POST",
            &format!("{}&username=no-such-user-here", files_uri(&h.p("t"))),
            &octet,
            full("x"),
        )
        .await;
    assert_http_error(resp, 401, "no-such-user-here").await;
    let resp = h
        .request(
            "POST",
            &files_uri(&h.p("t")),
            &[
                ("content-type", "application/octet-stream"),
                ("content-encoding", "br"),
            ],
            full("x"),
        )
        .await;
    assert_http_error(resp, 400, "content-encoding").await;
    assert!(!h.path("t").exists());
}

#[tokio::test]
async fn an_interrupted_upload_leaves_nothing_behind() {
    let h = Harness::start().await;
    let dest = h.p("partial/file.bin");
    let mut stream = tokio::net::UnixStream::connect(&h.socket)
        .await
        .expect("connect");
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: envd\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        files_uri(&dest),
        10 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream
        .write_all(&Pattern::bytes(1, 1024 * 1024))
        .await
        .expect("part of the body");
    let dir = h.path("partial");
    eventually("the temporary file appears", || {
        names_in(&dir).iter().any(|n| n.contains(".upload-"))
    })
    .await;
    drop(stream);
    eventually("the temporary file is removed", || no_temp_files(&dir)).await;
    assert!(!Path::new(&dest).exists());
}

#[tokio::test]
async fn uploads_and_downloads_run_as_the_named_user_needs_root() {
    if !is_root() {
        eprintln!("skipped: acting as another user needs root");
        return;
    }
    let h = Harness::start().await;
    std::fs::set_permissions(h.path(""), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let dest = h.p("nb/sub/owned.txt");
    let resp = h
        .request(
            "POST",
            &format!("{}&username=nobody", files_uri(&dest)),
            &[("content-type", "application/octet-stream")],
            full("mine"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::metadata(&dest).expect("stat").uid(), 65534);
    assert_eq!(
        std::fs::metadata(h.path("nb")).expect("stat").uid(),
        65534,
        "created parents belong to the user"
    );

    std::fs::write(h.path("secret"), "s").expect("write");
    std::fs::set_permissions(h.path("secret"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    let secret = h.p("secret");
    let resp = h
        .request(
            "GET",
            &format!("{}&username=nobody", files_uri(&secret)),
            &[],
            empty(),
        )
        .await;
    assert_http_error(resp, 403, &secret).await;
    let resp = h
        .request(
            "POST",
            &format!("{}&username=nobody", files_uri(&secret)),
            &[("content-type", "application/octet-stream")],
            full("overwrite"),
        )
        .await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "nobody may replace a file in a directory it can write"
    );

    std::fs::create_dir(h.path("locked")).expect("mkdir");
    std::fs::set_permissions(h.path("locked"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let locked = h.p("locked/x");
    let resp = h
        .request(
            "POST",
            &format!("{}&username=nobody", files_uri(&locked)),
            &[("content-type", "application/octet-stream")],
            full("x"),
        )
        .await;
    assert_http_error(resp, 403, &h.p("locked")).await;
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test]
async fn a_full_disk_answers_507_needs_root() {
    let h = Harness::start().await;
    let small = h.path("small");
    std::fs::create_dir(&small).expect("mkdir");
    let mounted = is_root()
        && std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&small)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if !mounted {
        eprintln!("skipped: mounting a small tmpfs needs root (CAP_SYS_ADMIN)");
        return;
    }
    let _mount = Mount(small.clone());
    let dest = h.p("small/too-big.bin");
    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[("content-type", "application/octet-stream")],
            stream_body(pattern_chunks(5, 4 * 1024 * 1024, 64 * 1024)),
        )
        .await;
    assert_http_error(resp, 507, "not enough disk space").await;
    assert!(names_in(&small).is_empty(), "{:?}", names_in(&small));
}

#[tokio::test]
async fn transfer_json_matches_what_the_sdk_parses() {
    // The SDK's WriteInfo.from_dict reads name, type ("file") and path from each entry of a
    // non-empty list.
    let h = Harness::start().await;
    let dest = h.p("w.txt");
    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[("content-type", "application/octet-stream")],
            full(""),
        )
        .await;
    let written: Value = body_json(resp).await;
    let list = written.as_array().expect("a list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["type"], "file");
    assert_eq!(list[0]["name"], "w.txt");
    assert_eq!(list[0]["path"], dest);
    assert_eq!(std::fs::metadata(&dest).expect("stat").len(), 0);
}

#[tokio::test]
async fn upload_metadata_becomes_extended_attributes() {
    let h = Harness::start().await;
    let dest = h.p("meta.txt");
    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[
                ("content-type", "application/octet-stream"),
                ("x-metadata-Owner", "Alice"),
                ("x-metadata-purpose", "test run"),
            ],
            full("m"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let written = body_json(resp).await;
    let want = json!({ "owner": "Alice", "purpose": "test run" });
    assert_eq!(written[0]["metadata"], want, "{written}");
    let got = h
        .unary("filesystem.Filesystem/Stat", json!({ "path": dest }))
        .await;
    assert_eq!(got.1["entry"]["metadata"], want, "{}", got.1);
    let got = h
        .unary("filesystem.Filesystem/ListDir", json!({ "path": h.p("") }))
        .await;
    assert_eq!(got.1["entries"][0]["metadata"], want, "{}", got.1);

    // Overwriting without metadata leaves none behind.
    let resp = h
        .request(
            "POST",
            &files_uri(&dest),
            &[("content-type", "application/octet-stream")],
            full("n"),
        )
        .await;
    let written = body_json(resp).await;
    assert!(written[0].get("metadata").is_none(), "{written}");
    let got = h
        .unary("filesystem.Filesystem/Stat", json!({ "path": dest }))
        .await;
    assert!(got.1["entry"].get("metadata").is_none(), "{}", got.1);

    // Invalid metadata is refused before anything is written.
    let other = h.p("other.txt");
    let long_key = format!("x-metadata-{}", "k".repeat(300));
    let resp = h
        .request(
            "POST",
            &files_uri(&other),
            &[
                ("content-type", "application/octet-stream"),
                (&long_key, "v"),
            ],
            full("x"),
        )
        .await;
    assert_http_error(resp, 400, "metadata key").await;
    assert!(!Path::new(&other).exists());
}
