//! Failures as Python exceptions. The classes live in `sandhub/errors.py`
//! (one per code word, so users can `except NotFoundError`); this side only
//! says which word, message and kind.

use pyo3::{exceptions::PyRuntimeError, prelude::*};
use sandhub_client::Error;

pub enum Failure {
    /// A `{code, message}` from the hub or sandboxd, or a transport failure
    /// the client crate already worded (UNAVAILABLE with the URL).
    Client(Error),
    /// A read passed `max_download_size`; nothing beyond it was kept.
    TooLarge { limit: u64, path: String },
    /// The sandbox vanished while a call on it was running.
    Lost { id: String, cause: Error },
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Client(e)
    }
}

impl Failure {
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        let (kind, code, message, status) = match self {
            Failure::Client(e) => ("wire", e.code.as_str(), e.message, e.code.http_status()),
            Failure::TooLarge { limit, path } => (
                "too_large",
                "RESOURCE_EXHAUSTED",
                format!("{path}: the file is larger than max_download_size ({limit} bytes)"),
                413,
            ),
            Failure::Lost { id, cause } => (
                "lost",
                "NOT_FOUND",
                format!("sandbox {id} is gone (the call failed with {cause})"),
                404,
            ),
        };
        let build = || -> PyResult<PyErr> {
            let module = py.import("sandhub.errors")?;
            let exc =
                module
                    .getattr("_from_native")?
                    .call1((kind, code, message.as_str(), status))?;
            Ok(PyErr::from_value(exc))
        };
        build().unwrap_or_else(|e| {
            PyRuntimeError::new_err(format!(
                "{code}: {message} (and sandhub.errors failed: {e})"
            ))
        })
    }
}
