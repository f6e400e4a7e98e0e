//! Thin, checked wrappers over the Linux system calls sandbox construction needs. Every `unsafe`
//! block in the native backend lives here, each with the reason it is sound.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(rc: libc::c_long, what: impl FnOnce() -> String) -> io::Result<libc::c_long> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{}: {e}", what())));
    }
    Ok(rc)
}

/// `mount(2)`.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = source.map(cstr).transpose()?;
    let tgt = cstr(target)?;
    let fs = fstype.map(cstr).transpose()?;
    let dat = data.map(cstr).transpose()?;
    // SAFETY: every pointer is either null or a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fs.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref().map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    check(rc.into(), || {
        format!(
            "mount {} on {}",
            source.or(fstype).unwrap_or("none"),
            target.display()
        )
    })?;
    Ok(())
}

/// Bind-mounts `source` on `target`, then applies `flags` (e.g. read-only) with a remount.
pub fn bind(source: &Path, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let src = source
        .to_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "non-UTF-8 path"))?;
    mount(Some(src), target, None, libc::MS_BIND | libc::MS_REC, None)?;
    if flags != 0 {
        mount(
            None,
            target,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            None,
        )?;
    }
    Ok(())
}

/// `pivot_root(".", ".")` in `new_root`, then detaches the old root: afterwards nothing of the
/// host's mount tree is reachable.
pub fn pivot_into(new_root: &Path) -> io::Result<()> {
    std::env::set_current_dir(new_root)?;
    let dot = cstr(".")?;
    // SAFETY: pivot_root takes two valid NUL-terminated paths.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    check(rc, || format!("pivot_root into {}", new_root.display()))?;
    // SAFETY: umount2 with a valid path; MNT_DETACH lazily detaches the old root stacked on ".".
    let rc = unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) };
    check(rc.into(), || "detaching the old root".to_string())?;
    std::env::set_current_dir("/")
}

/// `unshare(2)`.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes only flags.
    let rc = unsafe { libc::unshare(flags) };
    check(rc.into(), || format!("unshare({flags:#x})"))?;
    Ok(())
}

/// Forks into new namespaces (`clone(2)` without a new stack: fork semantics). Returns the
/// child's pid in the parent, 0 in the child.
///
/// # Safety
/// The calling process must be single-threaded: the child is a copy of this thread only.
pub unsafe fn clone_into_namespaces(flags: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: raw clone with a null stack behaves like fork; the caller guarantees there is only
    // one thread, so no lock can be held by a thread that does not exist in the child.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0usize,
        )
    };
    Ok(check(rc, || "clone into new namespaces".to_string())? as libc::pid_t)
}

/// Sets real, effective and saved user and group ids, and clears supplementary groups.
pub fn become_id(uid: u32, gid: u32, clear_groups: bool) -> io::Result<()> {
    if clear_groups {
        // SAFETY: setgroups with zero groups reads no memory.
        let rc = unsafe { libc::setgroups(0, std::ptr::null()) };
        check(rc.into(), || "clearing supplementary groups".to_string())?;
    }
    // SAFETY: setresgid/setresuid take plain integers.
    let rc = unsafe { libc::setresgid(gid, gid, gid) };
    check(rc.into(), || format!("setresgid({gid})"))?;
    // SAFETY: as above.
    let rc = unsafe { libc::setresuid(uid, uid, uid) };
    check(rc.into(), || format!("setresuid({uid})"))?;
    Ok(())
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    check(rc.into(), || format!("sethostname({name})"))?;
    Ok(())
}

pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(rc.into(), || "PR_SET_NO_NEW_PRIVS".to_string())?;
    Ok(())
}

pub fn set_dumpable(on: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(on), 0, 0, 0) };
    check(rc.into(), || "PR_SET_DUMPABLE".to_string())?;
    Ok(())
}

/// Highest capability number the kernel knows (read once per process).
pub fn last_cap() -> u32 {
    static LAST_CAP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST_CAP.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
    })
}

/// Removes every capability from the bounding set, so nothing exec'd later can regain one.
pub fn drop_bounding_set(last: u32) -> io::Result<()> {
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                format!("dropping capability {cap} from the bounding set"),
            ));
        }
    }
    // SAFETY: prctl with integer arguments only; clears every ambient capability.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Keeps exactly `caps` in the permitted and effective sets; inheritable is emptied.
