//! Errors of the local runtime. Each message names what failed and, where a
//! privilege or kernel feature is missing, which one.

use std::{io, path::PathBuf, time::Duration};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "invalid sandbox id {0:?}: use 1 to 63 characters from [A-Za-z0-9_.-], \
         not starting with '.' or '-'"
    )]
    InvalidId(String),

    /// No cgroup hierarchy can enforce limits and the caller did not opt out.
    #[error("{0}")]
    NoCgroupLimits(String),

    /// A kernel feature or privilege the sandbox needs is missing.
    #[error("{feature} is not available: {detail}")]
    MissingFeature {
        feature: &'static str,
        detail: String,
    },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A step inside the new sandbox failed; `message` comes from there.
    #[error("sandbox {id} failed to start: {message} (log: {})", log.display())]
    Start {
        id: String,
        message: String,
        log: PathBuf,
    },

    #[error("sandbox {id} did not become ready within {timeout:?} (log: {})", log.display())]
    StartTimeout {
        id: String,
        timeout: Duration,
        log: PathBuf,
    },

    #[error("sandbox {id} is already running: its cgroup {} still has processes", cgroup.display())]
    AlreadyRunning { id: String, cgroup: PathBuf },

    #[error("sandbox {id}: processes still alive {timeout:?} after SIGKILL ({})", cgroup.display())]
    StopTimeout {
        id: String,
        timeout: Duration,
        cgroup: PathBuf,
    },
}

impl RuntimeError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        RuntimeError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds context to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, RuntimeError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, RuntimeError> {
        self.map_err(|e| RuntimeError::io(context(), e))
    }
}

/// Prefixes an `io::Error`'s message with what was being done, keeping its kind.
pub(crate) fn annotate(step: impl std::fmt::Display, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{step}: {e}"))
}
