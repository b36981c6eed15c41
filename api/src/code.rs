//! The code interpreter's wire types (issue #33): contexts (one Jupyter
//! kernel each) and the NDJSON events of an execution. sandboxd serves
//! them under [`CONTEXTS_ROUTE`] / [`EXECUTE_ROUTE`]; the hub relays them
//! at `/v1/sandboxes/{id}/code[/contexts]` after checking every line
//! against these types and bounds, since the lines come from inside the
//! sandbox.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// sandboxd's routes (Sandhub extensions, beside `/v1/_sandhub/usage`).
pub const CONTEXTS_ROUTE: &str = "/v1/_sandhub/code/contexts";
pub const EXECUTE_ROUTE: &str = "/v1/_sandhub/code/execute";

/// The languages with a kernel: Python (ipykernel) and bash (bash_kernel,
/// an ipykernel subclass driving an interactive bash), both in the
/// code-interpreter image.
pub const PYTHON: &str = "python";
pub const BASH: &str = "bash";

/// Contexts (kernels) per sandbox, unless the operator says otherwise.
pub const DEFAULT_MAX_CONTEXTS: usize = 16;
/// A result bundle larger than this (summed over its MIME values) is
/// truncated, with `truncated: true`.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 16 << 20;
/// stdout + stderr text one execution may stream; past it the rest is
/// dropped and a marker says so.
pub const DEFAULT_MAX_STREAM_BYTES: usize = 64 << 20;
/// An execution's timeout when the request gives none, and the largest.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 300;
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// Code, like a command line, fits in the JSON body limit; this is what
/// sandboxd accepts.
pub const MAX_CODE_BYTES: usize = 8 << 20;
/// Longest line the hub reads from sandboxd's stream: a full result bundle
/// (base64 grows a PNG by 4/3) plus JSON overhead.
pub const MAX_EVENT_LINE_BYTES: usize = DEFAULT_MAX_RESULT_BYTES / 3 * 4 + (1 << 20);
/// Env entries a context or execution may set, and a context's cwd length.
pub const MAX_ENV_ENTRIES: usize = 256;
pub const MAX_ENV_BYTES: usize = 64 << 10;

/// The marker appended to text cut short by a bound.
pub const TRUNCATED_MARKER: &str = "\n[output truncated by sandhub]\n";

/// `POST .../code/contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// `python` (the default) or `bash`.
    #[serde(default)]
    pub language: Option<String>,
    /// The kernel's working directory, inside the workspace (default: the
    /// sandbox's default working directory).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment the kernel starts with (on top of the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One context: a kernel and the variables it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// `idle`, `busy`, or `dead` (its kernel exited; restart it).
    pub state: String,
    /// Why it is dead, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextList {
    pub contexts: Vec<Context>,
}

/// `POST .../code`: run `code` in `context`, or in the default context of
/// `language` (created on first use).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecuteCode {
    pub code: String,
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    /// Past it the kernel is interrupted (SIGINT) and the context kept.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Set in `os.environ` for this execution only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A rich result: the kernel's MIME bundle, the types Sandhub passes on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultBundle {
    #[serde(
        default,
        rename = "text/plain",
        skip_serializing_if = "Option::is_none"
    )]
    pub text: Option<String>,
    #[serde(default, rename = "text/html", skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(
        default,
        rename = "text/markdown",
        skip_serializing_if = "Option::is_none"
    )]
    pub markdown: Option<String>,
    /// Base64, as the kernel sends it.
    #[serde(default, rename = "image/png", skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(
        default,
        rename = "image/jpeg",
        skip_serializing_if = "Option::is_none"
    )]
    pub jpeg: Option<String>,
    #[serde(
        default,
        rename = "image/svg+xml",
        skip_serializing_if = "Option::is_none"
    )]
    pub svg: Option<String>,
    #[serde(
        default,
        rename = "application/json",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub json: Option<serde_json::Value>,
    /// The cell's value (`execute_result`), not a `display()`.
    #[serde(default)]
    pub is_main_result: bool,
    /// Some MIME values were dropped or cut to stay within the bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl ResultBundle {
    /// Bytes of its values, as the bound counts them.
    pub fn size(&self) -> usize {
        let s = |v: &Option<String>| v.as_ref().map_or(0, String::len);
        s(&self.text)
            + s(&self.html)
            + s(&self.markdown)
            + s(&self.png)
            + s(&self.jpeg)
            + s(&self.svg)
            + self
                .json
                .as_ref()
                .map_or(0, |j| serde_json::to_string(j).map_or(0, |t| t.len()))
    }

    /// Keeps it within `cap` bytes: whole values are dropped, largest first
    /// (images before text), and text/plain is cut with a marker if it
    /// alone is too big.
    pub fn bound(&mut self, cap: usize) {
        while self.size() > cap {
            self.truncated = true;
            if self.png.take().is_some()
                || self.jpeg.take().is_some()
                || self.svg.take().is_some()
                || self.json.take().is_some()
                || self.html.take().is_some()
                || self.markdown.take().is_some()
            {
                continue;
            }
            if let Some(t) = &mut self.text {
                let keep = cap.saturating_sub(TRUNCATED_MARKER.len());
                let mut end = keep.min(t.len());
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t.truncate(end);
                t.push_str(TRUNCATED_MARKER);
            }
            break;
        }
    }
}

