"""Import circles between the modules (files) of a Rust crate, from its `use` lines and `crate::`/`super::` paths.

    python scripts/rust_module_cycles.py router/src [--known router/module-cycles.txt]

A file depends on another when it names an item of it (`use crate::config::Builder`, `crate::admin::md5_hex(…)`,
`super::Builder` from `routes/pool.rs`). `mod x;` declarations are not dependencies (a parent lists its children),
but a parent's `pub use x::Y` re-export is. The crate root (`lib.rs`) is a module like the others: an item defined
there and used by `config.rs` is an edge `config.rs -> lib.rs`.

Circles are strongly connected components of that graph with more than one file (or a file naming itself through
`crate::`, which cannot happen). Exit status 1 when there is one, naming its files and one path round it.

With `--known FILE` (one crate-relative file per line, `#` comments) the check is a ratchet while an old circle is
being taken apart: it fails on a circle that holds a file not in the list, and on a listed file that is no
longer in any circle (take it off the list, so it cannot slip back in). It passes when the circles only hold
listed files.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

# `crate::a::b::c`, `super::super::x`, `self::y` paths as written in code (use lines and expressions).
_PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
# `use crate::a::{b, c::d}` groups: the prefix before the brace, and its body (nested braces flattened below).
_USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def module_of(path: Path, root: Path) -> tuple[str, ...]:
    """The module path of a source file: lib.rs/main.rs -> (), a/mod.rs and a.rs -> ("a",)."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def crate_files(root: Path) -> dict[tuple[str, ...], Path]:
    """Every module file of the library crate under `root` (binaries and examples are leaves: left out)."""
    files = {}
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        if rel.parts[0] == "bin" or rel.name == "main.rs":
            continue
        files[module_of(path, root)] = path
    return files


def _paths(text: str) -> Iterable[tuple[str, list[str]]]:
    """(anchor, segments) of every crate/super/self path in `text`, `use` groups expanded one level deep."""
    for m in _USE_GROUP.finditer(text):
        anchor, prefix, body = m.group(1), m.group(2), m.group(3)
        base = [s for s in prefix.split("::") if s]
        for item in re.split(r"[,{}]", body):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self" and item != "*":
                yield anchor, base + [s for s in item.split("::") if s]
            else:
                yield anchor, base
    for m in _PATH.finditer(text):
        yield m.group(1), [s for s in m.group(2).split("::") if s]


def resolve(anchor: str, segments: list[str], here: tuple[str, ...], modules: set[tuple[str, ...]]) -> tuple[str, ...]:
    """The module a path names an item of: the longest prefix of its absolute form that is a module file."""
    if anchor == "crate":
        absolute = list(segments)
    else:
        base = list(here)
        rest = list(segments)
        if anchor == "super":
            base = base[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        absolute = base + rest
    for n in range(len(absolute), -1, -1):
        if tuple(absolute[:n]) in modules:
            return tuple(absolute[:n])
    return ()


def graph(root: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    files = crate_files(root)
    modules = set(files)
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for module, path in files.items():
        text = _STRING.sub('""', _COMMENT.sub("", path.read_text()))
        for anchor, segments in _paths(text):
            target = resolve(anchor, segments, module, modules)
            if target != module:
                edges[module].add(target)
        # A path may also start at a child module by its bare name (`use config::RouterConfig;` in lib.rs,
        # `request::Request` in protocol/mod.rs): a dependency on that child.
        for child in (m for m in modules if len(m) == len(module) + 1 and m[:-1] == module):
            if re.search(rf"(?<![:\w]){child[-1]}::", text):
                edges[module].add(child)
    return edges


def circles(edges: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[tuple[str, ...]]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    on_stack: set[tuple[str, ...]] = set()
    stack: list[tuple[str, ...]] = []
    out = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def one_cycle(component: list[tuple[str, ...]], edges: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list:
    """A shortest path round the component from its first module back to it (breadth first)."""
    members = set(component)
    start = component[0]
    previous: dict[tuple[str, ...], tuple[str, ...]] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def file_name(module: tuple[str, ...], root: Path, files: dict[tuple[str, ...], Path]) -> str:
    return str(files[module].relative_to(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the crate's source folder (e.g. router/src)")
    parser.add_argument("--known", type=Path, help="files of an old circle being taken apart (a ratchet)")
    args = parser.parse_args(argv)
    root: Path = args.src
    files = crate_files(root)
    edges = graph(root)
    found = circles(edges)
    known = set()
    if args.known:
        for line in args.known.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                known.add(line)
    in_circles = {file_name(m, root, files) for c in found for m in c}
    status = 0
    for component in found:
        names = [file_name(m, root, files) for m in component]
        new = [n for n in names if n not in known]
        if new or not args.known:
            path = " -> ".join(file_name(m, root, files) for m in one_cycle(component, edges))
            print(f"{root}: an import circle of {len(names)} files: {', '.join(names)}")
            print(f"  for example {path}")
            if args.known:
                print(f"  not in {args.known}: {', '.join(new)}")
            status = 1
    for gone in sorted(known - in_circles):
        print(f"{root}: {gone} is in no circle any more: take it off {args.known}")
        status = 1
    if status == 0:
        print(f"{root}: no import circle" + (f" outside the {len(known)} files of {args.known}" if known else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
