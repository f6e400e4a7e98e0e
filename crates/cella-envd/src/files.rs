//! `GET /files` and `POST /files`: file download and upload over plain HTTP.
//!
//! Both stream: a download is read from disk in chunks on a blocking thread (gzip-compressed on
//! the fly when the client accepts it), an upload is written to a temporary file next to its
//! destination and renamed into place only when complete, so a failed or interrupted upload
//! leaves nothing behind. Files are opened in the requesting user's identity (`?username=`,
//! else the default user); new files and directories belong to that user. Errors are an HTTP
//! status with `{"code": <status>, "message": "..."}`: 400 bad input, 401 unknown user,
//! 403 permission denied, 404 missing, 406 unacceptable encoding, 507 no space, 500 otherwise.
//!
//! `?path=` names the destination of an octet-stream upload and of the first `file` part of a
//! multipart one (the SDK sends it, and the part's filename, for single-file uploads); further
//! parts are named by their filenames, and a second part while `?path=` is set is refused, as
//! is the same destination twice (both 400, like envd).
//!
//! `X-Metadata-<key>` headers become `user.e2b.<key>` extended attributes of every uploaded
//! file (envd ≥ 0.6.2) and come back as `metadata` in the answer (skipped, with a warning in
//! the log, on filesystems without xattrs).
//!
//! Not implemented: signed URLs (`signature=`) are not checked here, downloads ignore `Range`, and gzip request
//! bodies are accepted for octet-stream uploads only (the SDK never gzips multipart). Uploads
//! are not fsynced before the rename.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use cella_proto::{Code, RpcError};
use flate2::Compression;
use flate2::write::{GzEncoder, MultiGzDecoder};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::Envd;
use crate::filesystem::metadata;
use crate::filesystem::path::{self, io_error};
use crate::filesystem::{ensure_dirs, run_as};
use crate::users::User;

/// Size of the chunks a download is read in.
const DOWNLOAD_CHUNK: usize = 64 * 1024;
/// Buffer between the network and the disk on upload.
const UPLOAD_BUFFER: usize = 1024 * 1024;
/// How much of a failed upload's remaining body is read (and dropped) so the client gets to
/// see the error response instead of a broken pipe.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;

pub fn routes() -> Router<Envd> {
    Router::new().route(
        "/files",
        get(download)
            .post(upload)
            .layer(DefaultBodyLimit::disable()),
    )
}

#[derive(Debug, Default, Deserialize)]
struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// One written file, as the SDK's `WriteInfo.from_dict` reads it.
#[derive(Debug, Serialize)]
struct WriteInfo {
    path: String,
    name: String,
    #[serde(rename = "type")]
    file_type: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

/// A file-transfer error: HTTP status plus `{"code": <status>, "message": ...}`.
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    message: String,
}

impl HttpError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<RpcError> for HttpError {
    fn from(e: RpcError) -> Self {
        let status = match e.code {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.message)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_string(),
        )
            .into_response()
    }
}

fn parse_query(query: Result<Query<FileQuery>, QueryRejection>) -> Result<FileQuery, HttpError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| HttpError::bad_request(format!("invalid query: {}", e.body_text())))
}

/// The user named by `?username=` (the default user when absent); 401 when there is none.
fn query_user(envd: &Envd, q: &FileQuery) -> Result<User, HttpError> {
    let name = q.username.as_deref().filter(|n| !n.is_empty());
    envd.users
        .resolve(name)
        .map_err(|e| HttpError::new(StatusCode::UNAUTHORIZED, e.message))
}

// ---------------------------------------------------------------------------------------------
// Download

