//! User-defined file metadata, stored as `user.e2b.<key>` extended attributes like envd does:
//! set from `X-Metadata-<key>` upload headers, reported in `EntryInfo.metadata`.
//!
//! Keys and values are printable ASCII; a key is at most 246 bytes (the VFS limits the whole
//! xattr name to 255) and one file's metadata at most 4096 bytes (ext4 keeps all of an inode's
//! xattrs in one block). Filesystems without xattr support have no metadata: reads report
//! none, writes are skipped.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Namespace of the xattrs holding metadata.
pub const XATTR_PREFIX: &str = "user.e2b.";
/// Longest key (the VFS caps the xattr name, prefix included, at 255 bytes).
pub const MAX_KEY_LEN: usize = 255 - XATTR_PREFIX.len();
/// Largest metadata of one file: the sum of stored names and values.
pub const MAX_TOTAL_LEN: usize = 4096;

/// Checks metadata before anything is written; the error says which key is wrong and why.
pub fn validate(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("metadata key must not be empty".into());
        }
        if key.len() > MAX_KEY_LEN {
            return Err(format!(
                "metadata key {key:?} is longer than {MAX_KEY_LEN} bytes"
            ));
        }
        if let Some(b) = key.bytes().find(|b| !(0x20..=0x7e).contains(b)) {
            return Err(format!(
                "metadata key {key:?} holds byte 0x{b:02x}: keys are printable ASCII"
            ));
        }
        if let Some(b) = value.bytes().find(|b| !(0x20..=0x7e).contains(b)) {
            return Err(format!(
                "metadata value of key {key:?} holds byte 0x{b:02x}: values are printable ASCII"
            ));
        }
        total += XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_TOTAL_LEN {
        return Err(format!(
            "metadata takes {total} bytes, more than the {MAX_TOTAL_LEN} a file can hold"
        ));
    }
    Ok(())
}

fn unsupported(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::ENOTSUP)
}

/// Metadata stored on `path` (following symlinks); empty when there is none or the filesystem
/// has no xattrs. Entries that are not UTF-8 (set by other tools) are skipped.
pub fn read(path: &Path) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return metadata;
    };
    let Ok(names) = list(&c) else {
        return metadata;
    };
    for name in names.split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        let (Ok(key), Ok(cname)) = (std::str::from_utf8(key), CString::new(name)) else {
            continue;
        };
        if let Ok(value) = get(&c, &cname)
            && let Ok(value) = String::from_utf8(value)
        {
            metadata.insert(key.to_string(), value);
        }
    }
    metadata
}

/// The NUL-separated xattr names of `path`.
fn list(path: &CString) -> io::Result<Vec<u8>> {
    loop {
        // SAFETY: a null buffer of size 0 only asks for the size; `path` is NUL-terminated.
        let size = unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
        if size <= 0 {
            return if size == 0 {
                Ok(Vec::new())
            } else {
                Err(io::Error::last_os_error())
            };
        }
        let mut buf = vec![0u8; usize::try_from(size).unwrap_or(0)];
        // SAFETY: `buf` is valid writable memory of `buf.len()` bytes; `path` is NUL-terminated.
        let got = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(usize::try_from(got).unwrap_or(0));
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e); // ERANGE: the list grew in between; ask again
        }
    }
}

fn get(path: &CString, name: &CString) -> io::Result<Vec<u8>> {
    loop {
        // SAFETY: a null buffer of size 0 only asks for the size; both strings are NUL-terminated.
        let size = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; usize::try_from(size).unwrap_or(0)];
        // SAFETY: `buf` is valid writable memory of `buf.len()` bytes; both strings are
        // NUL-terminated.
        let got = unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if got >= 0 {
            buf.truncate(usize::try_from(got).unwrap_or(0));
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

/// Stores `metadata` on an open file. Returns `Ok(false)` when the filesystem has no xattr
/// support (nothing is stored then).
pub fn write(file: &File, metadata: &BTreeMap<String, String>) -> io::Result<bool> {
    for (key, value) in metadata {
        let name = CString::new(format!("{XATTR_PREFIX}{key}")).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "metadata key holds a NUL byte")
        })?;
        // SAFETY: `file` is open, `name` is NUL-terminated and `value` is valid for its length.
        let rc = unsafe {
            libc::fsetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if unsupported(&e) {
                return Ok(false);
            }
            return Err(e);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_like_envd() {
        let one = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(validate(&one("owner", "alice smith")).is_ok());
        assert!(validate(&one("", "x")).is_err());
        assert!(validate(&one("k", "tab\there")).is_err());
        assert!(validate(&one(&"k".repeat(MAX_KEY_LEN + 1), "")).is_err());
        assert!(validate(&one("k", &"v".repeat(MAX_TOTAL_LEN))).is_err());
    }
}
