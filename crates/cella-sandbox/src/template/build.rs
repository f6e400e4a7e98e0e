//! Building a template's root filesystem (`cella template build`), on the host, as root.
//!
//! Stages: Debian packages (mmdebstrap) → pip → npm → files → finish (the `user` account,
//! hostname, resolv.conf) → ownership shifted into the sandboxes' id range (uid 0 inside is
//! `owner_base` on the host, so the overlay of a sandbox can copy files up) → `build.json`.
//! pip, npm and files run inside the new root through `chroot` in a private mount namespace
//! (so `/proc` and `/dev` mounted for them vanish with it, and paths cannot leave the root).
//!
//! Everything happens in `<template dir>/.build-<hash>-<pid>` and is renamed into place at the
//! end: a failed or interrupted build leaves no half-built root behind, and a build whose hash
//! is already present is a cache hit that does nothing.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::catalog::{BuildInfo, Catalog, Loaded};
use super::manifest::{FileContent, Recipe};

/// What a build reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Stage `index` of `total` starts.
    Stage {
        index: usize,
        total: usize,
        name: &'static str,
        detail: String,
    },
    /// The stage that started last has finished.
    StageDone { name: &'static str, seconds: f64 },
}

/// How a build ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Built now.
    Built(BuildInfo),
    /// The current build was already there.
    Cached(BuildInfo),
    /// The template runs on the host's `/usr`: nothing to build.
    NothingToBuild,
}

