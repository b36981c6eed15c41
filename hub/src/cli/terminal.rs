//! The local terminal: raw mode that is undone on every way out, and the
//! window size.

use std::{
    os::fd::AsFd,
    sync::{Mutex, Once},
};

use rustix::termios::{self, OptionalActions, Termios};
use sandhub_client::{Error, PtySize, Result};

/// The settings to restore. A static rather than a field of the guard so
/// the panic hook can reach it too.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);
static PANIC_HOOK: Once = Once::new();

/// Raw mode on stdin while alive: keystrokes (Ctrl-C included) go to the
/// remote terminal byte for byte instead of being edited or turned into
/// signals here.
pub struct RawMode(());

impl RawMode {
    /// `None` when stdin is not a terminal (there is nothing to set).
    pub fn enable() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !termios::isatty(stdin.as_fd()) {
            return Ok(None);
        }
        let original = termios::tcgetattr(stdin.as_fd())
            .map_err(|e| Error::internal(format!("reading the terminal settings: {e}")))?;
        let mut raw = original.clone();
        raw.make_raw();
        *saved() = Some(original);
        // A panic message printed in raw mode is a staircase and leaves
        // the user's shell unusable: restore first, then report.
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw).map_err(|e| {
            saved().take();
            Error::internal(format!("switching the terminal to raw mode: {e}"))
        })?;
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

fn saved() -> std::sync::MutexGuard<'static, Option<Termios>> {
    // Poisoned only by a panic while holding it; the data is still good.
    SAVED.lock().unwrap_or_else(|e| e.into_inner())
}

fn restore() {
    if let Some(original) = saved().take() {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &original);
    }
}

pub fn stdin_is_tty() -> bool {
    termios::isatty(std::io::stdin().as_fd())
}

/// The size of whichever of stdout, stdin and stderr is a terminal.
pub fn size() -> Option<PtySize> {
    let fds = [
        termios::tcgetwinsize(std::io::stdout().as_fd()),
        termios::tcgetwinsize(std::io::stdin().as_fd()),
        termios::tcgetwinsize(std::io::stderr().as_fd()),
    ];
    fds.into_iter().flatten().find_map(|w| {
        (w.ws_col > 0 && w.ws_row > 0).then_some(PtySize {
            cols: w.ws_col,
            rows: w.ws_row,
        })
    })
}

/// What a remote terminal gets when there is no local one to measure.
pub const DEFAULT_SIZE: PtySize = PtySize { cols: 80, rows: 24 };
