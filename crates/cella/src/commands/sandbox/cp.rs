//! `cella sandbox cp`: one file into a sandbox (`POST /files`, octet-stream) or out of it
//! (`GET /files`), through the server's gateway. Both directions stream in chunks; a download
//! lands in a temporary file beside the destination and is renamed into place only when
//! complete, so a failed copy leaves no partial file.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use cella_proto::filesystem::{FileType, StatRequest, StatResponse};
use cella_proto::query::percent_encode;
use cella_sandbox::EnvdClient;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::Request;
use hyper::body::Frame;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::api::Server;

/// Read size of uploads.
const CHUNK: usize = 256 * 1024;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "A sandbox path is written ID:PATH (relative paths are under the user's home); anything else is a host path (write ./a:b for a host file with a colon). `-` is stdin (as SOURCE) or stdout (as DEST). When DEST is a directory (or ends with /), the file keeps its name.\n\nExamples:\n  cella sandbox cp ./data.csv ID:/home/user/data.csv\n  cella sandbox cp ID:/home/user/out.json .\n  tar cz src | cella sandbox cp - ID:/tmp/src.tgz"
)]
pub struct CpArgs {
    /// What to copy: a host file, `-` (stdin), or ID:PATH in a sandbox.
    source: String,
    /// Where to: ID:PATH in a sandbox, or a host path, or `-` (stdout).
    dest: String,
    /// User whose permissions (and home, for relative paths) apply in the sandbox.
    #[arg(long, short = 'u')]
    user: Option<String>,
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Host(PathBuf),
    Std,
    Sandbox { id: String, path: String },
}

impl Location {
    fn parse(text: &str) -> Location {
        if text == "-" {
            return Location::Std;
        }
        if let Some((id, path)) = text.split_once(':')
            && cella_proto::ids::is_valid_sandbox_id(id)
            && !path.is_empty()
        {
            return Location::Sandbox {
                id: id.to_string(),
                path: path.to_string(),
            };
        }
        Location::Host(PathBuf::from(text))
    }
}

/// The last component of a path (`a/b/c` → `c`).
fn base_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

pub async fn run(server: &Server, args: CpArgs, json: bool) -> anyhow::Result<u8> {
    let source = Location::parse(&args.source);
    let dest = Location::parse(&args.dest);
    let user = args.user.as_deref();
    let (bytes, shown_dest) = match (source, dest) {
        (from @ (Location::Host(_) | Location::Std), Location::Sandbox { id, path }) => {
            let client = server.running_envd(&id).await?;
            let (target, n) = upload(&client, &from, &path, user).await?;
            (n, format!("{id}:{target}"))
        }
        (Location::Sandbox { id, path }, to @ (Location::Host(_) | Location::Std)) => {
            let client = server.running_envd(&id).await?;
            download(&client, &path, &to, user).await?
        }
        (Location::Sandbox { .. }, Location::Sandbox { .. }) => anyhow::bail!(
            "both {} and {} are in sandboxes: copy through the host (cp ID:PATH - | cp - ID2:PATH)",
            args.source,
            args.dest
        ),
        _ => anyhow::bail!(
            "neither {} nor {} is in a sandbox: write one of them as ID:PATH (see `cella sandbox ls`)",
            args.source,
            args.dest
        ),
    };
    if json {
        super::print_json(
            &json!({ "source": args.source, "destination": shown_dest, "bytes": bytes }),
        );
    } else if shown_dest != "-" {
        eprintln!("copied {bytes} bytes to {shown_dest}");
    }
    Ok(0)
}

fn files_uri(path: &str, user: Option<&str>) -> String {
    let mut uri = format!("/files?path={}", percent_encode(path));
    if let Some(u) = user {
        uri.push_str("&username=");
        uri.push_str(&percent_encode(u));
    }
    uri
}

/// The message of a refused `/files` call (envd answers `{"code", "message"}`).
fn refusal(status: hyper::StatusCode, body: &[u8], what: &str) -> anyhow::Error {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    anyhow::anyhow!("{what}: {message} (HTTP {status})")
}

/// Whether `path` is a directory in the sandbox (false when it does not exist).
async fn is_sandbox_dir(client: &EnvdClient, path: &str, user: Option<&str>) -> bool {
    let req = StatRequest {
        path: path.to_string(),
    };
    matches!(
        client
            .unary::<_, StatResponse>("/filesystem.Filesystem/Stat", &req, user)
            .await,
        Ok(StatResponse { entry: Some(e) }) if e.file_type == FileType::Directory
    )
}

