//! Workspace paths as both clients put them on the wire, and the one
//! lexical normalization both use to find a path's parent for `stat`.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sandhub_api::sandboxd::{EntryType, FileEntry};

use crate::WriteOptions;

/// Everything but RFC 3986's unreserved characters: safe in a path
/// segment and in a query value alike, so a `?`, `#`, `%` or `&` in a
/// file name can never change what the request means.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One path segment or query value, percent-encoded.
pub(crate) fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// A workspace path for a URL: each segment encoded, `/` kept between
/// them, no leading slash (callers append it to `.../files/`). `.` and
/// `..` pass through untouched; the server confines the path, so the
/// client must not decide on its own what an escape is.
pub(crate) fn encode_path(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(encode)
        .collect::<Vec<_>>()
        .join("/")
}

/// The parent directory and the last name of `path`, normalized the way
/// sandboxd does (empty and `.` segments dropped, `..` pops); `None` for
/// the root. Only called after the server has accepted the path, so a
/// `..` above the root cannot occur; it is treated as the root.
pub(crate) fn split_parent(path: &str) -> Option<(String, String)> {
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let name = parts.pop()?;
    Some((parts.join("/"), name.to_string()))
}

/// The entry `stat` reports for the root, which no listing contains.
/// Its time and mode are not known without a stat call sandboxd does not
/// offer, so they are fixed placeholders rather than guesses.
pub(crate) fn root_entry() -> FileEntry {
    FileEntry {
        name: "/".into(),
        size: 0,
        kind: EntryType::Directory,
        modified_at: "1970-01-01T00:00:00Z".into(),
        mode: "0755".into(),
    }
}

/// The query of a write: `append=true`, `mode=0NNN` (sandboxd's regex
/// is `^0[0-7]{3}$`, so the mode is printed with exactly that shape).
pub(crate) fn write_query(options: WriteOptions) -> String {
    let mut params = Vec::new();
    if options.append {
        params.push("append=true".to_string());
    }
    if let Some(mode) = options.mode {
        params.push(format!("mode=0{mode:03o}"));
    }
    if params.is_empty() {
        String::new()
    } else {
        format!("?{}", params.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_slashes_kept() {
        assert_eq!(encode_path("/a b/c?d#e%f"), "a%20b/c%3Fd%23e%25f");
        assert_eq!(encode_path("dir//x.txt"), "dir/x.txt");
        assert_eq!(encode_path("/"), "");
        assert_eq!(encode_path(""), "");
        assert_eq!(encode_path("../etc"), "../etc");
        assert_eq!(encode_path("é"), "%C3%A9");
    }

    #[test]
    fn parents_follow_sandboxd_normalization() {
        assert_eq!(split_parent("a/b/c"), Some(("a/b".into(), "c".into())));
        assert_eq!(split_parent("/top"), Some(("".into(), "top".into())));
        assert_eq!(split_parent("a/./b/../c/"), Some(("a".into(), "c".into())));
        assert_eq!(split_parent("/"), None);
        assert_eq!(split_parent("a/.."), None);
    }

    #[test]
    fn write_queries() {
        assert_eq!(write_query(WriteOptions::default()), "");
        let both = WriteOptions {
            append: true,
            mode: Some(0o600),
        };
        assert_eq!(write_query(both), "?append=true&mode=0600");
        let mode = WriteOptions {
            append: false,
            mode: Some(0o7),
        };
        assert_eq!(write_query(mode), "?mode=0007");
    }
}
