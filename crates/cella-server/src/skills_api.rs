//! The Agent Skills registry over HTTP (`/v1/skills`), per tenant: upload a zip (a new name is
//! version 1, an existing name gets the next version), list, inspect, list versions, download,
//! delete. Uploads are unpacked with cella-skills' safe extractor (zip-slip, absolute paths and
//! escaping symlinks refused) and validated strictly against the agentskills.io specification
//! before anything is stored; the archive itself lives in the store.
//!
//! Also resolves a sandbox create's skills (`skills: ["pdf", "pdf@3"]`, or the E2B metadata key
//! `cella.skills`) into read-only mounts: each version is extracted once, under the data
//! directory, into a directory named by the archive's sha256 (a cache rebuilt from the store
//! whenever it is missing).
//!
//! Knows nothing about how a sandbox mounts the directories it returns (cella-sandbox does), nor
//! about SQL (cella-store does). Another tenant's skill is a 404, exactly like a missing one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use axum::body::Body;
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, Multipart, Path as UrlPath, Query, State,
};
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cella_skills::package::{self, PackageError};
use cella_skills::validate::{self, Finding, Mode};
use cella_store::{NewSkillVersion, SkillFile, SkillVersionRecord};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::control::rfc3339;
use crate::error::ApiError;
use crate::lifecycle::audit;
use crate::state::AppState;

/// Largest archive an upload may carry (413 past it).
pub const MAX_ARCHIVE_BYTES: usize = 32 << 20;
/// Most bytes an uploaded archive may expand to (413 past it).
pub const MAX_UNPACKED_BYTES: u64 = 128 << 20;
/// Most skills one sandbox may mount.
pub const MAX_SKILLS_PER_SANDBOX: usize = 64;
/// The E2B metadata key that carries a create's skills (comma-separated), for SDKs that cannot
/// send cella's `skills` field.
pub const METADATA_KEY: &str = "cella.skills";
/// Multipart overhead allowed on top of [`MAX_ARCHIVE_BYTES`] (boundaries, part headers).
const MULTIPART_SLACK: usize = 64 << 10;

/// The registry's routes, merged into the control plane.
pub fn routes() -> Router<AppState> {
    Router::new()
        // The upload reads its body itself, with its own limit (413 past MAX_ARCHIVE_BYTES).
        .route(
            "/v1/skills",
            get(list).post(upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/skills/{name}", get(get_one).delete(delete))
        .route("/v1/skills/{name}/versions", get(versions))
        .route("/v1/skills/{name}/download", get(download))
}

fn skills_dir(state: &AppState) -> PathBuf {
    state.config.data_dir.join("skills")
}

/// A skill name as it may appear in a URL or a create request: the specification's character
/// set (ASCII `a-z`, `0-9`, `-`; 1-64 characters; no leading, trailing or doubled hyphen), which
/// is also a safe directory name. Anything else, e.g. `../etc`, is refused.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = package::is_safe_name(name)
        && !name.ends_with('-')
        && !name.contains("--")
        && cella_sandbox::spec::validate_skill_mount_name(name).is_ok();
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "invalid skill name {name:?}: use 1-64 lowercase letters, digits and single hyphens \
             (not at the start or end)"
        )))
    }
}

fn skill_not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("skill {name} not found"))
}

#[derive(Debug, Deserialize, Default)]
pub struct VersionQuery {
    version: Option<String>,
}

/// `?version=N`: a positive integer, or absent for the latest.
fn parse_version(raw: Option<&str>) -> Result<Option<u32>, ApiError> {
    match raw.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::bad_request(format!(
                "invalid version {v:?}: use a version number (1, 2, …) from GET /v1/skills/{{name}}/versions"
            ))),
        },
    }
}

/// The JSON of one version; `files` only where a single skill is shown.
fn version_json(v: &SkillVersionRecord, with_files: bool) -> Value {
    let mut out = json!({
        "name": v.name,
        "version": v.version,
        "description": v.description,
        "sha256": v.sha256,
        "size": v.size,
        "frontmatter": v.frontmatter,
        "created_at": rfc3339(v.created_at),
        "created_by": v.created_by,
    });
    if with_files {
        out["files"] = json!(v.files);
    }
    out
}

