//! `sandhub._sandhub`: the native half of the `sandhub` Python package,
//! PyO3 bindings of `sandhub-client` (the same Rust client the CLI, MCP
//! and Gym use, so retries, error mapping and streaming are one code in
//! every language). The typed, documented API is `python/sandhub/`; this
//! module only moves calls into the shared tokio runtime and back.

mod backend;
mod client;
mod errors;
mod runtime;
mod streams;
mod trace;

use pyo3::prelude::*;

#[pymodule]
fn _sandhub(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<streams::ProcessStream>()?;
    m.add_class::<streams::FileReader>()?;
    m.add_class::<streams::FileWriter>()?;
    m.add_class::<streams::WatchStream>()?;
    m.add_class::<streams::EventStream>()?;
    // Before finalization, no worker thread may still be handing a result
    // to asyncio (see runtime/awaitable.rs).
    let quiesce = wrap_pyfunction!(runtime::awaitable::quiesce, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (quiesce,))?;
    Ok(())
}
