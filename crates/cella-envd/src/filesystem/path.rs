//! Paths as clients name them: `~` expansion, resolution against the user's home, lexical
//! clean-up, and the Connect error each `std::io::Error` stands for.
//!
//! Nothing here touches the filesystem: resolution is purely lexical (like envd's
//! `ExpandAndResolve`), so it is safe to call outside the user's identity.

use std::io;
use std::path::{Component, Path, PathBuf};

use cella_proto::{Code, RpcError};

/// Resolves a client-supplied path to an absolute, lexically clean path.
///
/// `~` and `~/x` expand to the user's home; relative paths resolve against it; `.` and `..`
/// are folded (never above `/`). Empty paths, NUL bytes and `~other` are invalid arguments.
pub fn resolve(raw: &str, home: &Path) -> Result<PathBuf, RpcError> {
    if raw.is_empty() {
        return Err(RpcError::invalid_argument(
            "path is empty: give an absolute path or one relative to the user's home",
        ));
    }
    if raw.contains('\0') {
        return Err(RpcError::invalid_argument(format!(
            "path {raw:?} contains a NUL byte"
        )));
    }
    let joined = if raw == "~" {
        home.to_path_buf()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        home.join(rest)
    } else if raw.starts_with('~') {
        return Err(RpcError::invalid_argument(format!(
            "cannot expand {raw:?}: only ~ and ~/ (the user's own home) are supported"
        )));
    } else if raw.starts_with('/') {
        PathBuf::from(raw)
    } else {
        home.join(raw)
    };
    Ok(clean(&joined))
}

/// Folds `.` and `..` lexically and makes the path absolute.
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The Connect code an I/O error stands for.
pub fn code_of(err: &io::Error) -> Code {
    match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => Code::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) => Code::PermissionDenied,
        Some(libc::EEXIST) => Code::AlreadyExists,
        Some(libc::EINVAL) | Some(libc::ENAMETOOLONG) | Some(libc::EISDIR) => Code::InvalidArgument,
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EMFILE) | Some(libc::ENFILE) => {
            Code::ResourceExhausted
        }
        Some(libc::ENOTEMPTY)
        | Some(libc::EROFS)
        | Some(libc::ELOOP)
        | Some(libc::EXDEV)
        | Some(libc::EBUSY)
        | Some(libc::ETXTBSY) => Code::FailedPrecondition,
        _ => match err.kind() {
            io::ErrorKind::NotFound => Code::NotFound,
            io::ErrorKind::PermissionDenied => Code::PermissionDenied,
            io::ErrorKind::AlreadyExists => Code::AlreadyExists,
            io::ErrorKind::InvalidInput => Code::InvalidArgument,
            _ => Code::Internal,
        },
    }
}

/// The reason an I/O error gives, lower-case and without Rust's `(os error N)` suffix.
pub fn reason(err: &io::Error) -> String {
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// A Connect error saying what was done to which path and why it failed, e.g.
/// `stat /home/user/a.txt: no such file or directory`.
pub fn io_error(action: &str, path: &Path, err: &io::Error) -> RpcError {
    let mut message = format!("{action} {}: {}", path.display(), reason(err));
    match err.raw_os_error() {
        Some(libc::ENOTDIR) => message.push_str(" (a component of the path is not a directory)"),
        Some(libc::EXDEV) => {
            message.push_str(" (source and destination are on different filesystems)")
        }
        _ => {}
    }
    RpcError::new(code_of(err), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_envd() {
        let home = Path::new("/home/user");
        let ok = |raw: &str| resolve(raw, home).expect("resolves").display().to_string();
        assert_eq!(ok("a.txt"), "/home/user/a.txt");
        assert_eq!(ok("~"), "/home/user");
        assert_eq!(ok("~/x/../y"), "/home/user/y");
        assert_eq!(ok("/tmp/./a//b/"), "/tmp/a/b");
        assert_eq!(ok("/../.."), "/");
        assert_eq!(ok("../../../etc"), "/etc");
        for bad in ["", "~root/x", "a\0b"] {
            assert_eq!(
                resolve(bad, home).expect_err(bad).code,
                Code::InvalidArgument
            );
        }
    }

    #[test]
    fn io_errors_read_well() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        let rpc = io_error("stat", Path::new("/x"), &e);
        assert_eq!(rpc.code, Code::NotFound);
        assert_eq!(rpc.message, "stat /x: no such file or directory");
        assert_eq!(
            code_of(&io::Error::from_raw_os_error(libc::EACCES)),
            Code::PermissionDenied
        );
    }
}
