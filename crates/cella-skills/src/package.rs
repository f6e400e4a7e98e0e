//! Packaging a skill directory into a zip (`.zip` or `.skill`, the same format) and installing a
//! skill from such an archive or from a directory.
//!
//! Archives hold one top-level folder named after the skill (`<name>/SKILL.md`, …), like the
//! `.skill` files Anthropic's tooling writes; entries are sorted and time-stamped 1980-01-01 so
//! the same tree always packs to the same bytes.
//!
//! Installing refuses, rather than sanitises: entry names that are absolute, contain `..`,
//! backslashes or NUL, or leave the skill folder (zip-slip); symlinks whose target leaves the
//! skill; archives over the size and entry limits (zip bombs). It extracts into a temporary
//! directory beside the destination, loads the result leniently, and only then renames it into
//! place as `<dest>/<name>`. [`unpack_bytes`] applies the same checks to an archive held in
//! memory (the server's skill registry) and leaves validation to its caller.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};

use zip::write::SimpleFileOptions;

use crate::skill;
use crate::validate;

/// Most entries an archive may have.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes an archive may expand to.
pub const MAX_UNPACKED_BYTES: u64 = 512 * 1024 * 1024;

/// Packaging or installing failed.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A file-system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "create", …).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The zip library failed.
    #[error("zip archive {}: {source}", path.display())]
    Zip {
        /// The archive.
        path: PathBuf,
        /// The error.
        source: zip::result::ZipError,
    },
    /// The source does not load as a skill.
    #[error("{} is not a loadable skill: {reason}", path.display())]
    NotASkill {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An archive entry name is unsafe.
    #[error("archive entry '{name}' is refused: {reason}")]
    UnsafeEntry {
        /// The entry name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// A symlink points outside the skill.
    #[error("symlink {} -> {} leaves the skill directory", link.display(), target.display())]
    SymlinkEscapes {
        /// The link.
        link: PathBuf,
        /// Its target.
        target: PathBuf,
    },
    /// The archive is too big.
    #[error("archive {} exceeds the limit of {limit}", path.display())]
    TooLarge {
        /// The archive.
        path: PathBuf,
        /// The limit broken.
        limit: String,
    },
    /// The archive has no SKILL.md at its root or in a single top-level folder.
    #[error("archive {} holds no skill (no SKILL.md at its root or in one top-level folder)", path.display())]
    NoSkillInArchive {
        /// The archive.
        path: PathBuf,
    },
    /// The skill's name cannot be a directory name.
    #[error("skill name '{name}' cannot be used as a directory name (only a-z, 0-9 and '-')")]
    BadName {
        /// The name.
        name: String,
    },
    /// The destination exists.
    #[error("{} already exists (use --force to replace it)", path.display())]
    Exists {
        /// The destination.
        path: PathBuf,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PackageError {
    let path = path.to_path_buf();
    move |source| PackageError::Io {
        action,
        path,
        source,
    }
}

/// A safe directory name for a skill: the specification's character set, 1-64 characters.
pub fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
}

/// One file to pack: path relative to the skill root (with `/`), source path, mode, or a link.
enum Item {
    File {
        rel: String,
        src: PathBuf,
        mode: u32,
    },
    Dir {
        rel: String,
    },
    Link {
        rel: String,
        target: String,
    },
}

fn is_within(root: &Path, path: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return path.starts_with(root),
        }
    }
    true
}

