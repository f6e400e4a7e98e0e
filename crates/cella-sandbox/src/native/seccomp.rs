//! The seccomp policy every sandbox process runs under, as data: a deny-list of system calls
//! that reach kernel attack surface or host-wide state, plus argument rules for namespace
//! creation and terminal injection. Denied calls fail with EPERM; `clone3` fails with ENOSYS so
//! libc falls back to `clone`, whose flags we can inspect; foreign-architecture calls (i386
//! through `int 0x80`) kill the process.
//!
//! The policy is one classic-BPF program assembled here: a linear chain of comparisons on the
//! call number (~70 instructions). The kernel checks and translates a filter when it is
//! installed, at a cost that grows with its length, and runs it on every system call of the
//! sandbox, so it is kept short and single.

use std::sync::OnceLock;

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
const DENIED_IOCTLS: &[u32] = &[0x5412 /* TIOCSTI */, 0x541C /* TIOCLINUX */];

// The argument checks read the low 32 bits of an argument, which is where they live on a
// little-endian machine.
const _: () = assert!(cfg!(target_endian = "little"));

/// `AUDIT_ARCH_*` of the architecture the call numbers above belong to.
const AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xC000_003E
} else if cfg!(target_arch = "aarch64") {
    0xC000_00B7
} else {
    0
};

/// Offsets in `struct seccomp_data`: the call number, the architecture, and the low halves of
/// the first two arguments. Namespace flags are all in the low half of `clone`'s and
/// `unshare`'s flags (the kernel ignores or refuses the rest), and the kernel truncates an
/// ioctl's request to 32 bits, so the low halves are exactly what decides.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;
const DATA_ARG1_LOW: u32 = 24;

/// x32 call numbers have this bit set; a deny-list keyed on x86_64 numbers must refuse them.
const X32_BIT: u32 = 0x4000_0000;

/// One classic-BPF instruction.
pub type Instruction = libc::sock_filter;

/// Where a conditional jump goes.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Next,
    Eperm,
    Enosys,
    Kill,
    CheckNamespaces,
    CheckIoctl,
}

struct Assembler {
    code: Vec<(Instruction, Target, Target)>,
    labels: Vec<(Target, usize)>,
}

impl Assembler {
    fn op(&mut self, code: u32, k: u32) {
        self.jump(code, k, Target::Next, Target::Next);
    }

    fn jump(&mut self, code: u32, k: u32, jt: Target, jf: Target) {
        let insn = Instruction {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        };
        self.code.push((insn, jt, jf));
    }

    fn label(&mut self, target: Target) {
        self.labels.push((target, self.code.len()));
    }

    fn finish(self) -> Result<Vec<Instruction>, String> {
        let offset = |at: usize, target: Target| -> Result<u8, String> {
            if target == Target::Next {
                return Ok(0);
            }
            let (_, to) = self
                .labels
                .iter()
                .find(|(t, _)| *t == target)
                .ok_or("seccomp policy: jump to a missing label")?;
            u8::try_from(to - at - 1).map_err(|_| "seccomp policy: jump too long".to_string())
        };
        self.code
            .iter()
            .enumerate()
            .map(|(at, (insn, jt, jf))| {
                Ok(Instruction {
                    jt: offset(at, *jt)?,
                    jf: offset(at, *jf)?,
                    ..*insn
                })
            })
            .collect()
    }
}

const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const RET: u32 = libc::BPF_RET | libc::BPF_K;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}

/// Assembles the whole policy.
pub fn program() -> Result<Vec<Instruction>, String> {
    if AUDIT_ARCH == 0 {
        return Err("seccomp: unsupported architecture".into());
    }
    let mut a = Assembler {
        code: Vec::new(),
        labels: Vec::new(),
    };
    a.op(LOAD, DATA_ARCH);
    a.jump(JEQ, AUDIT_ARCH, Target::Next, Target::Kill);
    a.op(LOAD, DATA_NR);
    if cfg!(target_arch = "x86_64") {
        a.jump(JGE, X32_BIT, Target::Enosys, Target::Next);
    }
    a.jump(JEQ, libc::SYS_clone3 as u32, Target::Enosys, Target::Next);
    for (_, nr) in DENIED {
        a.jump(JEQ, *nr as u32, Target::Eperm, Target::Next);
    }
    a.jump(
        JEQ,
        libc::SYS_clone as u32,
        Target::CheckNamespaces,
        Target::Next,
    );
    a.jump(
        JEQ,
        libc::SYS_unshare as u32,
        Target::CheckNamespaces,
        Target::Next,
    );
    a.jump(
        JEQ,
        libc::SYS_ioctl as u32,
        Target::CheckIoctl,
        Target::Next,
    );
    a.op(RET, ALLOW);

    a.label(Target::CheckNamespaces);
    let mask = NAMESPACE_FLAGS.iter().fold(0u64, |m, f| m | f);
    a.op(LOAD, DATA_ARG0_LOW);
    a.jump(JSET, mask as u32, Target::Eperm, Target::Next);
    a.op(RET, ALLOW);

    a.label(Target::CheckIoctl);
    a.op(LOAD, DATA_ARG1_LOW);
    for request in DENIED_IOCTLS {
        a.jump(JEQ, *request, Target::Eperm, Target::Next);
    }
    a.op(RET, ALLOW);

    a.label(Target::Eperm);
    a.op(RET, errno(libc::EPERM));
    a.label(Target::Enosys);
    a.op(RET, errno(libc::ENOSYS));
    a.label(Target::Kill);
    a.op(RET, KILL);
    a.finish()
}

