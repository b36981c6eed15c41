//! `sandhub code ID`: a small REPL against a code context of a sandbox
//! (issue #33), or one cell with `-c`. Output as it comes: stdout and
//! results' text to stdout, stderr and errors to stderr, images noted.

use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use sandhub_api::code::{CodeEvent, CreateContext, ExecuteCode};
use sandhub_client::{http::HubClient, Result};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{args::parse_duration, ClientArgs};

#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Sandbox id (its template's image needs a kernel, e.g. code-interpreter-v1).
    id: String,

    /// A context id (default: the language's default context).
    #[arg(long, value_name = "CONTEXT", env = "SANDHUB_CODE_CONTEXT")]
    context: Option<String>,

    /// Start a fresh context for this session, deleted at its end.
    #[arg(long, env = "SANDHUB_CODE_NEW", conflicts_with = "context")]
    new: bool,

    /// Run this code and exit (1 if it raised) instead of reading cells from stdin.
    #[arg(short = 'c', long, value_name = "CODE", env = "SANDHUB_CODE")]
    code: Option<String>,

    /// Interrupt a cell after this long (the context stays).
    #[arg(long, value_name = "DURATION", env = "SANDHUB_CODE_TIMEOUT", value_parser = parse_duration)]
    timeout: Option<Duration>,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn run(args: CodeArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let context = if args.new {
        let c = hub
            .create_context(&args.id, &CreateContext::default())
            .await?;
        eprintln!("context {}", c.id);
        Some(c.id)
    } else {
        args.context.clone()
    };
    let timeout = args.timeout.map(|d| d.as_secs().max(1));
    let cell = |code: String| ExecuteCode {
        code,
        context: context.clone(),
        timeout_seconds: timeout,
        ..Default::default()
    };
    let code = match args.code {
        Some(code) => {
            let failed = run_cell(&hub, &args.id, cell(code)).await?;
            i32::from(failed)
        }
        None => repl(&hub, &args.id, cell).await?,
    };
    if args.new {
        if let Some(c) = &context {
            hub.delete_context(&args.id, c).await?;
        }
    }
    Ok(code)
}

/// Cells from stdin: one line each, or, after a line ending in `:` or
/// `\`, every line up to the next empty one (as Python's own REPL).
async fn repl(hub: &HubClient, id: &str, cell: impl Fn(String) -> ExecuteCode) -> Result<i32> {
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut pending = String::new();
    loop {
        if interactive {
            eprint!("{}", if pending.is_empty() { ">>> " } else { "... " });
        }
        let Ok(Some(line)) = lines.next_line().await else {
            if !pending.is_empty() {
                run_cell(hub, id, cell(std::mem::take(&mut pending))).await?;
            }
            return Ok(0);
        };
        let open = !pending.is_empty();
        if open && line.trim().is_empty() {
            run_cell(hub, id, cell(std::mem::take(&mut pending))).await?;
            continue;
        }
        pending.push_str(&line);
        pending.push('\n');
        let continues = line.trim_end().ends_with(':') || line.ends_with('\\');
        if !open && !continues {
            run_cell(hub, id, cell(std::mem::take(&mut pending))).await?;
        }
    }
}

/// Runs one cell, printing as it goes; true if it raised.
async fn run_cell(hub: &HubClient, id: &str, request: ExecuteCode) -> Result<bool> {
    if request.code.trim().is_empty() {
        return Ok(false);
    }
    let mut events = hub.run_code(id, &request).await?;
    let mut failed = false;
    while let Some(event) = events.next().await {
        match event? {
            CodeEvent::Stdout { text } => print!("{text}"),
            CodeEvent::Stderr { text } => eprint!("{text}"),
            CodeEvent::Result(r) => {
                for (mime, data) in [("image/png", &r.png), ("image/svg+xml", &r.svg)] {
                    if let Some(d) = data {
                        println!("[{mime}, {} bytes of base64]", d.len());
                    }
                }
                if let Some(t) = r.text.or(r.markdown) {
                    println!("{t}");
                }
            }
            CodeEvent::Error {
                name,
                value,
                traceback,
            } => {
                failed = true;
                if traceback.is_empty() {
                    eprintln!("{name}: {value}");
                } else {
                    eprintln!("{}", traceback.join("\n"));
                }
            }
            CodeEvent::End { .. } => {}
        }
    }
    Ok(failed)
}
