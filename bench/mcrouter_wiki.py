"""Which of mcrouter's wiki examples the router loads, read from a local copy of the wiki (not a test).

    .venv/bin/python bench/mcrouter_wiki.py WIKI_DIR [--list]

WIKI_DIR is a directory holding the wiki's pages as Markdown (`*.md`, as a clone of mcrouter's GitHub wiki
has them); they are read there and never kept in this repository. Every example is taken from the pages:

* code blocks: fenced (```` ``` ````, indented or not) and HTML `<pre>` blocks (the JSONM page); a block
  that is not JSON as a whole is searched for the JSON object it shows (an admin request's `VALUE` reply);
* configs written inline: `--config-str='…'` / `--config-str={…}` on a command line, and a `"config_str"`
  option whose value is a config in a JSON string.

Each example is then one of (docs/router.md, "mcrouter's wiki examples", says why):

* **not a config**: not JSON, or JSON without a top-level `route`/`routes` (a route handle, a pool, a
  `failover_errors` list, a JSONM macro, a flavor file: fragments of a config, not configs);
* **incomplete**: a config in which a comment stands for what a user must fill in — a list or object
  that holds only a comment (`"servers": [ /* hosts of pool A */ ]`, `"pools": { /* define pool A */ }`),
  or one that is not JSON until such a comment is replaced (`"route": /* some route handle tree */`);
* **complete**: everything else with a `route`/`routes` — checked with
  `router/target/release/squeal-router-config`: loads clean, loads with warnings, or refused (with the
  reason). A block introduced as a named file (`` `pools.json` ``) is written under that name beside the
  page's other examples, so the config that `@import`s it finds it.

Incomplete ones whose only placeholders are server lists are loaded again with a loopback server in
each such list (what a user would write there); the others are loaded as written, for `--list` only.

The JSONM page's worked examples are checked too: an expression (an inline `@macro(…)` or a code
block) that the page says "would result in" / "would return" / "would produce" / "would be
preprocessed to" a value (inline or a block; "After preprocessing:" between two blocks) is expanded
with `squeal-router-config --expand` and compared with that value. An example the page writes with
typographic quotes or other JSON errors cannot be checked and is listed as such.
"""

from __future__ import annotations

import argparse
import collections
import html
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "router/target/release/squeal-router-config"

