//! Pseudo-terminals: allocation, async reads and writes on the master, and resizing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The master side of a pseudo-terminal, registered with the runtime.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// Opens a new pseudo-terminal pair of the given size: (master, slave).
pub fn open(cols: u16, rows: u16) -> io::Result<(PtyMaster, OwnedFd)> {
    let mut master = -1;
    let mut slave = -1;
    let size = libc::winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two fds into the provided ints; name and termios may be null and
    // `size` is a valid winsize.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty succeeded, so both fds are fresh and owned by us.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    set_cloexec_nonblocking(&master)?;
    set_cloexec(&slave)?;
    // SAFETY: `master` is an OwnedFd, so it stays open and keeps its descriptor number for as
    // long as the AsyncFd owns it.
    let fd =
        unsafe { AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE) }
            .map_err(io::Error::from)?;
    Ok((PtyMaster { fd }, slave))
}

fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a valid fd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_cloexec_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    set_cloexec(fd)?;
    // SAFETY: fcntl on a valid fd we own.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl on a valid fd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl PtyMaster {
    /// Reads output; `Ok(0)` at end (the slave side is closed: Linux reports EIO, mapped here).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| read_fd(fd.get_ref().as_raw_fd(), buf)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads whatever is available now without waiting (`WouldBlock` when nothing is).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        read_fd(self.fd.get_ref().as_raw_fd(), buf)
    }

    /// Writes all of `data` to the terminal.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                // SAFETY: writing from a valid buffer to a valid fd.
                let n = unsafe {
                    libc::write(fd.get_ref().as_raw_fd(), data.as_ptr().cast(), data.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Changes the terminal size (the foreground process gets SIGWINCH).
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let size = libc::winsize {
            ws_row: rows.max(1),
            ws_col: cols.max(1),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
        if unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn read_fd(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reading into a valid, writable buffer from a valid fd.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let err = io::Error::last_os_error();
        // EIO on a pty master means every slave fd is closed: end of output.
        if err.raw_os_error() == Some(libc::EIO) {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(n as usize)
}