/// One line of an execution's NDJSON stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Result(ResultBundle),
    Error {
        name: String,
        value: String,
        #[serde(default)]
        traceback: Vec<String>,
    },
    End {
        /// The kernel's count (`In [n]`), 0 when it gave none.
        execution_count: u64,
        /// Wall time from sending the code to its end, in seconds.
        duration: f64,
        /// Output messages lost to a flood (the kernel's queue was full).
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped: u64,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The error name of an execution whose timeout interrupted it.
pub const TIMEOUT_ERROR: &str = "TimeoutError";
/// The error name when the kernel died under an execution, or before it.
pub const KERNEL_DIED_ERROR: &str = "KernelDied";

/// Whether `language` names a kernel Sandhub knows (case-insensitive
/// aliases folded to the canonical name).
pub fn canonical_language(language: Option<&str>) -> Result<&'static str, String> {
    match language.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("python") | Some("python3") => Ok(PYTHON),
        Some("bash") => Ok(BASH),
        Some(other) => Err(format!(
            "language {other:?} has no kernel here (supported: python, bash)"
        )),
    }
}

/// Checks an env map's size and names (no `=` or NUL; values no NUL).
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV_ENTRIES {
        return Err(format!("env: at most {MAX_ENV_ENTRIES} entries"));
    }
    let mut total = 0;
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(format!("env: {k:?} is not a valid variable"));
        }
        total += k.len() + v.len();
    }
    if total > MAX_ENV_BYTES {
        return Err(format!("env: at most {MAX_ENV_BYTES} bytes"));
    }
    Ok(())
}

/// A context id: what sandboxd makes, or `default-<language>`; checked so
/// it is safe in a path segment and a file name.
pub fn check_context_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!("context id {id:?} is not valid"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_lines() {
        let e = CodeEvent::Result(ResultBundle {
            text: Some("42".into()),
            is_main_result: true,
            ..Default::default()
        });
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"type":"result","text/plain":"42","is_main_result":true}"#
        );
        assert_eq!(serde_json::from_str::<CodeEvent>(&line).unwrap(), e);
    }

    #[test]
    fn a_big_bundle_is_cut_with_a_marker() {
        let mut b = ResultBundle {
            text: Some("é".repeat(1000)),
            png: Some("A".repeat(5000)),
            ..Default::default()
        };
        b.bound(501);
        assert!(b.truncated && b.png.is_none());
        let t = b.text.unwrap();
        assert!(t.ends_with(TRUNCATED_MARKER) && t.len() <= 501);
    }

    #[test]
    fn languages_and_ids() {
        assert_eq!(canonical_language(None), Ok(PYTHON));
        assert_eq!(canonical_language(Some("Python3")), Ok(PYTHON));
        assert_eq!(canonical_language(Some("BASH")), Ok(BASH));
        assert!(canonical_language(Some("cobol")).is_err());
        assert!(check_context_id("default-python").is_ok());
        assert!(check_context_id("../x").is_err());
        assert!(check_env(&[("A=B".to_string(), String::new())].into()).is_err());
    }
}