async fn download(
    State(envd): State<Envd>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    match serve_download(&envd, query, &headers).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn serve_download(
    envd: &Envd,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, HttpError> {
    let q = parse_query(query)?;
    let user = query_user(envd, &q)?;
    let path = path::resolve(q.path.as_deref().unwrap_or(""), &user.home)?;
    let gzip = accepts_gzip(headers)?;
    let shown = path.clone();
    let (file, len) = run_as(envd, user, move |_| {
        // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io_error("download", &path, &e))?;
        let meta = file
            .metadata()
            .map_err(|e| io_error("download", &path, &e))?;
        if meta.is_dir() {
            return Err(RpcError::invalid_argument(format!(
                "download {}: is a directory",
                path.display()
            )));
        }
        if !meta.is_file() {
            return Err(RpcError::invalid_argument(format!(
                "download {}: not a regular file (a device, FIFO or socket)",
                path.display()
            )));
        }
        Ok((file, meta.len()))
    })
    .await?;

    let mut response = Response::new(file_body(file, len, gzip));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Some(value) = content_disposition(&shown) {
        h.insert(header::CONTENT_DISPOSITION, value);
    }
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    } else {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    Ok(response)
}

/// Whether to gzip the download: only when the client lists gzip with a non-zero quality.
/// 406 when the client refuses identity too.
fn accepts_gzip(headers: &HeaderMap) -> Result<bool, HttpError> {
    let Some(value) = headers.get(header::ACCEPT_ENCODING) else {
        return Ok(false);
    };
    let value = value
        .to_str()
        .map_err(|_| HttpError::bad_request("accept-encoding header is not ASCII"))?;
    let (mut gzip, mut identity, mut any) = (None, None, None);
    for item in value.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut q = 1.0_f32;
        for param in parts {
            if let Some(v) = param.trim().strip_prefix("q=") {
                q = v.trim().parse().unwrap_or(0.0);
            }
        }
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q),
            "identity" => identity = Some(q),
            "*" => any = Some(q),
            _ => {}
        }
    }
    if gzip.is_some_and(|q| q > 0.0) {
        return Ok(true);
    }
    if identity.or(any).is_some_and(|q| q <= 0.0) {
        return Err(HttpError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "no acceptable encoding in accept-encoding {value:?}: files are sent as gzip or identity"
            ),
        ));
    }
    Ok(false)
}

/// `attachment; filename="…"`, with `filename*` for names that are not plain ASCII.
fn content_disposition(path: &Path) -> Option<HeaderValue> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let mut value = format!("attachment; filename=\"{ascii}\"");
    if !name.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
        let encoded: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        value.push_str(&format!("; filename*=UTF-8''{encoded}"));
    }
    HeaderValue::from_str(&value).ok()
}

/// Streams `len` bytes of `file` (gzip-compressed when asked) from a blocking thread; the
/// thread stops as soon as the client goes away.
fn file_body(file: File, len: u64, gzip: bool) -> Body {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let mut reader = file.take(len);
        let result = if gzip {
            let mut encoder = GzEncoder::new(ChannelWriter::new(tx.clone()), Compression::fast());
            io::copy(&mut reader, &mut encoder)
                .and_then(|_| encoder.finish())
                .and_then(|mut w| w.flush())
        } else {
            send_chunks(&mut reader, &tx)
        };
        if let Err(e) = result
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let _ = tx.blocking_send(Err(e));
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn send_chunks(reader: &mut impl Read, tx: &mpsc::Sender<io::Result<Bytes>>) -> io::Result<()> {
    loop {
        let mut chunk = vec![0u8; DOWNLOAD_CHUNK];
        let n = match reader.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        chunk.truncate(n);
        if tx.blocking_send(Ok(Bytes::from(chunk))).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "client went away",
            ));
        }
    }
}

/// A `Write` that sends what it is given as body chunks.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self {
            tx,
            buf: Vec::with_capacity(DOWNLOAD_CHUNK),
        }
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= DOWNLOAD_CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(DOWNLOAD_CHUNK),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "client went away"))
    }
}

// ---------------------------------------------------------------------------------------------
// Upload