/// Collects the tree under `root` (sorted, skipping `.git` and `node_modules`), refusing
/// symlinks that leave it.
fn collect(root: &Path, skip: Option<&Path>) -> Result<Vec<Item>, PackageError> {
    let real_root = std::fs::canonicalize(root).map_err(io("read", root))?;
    let mut items = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(io("read", &dir))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for e in entries {
            let name = e.file_name();
            let Some(name) = name.to_str() else {
                return Err(PackageError::UnsafeEntry {
                    name: e.file_name().to_string_lossy().into_owned(),
                    reason: "file name is not UTF-8",
                });
            };
            if matches!(name, ".git" | "node_modules") {
                continue;
            }
            let path = e.path();
            if skip.is_some_and(|s| skill::absolute(&path) == s) {
                continue;
            }
            let child = rel.join(name);
            let rel_str = rel_string(&child);
            let meta = std::fs::symlink_metadata(&path).map_err(io("read", &path))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(io("read", &path))?;
                let resolved = std::fs::canonicalize(&path).map_err(io("resolve", &path))?;
                let lexical_ok = !target.is_absolute() && is_within(root, &rel.join(&target));
                if !resolved.starts_with(&real_root) || !lexical_ok {
                    return Err(PackageError::SymlinkEscapes { link: path, target });
                }
                items.push(Item::Link {
                    rel: rel_str,
                    target: target.to_string_lossy().replace('\\', "/"),
                });
            } else if meta.is_dir() {
                items.push(Item::Dir { rel: rel_str });
                subdirs.push(child);
            } else if meta.is_file() {
                items.push(Item::File {
                    rel: rel_str,
                    src: path,
                    mode: file_mode(&meta),
                });
            }
        }
        for d in subdirs.into_iter().rev() {
            stack.push(d);
        }
    }
    items.sort_by(|a, b| item_rel(a).cmp(item_rel(b)));
    Ok(items)
}

fn item_rel(i: &Item) -> &str {
    match i {
        Item::File { rel, .. } | Item::Dir { rel } | Item::Link { rel, .. } => rel,
    }
}

fn rel_string(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(unix)]
fn file_mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    }
}

#[cfg(not(unix))]
fn file_mode(_meta: &std::fs::Metadata) -> u32 {
    0o644
}

/// What [`package`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packaged {
    /// The skill's name (the archive's top-level folder).
    pub name: String,
    /// The archive written.
    pub archive: PathBuf,
    /// Number of files (not directories) packed.
    pub files: usize,
}

/// Packs the skill at `dir` into `out` (any extension; `.skill` and `.zip` are the same format).
/// The skill must load (lenient mode); callers decide whether to require strict validity first.
pub fn package(dir: &Path, out: &Path) -> Result<Packaged, PackageError> {
    let (loaded, _) = validate::load_lenient(dir).map_err(|report| PackageError::NotASkill {
        path: dir.to_path_buf(),
        reason: report
            .errors()
            .map(|f| f.message.clone())
            .collect::<Vec<_>>()
            .join("; "),
    })?;
    let name = loaded.name.clone();
    if !is_safe_name(&name) {
        return Err(PackageError::BadName { name });
    }
    let out_abs = skill::absolute(out);
    let items = collect(&loaded.dir, Some(&out_abs))?;
    let file = File::create(out).map_err(io("create", out))?;
    let mut zip = zip::ZipWriter::new(file);
    let zerr = |source| PackageError::Zip {
        path: out.to_path_buf(),
        source,
    };
    let base = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .last_modified_time(zip::DateTime::DEFAULT);
    zip.add_directory(format!("{name}/"), base.unix_permissions(0o755))
        .map_err(zerr)?;
    let mut files = 0;
    for item in &items {
        match item {
            Item::Dir { rel } => zip
                .add_directory(format!("{name}/{rel}/"), base.unix_permissions(0o755))
                .map_err(zerr)?,
            Item::Link { rel, target } => zip
                .add_symlink(
                    format!("{name}/{rel}"),
                    target,
                    base.unix_permissions(0o777),
                )
                .map_err(zerr)?,
            Item::File { rel, src, mode } => {
                let data = std::fs::read(src).map_err(io("read", src))?;
                zip.start_file(format!("{name}/{rel}"), base.unix_permissions(*mode))
                    .map_err(zerr)?;
                zip.write_all(&data).map_err(io("write", out))?;
                files += 1;
            }
        }
    }
    zip.finish().map_err(zerr)?;
    Ok(Packaged {
        name,
        archive: out.to_path_buf(),
        files,
    })
}

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The skill's name.
    pub name: String,
    /// Where it now lives.
    pub dir: PathBuf,
    /// Whether an existing skill was replaced.
    pub replaced: bool,
}

