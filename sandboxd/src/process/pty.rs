//! Pseudo-terminals for `Start` with `pty`.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
};

use rustix::{
    fs::{Mode, OFlags},
    pty::OpenptFlags,
    termios::{SpecialCodeIndex, Winsize},
};
use tokio::{io::unix::AsyncFd, sync::Mutex};

/// The daemon's end of a terminal: reads are the child's output, writes its
/// keyboard input.
pub(crate) struct Master {
    fd: AsyncFd<OwnedFd>,
    /// Keeps concurrent `WriteStdin` calls from interleaving partial writes.
    writing: Mutex<()>,
}

/// Opens a new terminal pair; the slave end is for the child's stdio.
pub(crate) fn open(cols: u32, rows: u32) -> io::Result<(Master, OwnedFd)> {
    // CLOEXEC at once: a concurrent spawn must not inherit the master, or
    // its holder would keep the terminal alive after our child exits.
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    // NOCTTY: the daemon must never adopt the terminal as its own.
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Upstream leaves the kernel default (0x0) unless both are given.
    if cols > 0 && rows > 0 {
        rustix::termios::tcsetwinsize(&master, winsize(cols, rows))?;
    }
    rustix::io::ioctl_fionbio(&master, true)?;
    // SAFETY: the `OwnedFd` moves into the `AsyncFd` and is closed only
    // when it drops, so the registered fd stays open and the same.
    let fd = unsafe { AsyncFd::register(master)? };
    let master = Master {
        fd,
        writing: Mutex::new(()),
    };
    Ok((master, slave))
}

fn winsize(cols: u32, rows: u32) -> Winsize {
    let clamp = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    Winsize {
        ws_row: clamp(rows),
        ws_col: clamp(cols),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Master {
    /// Reads output; `Ok(0)` once no process holds the terminal any more
    /// (Linux answers EIO on the master then, after the buffered output).
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *buf)?)) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    pub(crate) async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        let _turn = self.writing.lock().await;
        while !data.is_empty() {
            let mut ready = self.fd.writable().await?;
            match ready.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), data)?)) {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Types the terminal's end-of-file character: a PTY has no stdin to
    /// close, and the line discipline turns this into EOF for the reader.
    pub(crate) async fn send_eof(&self) -> io::Result<()> {
        let eof = rustix::termios::tcgetattr(self.fd.get_ref())
            .map(|t| t.special_codes[SpecialCodeIndex::VEOF])
            .unwrap_or(0x04);
        self.write_all(&[eof]).await
    }

    pub(crate) fn resize(&self, cols: u32, rows: u32) -> io::Result<()> {
        Ok(rustix::termios::tcsetwinsize(
            self.fd.get_ref().as_fd(),
            winsize(cols, rows),
        )?)
    }
}
