//! Where an E2B path lives. E2B clients name paths relative to the user's
//! home, or absolute anywhere in the sandbox. Sandhub's file API reaches
//! the workspace (`/workspace`, where commands start, so it is the home's
//! stand-in); paths beyond it are reached by commands run inside the
//! sandbox, with the sandbox's own permissions, never by the hub.

/// The workspace as processes inside a sandbox see it.
pub const WORKSPACE: &str = "/workspace";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Relative to the workspace (`""` is the workspace itself).
    Workspace(String),
    /// An absolute path outside the workspace, normalised.
    Elsewhere(String),
}

impl Place {
    pub fn parse(raw: &str) -> Place {
        let absolute = raw.starts_with('/');
        let mut parts: Vec<&str> = Vec::new();
        for seg in raw.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                s => parts.push(s),
            }
        }
        let joined = parts.join("/");
        if !absolute {
            // `..` above the home stays at the home, as `cd ..` at `/`
            // stays at `/`: sandboxd then confines the rest.
            return Place::Workspace(joined);
        }
        let abs = format!("/{joined}");
        match abs.strip_prefix(WORKSPACE) {
            Some("") => Place::Workspace(String::new()),
            Some(rest) if rest.starts_with('/') => Place::Workspace(rest[1..].to_string()),
            _ => Place::Elsewhere(abs),
        }
    }

    /// The path as a process inside the sandbox names it.
    pub fn absolute(&self) -> String {
        match self {
            Place::Workspace(rel) if rel.is_empty() => WORKSPACE.to_string(),
            Place::Workspace(rel) => format!("{WORKSPACE}/{rel}"),
            Place::Elsewhere(abs) => abs.clone(),
        }
    }
}

/// The last segment of a path (`/` for the root).
pub fn base_name(path: &str) -> String {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("/")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_land_in_the_workspace_or_elsewhere() {
        let w = |s: &str| Place::Workspace(s.into());
        assert_eq!(Place::parse("a/b.txt"), w("a/b.txt"));
        assert_eq!(Place::parse("./a//b/../c"), w("a/c"));
        assert_eq!(Place::parse("../../etc/passwd"), w("etc/passwd"));
        assert_eq!(Place::parse(""), w(""));
        assert_eq!(Place::parse("/workspace"), w(""));
        assert_eq!(Place::parse("/workspace/x/y"), w("x/y"));
        assert_eq!(
            Place::parse("/workspace/../etc"),
            Place::Elsewhere("/etc".into())
        );
        assert_eq!(
            Place::parse("/workspaces/x"),
            Place::Elsewhere("/workspaces/x".into())
        );
        assert_eq!(Place::parse("/tmp/../../x"), Place::Elsewhere("/x".into()));
        assert_eq!(Place::parse("/"), Place::Elsewhere("/".into()));
        assert_eq!(w("a").absolute(), "/workspace/a");
        assert_eq!(w("").absolute(), "/workspace");
        assert_eq!(base_name("/a/b/"), "b");
        assert_eq!(base_name("/"), "/");
    }
}
