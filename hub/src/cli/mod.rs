//! The client half of `sandhub`: subcommands that drive a hub over HTTP.
//!
//! Every subcommand is a thin face over [`sandhub_client::Sandboxes`]
//! (through [`sandhub_client::http::HubClient`]), so the CLI behaves like
//! every other client of the hub. Entry points return the process's exit
//! code and [`exit`] ends the process with it: the code carries meaning
//! (`exec` and `shell` pass the remote command's code through), and a read
//! of stdin blocked on tokio's blocking pool would otherwise keep the
//! runtime from shutting down.

pub mod args;
pub mod code;
pub mod cp;
pub mod events;
pub mod exec;
pub mod image;
pub mod network;
mod output;
pub mod pool;
pub mod port_forward;
pub mod sandbox;
pub mod shell;
pub mod snapshot;
pub mod template;
mod terminal;
pub mod top;
pub mod volume;

use std::io::Write;

pub use args::{ClientArgs, Output};
use sandhub_client::Result;

/// Prints a failure as `error: CODE: message` and ends the process with
/// `result`'s code (1 for a failure).
pub fn exit(result: Result<i32>) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