async fn find_version(
    state: &AppState,
    caller: &Caller,
    name: &str,
    version: Option<u32>,
) -> Result<SkillVersionRecord, ApiError> {
    check_name(name)?;
    match state
        .store
        .get_skill_version(&caller.tenant.id, name, version)
        .await?
    {
        Some(v) => Ok(v),
        None => match version {
            Some(n)
                if state
                    .store
                    .get_skill_version(&caller.tenant.id, name, None)
                    .await?
                    .is_some() =>
            {
                Err(ApiError::not_found(format!(
                    "skill {name} has no version {n}: list them with GET /v1/skills/{name}/versions"
                )))
            }
            _ => Err(skill_not_found(name)),
        },
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/skills`: the caller's skills by name, each as its latest version, in pages.
async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = match q.limit.as_deref().map(str::trim).filter(|l| !l.is_empty()) {
        None => 100,
        Some(l) => match l.parse::<u32>() {
            Ok(n) if (1..=cella_store::MAX_SKILL_PAGE_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid limit {l:?}: use 1 to {}",
                    cella_store::MAX_SKILL_PAGE_LIMIT
                )));
            }
        },
    };
    let page = state
        .store
        .list_skills(
            &caller.tenant.id,
            limit,
            q.cursor.as_deref().filter(|c| !c.is_empty()),
        )
        .await
        .map_err(|e| match e {
            cella_store::StoreError::Invalid {
                what: "page cursor",
                ..
            } => ApiError::bad_request(
                "invalid cursor: pass the next_cursor of a previous page of GET /v1/skills",
            ),
            other => other.into(),
        })?;
    let skills: Vec<Value> = page.items.iter().map(|v| version_json(v, false)).collect();
    Ok(Json(
        json!({ "skills": skills, "next_cursor": page.next_cursor }),
    ))
}

/// `GET /v1/skills/{name}[?version=N]`: one version's metadata and files (latest by default).
async fn get_one(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<VersionQuery>,
) -> Result<Json<Value>, ApiError> {
    let version = parse_version(q.version.as_deref())?;
    let v = find_version(&state, &caller, &name, version).await?;
    Ok(Json(version_json(&v, true)))
}

/// `GET /v1/skills/{name}/versions`: every version, oldest first.
async fn versions(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    check_name(&name)?;
    let all = state
        .store
        .list_skill_versions(&caller.tenant.id, &name)
        .await?;
    if all.is_empty() {
        return Err(skill_not_found(&name));
    }
    let versions: Vec<Value> = all.iter().map(|v| version_json(v, false)).collect();
    Ok(Json(json!({ "name": name, "versions": versions })))
}

/// `GET /v1/skills/{name}/download[?version=N]`: the archive exactly as uploaded.
async fn download(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<VersionQuery>,
) -> Result<Response, ApiError> {
    let version = parse_version(q.version.as_deref())?;
    let v = find_version(&state, &caller, &name, version).await?;
    let bytes = state
        .store
        .read_skill_archive(&caller.tenant.id, &v.name, v.version)
        .await?
        .ok_or_else(|| skill_not_found(&name))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/zip"),
    );
    let disposition = format!("attachment; filename=\"{}-{}.zip\"", v.name, v.version);
    if let Ok(h) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, h);
    }
    if let Ok(h) = HeaderValue::from_str(&format!("\"{}\"", v.sha256)) {
        headers.insert(header::ETAG, h);
    }
    Ok((headers, bytes).into_response())
}

/// `DELETE /v1/skills/{name}`: the skill with every version.
async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(name): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let removed = state.store.delete_skill(&caller.tenant.id, &name).await?;
    if removed == 0 {
        return Err(skill_not_found(&name));
    }
    audit(
        &state,
        &caller,
        "skill.delete",
        &name,
        json!({ "versions": removed }),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("skill archive exceeds the limit of {MAX_ARCHIVE_BYTES} bytes"),
    )
}

/// The request body, refused with 413 once it passes `limit` bytes.
async fn read_limited(mut body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    use http_body::Body as _;
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("reading the upload failed: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// The zip carried by an upload: the whole body (`application/zip`, `application/octet-stream`)
/// or, for `multipart/form-data`, the part named `file` (else the first part with a file name).
async fn archive_of(state: &AppState, req: Request<Body>) -> Result<Vec<u8>, ApiError> {
    let (parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let multipart = essence == "multipart/form-data";
    if !multipart
        && !matches!(
            essence.as_str(),
            "application/zip" | "application/x-zip-compressed" | "application/octet-stream"
        )
    {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "unsupported content type {content_type:?}: send the skill's zip as \
                 application/zip, or as the part \"file\" of multipart/form-data"
            ),
        ));
    }
    let limit = if multipart {
        MAX_ARCHIVE_BYTES + MULTIPART_SLACK
    } else {
        MAX_ARCHIVE_BYTES
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes = read_limited(body, limit).await?;
    if !multipart {
        return Ok(bytes);
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    let mut form = Multipart::from_request(req, state).await.map_err(|e| {
        ApiError::bad_request(format!("invalid multipart upload: {}", e.body_text()))
    })?;
    let mut chosen = None;
    while let Some(field) = form.next_field().await.map_err(|e| {
        ApiError::bad_request(format!("invalid multipart upload: {}", e.body_text()))
    })? {
        let named_file = field.name() == Some("file");
        if !named_file && (chosen.is_some() || field.file_name().is_none()) {
            continue;
        }
        let data = field.bytes().await.map_err(|e| {
            ApiError::bad_request(format!("invalid multipart upload: {}", e.body_text()))
        })?;
        chosen = Some(data.to_vec());
        if named_file {
            break;
        }
    }
    let data = chosen.ok_or_else(|| {
        ApiError::bad_request(
            "multipart upload has no file: send the skill's zip as the part named \"file\"",
        )
    })?;
    if data.len() > MAX_ARCHIVE_BYTES {
        return Err(too_large());
    }
    Ok(data)
}

/// A strict-validation failure as a 400 naming each rule, field and offending value.
fn invalid_skill(findings: &[&Finding]) -> Response {
    let lines: Vec<String> = findings
        .iter()
        .map(|f| {
            let mut line = String::new();
            if let Some(field) = &f.field {
                line.push_str(&format!("{field}: "));
            }
            line.push_str(&f.message);
            line.push_str(&format!(" (rule {}", f.rule));
            if let Some(value) = &f.value {
                line.push_str(&format!(", value {value:?}"));
            }
            line.push(')');
            line
        })
        .collect();
    let errors: Vec<Value> = findings
        .iter()
        .map(
            |f| json!({ "rule": f.rule, "field": f.field, "value": f.value, "message": f.message }),
        )
        .collect();
    let body = json!({
        "code": 400,
        "message": format!("invalid skill: {}", lines.join("; ")),
        "errors": errors,
    });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn package_error(e: PackageError) -> ApiError {
    match e {
        PackageError::TooLarge { limit, .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("skill archive exceeds the limit of {limit}"),
        ),
        PackageError::Io { .. } => ApiError::internal(format!("unpacking a skill: {e}")),
        PackageError::Zip { source, .. } => ApiError::bad_request(format!(
            "invalid skill archive: not a readable zip: {source}"
        )),
        other => ApiError::bad_request(format!("invalid skill archive: {other}")),
    }
}

/// A directory removed (with everything in it) when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(parent: &Path, what: &str) -> Result<Scratch, ApiError> {
        let dir = parent.join(format!(".{what}-{}", cella_proto::ids::random_hex(8)));
        std::fs::create_dir_all(&dir).map_err(|e| {
            ApiError::internal(format!(
                "creating the scratch directory {}: {e}",
                dir.display()
            ))
        })?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        make_writable(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a valid upload holds.
struct Inspected {
    name: String,
    description: String,
    frontmatter: Value,
    files: Vec<SkillFile>,
}

/// Unpacks `bytes` in a scratch directory and validates the skill strictly. A skill in a
/// top-level folder keeps that folder's name, so the specification's rule that `name` matches
/// its directory applies; a skill at the archive's root has no directory to disagree with.
fn inspect(bytes: &[u8], scratch_parent: &Path) -> Result<Result<Inspected, Response>, ApiError> {
    let scratch = Scratch::new(scratch_parent, "upload")?;
    let unpacked_dir = scratch.0.join("unpacked");
    std::fs::create_dir(&unpacked_dir)
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", unpacked_dir.display())))?;
    let unpacked = package::unpack_bytes(
        bytes,
        Path::new("upload.zip"),
        &unpacked_dir,
        MAX_UNPACKED_BYTES,
    )
    .map_err(package_error)?;
    let dir_name = match unpacked.folder.clone() {
        Some(folder) => folder,
        None => cella_skills::skill::read_properties(&unpacked_dir)
            .ok()
            .map(|p| p.name)
            .filter(|n| package::is_safe_name(n))
            .unwrap_or_else(|| "skill".to_owned()),
    };
    let skill_dir = scratch.0.join(&dir_name);
    if skill_dir != unpacked_dir {
        std::fs::rename(&unpacked_dir, &skill_dir)
            .map_err(|e| ApiError::internal(format!("renaming {}: {e}", unpacked_dir.display())))?;
    }
    let report = validate::validate(&skill_dir, Mode::Strict);
    if !report.valid {
        let errors: Vec<&Finding> = report.errors().collect();
        return Ok(Err(invalid_skill(&errors)));
    }
    let props = cella_skills::skill::read_properties(&skill_dir)
        .map_err(|e| ApiError::bad_request(format!("invalid skill: {e}")))?;
    check_name(&props.name)?;
    let files = unpacked
        .files
        .into_iter()
        .map(|f| SkillFile {
            path: f.path,
            size: f.size,
            executable: f.executable,
            symlink: f.symlink,
        })
        .collect();
    Ok(Ok(Inspected {
        frontmatter: props.to_value().to_json(),
        name: props.name,
        description: props.description,
        files,
    }))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `POST /v1/skills`: validates and stores an uploaded skill as the next version of its name.
async fn upload(State(state): State<AppState>, req: Request<Body>) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    let bytes = archive_of(&state, Request::from_parts(parts, body)).await?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "empty upload: send the skill's zip (make one with `cella skills package DIR`)",
        ));
    }
    let parent = skills_dir(&state);
    let (bytes, inspected) = tokio::task::spawn_blocking(move || {
        let inspected = inspect(&bytes, &parent);
        (bytes, inspected)
    })
    .await
    .map_err(|e| ApiError::internal(format!("inspecting the upload: {e}")))?;
    let inspected = match inspected? {
        Ok(i) => i,
        Err(response) => return Ok(response),
    };
    let record = state
        .store
        .insert_skill_version(&NewSkillVersion {
            tenant_id: caller.tenant.id.clone(),
            name: inspected.name,
            sha256: sha256_hex(&bytes),
            description: inspected.description,
            frontmatter: inspected.frontmatter,
            files: inspected.files,
            archive: bytes,
            created_by: caller.actor.clone(),
        })
        .await?;
    audit(
        &state,
        &caller,
        "skill.upload",
        &record.name,
        json!({ "version": record.version, "sha256": record.sha256, "size": record.size }),
    )
    .await;
    tracing::info!(tenant = %caller.tenant.name, skill = %record.name, version = record.version,
        "skill uploaded");
    Ok((StatusCode::CREATED, Json(version_json(&record, true))).into_response())
}

/// One requested skill: `name` (latest) or `name@N`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SkillRef {
    name: String,
    version: Option<u32>,
}

fn parse_ref(raw: &str) -> Result<SkillRef, ApiError> {
    let raw = raw.trim();
    let (name, version) = match raw.split_once('@') {
        Some((name, v)) => {
            let n = v.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid skill reference {raw:?}: write name or name@VERSION (VERSION 1, 2, …)"
                ))
            })?;
            (name, Some(n))
        }
        None => (raw, None),
    };
    check_name(name)?;
    Ok(SkillRef {
        name: name.to_owned(),
        version,
    })
}

/// The skills a create asks for: cella's `skills` field, then the metadata key
/// [`METADATA_KEY`] (comma-separated). A name asked for twice must name one version.
fn requested(
    field: Option<&[String]>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<SkillRef>, ApiError> {
    let from_metadata = metadata
        .and_then(|m| m.get(METADATA_KEY))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let all = field
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .chain(from_metadata);
    let mut refs: Vec<SkillRef> = Vec::new();
    for raw in all {
        let r = parse_ref(raw)?;
        match refs.iter().find(|x| x.name == r.name) {
            Some(prev) if prev.version == r.version => {}
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "skill {} is requested twice with different versions",
                    r.name
                )));
            }
            None => refs.push(r),
        }
    }
    if refs.len() > MAX_SKILLS_PER_SANDBOX {
        return Err(ApiError::bad_request(format!(
            "{} skills requested: a sandbox may mount at most {MAX_SKILLS_PER_SANDBOX}",
            refs.len()
        )));
    }
    Ok(refs)
}

/// Resolves a create's skills against the caller's registry and returns the mounts for
/// `SandboxSpec::skills`: name → the version's extracted, read-only directory. 400 names an
/// unknown skill or version.
pub async fn mounts_for_create(
    state: &AppState,
    caller: &Caller,
    field: Option<&[String]>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, PathBuf>, ApiError> {
    let mut mounts = BTreeMap::new();
    for r in requested(field, metadata)? {
        let found = state
            .store
            .get_skill_version(&caller.tenant.id, &r.name, r.version)
            .await?;
        let Some(v) = found else {
            return Err(ApiError::bad_request(match r.version {
                Some(n) => format!(
                    "unknown skill {}@{n}: the tenant's skill {} has no version {n} \
                     (GET /v1/skills/{}/versions lists them)",
                    r.name, r.name, r.name
                ),
                None => format!(
                    "unknown skill {:?}: upload it first with POST /v1/skills",
                    r.name
                ),
            }));
        };
        let dir = extracted(state, &v).await?;
        mounts.insert(v.name, dir);
    }
    Ok(mounts)
}

/// The directory holding version `v` extracted, creating it from the stored archive when
/// missing. Content-addressed: `<data-dir>/skills/<sha256>`, read-only once in place.
async fn extracted(state: &AppState, v: &SkillVersionRecord) -> Result<PathBuf, ApiError> {
    let parent = skills_dir(state);
    let dir = parent.join(&v.sha256);
    if dir.join("SKILL.md").is_file() || dir.join("skill.md").is_file() {
        return Ok(dir);
    }
    let bytes = state
        .store
        .read_skill_archive(&v.tenant_id, &v.name, v.version)
        .await?
        .ok_or_else(|| skill_not_found(&v.name))?;
    if sha256_hex(&bytes) != v.sha256 {
        return Err(ApiError::internal(format!(
            "skill {} version {}: the stored archive does not match its sha256 {}",
            v.name, v.version, v.sha256
        )));
    }
    let target = dir.clone();
    tokio::task::spawn_blocking(move || extract_into_cache(&bytes, &parent, &target))
        .await
        .map_err(|e| ApiError::internal(format!("extracting a skill: {e}")))??;
    Ok(dir)
}

fn extract_into_cache(bytes: &[u8], parent: &Path, target: &Path) -> Result<(), ApiError> {
    let scratch = Scratch::new(parent, "extract")?;
    let staged = scratch.0.join("skill");
    std::fs::create_dir(&staged)
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", staged.display())))?;
    package::unpack_bytes(
        bytes,
        Path::new("stored archive"),
        &staged,
        MAX_UNPACKED_BYTES,
    )
    .map_err(|e| ApiError::internal(format!("extracting a stored skill: {e}")))?;
    make_read_only(&staged)
        .map_err(|e| ApiError::internal(format!("making {} read-only: {e}", staged.display())))?;
    match std::fs::rename(&staged, target) {
        Ok(()) => Ok(()),
        // Another create extracted the same archive first: its copy is identical.
        Err(_) if target.join("SKILL.md").is_file() || target.join("skill.md").is_file() => Ok(()),
        Err(e) => Err(ApiError::internal(format!(
            "moving a skill into {}: {e}",
            target.display()
        ))),
    }
}

/// Files 0444 (0555 when executable), directories 0555; symlinks untouched.
fn make_read_only(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = std::fs::symlink_metadata(entry.path())?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            make_read_only(&entry.path())?;
        } else {
            let exec = meta.permissions().mode() & 0o111 != 0;
            let mode = if exec { 0o555 } else { 0o444 };
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode))?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
}

/// Undoes [`make_read_only`] on directories so a scratch tree can be removed without root.
fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            make_writable(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_references_parse_and_refuse_traversal() {
        assert_eq!(
            parse_ref("pdf").ok(),
            Some(SkillRef {
                name: "pdf".into(),
                version: None
            })
        );
        assert_eq!(
            parse_ref(" pdf@3 ").ok(),
            Some(SkillRef {
                name: "pdf".into(),
                version: Some(3)
            })
        );
        for bad in [
            "../etc", "a/b", "..", "", "Pdf", "pdf@0", "pdf@x", "pdf@", "-a", "a--b",
        ] {
            let err = parse_ref(bad).expect_err(bad);
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert!(
            parse_ref("../etc")
                .expect_err("traversal")
                .message
                .contains("invalid skill name \"../etc\"")
        );
    }

    #[test]
    fn field_and_metadata_requests_merge() {
        let md: BTreeMap<String, String> =
            [(METADATA_KEY.to_owned(), "b@2, a ,".to_owned())].into();
        let got = requested(Some(&["a".to_owned()]), Some(&md)).expect("merge");
        assert_eq!(
            got,
            vec![
                SkillRef {
                    name: "a".into(),
                    version: None
                },
                SkillRef {
                    name: "b".into(),
                    version: Some(2)
                }
            ]
        );
        let err =
            requested(Some(&["a@1".to_owned(), "a@2".to_owned()]), None).expect_err("conflict");
        assert!(err.message.contains("requested twice"), "{}", err.message);
        assert!(requested(None, None).expect("none").is_empty());
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version(None).ok(), Some(None));
        assert_eq!(parse_version(Some("2")).ok(), Some(Some(2)));
        assert!(parse_version(Some("0")).is_err());
        assert!(parse_version(Some("-1")).is_err());
        assert!(parse_version(Some("latest")).is_err());
    }
}
