//! `EntryInfo` for one path: type, size, permission bits, Go-style permission string, owner
//! names and RFC 3339 modification time, with symlinks described the way envd does.
//!
//! Symlinks: `type` is the *target's* type and `mode` the target's permission bits,
//! `isSymlink` is set and `symlinkTarget` holds the fully resolved target (envd follows the
//! whole chain). A dangling symlink has nothing to describe, so it reports
//! `FILE_TYPE_SYMLINK`, the link's own bits and the raw link text as its target.
//!
//! `metadata` holds the file's `user.e2b.*` extended attributes (see `metadata`).
//!
//! Callers run these in the requesting user's identity (`users::as_user`).

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cella_proto::filesystem::{EntryInfo, FileType};

use crate::users::Users;

/// Describes `path` without following it if it is a symlink (`lstat`).
pub fn entry_info(users: &Users, path: &Path) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    Ok(entry_from_metadata(users, path, &meta))
}

/// Describes `path` from its `lstat` metadata.
pub fn entry_from_metadata(users: &Users, path: &Path, meta: &Metadata) -> EntryInfo {
    let raw_mode = meta.mode();
    let is_symlink = meta.file_type().is_symlink();
    let (file_type, mode, symlink_target) = if is_symlink {
        match std::fs::canonicalize(path)
            .and_then(|target| std::fs::metadata(&target).map(|m| (target, m)))
        {
            Ok((target, target_meta)) => (
                file_type_of(target_meta.mode()),
                target_meta.mode() & 0o777,
                Some(target.to_string_lossy().into_owned()),
            ),
            Err(_) => (
                FileType::Symlink,
                raw_mode & 0o777,
                std::fs::read_link(path)
                    .ok()
                    .map(|t| t.to_string_lossy().into_owned()),
            ),
        }
    } else {
        (file_type_of(raw_mode), raw_mode & 0o777, None)
    };
    let name = match path.file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => path.to_string_lossy().into_owned(),
    };
    EntryInfo {
        name,
        file_type,
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(meta.size()).unwrap_or(i64::MAX),
        mode,
        permissions: permissions_string(raw_mode),
        owner: users.uid_name(meta.uid()),
        group: users.gid_name(meta.gid()),
        modified_time: Some(rfc3339(meta.mtime(), meta.mtime_nsec())),
        symlink_target,
        metadata: super::metadata::read(path),
        is_symlink,
    }
}

fn file_type_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileType::File,
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::Unspecified,
    }
}

/// `st_mode` rendered like Go's `os.FileMode.String()` (which envd sends): type letters from
/// `dalTLDpSugct?` followed by `rwxrwxrwx`, or `-` when no type letter applies.
pub fn permissions_string(mode: u32) -> String {
    let mut s = String::with_capacity(12);
    let fmt = mode & libc::S_IFMT;
    // Go's letter order: d a l T L D p S u g c t ?
    if fmt == libc::S_IFDIR {
        s.push('d');
    }
    if fmt == libc::S_IFLNK {
        s.push('L');
    }
    if fmt == libc::S_IFBLK || fmt == libc::S_IFCHR {
        s.push('D');
    }
    if fmt == libc::S_IFIFO {
        s.push('p');
    }
    if fmt == libc::S_IFSOCK {
        s.push('S');
    }
    if mode & libc::S_ISUID != 0 {
        s.push('u');
    }
    if mode & libc::S_ISGID != 0 {
        s.push('g');
    }
    if fmt == libc::S_IFCHR {
        s.push('c');
    }
    if mode & libc::S_ISVTX != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (i, c) in RWX.iter().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 {
            char::from(*c)
        } else {
            '-'
        });
    }
    s
}

/// A Unix time as an RFC 3339 UTC timestamp the way protobuf's JSON encodes
/// `google.protobuf.Timestamp`: 0, 3, 6 or 9 fractional digits and a `Z`.
pub fn rfc3339(secs: i64, nanos: i64) -> String {
    let nanos = nanos.clamp(0, 999_999_999);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let frac = if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}{frac}Z")
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_match_go() {
        assert_eq!(permissions_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(permissions_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(permissions_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            permissions_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(permissions_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(
            permissions_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(permissions_string(libc::S_IFIFO | 0o600), "prw-------");
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(951_782_400, 500_000_000),
            "2000-02-29T00:00:00.500Z"
        );
        assert_eq!(
            rfc3339(1_787_306_400, 123_456_000),
            "2026-08-21T10:00:00.123456Z"
        );
        assert_eq!(rfc3339(-1, 1), "1969-12-31T23:59:59.000000001Z");
    }
}
