//! The crate's modules import each other one way only: no two sibling
//! modules (children of one parent) reach each other through `crate::` or
//! `super::` paths, directly or around a circle. Issue #13 broke the circles
//! `body` -> `h1` -> `upstream` -> `body` and `body` <-> `error`; this keeps
//! them broken. Reads the sources as text: `use` trees and inline paths in
//! code (comments and `#[cfg(test)]` modules are not imports).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `lib.rs` is the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The code of a file without its test module and without comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a `use` tree names, e.g. `crate::{a::{b, c}, d}` gives
/// `crate::a::b`, `crate::a::c` and `crate::d`.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<Module>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default();
        let mut p = prefix.to_vec();
        p.extend(
            path.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
        out.push(p);
        return;
    };
    let mut p = prefix.to_vec();
    p.extend(
        tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from),
    );
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    for (i, ch) in body.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&body[start..i], &p, out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !body[start..].trim().is_empty() {
        expand(&body[start..], &p, out);
    }
}

/// The `crate::`/`super::`/`self::` paths a file's code names.
fn paths(code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    // `use` items start a line (after any `pub`, `pub(crate)`, ...).
    for (i, line) in code.lines().enumerate() {
        let item = line.trim_start();
        let item = match item.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => rest.split_once(')').map_or("", |(_, r)| r),
            Some(rest) => rest,
            None => item,
        };
        let Some(tree) = item.trim_start().strip_prefix("use ") else {
            continue;
        };
        let statement: String = std::iter::once(tree)
            .chain(code.lines().skip(i + 1))
            .collect::<Vec<_>>()
            .join(" ");
        let tree = statement.split(';').next().unwrap_or_default();
        expand(tree, &[], &mut out);
    }
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for root in ["crate::", "super::"] {
        for (i, _) in code.match_indices(root) {
            if code[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let path: String = code[i..].chars().take_while(|&c| is_ident(c)).collect();
            out.push(
                path.split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

/// Module `from` imports module `to` (the longest known prefix of a path).
fn edges(src: &Path) -> (BTreeSet<Module>, BTreeMap<Module, BTreeSet<Module>>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // main.rs is the binary's own crate root; it reaches the library by name.
    files.retain(|f| f.file_name().is_some_and(|n| n != "main.rs"));
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let from = module_of(src, file);
        for path in paths(&code(&fs::read_to_string(file).unwrap())) {
            let absolute: Module = match path.first().map(String::as_str) {
                Some("crate") => path[1..].to_vec(),
                Some("self") => [&from[..], &path[1..]].concat(),
                Some("super") => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    let base = &from[..from.len().saturating_sub(ups)];
                    [base, &path[ups..]].concat()
                }
                _ => continue,
            };
            let to = (1..=absolute.len())
                .rev()
                .map(|n| absolute[..n].to_vec())
                .find(|m| modules.contains(m));
            if let Some(to) = to.filter(|to| *to != from) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    (modules, edges)
}

/// A circle among the children of `parent`, if there is one.
fn sibling_circle(
    parent: &[String],
    modules: &BTreeSet<Module>,
    edges: &BTreeMap<Module, BTreeSet<Module>>,
) -> Option<Vec<String>> {
    let child = |m: &Module| {
        (m.len() > parent.len() && m.starts_with(parent)).then(|| m[parent.len()].clone())
    };
    let mut adj: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges {
        let Some(a) = child(from) else { continue };
        for b in tos.iter().filter_map(child).filter(|b| *b != a) {
            adj.entry(a.clone()).or_default().insert(b);
        }
    }
    let kids: BTreeSet<String> = modules.iter().filter_map(child).collect();
    // Depth-first search for a back edge; the stack is the circle.
    fn visit(
        n: &str,
        adj: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut circle = stack[i..].to_vec();
            circle.push(n.to_owned());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_owned());
        for m in adj.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, adj, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    kids.iter()
        .find_map(|k| visit(k, &adj, &mut Vec::new(), &mut done))
}

#[test]
fn sibling_modules_import_each_other_one_way_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (modules, edges) = edges(&src);
    let module = |s: &str| s.split("::").map(String::from).collect::<Module>();
    assert!(
        edges[&module("proxy")].contains(&module("http1::outbound")),
        "the reader finds the crate's imports: {edges:#?}"
    );
    let parents: BTreeSet<Module> = modules
        .iter()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    let circles: Vec<String> = parents
        .iter()
        .filter_map(|p| {
            sibling_circle(p, &modules, &edges).map(|c| {
                let parent = if p.is_empty() {
                    "crate".into()
                } else {
                    p.join("::")
                };
                format!("under {parent}: {}", c.join(" -> "))
            })
        })
        .collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_reader_sees_a_circle_when_there_is_one() {
    let mut expanded = Vec::new();
    expand("crate::{a::{b, c as d}, e}", &[], &mut expanded);
    assert_eq!(
        expanded,
        [
            vec!["crate", "a", "b"],
            vec!["crate", "a", "c"],
            vec!["crate", "e"]
        ]
    );
    let modules: BTreeSet<Module> = [vec![], vec!["a".into()], vec!["b".into()]].into();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    edges
        .entry(vec!["a".into()])
        .or_default()
        .insert(vec!["b".into()]);
    assert_eq!(sibling_circle(&[], &modules, &edges), None);
    edges
        .entry(vec!["b".into()])
        .or_default()
        .insert(vec!["a".into()]);
    assert_eq!(
        sibling_circle(&[], &modules, &edges),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}
