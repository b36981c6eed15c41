//! `execute_command`: a shell command run to completion.

use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use sandhub_api::hub::{Command, ExecRequest};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{bounded, seconds};
use crate::{
    errors::ToolError,
    output::truncate_middle,
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

const DEFAULT_TIMEOUT: f64 = 60.0;
/// How much longer than the command's own timeout we wait for the hub to
/// report it (killing a process tree and collecting its output takes a
/// moment), so the hub's `timed_out` answer normally wins over ours.
const GRACE_SECONDS: f64 = 30.0;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecuteCommandParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// A shell command line, run with /bin/sh -c in /workspace, e.g. "ls -la" or
    /// "cd src && python main.py > out.txt".
    pub command: String,
    /// Seconds before the command is killed. Default 60. For longer work use start_process.
    #[serde(default)]
    pub timeout: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecuteCommandResult {
    /// The command's exit status (0 is success).
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// True when the command was killed for running longer than timeout.
    pub timed_out: bool,
    /// True when stdout or stderr was longer than the cap and its middle was left out.
    pub truncated: bool,
    /// What was cut or why the command stopped, when something was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[tool_router(router = exec_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Run a shell command in a sandbox and wait for it to finish; returns its \
        exit code, stdout and stderr. Runs in /workspace with /bin/sh -c, so pipes, && and \
        redirections work. Output beyond the cap is cut in the middle (truncated: true). For \
        servers, watchers or anything longer than the timeout, use start_process.",
        annotations(
            title = "Execute command",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn execute_command(
        &self,
        Parameters(p): Parameters<ExecuteCommandParams>,
        hub: Hub,
    ) -> Result<Json<ExecuteCommandResult>, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let request = ExecRequest {
            command: Command::Shell(p.command),
            env: Default::default(),
            cwd: String::new(),
            timeout_seconds: Some(timeout),
            stdin: String::new(),
            container: None,
        };
        let result = bounded("the command", timeout + GRACE_SECONDS, async {
            sb.exec(&id, request)
                .await
                .map_err(|e| self.gone_or(&id, e))
        })
        .await?;
        Ok(Json(shape(
            result.exit_code,
            result.stdout,
            result.stderr,
            result.timed_out,
            timeout,
            self.options.max_output_bytes,
        )))
    }
}

/// The result as the model gets it: each stream capped, and a note that
/// says what happened to anything that is missing.
fn shape(
    exit_code: i32,
    stdout: String,
    stderr: String,
    timed_out: bool,
    timeout: f64,
    cap: usize,
) -> ExecuteCommandResult {
    let mut notes = Vec::new();
    if timed_out {
        notes.push(format!(
            "the command was killed after {timeout}s; pass a larger timeout, or run it with \
             start_process and poll read_process_output"
        ));
    }
    let mut cut = |name: &str, s: String| match truncate_middle(&s, cap) {
        Some(t) => {
            notes.push(format!(
                "{name} was {} bytes, over the {cap}-byte cap; its middle was left out \
                 (redirect it to a file and read parts with head, tail or grep)",
                s.len()
            ));
            (t, true)
        }
        None => (s, false),
    };
    let (stdout, out_cut) = cut("stdout", stdout);
    let (stderr, err_cut) = cut("stderr", stderr);
    ExecuteCommandResult {
        exit_code,
        stdout,
        stderr,
        timed_out,
        truncated: out_cut || err_cut,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_passes_unchanged() {
        let r = shape(0, "hi\n".into(), String::new(), false, 60.0, 1024);
        assert_eq!(r.stdout, "hi\n");
        assert!(!r.truncated);
        assert_eq!(r.note, None);
    }

    #[test]
    fn large_output_is_capped_and_noted() {
        let big = "x".repeat(10_000);
        let r = shape(1, big.clone(), "err".into(), false, 60.0, 1024);
        assert!(r.truncated);
        assert!(r.stdout.len() <= 1024);
        assert_eq!(r.stderr, "err");
        let note = r.note.unwrap();
        assert!(note.contains("stdout was 10000 bytes"), "{note}");
        assert!(!note.contains("stderr"), "{note}");
    }

    #[test]
    fn timeouts_are_explained() {
        let r = shape(-1, String::new(), String::new(), true, 5.0, 1024);
        assert!(r.timed_out);
        assert!(r.note.unwrap().contains("killed after 5s"));
    }
}