/// The policy, assembled once per process (see [`prepare`]).
fn compiled() -> &'static Result<Vec<Instruction>, String> {
    static PROGRAM: OnceLock<Result<Vec<Instruction>, String>> = OnceLock::new();
    PROGRAM.get_or_init(program)
}

/// Assembles the policy now, so processes forked from this one only install it.
pub fn prepare() {
    let _ = compiled();
}

/// Installs the policy on the calling thread (and everything it starts later). Needs
/// `no_new_privs` (or CAP_SYS_ADMIN).
pub fn install() -> Result<(), String> {
    let program = compiled().as_ref().map_err(Clone::clone)?;
    super::sys::install_seccomp(program).map_err(|e| format!("installing seccomp filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program the way the kernel would, for the instructions it uses.
    fn run(program: &[Instruction], arch: u32, nr: u64, args: [u64; 2]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        data[16..24].copy_from_slice(&args[0].to_le_bytes());
        data[24..32].copy_from_slice(&args[1].to_le_bytes());
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = program[pc];
            pc += 1;
            match u32::from(i.code) {
                LOAD => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                RET => return i.k,
                JEQ | JGE | JSET => {
                    let taken = match u32::from(i.code) {
                        JEQ => acc == i.k,
                        JGE => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    fn decide(nr: i64, args: [u64; 2]) -> u32 {
        run(&program().expect("assembles"), AUDIT_ARCH, nr as u64, args)
    }

    #[test]
    fn denied_calls_get_eperm_and_ordinary_ones_pass() {
        for (name, nr) in DENIED {
            assert_eq!(decide(*nr, [0, 0]), errno(libc::EPERM), "{name}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_mmap,
            libc::SYS_exit_group,
        ] {
            assert_eq!(decide(nr, [0, 0]), ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn namespace_flags_are_refused_in_clone_and_unshare() {
        let fork_like =
            (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        let thread_like = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD) as u64;
        assert_eq!(decide(libc::SYS_clone, [fork_like, 0]), ALLOW);
        assert_eq!(decide(libc::SYS_clone, [thread_like, 0]), ALLOW);
        assert_eq!(
            decide(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0]),
            ALLOW
        );
        for flag in NAMESPACE_FLAGS {
            assert_eq!(
                decide(libc::SYS_clone, [fork_like | flag, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(decide(libc::SYS_unshare, [*flag, 0]), errno(libc::EPERM));
            // High bits do not hide a namespace flag.
            assert_eq!(
                decide(libc::SYS_unshare, [flag | 1 << 40, 0]),
                errno(libc::EPERM)
            );
        }
    }

    #[test]
    fn clone3_and_x32_get_enosys_and_foreign_architectures_are_killed() {
        assert_eq!(decide(libc::SYS_clone3, [0, 0]), errno(libc::ENOSYS));
        if cfg!(target_arch = "x86_64") {
            let x32_mount = u64::from(X32_BIT) | libc::SYS_mount as u64;
            let x32_read = u64::from(X32_BIT) | libc::SYS_read as u64;
            let p = program().unwrap();
            assert_eq!(run(&p, AUDIT_ARCH, x32_mount, [0, 0]), errno(libc::ENOSYS));
            assert_eq!(run(&p, AUDIT_ARCH, x32_read, [0, 0]), errno(libc::ENOSYS));
        }
        let i386 = 0x4000_0003;
        assert_eq!(run(&program().unwrap(), i386, 0, [0, 0]), KILL);
    }

    #[test]
    fn terminal_injection_ioctls_are_refused_whatever_the_high_bits() {
        for request in DENIED_IOCTLS {
            let request = u64::from(*request);
            assert_eq!(decide(libc::SYS_ioctl, [0, request]), errno(libc::EPERM));
            assert_eq!(
                decide(libc::SYS_ioctl, [0, request | 1 << 32]),
                errno(libc::EPERM)
            );
        }
        assert_eq!(decide(libc::SYS_ioctl, [0, libc::TCGETS]), ALLOW);
        assert_eq!(decide(libc::SYS_ioctl, [0, libc::TIOCGWINSZ]), ALLOW);
    }

    #[test]
    fn the_program_is_short() {
        let p = program().unwrap();
        assert!(p.len() < DENIED.len() + 20, "{} instructions", p.len());
    }
}