async fn upload(
    State(envd): State<Envd>,
    query: Result<Query<FileQuery>, QueryRejection>,
    req: Request,
) -> Response {
    match receive_upload(&envd, query, req).await {
        Ok(written) => (StatusCode::OK, axum::Json(written)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn receive_upload(
    envd: &Envd,
    query: Result<Query<FileQuery>, QueryRejection>,
    req: Request,
) -> Result<Vec<WriteInfo>, HttpError> {
    let q = parse_query(query)?;
    let user = query_user(envd, &q)?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let gzip = match req
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" || e == "x-gzip" => true,
        Some(e) => {
            return Err(HttpError::bad_request(format!(
                "unsupported content-encoding {e:?}: send the body uncompressed or as gzip"
            )));
        }
    };
    let query_path = q.path.clone().filter(|p| !p.is_empty());
    let metadata = header_metadata(req.headers())?;

    if content_type.starts_with("multipart/form-data") {
        if gzip {
            return Err(HttpError::bad_request(
                "gzip-encoded multipart uploads are not supported: send gzip data as application/octet-stream with ?path=",
            ));
        }
        return receive_multipart(envd, &user, query_path, &metadata, req).await;
    }
    if !(content_type.is_empty() || content_type.starts_with("application/octet-stream")) {
        return Err(HttpError::bad_request(format!(
            "unsupported content-type {content_type:?}: upload multipart/form-data (parts named \"file\") or application/octet-stream with ?path="
        )));
    }
    let Some(raw) = query_path else {
        return Err(HttpError::bad_request(
            "application/octet-stream uploads need ?path= to name the destination",
        ));
    };
    let dest = path::resolve(&raw, &user.home)?;
    let body = req.into_body().into_data_stream();
    let stored = write_stream(envd, &user, &dest, body, gzip, &metadata).await?;
    Ok(vec![write_info(&dest, stored.then_some(&metadata))])
}

async fn receive_multipart(
    envd: &Envd,
    user: &User,
    query_path: Option<String>,
    metadata: &BTreeMap<String, String>,
    req: Request,
) -> Result<Vec<WriteInfo>, HttpError> {
    let mut multipart = Multipart::from_request(req, &()).await.map_err(|e| {
        HttpError::bad_request(format!("reading multipart upload: {}", e.body_text()))
    })?;
    let mut written: Vec<WriteInfo> = Vec::new();
    let mut query_path = query_path;
    let mut used_query_path = false;
    while let Some(field) = multipart.next_field().await.map_err(|e| {
        HttpError::bad_request(format!("reading multipart upload: {}", e.body_text()))
    })? {
        if field.name() != Some("file") {
            continue;
        }
        let raw = match query_path.take() {
            Some(p) => {
                used_query_path = true;
                p
            }
            None if used_query_path => {
                return Err(HttpError::bad_request(
                    "the upload holds several files but ?path= names a single destination: leave out path and name each destination in its part's filename",
                ));
            }
            None => match field.file_name().filter(|n| !n.is_empty()) {
                Some(n) => n.to_string(),
                None => {
                    return Err(HttpError::bad_request(
                        "multipart part \"file\" has no filename: the filename names the destination path",
                    ));
                }
            },
        };
        let dest = path::resolve(&raw, &user.home)?;
        let shown = dest.to_string_lossy();
        if written.iter().any(|w| w.path == shown) {
            return Err(HttpError::bad_request(format!(
                "upload names {shown} twice: each file needs its own destination (the first one was written)"
            )));
        }
        let stored =
            write_stream(envd, user, &dest, std::pin::pin!(field), false, metadata).await?;
        written.push(write_info(&dest, stored.then_some(metadata)));
    }
    if written.is_empty() {
        return Err(HttpError::bad_request(
            "the multipart upload holds no part named \"file\"",
        ));
    }
    Ok(written)
}

fn write_info(path: &Path, metadata: Option<&BTreeMap<String, String>>) -> WriteInfo {
    WriteInfo {
        path: path.to_string_lossy().into_owned(),
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        file_type: "file",
        metadata: metadata.cloned().unwrap_or_default(),
    }
}

/// Metadata from `X-Metadata-<key>` headers (keys lower-cased, as envd does).
fn header_metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, HttpError> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        let value = std::str::from_utf8(value.as_bytes()).map_err(|_| {
            HttpError::bad_request(format!(
                "metadata value of key {key:?} is not printable ASCII"
            ))
        })?;
        metadata.insert(key.to_ascii_lowercase(), value.to_string());
    }
    metadata::validate(&metadata).map_err(HttpError::bad_request)?;
    Ok(metadata)
}