/// Checks one archive entry name and returns its components.
fn entry_components(name: &str) -> Result<Vec<String>, PackageError> {
    let refuse = |reason| PackageError::UnsafeEntry {
        name: name.to_owned(),
        reason,
    };
    if name.contains('\0') {
        return Err(refuse("contains a NUL byte"));
    }
    if name.contains('\\') {
        return Err(refuse("contains a backslash"));
    }
    if name.starts_with('/') {
        return Err(refuse("is an absolute path"));
    }
    let bytes = name.as_bytes();
    if bytes.len() >= 2 && bytes[1] == b':' && bytes[0].is_ascii_alphabetic() {
        return Err(refuse("is an absolute (drive-letter) path"));
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(refuse("contains '..' (zip-slip)")),
            p => parts.push(p.to_owned()),
        }
    }
    if parts.is_empty() {
        return Err(refuse("is empty"));
    }
    Ok(parts)
}

struct Entry {
    parts: Vec<String>,
    is_dir: bool,
    link: Option<String>,
    mode: Option<u32>,
    data: Vec<u8>,
}

fn read_archive(path: &Path) -> Result<Vec<Entry>, PackageError> {
    let file = File::open(path).map_err(io("open", path))?;
    read_entries(file, path, MAX_UNPACKED_BYTES)
}

/// Reads and checks every entry of the archive `reader` (at most `max_unpacked` bytes in all);
/// `path` names it in messages.
fn read_entries<R: Read + Seek>(
    reader: R,
    path: &Path,
    max_unpacked: u64,
) -> Result<Vec<Entry>, PackageError> {
    let zerr = |source| PackageError::Zip {
        path: path.to_path_buf(),
        source,
    };
    let mut archive = zip::ZipArchive::new(reader).map_err(zerr)?;
    if archive.len() > MAX_ENTRIES {
        return Err(PackageError::TooLarge {
            path: path.to_path_buf(),
            limit: format!("{MAX_ENTRIES} entries"),
        });
    }
    let mut total: u64 = 0;
    let mut entries = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).map_err(zerr)?;
        let name = f.name().map_err(zerr)?.into_owned();
        let parts = entry_components(&name)?;
        if f.enclosed_name().is_none() {
            return Err(PackageError::UnsafeEntry {
                name,
                reason: "leaves the extraction directory",
            });
        }
        let is_dir = f.is_dir();
        let is_link = f.is_symlink();
        let mode = f.unix_mode();
        let mut data = Vec::new();
        if !is_dir {
            let budget = max_unpacked.saturating_sub(total);
            (&mut f)
                .take(budget.saturating_add(1))
                .read_to_end(&mut data)
                .map_err(io("read", path))?;
            total = total.saturating_add(data.len() as u64);
            if total > max_unpacked {
                return Err(PackageError::TooLarge {
                    path: path.to_path_buf(),
                    limit: format!("{max_unpacked} unpacked bytes"),
                });
            }
        }
        let link = if is_link {
            Some(String::from_utf8_lossy(&data).into_owned())
        } else {
            None
        };
        entries.push(Entry {
            parts,
            is_dir,
            link,
            mode,
            data,
        });
    }
    Ok(entries)
}

/// Where the skill sits in an archive: at the root (`SKILL.md`) or in one top-level folder.
fn skill_prefix(entries: &[Entry], path: &Path) -> Result<Option<String>, PackageError> {
    let is_skill_md = |e: &Entry, depth: usize| {
        !e.is_dir && e.parts.len() == depth && e.parts[depth - 1] == "SKILL.md"
    };
    if entries.iter().any(|e| is_skill_md(e, 1)) {
        return Ok(None);
    }
    let mut tops: Vec<&str> = entries.iter().map(|e| e.parts[0].as_str()).collect();
    tops.sort_unstable();
    tops.dedup();
    tops.retain(|t| *t != "__MACOSX");
    match tops.as_slice() {
        [top] if entries.iter().any(|e| is_skill_md(e, 2)) => Ok(Some((*top).to_owned())),
        _ => Err(PackageError::NoSkillInArchive {
            path: path.to_path_buf(),
        }),
    }
}

