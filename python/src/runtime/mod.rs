//! The one tokio runtime every `Hub`, `AsyncHub` and `Sandboxd` shares, and
//! the two ways a call crosses into it: blocking (GIL released, Ctrl-C
//! checked between ticks) or as an asyncio awaitable ([`awaitable`], a child
//! of this module so that the two never import each other in a circle).

pub mod awaitable;

use std::{future::Future, sync::OnceLock, time::Duration};

use pyo3::{exceptions::PyRuntimeError, prelude::*, IntoPyObjectExt};
use tokio::runtime::Runtime;

use crate::errors::Failure;

/// How often a blocking call wakes to let Python run signal handlers: short
/// enough that Ctrl-C feels immediate, long enough to cost nothing.
const SIGNAL_TICK: Duration = Duration::from_millis(50);

/// The process that started the runtime. A child made by `fork()` inherits
/// the runtime's memory but none of its threads, so a call there would
/// wait forever for a worker that does not exist.
static OWNER: OnceLock<u32> = OnceLock::new();

/// pyo3-async-runtimes' runtime, so awaitables and blocking calls run on the
/// same workers and share connection pools (no second, hidden runtime).
pub fn rt() -> &'static Runtime {
    OWNER.get_or_init(std::process::id);
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Refuses calls in a process forked after the runtime started (a clear
/// error instead of a hang).
pub fn check_fork() -> PyResult<()> {
    match OWNER.get() {
        Some(&owner) if owner != std::process::id() => Err(PyRuntimeError::new_err(
            "sandhub was already in use when this process was forked, and its threads \
             did not survive the fork: use multiprocessing's 'spawn' or 'forkserver' \
             start method (pickled Sandbox objects re-attach with hub.get), or create \
             clients only after forking",
        )),
        _ => Ok(()),
    }
}

/// Runs `fut` to completion with the GIL released, driven on the calling
/// thread (no hand-off to a worker and back: that wake-up is most of a
/// small call's overhead). Every [`SIGNAL_TICK`] the GIL is taken back just
/// long enough to run signal handlers; when one raises (`KeyboardInterrupt`),
/// the future is dropped, which drops its request (the hub sees the
/// connection close) and leaves every handle the call borrowed intact for
/// the next call.
pub fn block_on<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    check_fork()?;
    let mut fut = Box::pin(fut);
    loop {
        // The timer must be made inside the runtime, hence the async block.
        let waited = py.detach(|| {
            rt().block_on(async { tokio::time::timeout(SIGNAL_TICK, fut.as_mut()).await })
        });
        match waited {
            Ok(result) => return result.map_err(|f| f.into_py(py)),
            Err(_tick) => py.check_signals()?,
        }
    }
}

/// Sync or async, decided once per client: the value itself, or an
/// awaitable whose cancellation drops the request (see `awaitable`).
pub fn call<'py, T, F>(py: Python<'py>, asynchronous: bool, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    let fut = crate::trace::scoped(py, fut);
    if asynchronous {
        check_fork()?;
        awaitable::awaitable(py, fut)
    } else {
        block_on(py, fut)?.into_bound_py_any(py)
    }
}
