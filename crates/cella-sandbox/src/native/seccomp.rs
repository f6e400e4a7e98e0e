//! The seccomp policy every sandbox process runs under, as data: a deny-list of system calls
//! that reach kernel attack surface or host-wide state, plus argument rules for namespace
//! creation and terminal injection. Denied calls fail with EPERM; `clone3` fails with ENOSYS so
//! libc falls back to `clone`, whose flags we can inspect.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// System calls denied outright.
pub const DENIED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("setns", libc::SYS_setns),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("syslog", libc::SYS_syslog),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("vhangup", libc::SYS_vhangup),
    ("kcmp", libc::SYS_kcmp),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("uselib", libc::SYS_uselib),
    ("ustat", libc::SYS_ustat),
    ("sysfs", libc::SYS_sysfs),
    ("_sysctl", libc::SYS__sysctl),
    ("personality", libc::SYS_personality),
    ("nfsservctl", libc::SYS_nfsservctl),
];

/// Namespace-creating flags refused in `clone` and `unshare`.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// Terminal ioctls that inject input into another process's terminal.
const DENIED_IOCTLS: &[u64] = &[0x5412 /* TIOCSTI */, 0x541C /* TIOCLINUX */];

fn arch() -> Result<TargetArch, String> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp: unsupported architecture: {e:?}"))
}

fn any_flag_rules(arg: u8, flags: &[u64]) -> Result<Vec<SeccompRule>, String> {
    flags
        .iter()
        .map(|f| {
            let cond =
                SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(*f), *f)
                    .map_err(|e| e.to_string())?;
            SeccompRule::new(vec![cond]).map_err(|e| e.to_string())
        })
        .collect()
}

/// The main policy: returns EPERM for every denied call.
pub fn deny_list() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, vec![])).collect();
    rules.insert(libc::SYS_unshare, any_flag_rules(0, NAMESPACE_FLAGS)?);
    rules.insert(libc::SYS_clone, any_flag_rules(0, NAMESPACE_FLAGS)?);
    let ioctl_rules = DENIED_IOCTLS
        .iter()
        .map(|req| {
            let cond = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *req)
                .map_err(|e| e.to_string())?;
            SeccompRule::new(vec![cond]).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| format!("seccomp policy: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("compiling seccomp policy: {e}"))
}

/// `clone3` passes flags in memory seccomp cannot inspect: answer ENOSYS so libc uses `clone`.
pub fn clone3_fallback() -> Result<BpfProgram, String> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, vec![])].into_iter().collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(|e| format!("seccomp policy: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("compiling seccomp policy: {e}"))
}

/// Refuses the x32 ABI (syscall numbers with bit 30 set) on x86_64, which a deny-list keyed on
/// x86_64 numbers would otherwise let through.
pub fn no_x32() -> BpfProgram {
    const X32_BIT: u32 = 0x4000_0000;
    let ld_nr = seccompiler::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let jge = seccompiler::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
        jt: 0,
        jf: 1,
        k: X32_BIT,
    };
    let deny = seccompiler::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    };
    let allow = seccompiler::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    };
    if cfg!(target_arch = "x86_64") {
        vec![ld_nr, jge, deny, allow]
    } else {
        vec![allow]
    }
}

/// Installs the whole policy on the calling thread (and everything it starts later).
pub fn install() -> Result<(), String> {
    for prog in [no_x32(), clone3_fallback()?, deny_list()?] {
        seccompiler::apply_filter(&prog).map_err(|e| format!("installing seccomp filter: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_compiles() {
        assert!(deny_list().expect("compiles").len() > DENIED.len());
        assert!(!clone3_fallback().expect("compiles").is_empty());
        assert!(!no_x32().is_empty());
    }
}