/// Lexically resolves `.` and `..` in an absolute path.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Writes entries under `into`: directories and files first, symlinks last, so nothing is ever
/// written through a link from the archive; each link's target, resolved from its real (already
/// extracted) parent, must stay inside `into`. Returns the files and links written.
fn extract(
    entries: Vec<Entry>,
    prefix: Option<&str>,
    into: &Path,
) -> Result<Vec<UnpackedFile>, PackageError> {
    let real_root = std::fs::canonicalize(into).map_err(io("resolve", into))?;
    let mut links = Vec::new();
    let mut written = Vec::new();
    for e in entries {
        let parts: &[String] = match prefix {
            Some(p) if e.parts[0] == p => &e.parts[1..],
            Some(_) => continue,
            None => &e.parts,
        };
        if parts.is_empty() {
            continue;
        }
        let rel: PathBuf = parts.iter().collect();
        let dest = into.join(&rel);
        if let Some(target) = e.link {
            written.push(UnpackedFile {
                path: parts.join("/"),
                size: target.len() as u64,
                executable: false,
                symlink: Some(target.clone()),
            });
            links.push((rel, target));
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        if e.is_dir {
            std::fs::create_dir_all(&dest).map_err(io("create", &dest))?;
        } else {
            let mut f = File::create(&dest).map_err(io("create", &dest))?;
            f.write_all(&e.data).map_err(io("write", &dest))?;
            set_mode(&dest, e.mode)?;
            written.push(UnpackedFile {
                path: parts.join("/"),
                size: e.data.len() as u64,
                executable: is_executable(e.mode),
                symlink: None,
            });
        }
    }
    for (rel, target) in links {
        let tpath = PathBuf::from(&target);
        let escapes = || PackageError::SymlinkEscapes {
            link: rel.clone(),
            target: tpath.clone(),
        };
        if tpath.is_absolute() || target.contains('\\') || target.contains('\0') {
            return Err(escapes());
        }
        let dest = into.join(&rel);
        let parent = dest.parent().unwrap_or(into);
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        let real_parent = std::fs::canonicalize(parent).map_err(io("resolve", parent))?;
        if !real_parent.starts_with(&real_root)
            || !normalize(&real_parent.join(&tpath)).starts_with(&real_root)
        {
            return Err(escapes());
        }
        make_symlink(&tpath, &dest)?;
    }
    written.sort_by(|a, b| a.path.cmp(&b.path));
    written.dedup_by(|a, b| a.path == b.path);
    Ok(written)
}

fn is_executable(mode: Option<u32>) -> bool {
    mode.is_some_and(|m| m & 0o111 != 0)
}

#[cfg(unix)]
fn make_symlink(target: &Path, link: &Path) -> Result<(), PackageError> {
    std::os::unix::fs::symlink(target, link).map_err(io("create symlink", link))
}

#[cfg(not(unix))]
fn make_symlink(_target: &Path, link: &Path) -> Result<(), PackageError> {
    Err(PackageError::UnsafeEntry {
        name: link.display().to_string(),
        reason: "symlinks are not supported on this platform",
    })
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: Option<u32>) -> Result<(), PackageError> {
    use std::os::unix::fs::PermissionsExt;
    let perms = std::fs::Permissions::from_mode(if is_executable(mode) { 0o755 } else { 0o644 });
    std::fs::set_permissions(path, perms).map_err(io("chmod", path))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: Option<u32>) -> Result<(), PackageError> {
    Ok(())
}

fn copy_tree(src: &Path, into: &Path) -> Result<(), PackageError> {
    for item in collect(src, None)? {
        match item {
            Item::Dir { rel } => {
                let d = into.join(&rel);
                std::fs::create_dir_all(&d).map_err(io("create", &d))?;
            }
            Item::Link { rel, target } => {
                let d = into.join(&rel);
                if let Some(parent) = d.parent() {
                    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
                }
                make_symlink(Path::new(&target), &d)?;
            }
            Item::File { rel, src, mode } => {
                let d = into.join(&rel);
                if let Some(parent) = d.parent() {
                    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
                }
                std::fs::copy(&src, &d).map_err(io("copy", &src))?;
                set_mode(&d, Some(mode))?;
            }
        }
    }
    Ok(())
}

/// A regular file or symlink of an unpacked skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpackedFile {
    /// Relative to the skill root, with `/` separators.
    pub path: String,
    /// Bytes written (for a symlink, the length of its target).
    pub size: u64,
    /// Whether the archive marks it executable (it was written 0755, else 0644).
    pub executable: bool,
    /// The target, when the entry is a symlink (it stays inside the skill).
    pub symlink: Option<String>,
}

