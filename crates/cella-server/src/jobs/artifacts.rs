//! `GET /v1/jobs/{id}/artifacts.zip`: the job's workspace (kept on the host, so it outlives
//! the sandbox) as a zip archive, streamed as it is written. Symbolic links are stored as links,
//! never followed (the agent could point one anywhere on the host); other special files are
//! left out. A workspace over the size cap is refused with 413 before anything is sent.

use std::io::Write;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// What the archive will hold, found before writing it.
struct Entry {
    /// Path inside the archive (`/`-separated, relative).
    name: String,
    path: PathBuf,
    kind: Kind,
}

enum Kind {
    Dir,
    File,
    Symlink(String),
}

/// Every entry under `root` and the total bytes of regular files.
fn collect(root: &Path) -> std::io::Result<(Vec<Entry>, u64)> {
    let mut entries = Vec::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut children: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        children.sort_by_key(|e| e.file_name());
        for child in children {
            let path = child.path();
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let name = rel.to_string_lossy().replace('\\', "/");
            let meta = std::fs::symlink_metadata(&path)?;
            let kind = if meta.file_type().is_symlink() {
                Kind::Symlink(std::fs::read_link(&path)?.to_string_lossy().into_owned())
            } else if meta.is_dir() {
                stack.push(path.clone());
                Kind::Dir
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
                Kind::File
            } else {
                continue;
            };
            entries.push(Entry { name, path, kind });
        }
    }
    Ok((entries, total))
}

/// Sends what the zip writer writes to the response body, chunk by chunk.
struct ChannelWriter(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A buffer in front of the channel, so the body gets chunks of about 64 KiB.
fn write_zip(entries: Vec<Entry>, out: ChannelWriter) -> zip::result::ZipResult<()> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new_stream(std::io::BufWriter::with_capacity(64 << 10, out));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    for entry in entries {
        match entry.kind {
            Kind::Dir => zip.add_directory(format!("{}/", entry.name), options)?,
            Kind::Symlink(target) => zip.add_symlink(entry.name, target, options)?,
            Kind::File => {
                zip.start_file(entry.name, options)?;
                let mut file = std::fs::File::open(&entry.path)?;
                std::io::copy(&mut file, &mut zip)?;
            }
        }
    }
    zip.finish()?.flush()?;
    Ok(())
}

/// `GET /v1/jobs/{id}/artifacts.zip`.
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, ApiError> {
    let job = super::api::job_of(&state, &caller, &id).await?;
    let root = super::runner::workspace_dir(&state, &job.id);
    if !root.is_dir() {
        return Err(ApiError::not_found(format!(
            "job {id} has no workspace yet: it is {} (artifacts exist once it has started)",
            job.status
        )));
    }
    let scan = root.clone();
    let (entries, total) = tokio::task::spawn_blocking(move || collect(&scan))
        .await
        .map_err(|e| ApiError::internal(format!("reading the workspace of job {id}: {e}")))?
        .map_err(|e| ApiError::internal(format!("reading the workspace of job {id}: {e}")))?;
    let cap = state.config.jobs.artifacts_max_bytes;
    if total > cap {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the workspace of job {id} holds {total} bytes, over the artifacts limit of {cap} bytes: \
                 have the job write less, or raise the limit (cella serve --jobs-artifacts-max)"
            ),
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let error_tx = tx.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = write_zip(entries, ChannelWriter(tx)) {
            tracing::warn!(job = %job.id, "streaming artifacts: {e}");
            // Cut the body: the client sees a broken download, never a valid partial zip.
            let _ = error_tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = Body::from_stream(tokio_stream_from(rx));
    Ok((
        [
            ("content-type", "application/zip".to_owned()),
            (
                "content-disposition",
                format!("attachment; filename=\"{id}-artifacts.zip\""),
            ),
        ],
        body,
    )
        .into_response())
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