/// A temporary upload file, removed unless it was renamed into place.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where an upload goes: the open temporary file and the final path.
struct Prepared {
    file: File,
    temp: PathBuf,
    target: PathBuf,
    /// Permission bits of the file being replaced, kept on the new one.
    mode: Option<u32>,
}

/// Creates the destination's parents and a temporary file beside it (run as the user).
fn prepare(dest: &Path) -> Result<Prepared, RpcError> {
    // Writing through a symlink replaces the file it points at, as envd's open(O_TRUNC) does.
    let target = match std::fs::symlink_metadata(dest) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(dest).unwrap_or_else(|_| dest.to_path_buf())
        }
        _ => dest.to_path_buf(),
    };
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(RpcError::invalid_argument(format!(
            "upload {}: the path names no file",
            dest.display()
        )));
    };
    ensure_dirs(parent)
        .map_err(|e| RpcError::new(e.code, format!("upload {}: {}", dest.display(), e.message)))?;
    let mode = match std::fs::metadata(&target) {
        Ok(m) if m.is_dir() => {
            return Err(RpcError::invalid_argument(format!(
                "upload {}: is a directory",
                dest.display()
            )));
        }
        Ok(m) => Some(m.mode() & 0o7777),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("upload", dest, &e)),
    };
    let short: String = name.to_string_lossy().chars().take(100).collect();
    loop {
        let temp = parent.join(format!(
            ".{short}.upload-{}",
            cella_proto::ids::random_hex(6)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC)
            .open(&temp)
        {
            Ok(file) => {
                return Ok(Prepared {
                    file,
                    temp,
                    target,
                    mode,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                let mut err = io_error("upload", dest, &e);
                err.message = format!(
                    "upload {}: creating a temporary file in {}: {}",
                    dest.display(),
                    parent.display(),
                    path::reason(&e)
                );
                return Err(err);
            }
        }
    }
}

/// Streams `body` into `dest` (through a temporary file renamed into place at the end),
/// gunzipping it first when `gzip`.
async fn write_stream<S, E>(
    envd: &Envd,
    user: &User,
    dest: &Path,
    mut body: S,
    gzip: bool,
    metadata: &BTreeMap<String, String>,
) -> Result<bool, HttpError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Display,
{
    let owned = dest.to_path_buf();
    let Prepared {
        file,
        temp,
        target,
        mode,
    } = run_as(envd, user.clone(), move |_| prepare(&owned)).await?;
    let mut guard = TempFile(Some(temp.clone()));

    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let writer = tokio::task::spawn_blocking(move || write_file(file, rx, gzip, mode));
    let mut interrupted = None;
    let mut writer_gone = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) => {
                if tx.send(chunk).await.is_err() {
                    writer_gone = true; // the writer failed; its error explains why
                    break;
                }
            }
            Err(e) => {
                interrupted = Some(e.to_string());
                break;
            }
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| {
        HttpError::internal(format!(
            "upload {}: writer task failed: {e}",
            dest.display()
        ))
    })?;
    if let Some(e) = interrupted {
        return Err(HttpError::bad_request(format!(
            "upload {}: reading the request body failed, nothing was written: {e}",
            dest.display()
        )));
    }
    let file = match written {
        Ok(file) => file,
        Err(e) => {
            if writer_gone {
                drain(&mut body).await;
            }
            return Err(write_error(dest, &e, gzip));
        }
    };
    let (from, to) = (temp, target);
    let metadata = metadata.clone();
    let stored = run_as(envd, user.clone(), move |_| {
        let mut stored = !metadata.is_empty();
        if stored {
            match metadata::write(&file, &metadata) {
                Ok(true) => {}
                Ok(false) => {
                    stored = false;
                    tracing::warn!(
                    path = %to.display(),
                    "the filesystem has no extended attributes: upload metadata not stored"
                    );
                }
                Err(e) => {
                    let mut err = io_error("upload", &to, &e);
                    err.message = format!(
                        "upload {}: storing metadata: {}",
                        to.display(),
                        path::reason(&e)
                    );
                    if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::E2BIG)) {
                        err.code = Code::InvalidArgument;
                        err.message
                            .push_str(" (too much metadata for this filesystem)");
                    }
                    return Err(err);
                }
            }
        }
        drop(file);
        std::fs::rename(&from, &to).map_err(|e| {
            let mut err = io_error("upload", &to, &e);
            err.message = format!(
                "upload {}: moving the finished file into place: {}",
                to.display(),
                path::reason(&e)
            );
            err
        })?;
        Ok(stored)
    })
    .await?;
    guard.keep();
    Ok(stored)
}

