//! Tool failures as the model sees them.
//!
//! Every failure a tool can hit becomes a `CallToolResult` with
//! `isError: true`, never a JSON-RPC error: clients show protocol errors to
//! the user opaquely ("tool failed"), while a tool error reaches the model,
//! which can act on it. So each message says what went wrong *and* what to
//! do differently.

use rmcp::model::{ContentBlock, IntoContents};
use sandhub_api::error::Code;

/// One failed tool call: the text the model reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    message: String,
}

/// For helpers only: `#[tool]` derives a tool's output schema from a
/// literal `Result<Json<T>, _>` return type, so tool fns spell that out.
pub type ToolResult<T> = Result<T, ToolError>;

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The one answer for "not yours" and "gone": telling them apart would
    /// let one session probe for another session's sandbox ids.
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(format!(
            "sandbox {id} not found in this session; create one with create_sandbox \
             (list_sandboxes shows this session's sandboxes)"
        ))
    }

    /// A failure from the hub or a sandbox while doing `what`.
    pub fn hub(what: &str, error: sandhub_client::Error) -> Self {
        Self::new(format!(
            "{what} failed: {} ({}). {}",
            error.message.trim_end_matches('.'),
            error.code,
            hint(error.code)
        ))
    }

    /// An argument out of its range: the message names the range, and the
    /// code word is the one the hub's REST API answers with.
    pub fn invalid(message: impl std::fmt::Display) -> Self {
        Self::new(format!(
            "{} ({}). {}",
            message.to_string().trim_end_matches('.'),
            Code::InvalidArgument,
            hint(Code::InvalidArgument)
        ))
    }

    /// A bounded wait ran out.
    pub fn timed_out(what: &str, seconds: f64) -> Self {
        Self::new(format!(
            "{what} did not finish within {seconds}s; pass a larger timeout, or use \
             start_process and read_process_output for long-running work"
        ))
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

/// rmcp marks the result `isError` when a tool returns `Err` of a type that
/// converts into contents.
impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.message)]
    }
}

/// `map_err(during("reading the file"))`.
pub fn during(what: &str) -> impl FnOnce(sandhub_client::Error) -> ToolError + '_ {
    move |error| ToolError::hub(what, error)
}

/// What the model can do about each upstream code word.
fn hint(code: Code) -> &'static str {
    match code {
        Code::InvalidArgument => "Check the arguments against this tool's input schema.",
        Code::NotFound => {
            "It does not exist: list_sandboxes shows this session's sandboxes and list_files \
             a directory's contents (paths are relative to /workspace)."
        }
        Code::PermissionDenied => {
            "The path escapes the workspace or is not accessible; use a path relative to \
             /workspace."
        }
        Code::Conflict => {
            "It conflicts with the current state (for example a non-empty directory); check \
             with list_files or get_sandbox_status and retry."
        }
        Code::FailedPrecondition => {
            "The sandbox or process is not in a state that allows this (for example not \
             Ready, or already exited); check get_sandbox_status."
        }
        Code::ResourceExhausted => {
            "A limit was reached; delete sandboxes or kill processes you no longer need, \
             then retry."
        }
        Code::PayloadTooLarge => {
            "The data is too large; split it into smaller files, or generate it inside the \
             sandbox with execute_command."
        }
        Code::Unavailable => {
            "The sandbox or hub is unreachable right now; retry in a few seconds, and check \
             get_sandbox_status."
        }
        Code::DeadlineExceeded => "It took too long; pass a larger timeout.",
        Code::Unauthenticated => {
            "The hub rejected this server's credentials; the user must fix the MCP server's \
             configuration (API key)."
        }
        Code::Unimplemented => "This hub's backend does not support it.",
        Code::Internal => "An internal error; retry once, and report it if it persists.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_errors_carry_a_hint() {
        let e = ToolError::hub(
            "reading /etc",
            sandhub_client::Error::new(Code::PermissionDenied, "etc: path escapes the root"),
        );
        assert!(e
            .message()
            .starts_with("reading /etc failed: etc: path escapes the root"));
        assert!(e.message().contains("PERMISSION_DENIED"));
        assert!(e.message().contains("relative to /workspace"));
    }

    #[test]
    fn invalid_arguments_carry_the_code_word() {
        let e = ToolError::invalid("timeout must be between 0.001 and 3600 seconds, not -1");
        assert!(e.message().starts_with("timeout must be between"));
        assert!(e.message().contains("(INVALID_ARGUMENT)"), "{e}");
    }

    #[test]
    fn not_found_names_the_way_out() {
        let e = ToolError::sandbox_not_found("sb-1");
        assert!(e.message().contains("sb-1 not found in this session"));
        assert!(e.message().contains("create_sandbox"));
    }
}
