//! The sandbox's root filesystem. For the `base` template: a size-limited tmpfs as the writable
//! layer, the host's `/usr` bound read-only and a curated `/etc` prepared once on the host and
//! bound read-only. For a built template: its root (shared by every sandbox of the template,
//! never written) as the lower layer of an overlayfs whose upper layer lives on the same
//! size-limited tmpfs. Then, for both: a fresh `/proc`, a read-only `/sys`, and a minimal `/dev`.
//!
//! Runs inside the sandbox's new user and mount namespaces, before `pivot_root`.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::sys;

/// Host `/etc` entries copied into the template's `/etc` (nothing secret: no shadow, keys or
/// host names).
const ETC_COPIED: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "python3",
    "python3.11",
    "fonts",
    "terminfo",
    "environment",
    "login.defs",
    "magic",
    "mailcap",
    "gai.conf",
    "host.conf",
    "manpath.config",
    "subversion",
    "gitconfig",
    "matplotlibrc",
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n";
const HOSTNAME: &str = "cella";

/// Whether the host's libraries changed since `dir` was built (a package installed on the host
/// updates `ld.so.cache` and `alternatives`, which the copy must then follow).
fn etc_is_stale(dir: &Path) -> bool {
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let Some(built) = modified(&dir.join("passwd")) else {
        return true;
    };
    ["/etc/ld.so.cache", "/etc/alternatives"]
        .iter()
        .filter_map(|p| modified(Path::new(p)))
        .any(|host| host > built)
}

/// Builds the shared, read-only `/etc` of the base template under `dir` (atomically: into a
/// temporary directory, then renamed). Does nothing when it exists and is not older than the
/// host's libraries; a stale one is moved aside and left there: running sandboxes have it
/// mounted, and removing its files would remove them from their `/etc` too.
pub fn prepare_etc(dir: &Path) -> io::Result<()> {
    if !etc_is_stale(dir) {
        return Ok(());
    }
    if dir.exists() {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let _ = std::fs::rename(dir, dir.with_extension(format!("stale.{stamp}")));
    }
    let parent = dir
        .parent()
        .ok_or_else(|| io::Error::other("template etc has no parent"))?;
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".etc.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    for name in ETC_COPIED {
        let src = Path::new("/etc").join(name);
        if src.symlink_metadata().is_ok() {
            copy_tree(&src, &tmp.join(name))?;
        }
    }
    std::fs::write(tmp.join("passwd"), PASSWD)?;
    std::fs::write(tmp.join("group"), GROUP)?;
    std::fs::write(tmp.join("hostname"), format!("{HOSTNAME}\n"))?;
    std::fs::write(
        tmp.join("hosts"),
        format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{HOSTNAME}\n"
        ),
    )?;
    std::fs::write(tmp.join("resolv.conf"), "# no network by default\n")?;
    std::fs::write(
        tmp.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
    )?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Another process prepared it first: theirs is as good as ours.
        Err(_) if dir.join("passwd").exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("installing template etc at {}: {e}", dir.display()),
        )),
    }
}

/// Copies files, directories and symlinks; skips what the host does not let us read.
fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = src.symlink_metadata()?;
    if meta.file_type().is_symlink() {
        symlink(std::fs::read_link(src)?, dst)?;
    } else if meta.is_dir() {
        std::fs::create_dir_all(dst)?;
        std::fs::set_permissions(
            dst,
            std::fs::Permissions::from_mode(meta.permissions().mode() & 0o755),
        )?;
        let Ok(entries) = std::fs::read_dir(src) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let _ = copy_tree(&entry.path(), &dst.join(entry.file_name()));
        }
    } else if meta.is_file() && meta.permissions().mode() & 0o004 != 0 {
        std::fs::copy(src, dst)?;
    }
    Ok(())
}

/// What the root filesystem is made of.
pub struct Plan<'a> {
    pub root: &'a Path,
    pub disk_bytes: Option<u64>,
    pub etc: &'a Path,
    /// A built template's root filesystem: the read-only lower layer of an overlay (`etc` is
    /// then unused: the template has its own).
    pub template_root: Option<&'a Path>,
    /// An idmapped detached mount of the host work directory, or its path for a plain bind.
    pub workspace: Option<Workspace<'a>>,
    /// Skills to bind read-only at `/skills/<name>`.
    pub skills: &'a std::collections::BTreeMap<String, PathBuf>,
    /// Host directory with the egress proxy socket, bound read-only at `/run/cella`.
    pub egress: Option<&'a Path>,
    /// uid/gid of the sandbox's `user` as seen inside (1000).
    pub user_id: u32,
    /// Whether uid 0 exists inside (false when rootless: only `user` is mapped).
    pub has_root: bool,
}

