//! The sandbox's users: who a request runs as, and names for uids and gids.
//!
//! Users come from the sandbox's own `/etc/passwd` and `/etc/group`. envd switches identity only
//! when it runs as root (inside its user namespace); an unprivileged envd (rootless sandboxes,
//! tests) runs everything as itself and says so when another user is asked for.

use std::collections::HashMap;
use std::path::PathBuf;

use cella_proto::{Code, RpcError};

/// One account of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
}

/// The sandbox's accounts, loaded once at start.
#[derive(Debug, Clone)]
pub struct Users {
    default_user: String,
    by_name: HashMap<String, User>,
    uid_names: HashMap<u32, String>,
    gid_names: HashMap<u32, String>,
    /// Whether envd may switch to other users (it runs as uid 0).
    can_switch: bool,
    me: User,
}

impl Users {
    /// Loads `/etc/passwd` and `/etc/group`.
    pub fn load(default_user: &str) -> Self {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        Self::from_files(default_user, &passwd, &group)
    }

    /// Builds the table from passwd- and group-format text.
    pub fn from_files(default_user: &str, passwd: &str, group: &str) -> Self {
        let mut by_name = HashMap::new();
        let mut uid_names = HashMap::new();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 7 {
                continue;
            }
            let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
                continue;
            };
            let user = User {
                name: f[0].to_string(),
                uid,
                gid,
                home: PathBuf::from(f[5]),
                shell: f[6].to_string(),
            };
            uid_names.entry(uid).or_insert_with(|| user.name.clone());
            by_name.entry(user.name.clone()).or_insert(user);
        }
        let mut gid_names = HashMap::new();
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 3
                && let Ok(gid) = f[2].parse::<u32>()
            {
                gid_names.entry(gid).or_insert_with(|| f[0].to_string());
            }
        }
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let me = uid_names
            .get(&euid)
            .and_then(|n| by_name.get(n))
            .cloned()
            .unwrap_or_else(|| User {
                name: euid.to_string(),
                uid: euid,
                gid: egid,
                home: std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| "/".into()),
                shell: "/bin/sh".into(),
            });
        Users {
            default_user: default_user.to_string(),
            by_name,
            uid_names,
            gid_names,
            can_switch: euid == 0,
            me,
        }
    }

    /// Whether requests can run as users other than envd's own.
    pub fn can_switch(&self) -> bool {
        self.can_switch
    }

    /// The user a request runs as: the named one, or the default.
    pub fn resolve(&self, name: Option<&str>) -> Result<User, RpcError> {
        let name = name.unwrap_or(&self.default_user);
        if !self.can_switch {
            // Unprivileged envd: only its own identity exists. Asking for it (or the default)
            // works; asking for anyone else is refused clearly.
            if name == self.default_user || name == self.me.name {
                return Ok(self.me.clone());
            }
            return Err(RpcError::new(
                Code::PermissionDenied,
                format!(
                    "user {name:?} is not available: this sandbox runs unprivileged (rootless) and only has user {:?}",
                    self.default_user
                ),
            ));
        }
        self.by_name.get(name).cloned().ok_or_else(|| {
            RpcError::new(
                Code::Unauthenticated,
                format!("invalid user {name:?}: no such user in the sandbox"),
            )
        })
    }

    pub fn uid_name(&self, uid: u32) -> String {
        self.uid_names
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn gid_name(&self, gid: u32) -> String {
        self.gid_names
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Runs `f` on the current thread with the filesystem identity of `user`, so permission checks
/// and ownership of created files are the user's. Restores envd's identity afterwards.
///
/// Must be called from a blocking thread (`spawn_blocking`): the identity is per thread.
pub fn as_user<T>(users: &Users, user: &User, f: impl FnOnce() -> T) -> T {
    if !users.can_switch() || user.uid == 0 {
        return f();
    }
    /// Restores root's filesystem identity even if `f` panics: blocking threads are reused.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: setfsuid/setfsgid change only this thread's filesystem credentials.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
        }
    }
    // SAFETY: setfsuid/setfsgid change only this thread's filesystem credentials; they cannot
    // fail in a way that corrupts memory (they return the previous id).
    unsafe {
        libc::setfsgid(user.gid);
        libc::setfsuid(user.uid);
    }
    let _restore = Restore;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\n";

    #[test]
    fn parses_accounts() {
        let users = Users::from_files("user", PASSWD, GROUP);
        assert_eq!(users.uid_name(1000), "user");
        assert_eq!(users.gid_name(0), "root");
        assert_eq!(users.uid_name(4242), "4242");
        if users.can_switch() {
            let u = users.resolve(None).expect("default");
            assert_eq!((u.uid, u.home.to_str()), (1000, Some("/home/user")));
            assert_eq!(
                users
                    .resolve(Some("nobody-here"))
                    .expect_err("missing")
                    .code,
                Code::Unauthenticated
            );
        }
    }
}