/// What [`unpack_bytes`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// The archive's top-level folder when the skill sits in one (`<folder>/SKILL.md`); `None`
    /// when SKILL.md is at the archive's root.
    pub folder: Option<String>,
    /// Files and symlinks written, sorted by path (directories are not listed).
    pub files: Vec<UnpackedFile>,
}

/// Unpacks a skill archive held in memory into the existing directory `into`, which becomes the
/// skill's root (SKILL.md lands at `into/SKILL.md`). The same refusals as [`install`], the
/// same entry limit, and at most `max_unpacked` bytes (capped at [`MAX_UNPACKED_BYTES`]);
/// `shown` names the archive in messages. Nothing is validated beyond safety (the caller
/// validates the skill); on error `into` may hold part of the tree, so unpack into a directory
/// that is removed on failure.
pub fn unpack_bytes(
    bytes: &[u8],
    shown: &Path,
    into: &Path,
    max_unpacked: u64,
) -> Result<Unpacked, PackageError> {
    let max_unpacked = max_unpacked.min(MAX_UNPACKED_BYTES);
    let entries = read_entries(std::io::Cursor::new(bytes), shown, max_unpacked)?;
    let folder = skill_prefix(&entries, shown)?;
    let files = extract(entries, folder.as_deref(), into)?;
    Ok(Unpacked { folder, files })
}

/// A temporary directory beside the destination, removed on drop unless kept.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Installs the skill at `src` (a skill directory, a SKILL.md, or a `.zip`/`.skill` archive)
/// as `<dest>/<name>`. With `force`, an existing skill of that name is replaced.
pub fn install(src: &Path, dest: &Path, force: bool) -> Result<Installed, PackageError> {
    std::fs::create_dir_all(dest).map_err(io("create", dest))?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = Staging(dest.join(format!(".cella-install-{}-{n}", std::process::id())));
    let _ = std::fs::remove_dir_all(&staging.0);
    let stage_dir = staging.0.join("skill");
    std::fs::create_dir_all(&stage_dir).map_err(io("create", &stage_dir))?;

    let src_dir = skill::skill_dir_of(src);
    if src_dir.is_dir() {
        copy_tree(&src_dir, &stage_dir)?;
    } else {
        let entries = read_archive(src)?;
        let prefix = skill_prefix(&entries, src)?;
        extract(entries, prefix.as_deref(), &stage_dir)?;
    }

    let (loaded, _) =
        validate::load_lenient(&stage_dir).map_err(|report| PackageError::NotASkill {
            path: src.to_path_buf(),
            reason: report
                .errors()
                .map(|f| f.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
        })?;
    let name = loaded.name;
    if !is_safe_name(&name) {
        return Err(PackageError::BadName { name });
    }
    let target = dest.join(&name);
    let mut replaced = false;
    if std::fs::symlink_metadata(&target).is_ok() {
        if !force {
            return Err(PackageError::Exists { path: target });
        }
        std::fs::remove_dir_all(&target)
            .or_else(|_| std::fs::remove_file(&target))
            .map_err(io("remove", &target))?;
        replaced = true;
    }
    std::fs::rename(&stage_dir, &target).map_err(io("move into place", &target))?;
    Ok(Installed {
        name,
        dir: target,
        replaced,
    })
}
