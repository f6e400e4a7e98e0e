//! Landlock as a second fence behind the mount layout: sandbox processes may read and execute
//! anywhere in their own root, but write only where the sandbox is meant to be writable; they
//! may not signal or reach abstract sockets outside their domain.

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    path_beneath_rules,
};

/// Directories (inside the sandbox) that stay writable.
pub const WRITABLE: &[&str] = &[
    "/home",
    "/tmp",
    "/root",
    "/run",
    "/var/tmp",
    "/dev",
    "/proc",
    "/workspace",
    "/opt",
    "/mnt",
];

/// Also writable when the root is a template's overlay (writes land in the sandbox's own
/// upper layer, never in the shared template).
pub const OVERLAY_WRITABLE: &[&str] = &["/etc", "/usr", "/var", "/srv"];

/// How much of the policy the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    Partial,
    None,
}

/// Restricts the calling thread (and its future children). Call after `pivot_root`.
pub fn restrict(extra_writable: &[&str]) -> Result<Enforcement, String> {
    let abi = ABI::V6;
    let writable: Vec<&str> = WRITABLE
        .iter()
        .chain(extra_writable)
        .copied()
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))))
        .and_then(|r| r.add_rules(path_beneath_rules(writable, AccessFs::from_all(abi))))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    })
}

/// The Landlock ABI version the kernel offers (0 when unsupported).
pub fn abi_version() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, landlock_create_ruleset
    // only returns the ABI version and touches no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}
