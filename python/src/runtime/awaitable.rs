//! A Rust future as an asyncio future, safe at interpreter exit.
//!
//! The call runs on the shared tokio runtime; when it ends, a worker thread
//! takes the GIL to hand the result to the event loop
//! (`loop.call_soon_threadsafe`). That hand-off wakes the loop through a
//! socket write, which releases the GIL for a moment. If the program is
//! ending by then (the loop already saw the result and `asyncio.run`
//! returned), CPython ends any thread that asks for the GIL back during
//! finalization with `pthread_exit`, and unwinding that through Rust frames
//! aborts the process (about one exit in six did, before this module).
//!
//! So every hand-off registers itself ([`Gate::enter`]) before it takes the
//! GIL, and an `atexit` hook ([`quiesce`]) closes the gate and waits, with the
//! GIL released, for the hand-offs already inside to leave. `atexit` hooks
//! run before finalization, so after it no worker asks for the GIL again; a
//! call still running then simply never reports (nobody is left to await it).

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use pyo3::{prelude::*, sync::PyOnceLock, types::PyCFunction, IntoPyObjectExt};
use tokio::sync::oneshot;

use super::rt;
use crate::errors::Failure;

/// How long the exit hook waits for hand-offs in progress: each is a few
/// microseconds of Python, so this bounds only a pathological stall.
const QUIESCE_LIMIT: Duration = Duration::from_secs(5);

/// Closed by the exit hook; no hand-off starts after.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Hand-offs between [`Gate::enter`] and the end of their GIL section.
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// One hand-off's pass: held while the worker holds (or waits for) the GIL.
struct Gate;

impl Gate {
    /// A pass, unless the interpreter is shutting down. Counting first and
    /// checking after means the exit hook, which closes then waits for the
    /// count to drain, can never miss a hand-off that got in.
    fn enter() -> Option<Gate> {
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if CLOSED.load(Ordering::SeqCst) {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Gate)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `atexit` hook: closes the gate, then waits (GIL released, so the
/// hand-offs inside can finish) until none is left.
#[pyfunction]
pub fn quiesce(py: Python<'_>) {
    CLOSED.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + QUIESCE_LIMIT;
        while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_micros(200));
        }
    });
}

/// `settle(future, ok, value)` on the loop's thread: sets the result (or the
/// exception) unless the awaiting task was cancelled meanwhile, where
/// setting it would raise `InvalidStateError` inside the loop.
#[pyfunction]
fn settle(future: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if future.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    future.call_method1(method, (value,))?;
    Ok(())
}

/// Called by asyncio when the future is done; a cancelled one drops the
/// Rust call (and with it the request, so the hub stops the command).
#[pyclass]
struct OnDone {
    cancel: Mutex<Option<oneshot::Sender<()>>>,
}

#[pymethods]
impl OnDone {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            if let Some(tx) = self.cancel.lock().ok().and_then(|mut c| c.take()) {
                let _ = tx.send(());
            }
        }
        Ok(())
    }
}

fn settler(py: Python<'_>) -> PyResult<&Bound<'_, PyCFunction>> {
    static SETTLE: PyOnceLock<Py<PyCFunction>> = PyOnceLock::new();
    Ok(SETTLE
        .get_or_try_init(py, || wrap_pyfunction!(settle, py).map(Bound::unbind))?
        .bind(py))
}

/// `fut` as an asyncio future of the running loop. Cancelling the awaiting
/// task drops `fut`.
pub fn awaitable<'py, T, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let (cancel, cancelled) = oneshot::channel();
    let on_done = OnDone {
        cancel: Mutex::new(Some(cancel)),
    };
    future.call_method1("add_done_callback", (on_done,))?;
    let settle = settler(py)?.clone().unbind();
    let (event_loop, py_future) = (event_loop.unbind(), future.clone().unbind());
    rt().spawn(async move {
        let outcome = tokio::select! {
            outcome = fut => outcome,
            _ = cancelled => return,
        };
        let Some(_pass) = Gate::enter() else {
            return; // the interpreter is ending: nobody awaits this any more
        };
        Python::attach(|py| {
            let (ok, value) = match outcome.map(|v| v.into_py_any(py)) {
                Ok(Ok(v)) => (true, v),
                Ok(Err(e)) => (false, e.into_value(py).into_any()),
                Err(f) => (false, f.into_py(py).into_value(py).into_any()),
            };
            // Fails only when the loop is closed: its awaiter is gone too.
            let _ =
                event_loop.call_method1(py, "call_soon_threadsafe", (settle, py_future, ok, value));
        });
    });
    Ok(future)
}