/// Builds template `name` unless its current build exists.
pub fn build(
    catalog: &Catalog,
    name: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, String> {
    let loaded = catalog.require(name).map_err(|e| e.to_string())?;
    let (Some(recipe), Some(hash)) = (&loaded.template.build, &loaded.hash) else {
        return Ok(Outcome::NothingToBuild);
    };
    if let Some(info) = catalog.built(&loaded) {
        return Ok(Outcome::Cached(info));
    }
    if crate::native::sys::geteuid() != 0 {
        return Err(format!(
            "building templates needs root (mmdebstrap, chroot and the ownership shift): run `sudo cella template build {name}`"
        ));
    }
    if find_program("mmdebstrap").is_none() {
        return Err(
            "mmdebstrap is not installed: install it (apt-get install mmdebstrap) and build again"
                .into(),
        );
    }
    let template_dir = catalog.template_dir(name);
    std::fs::create_dir_all(&template_dir)
        .map_err(|e| format!("creating {}: {e}", template_dir.display()))?;
    remove_stale_builds(&template_dir);

    let work = template_dir.join(format!(".build-{hash}-{}", std::process::id()));
    let result = build_into(catalog, &loaded, recipe, hash, &work, progress);
    match result {
        Ok(info) => {
            let target = catalog.build_dir(name, hash);
            match std::fs::rename(&work, &target) {
                Ok(()) => Ok(Outcome::Built(info)),
                // Someone else finished the same build first; theirs is identical.
                Err(_) if catalog.built(&loaded).is_some() => {
                    remove_build_dir(&work);
                    Ok(Outcome::Built(info))
                }
                Err(e) => {
                    remove_build_dir(&work);
                    Err(format!("moving the build into {}: {e}", target.display()))
                }
            }
        }
        Err(e) => {
            let kept = template_dir.join("last-failed-build.log");
            let _ = std::fs::rename(work.join("build.log"), &kept);
            remove_build_dir(&work);
            Err(format!(
                "{e}\nnothing was installed; the build log is {}",
                kept.display()
            ))
        }
    }
}

fn build_into(
    catalog: &Catalog,
    loaded: &Loaded,
    recipe: &Recipe,
    hash: &str,
    work: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<BuildInfo, String> {
    let started = Instant::now();
    std::fs::create_dir_all(work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let log_path = work.join("build.log");
    let log = File::create(&log_path).map_err(|e| format!("creating the build log: {e}"))?;
    let rootfs = work.join("rootfs");

    let mut stages: Vec<(&'static str, String)> = vec![(
        "debian",
        format!(
            "mmdebstrap {} ({} variant, {} packages) from {}",
            recipe.suite,
            recipe.variant,
            recipe.debian_packages.len(),
            recipe.mirror
        ),
    )];
    if !recipe.pip_packages.is_empty() {
        stages.push(("pip", recipe.pip_packages.join(" ")));
    }
    if !recipe.npm_packages.is_empty() {
        stages.push(("npm", recipe.npm_packages.join(" ")));
    }
    if !recipe.files.is_empty() {
        stages.push(("files", format!("{} files", recipe.files.len())));
    }
    stages.push((
        "finish",
        "user account, network files, ownership for sandboxes".into(),
    ));
    let total = stages.len();
    for (index, (name, detail)) in stages.into_iter().enumerate() {
        progress(Progress::Stage {
            index: index + 1,
            total,
            name,
            detail,
        });
        let t = Instant::now();
        let ok = match name {
            "debian" => debootstrap(recipe, &rootfs, &log),
            "pip" => {
                let mut args = vec![
                    "python3",
                    "-m",
                    "pip",
                    "install",
                    "--no-cache-dir",
                    "--break-system-packages",
                    "--root-user-action=ignore",
                    "--disable-pip-version-check",
                    "--progress-bar=off",
                ];
                args.extend(recipe.pip_packages.iter().map(String::as_str));
                in_root(&rootfs, &args, None, &log, true)
            }
            "npm" => {
                let mut args = vec!["npm", "install", "-g", "--no-fund", "--no-audit"];
                args.extend(recipe.npm_packages.iter().map(String::as_str));
                in_root(&rootfs, &args, None, &log, true)
            }
            "files" => copy_files(recipe, &rootfs, &log),
            _ => finish(&rootfs, catalog.owner_base(), &log),
        };
        ok.map_err(|e| format!("stage {name} failed: {e}{}", log_tail(&log_path)))?;
        progress(Progress::StageDone {
            name,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    let info = BuildInfo {
        name: loaded.template.name.clone(),
        hash: hash.to_string(),
        suite: recipe.suite.clone(),
        built_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        build_seconds: started.elapsed().as_secs_f64(),
        size_bytes: disk_usage(&rootfs),
        owner_base: catalog.owner_base(),
    };
    let json = serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?;
    std::fs::write(work.join("build.json"), json)
        .map_err(|e| format!("writing build.json: {e}"))?;
    Ok(info)
}

fn debootstrap(recipe: &Recipe, rootfs: &Path, log: &File) -> Result<(), String> {
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg("--mode=root")
        .arg(format!("--variant={}", recipe.variant))
        .arg(format!("--components={}", recipe.components.join(",")))
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-include=/usr/share/doc/*/copyright")
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*");
    if !recipe.debian_packages.is_empty() {
        cmd.arg(format!("--include={}", recipe.debian_packages.join(",")));
    }
    cmd.arg(&recipe.suite).arg(rootfs).arg(&recipe.mirror);
    run_logged(cmd, None, log)
}

/// Runs `args` inside `rootfs` (chroot in a private mount namespace with `/proc` and `/dev`);
/// with `network`, the host's resolv.conf is copied in first.
fn in_root(
    rootfs: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
    log: &File,
    network: bool,
) -> Result<(), String> {
    if network && let Ok(resolv) = std::fs::read("/etc/resolv.conf") {
        let target = rootfs.join("etc/resolv.conf");
        // Debian's resolv.conf may be a symlink into /run: replace the link itself.
        let _ = std::fs::remove_file(&target);
        std::fs::write(&target, resolv).map_err(|e| format!("writing resolv.conf: {e}"))?;
    }
    const SCRIPT: &str = r#"set -e
r="$1"; shift
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
exec chroot "$r" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--fork", "--"])
        .args(["sh", "-c", SCRIPT, "sh"])
        .arg(rootfs)
        .args(args);
    run_logged(cmd, stdin, log)
}

fn run_logged(mut cmd: Command, stdin: Option<&[u8]>, log: &File) -> Result<(), String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = log.try_clone().map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {program}: {e}"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data)
            .map_err(|e| format!("writing to {program}: {e}"))?;
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{program} exited with {status}"))
    }
}

fn copy_files(recipe: &Recipe, rootfs: &Path, log: &File) -> Result<(), String> {
    // Written by a shell inside the root, so a symlink in the image cannot redirect a write
    // to the host.
    const WRITE: &str = "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\" && chmod \"$2\" \"$1\"";
    for f in &recipe.files {
        let bytes = match &f.content {
            FileContent::Inline(text) => text.clone().into_bytes(),
            FileContent::Source(path) => {
                std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?
            }
        };
        let mode = format!("{:o}", f.mode);
        in_root(
            rootfs,
            &["/bin/sh", "-c", WRITE, "sh", &f.path, &mode],
            Some(&bytes),
            log,
            false,
        )
        .map_err(|e| format!("writing {}: {e}", f.path))?;
    }
    Ok(())
}

/// The `user` account (uid/gid 1000), the sandbox's network files, then ownership shifted.
fn finish(rootfs: &Path, owner_base: u32, log: &File) -> Result<(), String> {
    const SCRIPT: &str = r#"set -e
grep -q '^user:' /etc/group || echo 'user:x:1000:' >> /etc/group
grep -q '^user:' /etc/passwd || echo 'user:x:1000:1000:user:/home/user:/bin/bash' >> /etc/passwd
if [ -f /etc/shadow ] && ! grep -q '^user:' /etc/shadow; then echo 'user:*:19000:0:99999:7:::' >> /etc/shadow; fi
mkdir -p /home/user /workspace
chown 1000:1000 /home/user
chmod 750 /home/user
rm -f /etc/resolv.conf /etc/hostname /etc/machine-id
echo cella > /etc/hostname
echo '# no network by default' > /etc/resolv.conf
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tcella\n' > /etc/hosts
rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /tmp/* /var/tmp/* /root/.cache /root/.npm
"#;
    in_root(rootfs, &["/bin/sh", "-c", SCRIPT], None, log, false)?;
    shift_ownership(rootfs, owner_base)
        .map_err(|e| format!("shifting ownership of {}: {e}", rootfs.display()))
}

/// Adds `base` to every uid/gid below 65536 (idempotent, so hard links are shifted once).
/// Symlinks are changed themselves, never followed.
fn shift_ownership(root: &Path, base: u32) -> std::io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = path.symlink_metadata()?;
        if meta.uid() < 65536 || meta.gid() < 65536 {
            let uid = if meta.uid() < 65536 {
                meta.uid() + base
            } else {
                meta.uid()
            };
            let gid = if meta.gid() < 65536 {
                meta.gid() + base
            } else {
                meta.gid()
            };
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            // chown clears set-id bits; sandboxes run with no_new_privs, so they stay cleared
            // for files, but a directory's setgid (inherit the group) is kept.
            if meta.is_dir() && meta.permissions().mode() & 0o2000 != 0 {
                std::fs::set_permissions(&path, meta.permissions())?;
            }
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Bytes on disk under `root` (hard links counted once).
pub fn disk_usage(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(15)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!("\n--- last lines of the build log ---\n{}", tail.join("\n"))
    }
}

/// Removes the temporary directories of builds whose process is gone.
fn remove_stale_builds(template_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(template_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(".build-")
            .and_then(|rest| rest.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_build_dir(&entry.path());
        }
    }
}

/// Deletes a build directory, but never through a mount point left inside it (a bound `/dev`
/// would otherwise be emptied): such mounts are detached first, and if any remains the
/// directory is left alone.
fn remove_build_dir(dir: &Path) {
    let mounted = mounts_under(dir);
    for m in mounted.iter().rev() {
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
            // SAFETY: c is a valid NUL-terminated path; MNT_DETACH only unmounts.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    if mounts_under(dir).is_empty() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![PathBuf::from("/")];
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn find_program(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_shift_is_idempotent_and_skips_symlink_targets() {
        if crate::native::sys::geteuid() != 0 {
            eprintln!("skipping: shifting ownership needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/a"), "a").unwrap();
        std::fs::hard_link(root.join("etc/a"), root.join("etc/b")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/link")).unwrap();
        shift_ownership(&root, 1_000_000).unwrap();
        shift_ownership(&root, 1_000_000).unwrap();
        let uid = |p: &Path| p.symlink_metadata().unwrap().uid();
        assert_eq!(uid(&root.join("etc/a")), 1_000_000);
        assert_eq!(uid(&root.join("etc/b")), 1_000_000);
        assert_eq!(uid(&root.join("etc/link")), 1_000_000);
        assert_eq!(uid(&outside), 0);
        assert!(disk_usage(&root) > 0);
    }

    #[test]
    fn removing_a_build_never_crosses_a_mount() {
        if crate::native::sys::geteuid() != 0 {
            eprintln!("skipping: mounting needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("keep");
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(keep.join("precious"), "x").unwrap();
        let build = dir.path().join(".build-x-1");
        std::fs::create_dir_all(build.join("rootfs/dev")).unwrap();
        let status = Command::new("mount")
            .args(["--bind"])
            .arg(&keep)
            .arg(build.join("rootfs/dev"))
            .status()
            .unwrap();
        assert!(status.success());
        remove_build_dir(&build);
        assert!(
            keep.join("precious").exists(),
            "the bound directory was emptied"
        );
        assert!(!build.exists());
    }
}