/// Reads (and drops) what is left of a failed upload's body, up to [`DRAIN_LIMIT`].
async fn drain<S, E>(body: &mut S)
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut dropped = 0usize;
    while dropped < DRAIN_LIMIT {
        match body.next().await {
            Some(Ok(chunk)) => dropped += chunk.len(),
            _ => return,
        }
    }
}

fn write_error(dest: &Path, e: &io::Error, gzip: bool) -> HttpError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => HttpError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!(
                "upload {}: not enough disk space: {}",
                dest.display(),
                path::reason(e)
            ),
        ),
        Some(_) => HttpError::from(io_error("upload", dest, e)),
        None if gzip => HttpError::bad_request(format!(
            "upload {}: the body is not valid gzip: {}",
            dest.display(),
            path::reason(e)
        )),
        None => HttpError::internal(format!("upload {}: {}", dest.display(), path::reason(e))),
    }
}

enum Sink {
    Plain(BufWriter<File>),
    Gzip(Box<MultiGzDecoder<BufWriter<File>>>),
}

/// Writes the chunks arriving on `rx` to `file` (runs on a blocking thread).
fn write_file(
    file: File,
    mut rx: mpsc::Receiver<Bytes>,
    gzip: bool,
    mode: Option<u32>,
) -> io::Result<File> {
    let out = BufWriter::with_capacity(UPLOAD_BUFFER, file);
    let mut sink = if gzip {
        Sink::Gzip(Box::new(MultiGzDecoder::new(out)))
    } else {
        Sink::Plain(out)
    };
    while let Some(chunk) = rx.blocking_recv() {
        match &mut sink {
            Sink::Plain(w) => w.write_all(&chunk)?,
            Sink::Gzip(w) => w.write_all(&chunk)?,
        }
    }
    let out = match sink {
        Sink::Plain(w) => w,
        Sink::Gzip(w) => w.finish()?,
    };
    let file = out.into_inner().map_err(|e| e.into_error())?;
    if let Some(mode) = mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Result<bool, HttpError> {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).expect("header"),
        );
        accepts_gzip(&h)
    }

    #[test]
    fn negotiates_encoding() {
        assert!(accept("gzip").expect("ok"));
        assert!(accept("deflate, gzip;q=0.5").expect("ok"));
        assert!(!accept("gzip;q=0").expect("ok"));
        assert!(!accept("br").expect("ok"));
        assert!(!accept("*").expect("ok"));
        assert_eq!(
            accept("identity;q=0").expect_err("406").status,
            StatusCode::NOT_ACCEPTABLE
        );
        assert!(!accepts_gzip(&HeaderMap::new()).expect("ok"));
    }

    #[test]
    fn disposition_names_the_file() {
        let v = content_disposition(Path::new("/a/b c.txt")).expect("value");
        assert_eq!(
            v.to_str().expect("ascii"),
            "attachment; filename=\"b c.txt\""
        );
        let v = content_disposition(Path::new("/a/\"é\".txt")).expect("value");
        assert_eq!(
            v.to_str().expect("ascii"),
            "attachment; filename=\"\\\"_\\\".txt\"; filename*=UTF-8''%22%C3%A9%22.txt"
        );
    }
}