/// Streams a host file (or stdin) to `path` in the sandbox; returns the final path and size.
async fn upload(
    client: &EnvdClient,
    from: &Location,
    path: &str,
    user: Option<&str>,
) -> anyhow::Result<(String, u64)> {
    let (reader, length, name): (
        Box<dyn AsyncRead + Unpin + Send>,
        Option<u64>,
        Option<String>,
    ) = match from {
        Location::Host(p) => {
            let file = tokio::fs::File::open(p)
                .await
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
            let meta = file.metadata().await?;
            if meta.is_dir() {
                anyhow::bail!(
                    "{} is a directory: cp copies one file (tar it and pipe it: tar c DIR | cella sandbox cp - ID:/tmp/dir.tar)",
                    p.display()
                );
            }
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let length = meta.is_file().then_some(meta.len());
            (Box::new(file), length, name)
        }
        _ => (Box::new(tokio::io::stdin()), None, None),
    };
    let target = if path.ends_with('/') || is_sandbox_dir(client, path, user).await {
        let Some(name) = name else {
            anyhow::bail!("{path} is a directory: give the file's name in the sandbox");
        };
        format!("{}/{name}", path.trim_end_matches('/'))
    } else {
        path.to_string()
    };
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    let chunks = futures::stream::unfold(reader, |mut r| async move {
        let mut buf = vec![0u8; CHUNK];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    })
    .map(move |frame| {
        if let Ok(f) = &frame
            && let Some(d) = f.data_ref()
        {
            counter.fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        frame
    });
    let mut req =
        Request::post(files_uri(&target, user)).header("content-type", "application/octet-stream");
    if let Some(len) = length {
        req = req.header("content-length", len);
    }
    let req = req.body(StreamBody::new(chunks))?;
    let what = format!("copying to {target} in the sandbox");
    let resp = client
        .send(req)
        .await
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        return Err(refusal(status, &body, &what));
    }
    Ok((target, sent.load(std::sync::atomic::Ordering::Relaxed)))
}

/// Streams `path` from the sandbox to a host file (atomically) or stdout; returns the size and
/// where it went.
async fn download(
    client: &EnvdClient,
    path: &str,
    to: &Location,
    user: Option<&str>,
) -> anyhow::Result<(u64, String)> {
    let what = format!("copying {path} out of the sandbox");
    let req = Request::get(files_uri(path, user)).body(Empty::<Bytes>::new())?;
    let resp = client
        .send(req)
        .await
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await?.to_bytes();
        return Err(refusal(status, &bytes, &what));
    }
    let Location::Host(dest) = to else {
        let mut out = tokio::io::stdout();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame
                .map_err(|e| anyhow::anyhow!("{what}: {e}"))?
                .into_data()
            {
                out.write_all(&data).await?;
                n += data.len() as u64;
            }
        }
        out.flush().await?;
        return Ok((n, "-".into()));
    };
    let dest = if dest.is_dir() {
        let Some(name) = base_name(path) else {
            anyhow::bail!("{path} names no file to copy");
        };
        dest.join(name)
    } else {
        dest.clone()
    };
    let part = partial_path(&dest);
    let result = async {
        let mut file = tokio::fs::File::create(&part)
            .await
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", part.display()))?;
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame
                .map_err(|e| anyhow::anyhow!("{what}: {e}"))?
                .into_data()
            {
                file.write_all(&data)
                    .await
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", part.display()))?;
                n += data.len() as u64;
            }
        }
        file.sync_all().await?;
        tokio::fs::rename(&part, &dest)
            .await
            .map_err(|e| anyhow::anyhow!("moving the copy into {}: {e}", dest.display()))?;
        anyhow::Ok(n)
    }
    .await;
    match result {
        Ok(n) => Ok((n, dest.display().to_string())),
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            Err(e)
        }
    }
}

/// A hidden temporary name beside `dest`.
fn partial_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "download".into());
    dest.with_file_name(format!(".{name}.cella-part-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(
            Location::parse("abc123:/home/user/f"),
            Location::Sandbox {
                id: "abc123".into(),
                path: "/home/user/f".into()
            }
        );
        assert_eq!(
            Location::parse("abc:rel/f"),
            Location::Sandbox {
                id: "abc".into(),
                path: "rel/f".into()
            }
        );
        assert_eq!(Location::parse("./a:b"), Location::Host("./a:b".into()));
        assert_eq!(Location::parse("/x/y"), Location::Host("/x/y".into()));
        assert_eq!(Location::parse("Abc:/f"), Location::Host("Abc:/f".into()));
        assert_eq!(Location::parse("-"), Location::Std);
        assert_eq!(base_name("/a/b/c"), Some("c"));
        assert_eq!(base_name("/a/b/"), Some("b"));
        assert_eq!(base_name("/"), None);
    }
}
