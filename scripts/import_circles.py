#!/usr/bin/env python3
"""Import circles between sibling modules of one crate (issue #13).

Usage: scripts/import_circles.py [SRC_DIR] [-v]   (default hub/src; -v lists the arrows)

Reads the `crate::...` paths and `super::` imports of every .rs file (test
items excluded wherever they stand in a file, and test modules in files of
their own), maps each file to its module path, and draws an arrow
between the two siblings under their common parent whenever one uses the
other (a child using its parent is no arrow). Prints every circle; exits 1
if there is one. A text-level check, not a compiler: macros and `self::`
re-exports are not followed."""
import re
import sys
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else "hub/src")

def modpath(f: Path):
    rel = f.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)

TEST_ITEM = re.compile(
    r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*"
    r"(?:(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;)?")


def strip_tests(text):
    """`text` without its `#[cfg(test)]` items, wherever they stand (a test
    module in the middle of a file hides nothing after it), and the names of
    the test modules it declares in files of their own (`mod tests;`)."""
    text = re.sub(r"//.*", "", text)
    out, files, at = "", [], 0
    while (m := TEST_ITEM.search(text, at)):
        out += text[at:m.start()]
        if m.group(1):
            files.append(m.group(1))
            at = m.end()
            continue
        # The item after the attribute: up to its `;`, or through its braces.
        semi, brace = text.find(";", m.end()), text.find("{", m.end())
        if brace < 0 or 0 <= semi < brace:
            at = len(text) if semi < 0 else semi + 1
        else:
            at = brace + len(braced(text, brace)) + 2
    return out + text[at:], files

def braced(text, open_at):
    """The text inside the brace at `open_at` and its matching one."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    return text[open_at + 1:]


def split_top(body):
    """`a::{b, c}, d` -> [`a::{b, c}`, `d`]: commas outside braces."""
    depth, cur, items = 0, "", []
    for ch in body:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


def first_two(item):
    """(module, submodule or None) of a path like `a::b::C` or `a::{b, c}`."""
    head, _, rest = item.partition("::")
    sub = re.match(r"\{?\s*([a-z_][a-z0-9_]*)(?:::|\s*[,}]|$)", rest)
    return head.strip(), sub.group(1) if sub else None


def crate_paths(text):
    text = re.sub(r"//.*", "", text)
    out = []
    for m in re.finditer(r"crate::", text):
        at = m.end()
        if text.startswith("{", at):
            out += [first_two(it) for it in split_top(braced(text, at))]
        else:
            path = re.match(r"[A-Za-z_][\w:]*", text[at:])
            if path:
                out.append(first_two(path.group(0)))
    return out


def super_paths(text):
    """Sibling names used through `super::` (one level up only)."""
    text = re.sub(r"//.*", "", text)
    out = []
    for m in re.finditer(r"\bsuper::", text):
        at = m.end()
        if text.startswith("{", at):
            items = split_top(braced(text, at))
        else:
            path = re.match(r"[A-Za-z_][\w:]*", text[at:])
            items = [path.group(0)] if path else []
        out += [first_two(it)[0] for it in items]
    return out


mods, test_mods = {}, set()
for f in root.rglob("*.rs"):
    m = modpath(f)
    mods[m], files = strip_tests(f.read_text())
    test_mods |= {m + (name,) for name in files}
# Files that are test modules (`#[cfg(test)] mod tests;`), and their children.
mods = {m: t for m, t in mods.items() if not any(m[:len(x)] == x for x in test_mods)}
known = set(mods)
edges = set()
for m, text in mods.items():
    targets = []
    for head, sub in crate_paths(text):
        t = (head,) if sub is None else (head, sub)
        while t and t not in known: t = t[:-1]
        if t: targets.append(t)
    # `super` of a file module and of a folder's mod.rs is the same parent.
    parent = m[:-1]
    for name in super_paths(text):
        t = parent + (name,)
        if t in known: targets.append(t)
    for t in targets:
        # the pair of siblings: longest common prefix + next segment of each
        i = 0
        while i < min(len(m), len(t)) and m[i] == t[i]: i += 1
        if i < len(m) and i < len(t):
            edges.add((m[:i+1], t[:i+1]))
graph = {}
for a, b in edges: graph.setdefault(a, set()).add(b)
cycles = set()
def dfs(start, node, path):
    for n in graph.get(node, ()):
        if n == start: cycles.add(tuple(sorted(path)))
        elif n not in path and len(path) < 8: dfs(start, n, path + [n])
for s in graph: dfs(s, s, [s])
for c in sorted(cycles): print("circle:", " <-> ".join("::".join(x) for x in c))
print(f"{len(edges)} sibling arrows, {len(cycles)} circles")
if "-v" in sys.argv:
    for a, b in sorted(edges): print("  ", "::".join(a), "->", "::".join(b))
sys.exit(1 if cycles else 0)