pub enum Workspace<'a> {
    Idmapped(&'a OwnedFd),
    Bind(&'a Path),
}

/// Creates `p` with `mode`. A directory that already has the mode is left alone: on a
/// template's overlay, changing it would copy it up for nothing.
fn mkdir(p: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = p.metadata()
        && meta.is_dir()
        && meta.mode() & 0o7777 == mode
    {
        return Ok(());
    }
    std::fs::create_dir_all(p)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", p.display())))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

fn chown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = p.symlink_metadata()
        && meta.uid() == uid
        && meta.gid() == gid
    {
        return Ok(());
    }
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
        .map_err(|e| io::Error::new(e.kind(), format!("chown {}: {e}", p.display())))
}

/// Builds the tree under `plan.root`. Returns warnings for optional parts that failed.
pub fn build(plan: &Plan<'_>) -> io::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let root = plan.root;
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    let size = plan
        .disk_bytes
        .map(|b| format!(",size={b}"))
        .unwrap_or_default();
    sys::mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        nosuid_nodev,
        Some(&format!("mode=0755{size}")),
    )?;
    if let Some(lower) = plan.template_root {
        mount_overlay(root, lower)?;
    }

    for (dir, mode) in [
        ("usr", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("var", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
    ] {
        mkdir(&root.join(dir), mode)?;
    }
    mkdir(&root.join("tmp"), 0o1777)?;
    mkdir(&root.join("var/tmp"), 0o1777)?;
    mkdir(&root.join("root"), 0o700)?;
    let home = root.join("home/user");
    mkdir(&home, 0o750)?;
    chown(&home, plan.user_id, plan.user_id)?;
    mkdir(&root.join("home"), 0o755)?;
    let ro = libc::MS_RDONLY | nosuid_nodev;
    if plan.template_root.is_none() {
        // Mirror the host's merged-/usr links (bin -> usr/bin, ...).
        for link in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            if let Ok(target) = std::fs::read_link(Path::new("/").join(link)) {
                symlink(target, root.join(link))?;
            }
        }
        sys::bind(Path::new("/usr"), &root.join("usr"), ro)?;
        sys::bind(plan.etc, &root.join("etc"), ro | libc::MS_NOEXEC)?;
    }

    build_dev(root, plan)?;
    sys::mount(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        nosuid_nodev | libc::MS_NOEXEC,
        None,
    )?;
    // Kernel tunables stay read-only even where the kernel would allow a namespaced write.
    if let Err(e) = sys::bind(
        &root.join("proc/sys"),
        &root.join("proc/sys"),
        ro | libc::MS_NOEXEC,
    ) {
        warnings.push(format!("/proc/sys left writable: {e}"));
    }
    if let Err(e) = sys::mount(
        Some("sysfs"),
        &root.join("sys"),
        Some("sysfs"),
        ro | libc::MS_NOEXEC,
        None,
    ) {
        warnings.push(format!("no /sys in the sandbox: {e}"));
    }
    if !plan.skills.is_empty() {
        let skills = root.join("skills");
        mkdir(&skills, 0o755)?;
        for (name, host) in plan.skills {
            crate::spec::validate_skill_mount_name(name).map_err(io::Error::other)?;
            let target = skills.join(name);
            mkdir(&target, 0o755)?;
            sys::bind(host, &target, ro | libc::MS_NOEXEC)?;
        }
    }
    if let Some(dir) = plan.egress {
        let target = root.join(crate::network::GUEST_DIR.trim_start_matches('/'));
        mkdir(&target, 0o755)?;
        sys::bind(dir, &target, ro | libc::MS_NOEXEC)?;
    }
    if let Some(ws) = &plan.workspace {
        let target = root.join("workspace");
        mkdir(&target, 0o755)?;
        match ws {
            Workspace::Idmapped(tree) => sys::attach_tree(tree, &target)?,
            Workspace::Bind(path) => sys::bind(path, &target, nosuid_nodev)?,
        }
    }
    Ok(warnings)
}

/// Stacks an overlay on `root` (already the sandbox's tmpfs): `lower` read-only below, upper
/// and work directories on the tmpfs, so every write lands in the size-limited tmpfs and the
/// template's root is never changed. The upper paths are resolved before the overlay covers
/// them.
fn mount_overlay(root: &Path, lower: &Path) -> io::Result<()> {
    let upper = root.join(".upper");
    let work = root.join(".work");
    mkdir(&upper, 0o755)?;
    mkdir(&work, 0o700)?;
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        overlay_path(lower)?,
        overlay_path(&upper)?,
        overlay_path(&work)?
    );
    sys::mount(
        Some("overlay"),
        root,
        Some("overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&opts),
    )
}

/// A path as overlayfs options accept it (`,` `:` and `\` would be read as separators).
fn overlay_path(p: &Path) -> io::Result<&str> {
    p.to_str()
        .filter(|s| !s.contains([',', ':', '\\']))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} cannot be an overlay layer (non-UTF-8, or contains , : or \\)",
                    p.display()
                ),
            )
        })
}

fn build_dev(root: &Path, plan: &Plan<'_>) -> io::Result<()> {
    let dev = root.join("dev");
    sys::mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=65536k"),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(node);
        std::fs::write(&target, b"")
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", target.display())))?;
        sys::bind(
            &PathBuf::from("/dev").join(node),
            &target,
            libc::MS_NOSUID | libc::MS_NOEXEC,
        )?;
    }
    let pts = dev.join("pts");
    mkdir(&pts, 0o755)?;
    let gid = if plan.has_root { ",gid=5" } else { "" };
    sys::mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(&format!("newinstance,ptmxmode=0666,mode=0620{gid}")),
    )?;
    symlink("pts/ptmx", dev.join("ptmx"))?;
    let shm = dev.join("shm");
    mkdir(&shm, 0o1777)?;
    sys::mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=65536k"),
    )?;
    symlink("/proc/self/fd", dev.join("fd"))?;
    symlink("/proc/self/fd/0", dev.join("stdin"))?;
    symlink("/proc/self/fd/1", dev.join("stdout"))?;
    symlink("/proc/self/fd/2", dev.join("stderr"))?;
    Ok(())
}