FENCED = re.compile(r"^([ \t]*)```[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)
CONFIG_STR_QUOTED = re.compile(r"--config-str='([^']*)'")
CONFIG_STR_BARE = re.compile(r"--config-str=(\{[^\n]*\})")
CONFIG_STR_OPTION = re.compile(r'"config_str"\s*:\s*("(?:[^"\\]|\\.)*")')
NAMED_FILE = re.compile(r"`([\w.-]+\.json)`")
# a list or object holding nothing but comments: what a user is meant to fill in
COMMENT = r"(?://[^\n]*\n|/\*(?:(?!\*/).)*\*/)"
PLACEHOLDER = re.compile(rf"[\[{{]\s*(?:{COMMENT}\s*)+[\]}}]", re.S)
# a server list holding only a comment: filled with a loopback address for the second check
SERVERS_PLACEHOLDER = re.compile(rf'("servers"\s*:\s*)\[\s*(?:{COMMENT}\s*)+\]', re.S)
FILLED_SERVER = '["127.0.0.1:11211"]'


class Example(NamedTuple):
    page: str
    line: int
    text: str
    file_name: str | None  # the name the page gives this block, if any


def strip_comments(text: str) -> str:
    """mcrouter's `//` and `/* */` comments removed (outside strings), trailing commas too."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return re.sub(r",(\s*[\]}])", r"\1", "".join(out))


def parse(text: str) -> object | None:
    try:
        return json.loads(strip_comments(text))
    except ValueError:
        return None


def line_of(page_text: str, offset: int) -> int:
    return page_text.count("\n", 0, offset) + 1


def examples_of(page: Path) -> list[Example]:
    text = page.read_text(errors="replace")
    found: list[tuple[int, str]] = []
    for m in FENCED.finditer(text):
        indent = len(m.group(1))
        body = "\n".join(line[indent:] if line[:indent].isspace() else line for line in m.group(2).splitlines())
        found.append((m.start(), body))
    for m in PRE.finditer(text):
        found.append((m.start(), html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))))
    found.sort()
    examples, previous_end = [], 0
    for start, body in found:
        named = NAMED_FILE.findall(text[previous_end:start])
        examples.append(Example(page.stem, line_of(text, start), body, named[-1] if named else None))
        previous_end = start + len(body)
    for pattern in (CONFIG_STR_QUOTED, CONFIG_STR_BARE):
        for m in pattern.finditer(text):
            examples.append(Example(page.stem, line_of(text, m.start()), m.group(1), None))
    for m in CONFIG_STR_OPTION.finditer(text):
        examples.append(Example(page.stem, line_of(text, m.start()), json.loads(m.group(1)), None))
    return examples


def json_in(text: str) -> str | None:
    """The example's JSON: the whole block, or the object a reply or a log shows inside it."""
    if parse(text) is not None:
        return text
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end and parse(text[start : end + 1]) is not None:
        return text[start : end + 1]
    return None


def classify(example: Example) -> tuple[str, str]:
    """(kind, detail): kind is `not a config`, `incomplete` or `complete`."""
    body = json_in(example.text)
    looks_like_config = re.search(r'"routes?"\s*:', example.text) is not None
    if body is None:
        if looks_like_config and re.search(r"/\*|//", example.text):
            return "incomplete", "not JSON until its comments are replaced by what they stand for"
        return "not a config", "not JSON"
    value = parse(body)
    if not isinstance(value, dict) or not ("route" in value or "routes" in value):
        return "not a config", "JSON without a top-level route/routes (a fragment)"
    placeholder = PLACEHOLDER.search(body)
    if placeholder:
        return "incomplete", "placeholder " + " ".join(placeholder.group(0).split())[:60]
    return "complete", ""


def check(path: Path) -> tuple[str, str]:
    out = subprocess.run([CHECK, path], capture_output=True, text=True, timeout=30)
    lines = [line.replace(f"{path}: ", "") for line in out.stderr.strip().splitlines()]
    if out.returncode == 0:
        warnings = [line.split("warning: ", 1)[-1] for line in lines if "warning" in line]
        return ("loads with warnings" if warnings else "loads clean"), "; ".join(warnings)
    return "refused", (lines or ["?"])[-1].split(": ", 1)[-1]


def filled(body: str) -> str | None:
    """The config with a loopback server in each server list that holds only a comment, when that
    was all it lacked."""
    text = SERVERS_PLACEHOLDER.sub(lambda m: m.group(1) + FILLED_SERVER, body)
    if text == body or PLACEHOLDER.search(text) or parse(text) is None:
        return None
    return text


def canonical(text: str) -> str:
    return json.dumps(parse(text), sort_keys=True)


# the JSONM page: code blocks, inline code, and the phrases that tie an expression to its result
JSONM_TOKEN = re.compile(
    r"(?P<code><pre[^>]*>.*?</pre>)|<tt>(?P<tt>[^<]*)</tt>"
    r"|(?P<verb>would result in|would return|would produce(?: an array)?|would be preprocessed to"
    r"|After preprocessing:)",
    re.S,
)
# what may stand between an expression and its phrase, or a phrase and its result
JSONM_GLUE = re.compile(r"^[\s,.;:]*(?:the above example|this|after preprocessing,\s*<tt>[^<]*</tt>)?[\s,.;:]*$", re.I)
TYPOGRAPHIC = re.compile("[\u201c\u201d\u2018\u2019]")


class JsonmExample(NamedTuple):
    line: int
    expression: object  # the value to expand: a string with a macro call, or a parsed block
    expected: object | None  # None: the page says it fails
    problem: str  # why it cannot be checked ("" when it can)


def jsonm_value(kind: str, text: str, is_expression: bool) -> tuple[object, str]:
    """(value, problem) of an inline or block example."""
    text = html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
    if TYPOGRAPHIC.search(text):
        return None, "written with typographic quotes"
    if kind == "tt" and is_expression:
        return text, ""
    value = parse(text)
    if value is None:
        if kind == "tt":
            return text, ""  # a bare string result: `same`, `es`
        return None, "not JSON as written"
    return value, ""


def jsonm_examples(page: Path) -> list[JsonmExample]:
    text = page.read_text(errors="replace")
    tokens = list(JSONM_TOKEN.finditer(text))
    found = []
    for i, verb in enumerate(tokens):
        if not verb.group("verb") or i == 0 or i + 1 >= len(tokens):
            continue
        j = i - 1
        if tokens[j].group("tt") and re.fullmatch(r"[\w.-]+\.json", tokens[j].group("tt")) and j > 0:
            j -= 1  # "after preprocessing, `allCities.json` would result in": the block before the name
        before, after = tokens[j], tokens[i + 1]
        if before.group("verb") or after.group("verb"):
            continue
        glue_before = re.sub(r"</?(?:p|div|blockquote)[^>]*>", "", text[before.end() : verb.start()])
        if not JSONM_GLUE.match(glue_before):
            continue
        if text[verb.end() : verb.end() + 12].strip().startswith("an error"):
            kind, body = ("code", before.group("code")) if before.group("code") else ("tt", before.group("tt"))
            value, problem = jsonm_value(kind, body, True)
            found.append(JsonmExample(line_of(text, before.start()), value, None, problem))
            continue
        glue_after = re.sub(r"</?(?:p|div)[^>]*>", "", text[verb.end() : after.start()])
        if not JSONM_GLUE.match(glue_after):
            continue
        kind, body = ("code", before.group("code")) if before.group("code") else ("tt", before.group("tt"))
        value, problem = jsonm_value(kind, body, True)
        rkind, rbody = ("code", after.group("code")) if after.group("code") else ("tt", after.group("tt"))
        expected, rproblem = jsonm_value(rkind, rbody, False)
        found.append(JsonmExample(line_of(text, before.start()), value, expected, problem or rproblem))
    return found


def check_jsonm(example: JsonmExample, files: Path) -> tuple[str, str]:
    """(verdict, detail): `same`, `differs`, `refused` (`, as mcrouter refuses it`) or `not checkable`."""
    if example.problem:
        return "not checkable", example.problem
    config = Path(files, "jsonm-example.json")
    config.write_text(json.dumps({"v": example.expression}))
    # `@import(file:NAME)` reads NAME from the working directory, as mcrouter does
    out = subprocess.run([CHECK, "--expand", config], capture_output=True, text=True, timeout=30, cwd=files)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["?"])[-1].split("preprocessor: ", 1)[-1]
        if example.expected is None:
            return "same", why
        if "is a string, not" in why:
            # the page's own rule: "all arguments that are not macro calls are treated as strings";
            # mcrouter's not/and/or/add/mod/range refuse strings too (ConfigPreprocessor.cpp)
            return "refused, as mcrouter refuses it", f"a bare argument is a string: {why}"
        return "refused", why
    got = json.loads(out.stdout)["v"]
    if example.expected is None:
        return "differs", f"the page says it fails; got {json.dumps(got)}"
    if got == example.expected:
        return "same", ""
    return "differs", f"got {json.dumps(got)[:80]}, the page says {json.dumps(example.expected)[:80]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wiki", type=Path, help="a directory with the wiki's pages (*.md)")
    ap.add_argument("--list", action="store_true", help="print every example with its verdict")
    args = ap.parse_args()
    if not CHECK.exists():
        sys.exit(f"{CHECK} not built: cargo build --release in router/")
    pages = sorted(args.wiki.glob("*.md"))
    if not pages:
        sys.exit(f"{args.wiki}: no *.md pages")
    complete: collections.Counter = collections.Counter()
    completed: collections.Counter = collections.Counter()  # incomplete ones with their server lists filled
    kinds: collections.Counter = collections.Counter()
    seen: dict[str, str] = {}

    def show(label: str, where: str, why: str = "") -> None:
        if args.list:
            print(f"  {label:40s} {where}" + (f": {why}" if why else ""))

    with tempfile.TemporaryDirectory() as tmp:
        for page in pages:
            page_dir = Path(tmp, page.stem)
            page_dir.mkdir()
            examples = sorted(examples_of(page), key=lambda e: e.line)
            for example in examples:  # named blocks first: a config may @import them
                if example.file_name and (body := json_in(example.text)):
                    Path(page_dir, example.file_name).write_text(body)
            for i, example in enumerate(examples):
                where = f"{example.page}:{example.line}"
                kind, detail = classify(example)
                body = json_in(example.text) or example.text
                if kind != "not a config":
                    key = canonical(body) if kind == "complete" else body
                    if key in seen:
                        show(f"same as {seen[key]}", where)
                        continue
                    seen[key] = where
                kinds[kind] += 1
                if kind == "not a config":
                    show(kind, where, detail)
                    continue
                path = Path(page_dir, example.file_name or f"example{i}.json")
                if not path.exists():
                    path.write_text(body)
                verdict, why = check(path)
                if kind == "complete":
                    complete[verdict] += 1
                    show(verdict, where, why)
                    continue
                text = filled(body)
                if text is None:
                    show("incomplete", where, f"{detail}; as written: {verdict}" + (f" ({why})" if why else ""))
                    continue
                path = Path(page_dir, f"example{i}-filled.json")
                path.write_text(text)
                verdict, why = check(path)
                completed[verdict] += 1
                show(f"incomplete, filled: {verdict}", where, f"{detail}" + (f"; {why}" if why else ""))

    def loads(c: collections.Counter) -> str:
        total = sum(c.values())
        n = c["loads clean"] + c["loads with warnings"]
        return (
            f"{n} of {total} load ({c['loads clean']} clean, {c['loads with warnings']} with warnings), "
            f"{c['refused']} refused"
        )

    print(f"complete configs: {loads(complete)}")
    print(
        f"incomplete configs: {kinds['incomplete']}; with a loopback server in each placeholder server list: "
        f"{loads(completed)}"
    )
    print(f"examples that are not configs: {kinds['not a config']}")

    jsonm: collections.Counter = collections.Counter()
    page = args.wiki / "JSONM.md"
    if page.exists():
        with tempfile.TemporaryDirectory() as files:
            text = page.read_text(errors="replace")
            # files the page names before their block (`<blockquote><p>NAME.json</p></blockquote>`)
            for m in re.finditer(r"<p>([\w.-]+\.json)</p></blockquote>\s*<div[^>]*>(<pre.*?</pre>)", text, re.S):
                body = html.unescape(re.sub(r"<[^>]+>", "", m.group(2)))
                Path(files, m.group(1)).write_text(body)
            for worked in jsonm_examples(page):
                verdict, why = check_jsonm(worked, Path(files))
                jsonm[verdict] += 1
                show(f"JSONM example: {verdict}", f"JSONM:{worked.line}", why)
        as_mcrouter = jsonm["refused, as mcrouter refuses it"]
        checked = jsonm["same"] + jsonm["differs"] + jsonm["refused"] + as_mcrouter
        print(
            f"JSONM examples with a stated result: {sum(jsonm.values())}; checked {checked}: {jsonm['same']} give "
            f"the page's result, {jsonm['differs']} differ, {as_mcrouter} refused as mcrouter refuses them "
            f"(a bare argument is a string), {jsonm['refused']} refused otherwise; "
            f"{jsonm['not checkable']} not checkable as written"
        )


if __name__ == "__main__":
    main()