pub fn limit_capabilities(caps: &[u32]) -> io::Result<()> {
    let mut data = [CapData::default(); 2];
    for &c in caps {
        let (i, bit) = ((c / 32) as usize, 1u32 << (c % 32));
        if i < 2 {
            data[i].effective |= bit;
            data[i].permitted |= bit;
        }
    }
    let mut hdr = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    // SAFETY: capset reads a header and two data structs laid out as the kernel's
    // _LINUX_CAPABILITY_VERSION_3 ABI.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    check(rc, || "setting capabilities".to_string())?;
    Ok(())
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    check(fd.into(), || "socket for loopback".to_string())?;
    // SAFETY: fd is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    check(rc.into(), || "reading loopback flags".to_string())?;
    // SAFETY: the union member for flags is what SIOCGIFFLAGS filled in.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    check(rc.into(), || "bringing loopback up".to_string())?;
    Ok(())
}

/// Closes every descriptor from 3 up except those in `keep`.
pub fn close_fds_except(keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd >= 3).collect();
    keep.sort_unstable();
    let mut lo: u32 = 3;
    for &fd in &keep {
        let fd = fd as u32;
        if fd > lo {
            // SAFETY: close_range closes descriptors in [lo, fd-1]; none is in use by Rust objects
            // we still hold (callers pass every descriptor they keep).
            unsafe { libc::syscall(libc::SYS_close_range, lo, fd - 1, 0) };
        }
        lo = fd + 1;
    }
    // SAFETY: as above, for [lo, max].
    unsafe { libc::syscall(libc::SYS_close_range, lo, u32::MAX, 0) };
}

/// Sets a resource limit (soft and hard).
pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    let rc = unsafe { libc::setrlimit(resource, &lim) };
    check(rc.into(), || format!("setrlimit({resource})"))?;
    Ok(())
}

/// Creates a pipe whose ends are close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(rc.into(), || "pipe".to_string())?;
    // SAFETY: both descriptors are fresh and owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of Unix `SOCK_SEQPACKET` sockets (message boundaries kept), close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    check(rc.into(), || "socketpair".to_string())?;
    // SAFETY: both descriptors are fresh and owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Most descriptors one message carries in [`send_fds`] / [`recv_fds`].
const MAX_PASSED_FDS: usize = 4;

/// Sends one message of `tag` carrying `fds` (`SCM_RIGHTS`) on a Unix socket.
pub fn send_fds(sock: &OwnedFd, tag: u8, fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_PASSED_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let data = [tag];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the sendmsg call,
    // the control buffer (64 bytes, 8-aligned) holds CMSG_SPACE of up to MAX_PASSED_FDS
    // descriptors, and CMSG_FIRSTHDR/CMSG_DATA stay inside it.
    let rc = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(cmsg),
            fd_bytes as usize,
        );
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    check(rc as libc::c_long, || "sending descriptors".to_string())?;
    Ok(())
}

/// Receives one message from [`send_fds`]: its tag and descriptors (close-on-exec), or `None`
/// at end of file.
pub fn recv_fds(sock: RawFd) -> io::Result<Option<(u8, Vec<OwnedFd>)>> {
    let mut data = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; the buffers outlive the call and recvmsg writes at
    // most msg_controllen bytes of control data. Descriptors are read only from SCM_RIGHTS
    // headers the kernel filled in, within cmsg_len.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<RawFd>();
                let first = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(first.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        Ok(Some((data[0], fds)))
    }
}

/// Installs a seccomp filter on the calling thread and every thread and process it starts.
pub fn install_seccomp(program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "filter too long"))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: the kernel copies `prog.len` instructions from `prog.filter`, which points into
    // `program` for the duration of the call; it does not write through the pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    check(rc, || "seccomp(SET_MODE_FILTER)".to_string())?;
    Ok(())
}

/// Overwrites this process's original argument and environment strings in place (what
/// `/proc/<pid>/cmdline` and `environ` read) with `name` and zeros, for a process forked from
/// a command line that must not carry the caller's arguments and environment along. Nothing
/// may read `std::env::args` afterwards.
pub fn scrub_cmdline_and_environ(name: &str) {
    // arg_start, arg_end, env_start, env_end.
    let Some([arg_start, arg_end, env_start, env_end]) = self_stat_fields::<usize, 4>(48) else {
        return;
    };
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if start == 0 || end <= start {
            continue;
        }
        // SAFETY: the kernel reports these ranges as this process's own argument and
        // environment strings, on its (writable) stack; the process is single-threaded and no
        // Rust value borrows them (std only keeps pointers it reads in `env::args`, which the
        // caller no longer uses; the environment was cleared before).
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
    }
    if arg_start != 0 && name.len() < arg_end.saturating_sub(arg_start) {
        // SAFETY: as above; `name` and its terminating zero fit in the argument range.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), arg_start as *mut u8, name.len()) };
    }
}

