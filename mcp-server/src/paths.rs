//! Paths as models write them, turned into workspace-relative paths.
//!
//! File tools address the sandbox's workspace, which processes see as
//! `/workspace`. Models write both `src/main.py` and
//! `/workspace/src/main.py` (the second because that is what `pwd` prints),
//! so both mean the same file. Any other absolute path is taken as relative
//! to the workspace, as upstream's runtime does.
//!
//! sandboxd confines every path itself (symlinks included); the lexical
//! check here only turns an obvious `..` escape into an error message that
//! says what to do instead of a bare PERMISSION_DENIED.

use crate::errors::ToolError;

pub const WORKSPACE: &str = "/workspace";

/// The workspace-relative form of `raw`: no leading slash, no `.` or `..`
/// segments; empty for the workspace itself.
pub fn workspace_path(raw: &str) -> Result<String, ToolError> {
    if raw.contains('\0') {
        return Err(ToolError::new(format!(
            "path {raw:?} contains a NUL byte; pass a plain path relative to /workspace"
        )));
    }
    let rest = strip_workspace(raw.trim());
    let mut parts: Vec<&str> = Vec::new();
    for segment in rest.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ToolError::new(format!(
                        "path {raw:?} escapes the workspace; use a path relative to /workspace \
                         (for example \"src/main.py\" or \"/workspace/src/main.py\")"
                    )));
                }
            }
            s => parts.push(s),
        }
    }
    Ok(parts.join("/"))
}

/// `raw` without a leading `/workspace` (only as a whole segment:
/// `/workspaces/x` is a directory named `workspaces`).
fn strip_workspace(raw: &str) -> &str {
    match raw.strip_prefix(WORKSPACE) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => raw,
    }
}

/// How a workspace-relative path reads in messages.
pub fn display(rel: &str) -> String {
    if rel.is_empty() {
        WORKSPACE.to_string()
    } else {
        format!("{WORKSPACE}/{rel}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_workspace_absolute_paths_agree() {
        for raw in [
            "src/main.py",
            "/workspace/src/main.py",
            "./src/main.py",
            "src//main.py",
            "/src/main.py",
            "src/x/../main.py",
        ] {
            assert_eq!(workspace_path(raw).unwrap(), "src/main.py", "{raw}");
        }
        for raw in ["", ".", "/", "/workspace", "/workspace/", "a/.."] {
            assert_eq!(workspace_path(raw).unwrap(), "", "{raw}");
        }
        assert_eq!(workspace_path("/workspaces/x").unwrap(), "workspaces/x");
    }

    #[test]
    fn escapes_are_refused_with_directions() {
        for raw in ["..", "../etc/passwd", "/workspace/../etc", "a/../../b"] {
            let e = workspace_path(raw).unwrap_err();
            assert!(e.message().contains("escapes the workspace"), "{raw}");
            assert!(e.message().contains("relative to /workspace"), "{raw}");
        }
        assert!(workspace_path("a\0b").is_err());
    }

    #[test]
    fn display_is_absolute() {
        assert_eq!(display(""), "/workspace");
        assert_eq!(display("a/b"), "/workspace/a/b");
    }
}