/// Shuts a socket down both ways (its peer reads end of file).
pub fn shutdown(sock: &OwnedFd) {
    // SAFETY: shutdown on a descriptor we own; failure (not connected) is harmless.
    unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
}

/// `fork(2)`: the child's pid in the parent, 0 in the child.
///
/// # Safety
/// The calling process must be single-threaded (see [`clone_into_namespaces`]).
pub unsafe fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { libc::fork() };
    Ok(check(rc.into(), || "fork".to_string())? as libc::pid_t)
}

/// How many threads this process has (from `/proc/self/stat`), if it can tell.
pub fn thread_count() -> Option<u64> {
    self_stat_fields::<u64, 1>(20).map(|[n]| n)
}

/// `N` consecutive fields of `/proc/self/stat` from field `first` (numbered from 1 as in
/// proc(5); field 3 or later).
fn self_stat_fields<T: std::str::FromStr, const N: usize>(first: usize) -> Option<[T; N]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 2, the command name, is in parentheses and may contain spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ').skip(first.checked_sub(3)?);
    let mut out = Vec::with_capacity(N);
    for _ in 0..N {
        out.push(fields.next()?.trim().parse().ok()?);
    }
    out.try_into().ok()
}

/// Restores the default action of `sig`, or ignores it (`ignore`).
pub fn set_signal(sig: libc::c_int, ignore: bool) {
    let action = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: installing SIG_IGN or SIG_DFL involves no handler code.
    unsafe { libc::signal(sig, action) };
}

/// Sets the calling thread's name as `ps` and `top` show it (truncated to 15 bytes).
pub fn set_process_name(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Points descriptors 0, 1 and 2 at `/dev/null`.
pub fn stdio_to_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 between a descriptor we hold and a standard descriptor number.
        check(unsafe { libc::dup2(null.as_raw_fd(), fd) }.into(), || {
            "dup2".to_string()
        })?;
    }
    Ok(())
}

/// Moves `from` onto descriptor number `to` (without close-on-exec), closing `from`.
pub fn move_fd(from: OwnedFd, to: RawFd) -> io::Result<()> {
    if from.as_raw_fd() == to {
        // Already there: only clear close-on-exec, as dup2 would have.
        // SAFETY: fcntl on a descriptor we own.
        check(unsafe { libc::fcntl(to, libc::F_SETFD, 0) }.into(), || {
            "fcntl".to_string()
        })?;
        std::mem::forget(from);
        return Ok(());
    }
    // SAFETY: dup2 between a descriptor we own and a number the caller hands over.
    check(unsafe { libc::dup2(from.as_raw_fd(), to) }.into(), || {
        "dup2".to_string()
    })?;
    Ok(())
}

/// Waits for a child; returns its raw wait status.
pub fn wait_child(pid: libc::pid_t) -> io::Result<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only `status`.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Collects a child that has exited, without waiting: its raw status, or `None` if it runs.
pub fn try_wait_child(pid: libc::pid_t) -> io::Result<Option<i32>> {
    let mut status = 0;
    // SAFETY: waitpid writes only `status`.
    let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    check(rc.into(), || format!("waitpid({pid})"))?;
    Ok((rc == pid).then_some(status))
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    let rc = unsafe { libc::kill(pid, sig) };
    check(rc.into(), || format!("kill({pid}, {sig})"))?;
    Ok(())
}

pub fn setsid() {
    // SAFETY: setsid takes no arguments; failure (already a leader) is harmless.
    unsafe { libc::setsid() };
}

pub fn geteuid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::getegid() }
}

pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit terminates the process without running atexit handlers, which is what a
    // forked child that fails set-up must do.
    unsafe { libc::_exit(code) }
}

// --- the new mount API (idmapped mounts) ----------------------------------------------------

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Clones the mount tree at `path` as a detached mount whose ids are translated through the
/// user namespace `userns` (an idmapped mount).
pub fn idmapped_tree(path: &Path, userns: &OwnedFd) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    // SAFETY: open_tree takes a valid path and flags; it returns a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            p.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE,
        )
    };
    let fd = check(fd, || format!("open_tree {}", path.display()))? as RawFd;
    // SAFETY: fd is fresh and ours.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = cstr("")?;
    // SAFETY: mount_setattr reads `attr` of the given size from a valid pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc, || format!("idmapping {}", path.display()))?;
    Ok(tree)
}

/// Attaches a detached mount (from [`idmapped_tree`]) at `target`.
pub fn attach_tree(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let empty = cstr("")?;
    // SAFETY: move_mount with a valid descriptor and valid paths.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(rc, || format!("attaching mount at {}", target.display()))?;
    Ok(())
}
